"""Prices for the closed-form step: collectives by group shape, chunk costs, and the recipes' piece durations.

Collective prices are cached across configurations by a key that captures what decides them (op, group size,
stride between peers, the first peer's position inside its node, bytes): the group is re-placed on the cluster's
first node(s) to price it (`CommPricer`). A group whose peers are not evenly spaced (the data-parallel group with
context parallelism where cp and dp are not adjacent in the order: simdist.plan.mesh.Mesh.shape) is keyed by its
peers' offsets from the first instead of one stride. Chunk costs and recipes (simdist.plan.recipe) are cached by
everything they read, so a search pays for each distinct one once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simdist.analytic.select import rank_choices
from simdist.collectives.group import Group
from simdist.collectives.request import Request
from simdist.collectives.uneven import imbalanced_matrix
from simdist.hardware.topology import Topology
from simdist.plan.accounting import category_of
from simdist.plan.chunk_cost import ChunkCost, chunk_cost_key, memo_chunk_cost
from simdist.plan.data_parallel import tail
from simdist.plan.interference import tax_s
from simdist.plan.recipe import CommItem, Piece, Recipe, StageTail, edge_recipe
from simdist.plan.step_config import LayerKinds, StepConfig

__all__ = ["NUM_CORE", "STREAMS", "CommPricer", "PricedPieces", "Shape", "cached_chunk_cost", "chunk_cost_entry",
           "price_pieces", "priced_by_durations", "recipe_entry", "tail_entry", "token"]

Adjust = Callable[[str, int, float, float], float]
Stride = int | tuple[int, ...]
"""Rank distance between a group's neighbours, or (a group not evenly spaced) its peers' offsets from the first."""
Shape = tuple[int, int, Stride]
"""A mesh group: (first rank, size, `Stride`)."""


def _offsets(size: int, stride: Stride) -> tuple[int, ...]:
    return stride if isinstance(stride, tuple) else tuple(i * stride for i in range(size))

STREAMS = ("compute", "tp", "cp", "ep", "dp", "pp")
"""The rank's streams: the step's own (compute, tp, cp, ep: `NUM_CORE`) first, then dp and pp."""
NUM_CORE = 4
STREAM_CODE = {s: i for i, s in enumerate(STREAMS)}


class CommPricer:
    """Seconds of one collective on a group, cached by (op, group size, stride, position in node, bytes, and an
    all_to_all's imbalance: simdist.collectives.uneven).

    # Assumption: a collective's time depends on its group's shape (size, rank stride, where its first
    # peer sits inside its node), not on which nodes it lands on: the group is priced re-placed on the first
    # node(s) of the cluster. On the bundled presets every node has the same NICs and leaf switch links, so
    # only groups that straddle leaf boundaries differently can differ (the engine path prices the real group).
    # On a 3-tier fabric the group is re-placed in the first pod(s), at its place inside its pod.
    # With failed leaf-spine links (faults.failed_links) every group is priced where it is.
    """

    def __init__(self, topology: Topology, adjust: Adjust | None = None) -> None:
        self.topology = topology
        # Failed leaf-spine links make a group's routes depend on where it sits (faults.failed_links): then a group
        # is priced where it is, its first rank itself in every key instead of its position inside its node.
        fabric = topology.fabric
        self._gpn = 0 if fabric is not None and fabric.failed_uplinks else topology.gpus_per_node
        # 3 tiers: a group's routes depend on which pods its nodes sit in, a pattern that repeats every pod (0: pods
        # that split nodes unevenly, every group priced where it is)
        self._period = self._gpn
        if self._gpn and fabric is not None and fabric.cores_per_group:
            self._period = fabric.nodes_per_pod * self._gpn
        self._switched = topology.spec.scale_up is not None
        self.adjust = adjust
        self._cache: dict[tuple, float] = {}
        self._priced: dict[tuple, tuple[PricedPieces, Any]] = {}
        self._memo: dict[tuple, Any] = {}
        self._groups: dict[tuple[int, ...], Group] = topology.groups  # type: ignore[assignment]
        """Groups by ranks: a group memoises its routes' structure (simdist.collectives.all_pairs), which every
        size and op priced on it shares."""
        self.misses = 0

    def scaled(self, factor_of_bytes: Callable[[float], float]) -> CommPricer:
        """A pricer of the same cluster whose every collective takes ``factor_of_bytes(nbytes)`` x as long (a
        perturbed link efficiency, simdist.predict.bands), its cache the prices already made, scaled."""
        return self.perturbed(lambda op, n, nbytes, t: t * factor_of_bytes(nbytes))

    def perturbed(self, time_of: Adjust) -> CommPricer:
        """A pricer of the same cluster whose every collective takes ``time_of(op, num_ranks, nbytes, t)`` seconds
        where this one takes t (a perturbed cost: simdist.predict.bands samples calibrated constants so), its cache
        the prices already made, perturbed."""
        base = self.adjust

        def adjust(op: str, n: int, nbytes: float, t: float) -> float:
            return time_of(op, n, nbytes, base(op, n, nbytes, t) if base is not None else t)

        out = CommPricer(self.topology, adjust)
        # a key is (op, ranks, nbytes, imbalance, kernel) or (op, position, size, stride, nbytes, imbalance, kernel):
        # see `key`
        out._cache = {key: time_of(key[0], len(key[1]) if len(key) == 5 else key[2], key[-3], t)
                      for key, t in self._cache.items()}
        out._groups = self._groups
        return out

    def key(self, op: str, ranks: tuple[int, ...], nbytes: float, imbalance: float = 1.0, kernel: str = "nccl"
            ) -> tuple:
        n = len(ranks)
        stride = ranks[1] - ranks[0] if n > 1 else 0
        regular = all(ranks[i + 1] - ranks[i] == stride for i in range(n - 1)) and stride > 0
        if not regular:
            return (op, ranks, float(nbytes), float(imbalance), kernel)
        return (op, self._position(ranks[0], n, stride), n, stride, float(nbytes), float(imbalance), kernel)

    def time_s(self, op: str, ranks: tuple[int, ...], nbytes: float, imbalance: float = 1.0, kernel: str = "nccl"
               ) -> float:
        if len(ranks) < 2 or nbytes <= 0:
            return 0.0
        return self._price(self.key(op, ranks, nbytes, imbalance, kernel))

    def time_of_key(self, key: tuple | None) -> float:
        """`time_s` of the collective whose `key` is ``key`` (None: one that takes no time, as `time_s` has it), for
        a caller that prices it on several pricers of one cluster (their keys are the same)."""
        return 0.0 if key is None else self._price(key)

    def shape_time_s(self, op: str, first: int, size: int, stride: Stride, nbytes: float, imbalance: float = 1.0,
                     kernel: str = "nccl") -> float:
        """The group ``first + i * stride`` for i < size (a mesh axis group), without listing its ranks; ``stride``
        a tuple: the group ``first + offset`` for each of its offsets."""
        if size < 2 or nbytes <= 0:
            return 0.0
        key = (op, self._position(first, size, stride), size, stride, float(nbytes), float(imbalance), kernel)
        hit = self._cache.get(key)
        return hit if hit is not None else self._price(key)

    def memo(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()``, cached under ``key`` for this pricer's cluster (what only prices and shapes decide)."""
        hit = self._memo.get(key)
        if hit is None:
            if len(self._memo) >= _CACHE_MAX:
                self._memo.clear()
            hit = self._memo[key] = make()
        return hit

    def shape_key(self, groups: dict[str, Shape]) -> tuple:
        """What decides a piece's price on ``groups`` (axis -> (first rank, size, stride)): their shapes."""
        return tuple((a, self._position(*g), g[1], g[2]) for a, g in sorted(groups.items()))

    def stand_in(self, ranks: tuple[int, ...]) -> tuple[int, ...] | None:
        """``ranks`` moved by whole periods (`_position`'s: the nodes, or the pods of three tiers) to the first
        period they reach into: a group this pricer prices as ``ranks`` (None: already there, or every group priced
        where it is)."""
        if not self._period:
            return None
        shift = min(ranks) // self._period * self._period
        return tuple(r - shift for r in ranks) if shift else None

    def _position(self, rank: int, size: int = 1, stride: Stride = 1) -> int:
        """Where a group (first rank, size, stride) sits, as far as its price goes: its first rank's place in its node
        (the rank itself where failed links make the routes depend on the nodes); 0 for a group inside one node of
        an NVSwitch: every GPU there has the same port to the one switch, so the group prices the same anywhere in
        the node (simdist.hardware.node: each GPU's nvlink to the ``nvswitch`` vertex, one bandwidth)."""
        if not self._period:
            return rank
        span = max(stride) if isinstance(stride, tuple) else (size - 1) * stride
        if self._switched and rank % self._gpn + span < self._gpn:
            return 0
        return rank % self._period

    def priced(self, pieces: tuple[Piece, ...], end: int, groups: dict[str, Shape], *,
               compile: Callable[[PricedPieces], Any] | None = None, shape: tuple | None = None,
               pieces_token: int | None = None) -> tuple[PricedPieces, Any]:
        """(`price_pieces`, ``compile`` of it or None), cached by the pieces and their groups' shapes (alike stages
        share them); ``shape``: `shape_key` of ``groups`` (or a `token` standing for it), if already computed;
        ``pieces_token``: `token` of
        (``pieces``, ``end``), if known (the key then hashes it instead of every piece)."""
        shape = self.shape_key(groups) if shape is None else shape
        key = (pieces, end, shape, compile) if pieces_token is None else (pieces_token, shape, compile)
        hit = self._priced.get(key)
        if hit is None:
            if len(self._priced) >= _CACHE_MAX:
                self._priced.clear()
            if pieces_token is None:
                priced = price_pieces(self, pieces, end, groups)
                hit = (priced, compile(priced) if compile is not None else None)
            else:
                hit = priced_by_durations(pieces, end, pieces_token, piece_durations(self, pieces, groups), compile)
            self._priced[key] = hit
        return hit

    def _price(self, key: tuple) -> float:
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        self.misses += 1
        op, nbytes, imbalance, kernel = key[0], key[-3], key[-2], key[-1]
        placed = key[1] if len(key) == 5 else tuple(key[1] + o for o in _offsets(key[2], key[3]))
        t = self._cache[key] = self._time(op, placed, nbytes, imbalance, kernel)
        return t

    def _time(self, op: str, placed: tuple[int, ...], nbytes: float, imbalance: float, kernel: str = "nccl"
              ) -> float:
        """Seconds of ``op`` on the ranks ``placed``, alone (what `_price` caches; a subclass may time it otherwise:
        simdist.search.contention)."""
        group = self._groups.get(placed)
        if group is None:
            group = self._groups[placed] = Group(self.topology, placed)
        if op == "all_to_all" and imbalance != 1.0:
            # the uneven all_to_all of routing imbalance, as simdist.predict.price.request_of builds it
            request = Request(op, group, nbytes, matrix=imbalanced_matrix(len(placed), nbytes, imbalance),
                              kernel=kernel)
        else:
            request = Request(op, group, nbytes, kernel=kernel)
        t = rank_choices(request)[0].predicted_s
        if self.adjust is not None:
            t = self.adjust(op, len(placed), nbytes, t)
        return t


_CACHE_MAX = 200_000
_CHUNK_CACHE: dict[tuple, tuple[ChunkCost, int]] = {}
_RECIPE_CACHE: dict[tuple, tuple[Recipe | StageTail, int]] = {}
_TOKENS: dict[Any, int] = {}
_NEXT_TOKEN = itertools.count()


def token(value: Any) -> int:
    """A number standing for ``value`` in cache keys: equal values get the same number, unequal ones different
    numbers, so a key built of tokens finds exactly what one built of the values would, but hashes a few ints
    instead of the frozen config and cost objects at every lookup (the band's 32 copies each look up their recipes
    dozens of times). A number is never given twice: when the table is cleared a value gets a new one, and entries
    under its old one are only never found again."""
    hit = _TOKENS.get(value)
    if hit is None:
        if len(_TOKENS) >= _CACHE_MAX:
            _TOKENS.clear()
        hit = _TOKENS[value] = next(_NEXT_TOKEN)
    return hit


def cached_chunk_cost(cfg: StepConfig, layers: LayerKinds, first_part: bool, last_part: bool,
                      config: int | None = None) -> ChunkCost:
    """`simdist.plan.chunk_cost.chunk_cost`, cached by every field it reads; ``config``: `token` of
    `chunk_cost_key` of ``cfg``, if already computed."""
    return chunk_cost_entry(cfg, layers, first_part, last_part, config)[0]


def chunk_cost_entry(cfg: StepConfig, layers: LayerKinds, first_part: bool, last_part: bool,
                     config: int | None = None) -> tuple[ChunkCost, int]:
    """(`cached_chunk_cost`, the `token` of that cost)."""
    key = (token(chunk_cost_key(cfg)) if config is None else config, layers, first_part, last_part)
    hit = _CHUNK_CACHE.get(key)
    if hit is None:
        if len(_CHUNK_CACHE) >= _CACHE_MAX:
            _CHUNK_CACHE.clear()
        cost = memo_chunk_cost(cfg, layers, first_part, last_part)  # (simdist.plan.stage_pace's too)
        hit = _CHUNK_CACHE[key] = (cost, token(("cost", cost)))
    return hit


def recipe_key(cfg: StepConfig) -> tuple:
    """Every StepConfig field a recipe or a stage tail reads besides the chunk cost. (Not the mesh's axis order:
    a recipe names its collectives' axes and sizes, and where the groups land is priced by their shapes, so the
    placements of one layout share their recipes.)"""
    return (cfg.schedule, cfg.zero_stage, cfg.zero3_fetch, cfg.grad_reduce, cfg.grad_bucket_bytes, cfg.precision,
            cfg.fp8_param_gather,
            cfg.mesh.tp, cfg.mesh.cp, cfg.mesh.dp, cfg.mesh.pp, cfg.mesh.ep, cfg.mesh.etp,
            cfg.gpu, cfg.compute_efficiency, cfg.host_overhead, cfg.moe_overlap, cfg.moe_overlap_share,
            cfg.tp_comm_overlap,
            cfg.grad_reduce_in_fp32, cfg.overlap_param_gather, cfg.vpp, cfg.execution, cfg.mesh.dp_shard,
            cfg.expert_parallel.kernel)


def recipe_entry(cfg: StepConfig, cost: ChunkCost, cost_token: int, kind: str, edge: bool,
                 config: int | None = None, alone: bool = False) -> tuple[Recipe, int]:
    """(`simdist.plan.recipe.edge_recipe`, cached (``edge``: the chunk's first forward, last backward or W), and the
    `token` of its (pieces, end): `CommPricer.priced`'s ``pieces_token``); ``cost_token``:
    `token` of ``cost`` (as `chunk_cost_entry` gives it), ``config``: `token` of `recipe_key` of ``cfg``, if already
    computed; ``alone``: a step the 1F1B A2A overlap runs without a partner (simdist.plan.comm_overlap.unpaired)."""
    key = ("step", token(recipe_key(cfg)) if config is None else config, cost_token, kind, edge, alone)
    hit = _RECIPE_CACHE.get(key)
    if hit is None:
        if len(_RECIPE_CACHE) >= _CACHE_MAX:
            _RECIPE_CACHE.clear()
        r = edge_recipe(cfg, cost, kind, edge, alone)
        hit = _RECIPE_CACHE[key] = (r, token(("pieces", r.pieces, r.end)))
    return hit  # type: ignore[return-value]


def tail_entry(cfg: StepConfig, costs: tuple[ChunkCost, ...], cost_tokens: tuple[int, ...],
               config: int | None = None) -> tuple[StageTail, int]:
    """(`simdist.plan.data_parallel.tail` of the stage's chunk costs, cached, and the `token` of its (pieces, end):
    `CommPricer.priced`'s ``pieces_token``); ``cost_tokens``:
    the `token` of each cost, ``config``: `token` of `recipe_key` of ``cfg``, if already computed."""
    key = ("tail", token(recipe_key(cfg)) if config is None else config, cost_tokens)
    hit = _RECIPE_CACHE.get(key)
    if hit is None:
        if len(_RECIPE_CACHE) >= _CACHE_MAX:
            _RECIPE_CACHE.clear()
        t = tail(cfg, list(costs))
        hit = _RECIPE_CACHE[key] = (t, token(("pieces", t.pieces, len(t.pieces) - 1)))
    return hit  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class PricedPieces:
    """A recipe's (or tail's) pieces as flat tuples, with each piece's duration on its stage's groups."""

    streams: tuple[int, ...]
    """STREAM_CODE of each piece."""
    durations: tuple[float, ...]
    deps: tuple[tuple[int, ...], ...]
    needs_input: int
    """Index of the piece that waits for the neighbouring stage (-1: none)."""
    end: int
    categories: tuple[str, ...]
    work: tuple[bool, ...]
    model_flops: float
    hardware_flops: float


def _duration(pricer: CommPricer, piece: Piece, groups: dict[str, Shape]) -> float:
    c: CommItem | None = piece.comm
    if c is None:
        return piece.duration_s
    first, size, stride = groups[c.axis]
    if size < 2 or c.nbytes <= 0:
        return 0.0
    # simdist.predict.price.price_graph: count back-to-back runs, each with its host time.
    return (pricer.shape_time_s(c.op, first, size, stride, c.nbytes, c.imbalance, c.kernel) + c.host_s) * c.count


def piece_durations(pricer: CommPricer, pieces: tuple[Piece, ...], groups: dict[str, Shape]) -> tuple[float, ...]:
    """Seconds of each of ``pieces`` on the mesh groups ``groups`` (axis -> (first rank, size, stride or offsets))."""
    durations: list[float] = []
    for p in pieces:
        if p.tax_of:  # the compute the collectives beside it slow (simdist.plan.interference.tax_s)
            durations.append(tax_s(p, (durations[k] for k in p.tax_of)))
        else:
            durations.append(_duration(pricer, p, groups))
    return tuple(durations)


_BY_DURATIONS: dict[tuple, tuple[PricedPieces, Any]] = {}


def priced_by_durations(pieces: tuple[Piece, ...], end: int, pieces_token: int, durations: tuple[float, ...],
                         compile: Callable[[PricedPieces], Any] | None) -> tuple[PricedPieces, Any]:
    """(the `PricedPieces` of ``pieces`` taking ``durations``, ``compile`` of it), shared by every pricer and group
    shape that times the pieces alike: a priced recipe is its pieces and their durations, nothing else, and a
    search prices one recipe on many shapes and pricers (one per mesh with contention) that mostly give the same
    durations (groups inside a node, collectives priced alike), so its simple form (simdist.analytic.stages) is
    made once per distinct timing, not once per shape (a stage slowed by a spread of GPU speeds likewise:
    simdist.analytic.stages)."""
    key = (pieces_token, durations, compile)
    hit = _BY_DURATIONS.get(key)
    if hit is None:
        if len(_BY_DURATIONS) >= _CACHE_MAX:
            _BY_DURATIONS.clear()
        priced = _with_durations(pieces, end, durations)
        hit = _BY_DURATIONS[key] = (priced, compile(priced) if compile is not None else None)
    return hit


def price_pieces(pricer: CommPricer, pieces: tuple[Piece, ...], end: int,
                 groups: dict[str, Shape]) -> PricedPieces:
    """``pieces`` timed on the mesh groups ``groups`` (axis -> (first rank, size, stride or offsets))."""
    return _with_durations(pieces, end, piece_durations(pricer, pieces, groups))


def _with_durations(pieces: tuple[Piece, ...], end: int, durations: tuple[float, ...]) -> PricedPieces:
    return PricedPieces(
        streams=tuple(STREAM_CODE[p.stream] for p in pieces),
        durations=durations,
        deps=tuple(p.deps for p in pieces),
        needs_input=next((i for i, p in enumerate(pieces) if p.needs_input), -1),
        end=end,
        categories=tuple(category_of(p.kind, p.comm.axis if p.comm is not None else None) for p in pieces),
        work=tuple(p.work for p in pieces),
        model_flops=sum(p.model_flops for p in pieces),
        hardware_flops=sum(p.hardware_flops for p in pieces),
    )
