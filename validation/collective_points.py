"""The vocabulary of the collective accuracy report (validation.accuracy_collectives): how a published point is
predicted (`Mapping`), a measured point (`Point`), a dataset of them with its source and reasons (`Dataset`), a point
with simdist's prediction (`Record`), and the readers that turn a reference table's row into a `Measurement` with
nccl-tests' conventions (busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather, reduce_scatter and
all_to_all; simdist.collectives.ops)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from simdist import api
from simdist.calibrate.measurements import Measurement
from simdist.collectives.ops import busbw_Bps, op_info

REFERENCE = Path(__file__).resolve().parent / "reference"
REPO = Path(__file__).resolve().parents[1]

MiB = 2**20
GiB = 2**30
PLATEAU_BYTES = 8 * GiB
"""Size at which a plateau bar (a slide's single busbw per fabric) is predicted: nccl-tests sweeps of
the slides end at 8-16 GiB, where every modelled algorithm is within 1 % of its asymptote."""

BANDS: tuple[tuple[str, float, float], ...] = (
    (">= 256 MiB", 256 * MiB, float("inf")),
    ("1 MiB - 256 MiB", 1 * MiB, 256 * MiB),
    ("< 1 MiB", 0.0, 1 * MiB),
)
"""Size bands of the report; the requirement is |error| <= 15 % from 256 MiB and <= 30 % from 1 MiB."""
TOLERANCE = ((256 * MiB, 0.15), (1 * MiB, 0.30))


@dataclass(frozen=True, slots=True)
class Mapping:
    """How a measured point is predicted: ``api.collective(cluster, op, num_ranks, ...)``."""

    cluster: str
    num_ranks: int
    num_nodes: int | None = None
    assignments: tuple[str, ...] = ()
    algorithm: str = "auto"
    fidelity: str = "auto"
    kernel: str = "nccl"
    """What runs an all_to_all (simdist.collectives.ep_kernels): nccl, or MoE dispatch's deepep / hybridep."""

    def describe(self) -> str:
        parts = [f"`{self.cluster}`", f"{self.num_ranks} ranks"]
        if self.num_nodes:
            parts.append(f"{self.num_nodes} nodes")
        parts += [f"`{a}`" for a in self.assignments]
        parts.append(f"algorithm {self.algorithm}")
        if self.kernel != "nccl":
            parts.append(f"kernel {self.kernel}")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Point:
    measurement: Measurement
    mapping: Mapping
    label: str


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    title: str
    reference: str
    harness: str
    """How the numbers were measured (tool, timing), from the source."""
    mapping: str
    """Which preset, ranks, nodes, overrides and algorithm, and why."""
    points: tuple[Point, ...]
    host_overhead_s: tuple[float, float] | None = None
    """The harness's own per-call host overhead range, where its source states one (reported only)."""
    forced: tuple[str, str] | None = None
    """(algorithm, protocol) to report alongside, where the source suggests the run used it (reported only)."""


@dataclass(frozen=True, slots=True)
class Record:
    """One measured point and simdist's prediction of it."""

    dataset: str
    measurement: Measurement
    prediction: api.CollectiveRow
    mapping: Mapping
    label: str

    @property
    def measured_busbw_GBps(self) -> float:
        return self.measurement.busbw_Bps / 1e9

    @property
    def error(self) -> float:
        """predicted busbw / measured busbw - 1 (= measured time / predicted time - 1)."""
        return self.prediction.busbw_GBps / self.measured_busbw_GBps - 1.0

    @property
    def tolerance(self) -> float | None:
        """The requirement for this size (None: below 1 MiB, reported only)."""
        return next((tol for lo, tol in TOLERANCE if self.measurement.nbytes >= lo), None)

    @property
    def band(self) -> str:
        return next(name for name, lo, hi in BANDS if lo <= self.measurement.nbytes < hi)


@dataclass(frozen=True, slots=True)
class NotCovered:
    what: str
    reason: str


@dataclass(frozen=True, slots=True)
class Deviation:
    """Points of a dataset that miss the requirement, why, and what the model achieves on them instead."""

    reason: str
    points: frozenset[str]
    """Labels of the points outside the requirement."""
    bound: float
    """|error| the model stays within on those points (the tests assert it)."""


@dataclass(frozen=True, slots=True)
class Report:
    datasets: tuple[Dataset, ...]
    records: tuple[Record, ...]
    not_covered: tuple[NotCovered, ...] = field(default_factory=tuple)


def size_label(nbytes: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{int(nbytes // scale)}{unit}"
    return f"{nbytes:.0f}B"


def measurement(op: str, nbytes: int, ranks: int, *, source: str, label: str, busbw_GBps: float | None = None,
                 time_s: float | None = None, nodes: int | None = None, algorithm: str | None = None,
                 version: str | None = None) -> Measurement:
    """A Measurement from a busbw (time derived) or a time (busbw derived), nccl-tests conventions."""
    factor = op_info(op).busbw_factor(ranks)
    if time_s is None:
        assert busbw_GBps is not None
        time_s = nbytes * factor / (busbw_GBps * 1e9)
    busbw = busbw_GBps * 1e9 if busbw_GBps is not None else busbw_Bps(op, ranks, nbytes, time_s)
    return Measurement(op=op, nbytes=nbytes, num_ranks=ranks, time_s=time_s, algbw_Bps=busbw / factor,
                       busbw_Bps=busbw, source=source, algorithm=algorithm, num_nodes=nodes, label=label,
                       nccl_version=version or None)

