"""A scenario's what-if faults on the simulated step: degraded links' capacities, failed leaf-spine links, and who
waits for whom.

Stragglers are part of the step's configuration (simdist.plan.step_config.StepConfig.compute_slowdown: both
fidelities read it); a degraded link is a capacity the engine's shared links see (simdist.engine.graph.run_graph:
a job's rate is bounded by every link it loads), while the closed form prices each collective on the nominal
bandwidths (simdist.predict.price), so only the engine sees it. The report's ``faults`` names the stragglers,
the degraded links, and, from the engine's trace, how long each simulated data-parallel replica waited at the
data-parallel collectives and for which replica's ranks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from simdist.engine.graph import GraphTrace
from simdist.errors import SpecError
from simdist.hardware.topology import Topology
from simdist.plan.step import StepConfig, StepPlan
from simdist.spec.faults import FaultsSpec
from simdist.units import ascii_int


def degraded_links(faults: FaultsSpec, topology: Topology) -> dict[int, float]:
    """link id -> fraction of its capacity left, for ``faults.degraded_links`` (an unknown link: a SpecError)."""
    if not faults.degraded_links:
        return {}
    wanted: dict[tuple[str, str], tuple[int, float]] = {}
    for i, d in enumerate(faults.degraded_links):
        wanted[(d.src, d.dst)] = (i, d.bandwidth_fraction)
        if not d.one_way:
            wanted.setdefault((d.dst, d.src), (i, d.bandwidth_fraction))
    out: dict[int, float] = {}
    found: set[int] = set()
    for link in topology.links():
        hit = wanted.get((link.src, link.dst))
        if hit is not None:
            out[link.id] = min(out.get(link.id, 1.0), hit[1])
            found.add(hit[0])
    for i, d in enumerate(faults.degraded_links):
        if i not in found:
            raise SpecError(f"no link {d.src} -> {d.dst} in this cluster", field=f"faults.degraded_links.{i}",
                            fix="name a link by its two vertices as `simdist topo` and the run JSON's links "
                                "rows write them, e.g. src: n0/nic0, dst: leaf0")
    return out


def failed_uplinks(faults: FaultsSpec, topology: Topology) -> list[tuple[int, int]]:
    """(leaf, spine) of each ``faults.failed_links`` entry (a link that is not leaf-spine: a SpecError)."""
    out = []
    f = topology.fabric
    for i, d in enumerate(faults.failed_links):
        ends = sorted((d.src, d.dst), key=lambda v: not v.startswith("leaf"))  # the leaf first
        leaf, spine = ends
        a = ascii_int(leaf[4:]) if leaf.startswith("leaf") else None
        b = ascii_int(spine[5:]) if spine.startswith("spine") else None
        if a is None or b is None or f is None or a >= f.num_leaves or b >= f.num_spines:
            have = (f"leaf0..leaf{f.num_leaves - 1} and spine0..spine{f.num_spines - 1}" if f is not None
                    and f.num_spines else "no leaf-spine links (one switch or one node)")
            raise SpecError(f"no leaf-spine link {d.src} - {d.dst} in this cluster ({have})",
                            field=f"faults.failed_links.{i}",
                            fix="name a leaf and a spine as `simdist topo` writes them, e.g. src: leaf0, dst: spine1; "
                                "a NIC or NVLink at reduced speed is a degraded_links entry")
        out.append((a, b))
    return out


def scaled_capacities(topology: Topology, factors: dict[int, float]
                      ) -> tuple[Callable[[int], float], Callable[[np.ndarray], np.ndarray]]:
    """(capacity_of, capacities) of the engine (simdist.engine.graph.run_graph) with ``factors`` applied."""
    base = topology.layout.capacity_Bps
    many = topology.layout.capacities_Bps
    if not factors:
        return base, many
    ids = np.fromiter(factors, dtype=np.int64, count=len(factors))
    scale = np.fromiter(factors.values(), dtype=float, count=len(factors))
    order = np.argsort(ids)
    ids, scale = ids[order], scale[order]

    def one(link: int) -> float:
        return base(link) * factors.get(link, 1.0)

    def batch(links: np.ndarray) -> np.ndarray:
        out = np.asarray(many(links), dtype=float).copy()
        pos = np.searchsorted(ids, links)
        pos = np.minimum(pos, len(ids) - 1)
        hit = ids[pos] == links
        out[hit] *= scale[pos[hit]]
        return out

    return one, batch


def _ready_times(plan: StepPlan, trace: GraphTrace) -> list[float]:
    """When each op could have started on its own rank: its dependencies ended and its stream was free (the
    previous op of its rank's stream ended); a collective instance starts when its last member is ready."""
    last_on: dict[tuple[int, str], float] = {}
    ready = []
    for i, op in enumerate(plan.graph.ops):
        t = last_on.get((op.rank, op.stream), 0.0)
        for d in op.deps:
            t = max(t, trace.end_s[d])
        ready.append(t)
        last_on[(op.rank, op.stream)] = trace.end_s[i]
    return ready


def waits(plan: StepPlan, trace: GraphTrace) -> list[dict[str, Any]]:
    """Per simulated (stage, data-parallel replica): seconds its representative rank waited at data-parallel
    collectives for the other members, and the ranks it waited for (the last ready members), longest wait first."""
    cfg = plan.config
    ready = _ready_times(plan, trace)
    members: dict[int, list[int]] = {}
    for i, op in enumerate(plan.graph.ops):
        # (the dense gradients' group is dp_cp where cp > 1: simdist.plan.data_parallel.dense_data_parallel_axis)
        if op.sync >= 0 and op.comm is not None and op.comm.axis in ("dp", "dp_cp", "dps", "dps_cp", "dpr"):
            members.setdefault(op.sync, []).append(i)
    rank_of = {r: (s, d) for (s, d), r in plan.stage_ranks.items()}
    wait_s: dict[int, float] = {}
    blamed: dict[int, dict[int, float]] = {}
    for ids in members.values():
        latest = max(ready[i] for i in ids)
        last = [plan.graph.ops[i].rank for i in ids if ready[i] == latest]
        for i in ids:
            r = plan.graph.ops[i].rank
            w = latest - ready[i]
            if w > 0:
                wait_s[r] = wait_s.get(r, 0.0) + w
                for other in last:
                    blamed.setdefault(r, {})[other] = blamed.get(r, {}).get(other, 0.0) + w
    rows = []
    for r, w in wait_s.items():
        if r not in rank_of:
            continue
        s, d = rank_of[r]
        by = sorted(blamed.get(r, {}).items(), key=lambda kv: -kv[1])
        rows.append({"rank": r, "stage": s, "dp": d, "wait_s": w, "waits_for": [o for o, _ in by],
                     "compute_time_factor": cfg.compute_factor(s, d)})
    return sorted(rows, key=lambda row: (-row["wait_s"], row["rank"]))


def faults_report(cfg: StepConfig, faults: FaultsSpec, topology: Topology, links: dict[int, float],
                  plan: StepPlan | None, trace: GraphTrace | None, fidelity: str) -> dict[str, Any] | None:
    """The run JSON's ``faults`` (None without any straggler, degraded or failed link)."""
    failed = sorted(topology.fabric.failed_uplinks) if topology.fabric is not None else []
    if not cfg.compute_slowdown and not links and not failed:
        return None
    stragglers = []
    for rank, factor in cfg.compute_slowdown:
        c = cfg.mesh.coords(rank)
        stragglers.append({"rank": rank, "stage": c["pp"], "dp": c["dp"], "tp": c["tp"], "cp": c["cp"],
                           "compute_time_factor": factor})
    degraded = []
    for link_id, fraction in sorted(links.items()):
        lk = topology.link(link_id)
        degraded.append({"link": link_id, "src": lk.src, "dst": lk.dst, "kind": lk.kind,
                         "bandwidth_fraction": fraction})
    seen = "closed form: straggler compute only (degraded links unseen)" if fidelity == "closed_form" else (
        "engine: stragglers' compute and degraded links' capacity")
    if failed:
        seen += "; both: the routes around the failed links"
    if faults.heterogeneous_nodes:
        seen += "; both: the other GPUs' kernel times"
    out: dict[str, Any] = {"stragglers": stragglers, "degraded_links": degraded,
                           "heterogeneous_nodes": [{"nodes": list(h.nodes), "gpu": h.gpu}
                                                   for h in faults.heterogeneous_nodes],
                           "failed_links": [{"src": f"leaf{a}", "dst": f"spine{b}"} for a, b in failed],
                           "seen_by": seen}
    if plan is not None and trace is not None and fidelity == "engine":
        out["waits"] = waits(plan, trace)
    return out

