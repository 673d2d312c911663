"""The engine's cheapest SimPy event: a timeout built with its one callback (the engine schedules 10^5 of them a
run: every job's latency, every compute op's end, every horizon of the shared links)."""

from __future__ import annotations

import simpy

__all__ = ["NORMAL", "Tick"]

NORMAL = simpy.events.NORMAL
"""SimPy's priority of a timeout (`Tick`s are scheduled with it, in the same order as timeouts)."""


class Tick(simpy.events.Event):
    """A timeout without a value, built with its one callback: ``env.schedule(Tick(env, [callback]), NORMAL, delay)``
    is ``env.timeout(delay).callbacks.append(callback)`` (the same entry in SimPy's queue, the same order), without
    the timeout's checks and the append (the engine schedules 10^5 of them per run); ``value``: the timeout's."""

    def __init__(self, env: simpy.Environment, callbacks: list, value: object = None) -> None:
        # (Event.__init__'s attributes, as Timeout sets them: a triggered event, ok, its value)
        self.env = env
        self.callbacks = callbacks
        self._value = value
        self._ok = True
