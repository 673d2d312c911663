"""The closed form's kernels shipped compiled (simdist.precompiled): fresh for their sources, loaded by a search
from the command line in a fresh process with an empty numba cache (no kernel compiled), and the portable target
asked for only where the user has not named a CPU."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numba
import pytest

from simdist import precompiled
from simdist.analytic import steady_jit, timeline_jit
from simdist.plan import accounting_kernel

REPO = Path(__file__).resolve().parents[1]
KERNEL_MODULES = (timeline_jit, steady_jit, accounting_kernel)
TAG = f".py{sys.version_info[0]}{sys.version_info[1]}."
"""This Python's part of numba's cache file names (timeline_jit.run-178.py311.nbi)."""


def _problems() -> dict[str, str]:
    return {f"{m.__name__}.{k}": v for m in KERNEL_MODULES for k, v in precompiled.problems(vars(m)).items()}


def _shipped_version() -> str | None:
    """The numba version that wrote the shipped cache for this Python (numba's file names carry it: .py311.), None
    where none is shipped for it."""
    import pickle

    index = next(iter(sorted(p for p in precompiled.SHIPPED_DIR.glob("*.nbi") if TAG in p.name)), None)
    if index is None:
        return None
    with index.open("rb") as f:
        return pickle.load(f)


def test_every_kernel_is_attached_and_shipped_fresh():
    from numba.core.dispatcher import Dispatcher

    kernels = {(m.__name__, k) for m in KERNEL_MODULES for k, v in vars(m).items() if isinstance(v, Dispatcher)}
    attached = {(m.__name__, k) for m in KERNEL_MODULES for k, v in vars(m).items()
                if hasattr(getattr(v, "_cache", None), "_shipped")}
    assert len(kernels) == 20 and attached == kernels  # every njit(cache=True) kernel of the three modules
    if _shipped_version() != numba.__version__:
        pytest.skip(f"the shipped cache is numba {_shipped_version()}'s for this Python, numba {numba.__version__} "
                    "is installed")
    assert _problems() == {}
    # one index per kernel, nothing left over from a renamed or moved kernel (its line is in the file name)
    names = {f"{v._cache._impl.filename_base}.nbi" for m in KERNEL_MODULES for v in vars(m).values()
             if hasattr(getattr(v, "_cache", None), "_shipped")}
    assert {p.name for p in precompiled.SHIPPED_DIR.glob("*.nbi") if TAG in p.name} == names


def test_problems_names_a_stale_or_missing_index(monkeypatch, tmp_path):
    kernel = vars(steady_jit)["steady_order"]
    monkeypatch.setattr(precompiled, "SHIPPED_DIR", tmp_path)
    assert "rebuild" in precompiled.problems({"steady_order": kernel})["steady_order"]
    import pickle

    index = tmp_path / f"{kernel._cache._impl.filename_base}.nbi"
    index.write_bytes(pickle.dumps(numba.__version__) + pickle.dumps((b"another source", {"k": "v"})))
    assert "another version" in precompiled.problems({"steady_order": kernel})["steady_order"]
    index.write_bytes(pickle.dumps("0.1.0") + pickle.dumps((b"", {})))
    assert "built by numba 0.1.0" in precompiled.problems({"steady_order": kernel})["steady_order"]


@pytest.mark.skipif(sys.platform != "linux" or platform.machine() != "x86_64",
                    reason="the shipped cache is built for x86-64 Linux")
def test_a_search_from_the_command_line_loads_every_kernel_and_compiles_none(tmp_path):
    if _shipped_version() != numba.__version__ or _problems():
        pytest.skip("the shipped cache does not match this numba or these sources")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU_")}
    env.update(NUMBA_CACHE_DIR=str(tmp_path), NUMBA_DEBUG_CACHE="1")
    out = subprocess.run([sys.executable, "-m", "simdist", "search", "--model", "gpt3-175b", "--cluster", "dgx-a100",
                          "--gpus", "64", "--global-batch", "128", "--top", "1"],
                         cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    log = [line for line in out.splitlines() if line.startswith("[cache]")]
    loaded = [line for line in log if line.startswith("[cache] data loaded from")]
    assert loaded and all(str(precompiled.SHIPPED_DIR) in line for line in loaded)
    assert not [line for line in log if "saved" in line]  # numba saves what it compiled: nothing was
    assert not list(tmp_path.rglob("*.nbc"))


def test_the_portable_target_is_asked_for_only_where_the_user_named_no_cpu():
    env: dict[str, str] = {}
    assert precompiled.use_portable_target(env, modules={}) and env == {"NUMBA_CPU_NAME": "generic"}
    for named in ({"NUMBA_CPU_NAME": "skylake"}, {"NUMBA_CPU_FEATURES": "+avx2"}):
        env = dict(named)
        assert not precompiled.use_portable_target(env, modules={}) and env == named
    env = {}
    assert not precompiled.use_portable_target(env, modules={"numba": numba}) and env == {}  # read at its import
