"""The rank mesh: which global rank holds which coordinate of the parallel layout, and its groups.

Axes are listed innermost first (the order in which consecutive ranks vary), as Megatron-LM's
``RankGenerator`` order string "tp-cp-ep-dp-pp" does (megatron/core/parallel_state.py): with the default
``tp-cp-dp-pp`` the tp peers of a group are consecutive ranks, so on a cluster whose nodes hold
``gpus_per_node`` consecutive GPUs (simdist.hardware.topology: rank r lives on node r // gpus_per_node)
a tensor-parallel group of size <= gpus_per_node stays inside one NVLink domain.

Placement is the identity: mesh rank r runs on GPU r. A different placement is a different axis order.

Experts. Megatron-Core forms the expert groups with a second ``RankGenerator`` over the same ranks
(megatron/core/parallel_state.py, initialize_model_parallel): tp -> etp (expert_tensor_parallel_size, default
tp), cp -> 1, ep = expert_model_parallel_size, dp -> edp = world / (etp x ep x pp) (the expert-data-parallel
group, over which the experts' gradients reduce), in the same order string (default "tp-cp-ep-dp-pp": the dense
generator takes ep = 1, the expert one cp = 1). So the dense axes tp, cp, dp and the expert axes etp, ep, edp
are two factorizations of the same tp x cp x dp ranks of each pipeline stage: innermost first
``etp, ep, edp`` where the order says ``tp, [cp,] ep, dp``. With ``etp = tp`` and ep inner to dp, an ep group of
size ep x etp <= gpus_per_node stays inside one NVLink domain, and a larger one spans nodes. Megatron requires
the two generators' pipeline groups to be the same ("Pipeline parallel groups are expected to be the same for
Non-Expert and Expert part"), which `Mesh.pipeline_groups_agree` checks. An order without ``ep`` places it where
Megatron's default does: just inside dp. The expert generator has no cp, so edp already spans the cp ranks.

Combined groups. The dense parameters' gradients and their distributed-optimizer / ZeRO shards live over the
data-parallel group *with context parallelism*, ``dp_cp`` (`COMBINED_AXES`): the cp ranks of a replica hold the
same weights and compute gradients on different chunks of the sequence (Megatron-Core parallel_state.py:
``get_ranks("dp-cp")`` -> ``get_data_parallel_group(with_context_parallel=True)``, the group of the dense
gradient buffers in distributed_data_parallel.py and of the distributed optimizer's shards). Its peers are
ordered as Megatron's ``generate_masked_orthogonal_rank_groups`` orders a masked group: the peer index
decomposed over the group's axes innermost first (so ranks ascend). Where cp and dp are not adjacent in the
order (tp-cp-pp-dp) the group is not one stride: `Mesh.offsets` lists its peers' distances from the first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simdist.errors import LayoutError

AXES = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = ("tp", "cp", "dp", "pp")
EXPERT_AXES = ("etp", "ep", "edp")
"""The expert generator's axes: expert tensor parallel, expert parallel, expert data parallel (module docstring)."""
_EXPERT_NAME = {"tp": "etp", "ep": "ep", "dp": "edp", "pp": "pp"}
COMBINED_AXES = {"dp_cp": ("cp", "dp"), "dps_cp": ("cp", "dps")}
"""Groups over several dense axes (module docstring): the data-parallel group with context parallelism, and a hybrid
sharding's shard group with it."""
DP_SUB_AXES = ("dps", "dpr")
"""Hybrid sharding (HSDP, `Mesh.dp_shard`): dp split into its shard groups (``dps``: dp_shard consecutive data-parallel
ranks, innermost) and their replicas (``dpr``: dp / dp_shard of them, a stride of dp_shard data-parallel ranks apart),
as torchtitan's ("dp_replicate", "dp_shard") mesh and FSDP's HYBRID_SHARD (shard inside, replicate across)."""


def component_axes(axis: str) -> tuple[str, ...]:
    """The mesh axes a group along ``axis`` spans: dp_cp -> (cp, dp); any other axis itself."""
    return COMBINED_AXES.get(axis, (axis,))


def parse_order(text: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """'tp-cp-dp-pp' -> ('tp', 'cp', 'dp', 'pp'); a permutation of the four axes, or of the four and ep
    (Megatron's 'tp-cp-ep-dp-pp'), innermost first."""
    if text is None:
        return DEFAULT_ORDER
    axes = tuple(text.split("-")) if isinstance(text, str) else tuple(text)
    if sorted(axes) not in (sorted(AXES), sorted((*AXES, "ep"))):
        raise LayoutError(
            f"axis order '{'-'.join(axes)}' is not a permutation of {'-'.join(AXES)} (and optionally ep)",
            field="parallel.order", fix="write the axes innermost first, e.g. tp-cp-dp-pp or tp-cp-ep-dp-pp",
        )
    return axes


@dataclass(frozen=True, slots=True)
class Mesh:
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    order: tuple[str, ...] = DEFAULT_ORDER
    """Innermost first; may name ep (its place in the expert generator; absent: just inside dp)."""
    ep: int = 1
    etp: int | None = None
    """Expert tensor parallelism; None: tp (Megatron-Core's default)."""
    dp_shard: int = 0
    """Hybrid sharding's shard group size along dp (`DP_SUB_AXES`); 0: no hybrid sharding (dps = dp, dpr = 1)."""

    def size(self, axis: str) -> int:
        if axis == "dps":
            return self.dp_shard or self.dp
        if axis == "dpr":
            return self.dp // (self.dp_shard or self.dp)
        if axis == "etp":
            return self.tp if self.etp is None else self.etp
        if axis == "edp":
            return self.tp * self.cp * self.dp // (self.size("etp") * self.ep)
        if axis in COMBINED_AXES:
            return math.prod(self.size(a) for a in COMBINED_AXES[axis])
        return int(getattr(self, axis))

    @property
    def num_ranks(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def dense_order(self) -> tuple[str, ...]:
        """The dense generator's axes, innermost first."""
        return tuple(a for a in self.order if a != "ep")

    @property
    def expert_order(self) -> tuple[str, ...]:
        """The expert generator's axes, innermost first: the order without cp, tp as etp, dp as edp; ep where the
        order names it, else just inside dp (Megatron's default tp-cp-ep-dp-pp)."""
        order = self.order if "ep" in self.order else tuple(
            x for a in self.order for x in (("ep", a) if a == "dp" else (a,)))
        return tuple(_EXPERT_NAME[a] for a in order if a != "cp")

    def _axes_of(self, axis: str) -> tuple[str, ...]:
        if axis in EXPERT_AXES:
            return self.expert_order
        return self.order if len(self.order) == len(AXES) else self.dense_order

    def _group_order(self, axes: tuple[str, ...]) -> tuple[str, ...]:
        """The order a group over ``axes`` is laid along: the dense order, dp read as its hybrid-sharding sub-axis where
        the group names one (dps, dpr)."""
        sub = next((a for a in axes if a in DP_SUB_AXES), None)
        order = self._axes_of(axes[0])
        return tuple(sub if a == "dp" and sub else a for a in order)

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours along ``axis`` (product of the inner axes' sizes); the expert axes
        (etp, ep, edp) in the expert generator (module docstring); a combined axis (dp_cp) where its group is one
        stride (`levels`), else a ValueError (use `offsets`)."""
        if axis in COMBINED_AXES:
            levels = self.levels(axis)
            if len(levels) > 1:
                raise ValueError(f"the {axis} group of order {'-'.join(self.order)} is not evenly spaced: "
                                 "use Mesh.offsets")
            return levels[0][1] if levels else self.stride(COMBINED_AXES[axis][0])
        if axis == "dps":
            return self.stride("dp")
        if axis == "dpr":
            return self.stride("dp") * self.size("dps")
        s = 1
        for a in self._axes_of(axis):
            if a == axis:
                return s
            s *= self.size(a)
        raise LayoutError(f"unknown axis '{axis}'", field="parallel.order",
                          fix=f"use {', '.join((*AXES, *EXPERT_AXES, *COMBINED_AXES))}")

    def levels(self, axis: str) -> tuple[tuple[int, int], ...]:
        """(size, stride) of each run of evenly spaced peers of a group along ``axis``, innermost first: the
        group's axes of size > 1 in the order's sequence (Megatron's masked decomposition, module docstring),
        neighbours merged where the outer one's stride continues the inner one's span (cp x dp adjacent: one)."""
        axes = component_axes(axis)
        out: list[tuple[int, int]] = []
        for a in self._group_order(axes):
            if a not in axes or self.size(a) == 1:
                continue
            size, stride = self.size(a), self.stride(a)
            if out and out[-1][0] * out[-1][1] == stride:
                size, stride = out[-1][0] * size, out[-1][1]
                out.pop()
            out.append((size, stride))
        return tuple(out)

    def offsets(self, axis: str) -> tuple[int, ...]:
        """Rank distance of each peer of a group along ``axis`` from its first (peer 0), in peer order: peer j's
        index decomposed over `levels` innermost first (i * stride for a one-stride group)."""
        out = [0]
        for size, stride in self.levels(axis):
            out = [o + k * stride for k in range(size) for o in out]
        return tuple(out)

    def shape(self, axis: str) -> tuple[int, int | tuple[int, ...]]:
        """(size, stride) of a group along ``axis``: the stride where its peers are evenly spaced, else the tuple of
        their `offsets` (a combined group whose axes are not adjacent in the order)."""
        if axis in COMBINED_AXES and len(self.levels(axis)) > 1:
            return self.size(axis), self.offsets(axis)
        return self.size(axis), self.stride(axis)

    def expert_coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank`` in the expert generator (etp, ep, edp, pp)."""
        out: dict[str, int] = {}
        rest = rank
        for a in self.expert_order:
            rest, out[a] = divmod(rest, self.size(a))
        return out

    def pipeline_groups_agree(self) -> bool:
        """The dense and the expert generators give the same pipeline groups (Megatron-Core asserts it): pp has the
        same stride in both, and the expert axes factor the dense tp x cp x dp exactly."""
        inner = self.size("etp") * self.ep
        if (self.tp * self.cp * self.dp) % inner:
            return False
        dense = 1
        for a in self._axes_of("tp"):
            if a == "pp":
                break
            dense *= self.size(a)
        expert = 1
        for a in self.expert_order:
            if a == "pp":
                break
            expert *= self.size(a)
        return dense == expert

    def rank(self, **coords: int) -> int:
        """Global rank of a coordinate (missing axes are 0): rank(tp=1, pp=2)."""
        r = 0
        for axis, c in coords.items():
            if not 0 <= c < self.size(axis):
                raise ValueError(f"{axis} coordinate {c} outside 0..{self.size(axis) - 1}")
            r += c * self.stride(axis)
        return r

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank`` along the dense axes (tp, cp, dp, pp)."""
        out: dict[str, int] = {}
        rest = rank
        for a in self._axes_of("tp"):
            rest, out[a] = divmod(rest, self.size(a))
        return out

    def _group_coords(self, rank: int) -> dict[str, int]:
        """`coords` with dp's hybrid-sharding sub-axes (dps, dpr) too."""
        out = self.coords(rank)
        out["dpr"], out["dps"] = divmod(out["dp"], self.size("dps"))
        return out

    def group(self, axis: str, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s group along ``axis``, in peer order (coordinate 0 first); ep, etp and edp
        from the expert generator; dp_cp over the cp and dp coordinates (peer order: `offsets`)."""
        if axis in COMBINED_AXES:
            c = self._group_coords(rank)
            base = rank - sum(c[a] * self.stride(a) for a in COMBINED_AXES[axis])
            return tuple(base + o for o in self.offsets(axis))
        c = self.expert_coords(rank) if axis in EXPERT_AXES else self._group_coords(rank)
        base = rank - c[axis] * self.stride(axis)
        return tuple(base + i * self.stride(axis) for i in range(self.size(axis)))

    def nodes_spanned(self, axis: str, gpus_per_node: int) -> int:
        """How many nodes one group along ``axis`` touches (rank r on node r // gpus_per_node)."""
        return len({r // gpus_per_node for r in self.group(axis, 0)})

    def translates(self, ranks: tuple[int, ...], axes: tuple[str, ...]) -> list[tuple[int, ...]]:
        """Images of a group of ``ranks`` when every member's coordinates along ``axes`` shift by the same
        offsets (mod the axis sizes): the equivalent groups of a homogeneous layout. The group itself comes
        first; images with the same set of ranks (a shift along the group's own axis) appear once.
        """
        return list(map(tuple, self.translates_array(ranks, axes).tolist()))

    def translates_array(self, ranks: tuple[int, ...], axes: tuple[str, ...]) -> np.ndarray:
        """`translates` as an (images, members) int64 array, row by row in the same order."""
        members = np.asarray(ranks, dtype=np.int64)
        images = members[None, :]
        for axis in axes:
            size, stride = self.size(axis), self.stride(axis)
            if size == 1:
                continue
            coord = (images // stride) % size  # (n_images, n_members)
            base = images - coord * stride
            shift = np.arange(size, dtype=np.int64)[:, None, None]  # every offset k, offset-major
            images = (base[None] + ((coord[None] + shift) % size) * stride).reshape(-1, images.shape[1])
        if len(images) == 1:
            return images
        # the first image of every set of ranks (a row's members are distinct: sorted rows compare as sets),
        # each sorted row compared as one opaque value (far cheaper than np.unique over axis 0)
        rows = np.ascontiguousarray(np.sort(images, axis=1))
        _, first = np.unique(rows.view(np.dtype((np.void, rows.itemsize * rows.shape[1]))).ravel(),
                             return_index=True)
        return images[np.sort(first)]
