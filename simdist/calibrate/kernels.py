"""Measured compute kernels: the `KernelMeasurement` schema, its CSV reader and writer, and the simdist kernel each
row is priced as (no torch here).

``python -m validation.kernels`` times single kernels on one device (GEMMs of a scenario's layers and a size sweep,
attention through torch's scaled_dot_product_attention, norm and element-wise kernels) and ``python -m
validation.moe`` its experts' GEMMs, one at a time and as a grouped call, and its token permutation; both write one
row per kernel. The CSV has a header row (order free, extra columns ignored), optional leading ``# key: value``
metadata lines (torch version, device, command), and blank or ``#`` lines anywhere, which readers skip. Columns:

- ``kernel``: gemm | attention | memory (the roofline's kinds, simdist.hardware.compute; memory = element-wise,
  norm and softmax kernels, bandwidth-bound)
- ``name``: what was measured (``sweep``, a layer kernel's name such as ``mlp_up``, ``layer_norm``, ``sdpa``)
- ``dtype``: fp32 | bf16 | fp16 | fp8 (simdist.calibrate.compute_fit.DTYPES spellings)
- ``flops``, ``hbm_bytes``: the work as simdist counts it (simdist.plan.layer_cost: a GEMM 2mnk per batch entry and
  its operands read and result written; fused attention 4 b a s^2 d forward, 2.5x that backward, halved when
  causal; a memory kernel its bytes read + written)
- ``m``, ``n``, ``k``, ``batch``: one GEMM's shape and how many run in the call (gemm, attention: (s_q, s_k, d),
  batch = b x heads); blank for memory kernels
- ``seq_len``, ``head_dim``, ``causal`` (true/false), ``direction`` (forward/backward), ``attention_kernel``
  (flash2 | flash3 | cudnn: priced from simdist.hardware.attention's measured curves on GPUs that have them;
  anything else, e.g. ``cpu`` or ``math``: priced as batched GEMMs): attention rows only
- ``time_s``: median over timed iterations (seconds, > 0); ``time_mean_s``: their mean; ``num_samples``: how many
- ``device`` (the GPU or CPU model), ``source``

Every problem with a file is a one-line `SpecError` naming the file and line and the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

from simdist.calibrate.measurements import _first_data_line, _number, read_csv_rows, write_dataclass_csv
from simdist.errors import SpecError
from simdist.files import read_text
from simdist.limits import KERNEL_ROWS
from simdist.plan.layer_cost import AttentionShape, Kernel

__all__ = ["FUSED_ATTENTION", "KERNEL_CSV_COLUMNS", "KERNEL_KINDS", "KernelMeasurement", "kernel_of",
           "looks_like_kernel_csv", "read_kernel_measurements", "write_kernel_measurements_csv"]

KERNEL_KINDS: tuple[str, ...] = ("gemm", "attention", "memory")
FUSED_ATTENTION: tuple[str, ...] = ("flash2", "flash3", "cudnn")  # simdist.hardware.attention.KERNELS


@dataclass(frozen=True, slots=True)
class KernelMeasurement:
    """One timed kernel on one device."""

    kernel: str
    name: str
    dtype: str
    flops: float
    hbm_bytes: float
    time_s: float
    time_mean_s: float
    num_samples: int
    device: str
    source: str
    m: int | None = None
    n: int | None = None
    k: int | None = None
    batch: int = 1
    seq_len: int | None = None
    head_dim: int | None = None
    causal: bool | None = None
    direction: str | None = None
    attention_kernel: str | None = None


KERNEL_CSV_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(KernelMeasurement))
_REQUIRED = ("kernel", "name", "dtype", "flops", "hbm_bytes", "time_s")
_SHAPE = ("m", "n", "k")


def looks_like_kernel_csv(header: set[str]) -> bool:
    """Whether a CSV header is this schema's (simdist.api.calibration tells the measurement files apart by it)."""
    return {"kernel", "flops", "hbm_bytes", "time_s"} <= header


def write_kernel_measurements_csv(rows: list[KernelMeasurement] | tuple[KernelMeasurement, ...], path: str | Path,
                                  *, metadata: dict[str, str] | None = None) -> None:
    """Write ``rows`` (all `KERNEL_CSV_COLUMNS`, None as blank) after ``metadata`` as ``# key: value`` lines."""
    write_dataclass_csv(rows, KERNEL_CSV_COLUMNS, path, metadata=metadata)


def read_kernel_measurements(path: str | Path) -> list[KernelMeasurement]:
    """Read a kernel CSV written by `write_kernel_measurements_csv` (or by hand with the same header)."""
    p = Path(path)
    if not p.is_file():
        raise SpecError("no such kernel measurement file", source=str(p), fix="check the path")
    text = read_text(p, errors="replace")
    if _first_data_line(text) is None:
        raise SpecError("kernel CSV is empty", source=str(p),
                        fix=f"write a header row {','.join(KERNEL_CSV_COLUMNS)} and one row per kernel")
    return read_csv_rows(text, str(p), _REQUIRED, _row_to_kernel, what="kernel CSV",
                         header_fix=f"the header must name at least {','.join(_REQUIRED)} "
                                    f"(columns: {','.join(KERNEL_CSV_COLUMNS)})",
                         rows_fix="add one row per measured kernel", limit=KERNEL_ROWS)


def _optional_int(row: dict[str, str], column: str) -> int | None:
    return int(_number(row, column, integer=True, positive=True)) if row.get(column) else None


def _row_to_kernel(row: dict[str, str], source: str) -> KernelMeasurement:
    kind = row["kernel"]
    if kind not in KERNEL_KINDS:
        raise SpecError(f"unknown kernel kind '{kind}'", field="kernel", fix=f"use one of: {', '.join(KERNEL_KINDS)}")
    if not row["dtype"]:
        raise SpecError("dtype is blank", field="dtype", fix="write the kernel's dtype, e.g. fp32 or bf16")
    flops, nbytes = _number(row, "flops"), _number(row, "hbm_bytes")
    time_s = _number(row, "time_s", positive=True)
    mean = _number(row, "time_mean_s", positive=True) if row.get("time_mean_s") else time_s
    shape = {c: _optional_int(row, c) for c in _SHAPE}
    if kind != "memory" and None in shape.values():
        missing = ", ".join(c for c, v in shape.items() if v is None)
        raise SpecError(f"a {kind} row without {missing}", field=missing.split(",")[0],
                        fix="write the GEMM's m, n and k (attention: s_q, s_k, head dim)")
    if kind == "gemm" and flops <= 0:
        raise SpecError("a GEMM row with no FLOPs", field="flops", fix="write 2 m n k x batch")
    causal_text = row.get("causal", "").lower()
    if causal_text not in ("", "true", "false"):
        raise SpecError(f"'{row['causal']}' is not a boolean", field="causal", fix="write true or false")
    direction = row.get("direction") or None
    if direction not in (None, "forward", "backward"):
        raise SpecError(f"unknown direction '{direction}'", field="direction", fix="write forward or backward")
    return KernelMeasurement(
        kernel=kind, name=row["name"] or kind, dtype=row["dtype"], flops=flops, hbm_bytes=nbytes, time_s=time_s,
        time_mean_s=mean, num_samples=_optional_int(row, "num_samples") or 1, device=row.get("device", ""),
        source=row.get("source") or source, batch=_optional_int(row, "batch") or 1,
        seq_len=_optional_int(row, "seq_len"), head_dim=_optional_int(row, "head_dim"),
        causal=None if not causal_text else causal_text == "true", direction=direction,
        attention_kernel=row.get("attention_kernel") or None, **shape)


def kernel_of(row: KernelMeasurement) -> Kernel:
    """The simdist kernel a measured row is priced as (simdist.hardware.compute.kernel_time_s): a GEMM with its
    (m, n, k); a fused attention kernel (flash2/flash3/cudnn) with its shape; other attention as batched GEMMs."""
    mnk = (row.m, row.n, row.k) if row.m and row.n and row.k else None
    attention = None
    if row.kernel == "attention" and row.attention_kernel in FUSED_ATTENTION:
        attention = AttentionShape(row.attention_kernel, row.direction or "forward", row.head_dim or (row.k or 1),
                                   ((1.0, bool(row.causal), float(row.seq_len or row.m or 1)),))
    fp8 = row.kernel == "gemm" and row.dtype.lower() == "fp8"
    return Kernel(row.name, row.flops, row.hbm_bytes, row.kernel, mnk, dtype="fp8" if fp8 else None,
                  attention=attention)
