"""Hardware: GPU presets, topology graphs, routes, bisection and summaries."""

from simdist.hardware.bisection import Bisection, bisection
from simdist.hardware.fabric import Fabric
from simdist.hardware.gpus import GPU_PRESETS, gpu_preset
from simdist.hardware.link import Link, Route
from simdist.hardware.presets import load_topology, preset_names, resolve_topology_spec
from simdist.hardware.summary import describe
from simdist.hardware.topology import Topology

__all__ = [
    "GPU_PRESETS",
    "Bisection",
    "Fabric",
    "Link",
    "Route",
    "Topology",
    "bisection",
    "describe",
    "gpu_preset",
    "load_topology",
    "preset_names",
    "resolve_topology_spec",
]
