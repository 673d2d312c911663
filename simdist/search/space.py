"""The search space: a problem (model, cluster, GPUs, batch) and the candidate layouts it enumerates.

A candidate fixes tp, pp, dp, cp, vpp, micro-batch, ZeRO stage, recompute mode, sequence parallelism and the
pipeline schedule, and for a mixture-of-experts model the expert-parallel ep and expert-tensor-parallel etp
(`expert_layouts`). Enumeration order is deterministic (nested loops over sorted value lists), and every
candidate has a stable text key, so results match whichever executor computed them and a sweep can resume.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from itertools import permutations
from operator import attrgetter

from simdist.errors import SpecError
from simdist.limits import GLOBAL_BATCH, GPUS, SEARCH_CANDIDATES, SEQ_LENGTH, VPP, check_work

GIB = 2**30
# Assumption: 2 GiB per GPU left free by a search's layouts beyond the modelled peak, which already counts the
# CUDA context and workspaces (1 GiB), NCCL's buffers (0.5 GiB) and 5 % activation fragmentation
# (simdist.plan.memory): what it does not model (the caching allocator's fragmentation over a long run, NVLS and
# extra communicators' buffers, framework caches) takes a few GiB in practice, and a layout at 79 of 80 GiB is
# one allocator spike from out-of-memory. --memory-headroom changes it (0: none).
DEFAULT_MEMORY_HEADROOM = 2.0 * GIB
RECOMPUTE_MODES = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
SEARCH_SCHEDULES = ("1f1b", "interleaved_1f1b", "gpipe", "zb_h1")


@dataclass(frozen=True, slots=True)
class SearchProblem:
    """What the user asks: a model preset on ``num_nodes`` nodes of a cluster preset, and the bounds of the space."""

    model: str
    cluster: str
    num_nodes: int
    global_batch_size: int
    seq_length: int | None = None
    precision: str = "bf16"
    max_tp: int | None = None
    """None: the GPUs of one node (tensor parallelism stays inside the NVLink domain)."""
    max_pp: int = 64
    max_cp: int = 2
    max_vpp: int = 4
    max_micro_batch: int = 8
    schedules: tuple[str, ...] = ("1f1b", "interleaved_1f1b")
    zero_stages: tuple[int, ...] = ZERO_STAGES
    recompute: tuple[str, ...] = RECOMPUTE_MODES
    zero3_fetch: str = "prefetch"
    """How ZeRO-3 layouts move parameters (training.zero3_fetch): prefetch, or per_parameter (DeepSpeed 2021)."""
    zero_with_pp: bool = True
    """Combine ZeRO-2/3 with pipeline stages (valid: simdist.plan.layout; FSDP with pipeline stages, as
    torchtitan and Llama 3 run it). False leaves them out of the space: most of it (GPT-3 175B on 1,024 GPUs:
    3,112 of 4,839 feasible layouts), but ZeRO-2's per-micro-batch scatters can rank high."""
    placement: bool = False
    """Also search the mesh axis order (parallel.order, `placement_orders`): where the groups land."""
    framework_layouts: bool = True
    """Keep to the layouts the scenario's framework runs (simdist.search.framework_layouts: its ZeRO stages, and
    which of them it combines with pipeline stages); False: every layout simdist can time."""
    memory_headroom_bytes: float = DEFAULT_MEMORY_HEADROOM
    """Memory a layout must leave free per GPU beyond the modelled peak (`DEFAULT_MEMORY_HEADROOM`)."""
    contention: bool = True
    """Rank by the closed form with its contention estimate (simdist.search.contention: each collective waits for
    its translates' traffic on shared links); False: each collective alone (`run --fidelity closed_form`)."""
    max_ep: int | None = None
    """Largest expert-parallel size a mixture-of-experts model's space takes (None: as many as divide its experts
    and a stage's ranks)."""
    base: str = ""
    """A base scenario (simdist search SCENARIO): the validated ScenarioSpec as canonical JSON (paths absolute,
    cluster.num_nodes set), whose cluster, model and training every candidate keeps; "" builds one from
    ``model``/``cluster`` (presets). A string, so that the problem stays hashable and travels to workers."""

    def as_dict(self) -> dict:
        out = asdict(self)
        out["schedules"] = list(self.schedules)
        out["zero_stages"] = list(self.zero_stages)
        out["recompute"] = list(self.recompute)
        if not self.placement:  # the problem line of results files written before placement search
            del out["placement"]
        if self.max_ep is None:  # ... and before expert parallelism
            del out["max_ep"]
        if self.base:
            out["base"] = json.loads(self.base)
        else:
            del out["base"]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> SearchProblem:
        names = {f.name for f in fields(cls)}
        kw = {k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in names}
        if isinstance(kw.get("base"), dict):
            kw["base"] = canonical_json(kw["base"])
        return cls(**kw)

    def check(self) -> None:
        """The problem's own bounds (flags of `simdist search` / `compare`): one clear error each."""
        for flag, value, minimum, limit in (
                ("--global-batch", self.global_batch_size, 1, GLOBAL_BATCH), ("--seq", self.seq_length, 1, SEQ_LENGTH),
                ("--max-tp", self.max_tp, 1, GPUS), ("--max-pp", self.max_pp, 1, GPUS),
                ("--max-cp", self.max_cp, 1, GPUS), ("--max-vpp", self.max_vpp, 1, VPP),
                ("--max-micro-batch", self.max_micro_batch, 1, GLOBAL_BATCH), ("--num-nodes", self.num_nodes, 1, GPUS),
                ("--max-ep", self.max_ep, 1, GPUS)):
            if value is None and flag in ("--seq", "--max-tp", "--max-ep"):
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise SpecError(f"{flag} {value!r} must be a whole number >= {minimum}", field=flag,
                                fix=f"give e.g. {max(minimum, 2)}")
            if value > limit.value:
                raise SpecError(f"{flag} {value:,} is above the limit of {limit.text()} ({limit.reason})",
                                field=flag, fix=f"give at most {limit.text()}")
        if not self.schedules:
            raise SpecError("no schedule given", field="--schedules", fix="give e.g. 1f1b,interleaved_1f1b")
        bad = [s for s in self.schedules if s not in SEARCH_SCHEDULES]
        if bad:
            raise SpecError(f"unknown schedule '{bad[0]}'", field="--schedules",
                            fix=f"use some of: {', '.join(SEARCH_SCHEDULES)}")
        h = self.memory_headroom_bytes
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not math.isfinite(h) or h < 0:
            raise SpecError(f"--memory-headroom {h!r} must be a size >= 0", field="--memory-headroom",
                            fix="give e.g. '4 GiB', or 0")
        if self.zero3_fetch not in ("prefetch", "per_parameter"):
            raise SpecError(f"unknown ZeRO-3 fetch '{self.zero3_fetch}'", field="--zero3-fetch",
                            fix="use prefetch or per_parameter")
        if self.global_batch_size < 1:
            raise SpecError("the global batch must be at least 1", field="--global-batch", fix="give e.g. 1536")


def canonical_json(data: object) -> str:
    """One text per value (sorted keys, no spaces): a base scenario's form in `SearchProblem.base`."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Candidate:
    tp: int
    pp: int
    dp: int
    cp: int
    vpp: int
    micro_batch_size: int
    zero_stage: int
    recompute: str
    sequence_parallel: bool
    schedule: str
    order: str = ""
    """The mesh axis order (parallel.order) when the search varies it; "" keeps the base scenario's."""
    ep: int = 1
    """Expert parallelism (parallel.ep; 1: a dense model's, or experts unsharded)."""
    etp: int = 0
    """Expert tensor parallelism (parallel.etp); 0: tp (Megatron-Core's default, the scenario's etp unset)."""
    key: str = field(init=False, repr=False, compare=False)
    """The candidate's name in results and reports, made once (a search looks it up hundreds of thousands of times:
    sorting by bound, the rows' dictionaries); not a layout field."""

    def __post_init__(self) -> None:
        sp = "sp" if self.sequence_parallel else "nosp"
        experts = (f"-ep{self.ep}" if self.ep > 1 else "") + (f"-etp{self.etp}" if self.etp else "")
        object.__setattr__(self, "key", (
            f"tp{self.tp}-pp{self.pp}-dp{self.dp}-cp{self.cp}-v{self.vpp}-mbs{self.micro_batch_size}-"
            f"z{self.zero_stage}-{self.recompute}-{sp}-{self.schedule}" + (f"-{self.order}" if self.order else "")
            + experts))

    @property
    def unplaced(self) -> Candidate:
        """The layout without its placement (the mesh's axis order): what its placements share."""
        if not self.order:
            return self
        # positionally, from the layout's fields (dataclasses.replace costs several times as much: a search asks for
        # tens of thousands)
        values = _layout_values(self)
        return Candidate(*values[:_ORDER], "", *values[_ORDER + 1:])

    def as_dict(self) -> dict:
        out = {name: getattr(self, name) for name in LAYOUT_FIELDS}  # flat: ints, strings and bools
        for name, default in OPTIONAL_FIELDS.items():
            if out[name] == default:  # the rows of results files written before placement / expert search
                del out[name]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> Candidate:
        return cls(**{name: data[name] for name in LAYOUT_FIELDS if name in data or name not in OPTIONAL_FIELDS})


LAYOUT_FIELDS = tuple(f.name for f in fields(Candidate) if f.init)
"""Candidate's fields that make the layout (its dict's), in order: every field but its `Candidate.key`."""
_layout_values = attrgetter(*LAYOUT_FIELDS)
_ORDER = LAYOUT_FIELDS.index("order")
OPTIONAL_FIELDS = {"order": "", "ep": 1, "etp": 0}
"""Candidate fields left out of its dict (and key) at their default."""


def placement_orders(sizes: dict[str, int], default: tuple[str, ...]) -> list[str]:
    """The mesh axis orders worth trying for a layout, ``default``'s first ("" when it is the only one).

    Two orders that list the axes of size > 1 the same way place every rank on the same GPU, so one stands for
    all (the default's, when it is among them). tp stays innermost: its collectives run on every layer's
    critical path (Megatron-LM, Narayanan et al. 2021 sec. 3.3: tensor parallelism inside a node), so an order
    that spreads a tp group over more hosts than the default cannot help; the others (cp, dp, pp in any
    order) decide which of them share a host and a leaf switch.
    """
    def placed(order: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(a for a in order if sizes.get(a, 1) > 1)

    seen = {placed(default)}
    out = [""]
    rest = [a for a in default if a != "tp"]
    for perm in permutations(rest):
        order = ("tp", *perm)
        if placed(order) not in seen:
            seen.add(placed(order))
            out.append("-".join(order))
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _powers_of_two(limit: int) -> list[int]:
    out, v = [], 1
    while v <= limit:
        out.append(v)
        v *= 2
    return out


def _axes(problem: SearchProblem, *, num_gpus: int, gpus_per_node: int, num_layers: int
          ) -> tuple[list[int], list[int], list[int], list[int]]:
    """The values of tp, cp, pp and micro-batch the space takes (see `raw_candidates`)."""
    max_tp = problem.max_tp or gpus_per_node
    tps = [t for t in _divisors(min(gpus_per_node, num_gpus)) if t <= max_tp]
    if problem.max_tp and problem.max_tp > gpus_per_node:
        tps += [t for t in _divisors(num_gpus) if gpus_per_node < t <= problem.max_tp and t % gpus_per_node == 0]
    pps = [p for p in _divisors(num_layers) if p <= problem.max_pp]
    return tps, _powers_of_two(problem.max_cp), pps, _powers_of_two(problem.max_micro_batch)


def splits_the_batch(problem: SearchProblem, *, num_gpus: int, gpus_per_node: int, num_layers: int) -> bool:
    """Some tp x cp x pp of the space leaves a dp that divides the global batch (the batch rule of
    simdist.plan.layout, checked without enumerating): a GPU count a budget may buy."""
    tps, cps, pps, _ = _axes(problem, num_gpus=num_gpus, gpus_per_node=gpus_per_node, num_layers=num_layers)
    return any(num_gpus % (tp * cp * pp) == 0 and problem.global_batch_size % (num_gpus // (tp * cp * pp)) == 0
               for tp in tps for cp in cps for pp in pps)


def base_order(problem: SearchProblem) -> tuple[str, ...]:
    """The mesh axis order of the base scenario (parallel.order; Megatron-LM's default without one)."""
    order = json.loads(problem.base).get("parallel", {}).get("order") if problem.base else None
    return tuple(order.split("-")) if isinstance(order, str) else ("tp", "cp", "dp", "pp")


def expert_layouts(problem: SearchProblem, num_experts: int, tp: int, cp: int, dp: int) -> list[tuple[int, int]]:
    """(ep, etp) of a layout of a mixture-of-experts model with ``num_experts`` routed experts ([(1, 0)] for a dense
    model): ep a power of two dividing the experts, up to max_ep; etp 1 or tp (0: the default, tp); etp x ep
    dividing the stage's tp x cp x dp ranks, the experts carved out of them as Megatron-Core does
    (simdist.plan.layout.check_experts, which refuses the rest). ep 1 keeps every expert on every rank.
    # Assumption: the space takes etp in {1, tp}: expert tensor parallelism inside attention's tp group or none,
    # the two Megatron-Core recipes use (etp 1 for fine-grained experts).
    """
    if num_experts <= 0:
        return [(1, 0)]
    ranks = tp * cp * dp
    eps = [e for e in _powers_of_two(min(num_experts, ranks, problem.max_ep or ranks)) if num_experts % e == 0]
    etps = (0, 1) if tp > 1 else (0,)
    return [(e, t) for e in eps for t in etps if ranks % (e * (t or tp)) == 0]


def _orders(problem: SearchProblem, tp: int, cp: int, dp: int, pp: int) -> list[str]:
    if not problem.placement:
        return [""]
    return placement_orders({"tp": tp, "cp": cp, "dp": dp, "pp": pp}, base_order(problem))


def count_candidates(problem: SearchProblem, *, num_gpus: int, gpus_per_node: int, num_layers: int,
                     num_experts: int = 0) -> int:
    """How many candidates `raw_candidates` yields, counted without enumerating them (bounded work)."""
    tps, cps, pps, mbss = _axes(problem, num_gpus=num_gpus, gpus_per_node=gpus_per_node, num_layers=num_layers)
    total = 0
    for tp in tps:
        for cp in cps:
            for pp in pps:
                if num_gpus % (tp * cp * pp):
                    continue
                zeros = [z for z in problem.zero_stages if z < 2 or pp == 1 or problem.zero_with_pp]
                dp = num_gpus // (tp * cp * pp)
                orders = _orders(problem, tp, cp, dp, pp)
                per_layout = (len(mbss) * len(zeros) * len(problem.recompute) * len(orders)
                              * len(expert_layouts(problem, num_experts, tp, cp, dp)))
                for schedule in problem.schedules:
                    if pp == 1 and schedule != "1f1b":
                        continue
                    vpps = max(0, problem.max_vpp - 1) if schedule == "interleaved_1f1b" else 1
                    total += vpps * per_layout * (2 if tp > 1 else 1)
    return total


def raw_candidates(problem: SearchProblem, *, num_gpus: int, gpus_per_node: int, num_layers: int,
                   num_experts: int = 0) -> Iterator[Candidate]:
    """Every combination of the axes' values before pruning (tp x cp x pp filling the GPUs; dp the rest).

    tp: divisors of the node's GPU count up to max_tp; pp: divisors of the layer count up to max_pp (even
    split, as Megatron-LM requires without an explicit layout); cp, micro-batch: powers of two; ep and etp of a
    model with ``num_experts`` experts: `expert_layouts`.
    """
    tps, cps, pps, mbss = _axes(problem, num_gpus=num_gpus, gpus_per_node=gpus_per_node, num_layers=num_layers)
    check_work(count_candidates(problem, num_gpus=num_gpus, gpus_per_node=gpus_per_node, num_layers=num_layers,
                                num_experts=num_experts),
               SEARCH_CANDIDATES, what="the search space",
               fix="lower --max-vpp, --max-pp, --max-cp or --max-micro-batch, or try fewer --schedules")
    for tp in tps:
        for cp in cps:
            for pp in pps:
                if num_gpus % (tp * cp * pp):
                    continue
                dp = num_gpus // (tp * cp * pp)
                orders = _orders(problem, tp, cp, dp, pp)
                experts = expert_layouts(problem, num_experts, tp, cp, dp)
                for schedule in problem.schedules:
                    if pp == 1 and schedule != "1f1b":
                        continue
                    vpps = range(2, problem.max_vpp + 1) if schedule == "interleaved_1f1b" else (1,)
                    for vpp in vpps:
                        for mbs in mbss:
                            for zero in problem.zero_stages:
                                if zero >= 2 and pp > 1 and not problem.zero_with_pp:
                                    continue
                                for rec in problem.recompute:
                                    for sp in ((False, True) if tp > 1 else (False,)):
                                        for order in orders:
                                            for ep, etp in experts:
                                                yield Candidate(tp, pp, dp, cp, vpp, mbs, zero, rec, sp, schedule,
                                                                order, ep, etp)
