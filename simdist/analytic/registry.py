"""Closed forms by algorithm name (the same names as simdist.collectives.registry).

Each entry is ``time_s(request, protocol) -> seconds``: the uncontended time of the plan that the
algorithm of the same name builds, including the protocol's start-up, per-transfer latency and rate
factor exactly as the engine applies them.
"""

from __future__ import annotations

from collections.abc import Callable

from simdist.collectives.protocols import ProtocolCost
from simdist.collectives.request import Request

ClosedForm = Callable[[Request, ProtocolCost], float]

CLOSED_FORMS: dict[str, ClosedForm] = {}


def register_closed_form(name: str, fn: ClosedForm) -> ClosedForm:
    CLOSED_FORMS[name] = fn
    return fn


def closed_form(name: str) -> ClosedForm:
    from simdist.analytic import all_forms  # noqa: F401  (importing registers every closed form)

    return CLOSED_FORMS[name]
