"""Algorithms by the names users write (``--algorithm ring``), what ops they implement, where they apply.

Each entry builds a detailed `Plan` (one transfer per chunk per step, verifiable) from a `Request`.
Closed forms of the same algorithms live in `simdist.analytic.registry` under the same names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simdist.collectives.plan import Plan
from simdist.collectives.request import Request
from simdist.errors import SimdistError


@dataclass(frozen=True, slots=True)
class Algorithm:
    name: str
    ops: frozenset[str]
    build: Callable[[Request], Plan]
    check: Callable[[Request], None] | None = None
    """Raises SimdistError when the algorithm cannot run this request (topology, group shape)."""
    summary: str = ""
    build_fast: Callable[[Request], Plan] | None = None
    """Fast fidelity: a few long flows standing for many steps (not verifiable); None: none."""
    detailed_size: Callable[[Request], int] | None = None
    """Transfers the detailed plan of a request would hold, without building it; None: P^2 or less."""


ALGORITHMS: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def algorithm_for(name: str, request: Request) -> Algorithm:
    """The algorithm ``name`` if it implements ``request.op`` here; otherwise a clear error."""
    _load_all()
    algo = ALGORITHMS.get(name)
    if algo is None:
        raise SimdistError(f"unknown algorithm '{name}'", field="--algorithm",
                           fix=f"use auto or one of: {', '.join(sorted(ALGORITHMS))}")
    if request.op not in algo.ops:
        able = sorted(a.name for a in ALGORITHMS.values() if request.op in a.ops)
        raise SimdistError(f"algorithm '{name}' does not implement {request.op}", field="--algorithm",
                           fix=f"for {request.op} use auto or one of: {', '.join(able)}")
    if algo.check is not None:
        algo.check(request)
    return algo


def candidates(request: Request, among: frozenset[str] | tuple[str, ...] | None = None) -> list[Algorithm]:
    """Algorithms that implement ``request.op`` and can run it on this group (``among``: only those named, their
    checks alone run)."""
    _load_all()
    out = []
    for algo in ALGORITHMS.values():
        if request.op not in algo.ops or (among is not None and algo.name not in among):
            continue
        try:
            if algo.check is not None:
                algo.check(request)
        except SimdistError:
            continue
        out.append(algo)
    return out


def _load_all() -> None:
    # Importing the algorithm modules registers them (kept lazy to avoid import cycles).
    from simdist.collectives import algorithms  # noqa: F401
