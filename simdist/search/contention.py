"""What contention adds to the closed form a search ranks by.

The closed form (simdist.analytic.step) prices each collective alone on its group's links; the engine runs every
collective of a step on shared links, and in a homogeneous layout each collective runs together with its
*translates*: the same collective of every other tensor-, context- and data-parallel peer group of its stage
(simdist.plan.mesh.Mesh.translates), in lockstep. Where they share a link (a NIC serving several GPUs, an
oversubscribed leaf uplink, two groups whose ECMP routes collide on a spine, a degraded link) the class's bytes on
it bound the time. `ContendedPricer` prices a collective as

    latency + transfer alone x max(1, class bytes on its busiest link / that link's capacity / transfer alone)

(simdist.predict.price.class_bottleneck_s: the bytes the group and its translates put on each link of the
group's routes, the engine's own accounting of them), so the closed form's step moves with oversubscription, NIC
count and speed, placement and failed links where the engine's does. It is a bound of the class, not a schedule:
collectives of *different* axes overlapping in time (a data-parallel reduction beside the next micro-batch's
tensor-parallel traffic) are not charged to each other. `benchmarks/contention.py` measures how it ranks
against the engine.

# Assumption: translates of a collective run in lockstep (the engine's symmetric reduction,
# simdist.predict.link_loads); a layout whose translates finish at different times (asymmetric routes) is charged its
# busiest link's whole class.
"""

from __future__ import annotations

from hashlib import blake2b

import numpy as np

from simdist.analytic.pricing import CommPricer
from simdist.hardware.topology import Topology
from simdist.plan.mesh import Mesh
from simdist.plan.opgraph import Comm
from simdist.predict.price import class_bottleneck_s, plan_basis, price_comm, transfer_alone_s, translate_necks_s

__all__ = ["ContendedPricer"]

TRANSLATE_AXES = ("tp", "cp", "dp", "pp")
"""The axes whose peer groups run a stage's collectives together (a stage's ranks, one per replica and peer)."""


REFERENCE_BYTES = 64 * 2**20
"""The size a collective's sharing factor is measured at (`ContendedPricer.factor`): large enough that its transfer
dominates its latency on every fabric bundled."""


class ContendedPricer(CommPricer):
    """A `CommPricer` for one mesh whose every collective also waits for its translates' traffic (the module
    docstring). Keys carry the group's own first rank (where it sits decides which links its translates share),
    so the prices are this mesh's; a search keeps one per mesh (simdist.search.evaluate).

    A collective of n bytes takes latency + transfer x its group's sharing factor (`factor`: the class's busiest
    link against the transfer alone, at `REFERENCE_BYTES`, at least 1), its latency and transfer the alone
    pricer's (``alone``: cached by group shape; latency: its one-byte time). One factor per (op, group) serves
    every size, so a search's layouts of one mesh share them whatever their micro-batch; the members of a class of
    translates that run one plan (a pipeline's stages, a replica's tp peers) share one batch of the class's routes,
    each reading its own busiest link's class bytes (`_class_factor`).
    # Assumption: the sharing factor does not depend on the size (the class's link bytes and the transfer alone
    # both scale with it; where the tuner switches algorithm between sizes, the reference size's stands).
    """

    def __init__(self, topology: Topology, mesh: Mesh, alone: CommPricer | None = None,
                 shared: dict[tuple, float] | None = None) -> None:
        super().__init__(topology)
        self._gpn = self._period = 0  # every group priced where it is (`CommPricer._position`)
        self.mesh = mesh
        self.alone = alone if alone is not None else CommPricer(topology)
        self._axes = tuple(a for a in TRANSLATE_AXES if mesh.size(a) > 1)
        self._factors: dict[tuple, float] = {}
        # factors by what decides them (op, imbalance, the group and its translates placed), shared by the pricers
        # of every mesh on one topology: meshes that differ only in axes a group and its translates fill alike
        # (tp 4 innermost, whatever pp and dp) place the same images and get one price_comm between them
        self._shared = shared if shared is not None else {}

    def factor(self, op: str, placed: tuple[int, ...], imbalance: float = 1.0, kernel: str = "nccl") -> float:
        """How many times longer the transfer of ``op`` on the group ``placed`` takes beside its translates than
        alone (at least 1)."""
        key = (op, placed, imbalance, kernel)
        hit = self._factors.get(key)
        if hit is None:
            gpn = self.topology.gpus_per_node
            if self._switched and len({r // gpn for r in placed}) == 1:
                # inside one NVSwitch node every GPU has its own switch ports: its translates share no link with it
                hit = self._factors[key] = 1.0
                return hit
            axes = self._translate_axes(placed)
            # the images are those of ``placed`` under these shifts (`_images`), so these key them first; meshes
            # whose shifts differ may still place the same images (then their digest keys them: one price_comm;
            # 128 bits of BLAKE2b, where a search keeps thousands: no two distinct images meet in practice, and the
            # thousands of bytes of each are not kept)
            shifts_key = (op, placed, imbalance, kernel,
                          tuple((a, self.mesh.size(a), self.mesh.stride(a)) for a in axes))
            hit = self._shared.get(shifts_key)
            if hit is None:
                images = self._images(placed, axes)
                hit = self._class_factor(op, placed, imbalance, kernel, images)
                if hit is None:  # a class not priced in one batch: this group with its translates
                    hit = self._own_factor(op, placed, imbalance, kernel, images)
                self._shared[shifts_key] = hit
            self._factors[key] = hit
        return hit

    def _own_factor(self, op: str, placed: tuple[int, ...], imbalance: float, kernel: str, images: np.ndarray
                    ) -> float:
        """`factor` from `price_comm` of ``placed`` with its translates ``images``."""
        images_key = (op, placed, imbalance, kernel, images.shape, blake2b(images.tobytes(), digest_size=16).digest())
        hit = self._shared.get(images_key)
        if hit is None:
            priced = price_comm(self.topology, Comm(op, placed, REFERENCE_BYTES, "", imbalance=imbalance,
                                                    kernel=kernel),
                                translates=images if len(images) > 1 else None,
                                groups=self.topology.groups,  # type: ignore[arg-type]
                                # its tuner choice and transfer alone found once for every stage's group: the
                                # alone pricer prices them as this stand-in
                                stand_in=self.alone.stand_in(placed))
            transfer = priced.time_s - priced.latency_s
            hit = self._shared[images_key] = max(
                1.0, class_bottleneck_s(self.topology, priced) / transfer) if transfer > 0 else 1.0
        return hit

    def _class_factor(self, op: str, placed: tuple[int, ...], imbalance: float, kernel: str, images: np.ndarray
                      ) -> float | None:
        """`factor` from the class's bottlenecks, found once for every member of the class that runs one plan
        (simdist.predict.price.translate_necks_s: a translate's factor is its own busiest link's class bytes against
        its own transfer alone, the class's bytes the same whichever member asks); None where the class is not
        priced in one batch. The class's rows in one order whichever member asks first, so each factor is the same
        float whatever the order a search (or its workers) asks them in."""
        if len(images) < 2:
            return None
        stand_in = self.alone.stand_in(placed)
        basis = plan_basis(self.topology, placed, stand_in)
        rows = images[np.lexsort(images.T[::-1])]  # (every member's images are the same set: its orbit)
        key = ("class", op, imbalance, kernel, basis, rows.shape, blake2b(rows.tobytes(), digest_size=16).digest())
        necks = self._shared.get(key)
        comm = Comm(op, placed, REFERENCE_BYTES, "", imbalance=imbalance, kernel=kernel)
        if necks is None:
            found = translate_necks_s(self.topology, comm, rows, groups=self.topology.groups,  # type: ignore[arg-type]
                                      stand_in=stand_in)
            necks = self._shared[key] = found if found is not None else ()
        if not len(necks):
            return None
        row = np.flatnonzero((rows == np.asarray(placed, dtype=np.int64)).all(axis=1))
        if len(row) != 1:
            return None
        transfer = transfer_alone_s(self.topology, comm, self.topology.groups,  # type: ignore[arg-type]
                                    stand_in)
        return max(1.0, float(necks[row[0]]) / transfer) if transfer > 0 else 1.0

    def _translate_axes(self, placed: tuple[int, ...]) -> tuple[str, ...]:
        """The axes the members of ``placed`` do not span: shifting along its own axis maps a whole axis group to
        itself, and a pair of pipeline stages onto a pair that never sends."""
        coords = [self.mesh.coords(r) for r in placed]
        return tuple(a for a in self._axes if len({c[a] for c in coords}) == 1)

    def _images(self, placed: tuple[int, ...], axes: tuple[str, ...]) -> np.ndarray:
        """The group ``placed`` and its translates (rows, members in peer order): its images under every shift of
        ``axes`` (`_translate_axes`)."""
        order = sorted(range(len(placed)), key=placed.__getitem__)
        members = tuple(placed[i] for i in order)
        return self.mesh.translates_array(members, axes)[:, np.argsort(order)]

    def _time(self, op: str, placed: tuple[int, ...], nbytes: float, imbalance: float, kernel: str = "nccl"
              ) -> float:
        alone = self.alone.time_s(op, placed, nbytes, imbalance, kernel)
        f = self.factor(op, placed, imbalance, kernel)
        if f == 1.0:  # (its latency, a one-byte pricing, is not needed)
            return alone
        latency = min(self.alone.time_s(op, placed, 1.0, imbalance, kernel), alone)
        return latency + (alone - latency) * f
