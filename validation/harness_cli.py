"""The validation harnesses' command lines, guarded: one parser and one runner every ``python -m validation.*``
shares (`HarnessParser`, `cli_guard`), so that bad input, Ctrl-C, an operating-system error or a stdout that cannot
be written is one line and an exit status, never a traceback, and what a run measured is kept in its files."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from validation.spawn import HarnessError

__all__ = ["HarnessParser", "cli_guard", "report_main"]


class HarnessParser(argparse.ArgumentParser):
    """The harnesses' argument parser: a bad argument is one `HarnessError` line naming the fix (``--help``), not
    argparse's usage dump."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        raise HarnessError(f"{message} (fix: see {self.prog} --help)")


def report_main(prog: str, description: str, render: Callable[[], str], argv: list[str] | None = None) -> int:
    """A report harness's command line: ``--out FILE`` (checked before the work, written atomically: never half a
    report) or the report on stdout. ``render`` builds the markdown."""
    from pathlib import Path

    parser = HarnessParser(prog=prog, description=description)
    parser.add_argument("--out", type=Path, help="write the markdown report here (default: stdout)")
    args = parser.parse_args(argv)
    if args.out:
        from simdist.files import check_target

        check_target(args.out, field="--out")  # before the work, not after it
    text = render()
    if args.out:
        from simdist.files import write_text  # atomic, creates the folder, one-line errors

        write_text(args.out, text, field="--out")
    else:
        sys.stdout.write(text)
    return 0


def _stderr(line: str) -> None:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


class _GuardedStdout:
    """sys.stdout while a harness runs (`cli_guard`): its progress lines are a courtesy, its results go to files,
    so a stdout that cannot be written (a closed pipe, a full disk behind ``> out.txt``) must not stop the run or
    lose what it measured. The first failure points stdout at /dev/null and is kept (``failure``) for the end."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.failure: OSError | None = None

    def _guarded(self, call: Callable[[], Any]) -> Any:
        if self.failure is not None:
            return None
        try:
            return call()
        except OSError as err:
            self.failure = err
            with contextlib.suppress(OSError, ValueError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
            return None

    def write(self, text: str) -> int:
        self._guarded(lambda: self._stream.write(text))
        return len(text)

    def flush(self) -> None:
        self._guarded(self._stream.flush)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def cli_guard(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Run a harness CLI ``main``; a `HarnessError` or simdist error becomes ``error: <one line>``, status 2; Ctrl-C
    ``interrupted`` (status 130, after the harness kept what it had: its own ``finally``); an operating-system
    error (``ulimit -n``, a full disk) one line naming the reason and the fix, status 2. Its stdout never stops it
    (`_GuardedStdout`): a closed pipe ends quietly, and a stdout that could not be written (``> /dev/full``) is one
    line at the end, status 2, the results written to their files all the same."""
    from simdist.errors import SimdistError
    from simdist.files import os_fix, os_reason

    guarded = _GuardedStdout(sys.stdout) if sys.stdout is not None else None
    if guarded is not None:
        sys.stdout = guarded  # type: ignore[assignment]
    try:
        status = main(argv)
    except HarnessError as exc:
        _stderr(f"error: {exc}")
        return exc.status
    except SimdistError as exc:
        _stderr(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        _stderr("interrupted")
        return 130
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        where = f"{exc.filename}: " if isinstance(exc.filename, str) else ""
        _stderr(f"error: {where}{os_reason(exc)} (fix: {os_fix(exc, 'check the file system and ulimit -a')})")
        return 2
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != "torch":
            raise
        _stderr("error: the validation harness needs torch, which is not installed "
                "(fix: pip install -e '.[validation]')")
        return 2
    finally:
        if guarded is not None and sys.stdout is guarded:
            guarded.flush()
            sys.stdout = guarded._stream
    failure = guarded.failure if guarded is not None else None
    if failure is not None and not isinstance(failure, BrokenPipeError) and status == 0:
        _stderr(f"error: cannot write to standard output: {os_reason(failure)}; the files it wrote are complete "
                "(fix: free space, or redirect the output elsewhere)")
        return 2
    return status
