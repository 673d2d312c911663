"""The vocabulary of the one step model (simdist.plan.recipe): a step's `Piece`s on the streams of one rank, the
collectives they run (`CommItem`), a step's `Recipe` and a stage's `StageTail`, and the builder that chains them.

Both fidelities read these: the op-graph builder (simdist.plan.step) and the closed form (simdist.analytic.step).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DP_DONE", "LAST_BACKWARDS", "PREV", "SLOWED_KINDS", "STREAM_OF_AXIS", "Builder", "CommItem", "Piece",
           "Recipe", "StageTail", "stream_of"]

PREV = -1
"""A dependency on the end of the stage's previous step (program order)."""
LAST_BACKWARDS = -2
"""(tail only) A dependency on the end of every chunk's last backward of the stage."""
DP_DONE = -3
"""(tail only) A dependency on every data-parallel collective the stage issued before (the dp stream's last op)."""
SLOWED_KINDS = frozenset({"forward", "backward", "weight_grad", "recompute", "optimizer"})
"""Pieces a slower GPU runs slower (a straggler, the spread of GPU speeds: StepConfig.compute_factor): its kernels (not
its waits, not its collectives, which the links time); both fidelities slow the same ones."""


@dataclass(frozen=True, slots=True)
class CommItem:
    """A collective a piece runs: ``count`` back-to-back runs of ``op`` over ``nbytes`` (the nccl-tests size) on
    the piece's rank's group along ``axis``; ``host_s`` host time each run adds (list collectives' copies);
    ``imbalance`` (all_to_all): the busiest peer receives that many times the mean, priced as the uneven all_to_all
    of simdist.collectives.uneven.imbalanced_matrix (1.0: even)."""

    op: str
    nbytes: float
    axis: str
    count: int = 1
    host_s: float = 0.0
    imbalance: float = 1.0
    kernel: str = "nccl"
    """all_to_all: what moves it (simdist.collectives.ep_kernels.EP_KERNELS)."""


@dataclass(frozen=True, slots=True)
class Piece:
    stream: str
    """compute | tp | cp | ep | dp | pp (the rank's track it runs on; simdist.plan.recipe.stream_of an axis)."""
    kind: str
    """forward | backward | weight_grad | recompute | wait | optimizer | comm."""
    label: str
    duration_s: float = 0.0
    """Compute pieces; a comm piece's duration comes from pricing its ``comm``."""
    comm: CommItem | None = None
    deps: tuple[int, ...] = ()
    """Earlier pieces of the recipe, or PREV (LAST_BACKWARDS, DP_DONE in a stage tail)."""
    needs_input: bool = False
    """Waits for the neighbouring stage's activation (F) or gradient (B) too."""
    per_step: bool = False
    """Belongs to the step, not to its micro-batch (gradient buckets): not pipeline work for the bubble."""
    model_flops: float = 0.0
    hardware_flops: float = 0.0
    tax_of: tuple[int, ...] = ()
    """A compute piece standing for the compute slowed by collectives that run beside it (simdist.plan.interference):
    the collectives' pieces; its duration is then ``tax_share`` x min(their priced time, ``duration_s``), both
    fidelities pricing it once they have priced them."""
    tax_share: float = 0.0
    pairing: tuple[float, ...] = ()
    """Of a tax piece beside the 1F1B A2A overlap's all-to-alls: the per-layer compute segments, MoE layers and the
    step's share (simdist.plan.moe_pairing.step_pairing) whose exposure it adds (simdist.plan.interference.taxed_s)."""

    @property
    def work(self) -> bool:
        """Pipeline work (simdist.plan.accounting): the step's compute and the collectives it issues per
        micro-batch; not the zero-length wait, not per-step gradient buckets."""
        return not self.per_step and self.kind != "wait"


@dataclass(frozen=True, slots=True)
class Recipe:
    pieces: tuple[Piece, ...]
    end: int
    """Index of the piece that ends the step."""


@dataclass(frozen=True, slots=True)
class StageTail:
    """What a stage runs after its last pipeline step (deps may be LAST_BACKWARDS and DP_DONE)."""

    pieces: tuple[Piece, ...]


STREAM_OF_AXIS = {"etp": "tp", "edp": "dp", "dp_cp": "dp", "dps": "dp", "dps_cp": "dp", "dpr": "dp"}
"""The stream a collective of an axis without a stream of its own runs on (ep has its own: the token all_to_alls,
which Megatron-Core's 1F1B A2A overlap runs beside the compute).
# Assumption: the expert-TP collectives are model-parallel communication in the layer's critical path, run on the
# tp stream; the expert-data-parallel gradient reductions run on the dp stream beside (after) the dense ones.
"""


def stream_of(axis: str) -> str:
    """The rank's stream a collective along ``axis`` runs on (`STREAM_OF_AXIS`; else the axis's own)."""
    return STREAM_OF_AXIS.get(axis, axis)


class Builder:
    def __init__(self) -> None:
        self.pieces: list[Piece] = []

    def add(self, piece: Piece) -> int:
        self.pieces.append(piece)
        return len(self.pieces) - 1

    def chain(self, items: tuple, after: tuple[int, ...], label: str, groups: dict[str, int]) -> list[int]:
        """One comm piece per item, back to back after ``after``; axes whose group has < 2 ranks are skipped."""
        ids: list[int] = []
        deps = after
        for op, nbytes, axis, count, imbalance, kernel in items:
            if groups.get(axis, 1) < 2:
                continue
            i = self.add(Piece(stream_of(axis), "comm", f"{label} {op} x{count}",
                               comm=CommItem(op, nbytes, axis, count, imbalance=imbalance, kernel=kernel), deps=deps))
            ids.append(i)
            deps = (i,)
        return ids
