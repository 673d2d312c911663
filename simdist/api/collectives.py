"""Collectives: simulate one op over a size sweep (simdist collective), curves and comparisons."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simdist.api.calibration import _cluster_calibration
from simdist.errors import SpecError
from simdist.hardware import Topology, load_topology
from simdist.limits import PLAN_TRANSFERS, SWEEP_TRANSFERS, TREE_PRICING, check_work

# Plans whose transfers grow as ranks^2 (one per peer pair, or per pair and channel for the detailed ring),
# estimated before they are built; every other plan is counted once built (simdist.limits.PLAN_TRANSFERS).
_QUADRATIC = ("direct", "halving_doubling", "hierarchical")
_RING_CHANNELS_MAX = 16
_PER_SIZE = 170
"""Transfer-equivalents of choosing a size's algorithm and protocol (simdist.limits.SWEEP_TRANSFERS)."""

# --------------------------------------------------------------------------- collectives
FIDELITIES = ("auto", "detailed", "fast")
# Assumption: above this many peers, or this many transfers in the detailed plan (one transfer per chunk
# per step), the detailed plan is replaced by the fast one; alone on the network both take the closed
# form's time (tests/test_fast_fidelity.py), so the choice changes only how contention is simulated.
DETAILED_MAX_PEERS = 64
DETAILED_MAX_TRANSFERS = 20_000


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    """One simulated collective, reported as nccl-tests does (sizes and bandwidths)."""

    op: str
    nbytes: float
    num_ranks: int
    algorithm: str
    protocol: str
    fidelity: str
    time_s: float
    closed_form_s: float
    algbw_GBps: float | None
    """None for a barrier: it moves no payload, so it has no bandwidth (its time is the figure)."""
    busbw_GBps: float | None
    max_bytes_sent_per_rank: float
    max_bytes_received_per_rank: float
    busiest_links: tuple[dict[str, Any], ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "bytes": self.nbytes, "num_ranks": self.num_ranks, "algorithm": self.algorithm,
            "protocol": self.protocol, "fidelity": self.fidelity, "time_s": self.time_s,
            "closed_form_s": self.closed_form_s, "algbw_GBps": self.algbw_GBps, "busbw_GBps": self.busbw_GBps,
            "max_bytes_sent_per_rank": self.max_bytes_sent_per_rank,
            "max_bytes_received_per_rank": self.max_bytes_received_per_rank,
            "busiest_links": list(self.busiest_links),
        }


def collective(
    cluster: str,
    op: str,
    num_ranks: int,
    sizes: list[float],
    *,
    algorithm: str = "auto",
    protocol: str = "auto",
    num_nodes: int | None = None,
    assignments: list[str] | None = None,
    fidelity: str = "auto",
    root: int = 0,
    calibration: str | Path | None = None,
    matrix: list[list[float]] | None = None,
    kernel: str = "nccl",
) -> list[CollectiveRow]:
    """Simulate ``op`` over the first ``num_ranks`` GPUs of a cluster for every size.

    ``matrix`` (all_to_all only): uneven pieces, ``matrix[i][j]`` bytes from peer i to peer j (MoE token dispatch
    with unbalanced routing); ``sizes`` is then ignored and one row returned, its ``nbytes`` the mean peer's send
    buffer (the nccl-tests size of the balanced all-to-all moving the same bytes). ``kernel`` (all_to_all only): what
    runs it, nccl or the MoE flex dispatcher's deepep / hybridep (simdist.collectives.ep_kernels).

    ``algorithm='auto'`` (and ``protocol='auto'``) take, per size, the pair with the least predicted
    time, as NCCL's tuner does; the chosen plan then runs in the engine. ``calibration``: a calibration
    file fitted for this cluster (`calibrate`): its overrides, latency and bandwidth corrections apply.
    """
    from simdist.analytic.select import evaluate, priced_request, rank_choices
    from simdist.api.checks import whole
    from simdist.collectives.ep_kernels import check_kernel_sms, parse_kernel
    from simdist.collectives.group import Group
    from simdist.collectives.nccl_model import PROTOCOLS, supports
    from simdist.collectives.ops import busbw_Bps, op_info
    from simdist.collectives.registry import algorithm_for
    from simdist.collectives.request import Request
    from simdist.engine.simulate import simulate
    from simdist.hardware.gemm import architecture

    info = op_info(op)
    whole(num_ranks, "--ranks", example="8")
    if parse_kernel(kernel)[0] != "nccl" and op != "all_to_all":
        raise SpecError(f"the {kernel} kernels run the MoE dispatch's all_to_all, not {op}", field="--kernel",
                        fix="use --op all_to_all, or --kernel nccl")
    if isinstance(root, bool) or not isinstance(root, int):
        raise SpecError(f"--root {root!r} is not a whole number", field="--root", fix="give e.g. 0")
    if fidelity not in FIDELITIES:
        raise SpecError(f"unknown fidelity '{fidelity}'", field="--fidelity",
                        fix=f"use one of: {', '.join(FIDELITIES)}")
    if protocol != "auto" and protocol not in PROTOCOLS:
        raise SpecError(f"unknown protocol '{protocol}'", field="--protocol",
                        fix=f"use auto or one of: {', '.join(PROTOCOLS)}")
    cal = _cluster_calibration(calibration, cluster)
    topology = load_topology(cluster, num_nodes=num_nodes, assignments=assignments,
                             overrides=cal.overrides_document() if cal is not None else None)
    group = Group.first(topology, num_ranks)
    if kernel != "nccl":
        check_kernel_sms(kernel, architecture(topology.gpu).num_sms, topology.gpu.name, "--kernel")
    if num_ranks < 2 and op != "barrier":
        raise SpecError(f"{op} needs at least 2 ranks", field="--ranks", fix="give --ranks 2 or more")
    if info.rooted and not 0 <= root < num_ranks:
        raise SpecError(f"root {root} is not one of the {num_ranks} ranks", field="--root",
                        fix=f"use a root in 0..{num_ranks - 1}")
    if algorithm in ("auto", "tree"):
        check_work(num_ranks * len(sizes), TREE_PRICING, what=f"{num_ranks:,} ranks x {len(sizes)} sizes",
                   field="--ranks", fix="sweep fewer sizes or ranks, or name an algorithm (e.g. --algorithm ring)")
    uneven = None
    if matrix is not None:
        if op != "all_to_all":
            raise SpecError(f"a matrix of pieces is for all_to_all, not {op}", field="matrix",
                            fix="use op all_to_all, or drop the matrix")
        if len(matrix) != num_ranks or any(len(row) != num_ranks for row in matrix):
            raise SpecError(f"the matrix must be {num_ranks} x {num_ranks} (one row and column per rank)",
                            field="matrix", fix=f"give {num_ranks} rows of {num_ranks} byte counts")
        if any(not (x >= 0) for row in matrix for x in row) or not any(x > 0 for row in matrix for x in row):
            raise SpecError("the matrix needs byte counts >= 0, some positive", field="matrix",
                            fix="give bytes per (sender, receiver) pair, e.g. [[0, 1e6], [2e6, 0]]")
        uneven = tuple(tuple(float(x) for x in row) for row in matrix)
        sizes = [sum(map(sum, uneven)) / num_ranks]
    rows: list[CollectiveRow] = []
    swept = 0
    for nbytes in sizes:
        if nbytes < 0 or (nbytes == 0 and op != "barrier"):
            raise SpecError(f"size {nbytes:g} must be positive", field="--bytes", fix="give sizes such as 8:8G:x2")
        request = Request(op, group, 0.0 if op == "barrier" else nbytes, root=root, matrix=uneven, kernel=kernel)
        protocols = PROTOCOLS if protocol == "auto" else (protocol,)
        if algorithm == "auto":
            choices = rank_choices(request, protocols=protocols)
            if not choices:
                raise SpecError(f"no algorithm implements {op} on this group", field="--op")
            choice = choices[0]
        else:
            algorithm_for(algorithm, request)  # validates op and applicability, with a clear message
            usable = [p for p in protocols if supports(algorithm, p)]
            if not usable:
                raise SpecError(f"algorithm '{algorithm}' does not run with protocol {protocol}", field="--protocol",
                                fix="use --protocol auto")
            choice = min((evaluate(request, algorithm, p) for p in usable), key=lambda c: c.predicted_s)
        algo = algorithm_for(choice.algorithm, request)
        cost = choice.priced.cost
        correction = cal.correction(op) if cal is not None else None
        if correction is not None:  # t = latency + t_model / rate: simdist.calibrate.calibration.Correction
            cost = dataclasses.replace(cost, base_latency_s=cost.base_latency_s + correction.latency_for(num_ranks),
                                       rate_factor=cost.rate_factor * correction.rate(nbytes))
        priced = dataclasses.replace(priced_request(request, choice.priced), protocol=cost)
        builder = algo.build_fast if algo.build_fast is not None and _fast(fidelity, algo, priced) else algo.build
        fast = builder is algo.build_fast
        if not fast:  # a fast plan's flows are bounded by construction; a detailed plan grows with its steps
            where = f"{choice.algorithm} {op} on {num_ranks:,} ranks (detailed plan)"
            fix = "use fewer ranks, --fidelity fast or auto, or another algorithm"
            if op == "all_to_all" or choice.algorithm in _QUADRATIC or choice.algorithm == "ring":
                per_pair = 1 if op == "all_to_all" else 2 * (_RING_CHANNELS_MAX if choice.algorithm == "ring" else 1)
                pairs = per_pair * num_ranks * (num_ranks - 1)
                check_work(pairs, PLAN_TRANSFERS, what=f"the plan of {where}, estimated,", field="--ranks", fix=fix)
        plan = builder(priced)
        if not fast:
            check_work(plan.num_transfers, PLAN_TRANSFERS, what=f"the plan of {where}", field="--ranks", fix=fix)
            swept += plan.num_transfers + _PER_SIZE
            left = len(sizes) - len(rows) - 1  # projected from this size's plan: refuse early, not after minutes
            check_work(swept + left * (plan.num_transfers + _PER_SIZE), SWEEP_TRANSFERS,
                       what=f"the sweep of {len(sizes)} sizes ({choice.algorithm}, {num_ranks:,} ranks), estimated,",
                       field="--bytes", fix="sweep fewer sizes (e.g. a larger factor: 8:8G:x4) or fewer ranks")
        plan = dataclasses.replace(plan, base_latency_s=plan.base_latency_s + cost.base_latency_s,
                                   per_transfer_latency_s=cost.per_transfer_latency_s,
                                   rate_factor=cost.rate_factor, protocol=cost.name)
        run = simulate([(plan, priced.group)])[0]
        sent, received = plan.bytes_sent(), plan.bytes_received()
        busiest = sorted(run.link_bytes.items(), key=lambda kv: -kv[1])[:5]
        rows.append(CollectiveRow(
            op=op, nbytes=nbytes, num_ranks=num_ranks, algorithm=choice.algorithm, protocol=choice.protocol,
            fidelity="fast" if builder is algo.build_fast else "detailed", time_s=run.time_s,
            closed_form_s=(correction.time_s(choice.predicted_s, nbytes, num_ranks) if correction
                           else choice.predicted_s),
            algbw_GBps=None if op == "barrier" else (nbytes / run.time_s / 1e9) if run.time_s > 0 else 0.0,
            busbw_GBps=None if op == "barrier" else (busbw_Bps(op, num_ranks, nbytes, run.time_s) / 1e9)
            if run.time_s > 0 else 0.0,
            max_bytes_sent_per_rank=max(sent), max_bytes_received_per_rank=max(received),
            busiest_links=tuple(_link_load(topology, link, b, run.time_s) for link, b in busiest),
        ))
    return rows


def _fast(fidelity: str, algo: Any, request: Any) -> bool:
    """Whether to run the fast plan: asked for, or (auto) the detailed one would be large."""
    if fidelity != "auto":
        return fidelity == "fast"
    if request.num_peers > DETAILED_MAX_PEERS:
        return True
    size = algo.detailed_size(request) if algo.detailed_size is not None else request.num_peers ** 2
    return size > DETAILED_MAX_TRANSFERS


def _link_load(topology: Topology, link_id: int, nbytes: float, time_s: float) -> dict[str, Any]:
    link = topology.link(link_id)
    return {"link": link_id, "src": link.src, "dst": link.dst, "kind": link.kind, "bytes": nbytes,
            "utilization": nbytes / (link.effective_bandwidth_Bps * time_s) if time_s > 0 else 0.0}


def collective_curves(cluster: str, op: str, num_ranks: int, sizes: list[float], *, skip: set[str],
                      **options: Any) -> dict[str, list[CollectiveRow]]:
    """A sweep per algorithm that can run ``op`` on this group (for charts), except those in ``skip``."""
    from simdist.collectives.group import Group
    from simdist.collectives.registry import candidates
    from simdist.collectives.request import Request

    topology = load_topology(cluster, num_nodes=options.get("num_nodes"), assignments=options.get("assignments"))
    request = Request(op, Group.first(topology, num_ranks), sizes[0], root=options.get("root", 0))
    out: dict[str, list[CollectiveRow]] = {}
    for algo in candidates(request):
        if algo.name not in skip:
            out[algo.name] = collective(cluster, op, num_ranks, sizes, algorithm=algo.name, **options)
    return out


def curves_for_report(series: dict[str, list[CollectiveRow]]) -> list[Any]:
    """Convert sweeps to the report's curve type (keeps report free of api types)."""
    from simdist.report.collective_html import Curve, CurvePoint

    return [Curve.of(auto_label(rows) if name == "auto" else name,
                     [CurvePoint(r.nbytes, r.time_s, (r.busbw_GBps or 0.0) * 1e9) for r in rows])
            for name, rows in series.items()]


def auto_label(rows: list[CollectiveRow]) -> str:
    """``auto`` with what it chose at each size: "auto (tree to 1 MiB, ring from 2 MiB)"."""
    from simdist.units import format_bytes

    runs: list[list[Any]] = []  # [algorithm, first size, last size]
    for r in sorted(rows, key=lambda r: r.nbytes):
        if runs and runs[-1][0] == r.algorithm:
            runs[-1][2] = r.nbytes
        else:
            runs.append([r.algorithm, r.nbytes, r.nbytes])
    if len(runs) <= 1:
        return f"auto ({runs[0][0]})" if runs else "auto"
    parts = []
    for i, (algo, first, last) in enumerate(runs):
        if i == 0:
            parts.append(f"{algo} to {format_bytes(last)}")
        elif i == len(runs) - 1:
            parts.append(f"{algo} from {format_bytes(first)}")
        else:
            parts.append(f"{algo} {format_bytes(first)}-{format_bytes(last)}")
    return f"auto ({', '.join(parts)})"


def compare_rows(series: dict[str, list[CollectiveRow]], measured: list[Any]) -> list[dict[str, Any]]:
    """Predicted vs measured busbw at each measured size (the first series, nearest size)."""
    rows = next(iter(series.values()))
    out = []
    for m in measured:
        if not rows:
            break
        best = min(rows, key=lambda r: abs(r.nbytes - m.nbytes))
        if abs(best.nbytes - m.nbytes) > 0.01 * m.nbytes:
            continue
        out.append({
            "bytes": m.nbytes, "measured_busbw_GBps": m.busbw_Bps / 1e9, "predicted_busbw_GBps": best.busbw_GBps,
            "error_pct": 100.0 * (best.busbw_GBps - m.busbw_Bps / 1e9) / (m.busbw_Bps / 1e9) if m.busbw_Bps else 0.0,
            "in_place": bool(getattr(m, "in_place", False)),
        })
    return out


def compare_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The errors of `compare_rows` per column (nccl-tests' out-of-place and in-place): count, mean absolute
    percentage error, signed mean and the worst size."""
    out: dict[str, Any] = {}
    for name, flag in (("out_of_place", False), ("in_place", True)):
        errs = [r for r in rows if r["in_place"] == flag]
        if not errs:
            continue
        worst = max(errs, key=lambda r: abs(r["error_pct"]))
        out[name] = {"num_sizes": len(errs), "mape_pct": sum(abs(r["error_pct"]) for r in errs) / len(errs),
                     "mean_error_pct": sum(r["error_pct"] for r in errs) / len(errs),
                     "worst_bytes": worst["bytes"], "worst_error_pct": worst["error_pct"]}
    return out
