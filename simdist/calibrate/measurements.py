"""Measured collective times: the `Measurement` schema and `read_measurements`, which detects the format.

A measurement is one nccl-tests style data point. Sizes and bandwidths follow nccl-tests
(doc/PERFORMANCE.md): ``nbytes`` is the ``size`` column (see simdist.collectives.ops for what it
means per op), algbw = nbytes / time and busbw = algbw x the op's factor (2(n-1)/n for all_reduce,
(n-1)/n for all_gather, reduce_scatter and all_to_all, 1 otherwise), all in bytes per second.

`read_measurements(path)` reads three formats, told apart by their content:

(a) our CSV, one measurement a row, with a header row. Required columns:
    ``op`` (a simdist op name: all_reduce, all_gather, ...), ``nbytes`` (the nccl-tests size, bytes),
    ``num_ranks`` (ranks in the communicator), ``time_s`` (seconds, > 0).
    Optional columns: ``algbw_Bps`` and ``busbw_Bps`` (bytes/s; computed from the above when absent
    or blank), ``dtype``, ``algorithm`` (e.g. ring, tree, nvls; blank = NCCL's own choice),
    ``in_place`` (true/false, default false), ``num_nodes``, ``label``, ``nccl_version``, ``device`` (the GPU
    or CPU it ran on; blank: the file's ``# gpu:`` metadata line, else ``# cpu_model:`` on a gloo run),
    ``source`` (where the point came from; defaults to the CSV's own path) and ``imbalance`` (all_to_all with
    unequal splits, ``python -m validation.moe``: the busiest rank's received bytes / the mean, between 1 and
    num_ranks; ``nbytes`` is then each rank's send buffer, as simdist.plan.layer_cost.CommWork counts it;
    blank or absent: 1, the even all_to_all). Other columns are ignored, as are
    blank lines and lines starting with ``#``. `write_measurements_csv` writes every column.
(b) the text nccl-tests prints (``all_reduce_perf -b 8 -e 8G -f 2 -g 8 > out.txt``);
(c) the JSON file of nccl-tests ``-J out.json``. (b) and (c): see simdist.calibrate.nccltests.

The format is told by content alone, never by the file's name: a JSON document (first character ``{`` or
``[``) is read as nccl-tests ``-J`` output, text with an nccl-tests header, column header or footer line as
nccl-tests stdout (so ``node17.log`` is read as well as ``all_reduce_perf.txt``), and a first data line with
commas as our CSV.

Every problem with a file is a one-line `SpecError` naming the file (and line) and the fix.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import astuple, dataclass, fields, replace
from pathlib import Path

from simdist.collectives.ops import OPS, algbw_Bps, busbw_Bps
from simdist.errors import SimdistError, SpecError
from simdist.files import read_text
from simdist.limits import MEASURED_TIME_MAX, MEASURED_TIME_MIN, Limit, check_work

__all__ = ["CSV_COLUMNS", "REQUIRED_COLUMNS", "Measurement", "read_measurements", "write_measurements_csv",
           "write_text_atomic"]


@dataclass(frozen=True, slots=True)
class Measurement:
    """One measured collective: ``op`` on ``num_ranks`` ranks moved ``nbytes`` in ``time_s``."""

    op: str
    nbytes: int
    num_ranks: int
    time_s: float
    algbw_Bps: float
    busbw_Bps: float
    source: str
    dtype: str | None = None
    algorithm: str | None = None  # None: NCCL's own choice (no NCCL_ALGO)
    in_place: bool = False
    num_nodes: int | None = None
    label: str | None = None
    nccl_version: str | None = None
    device: str | None = None  # the GPU (or CPU, for gloo) it ran on, as the tool names it: "NVIDIA A100-SXM4-80GB"
    imbalance: float = 1.0  # all_to_all: busiest rank's received bytes / the mean (1: even splits)


CSV_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Measurement))
REQUIRED_COLUMNS: tuple[str, ...] = ("op", "nbytes", "num_ranks", "time_s")
_TRUE, _FALSE = {"true", "1", "yes", "y"}, {"false", "0", "no", "n", ""}


def read_measurements(path: str | Path) -> list[Measurement]:
    """Read measurements from our CSV, nccl-tests text output or nccl-tests ``-J`` JSON (detected)."""
    from simdist.calibrate import nccltests  # imports this module: import here, not at the top

    p = Path(path)
    if not p.is_file():
        raise SpecError("no such measurement file", source=str(p), fix="check the path")
    text = read_text(p, errors="replace")
    if _first_data_line(text) is None:
        raise SpecError("measurement file is empty (no header, no rows)", source=str(p),
                        fix="pass a file with measurements; a run that failed before writing them leaves none")
    if text.lstrip().startswith(("{", "[")):
        return nccltests.parse_nccltests_json(text, source=str(p))
    if nccltests.looks_like_nccltests_text(text):
        return nccltests.parse_nccltests_text(text, source=str(p))
    first = _first_data_line(text)
    if first is not None and "," in first[1]:
        return _read_csv(text, str(p))
    raise SpecError(
        "unknown measurement format (not our CSV, nccl-tests output or nccl-tests JSON)",
        source=str(p),
        fix="pass a CSV with the header op,nbytes,num_ranks,time_s, the stdout of an nccl-tests binary "
        "(e.g. all_reduce_perf), or the file written by nccl-tests -J",
    )


def write_measurements_csv(
    rows: list[Measurement] | tuple[Measurement, ...], path: str | Path, *, metadata: dict[str, str] | None = None
) -> None:
    """Write ``rows`` as our CSV (all `CSV_COLUMNS`; None as blank); `read_measurements` reads it back.

    ``metadata`` (e.g. torch and NCCL versions, device, command) goes first as ``# key: value`` lines, one
    per line of a multi-line value; readers skip ``#`` lines.
    """
    write_dataclass_csv(rows, CSV_COLUMNS, path, metadata=metadata)


def write_dataclass_csv(rows, columns: tuple[str, ...], path: str | Path, *, metadata: dict[str, str] | None = None
                        ) -> None:
    """``metadata`` as ``# key: value`` lines, a header of ``columns`` (the dataclass's fields in order), one row per
    dataclass (floats by repr, so they read back exactly; None as blank), written whole or not at all. Shared by the
    collective, step and kernel schemas."""
    out = io.StringIO()
    out.write(_metadata_lines(metadata))
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for m in rows:
        writer.writerow(["" if v is None else repr(v) if isinstance(v, float) else v for v in astuple(m)])
    write_text_atomic(path, out.getvalue())


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: a hidden temporary file beside it, then a rename
    (POSIX rename(2) replaces the target atomically), so a crash or a full disk never leaves half a file."""
    from simdist.files import write_text  # one atomic writer for every file simdist writes

    write_text(path, text)


def _metadata_lines(metadata: dict[str, str] | None) -> str:
    """``# key: value`` comment lines for a CSV's head (a multi-line value repeats its key on each line)."""
    out: list[str] = []
    for key, value in (metadata or {}).items():
        name = "_".join(str(key).split())
        lines = str(value).splitlines() or [""]
        out += [f"# {name}: {line.rstrip()}" for line in lines]
    return "".join(line + "\n" for line in out)


def _first_data_line(text: str) -> tuple[int, str] | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip() and not line.lstrip().startswith("#"):
            return number, line
    return None


def read_csv_rows(text: str, source: str, required: tuple[str, ...], convert, *, what: str, header_fix: str,
                  rows_fix: str, limit: Limit | None = None) -> list:
    """Rows of a CSV (``#`` lines and blank lines skipped) converted one by one by ``convert(row, source)``;
    every problem is one SpecError naming ``source:line``. Shared by the collective and the step schemas.
    ``limit``: the most rows the caller's work allows, refused (`LimitError`) before any row is converted."""
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), start=1)
                if line.strip() and not line.lstrip().startswith("#")]
    if limit is not None:
        check_work(len(numbered) - 1, limit, what=f"the {what}'s row count", source=source,
                   fix="fit on fewer measurements (every other size, or one file per device)")
    head_line, head_text = numbered[0]
    header = [h.strip() for h in next(csv.reader([head_text]))]
    missing = [c for c in required if c not in header]
    if missing:
        raise SpecError(f"{what} header lacks column(s) {', '.join(missing)}", source=f"{source}:{head_line}",
                        fix=header_fix)
    out = []
    for number, line in numbered[1:]:
        values = next(csv.reader([line]))
        if len(values) != len(header):
            raise SpecError(
                f"row has {len(values)} fields, the header {len(header)}",
                source=f"{source}:{number}",
                fix="give every row one value per header column (blank for none)",
            )
        row = dict(zip(header, (v.strip() for v in values), strict=True))
        try:
            out.append(convert(row, source))
        except SimdistError as exc:
            raise exc.located(source=f"{source}:{number}") from None
    if not out:
        raise SpecError(f"{what} has a header but no rows", source=source, fix=rows_fix)
    return out


def _read_csv(text: str, source: str) -> list[Measurement]:
    rows = read_csv_rows(
        text, source, REQUIRED_COLUMNS, _row_to_measurement, what="CSV",
        header_fix=f"the header must name at least {','.join(REQUIRED_COLUMNS)} (columns: {','.join(CSV_COLUMNS)})",
        rows_fix="add one row per measurement")
    device = _metadata_device(text)
    if device is None:
        return rows
    return [m if m.device else replace(m, device=device) for m in rows]


def _metadata_device(text: str) -> str | None:
    """The device a harness CSV's ``# key: value`` head names: ``gpu``, else ``cpu_model`` of a gloo run."""
    meta: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        key, sep, value = stripped.lstrip("#").strip().partition(":")
        if sep and key.strip() not in meta:
            meta[key.strip()] = value.strip()
    if meta.get("gpu"):
        return meta["gpu"]
    if meta.get("backend") == "gloo" and meta.get("cpu_model"):
        return meta["cpu_model"]
    return None


def _number(row: dict[str, str], column: str, *, integer: bool = False, positive: bool = False) -> float:
    text = row.get(column, "")
    try:
        value = float(text)
    except ValueError:
        raise SpecError(
            f"'{text}' is not a number", field=column, fix=f"write {column} as a plain number, e.g. 1048576"
        ) from None
    bad = not math.isfinite(value) or value < 0 or (positive and value == 0) or (integer and value != int(value))
    if bad:
        what = "a positive" if positive else "a non-negative"
        raise SpecError(f"{text} is not {what} {'integer' if integer else 'number'}", field=column,
                        fix=f"write {column} as {what} {'integer' if integer else 'number'}")
    return value


def _row_to_measurement(row: dict[str, str], source: str) -> Measurement:
    op = row["op"]
    if op not in OPS:
        raise SpecError(f"unknown collective '{op}'", field="op", fix=f"use one of: {', '.join(OPS)}")
    nbytes = int(_number(row, "nbytes", integer=True))
    num_ranks = int(_number(row, "num_ranks", integer=True, positive=True))
    time_s = _number(row, "time_s", positive=True)
    if not MEASURED_TIME_MIN.value <= time_s <= MEASURED_TIME_MAX.value:
        limit = MEASURED_TIME_MIN if time_s < MEASURED_TIME_MIN.value else MEASURED_TIME_MAX
        raise SpecError(f"time_s {row.get('time_s')} is {'below' if limit is MEASURED_TIME_MIN else 'above'} "
                        f"{limit.text()} ({limit.reason})", source=source,
                        fix="write time_s in seconds (nccl-tests prints microseconds)")
    algbw = _number(row, "algbw_Bps") if row.get("algbw_Bps") else algbw_Bps(nbytes, time_s)
    busbw = _number(row, "busbw_Bps") if row.get("busbw_Bps") else busbw_Bps(op, num_ranks, nbytes, time_s)
    if row.get("algbw_Bps") and nbytes > 0:
        # Mixed units: algbw_Bps = nbytes / time_s by definition (nccl-tests doc/PERFORMANCE.md); a factor of 10
        # or more between the two is a unit slip (time in us or ms, bandwidth in GB/s), not rounding.
        ratio = algbw / (nbytes / time_s)
        if not 0.1 < ratio < 10.0:
            raise SpecError(f"algbw_Bps {row['algbw_Bps']} disagrees with nbytes / time_s = {nbytes / time_s:.4g} "
                            f"by a factor {ratio:.3g}: mixed units", field="algbw_Bps",
                            fix="write time_s in seconds and algbw_Bps / busbw_Bps in bytes per second "
                                "(or leave the bandwidth columns blank)")
    in_place_text = row.get("in_place", "").lower()
    if in_place_text not in _TRUE | _FALSE:
        raise SpecError(f"'{row['in_place']}' is not a boolean", field="in_place", fix="write true or false")
    nodes = int(_number(row, "num_nodes", integer=True, positive=True)) if row.get("num_nodes") else None
    imbalance = _number(row, "imbalance") if row.get("imbalance") else 1.0
    if imbalance != 1.0 and op != "all_to_all":
        raise SpecError(f"imbalance {row['imbalance']} on a {op} row (only all_to_all has unequal splits)",
                        field="imbalance", fix="leave imbalance blank (or 1) on rows other than all_to_all")
    if not 1.0 <= imbalance <= num_ranks:
        raise SpecError(f"imbalance {row['imbalance']} is outside 1..{num_ranks} (the ranks)", field="imbalance",
                        fix="write the busiest rank's received bytes / the mean, between 1 and num_ranks")
    return Measurement(
        op=op,
        nbytes=nbytes,
        num_ranks=num_ranks,
        time_s=time_s,
        algbw_Bps=algbw,
        busbw_Bps=busbw,
        source=row.get("source") or source,
        dtype=row.get("dtype") or None,
        algorithm=row.get("algorithm") or None,
        in_place=in_place_text in _TRUE,
        num_nodes=nodes,
        label=row.get("label") or None,
        nccl_version=row.get("nccl_version") or None,
        device=row.get("device") or None,
        imbalance=imbalance,
    )
