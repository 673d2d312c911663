"""The closed form's compiled helpers are compiled once each on a cold cache.

numba compiles a jitted function anew for every distinct argument type a caller hands it, and a bare literal (``0``,
``False``) is a type of its own (Literal[int](0)): a helper called once with a literal and once with a variable is
compiled twice, with everything it calls. On the README's search that cost about 3 s of the first run after an
install (simdist.analytic.timeline_jit.run's comment). A small search on an empty numba cache must leave every
helper of simdist.analytic.timeline_jit, simdist.plan.accounting_kernel and simdist.analytic.steady_jit with exactly
one signature: all of them compiled (the search times programs with bodies to jump, so every helper runs), none twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

_SCRIPT = """
import json, sys
from simdist.cli import app
sys.argv = ['simdist', 'search', '--model', 'gpt3-175b', '--cluster', 'dgx-a100', '--gpus', '128',
            '--global-batch', '256', '--top', '1', '--json']
try:
    app()
except SystemExit:
    pass
import simdist.analytic.steady_jit as sj
import simdist.analytic.timeline_jit as tj
import simdist.plan.accounting_kernel as ak
counts = {f'{m.__name__}.{n}': len(getattr(m, n).signatures)
          for m in (tj, ak, sj) for n in dir(m) if hasattr(getattr(m, n), 'signatures')}
sys.stderr.write('SIGNATURES ' + json.dumps(counts) + '\\n')
"""


@pytest.mark.slow  # a cold compile of every helper: about 10 s on 2 cores
def test_each_compiled_helper_is_compiled_once_on_a_cold_cache(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    line = next((x for x in done.stderr.splitlines() if x.startswith("SIGNATURES ")), None)
    assert line is not None, done.stderr[-2000:]
    counts = json.loads(line.removeprefix("SIGNATURES "))
    assert len(counts) >= 20  # timeline_jit's 12, the accounting sweep's 6, steady_jit's 2
    assert counts == dict.fromkeys(counts, 1), {k: v for k, v in counts.items() if v != 1}
