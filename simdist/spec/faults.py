"""What-if faults of a scenario (``faults:``): stragglers, degraded links, and the checkpoint/restart costs that
goodput (simdist.predict.goodput) charges for failures.

Both fidelities see a straggler's compute and the routes around a failed leaf-spine link (the cluster's ECMP
routing changes: simdist.hardware.fabric); only the engine sees a degraded link (the closed form prices each
collective on the nominal link bandwidth: simdist.predict.step says so in its JSON).
"""

from __future__ import annotations

from pydantic import Field

from simdist.limits import LINK_FRACTION_MAX, LINK_FRACTION_MIN
from simdist.spec.base import Duration, Spec, bounded, count

STRAGGLER_MAX = 100.0
"""A GPU at most 100 x slower (slower_by 99): beyond that it is a failure, not a straggler."""


class StragglerSpec(Spec):
    """One GPU whose kernels run slower than its peers' (thermal throttling, a bad HBM stack, a noisy host)."""

    rank: count(minimum=0) = Field(description="the global rank of the slow GPU (rank r runs on GPU r)")
    slower_by: float = Field(gt=0.0, lt=STRAGGLER_MAX, description="fraction by which each compute kernel of "
                                                                     "the GPU takes longer: 0.2 = every kernel "
                                                                     "takes 1.2 x as long")


class DegradedLinkSpec(Spec):
    """A directed link (both directions unless ``one_way``) at a fraction of its bandwidth, named by its two
    vertices as `simdist topo` and the run JSON's ``links`` rows write them (``n0/nic0`` and ``leaf0``,
    ``leaf0`` and ``spine1``, ``n0/gpu0`` and ``n0/nvswitch``)."""

    src: str = Field(description="one end of the link, e.g. n0/nic0")
    dst: str = Field(description="the other end, e.g. leaf0")
    bandwidth_fraction: bounded(LINK_FRACTION_MIN, LINK_FRACTION_MAX, "bandwidth fraction") = Field(
                                      description="the link's bandwidth as a fraction of its nominal bandwidth (0.5: "
                                                  "half), at least 1e-6 (slower is down: failed_links)")
    one_way: bool = Field(default=False, description="degrade only src -> dst (default: both directions)")


class FailedLinkSpec(Spec):
    """A leaf-spine link that is down (both directions), named by its two vertices as `simdist topo` and the run
    JSON's ``links`` rows write them (``leaf0`` and ``spine1``, either order): ECMP routes around it."""

    src: str = Field(description="one end of the link, e.g. leaf0")
    dst: str = Field(description="the other end, e.g. spine1")


class OtherGpuNodesSpec(Spec):
    """Nodes of the cluster whose GPUs are another model (a mixed fleet): their kernels run at that GPU's speed."""

    nodes: list[count(minimum=0)] = Field(min_length=1, description="node indices (rank r sits on node r // GPUs "
                                                                     "per node), e.g. [4, 5, 6, 7]")
    gpu: str = Field(description="the GPU preset of those nodes (simdist topo gpus), e.g. a100-sxm-80gb")


class CheckpointSpec(Spec):
    """What a failure costs: writing checkpoints, restarting from the last one (simdist.predict.goodput)."""

    write: Duration | None = Field(default=None, description="time a checkpoint write stalls training, e.g. "
                                                              "'30 s' (default: simdist/predict/data/"
                                                              "goodput.yaml)")
    restart: Duration | None = Field(default=None, description="time from a failure to training again (detect, "
                                                                "replace, reload), e.g. '10 min' (default: the "
                                                                "data file)")
    interval: Duration | None = Field(default=None, description="time between checkpoints (default: the "
                                                                 "Young/Daly optimum sqrt(2 x write x MTBF))")


class FaultsSpec(Spec):
    """What-ifs the step is simulated under, and the failure costs goodput charges."""

    stragglers: list[StragglerSpec] = Field(default_factory=list, description="slow GPUs")
    degraded_links: list[DegradedLinkSpec] = Field(default_factory=list, description="links at a fraction of "
                                                                                      "their bandwidth (engine only)")
    heterogeneous_nodes: list[OtherGpuNodesSpec] = Field(
        default_factory=list, description="nodes with another GPU: each of their GPUs runs the step's kernels as "
                                          "that GPU's kernel model times them (both fidelities)")
    failed_links: list[FailedLinkSpec] = Field(
        default_factory=list, description="leaf-spine links that are down: the flows of their leaves are rehashed "
                                          "over the spines still reachable (both fidelities route around them)")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="checkpoint write, restart "
                                                                                   "and interval for goodput")
