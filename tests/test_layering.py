"""DESIGN.md's one-way data flow, enforced: import-linter contracts from pyproject.toml."""

import shutil
import subprocess
import sys

from tests.conftest import REPO


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports")
    assert exe is not None, "import-linter is part of the test extra"
    proc = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_library_import_pulls_no_torch():
    code = "import sys, simdist.api, simdist.cli; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "False"
