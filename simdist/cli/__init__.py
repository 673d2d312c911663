"""Command line: thin typer commands over `simdist.api`.

Bad input never prints a traceback: a `SimdistError` or a usage error becomes one line on stderr
(``error: ...``) and exit status 2. ``--json`` prints exactly one JSON document on stdout.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

try:  # typer >= 0.20 vendors click as typer._click; older releases use click itself
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as click_exceptions  # type: ignore[no-redef]

from simdist import (
    api,  # noqa: F401 - re-exported: `simdist.cli.api` for callers and tests
    precompiled,
)
from simdist.cli.streams import OutputClosed, _silence_stdout, emit, notes_to_stderr, print_json, to_stderr
from simdist.errors import EXIT_USAGE, SimdistError
from simdist.files import check_target, os_fix, os_reason, write_text

__all__ = ["app", "check_target", "console", "emit", "main", "print_json", "topo_app", "write_atomically"]

# Exit and Abort live in typer itself in recent releases (typer.Exit, typer.Abort), in click's exceptions before.
_EXIT = tuple({getattr(typer, "Exit", None), getattr(click_exceptions, "Exit", None)} - {None})
_ABORT = tuple({getattr(typer, "Abort", None), getattr(click_exceptions, "Abort", None)} - {None})

app = typer.Typer(
    name="simdist",
    help="Discrete-event simulator of distributed-training cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
topo_app = typer.Typer(help="Inspect topology presets and clusters.", no_args_is_help=True)


def _version(value: bool) -> None:
    if value:
        from simdist import __version__

        sys.stdout.write(f"simdist {__version__}\n")
        raise typer.Exit()


@app.callback()
def _options(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                   help="Print the simdist version and exit.")] = False) -> None:
    """Discrete-event simulator of distributed-training cost."""
app.add_typer(topo_app, name="topo")

SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a field: key=value (dotted path, YAML value), repeatable."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout, nothing else.")]
CalibrationOption = Annotated[Path | None, typer.Option(
    "--calibration", help="A calibration file (simdist calibrate) fitted for this cluster.")]


def _print_json(doc: Any) -> None:
    print_json(doc)


def write_atomically(path: Path, text: str, *, field: str = "--html") -> None:
    """Write ``text`` to ``path`` atomically (simdist.files.write_text): never half a file, one-line errors."""
    write_text(path, text, field=field)


def _fail(message: str, code: int = EXIT_USAGE) -> None:
    to_stderr("error: " + message)
    sys.exit(code)


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived: unwind (every writer removes its temporary files on the way), then exit 128 + the
    signal number, as the signal's default action would, without leaving ``.report.json.*.tmp`` behind."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _terminate(signum: int, frame: object) -> None:
    raise Terminated(signum)


@contextlib.contextmanager
def terminate_as_exception() -> Iterator[None]:
    """SIGTERM and SIGHUP raise `Terminated` in the main thread while the block runs (the handlers before are put
    back after it; a no-op outside the main thread, where handlers cannot be set; an ignored signal stays ignored)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    olds = {}
    for name in ("SIGTERM", "SIGHUP"):
        signum = getattr(signal, name, None)
        if signum is not None and signal.getsignal(signum) is not signal.SIG_IGN:
            olds[signum] = signal.signal(signum, _terminate)
    try:
        yield
    finally:
        for signum, old in olds.items():
            signal.signal(signum, old)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``simdist`` console script and ``python -m simdist``."""
    with notes_to_stderr(), terminate_as_exception():
        _main(argv)


GC_THRESHOLDS = (50_000, 20, 20)
"""The console process's cyclic garbage collector thresholds (`gc.set_threshold`; CPython's default: 700, 10, 10).
A search builds hundreds of thousands of long-lived cached tuples and floats (prices, recipes, stage memories:
about 516,000 objects tracked at the end of the README's search), none in a reference cycle, and the default
thresholds walk them again and again: there 1,733 young, 146 middle and 6 full collections took 0.65 s (measured
with `gc.callbacks`); with these, 20 young collections and 1 middle one, and the search is 6 % faster (whole processes,
3 pairs) at the same peak memory. `simdist run` of the bundled scenarios: the same time and peak memory (77-94
MiB). Cycles that become garbage (SimPy's processes and events) are still collected, in fewer, larger passes."""


def console() -> None:
    """The ``simdist`` console script and ``python -m simdist``: `main` (the collector at `GC_THRESHOLDS`), then the
    process ends as soon as its output is flushed and its exit handlers have run (``atexit``, as the interpreter
    runs them: logging's flush, multiprocessing's joins, a tempfile's cleanup, numba's), with ``os._exit``: without
    the interpreter's teardown, which frees every module and object one by one and collects garbage over all of
    them again (about 1 s of the README's 11 s search; 0.1-0.15 s of a 2-3 s ``simdist run``; measured), and writes
    nothing. Only where no other thread is alive (the interpreter would wait for it); else the interpreter exits as
    usual. The exit status and everything written are `main`'s. numba is asked for its portable CPU target first,
    so that a search loads the kernels shipped compiled (`simdist.precompiled.use_portable_target`)."""
    precompiled.use_portable_target()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        main()
        code: int = 0
    except SystemExit as exit_:
        if exit_.code is None or isinstance(exit_.code, int):
            code = exit_.code or 0
        else:  # sys.exit("message"): the interpreter would print it and exit 1
            to_stderr(str(exit_.code))
            code = 1
    _flush()
    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is not None and threading.active_count() == 1:
        run_exit_handlers()  # as the interpreter runs them at exit (an exception in one is reported, not raised)
        _flush()
        os._exit(code)
    sys.exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (BrokenPipeError, OSError, ValueError):  # a reader gone at the last moment: as main would end
            if stream is sys.stdout:
                _silence_stdout()


def _main(argv: list[str] | None) -> None:
    try:
        code = app(args=argv, prog_name="simdist", standalone_mode=False)
    except SimdistError as err:
        _fail(err.one_line())
    except click_exceptions.NoArgsIsHelpError as err:
        sys.stdout.write(err.format_message() + "\n")
        sys.exit(0)
    except click_exceptions.UsageError as err:
        where = f"{err.ctx.command_path}: " if err.ctx is not None else ""
        _fail(where + err.format_message())
    except click_exceptions.ClickException as err:
        _fail(err.format_message())
    except _EXIT as err:
        sys.exit(getattr(err, "exit_code", 0))
    except (*_ABORT, KeyboardInterrupt):
        to_stderr("interrupted")
        sys.exit(130)
    except Terminated as err:
        to_stderr(f"terminated by {signal.Signals(err.signum).name}: nothing half-written was left")
        sys.exit(128 + err.signum)
    except (OutputClosed, BrokenPipeError) as err:
        _silence_stdout()
        if isinstance(err, OutputClosed) and err.args:  # a write error other than a closed pipe
            _fail(f"cannot write to standard output: {err.args[0]} (fix: {err.args[1]})")
        sys.exit(0)
    except OSError as err:  # the one I/O error path of whatever no writer or reader named (e.g. EMFILE in a pipe)
        where = f"{err.filename}: " if isinstance(err.filename, str) else ""
        _fail(f"{where}{os_reason(err)} (fix: {os_fix(err, 'check the file system and the limits (ulimit -a)')})")
    except MemoryError:
        _fail("ran out of memory (an input asks for more than this machine has; simdist.limits bounds the known "
              "cases) (fix: give a smaller cluster, fewer micro-batches or fewer sizes)")
    except RecursionError:
        _fail("an input is nested too deeply to process (fix: simplify it)")
    sys.exit(code if isinstance(code, int) else 0)


# The commands, one module per family; imported last because they register on `app` and use the options above,
# in the order `simdist --help` lists them.
for _family in ("commands", "bubble", "calibration", "search", "topo"):
    importlib.import_module(f"simdist.cli.{_family}")

if __name__ == "__main__":
    console()
