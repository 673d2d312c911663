"""How a step's prediction band was obtained, in one line of text (from the JSON's ``step_time_band_sources``,
simdist.predict.bands)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["band_line"]


def band_line(sources: Sequence[Mapping[str, Any]] | None) -> str:
    """``band from: ...``: which constants were sampled from a calibration's confidence intervals (and which file),
    which from the stated ranges; empty without sources."""
    if not sources:
        return ""
    fitted = [s for s in sources if s.get("method") == "calibration_ci"]
    stated = [s for s in sources if s.get("method") == "stated_range"]
    parts = []
    if fitted:
        level = float(fitted[0]["interval"]["confidence"])
        names = ", ".join(f"{s['op']} {s['constant']}" if s.get("op") else str(s["constant"]) for s in fitted)
        files = ", ".join(dict.fromkeys(Path(str(s["source"])).name for s in fitted))
        parts.append(f"the {level:.0%} confidence intervals of {files}: {names}")
    texts = []
    for s in stated:
        if s.get("part") == "compute" and "gpu_speed_cv" in s.get("applies_to", ()):
            texts.append(f"GPU speed spread x {s['p10']:g}-{s['p90']:g}")
        elif s.get("part") == "compute":
            on = f" ({', '.join(s['applies_to'])})" if fitted or s.get("calibrated_without_interval") else ""
            texts.append(f"compute time x {s['p10']:g}-{s['p90']:g}{on}")
        elif s.get("part") == "host":
            texts.append(f"host time per framework op x {s['p10']:g}-{s['p90']:g}")
        elif s.get("part") == "memory":
            texts.append(f"memory-bound kernel time x {s['p10']:g}-{s['p90']:g}")
        else:
            texts.append("other collectives' time by message size" if fitted else "collective time by message size")
    if texts:
        parts.append(f"the stated p10-p90 ranges of uncertainty.yaml: {', '.join(texts)}")
    return "step time band from " + "; ".join(parts)
