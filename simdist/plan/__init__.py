"""Execution plans: model structure, layer costs, memory, rank mesh and placement, pipeline schedules, op graphs."""
