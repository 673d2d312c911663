"""Input models (pydantic, frozen, ``extra="forbid"``) and their loading from YAML."""

from simdist.spec.gpu import GpuSpec, PeakFlopsSpec
from simdist.spec.scenario import ClusterSpec, ModelSpec, ParallelSpec, ScenarioSpec, TrainingSpec
from simdist.spec.topology import (
    CpuInterconnectSpec,
    HostSpec,
    InterNodeSpec,
    PcieSpec,
    ScaleUpSpec,
    TopologySpec,
)

__all__ = [
    "ClusterSpec",
    "CpuInterconnectSpec",
    "GpuSpec",
    "HostSpec",
    "InterNodeSpec",
    "ModelSpec",
    "ParallelSpec",
    "PcieSpec",
    "PeakFlopsSpec",
    "ScaleUpSpec",
    "ScenarioSpec",
    "TopologySpec",
    "TrainingSpec",
]
