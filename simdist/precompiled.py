"""The closed form's numba kernels, shipped compiled: a search's first run after an install loads them, not compiles.

numba compiles the kernels (`simdist.analytic.timeline_jit`, `simdist.analytic.steady_jit`,
`simdist.plan.accounting_kernel`) on their first call and keeps the machine code in its on-disk cache
(``cache=True``: ``__pycache__`` beside the module, else the user's cache directory); a later process loads it
from there. The first search after an install paid that compile: about 10 s of a 17 s run on this project's 2-core
machine (`python benchmarks/compile.py`). ``simdist/numba_cache/`` holds the same cache, as numba writes it, built
by `rebuild` for numba's portable CPU target: NUMBA_CPU_NAME=generic, the architecture's baseline instruction set
without the building machine's own features. numba keys every entry by the CPU name and features it was compiled
for and loads only an exact match ("Notes on Caching", Cache sharing, in numba's developer documentation), so an
entry built for ``generic`` matches any CPU of the architecture whose process also asks for ``generic``: the
command line does (`use_portable_target`, before numba is imported). Generic code runs the README's search as fast
as the host's (6.5 s either way, measured on 2026-12-07: the kernels are scalar loops).

`attach` gives each kernel of a module a second place to look: its own cache first (where numba saves what it
compiles), then the shipped one. An entry is also keyed by numba's version, the Python version (in the file
names), the SHA-256 of the module's source, the function's bytecode and its argument types: any other numba,
Python or platform, an edited kernel, or a NUMBA_CPU_NAME of the user's own misses the shipped cache, and numba
compiles and caches as it always did. tests/test_precompiled.py checks that the shipped cache matches the kernels'
sources and that a search from the command line loads every kernel and compiles none.

Rebuild after editing a kernel (the test names the command): ``python -m simdist.precompiled``.
"""

from __future__ import annotations

import functools
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

__all__ = ["REBUILD_RUNS", "SHIPPED_DIR", "attach", "problems", "rebuild", "use_portable_target"]

SHIPPED_DIR = Path(__file__).with_name("numba_cache")
"""The shipped cache: numba's index (``.nbi``) and data (``.nbc``) files of every kernel, flat."""

PORTABLE_CPU = "generic"
"""numba's portable CPU target (NUMBA_CPU_NAME; its features then default to none)."""

REBUILD_RUNS: tuple[tuple[str, ...], ...] = (
    ("search", "--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "1024", "--global-batch", "1536"),
)
"""The command lines `rebuild` runs to compile every kernel the closed form calls: the README's default search
(its timeline compiles `timed` and `steady_order`, and with them every kernel they call)."""


def use_portable_target(environ: MutableMapping[str, str] = os.environ,
                        modules: dict[str, Any] | None = None) -> bool:
    """Ask numba for its portable CPU target (NUMBA_CPU_NAME=generic) so that the shipped kernels match; True if
    asked. Only where numba is not imported yet (it reads the variable once, at import) and the user set neither
    NUMBA_CPU_NAME nor NUMBA_CPU_FEATURES (theirs win: numba then compiles for what they named). The variable is
    inherited by the processes this one starts (a search's Dask workers), which then load the same kernels."""
    loaded = sys.modules if modules is None else modules
    if "numba" in loaded or environ.get("NUMBA_CPU_NAME") or environ.get("NUMBA_CPU_FEATURES"):
        return False
    environ["NUMBA_CPU_NAME"] = PORTABLE_CPU
    return True


@functools.cache
def _with_shipped() -> tuple[type, type, Any] | None:
    """(numba's FunctionCache, its subclass that falls back on the shipped cache, numba's IndexDataCacheFile), made on
    first use: the console imports this module before numba (`use_portable_target`). None where numba's caching
    classes are not what this module was written against (another numba)."""
    try:
        from numba.core.caching import FunctionCache, IndexDataCacheFile
    except ImportError:  # pragma: no cover - depends on the installed numba
        return None

    class WithShipped(FunctionCache):
        """numba's cache of one function (found and saved where numba chooses) and, where that has no entry for a
        signature, the shipped one (``_shipped``, read only). The swap of the index file below runs under numba's
        global compiler lock (a dispatcher loads from its cache while compiling), so no other thread sees it."""

        _shipped: Any

        def load_overload(self, sig: Any, target_context: Any) -> Any:
            found = super().load_overload(sig, target_context)
            if found is None:
                own, self._cache_file = self._cache_file, self._shipped
                try:
                    found = super().load_overload(sig, target_context)
                finally:
                    self._cache_file = own
            return found

    return FunctionCache, WithShipped, IndexDataCacheFile


def attach(namespace: dict[str, Any]) -> int:
    """Give every cached numba kernel of a module's namespace (``attach(globals())`` at its end) the shipped cache
    to fall back on; the number attached. The cache numba built for the kernel (its place and the source's stamp,
    found when the kernel was decorated) is kept and given the fallback, not built again. numba's caching classes are
    its internals: where they are not what this module was written against (another numba), nothing is attached and
    numba compiles as usual."""
    classes = _with_shipped()
    if classes is None:  # pragma: no cover - depends on the installed numba
        return 0
    function_cache, with_shipped, index_file = classes
    attached = 0
    for value in list(namespace.values()):
        cache = getattr(value, "_cache", None)
        if type(cache) is not function_cache:
            continue
        try:
            shipped = index_file(cache_path=str(SHIPPED_DIR), filename_base=cache._impl.filename_base,
                                 source_stamp=cache._impl.locator.get_source_stamp())
        except (AttributeError, TypeError):  # pragma: no cover - another numba's internals
            continue
        cache.__class__ = with_shipped
        cache._shipped = shipped
        attached += 1
    return attached


def problems(namespace: dict[str, Any]) -> dict[str, str]:
    """What keeps the shipped cache from serving each attached kernel of a module's namespace (`attach`), by the
    kernel's name: no shipped index, an index written by another numba, or one for another version of the module's
    source (rebuild it); kernels it serves are left out. numba's index file is two pickles: its version, then the
    source's stamp and the entries ("Notes on Caching", numba's developer documentation)."""
    found = {}
    for name, value in namespace.items():
        cache = getattr(value, "_cache", None)
        shipped = getattr(cache, "_shipped", None)
        if shipped is None:
            continue
        index = SHIPPED_DIR / f"{cache._impl.filename_base}.nbi"
        if not index.is_file():
            found[name] = f"no shipped index {index.name}: rebuild with `python -m simdist.precompiled`"
            continue
        with index.open("rb") as f:
            version = pickle.load(f)
            if version != shipped._version:
                found[name] = f"{index.name} was built by numba {version}, numba {shipped._version} is installed"
                continue
            stamp, entries = pickle.loads(f.read())
        if stamp != shipped._source_stamp or not entries:
            found[name] = (f"{index.name} is of another version of {value.py_func.__module__}'s source: rebuild "
                           "with `python -m simdist.precompiled`")
    return found


def rebuild(runs: tuple[tuple[str, ...], ...] = REBUILD_RUNS, target: Path = SHIPPED_DIR) -> list[Path]:
    """Compile the kernels for the portable target and replace the shipped cache with numba's cache of them; the
    files written. Runs each command line of ``runs`` (``python -m simdist ...``) in a fresh process whose numba
    cache is an empty temporary directory, after emptying ``target`` (so that nothing is loaded from it)."""
    for old in [*target.glob("*.nbi"), *target.glob("*.nbc")]:
        old.unlink()
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="simdist-numba-") as cache:
        env = {key: value for key, value in os.environ.items() if key != "NUMBA_CPU_FEATURES"}
        env.update(NUMBA_CACHE_DIR=cache, NUMBA_CPU_NAME=PORTABLE_CPU)
        for run in runs:
            subprocess.run([sys.executable, "-m", "simdist", *run], env=env, check=True, stdout=subprocess.DEVNULL)
        written = []
        for path in sorted(Path(cache).rglob("*.nb[ic]")):
            written.append(Path(shutil.copy2(path, target / path.name)))
    return written


def main() -> int:
    """``python -m simdist.precompiled``: rebuild the shipped cache and list what it holds."""
    written = rebuild()
    size = sum(path.stat().st_size for path in written)
    print(f"{len(written)} files, {size / 2**20:.2f} MiB in {SHIPPED_DIR}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
