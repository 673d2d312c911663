"""One timeline pass over perturbed copies of a step (simdist.analytic.step_batch) gives each copy's closed form.

The prediction band times 32 copies of the step whose compute and collective costs are scaled; the batch pass must
give, copy by copy, what the closed form gives for that copy alone (simdist.analytic.step.analytic_observables).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from simdist import api
from simdist.analytic.step import CommPricer, analytic_observables
from simdist.analytic.step_batch import Variant, perturbed_step_s
from simdist.hardware.compute import compute_efficiency
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.predict.bands import _scaled_efficiency
from tests.test_analytic_step import _config, _spec, layouts

# Compute factors and collective times (op, ranks, bytes, time -> time), as the band draws them (simdist.predict.bands):
# size-dependent factors, and an op-dependent latency and bandwidth (a calibrated collective's).
FACTORS = [(0.8, lambda op, n, b, t: t * 1.3), (1.25, lambda op, n, b, t: t * (0.7 if b < 1e6 else 1.1)),
           (1.0, lambda op, n, b, t: t), (0.9, lambda op, n, b, t: 2e-6 * n + t / 1.2 if op == "all_reduce" else t)]


def _check(cfg, topology) -> bool:
    pricer = CommPricer(topology)
    eff = cfg.compute_efficiency or compute_efficiency(cfg.gpu)
    variants = [Variant(_scaled_efficiency(eff, a), f) for a, f in FACTORS]
    # and one whose host takes 3 x its framework time per op (the band's host factor)
    host = cfg.host_overhead
    variants.append(Variant(eff, FACTORS[2][1], dataclasses.replace(host, dispatch_s=3 * host.dispatch_s)))
    base, steps = perturbed_step_s(cfg, pricer, variants)
    alone = [analytic_observables(dataclasses.replace(cfg, compute_efficiency=v.compute_efficiency,
                                                      host=v.host or cfg.host),
                                  CommPricer(topology).perturbed(v.time_of))[0]["step_s"] for v in variants]
    assert base == pytest.approx(analytic_observables(cfg, CommPricer(topology))[0]["step_s"], rel=1e-9)
    assert steps.tolist() == pytest.approx(alone, rel=1e-9)
    return len(set(np.round(steps / base, 6))) > 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layouts)
def test_batch_equals_each_copy_alone(x):
    # Every schedule, ZeRO stage, bucketing, recompute and uneven split of the closed form's own property test.
    made = _config(x)
    if made is None:
        return
    cfg, topology = made
    _check(cfg, topology)


@pytest.mark.parametrize("schedule,vpp", [("1f1b", 1), ("interleaved_1f1b", 2)])
def test_batch_fast_forwards_long_steps_as_the_closed_form_does(schedule, vpp):
    # 192 micro-batches (interleaved: 4 x 100): the batch is timed at the closed form's three sample counts and
    # extended; the copies differ (the factors move the step), and each equals its own closed form.
    spec = _spec({"tp": 2, "pp": 4, "dp": 1, "cp": 1, "vpp": vpp, "zero_stage": 1, "recompute": "none",
                  "schedule": schedule, "grad_reduce": "bucketed", "bucket": None,
                  "microbatches": 100 if vpp > 1 else 192, "mbs": 1, "sp": True, "per_parameter": False})
    topology = api.cluster_of(spec)
    cfg = step_config_of(spec, topology, resolve_model(spec.model))
    assert analytic_observables(cfg, CommPricer(topology))[1] is not None  # the closed form fast-forwards it
    assert _check(cfg, topology)
