"""Measured points of a calibration: aggregated, held out, placed on the cluster, tiered, and predicted.

Each point is one (op, rank count, nodes, size) with the median of its measured times; its group is placed
on the first GPUs of the cluster (``num_nodes`` spreads it over that many nodes) and sorted into a link tier
(simdist.calibrate.calibration uses the tiers and predictions to fit a calibration).

`predict_details` also says how *bandwidth-bound* the model is at each point: share = beta S / t(S), where
beta is the op's time per byte at its plateau (the model's fastest choice at `PLATEAU_PROBE_BYTES`, as
(t(2B) - t(B)) / B: for t = alpha + beta S that is beta exactly) and t(S) the predicted time. Where the share is
at least `PLATEAU_SHARE`, the latency, protocol and pipeline-fill terms are under 2 % of the time: the point
measures the link's bandwidth, and only such points may change a link efficiency or a plateau factor
(simdist.calibrate.calibration, simdist.calibrate.correction_fit). Below it, beta S / (measured time - latency)
is the fraction of the plateau rate the measurement reached.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from simdist.analytic.select import evaluate, rank_choices
from simdist.calibrate.measurements import Measurement
from simdist.collectives.group import Group
from simdist.collectives.registry import ALGORITHMS, candidates
from simdist.collectives.request import Request
from simdist.collectives.uneven import imbalanced_matrix
from simdist.errors import SimdistError, SimdistWarning, SpecError
from simdist.hardware.presets import load_topology, topology_document
from simdist.hardware.topology import Topology
from simdist.spec.load import Document

HOLDOUTS = ("none", "sizes", "large", "ranks")
PLATEAU_SHARE = 0.98
PLATEAU_PROBE_BYTES = 2.0**36  # 64 GiB: past every preset's knee (NVLink and network alike reach it by ~1 GiB)
TIER_FIELD = {"scale_up": ("scale_up", "efficiency"), "pcie": ("host", "pcie", "efficiency"),
              "inter_node": ("inter_node", "efficiency")}
"""Where a tier's fitted efficiency goes among a template topology's fields."""
_TIER_KINDS = {"scale_up": {"nvlink"}, "pcie": {"pcie"}}


def tier_field(topology: Topology, tier: str) -> tuple[str, ...]:
    """The topology field a tier's fitted efficiency is written to: `TIER_FIELD`, or for a node given as a graph
    (simdist.spec.node_graph) its per-kind efficiency, ``node.efficiency.nvlink`` or ``.pcie``."""
    if topology.spec.node is not None and tier != "inter_node":
        return ("node", "efficiency", "nvlink" if tier == "scale_up" else "pcie")
    return TIER_FIELD[tier]


# --------------------------------------------------------------------------- measured points
@dataclass(frozen=True, slots=True)
class Point:
    """Median of the measurements of one (op, ranks, nodes, size, algorithm)."""

    op: str
    num_ranks: int
    num_nodes: int | None
    nbytes: float
    time_s: float
    algorithm: str | None
    source: str
    samples: int = 1
    imbalance: float = 1.0
    """all_to_all with unequal splits: the busiest rank's received bytes / the mean (simdist.collectives.uneven)."""

    @property
    def series(self) -> tuple:
        return (self.op, self.num_ranks, self.num_nodes, self.algorithm, round(self.imbalance, 1))


def aggregate(measurements: Sequence[Measurement]) -> list[Point]:
    """Median time per (op, ranks, nodes, size, algorithm): robust to warm-up spikes of single samples.

    Barrier and 0-byte rows have no size to fit a bandwidth to: they are skipped with a `SimdistWarning`
    (an error when nothing else is left)."""
    sized = [m for m in measurements if m.op != "barrier" and m.nbytes > 0]
    if measurements and not sized:
        m = measurements[0]
        raise SpecError(f"a {m.op} of {m.nbytes} bytes has no size to fit a bandwidth to, and no other rows are left",
                        source=m.source, fix="measure collectives of one size or more (e.g. --bytes 1K:16M:x4)")
    skipped = len(measurements) - len(sized)
    if skipped:
        where = sorted({m.source for m in measurements if m.op == "barrier" or m.nbytes <= 0})
        warnings.warn(SimdistWarning(f"skipped {skipped} barrier or 0-byte row(s) of {', '.join(where)}: they have "
                                     "no size to fit a bandwidth to"), stacklevel=2)
    groups: dict[tuple, list[Measurement]] = {}
    for m in sized:
        algo = (m.algorithm or "").lower() or None
        algo = algo if algo in ALGORITHMS else None  # e.g. NCCL_ALGO=CollnetDirect: priced as NCCL's choice
        nodes = m.num_nodes if m.num_nodes and m.num_nodes > 1 else None
        # Assumption: imbalances that agree to 1 decimal are one sweep (the harness realises a target imbalance in
        # whole tokens, and the router's own near-even routing varies a little with the tokens, so a sweep's sizes
        # land a little apart); each point is priced at its own measured imbalance.
        imbalance = round(m.imbalance, 1)
        groups.setdefault((m.op, m.num_ranks, nodes, float(m.nbytes), algo, imbalance), []).append(m)
    order = sorted(groups, key=lambda k: (k[0], k[1], k[2] or 0, str(k[4]), k[5], k[3]))
    return [Point(op, n, nodes, size, float(np.median([m.time_s for m in groups[key]])), algo,
                  groups[key][0].source, len(groups[key]),
                  float(np.median([m.imbalance for m in groups[key]])))
            for key in order for (op, n, nodes, size, algo, imbalance) in [key]]


def lower_envelope(points: Sequence[Point]) -> list[Point]:
    """Each point's time lowered to the least time of its sweep at its size or above (same order as given).

    Physics: a collective of more bytes never takes less time (NCCL's choice is the fastest of per-algorithm
    times that each grow with size; gloo's likewise). A measured time above that of a larger size is
    interference, which on a shared host only ever adds time: the envelope removes such spikes (a stalled
    rank, a descheduled proxy: 3-8 ms on gloo sweeps whose latency is 0.1-0.3 ms) and leaves a clean sweep as
    it is (the A100 sample: 1 MiB 102.2 us -> 100.7 us, the time of 2 MiB, and nothing else).
    """
    # Assumption: measurement noise is one-sided (interference adds time, never removes it).
    out = list(points)
    series: dict[tuple, list[int]] = {}
    for i, p in enumerate(points):
        series.setdefault(p.series, []).append(i)
    for idx in series.values():
        floor = math.inf
        for i in sorted(idx, key=lambda i: points[i].nbytes, reverse=True):
            floor = min(floor, points[i].time_s)
            if floor < points[i].time_s:
                out[i] = replace(points[i], time_s=floor)
    return out


def split_holdout(points: Sequence[Point], holdout: str) -> tuple[list[Point], list[Point]]:
    """(fit, held out): ``sizes`` every other size of each sweep, ``large`` its largest third, ``ranks``
    the largest rank count of each op measured at several, ``none`` nothing held out."""
    if holdout not in HOLDOUTS:
        raise SpecError(f"unknown holdout '{holdout}'", field="--holdout", fix=f"use one of: {', '.join(HOLDOUTS)}")
    if holdout == "none":
        return list(points), []
    train, test = [], []
    if holdout == "ranks":
        counts: dict[str, set[int]] = {}
        for p in points:
            counts.setdefault(p.op, set()).add(p.num_ranks)
        held = {op: max(c) for op, c in counts.items() if len(c) > 1}
        if not held:
            raise SpecError("--holdout ranks needs an op measured at two or more rank counts", field="--holdout",
                            fix="use --holdout sizes, or add measurements at another rank count")
        for p in points:
            (test if held.get(p.op) == p.num_ranks else train).append(p)
        return train, test
    series: dict[tuple, list[Point]] = {}
    for p in points:
        series.setdefault(p.series, []).append(p)
    for pts in series.values():
        pts = sorted(pts, key=lambda p: p.nbytes)
        n = len(pts)
        for i, p in enumerate(pts):
            out = n >= 4 and i % 2 == 1 if holdout == "sizes" else n >= 3 and i >= n - math.ceil(n / 3)
            (test if out else train).append(p)
    if not test:
        raise SpecError(f"--holdout {holdout} leaves no point to predict", field="--holdout",
                        fix="measure sweeps of at least 4 sizes, or use --holdout none")
    return train, test


# --------------------------------------------------------------------------- the cluster and its predictions
def build_cluster(topology: str, points: Sequence[Point], *, num_nodes: int | None = None,
                  overrides: dict[str, Any] | None = None) -> Topology:
    """The preset with enough nodes for every measured group (or exactly ``num_nodes``) and ``overrides``."""
    gpn = int(topology_document(topology).data.get("gpus_per_node", 1))
    needed = max([p.num_nodes or -(-p.num_ranks // gpn) for p in points] or [1])
    if num_nodes is not None and num_nodes < needed:
        worst = max(points, key=lambda p: p.num_nodes or -(-p.num_ranks // gpn))
        raise SpecError(f"{worst.op} on {worst.num_ranks} ranks needs {needed} nodes of {topology}, "
                        f"--num-nodes is {num_nodes}", source=worst.source, fix=f"use --num-nodes {needed}")
    doc = Document(data=overrides, source="calibration overrides") if overrides else None
    return load_topology(topology, num_nodes=num_nodes or needed, overrides=doc)


def _group(topology: Topology, p: Point) -> Group:
    gpn = topology.gpus_per_node
    if p.num_nodes is None:
        return Group.first(topology, p.num_ranks)
    per, rest = divmod(p.num_ranks, p.num_nodes)
    if rest or per > gpn or p.num_nodes > topology.num_nodes:
        raise SpecError(f"{p.num_ranks} ranks on {p.num_nodes} nodes do not fit nodes of {gpn} GPUs",
                        source=p.source, fix="check the num_ranks and num_nodes columns")
    return Group(topology, tuple(node * gpn + j for node in range(p.num_nodes) for j in range(per)))


def tier_of(topology: Topology, group: Group) -> str:
    """scale_up (one NVLink domain), pcie (one node without NVLink) or inter_node."""
    if len({topology.locate(r)[0] for r in group.ranks}) > 1:
        return "inter_node"
    if topology.spec.node is not None:  # a node graph: NVLink where the group's routes cross NVLink alone
        kinds = {topology.link(i).kind for a in group.ranks for b in group.ranks if a != b
                 for i in topology.route(a, b).links}
        return "scale_up" if kinds == {"nvlink"} else "pcie"
    return "scale_up" if topology.spec.scale_up is not None else "pcie"


def _tier_efficiency(topology: Topology, tier: str) -> float:
    if tier == "inter_node":
        assert topology.fabric is not None
        return topology.fabric.efficiency
    return next(lk.efficiency for lk in topology.node.links if lk.kind in _TIER_KINDS[tier])


def predict_without_nvls(topology: Topology, points: Sequence[Point]) -> list[float | None]:
    """Each point's time priced as NCCL runs it without NVLink SHARP (its best other algorithm), where the
    tuner's choice is NVLS and the measurement names no algorithm; None elsewhere (simdist.calibrate.calibration
    uses it to tell the links from the in-switch reduction)."""
    from simdist.collectives.nccl_model import nccl_algorithms

    out: list[float | None] = []
    for p in points:
        if p.algorithm is not None:
            out.append(None)
            continue
        group = _group(topology, p)
        request = _request(p, group, p.nbytes)
        choices = rank_choices(request)
        if not choices or choices[0].algorithm != "nvls":
            out.append(None)
            continue
        able = {a.name for a in candidates(request)}
        others = [a for a in (nccl_algorithms(p.op) or ()) if a != "nvls" and a in able]
        rest = rank_choices(request, algorithms=others) if others else []
        out.append(rest[0].predicted_s if rest else None)
    return out


def predict_points(topology: Topology, points: Sequence[Point]) -> np.ndarray:
    """simdist's closed-form time of each point: the (algorithm, protocol) NCCL's tuner would take, or the
    measured algorithm where the file names one (simdist.analytic.select.rank_choices)."""
    return predict_details(topology, points)[0]


def _request(p: Point, group: Group, nbytes: float) -> Request:
    """The priced request of a point of ``nbytes``: the uneven all_to_all of simdist.collectives.uneven where it has
    an imbalance (the busiest rank receives that many times the mean), as a training step prices an MoE dispatch."""
    if p.op == "all_to_all" and p.imbalance != 1.0:
        # Assumption: one busiest receiver and the others alike (simdist.collectives.uneven, as a step prices an
        # MoE dispatch); validation.moe skews routing towards one rank's experts, that pattern up to whole tokens.
        return Request(p.op, group, nbytes, matrix=imbalanced_matrix(p.num_ranks, nbytes, p.imbalance))
    return Request(p.op, group, nbytes)


def predict_details(topology: Topology, points: Sequence[Point]) -> tuple[np.ndarray, np.ndarray]:
    """(`predict_points`, the share of each predicted time that its bytes account for; module doc)."""
    cache: dict[tuple, tuple[float, float]] = {}
    per_byte: dict[tuple, float] = {}
    out = []
    for p in points:
        key = (p.op, p.num_ranks, p.num_nodes, p.nbytes, p.algorithm, p.imbalance)
        if key not in cache:
            try:
                group = _group(topology, p)
                request = _request(p, group, p.nbytes)
                choices = rank_choices(request, algorithms=[p.algorithm] if p.algorithm else None)
            except SpecError:
                raise
            except SimdistError as err:
                raise SpecError(f"{p.op} on {p.num_ranks} ranks cannot be priced on {topology.spec.name}: "
                                f"{err.problem}", source=p.source, fix=err.fix or "check num_ranks") from None
            if not choices:
                raise SpecError(f"no algorithm runs {p.op} on {p.num_ranks} ranks of {topology.spec.name}",
                                source=p.source, fix="remove these rows or calibrate another topology")
            series = p.series
            if series not in per_byte:
                big = rank_choices(_request(p, group, PLATEAU_PROBE_BYTES),
                                   algorithms=[p.algorithm] if p.algorithm else None)[0]
                doubled = evaluate(_request(p, group, 2.0 * PLATEAU_PROBE_BYTES), big.algorithm, big.protocol)
                per_byte[series] = max(0.0, (doubled.predicted_s - big.predicted_s) / PLATEAU_PROBE_BYTES)
            t = choices[0].predicted_s
            cache[key] = (t, min(1.0, per_byte[series] * p.nbytes / t) if t > 0 else 0.0)
        out.append(cache[key])
    arr = np.asarray(out, dtype=float).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]
