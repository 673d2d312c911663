"""How much of the GPUs' speed spread a pipeline of unequal stages pays: the pace of its slowest stage.

A synchronous step waits for its slowest GPU (simdist.hardware.variability): with identical stages every GPU of the
job can be the one that paces it, so the compute takes 1 + cv z(N) as long, N the job's GPUs. A pipeline whose
stages differ in work is paced by the heavy stage: the output layer and the loss make the last stage of a GPT 1T
over 64 stages (two decoder layers each) about 8 % heavier than the rest, so a GPU 3 % slow in any other stage waits
for it instead of delaying the pipeline: with otherwise identical GPUs, `simdist run
scenarios/published/korthikanti2022-1t.yaml --fidelity closed_form --set cluster.gpu_speed_cv=0 --set
"faults.stragglers=[{rank: R, slower_by: 0.03}]"` gives 75.10 s for R = 0 (stage 0) and 75.09 s for R = 256 (stage
32), as without the straggler, and 77.02 s (+2.6 %) for R = 504 (the last stage); tests/test_gpu_variability.py shows
the same on a four-stage pipeline in the engine. StepConfig.paced_variability, the factor the step's compute takes, is
the job's factor x `stage_pace`: `pace_ratio` of the stages' compute per micro-batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from simdist.hardware.variability import gpu_variability, pace_ratio
from simdist.plan.chunk_cost import memo_chunk_cost
from simdist.plan.step_config import StepConfig

__all__ = ["PACE_DIGITS", "paced_variabilities", "stage_loads", "stage_pace"]


def stage_loads(cfg: StepConfig) -> tuple[float, ...]:
    """Each pipeline stage's compute seconds per micro-batch at the model's constants: forward, backward and
    recompute of every model chunk it holds (the embedding on the first part, the head and the loss on the last)."""
    last = cfg.num_parts - 1
    kinds = cfg.parts_layers()
    seen: dict[tuple, float] = {}  # alike chunks (the same layers, neither end of the model) priced once
    loads = []
    for chunks in cfg.part_table:
        total = 0.0
        for part in chunks:
            key = (kinds[part], part == 0, part == last)
            seconds = seen.get(key)
            if seconds is None:
                cost = memo_chunk_cost(cfg, *key)
                seconds = seen[key] = cost.forward_s + cost.backward_s + cost.recompute_s
            total += seconds
        loads.append(total)
    return tuple(loads)


PACE_DIGITS = 3
"""The stage pace is rounded to 0.1 % (decimals): within `pace_ratio`'s own error against a Monte Carlo of the
pipeline (under 0.06 %, tests/test_gpu_variability.py), and it lets a search's layouts of one depth share the
compute pieces slowed by one factor (simdist.analytic.stages prices a recipe once per factor)."""

_PACES: dict[int, tuple[StepConfig, float]] = {}
"""`stage_pace` by the configuration's identity (the configuration kept in the entry: its id no other's meanwhile)."""
_PACES_MAX = 4096


def stage_pace(cfg: StepConfig) -> float:
    """`pace_ratio` of ``cfg``'s stages for its GPUs' spread (StepConfig.gpu_speed_cv): what StepConfig.
    paced_variability multiplies the job's factor by; 1 without a pipeline or a spread."""
    if not cfg.gpu_speed_cv or cfg.mesh.pp == 1:
        return 1.0
    hit = _PACES.get(id(cfg))
    if hit is not None and hit[0] is cfg:
        return hit[1]
    if len(_PACES) >= _PACES_MAX:
        _PACES.clear()
    pace = _pace(cfg, cfg.gpu_speed_cv, stage_loads(cfg))
    _PACES[id(cfg)] = (cfg, pace)
    return pace


def _pace(cfg: StepConfig, cv: float, loads: tuple[float, ...]) -> float:
    """`pace_ratio` of stages taking ``loads`` on ``cfg``'s GPUs per stage at spread ``cv``, rounded to PACE_DIGITS."""
    return round(pace_ratio(cv, loads, cfg.mesh.num_ranks // cfg.mesh.pp), PACE_DIGITS)


def paced_variabilities(cfg: StepConfig, cvs: Sequence[float]) -> list[float]:
    """StepConfig.paced_variability of ``cfg`` were its GPUs' spread each of ``cvs`` (a prediction band's draws of
    the spread, simdist.predict.bands): the job's factor at each (simdist.hardware.variability.gpu_variability)
    times its stage pace, the stages' loads found once."""
    n = cfg.mesh.num_ranks
    loads = stage_loads(cfg) if cfg.mesh.pp > 1 and any(cvs) else ()
    return [gpu_variability(cfg.gpu, cv, n) * (_pace(cfg, cv, loads) if loads and cv else 1.0) for cv in cvs]
