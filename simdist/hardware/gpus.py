"""GPU presets: dense peak FLOP/s per dtype, HBM capacity and bandwidth, board power.

The presets are data: one YAML file per GPU under ``gpus/`` at the top of the repository (shipped in the wheel
beside ``topologies/``), each value cited under the file's ``sources:`` (mostly
``validation/reference/hardware_gpu_specs.csv`` and NVIDIA's datasheets). The file name is the preset name.
"""

from __future__ import annotations

from simdist.errors import PresetError
from simdist.spec.gpu import GpuSpec
from simdist.spec.preset_file import bundled_dir, read_preset


def _load() -> tuple[dict[str, GpuSpec], dict[str, dict[str, str]]]:
    specs: dict[str, GpuSpec] = {}
    sources: dict[str, dict[str, str]] = {}
    for path in sorted(bundled_dir("gpus").glob("*.yaml")):
        specs[path.stem], sources[path.stem], _ = read_preset(path, GpuSpec)
    return specs, sources


GPU_PRESETS, GPU_SOURCES = _load()
"""Preset name -> GpuSpec, and preset name -> {field path: citation} (``gpus/*.yaml``)."""

CPU_PRESETS = frozenset({"cpu-core"})
"""GPU_PRESETS entries that are CPU cores standing in for devices (no tensor cores: every dtype at one rate)."""


def gpu_preset(name: str) -> GpuSpec:
    """The GPU preset called ``name``; an unknown name lists the valid ones."""
    try:
        return GPU_PRESETS[name]
    except KeyError:
        raise PresetError(
            f"unknown GPU preset '{name}'",
            field="gpu",
            fix=f"use one of: {', '.join(sorted(GPU_PRESETS))}, or describe the GPU inline",
        ) from None
