"""The engine pauses CPython's cyclic collector while it simulates (simdist.predict.engine_step.collector_paused):
it resumes as it was, and nothing allocated meanwhile escapes it."""

from __future__ import annotations

import gc
import weakref

from simdist.predict.engine_step import collector_paused


class _Node:
    pass


def test_a_cycle_made_while_paused_is_collected_afterwards():
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        a, b = _Node(), _Node()
        a.other, b.other = b, a  # a cycle: only the cyclic collector frees it
        alive = weakref.ref(a)
    assert gc.isenabled() and gc.get_freeze_count() == 0  # nothing left frozen
    del a, b
    gc.collect()
    assert alive() is None


def test_objects_the_process_froze_stay_frozen():
    # (the frozen objects are not counted before and after: another thread of the process, e.g. a pytest-xdist
    # worker's, may free some of them meanwhile; a frozen object is one the collector does not list)
    mine = _Node()
    gc.collect()
    gc.freeze()
    try:
        assert gc.get_freeze_count() > 0 and not any(o is mine for o in gc.get_objects())
        with collector_paused():
            _Node()
        assert gc.isenabled() and not any(o is mine for o in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(o is mine for o in gc.get_objects())


def test_a_paused_collector_stays_paused_and_nested_pauses_resume_once():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with collector_paused():
        with collector_paused():
            pass
        assert not gc.isenabled()  # the inner pause leaves the outer one's
    assert gc.isenabled()
