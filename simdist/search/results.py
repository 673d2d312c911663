"""Results files: JSON lines written as results arrive, so an interrupted sweep can resume.

Line 1 is ``{"problem": {...}}`` (the search it belongs to); every other line is one candidate's closed-form
result (``{"key": ..., "layout": {...}, "step_time_s": ..., ...}``). A file is appended to and flushed per
batch; a torn last line (the sweep was killed mid-write) is ignored on reading.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from simdist.errors import SpecError
from simdist.search.space import SearchProblem


def read_results(path: Path, problem: SearchProblem) -> dict[str, dict[str, Any]]:
    """Results already in ``path`` by candidate key; none when the file does not exist yet."""
    if not path.exists():
        return {}
    out: dict[str, dict[str, Any]] = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise SpecError(f"cannot read {path}: {err.strerror}", field="--resume", fix="give a readable file") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                break  # torn last line of a killed sweep
            raise SpecError(f"line {number} is not JSON", source=str(path), field="--resume",
                            fix="give a results file written by simdist search --out") from None
        if "problem" in row:
            if row["problem"] != problem.as_dict():
                raise SpecError("the results file belongs to a different search", source=str(path),
                                field="--resume", fix="repeat the options of the search that wrote it, or use a new "
                                                      "file")
            continue
        if "key" in row:
            out[row["key"]] = row
    return out


class ResultsWriter:
    def __init__(self, path: Path, problem: SearchProblem) -> None:
        self.path = path
        fresh = not path.exists() or path.stat().st_size == 0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file: TextIO = path.open("a", encoding="utf-8")
        except OSError as err:
            raise SpecError(f"cannot write {path}: {err.strerror}", field="--out", fix="give a writable file") from None
        if fresh:
            self._file.write(json.dumps({"problem": problem.as_dict()}) + "\n")
            self._file.flush()

    def write(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._file.write(json.dumps(row) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
