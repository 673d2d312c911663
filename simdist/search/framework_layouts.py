"""The layouts each framework can run, as far as search varies them: which ZeRO stages it has, and which of them
it combines with pipeline stages (data: simdist/search/data/framework_layouts.csv, a source per row).

`simdist search` keeps to the scenario's framework (``training.framework``; Megatron-Core by default) unless
asked otherwise (``--any-layout``): a layout its framework cannot run is pruned with the rule ``framework`` and
the reason, e.g. Megatron-Core's distributed optimizer is ZeRO-1, so ZeRO-2/3 (Megatron-FSDP) come without a
pipeline; DeepSpeed's pipeline engine refuses ZeRO-2/3.
"""

from __future__ import annotations

import csv
from functools import lru_cache
from pathlib import Path

__all__ = ["FrameworkLayouts", "framework_layouts", "why_not_run"]

_DATA = Path(__file__).with_name("data") / "framework_layouts.csv"


class FrameworkLayouts:
    """One framework's row: the ZeRO stages it runs, those it runs with pipeline stages, and the source."""

    __slots__ = ("framework", "source", "zero_stages", "zero_stages_with_pp")

    def __init__(self, framework: str, zero_stages: frozenset[int], zero_stages_with_pp: frozenset[int],
                 source: str) -> None:
        self.framework = framework
        self.zero_stages = zero_stages
        self.zero_stages_with_pp = zero_stages_with_pp
        self.source = source


@lru_cache(maxsize=1)
def framework_layouts() -> dict[str, FrameworkLayouts]:
    """Every framework's row, by its name (simdist.spec.training.FRAMEWORKS)."""
    out = {}
    with open(_DATA, newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            out[row["framework"]] = FrameworkLayouts(
                row["framework"], frozenset(int(z) for z in row["zero_stages"].split()),
                frozenset(int(z) for z in row["zero_stages_with_pp"].split()), row["source"])
    return out


def why_not_run(framework: str, zero_stage: int, pp: int) -> str | None:
    """Why ``framework`` does not run ZeRO stage ``zero_stage`` with ``pp`` pipeline stages, or None if it does
    (a framework without a row runs everything)."""
    row = framework_layouts().get(framework)
    if row is None:
        return None
    if zero_stage not in row.zero_stages:
        stages = ", ".join(str(z) for z in sorted(row.zero_stages))
        return f"{framework} has no ZeRO-{zero_stage} (it runs ZeRO stages {stages})"
    if pp > 1 and zero_stage not in row.zero_stages_with_pp:
        if not row.zero_stages_with_pp:
            return f"{framework} runs no pipeline stages"
        stages = ", ".join(str(z) for z in sorted(row.zero_stages_with_pp))
        return f"{framework} runs ZeRO-{zero_stage} only without pipeline stages (with them: ZeRO {stages})"
    return None
