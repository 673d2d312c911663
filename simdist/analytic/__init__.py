"""Closed-form costs of the same plans the engine runs (alpha-beta with link loads)."""
