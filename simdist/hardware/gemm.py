"""Tile and wave quantization of a GEMM on a GPU (NVIDIA, "Matrix Multiplication Background User's Guide",
docs.nvidia.com/deeplearning/performance/dl-performance-matrix-multiplication, sec. "Tile Quantization" and
"Wave Quantization").

A GEMM C[m, n] = A[m, k] B[k, n] runs as thread blocks, each computing one tile_m x tile_n output tile through
ceil(k / tile_k) k-steps; the blocks of a GEMM (and of every GEMM of a batched call) run in waves of one block per
SM. Work is done in whole tiles, whole k-steps and whole waves, so the useful share of what the GPU executes is

    quantization = (m n k batch) / (ceil(m/tile_m) tile_m x ceil(n/tile_n) tile_n x ceil(k/tile_k) tile_k
                                    x batch x waves x num_sms / tiles),   waves = ceil(tiles / num_sms),
    tiles = ceil(m/tile_m) ceil(n/tile_n) batch,

1 when every dimension divides into tiles and the tiles into waves. cuBLAS picks among several kernels; the model
takes the tile of ``data/gemm_tiles.csv`` with the largest useful share. The architecture and SM count of each GPU
are in ``data/gpu_architecture.csv``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources

from simdist.spec.gpu import GpuSpec

__all__ = ["BLACKWELL", "TILE_FAMILY", "Architecture", "architecture", "quantization", "tiles_of"]


BLACKWELL = ("blackwell", "blackwell_ultra")
"""The architectures with Blackwell's block-scaled tensor cores (MXFP8: Transformer Engine MXFP8BlockScaling needs
compute capability 10.0+; B300 is sm103)."""


@dataclass(frozen=True, slots=True)
class Architecture:
    name: str
    num_sms: int


def _rows(name: str) -> list[dict[str, str]]:
    text = (resources.files("simdist.hardware") / "data" / name).read_text(encoding="utf-8")
    return list(csv.DictReader(line for line in text.splitlines() if not line.startswith("#")))


@cache
def _architectures() -> dict[str, Architecture]:
    return {r["gpu"]: Architecture(r["architecture"], int(r["num_sms"])) for r in _rows("gpu_architecture.csv")}


@cache
def _tiles() -> dict[tuple[str, str], tuple[tuple[int, int, int], ...]]:
    out: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
    for r in _rows("gemm_tiles.csv"):
        out.setdefault((r["architecture"], r["operand"]), []).append(
            (int(r["tile_m"]), int(r["tile_n"]), int(r["tile_k"])))
    return {k: tuple(v) for k, v in out.items()}


def architecture(gpu: GpuSpec) -> Architecture:
    """The GPU's row of gpu_architecture.csv (the ``default`` row for a GPU without one)."""
    table = _architectures()
    return table.get(gpu.name, table["default"])


TILE_FAMILY = {"blackwell_ultra": "blackwell"}
"""Architectures whose GEMM kernels are another's: Blackwell Ultra (B300, GB300) keeps Blackwell's tcgen05 UMMA tiles
(NVIDIA, 'Inside NVIDIA Blackwell Ultra': the same fifth-generation tensor cores)."""


def tiles_of(arch: str, dtype: str) -> tuple[tuple[int, int, int], ...]:
    """Candidate (tile_m, tile_n, tile_k) of ``arch`` for ``dtype`` operands (8-bit: ``fp8`` rows); () if none."""
    return _tiles().get((TILE_FAMILY.get(arch, arch), "fp8" if dtype == "fp8" else "16bit"), ())


def _useful_share(m: int, n: int, k: int, batch: int, tile: tuple[int, int, int], num_sms: int) -> float:
    tm, tn, tk = tile
    mt, nt, kt = math.ceil(m / tm), math.ceil(n / tn), math.ceil(k / tk)
    tiles = mt * nt * batch
    waves = math.ceil(tiles / num_sms)
    executed = waves * num_sms * tm * tn * kt * tk  # per wave slot: one whole tile over whole k-steps
    return (m * n * k * batch) / executed


@lru_cache(maxsize=65536)
def _quantization(arch: str, num_sms: int, dtype: str, m: int, n: int, k: int, batch: int) -> float:
    tiles = tiles_of(arch, dtype)
    if not tiles or min(m, n, k, batch) < 1:
        return 1.0
    return max(_useful_share(m, n, k, batch, t, num_sms) for t in tiles)


def quantization(gpu: GpuSpec, mnk: tuple[int, int, int], dtype: str = "bf16", batch: int = 1) -> float:
    """Useful share (0, 1] of the tensor-core work a (batched) GEMM executes, after tile and wave quantization."""
    arch = architecture(gpu)
    m, n, k = mnk
    return _quantization(arch.name, arch.num_sms, dtype, int(m), int(n), int(k), max(1, int(batch)))
