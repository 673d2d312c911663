"""The compiled pass of simdist.analytic.steady (numba; imported on first use, with the compiled timeline): a
program's steps in wave order and the body that recurs in them."""

from __future__ import annotations

import numpy as np
from numba import njit

from simdist import precompiled

__all__ = ["steady_order"]


@njit(cache=True)
def steady_order(steps, num_stages, lengths, min_bodies):  # pragma: no cover - compiled
    """(the program ``steps`` in wave order, its body: first step, length, repeats, lookback; first -1: none) for
    simdist.analytic.steady, whose programs hold no sends (rows 4-6: 0, -1, -1, left as they are). A step's wave is
    one more than the later of its stage's previous step's and its upstream step's (0: neither); the order is by
    wave, then stage (two stable counting sorts), the upstream indices renumbered. The body is the longest run of
    steps that recurs at one of ``lengths`` steps (stage, recipe code, upstream as a distance back, downstream stage
    equal), kept if it repeats at least ``min_bodies`` times."""
    n = steps.shape[1]
    K = num_stages
    wave = np.empty(n, dtype=np.int64)
    last = np.full(K, -1, dtype=np.int64)
    top = np.int64(0)
    for i in range(n):
        w = last[steps[0, i]] + 1
        up = steps[2, i]
        if up >= 0 and wave[up] >= w:
            w = wave[up] + 1
        wave[i] = w
        last[steps[0, i]] = w
        if w > top:
            top = w
    # stable counting sorts: by stage, then by wave (each stage's steps keep their order: their waves increase)
    # (a writable copy of the stage row: numba compiles a helper once per array type, read-only arrays apart)
    by_stage = _counting_order(steps[0].copy(), K, np.arange(n))
    order = _counting_order(wave, top + 1, by_stage)
    renumber = np.empty(n, dtype=np.int64)
    for j in range(n):
        renumber[order[j]] = j
    ordered = np.empty((7, n), dtype=np.int64)
    relative = np.empty((4, n), dtype=np.int64)  # what decides a step: stage, code, upstream distance, downstream
    for j in range(n):
        i = order[j]
        for r in range(7):
            ordered[r, j] = steps[r, i]
        up = steps[2, i]
        ordered[2, j] = renumber[up] if up >= 0 else -1
        relative[0, j] = steps[0, i]
        relative[1, j] = steps[1, i]
        relative[2, j] = j - ordered[2, j] if up >= 0 else -1
        relative[3, j] = steps[3, i]
    body = np.array([-1, 0, 0, 0], dtype=np.int64)
    best = 0
    for length in lengths:
        if length <= 0 or min_bodies * length > n:
            continue
        run = 0
        for i in range(n - length + 1):
            same = True
            if i < n - length:
                for r in range(4):
                    if relative[r, i] != relative[r, i + length]:
                        same = False
                        break
            else:
                same = False
            if same:
                run += 1
            elif run:
                repeats = run // length + 1  # steps [i - run, i) recur: they and one more body
                if repeats >= min_bodies and repeats * length > best:
                    best = repeats * length
                    body[0] = i - run
                    body[1] = length
                    body[2] = repeats
                run = 0
    if body[0] >= 0:
        lookback = 0
        for j in range(body[0], n):
            if relative[2, j] > lookback:
                lookback = relative[2, j]
        body[3] = lookback
        if lookback > body[0]:
            body[0] = -1
    return ordered, body


@njit(cache=True)
def _counting_order(key, num_keys, order):  # pragma: no cover - compiled
    """``order`` stably sorted by ``key`` of its entries (keys 0 .. num_keys - 1)."""
    counts = np.zeros(num_keys + 1, dtype=np.int64)
    for j in range(order.shape[0]):
        counts[key[order[j]] + 1] += 1
    for k in range(num_keys):
        counts[k + 1] += counts[k]
    out = np.empty(order.shape[0], dtype=np.int64)
    for j in range(order.shape[0]):
        k = key[order[j]]
        out[counts[k]] = order[j]
        counts[k] += 1
    return out


precompiled.attach(globals())  # the shipped cache of these kernels (simdist.precompiled)
