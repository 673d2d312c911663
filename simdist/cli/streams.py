"""The CLI's output streams: whole documents on stdout, one-line notes and errors on stderr.

- `emit` writes a command's whole output with one write and a flush, with SIGINT held back meanwhile: a
  Ctrl-C while printing lands after the document (exit 130), so stdout carries the complete document or
  nothing, never a JSON cut in the middle.
- `print_json` emits strict JSON (no NaN or Infinity: `simdist.files.json_text`).
- A closed pipe (``simdist ... --json | head -c 10``) ends the command quietly: `BrokenPipeError` is caught
  and stdout pointed at /dev/null so that the interpreter's final flush does not fail again.
- `notes_to_stderr` prints each `simdist.errors.SimdistWarning` as ``note: ...`` and any other warning as
  ``warning: ...``, one line each.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

from simdist.errors import SimdistWarning
from simdist.files import json_text


class OutputClosed(Exception):
    """stdout's reader went away (a closed pipe): stop quietly."""


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Hold a SIGINT back until the block is done, then act on it as the handler before would have.

    The Python-level handler is swapped (masking the signal would not do: the kernel may hand a process-directed
    signal to another thread, whose C handler still trips the main thread's KeyboardInterrupt).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    old = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
    if pending and old is not signal.SIG_IGN:
        if callable(old):
            old(signal.SIGINT, None)
        else:
            raise KeyboardInterrupt


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def emit(text: str, *, stream: Any = None) -> None:
    """Write ``text`` (plus a newline if it lacks one) as one block: complete, or not at all."""
    out = stream if stream is not None else sys.stdout
    if text and not text.endswith("\n"):
        text += "\n"
    with _sigint_held():
        try:
            out.write(text)
            out.flush()
        except BrokenPipeError:
            if out is sys.stdout:
                _silence_stdout()
            raise OutputClosed from None


def print_json(doc: Any) -> None:
    """One strict JSON document on stdout."""
    emit(json_text(doc))


def _one_line(message: Any, category: type[Warning], *_: Any, **__: Any) -> None:
    label = "note" if issubclass(category, SimdistWarning) else "warning"
    text = " ".join(str(message).split())
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(f"{label}: {text}\n")
        sys.stderr.flush()


@contextlib.contextmanager
def notes_to_stderr() -> Iterator[None]:
    """Within the block, warnings print as one line each (``note: ...``), every time they occur."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", SimdistWarning)
        warnings.showwarning = _one_line  # restored by catch_warnings
        yield
