"""Results files: JSON lines written as results arrive, so an interrupted sweep can resume.

Line 1 is ``{"problem": {...}}`` (the search it belongs to); every other line is one candidate's closed-form
result (``{"key": ..., "layout": {...}, "step_time_s": ..., ...}``). A file is appended to and flushed per
batch. A sweep killed mid-write leaves a torn last line (no newline, not JSON): reading drops it with a note
and writing truncates it before appending, so the search continues. Any other damage (bytes that are not
text, a line that is not a JSON object, a row missing fields or with a key that does not match its layout)
is one error naming the line: the file was not written by `simdist search`, or was edited.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from simdist.errors import SpecError, note
from simdist.files import json_text, loads_json, open_append
from simdist.limits import RESULT_LINE_BYTES
from simdist.search.space import LAYOUT_FIELDS, OPTIONAL_FIELDS, Candidate, SearchProblem

ROW_NUMBERS = ("step_time_s", "tokens_per_s", "mfu", "memory_per_gpu_bytes")
"""Numbers every result row carries (the ranking and the tables read them)."""
_FIX = "give a results file written by simdist search --out, or a new file name"


@dataclass(slots=True)
class _Scan:
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    good_bytes: int = 0
    """Length of the file up to the end of its last complete line (what is kept)."""
    needs_newline: bool = False
    """The last line is complete JSON but lacks its newline (killed between the two)."""
    has_problem: bool = False


def _damaged(path: Path, number: int, what: str) -> SpecError:
    return SpecError(f"line {number} {what}", source=f"{path}:{number}", field="--resume", fix=_FIX)


def _check_row(row: dict[str, Any], path: Path, number: int) -> None:
    missing = [k for k in ("key", "layout", *ROW_NUMBERS) if k not in row]
    if missing:
        raise _damaged(path, number, f"is a result row without {', '.join(missing)}")
    if not isinstance(row["key"], str) or not isinstance(row["layout"], dict):
        raise _damaged(path, number, "has a key that is not text or a layout that is not an object")
    bad = [k for k in ROW_NUMBERS if isinstance(row[k], bool) or not isinstance(row[k], (int, float))
           or not math.isfinite(row[k]) or row[k] < 0]
    if bad:
        raise _damaged(path, number, f"has {bad[0]} = {row[bad[0]]!r}, not a number >= 0")
    # order, ep, etp: only where placement / expert parallelism is searched
    names = [name for name in LAYOUT_FIELDS if name not in OPTIONAL_FIELDS]
    absent = [n for n in names if n not in row["layout"]]
    if absent:
        raise _damaged(path, number, f"has a layout without {', '.join(absent)}")
    try:
        key = Candidate.from_dict(row["layout"]).key
    except (TypeError, ValueError):
        key = None
    if key != row["key"]:
        raise _damaged(path, number, f"has key {row['key']!r}, which does not match its layout")


def _scan(path: Path, problem: SearchProblem, *, quiet: bool = False) -> _Scan:
    out = _Scan()
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return out
    except OSError as err:
        raise SpecError(f"cannot read {path}: {err.strerror}", field="--resume", fix="give a readable file") from None
    with fh:
        number, offset = 0, 0
        limit = int(RESULT_LINE_BYTES.value)
        while True:
            raw = fh.readline(limit + 1)
            if not raw:
                break
            number += 1
            complete = raw.endswith(b"\n")
            if not complete and len(raw) > limit:
                raise _damaged(path, number, f"is longer than {RESULT_LINE_BYTES.text()}")
            try:
                text = raw.decode("utf-8")
                row = loads_json(text) if text.strip() else None
            except UnicodeDecodeError:
                raise _damaged(path, number, "holds bytes that are not text") from None
            except ValueError:
                if not complete:  # the torn last line of a killed sweep: drop it, continue
                    if not quiet:
                            note(f"{path}:{number}: dropped the incomplete last line (a search stopped while writing "
                             "it); the search continues from the lines before it")
                    break
                raise _damaged(path, number, "is not JSON") from None
            if row is not None:
                if not isinstance(row, dict):
                    raise _damaged(path, number, f"is a JSON {type(row).__name__}, not an object")
                if "problem" in row:
                    if number != 1 and out.has_problem:
                        raise _damaged(path, number, "repeats the problem line")
                    if row["problem"] != problem.as_dict():
                        raise SpecError("the results file belongs to a different search", source=f"{path}:{number}",
                                        field="--resume", fix="repeat the options of the search that wrote it, or "
                                                              "use a new file")
                    out.has_problem = True
                else:
                    if not out.has_problem:
                        raise _damaged(path, number, "comes before the problem line (line 1 must be "
                                                     "{\"problem\": ...})")
                    _check_row(row, path, number)
                    out.rows[row["key"]] = row
            offset += len(raw)
            out.good_bytes = offset
            out.needs_newline = not complete
    return out


def read_results(path: Path, problem: SearchProblem) -> dict[str, dict[str, Any]]:
    """Results already in ``path`` by candidate key; none when the file does not exist yet."""
    return _scan(path, problem).rows


class ResultsWriter:
    """Appends result rows to a results file (after `read_results`), truncating a torn last line first."""

    def __init__(self, path: Path, problem: SearchProblem) -> None:
        self.path = path
        state = _scan(path, problem, quiet=True) if path.exists() else _Scan()
        self._file: TextIO = open_append(path, field="--out")
        try:
            if path.stat().st_size > state.good_bytes:
                self._file.truncate(state.good_bytes)
            if state.needs_newline:
                self._file.write("\n")
            if not state.has_problem:
                self._file.write(json_text({"problem": problem.as_dict()}, compact=True) + "\n")
            self._file.flush()
        except OSError as err:
            self._file.close()
            raise SpecError(f"cannot write {path}: {err.strerror}", field="--out", fix="give a writable file") from None

    def write(self, rows: list[dict[str, Any]]) -> None:
        # one write per batch: a kill leaves whole lines and at most one torn last line
        self._file.write("".join(json_text(row, compact=True) + "\n" for row in rows))
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()
