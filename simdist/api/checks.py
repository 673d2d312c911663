"""Argument checks of the API (and so of the CLI): numbers a user passes, and the work they ask for.

A flag value that is negative, zero where a count is needed, not finite, or beyond `simdist.limits` is one
`SpecError` / `LimitError` naming the flag and the fix, before anything runs.
"""

from __future__ import annotations

import math
from typing import Any

from simdist.errors import SpecError
from simdist.limits import Limit


def whole(value: Any, flag: str, *, minimum: int = 1, limit: Limit | None = None, example: str = "") -> int:
    """A whole-number flag in [minimum, limit]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"{flag} {value!r} is not a whole number", field=flag, fix=f"give e.g. {example or minimum}")
    if value < minimum:
        raise SpecError(f"{flag} {value} must be at least {minimum}", field=flag,
                        fix=f"give e.g. {example or minimum}")
    if limit is not None and value > limit.value:
        raise SpecError(f"{flag} {value:,} is above the limit of {limit.text()} ({limit.reason})", field=flag,
                        fix=f"give at most {limit.text()}")
    return value


def number(value: Any, flag: str, *, low: float | None = None, high: Limit | float | None = None,
           low_inclusive: bool = True, example: str = "") -> float:
    """A finite number flag in [low, high] (``low_inclusive=False``: above ``low``)."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise SpecError(f"{flag} {value!r} is not a number", field=flag, fix=f"give e.g. {example}") from None
    if not math.isfinite(v):
        raise SpecError(f"{flag} {value!r} is not a finite number", field=flag, fix=f"give e.g. {example}")
    if low is not None and (v < low or (v == low and not low_inclusive)):
        bound = f"at least {low:g}" if low_inclusive else f"above {low:g}"
        raise SpecError(f"{flag} {v:g} must be {bound}", field=flag, fix=f"give e.g. {example}")
    top = high.value if isinstance(high, Limit) else high
    if top is not None and v > top:
        why = f" ({high.reason})" if isinstance(high, Limit) else ""
        raise SpecError(f"{flag} {v:g} is above the limit of {top:g}{why}", field=flag, fix=f"give e.g. {example}")
    return v
