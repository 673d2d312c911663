"""simdist: a discrete-event simulator of distributed-training cost."""

__version__ = "0.1.0"
