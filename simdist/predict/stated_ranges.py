"""The stated ranges of the prediction band (simdist/predict/data/uncertainty.yaml): each a time factor on one part of
the step, its p10 and p90 around the model's own value (median 1), with its reason.

Read by simdist.predict.bands, which draws each as a split log-normal (`time_factor`): the compute kernels by GPU
(`compute_range`), the memory-bound kernels by GPU (`memory_range`), the collectives by message size
(`size_factor`), the GPUs' speed spread (`spread_range`) and the host's time per framework op (`host_range`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import yaml

__all__ = ["DATA", "DATA_NAME", "Z90", "compute_range", "host_range", "memory_range", "range_key", "size_factor",
           "spread_range", "time_factor", "uncertainty"]

DATA = Path(__file__).parent / "data" / "uncertainty.yaml"
DATA_NAME = "simdist/predict/data/uncertainty.yaml"
Z90 = 1.2815515655446004
"""The standard normal's 90th percentile: a log-normal factor with p90 = x has sigma = ln x / Z90."""


@cache
def uncertainty() -> dict[str, Any]:
    """The data file (simdist/predict/data/uncertainty.yaml)."""
    return yaml.safe_load(DATA.read_text(encoding="utf-8"))


def time_factor(z: float, p10: float, p90: float) -> float:
    """A split log-normal time factor at standard normal ``z``: median 1, p10 and p90 as given."""
    return math.exp(z * (math.log(p90) if z >= 0 else -math.log(p10)) / Z90)


def range_key(part: str, gpu_name: str) -> str:
    """The row of uncertainty.yaml's ``part`` (compute, memory) that ``gpu_name`` takes: its own, else default."""
    return gpu_name if gpu_name in uncertainty()[part] else "default"


def compute_range(gpu_name: str) -> dict[str, Any]:
    """The stated range of the compute time factor of ``gpu_name``."""
    return uncertainty()["compute"][range_key("compute", gpu_name)]


def memory_range(gpu_name: str) -> dict[str, Any]:
    """The stated range of the memory-bound time factor of ``gpu_name``."""
    return uncertainty()["memory"][range_key("memory", gpu_name)]


def spread_range() -> dict[str, Any]:
    """The stated range of the factor on the GPUs' speed spread (uncertainty.yaml's ``gpu_speed_spread``)."""
    return uncertainty()["gpu_speed_spread"]


def host_range() -> dict[str, Any]:
    """The stated range of the factor on the host's framework time per op (uncertainty.yaml's ``host``)."""
    return uncertainty()["host"]


def size_factor(z: float) -> Callable[[float], float]:
    """The stated collective time factor of a message size (bytes -> factor) at standard normal ``z``."""
    bands = uncertainty()["communication"]

    def factor(nbytes: float) -> float:
        for b in bands:
            if nbytes < float(b["max_bytes"]):
                return time_factor(z, b["p10"], b["p90"])
        return time_factor(z, bands[-1]["p10"], bands[-1]["p90"])

    return factor
