"""Benchmark of the teaching notebooks: wall seconds to execute each one, as tests/test_notebooks.py does.

Run from the repository root with the project's virtualenv active:

    python benchmarks/notebooks.py [--repeat N] [NAME ...]      (e.g. 07_buying.ipynb; default: every notebook)

Each notebook is executed --repeat times (default 3) in a fresh kernel of this interpreter (a kernelspec written
into a temporary directory), in a temporary working directory; the figures are the kernel start plus every cell,
the median and the spread of the repeats. Target (issue 16): 07_buying.ipynb in about 20 s or less on the 2-core
machine. The machine is shared: compare medians, and re-measure on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def execute_s(path: Path, kernels: Path) -> float:
    """Wall seconds to start a kernel and execute every cell of ``path`` (an error in a cell is raised)."""
    import nbformat
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name="simdist-bench", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(kernels)]))
    with tempfile.TemporaryDirectory() as work:
        client = NotebookClient(nb, km=km, timeout=600, allow_errors=False, resources={"metadata": {"path": work}})
        t0 = time.perf_counter()
        client.execute()
        return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook file names (default: every notebook)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    paths = [ROOT / "notebooks" / n for n in args.names] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    with tempfile.TemporaryDirectory() as kernels:
        spec = Path(kernels) / "simdist-bench"
        spec.mkdir()
        (spec / "kernel.json").write_text(json.dumps({
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "simdist bench", "language": "python"}))
        print(f"{'notebook':<32} {'median s':>9} {'min s':>7} {'max s':>7}  (repeats: {args.repeat})")
        for path in paths:
            times = [execute_s(path, Path(kernels)) for _ in range(args.repeat)]
            print(f"{path.name:<32} {statistics.median(times):9.1f} {min(times):7.1f} {max(times):7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
