from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from simdist.cli import main

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
"""Tiny hand-checkable inputs for tests of mechanisms (the shipped presets are for tests about presets)."""
TOY_TOPOLOGY = FIXTURES / "toy-nvswitch.yaml"


def markdown_rows(text: str, columns: int) -> list[list[str]]:
    """The cells of the body rows of ``text``'s markdown tables of ``columns`` columns (a header row, the one above
    a rule row, left out): the rows of a table a validation script generated, for tests comparing it with the script."""
    out: list[list[str]] = []
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != columns:
            continue
        if all(c and set(c) <= set("-:") for c in cells):
            out.pop()  # the header above this rule
        else:
            out.append(cells)
    return out


def toy_gpu():
    """The GpuSpec of tests/fixtures/toy-gpu.yaml: 100 TFLOP/s bf16, 10 fp32, 1 TB/s HBM, 16 GiB."""
    from simdist.spec.gpu import GpuSpec
    from simdist.spec.load import read_yaml, validate

    return validate(GpuSpec, read_yaml(FIXTURES / "toy-gpu.yaml"))


@pytest.fixture
def toy_gpu_spec():
    return toy_gpu()


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process: returns (exit status, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        try:
            main(list(argv))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        else:  # pragma: no cover - main always exits
            code = 0
        out, err = capsys.readouterr()
        return code, out, err

    return run


# --------------------------------------------------------------------------- running in parallel (pytest-xdist)
# With -n auto --dist loadfile (optional; the README's command runs serially): each test file on one worker, so module
# fixtures and module caches are built once, as in a serial run. The files below start torch.distributed process
# groups (gloo ranks meeting at a free TCP port on 127.0.0.1, validation/spawn.py): they share one worker, so that
# only one rendezvous is open at a time.
TORCH_DISTRIBUTED = {"test_moe_harness.py", "test_validation_harness.py", "test_validation_loop.py"}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile``, with the `TORCH_DISTRIBUTED` files as one unit of work."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "torch.distributed" if Path(path).name in TORCH_DISTRIBUTED else path

    return FileScheduling(config, log)


def _fuzz_cases() -> Counter:
    fuzz = sys.modules.get("tests.test_fuzz")
    return Counter(fuzz.CASES) if fuzz is not None else Counter()


class _WorkerFuzzCases:
    """The fuzz case counts of the xdist workers, gathered on the controller as each worker ends."""

    def __init__(self) -> None:
        self.cases: Counter = Counter()

    def pytest_testnodedown(self, node, error):
        self.cases.update(getattr(node, "workeroutput", {}).get("fuzz_cases", {}))


def pytest_configure(config):
    if config.pluginmanager.hasplugin("xdist") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_WorkerFuzzCases(), "simdist-worker-fuzz-cases")


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: its fuzz cases go to the controller
        session.config.workeroutput["fuzz_cases"] = dict(_fuzz_cases())


def pytest_terminal_summary(terminalreporter):
    """The fuzz tests' case counts (tests/test_fuzz.py), when they ran (in this process or in xdist workers)."""
    cases = _fuzz_cases()
    workers = terminalreporter.config.pluginmanager.get_plugin("simdist-worker-fuzz-cases")
    if workers is not None:
        cases.update(workers.cases)
    if cases:
        counts = ", ".join(f"{name} {n}" for name, n in sorted(cases.items()))
        terminalreporter.write_line(f"fuzz cases: {sum(cases.values())} ({counts})")
