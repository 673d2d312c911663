"""Registers every algorithm module's entries in simdist.collectives.registry."""

from simdist.collectives import ring_registration  # noqa: F401
