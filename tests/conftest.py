from __future__ import annotations

from pathlib import Path

import pytest

from simdist.cli import main

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
"""Tiny hand-checkable inputs for tests of mechanisms (the shipped presets are for tests about presets)."""
TOY_TOPOLOGY = FIXTURES / "toy-nvswitch.yaml"


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


def pytest_terminal_summary(terminalreporter):
    """The fuzz tests' case counts (tests/test_fuzz.py), when they ran."""
    import sys

    fuzz = sys.modules.get("tests.test_fuzz")
    if fuzz is not None and fuzz.CASES:
        counts = ", ".join(f"{name} {n}" for name, n in sorted(fuzz.CASES.items()))
        terminalreporter.write_line(f"fuzz cases: {sum(fuzz.CASES.values())} ({counts})")
