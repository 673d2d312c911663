"""Run the CLI in-process with a per-case time limit (for the bad-input and fuzz tests).

`run_cli` captures stdout and stderr, turns `SystemExit` into a status, and stops a case that runs past
``timeout_s`` with `CaseTimeout` (a SIGALRM timer: the harness bounds the work of a case; no test asserts
how fast anything is). Any other exception escapes: a traceback is a failure.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from simdist.cli import main

REPO = Path(__file__).resolve().parents[1]


class CaseTimeout(BaseException):
    """A CLI case ran past its time limit: simdist hung or did unbounded work."""


@dataclass(frozen=True, slots=True)
class Result:
    code: int
    out: str
    err: str

    def one_line_error(self) -> bool:
        """Exit 2 with exactly one ``error:`` line (notes may precede it) and no traceback."""
        lines = [ln for ln in self.err.splitlines() if ln.strip()]
        return (self.code == 2 and bool(lines) and lines[-1].startswith("error: ")
                and sum(ln.startswith("error: ") for ln in lines) == 1 and "Traceback" not in self.err)


def _alarm(signum, frame):  # pragma: no cover - only when a case hangs
    raise CaseTimeout


def run_cli(argv: list[str], *, cwd: str | Path | None = None, timeout_s: float = 60.0,
            stdout: io.TextIOBase | None = None) -> Result:
    """``simdist ARGV`` in this process: (status, stdout, stderr); `CaseTimeout` past ``timeout_s``."""
    out = stdout if stdout is not None else io.StringIO()
    err = io.StringIO()
    old_dir = os.getcwd()
    old_handler = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([str(a) for a in argv])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        os.chdir(old_dir)
    return Result(code, out.getvalue() if isinstance(out, io.StringIO) else "", err.getvalue())
