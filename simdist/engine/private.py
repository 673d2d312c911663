"""Which links of an op graph's jobs only one track loads: those bound that track's job alone, so the engine folds
them into its time and puts only the others on its shared links (`simdist.engine.graph.run_graph`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import chain

import numpy as np

from simdist.engine.sharing import job_flows, unique_inverse
from simdist.plan.opgraph import Job

__all__ = ["Share", "private_links"]


@dataclass(frozen=True, slots=True)
class Share:
    """What the shared links see of a job on one track, or of a collective instance."""

    links: tuple[int, ...]
    """The links it loads that another track may load too."""
    weights: tuple[float, ...]
    """Its weight on each (simdist.engine.sharing.job_flows)."""
    size: float
    """Bytes of each of its heaviest flows."""
    bandwidth_s: float
    """Transfer time alone, with the links only its own track loads folded in."""


def private_links(ops: list, capacity_of: Callable[[int], float] | None,
                   capacities: Callable[[np.ndarray], np.ndarray] | None = None
                   ) -> tuple[list[float], dict[tuple[int, int, str], Share]]:
    """Which links of the jobs only one track loads (ops of its own, none a collective instance): such links
    bound that track's job alone, so they fold into its uncontended transfer time.

    Returns per op the duration of a job none of whose links another track loads (NaN otherwise, and for ops
    without a job or of an instance), and the `Share` of the others: per (id(job), rank, stream) of an op
    outside instances, per (id(job), -1, "") of a job of instances (all its links).
    Per link arithmetic in numpy: a data-parallel collective of a large cluster loads hundreds of links.
    """
    n = len(ops)
    solo_duration = [math.nan] * n
    share_of: dict[tuple[int, int, str], Share] = {}
    arrays: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # id(job) -> (links, bytes, weights)
    size_of: dict[int, float] = {}  # id(job) -> bytes of its heaviest flows
    tracks: dict[tuple[int, str], int] = {}
    seen: set[tuple[int, int, str, bool]] = set()
    entries: list[np.ndarray] = []
    codes: list[np.ndarray] = []
    for op in ops:
        job = op.job
        if job is None:
            continue
        ident = (id(job), op.rank, op.stream, op.sync >= 0)
        if ident in seen:  # the same job object on the same track: its links are already recorded
            continue
        seen.add(ident)
        arr = arrays.get(id(job))
        if arr is None:
            table = np.fromiter(chain.from_iterable(job.demand), dtype=float, count=3 * len(job.demand)).reshape(-1, 3)
            size_of[id(job)], weights = job_flows(table[:, 1], table[:, 2])
            arr = arrays[id(job)] = (table[:, 0].astype(np.int64), table[:, 1], weights)
        code = -1 if op.sync >= 0 else tracks.setdefault((op.rank, op.stream), len(tracks))
        entries.append(arr[0])
        codes.append(np.full(len(arr[0]), code, dtype=np.int64))
        if op.sync >= 0 and (id(job), -1, "") not in share_of:
            weighted = arr[2] > 0
            share_of[(id(job), -1, "")] = Share(tuple(arr[0][weighted].tolist()), tuple(arr[2][weighted].tolist()),
                                                 size_of[id(job)], job.bandwidth_s)
    if not arrays:
        return solo_duration, share_of
    links, inverse = unique_inverse(np.concatenate(entries))
    code = np.concatenate(codes)
    lo = np.full(len(links), len(tracks), dtype=np.int64)
    hi = np.full(len(links), -1, dtype=np.int64)
    np.minimum.at(lo, inverse, code)
    np.maximum.at(hi, inverse, code)
    shared_link = (lo < 0) | (lo != hi)  # an instance's op loads it, or two tracks do
    capacity = np.full(len(links), np.nan)

    def own_rate(job: Job, where: np.ndarray, nbytes: np.ndarray) -> float:
        """The job's rate alone over the links ``where`` (indices into ``links``) carrying ``nbytes``."""
        rate = 1.0 / job.bandwidth_s if job.bandwidth_s > 0 else math.inf
        loaded = nbytes > 0
        if loaded.any():
            where, nbytes = where[loaded], nbytes[loaded]
            todo = where[np.isnan(capacity[where])]
            if len(todo):
                todo = np.unique(todo)
                if capacities is not None:
                    capacity[todo] = capacities(links[todo])
                else:
                    capacity[todo] = [capacity_of(link) for link in links[todo].tolist()]  # type: ignore[misc]
            rate = min(rate, float((capacity[where] / nbytes).min()))
        return rate

    solo_of_job: dict[int, float] = {}
    where_of_job: dict[int, np.ndarray] = {}  # id(job) -> its links' indices into ``links``
    for i, op in enumerate(ops):
        job = op.job
        if job is None or op.sync >= 0:
            continue
        d = solo_of_job.get(id(job))
        if d is None:
            d = math.nan
            job_links, nbytes, _ = arrays[id(job)]
            where = where_of_job[id(job)] = np.searchsorted(links, job_links)
            if not shared_link[where].any():
                rate = own_rate(job, where, nbytes)
                d = job.latency_s + (1.0 / rate if job.bandwidth_s > 0 else 0.0)
            solo_of_job[id(job)] = d
        solo_duration[i] = d
        if math.isnan(d):
            key = (id(job), op.rank, op.stream)
            if key not in share_of:
                # the links only this track loads are this job's own (it is on this track)
                job_links, nbytes, weights = arrays[id(job)]
                where = where_of_job[id(job)]
                mine = ~shared_link[where]
                rate = own_rate(job, where[mine], nbytes[mine])
                other = ~mine & (weights > 0)
                share_of[key] = Share(tuple(job_links[other].tolist()), tuple(weights[other].tolist()),
                                       size_of[id(job)], 1.0 / rate if job.bandwidth_s > 0 else 0.0)
    return solo_duration, share_of
