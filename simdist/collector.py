"""CPython's cyclic garbage collector paused while simdist builds or simulates many small objects.

One owner for the pause: the engine pauses it while a step is simulated (simdist.predict.engine_step) and the fast
ring while it builds its flows (simdist.collectives.ring). No simdist imports: any layer may use it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause CPython's cyclic garbage collector while a step is simulated (or a plan builds its transfers); it
    resumes as it was afterwards.

    A 100,000-GPU ring's 800,000 fast flows (simdist.collectives.ring) form no cycles either: every collection their
    allocations trigger walks all live objects, so they took twice as long to build with it (2.2 s against 1.1 s;
    benchmarks/topology.py, the 100k-GPU all-reduces).

    The simulation allocates 10^4-10^5 small objects that reference counting frees (ops, the engine's jobs
    with one (link, bytes) pair per link, events; a run leaves a few dozen objects in cycles): the collector
    would scan the young ones every 700 allocations and, every 100th time, everything the process holds, for
    next to nothing to free (up to a tenth of a 16,384-GPU step's in-process time). Results are
    unchanged: only when garbage is collected changes.

    On resuming, the objects allocated meanwhile (10^6 after a long interleaved step: its samples' graphs, traces
    and prices, most alive still) would all sit in the youngest generation, and the first allocation after would
    scan them all at once (a quarter of a second here). They join the oldest generation instead (`gc.freeze`
    then `gc.unfreeze`: two list splices), where the next full collection, whenever CPython's own rule calls it,
    frees any cycles among them. Not where the process had frozen objects of its own (a pre-fork server): those
    stay frozen, and the collector resumes plainly.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.enable()
                gc.unfreeze()
            else:
                gc.enable()
