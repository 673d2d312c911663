"""Hardware comparison: the best layout per cluster, time, cost and energy to train a number of tokens.

Energy: GPUs x TDP x time x PUE.
# Assumption: every GPU draws its board power limit (TDP) for the whole run, and the PUE factor (default 1.0:
# none) stands for host CPUs, network, storage and cooling; measured GPU power during training is usually
# below TDP, so this is an upper bound of the GPUs' share.
Cost: GPUs x hours x the user's price per GPU-hour (no default prices: they vary by provider and contract).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simdist.errors import LayoutError, PresetError, SimdistError, SpecError
from simdist.hardware.presets import preset_names, resolve_topology_spec, topology_document
from simdist.search.executors import Executor
from simdist.search.rank import SearchOutcome, closed_form_band, run_search
from simdist.search.space import SearchProblem

SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True, slots=True)
class ClusterSize:
    cluster: str
    gpus_per_node: int
    num_nodes: int
    num_gpus: int
    note: str
    gpus_used_per_node: int = 0
    """GPUs the job uses of each node where it uses part of each (cluster.placement); 0: every GPU."""


PARTIAL_NODE_MIN_GPUS = 9
"""Nodes of at least this many GPUs (rack-scale NVLink domains: GB200/GB300 NVL72) may be used in part.
# Assumption: a rack's NVLink domain is allocated in part (NVL72 racks are scheduled per tray of 4 GPUs: NVIDIA
# GB200 NVL72 is 18 compute trays of 4 GPUs); a server of 8 GPUs or fewer is taken whole, as clouds rent them."""


def size_cluster(cluster: str, gpus: int, *, field: str = "--clusters") -> ClusterSize:
    """The nodes ``gpus`` GPUs take: whole nodes, num_nodes = ceil(gpus / gpus_per_node) (a gb200-nvl72 node is a
    72-GPU rack, README Concepts), or, on racks (`PARTIAL_NODE_MIN_GPUS`), that many racks each used in part
    where the GPUs split evenly over them (256 GPUs of NVL72: 4 racks x 64). ``cluster``: a preset name or a
    topology file."""
    if cluster in preset_names():
        gpn = int(topology_document(cluster).data["gpus_per_node"])
    elif Path(cluster).suffix in (".yaml", ".yml"):
        try:
            gpn = resolve_topology_spec(cluster).gpus_per_node
        except SimdistError as err:
            raise err.located(field_prefix=field) from None
    else:
        raise PresetError(f"unknown cluster '{cluster}'", field=field,
                          fix=f"use presets from: {', '.join(preset_names())}, or a topology file (.yaml)")
    nodes = math.ceil(gpus / gpn)
    if nodes * gpn != gpus and gpn >= PARTIAL_NODE_MIN_GPUS and gpus % nodes == 0:
        return ClusterSize(cluster, gpn, nodes, gpus, f"{gpus} GPUs: {gpus // nodes} of the {gpn} on each of {nodes} "
                                                       f"node(s) (cluster.placement)", gpus // nodes)
    note = "" if nodes * gpn == gpus else (
        f"{gpus} GPUs is not a multiple of {gpn} GPUs per node: using {nodes} nodes = {nodes * gpn} GPUs")
    return ClusterSize(cluster, gpn, nodes, nodes * gpn, note)


def parse_prices(items: list[str], clusters: list[str]) -> dict[str, float]:
    """``cluster=USD_per_GPU_hour`` items; a cluster not compared is an error."""
    prices: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep:
            raise SpecError(f"price '{item}' is not cluster=USD_per_GPU_hour", field="--price",
                            fix="write e.g. --price dgx-h100=2.5")
        if name not in clusters:
            raise SpecError(f"price given for '{name}', which is not compared", field="--price",
                            fix=f"add it to --clusters or price one of: {', '.join(clusters)}")
        try:
            usd = float(value)
        except ValueError:
            raise SpecError(f"price '{value}' for {name} is not a number", field="--price",
                            fix="give US dollars per GPU-hour, e.g. 2.5") from None
        if not (math.isfinite(usd) and usd >= 0):
            raise SpecError(f"price {value} for {name} must be >= 0", field="--price", fix="give e.g. 2.5")
        prices[name] = usd
    return prices


def compare_row(size: ClusterSize, outcome: SearchOutcome, *, tokens: float, price: float | None, pue: float,
                num_params: float | None = None) -> dict[str, Any]:
    """One cluster's row; ``num_params`` (the model's): also goodput (simdist.predict.goodput: failures and
    checkpoints at the data file's defaults) and the days to train with it."""
    from simdist.search.evaluate import context

    best = outcome.ranked[0]
    engine = outcome.engine[0] if outcome.engine else {}
    # Step time, throughput and MFU all from one fidelity: the engine's where it re-simulated the winner, else
    # the closed form's (the row's "fidelity" says which).
    ran = "engine_step_time_s" in engine
    tokens_per_s = engine["engine_tokens_per_s"] if ran else best["tokens_per_s"]
    step_s = engine["engine_step_time_s"] if ran else best["step_time_s"]
    mfu = engine["engine_mfu"] if ran else best["mfu"]
    train_s = tokens / tokens_per_s
    # The band of the row's step (simdist.predict.bands), in the same fidelity: the engine's run sampled it; a
    # closed-form row samples it here (once per row). Days to train scale with the step.
    band = engine["step_time_band_s"] if ran else closed_form_band(outcome.problem, best)
    gpu_hours = size.num_gpus * train_s / SECONDS_PER_HOUR
    ctx_topology = context(outcome.problem).topology
    tdp = ctx_topology.gpu.tdp_w
    energy = size.num_gpus * tdp * train_s * pue / JOULES_PER_KWH if tdp else None
    extra: dict[str, Any] = {}
    if num_params is not None:
        from simdist.predict.goodput import goodput
        from simdist.search.evaluate import base_spec

        inter = ctx_topology.spec.inter_node
        # the scenario's own checkpoint settings (faults.checkpoint), as `simdist run` prices its goodput
        good = goodput(num_gpus=size.num_gpus, num_hosts=size.num_nodes,
                       num_nics=(inter.nics_per_node if inter is not None else 0) * size.num_nodes,
                       num_params=num_params, checkpoint=base_spec(outcome.problem).faults.checkpoint)
        extra = {"goodput": good["fraction"], "mtbf_s": good["mtbf_s"],
                 "time_to_train_with_failures_days": train_s / 86400.0 / good["fraction"] if good["fraction"] > 0
                 else None}
    return {
        "cluster": size.cluster, "gpus_per_node": size.gpus_per_node, "num_nodes": size.num_nodes,
        "num_gpus": size.num_gpus, "note": size.note, "layout": best["key"], "step_time_s": step_s,
        "closed_form_step_time_s": best["step_time_s"], "tokens_per_s": tokens_per_s, "mfu": mfu,
        "closed_form_mfu": best["mfu"], "fidelity": "engine" if ran else "closed_form",
        "memory_per_gpu_bytes": best["memory_per_gpu_bytes"], "time_to_train_s": train_s,
        "time_to_train_days": train_s / 86400.0, "gpu_hours": gpu_hours, "gpu_tdp_w": tdp,
        "step_time_band_s": band,
        "time_to_train_days_band": {q: train_s / 86400.0 * band[q] / step_s if step_s > 0 else train_s / 86400.0
                                    for q in ("p10", "p50", "p90")},
        "energy_kwh": energy, "usd_per_gpu_hour": price,
        "cost_usd": gpu_hours * price if price is not None else None,
        "usd_per_hour": size.num_gpus * price if price is not None else None,
        "power_kw": size.num_gpus * tdp * pue / 1e3 if tdp else None,
        **extra,
    }


def compare_problems(entries: list[tuple[ClusterSize, SearchProblem]], *, tokens: float,
                     prices: dict[str, float], executor: Executor, pue: float = 1.0, top_k: int = 1
                     ) -> list[dict[str, Any]]:
    """One row per (cluster, size): its best layout (`run_search`), time, cost and energy to train ``tokens``."""
    if tokens <= 0:
        raise SpecError(f"--tokens {tokens:g} must be positive", field="--tokens", fix="give e.g. 300e9")
    if not pue >= 1.0:
        raise SpecError(f"--pue {pue} must be at least 1", field="--pue", fix="give 1.0 (GPUs only) or e.g. 1.2")
    rows = []
    for size, problem in entries:
        try:
            outcome = run_search(problem, executor, top_k=top_k)
            if outcome.interrupted:  # Ctrl-C: a partial sweep's best is not this cluster's best
                raise KeyboardInterrupt
        except LayoutError as err:  # this cluster has no feasible layout: say so in its row, compare the rest
            rows.append({"cluster": size.cluster, "num_gpus": size.num_gpus, "note": size.note,
                         "error": err.problem})
            continue
        from simdist.search.evaluate import context

        rows.append(compare_row(size, outcome, tokens=tokens, price=prices.get(size.cluster), pue=pue,
                                num_params=context(problem).model.num_params))
    return rows


def compare_clusters(model: str, clusters: list[str], *, gpus: int, tokens: float, global_batch_size: int,
                     prices: dict[str, float], executor: Executor, pue: float = 1.0, seq_length: int | None = None,
                     precision: str = "bf16", top_k: int = 1) -> list[dict[str, Any]]:
    """`compare_problems` of a model preset on ``gpus`` GPUs of each cluster (rounded up to whole nodes)."""
    sizes = [size_cluster(c, gpus) for c in clusters]
    entries = [(size, SearchProblem(model=model, cluster=size.cluster, num_nodes=size.num_nodes,
                                    global_batch_size=global_batch_size, seq_length=seq_length, precision=precision))
               for size in sizes]
    return compare_problems(entries, tokens=tokens, prices=prices, executor=executor, pue=pue, top_k=top_k)
