"""Measured training steps: the `StepMeasurement` schema, its CSV reader and writer (no torch here).

The validation harness (``python -m validation.mlp``) times full training steps (forward, backward,
optimizer update) of the CS336 lecture's MLP under each parallel cut and writes one row per cut and
configuration. The CSV has a header row naming `STEP_CSV_COLUMNS` (order free, extra columns ignored),
optional leading ``# key: value`` metadata lines (torch and NCCL versions, backend, device, host count,
the command), and blank or ``#`` lines anywhere, which readers skip. Columns:

- ``cut``: single | data_parallel | data_parallel_bucketed | tensor_parallel | pipeline_gpipe | pipeline_1f1b
- ``world_size`` (ranks), ``num_layers``, ``width`` (square layers width x width), ``global_batch``
  (examples per step over all ranks), ``num_microbatches`` (1 unless pipeline): positive integers
- ``dtype`` (e.g. fp32), ``backend`` (gloo | nccl), ``device`` (CPU model or GPU name), ``source``
- ``time_s``: median over timed iterations of the per-iteration maximum over ranks (seconds, > 0)
- ``time_mean_s``: mean over iterations and ranks (seconds, > 0); ``num_samples``: timed iterations (> 0)

Every problem with a file is a one-line `SpecError` naming the file and line and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from simdist.calibrate.measurements import (
    _first_data_line,
    _number,
    read_csv_rows,
    write_dataclass_csv,
)
from simdist.errors import SpecError
from simdist.files import read_text

__all__ = ["CUTS", "STEP_CSV_COLUMNS", "StepMeasurement", "read_csv_metadata", "read_step_measurements",
           "write_step_measurements_csv"]

CUTS: tuple[str, ...] = ("single", "data_parallel", "data_parallel_bucketed", "tensor_parallel",
                         "pipeline_gpipe", "pipeline_1f1b")
BACKENDS: tuple[str, ...] = ("gloo", "nccl", "mpi", "none")


@dataclass(frozen=True, slots=True)
class StepMeasurement:
    """One timed training step of the MLP under one parallel cut."""

    cut: str
    world_size: int
    num_layers: int
    width: int
    global_batch: int
    num_microbatches: int
    dtype: str
    time_s: float
    time_mean_s: float
    num_samples: int
    backend: str
    device: str
    source: str


STEP_CSV_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(StepMeasurement))
_INT_COLUMNS = ("world_size", "num_layers", "width", "global_batch", "num_microbatches", "num_samples")
_TIME_COLUMNS = ("time_s", "time_mean_s")
_REQUIRED = tuple(c for c in STEP_CSV_COLUMNS if c != "source")


def write_step_measurements_csv(
    rows: list[StepMeasurement] | tuple[StepMeasurement, ...],
    path: str | Path,
    *,
    metadata: dict[str, str] | None = None,
) -> None:
    """Write ``rows`` (all `STEP_CSV_COLUMNS`) after ``metadata`` as ``# key: value`` lines."""
    write_dataclass_csv(rows, STEP_CSV_COLUMNS, path, metadata=metadata)


def read_step_measurements(path: str | Path) -> list[StepMeasurement]:
    """Read a step CSV written by `write_step_measurements_csv` (or by hand with the same header)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("no such step measurement file", source=str(p), fix="check the path")
    source = str(p)
    text = read_text(p, errors="replace")
    first = _first_data_line(text)
    if first is None:
        raise SpecError("step CSV is empty", source=source,
                        fix=f"write a header row {','.join(STEP_CSV_COLUMNS)} and one row per step")
    return read_csv_rows(text, source, _REQUIRED, _row_to_step, what="step CSV",
                         header_fix=f"the header must name {','.join(STEP_CSV_COLUMNS)}",
                         rows_fix="add one row per measured step")


def read_csv_metadata(path: str | Path) -> dict[str, str]:
    """The leading ``# key: value`` lines of a CSV as a dict (a repeated key joins its lines with newlines)."""
    meta: dict[str, str] = {}
    for line in read_text(path, errors="replace").splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if not stripped.startswith("#"):
            break
        key, sep, value = stripped[1:].strip().partition(":")
        if sep:
            value = value[1:] if value.startswith(" ") else value
            meta[key] = f"{meta[key]}\n{value}" if key in meta else value
    return meta


def _row_to_step(row: dict[str, str], source: str) -> StepMeasurement:
    cut = row["cut"]
    if cut not in CUTS:
        raise SpecError(f"unknown cut '{cut}'", field="cut", fix=f"use one of: {', '.join(CUTS)}")
    backend = row["backend"]
    if backend not in BACKENDS:
        raise SpecError(f"unknown backend '{backend}'", field="backend", fix=f"use one of: {', '.join(BACKENDS)}")
    ints = {c: int(_number(row, c, integer=True, positive=True)) for c in _INT_COLUMNS}
    times = {c: _number(row, c, positive=True) for c in _TIME_COLUMNS}
    for column in ("dtype", "device"):
        if not row[column]:
            raise SpecError(f"{column} is blank", field=column, fix=f"write the {column}, e.g. fp32 / the CPU model")
    if cut != "single" and ints["world_size"] < 2:
        raise SpecError(f"cut {cut} needs at least 2 ranks, got {ints['world_size']}", field="world_size",
                        fix="write the number of ranks the step ran on, or cut single")
    if not cut.startswith("pipeline") and ints["num_microbatches"] != 1:
        raise SpecError(f"cut {cut} has no micro-batches, got {ints['num_microbatches']}", field="num_microbatches",
                        fix="write 1 for cuts other than pipeline_gpipe and pipeline_1f1b")
    return StepMeasurement(
        cut=cut, dtype=row["dtype"], backend=backend, device=row["device"],
        source=row.get("source") or source, **ints, **times,
    )
