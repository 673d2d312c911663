"""The one-way data flow of docs/architecture.md, enforced: import-linter contracts from pyproject.toml.

The contract can only fail for what import-linter sees: a directory without ``__init__.py`` is never analysed, a
layer in parentheses is optional (a package missing from the tree, or misnamed in the contract, passes silently) and
a package that is no layer is unconstrained. The tests below check each of those, and that an upward import planted
in a copy of every layer breaks the contract there.
"""

import itertools
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "simdist"
PLANT = "_planted_upward_import"


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports")
    assert exe is not None, "import-linter is part of the test extra"
    # PYTHONPATH first: the tree under cwd, not the installed (editable) simdist, is the one analysed
    return subprocess.run([exe, "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(cwd)})


def layers_contract() -> dict:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return contract


def layers() -> list[list[str]]:
    """The contract's layers, top first, each as its list of sibling names (as written, parentheses kept)."""
    return [[name.strip() for name in re.split(r"[|:]", layer)] for layer in layers_contract()["layers"]]


def test_import_linter_contracts_hold():
    proc = lint_imports(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_every_directory_of_modules_is_a_package():
    # import-linter (grimp) skips namespace directories: their modules would escape every contract
    bare = [str(d.relative_to(REPO)) for d in PACKAGE.rglob("*")
            if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py")) and not (d / "__init__.py").exists()]
    assert bare == []


def test_every_subpackage_and_module_of_simdist_is_a_mandatory_layer():
    contract = layers_contract()
    assert contract["containers"] == ["simdist"]
    names = [name for layer in layers() for name in layer]
    assert [n for n in names if n.startswith("(")] == [], "a layer in parentheses is optional"
    assert len(names) == len(set(names))
    children = {d.name for d in PACKAGE.iterdir() if (d / "__init__.py").is_file()}
    children |= {f.stem for f in PACKAGE.glob("*.py")} - {"__init__", *contract.get("exhaustive_ignores", [])}
    assert set(names) == children
    assert contract["exhaustive"] is True  # and import-linter itself fails on a new child that is no layer


def plants() -> dict[str, str]:
    """Planted module (dotted) -> the module it imports: every layer but the top imports the layer above it
    (collectives -> plan, ...), and the first of two independent siblings imports the second."""
    out: dict[str, str] = {}
    stack = layers()
    for above, layer in itertools.pairwise(stack):
        for name in layer:
            out[f"simdist.{name}"] = f"simdist.{above[0]}"
    for layer in stack:
        if len(layer) == 2:
            out[f"simdist.{layer[0]}.sibling"] = f"simdist.{layer[1]}"
    return out


def test_planted_upward_imports_break_the_contract(tmp_path: Path):
    shutil.copytree(PACKAGE, tmp_path / "simdist", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path)
    planted: dict[str, str] = {}
    for where, target in plants().items():
        name = where.removesuffix(".sibling").removeprefix("simdist.")
        path = tmp_path / "simdist" / name
        line = f"import {target}  # planted by tests/test_layering.py\n"
        if path.is_dir():  # a package: a new module in it (the case a missing __init__.py once let through)
            module = f"{PLANT}_sibling" if where.endswith(".sibling") else PLANT
            (path / f"{module}.py").write_text(line, encoding="utf-8")
            planted[f"simdist.{name}.{module}"] = target
        else:  # a module layer (units, errors): the import appended to it
            with (path.parent / f"{name}.py").open("a", encoding="utf-8") as f:
                f.write(line)
            planted[f"simdist.{name}"] = target
    # and a package no layer names (exhaustive contract)
    (tmp_path / "simdist" / "unlisted").mkdir()
    (tmp_path / "simdist" / "unlisted" / "__init__.py").write_text("", encoding="utf-8")

    proc = lint_imports(tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "BROKEN" in out
    for module, target in planted.items():
        assert re.search(rf"{re.escape(module)} -> {re.escape(target)}\b", out), (module, target, out)
    assert "simdist.unlisted" in out


def test_library_import_pulls_no_torch():
    code = "import sys, simdist.api, simdist.cli; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "False"
