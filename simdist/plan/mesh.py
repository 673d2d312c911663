"""The rank mesh: which global rank holds which coordinate of the parallel layout, and its groups.

Axes are listed innermost first (the order in which consecutive ranks vary), as Megatron-LM's
``RankGenerator`` order string "tp-cp-ep-dp-pp" does (megatron/core/parallel_state.py): with the default
``tp-cp-dp-pp`` the tp peers of a group are consecutive ranks, so on a cluster whose nodes hold
``gpus_per_node`` consecutive GPUs (simdist.hardware.topology: rank r lives on node r // gpus_per_node)
a tensor-parallel group of size <= gpus_per_node stays inside one NVLink domain.

Placement is the identity: mesh rank r runs on GPU r. A different placement is a different axis order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simdist.errors import LayoutError

AXES = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = ("tp", "cp", "dp", "pp")


def parse_order(text: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """'tp-cp-dp-pp' -> ('tp', 'cp', 'dp', 'pp'); a permutation of the four axes, innermost first."""
    if text is None:
        return DEFAULT_ORDER
    axes = tuple(text.split("-")) if isinstance(text, str) else tuple(text)
    if sorted(axes) != sorted(AXES):
        raise LayoutError(
            f"axis order '{'-'.join(axes)}' is not a permutation of {'-'.join(AXES)}",
            field="parallel.order", fix="write the four axes innermost first, e.g. tp-cp-dp-pp",
        )
    return axes


@dataclass(frozen=True, slots=True)
class Mesh:
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1
    order: tuple[str, ...] = DEFAULT_ORDER

    def size(self, axis: str) -> int:
        return int(getattr(self, axis))

    @property
    def num_ranks(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def stride(self, axis: str) -> int:
        """Rank distance between neighbours along ``axis`` (product of the inner axes' sizes)."""
        s = 1
        for a in self.order:
            if a == axis:
                return s
            s *= self.size(a)
        raise LayoutError(f"unknown axis '{axis}'", field="parallel.order", fix=f"use {', '.join(AXES)}")

    def rank(self, **coords: int) -> int:
        """Global rank of a coordinate (missing axes are 0): rank(tp=1, pp=2)."""
        r = 0
        for axis, c in coords.items():
            if not 0 <= c < self.size(axis):
                raise ValueError(f"{axis} coordinate {c} outside 0..{self.size(axis) - 1}")
            r += c * self.stride(axis)
        return r

    def coords(self, rank: int) -> dict[str, int]:
        out: dict[str, int] = {}
        rest = rank
        for a in self.order:
            rest, out[a] = divmod(rest, self.size(a))
        return out

    def group(self, axis: str, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s group along ``axis``, in peer order (coordinate 0 first)."""
        c = self.coords(rank)
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
