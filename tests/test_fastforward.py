"""The engine's fast-forward (simdist.plan.fastforward via simdist.predict.engine_step): three simulated micro-batch
counts a period apart, extended along the repeating steady state, equal the simulation of every micro-batch,
with contention (collectives sharing links) and without (where the smallest sample shows no contention at all,
the closed form's answer, which the uncontended engine equals)."""

from __future__ import annotations

import pytest

from simdist import api
from simdist.plan import fastforward
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.predict import engine_step as engine_module

BASE = """\
name: ff
cluster: {{preset: dgx-h100, num_nodes: {nodes}}}
model: {{num_layers: 8, hidden_size: 1024, num_attention_heads: 16, seq_length: 1024, vocab_size: 32000}}
parallel: {{tp: {tp}, pp: {pp}, dp: {dp}, vpp: {vpp}}}
training: {{global_batch_size: {batch}, micro_batch_size: 1, grad_reduce: {reduce}, grad_bucket_size: {bucket}}}
schedule: {schedule}
"""

CASES = {
    # dp gradient buckets overlap the pipeline sends on the NICs: the engine finds contention (16 MB buckets: with
    # 4 MB ones the buckets fall between the sends since one-GPU-per-node groups pay NCCL's exposed network latency)
    "1f1b contended": dict(nodes=4, tp=8, pp=2, dp=2, vpp=1, batch=256, reduce="overlapped", schedule="1f1b",
                           bucket="16 MB"),
    # one node, no reduction during the pipeline: nothing contends
    "1f1b alone": dict(nodes=1, tp=2, pp=4, dp=1, vpp=1, batch=96, reduce="bucketed", schedule="1f1b"),
    "interleaved contended": dict(nodes=4, tp=8, pp=2, dp=2, vpp=2, batch=256, reduce="overlapped",
                                  schedule="interleaved_1f1b"),
    # (tp inside a node, the pipeline across two: their traffic never meets on a link)
    "zb_h1 alone": dict(nodes=2, tp=8, pp=2, dp=1, vpp=1, batch=96, reduce="bucketed", schedule="zb_h1"),
}


def _cfg(tmp_path, case):
    path = tmp_path / "s.yaml"
    path.write_text(BASE.format(**{"bucket": "4 MB", **case}))
    sc = api.load_scenario(path)
    return step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model)), sc.topology


@pytest.mark.parametrize("name", CASES)
def test_fast_forward_equals_every_micro_batch(tmp_path, monkeypatch, name):
    cfg, topology = _cfg(tmp_path, CASES[name])
    full = engine_module.engine_step(cfg, topology, None, False, False)
    monkeypatch.setattr(engine_module, "FAST_FORWARD_MIN_OPS", 0)  # fast-forward even a small step
    fast = engine_module.engine_step(cfg, topology, None, False, True)
    assert full.micro_batches == "all"
    if "contended" in name:  # three engine samples a period apart, extended
        assert fast.micro_batches.startswith("fast-forward"), fast.micro_batches
    else:  # no contention in the smallest sample: the closed form's answer (simdist.engine.contention)
        assert "by the closed form: no contention" in fast.micro_batches, fast.micro_batches
    assert fast.simulated_microbatches < full.simulated_microbatches
    contention = full.observables["step_s"] - full.uncontended_step_s
    if "contended" in name:
        assert contention > 1e-9 * full.observables["step_s"]  # the case does exercise link sharing
    else:
        assert contention == pytest.approx(0.0, abs=1e-12)
    assert fast.uncontended_step_s == pytest.approx(full.uncontended_step_s, rel=1e-9)
    assert set(fast.observables) == set(full.observables)
    for key, value in full.observables.items():
        assert fast.observables[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_steady_counts_are_the_earliest_four_collinear_steps():
    # step time affine in M from M = 15 on (a transient before): 1F1B on 4 stages, cycle 3, M = 300. Candidates
    # start past the warm-up (6) on M's residue: 6, 9, 12 see the transient; 15, 18, 21, 24 lie on one line.
    def step_of(m):
        return 2.0 * m + 0.01 * max(0, 15 - m) ** 2

    assert fastforward.steady_counts("1f1b", 4, 300, 3, step_of, start=10) == (15, 18, 21)
    # never on a line before the bound: the bound's samples (warm-up or start, + cool-down margin 6 + cycle 3)
    assert fastforward.steady_counts("1f1b", 4, 300, 3, lambda m: m * m, start=10) == (21, 24, 27)
    # too few micro-batches to gain
    assert fastforward.steady_counts("1f1b", 4, 40, 3, step_of, start=10) is None


def test_samples_slide_until_the_engine_is_steady(tmp_path, monkeypatch):
    # Samples that begin in the engine's transient are not collinear (contention can make it longer than the
    # closed form's, as on Llama 3 405B interleaved at DP 1): the engine adds one a cycle later and tries the
    # last three again. Here the first window is refused twice; the extension still equals every micro-batch.
    cfg, topology = _cfg(tmp_path, CASES["interleaved contended"])
    full = engine_module.engine_step(cfg, topology, None, False, False)
    monkeypatch.setattr(engine_module, "FAST_FORWARD_MIN_OPS", 0)
    real = engine_module.extrapolate
    windows = []

    def refuse_twice(samples, total):
        windows.append([m for m, _ in samples])
        return None if len(windows) <= 2 else real(samples, total)

    monkeypatch.setattr(engine_module, "extrapolate", refuse_twice)
    fast = engine_module.engine_step(cfg, topology, None, False, True)
    first, second, third = windows
    cycle = first[1] - first[0]
    assert second == [m + cycle for m in first] and third == [m + cycle for m in second]
    assert fast.micro_batches.startswith("fast-forward") and "not yet in the steady state" in fast.micro_batches
    assert fast.simulated_microbatches == third[-1] < full.simulated_microbatches
    for key, value in full.observables.items():
        assert fast.observables[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
