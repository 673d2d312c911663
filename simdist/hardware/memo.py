"""Bounded memo tables that a `Topology` owns for values derived from it alone (route batches, ring orders).

A memo keeps at most ``max_entries`` entries and at most ``max_bytes`` bytes, an entry being charged an
estimate of what its key and value hold (`nbytes_of`); once either bound is passed the least recently used
entries leave first, and an entry larger than ``max_bytes`` on its own is returned but not kept. Keys are
values (tuples, bytes), never object ids, so an entry can never be found by a different object that happens to
reuse a freed one's id. A memo lives and dies with its topology; it pickles empty.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

import numpy as np

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_SAMPLE = 32
"""Elements of a tuple or list that `nbytes_of` looks at (it scales their sizes to the whole)."""


def nbytes_of(obj: object) -> int:
    """Bytes ``obj`` holds, estimated: arrays and bytes exactly, tuples and lists from a sample of their elements,
    an object with an ``nbytes`` attribute by it, anything else by ``sys.getsizeof``."""
    if isinstance(obj, np.ndarray):
        return int(obj.nbytes)
    if isinstance(obj, bytes | bytearray):
        return len(obj)
    if isinstance(obj, tuple | list):
        if not obj:
            return sys.getsizeof(obj)
        step = max(1, len(obj) // _SAMPLE)
        sample = obj[::step]
        return sys.getsizeof(obj) + sum(nbytes_of(x) for x in sample) * len(obj) // len(sample)
    nbytes = getattr(obj, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes
    return sys.getsizeof(obj)


class Memo(Generic[K, V]):
    """A bounded least-recently-used memo (see the module docstring). Thread-safe: one lock per access."""

    def __init__(self, name: str, max_entries: int, max_bytes: int) -> None:
        self.name = name
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._nbytes = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        """The value kept for ``key`` (now the most recently used), or None."""
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                return None
            self._data.move_to_end(key)
            return hit[0]

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` for ``key`` (evicting the least recently used entries past a bound); returns ``value``."""
        size = nbytes_of(key) + nbytes_of(value)
        with self._lock:
            old = self._data.pop(key, None)
            if old is not None:
                self._nbytes -= old[1]
            if size > self.max_bytes:
                return value
            self._data[key] = (value, size)
            self._nbytes += size
            while len(self._data) > self.max_entries or self._nbytes > self.max_bytes:
                _, (_, freed) = self._data.popitem(last=False)
                self._nbytes -= freed
        return value

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self._nbytes = 0

    def __len__(self) -> int:
        return len(self._data)

    @property
    def nbytes(self) -> int:
        """Bytes charged to the entries kept now (<= max_bytes)."""
        return self._nbytes

    def __reduce__(self) -> tuple:
        return Memo, (self.name, self.max_entries, self.max_bytes)

    def __repr__(self) -> str:
        return (f"Memo({self.name!r}, {len(self._data)}/{self.max_entries} entries, "
                f"{self._nbytes / 2**20:.1f}/{self.max_bytes / 2**20:.0f} MiB)")
