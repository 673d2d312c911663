"""No test asserts on wall-clock time or memory: machines are shared and noisy (times belong in benchmarks/).

Tests read no clock that measures how fast simdist runs (perf_counter, time.time, process_time, timeit,
getrusage, tracemalloc). ``time.monotonic`` serves only as a hang guard around subprocesses (a bound of a minute or
more, failing only when a child never answers), ``time.sleep`` only to poll.
"""

from __future__ import annotations

import re

from tests.conftest import REPO

CLOCKS = re.compile(r"\b(perf_counter(_ns)?|process_time|timeit|getrusage|tracemalloc|ru_maxrss)\b"
                    r"|\btime\.time(_ns)?\(")


def offenders(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if CLOCKS.search(line) and not line.lstrip().startswith("#")]


def test_no_test_reads_a_performance_clock():
    found = {p.name: offenders(p.read_text(encoding="utf-8")) for p in (REPO / "tests").glob("*.py")
             if p.name != "test_no_wall_clock.py"}
    assert {name: lines for name, lines in found.items() if lines} == {}


def test_a_timed_assertion_would_be_found():
    assert offenders("t0 = time.perf_counter()\nassert time.time() - t0 < 1\n# perf_counter in a comment") == [
        "t0 = time.perf_counter()", "assert time.time() - t0 < 1"]
