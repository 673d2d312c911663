"""Collectives: communicators on a topology (`group`), the plans each algorithm emits (transfers with dependencies),
NCCL's tuning model and the registry of algorithms. The engine executes the plans; the closed forms price them."""
