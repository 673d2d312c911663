"""The CLI's output streams: whole documents on stdout, one-line notes and errors on stderr.

- `emit` writes a command's whole output with one write and a flush, with SIGINT held back meanwhile: a
  Ctrl-C while printing lands after the document (exit 130), so stdout carries the complete document or
  nothing, never a JSON cut in the middle.
- `print_json` emits strict JSON (no NaN or Infinity: `simdist.files.json_text`).
- A closed pipe (``simdist ... --json | head -c 10``) ends the command quietly: `BrokenPipeError` is caught
  and stdout pointed at /dev/null so that the interpreter's final flush does not fail again.
- `notes_to_stderr` prints each `simdist.errors.SimdistWarning` as ``note: ...`` and any other warning as
  ``warning: ...``, one line each.
- Nothing reaches the terminal raw that could drive it: every control character but newline and tab (ESC
  sequences, OSC hyperlinks and titles, carriage returns), C1 controls and the Unicode bidirectional overrides
  and isolates (which reorder what a reader sees, CVE-2021-42574 "Trojan Source") are written as ``\\uXXXX``
  escapes (`terminal_safe`), in documents, JSON (where the escape means the same character) and stderr lines
  alike: scenario names, grid values, file names and calibration fields are users' strings.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from simdist.errors import SimdistNote, SimdistWarning
from simdist.files import json_text, os_fix, os_reason, sigint_held

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    """``text`` with every character that could drive a terminal or reorder what it shows as a ``\\uXXXX`` escape
    (newline and tab kept; see the module docstring)."""
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class OutputClosed(Exception):
    """stdout's reader went away (a closed pipe: no arguments, stop quietly), or it could not be written (a full
    disk behind a redirect: the reason and the fix, one ``error:`` line)."""


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
    if out is None:  # stdout closed at start (`simdist ... >&-`): nobody reads it
        return
    if text and not text.endswith("\n"):
        text += "\n"
    text = terminal_safe(text)
    with sigint_held():
        try:
            try:
                out.write(text)
            except UnicodeEncodeError:  # e.g. PYTHONIOENCODING=ascii: escape what the stream cannot carry
                encoding = getattr(out, "encoding", None) or "ascii"
                out.write(text.encode(encoding, errors="backslashreplace").decode(encoding))
            out.flush()
        except BrokenPipeError:
            if out is sys.stdout:
                _silence_stdout()
            raise OutputClosed from None
        except OSError as err:  # e.g. a full disk behind a redirect: one line, not a traceback
            if out is sys.stdout:
                _silence_stdout()  # the interpreter's last flush would fail again
            fix = ("free space, or redirect the output to another disk" if err.errno in (errno.ENOSPC, errno.EDQUOT)
                   else os_fix(err, "redirect the output to a writable file"))
            raise OutputClosed(os_reason(err), fix) from None


def print_json(doc: Any) -> None:
    """One strict JSON document on stdout."""
    emit(json_text(doc))


def to_stderr(text: str) -> None:
    """One line on stderr, if there is a stderr to write to (it may be closed: ``2>&-``)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        sys.stderr.write(terminal_safe(" ".join(text.split())) + "\n")
        sys.stderr.flush()


def _one_line(message: Any, category: type[Warning], *_: Any, **__: Any) -> None:
    label = "note" if issubclass(category, SimdistNote) else "warning"
    to_stderr(f"{label}: {message}")


@contextlib.contextmanager
def notes_to_stderr() -> Iterator[None]:
    """Within the block, warnings print as one line each (``note: ...``), every time they occur."""
    with warnings.catch_warnings():
        warnings.simplefilter("default", SimdistWarning)  # a warning once per place
        warnings.simplefilter("always", SimdistNote)
        warnings.showwarning = _one_line  # restored by catch_warnings
        yield
