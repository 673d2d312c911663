"""The engine's fast-forward (simdist.plan.fastforward via simdist.predict.engine_step): three simulated micro-batch
counts a period apart, extended along the repeating steady state, equal the simulation of every micro-batch,
with contention (collectives sharing links) and without (where the smallest sample shows no contention at all,
the closed form's answer, which the uncontended engine equals)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
training: {{global_batch_size: {batch}, micro_batch_size: 1, grad_reduce: {reduce}, grad_bucket_size: {bucket},
           host_overhead: {{dispatch: 3.3 us}}}}
schedule: {schedule}
"""

# The cases' timelines are laid out at a host dispatch of 3.3 us an op (training.host_overhead; the default, a Linear
# forward's 8.48 us, shifts the buckets off the sends): this file tests the fast-forward, not the host.
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


def test_a_steady_state_that_never_repeats_exactly_is_extended_by_its_mean_increment(tmp_path, monkeypatch):
    # As if contention's jitter kept every window from the exact test (simdist.plan.fastforward.extrapolate_mean):
    # the fifth sample, two periods past the first window, ends the sliding; its samples here are exactly collinear,
    # so their mean increment extends them to every micro-batch's answer.
    cfg, topology = _cfg(tmp_path, CASES["interleaved contended"])
    full = engine_module.engine_step(cfg, topology, None, False, False)
    monkeypatch.setattr(engine_module, "FAST_FORWARD_MIN_OPS", 0)
    windows = []

    def refuse(samples, total):
        windows.append([m for m, _ in samples])
        return None

    monkeypatch.setattr(engine_module, "extrapolate", refuse)
    fast = engine_module.engine_step(cfg, topology, None, False, True)
    assert len(windows) == 3  # the first window and two slides: five samples
    cycle = windows[0][1] - windows[0][0]
    read = [windows[0][0] + i * cycle for i in range(fastforward.JITTER_SAMPLES)]
    assert f"by the mean increment of {', '.join(map(str, read))}" in fast.micro_batches
    assert "within 0.00% of the step's" in fast.micro_batches
    assert fast.simulated_microbatches == read[-1] < full.simulated_microbatches
    for key, value in full.observables.items():
        assert fast.observables[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key


def test_the_mean_increment_by_hand():
    # step 10 + 1.2 per period of 8 with +-0.002 of jitter, bubble 1.0 + 0.001 jitter: increments 1.204, 1.196,
    # 1.202, 1.198 (spread 0.008 = 0.67 % of their mean 1.2); at M = 512 from the last sample (m = 48): 58 periods of
    # the chord's mean (10.0 + 4.8 - 10.0) / 4 = 1.2 -> 14.8 + 58 x 1.2 = 84.4
    steps = [10.0, 11.204, 12.4, 13.602, 14.8]
    samples = [(16 + 8 * i, {"step_s": x, "bubble_s": 1.0 + (0.001 if i % 2 else 0.0), "flops": 1e15 * (i + 1)})
               for i, x in enumerate(steps)]
    got = fastforward.extrapolate_mean(samples, 512)
    assert got is not None
    out, widest = got
    assert out["step_s"] == pytest.approx(14.8 + 58 * 1.2, rel=1e-12)
    assert out["bubble_s"] == pytest.approx(1.0 + 58 * 0.0, abs=1e-12)  # (chord: first and last are both 1.0)
    assert out["flops"] == pytest.approx(5e15 + 58 * 1e15, rel=1e-12)
    assert widest == pytest.approx(0.008 / 1.2, rel=1e-9)
    assert fastforward.extrapolate(samples[-3:], 512) is None  # not collinear to 1e-9: the exact test refuses
    # twice the jitter (1.3 % of the increment) is past JITTER_TOLERANCE (1 %)
    wide = [(m, {"step_s": 10.0 + (x - 10.0 - 1.2 * i) * 2 + 1.2 * i}) for i, (m, x) in
            enumerate((m, obs["step_s"]) for m, obs in samples)]
    assert fastforward.extrapolate_mean(wide, 512) is None
    with pytest.raises(ValueError, match="equally spaced"):
        fastforward.extrapolate_mean([(16, {"step_s": 1.0}), (24, {"step_s": 2.0}), (36, {"step_s": 3.0})], 512)


def _find_cycle_by_loops(schedule, num_stages, starts, step_s, total, vpp=1):
    """find_cycle as loops over the sequences and their micro-batches (the oracle of the vectorised one)."""
    g = fastforward.group_of(schedule, num_stages)
    end = total - fastforward._cooldown_margin(schedule, num_stages, vpp)
    tol = fastforward.REL_TOLERANCE * max(step_s, 1e-300)
    longest = fastforward._max_cycle(schedule, num_stages)
    a = end - 2 * longest
    if a < 0:
        return None
    for c in range(g, longest + 1, g):
        ok, shifts = True, []
        for seq in starts.values():
            if len(seq) < end:
                return None
            shift = seq[a + c] - seq[a]
            if any(abs(seq[m + c] - seq[m] - shift) > tol for m in range(a + 1, end - c)):
                ok = False
                break
            shifts.append(shift)
        if ok:
            seqs = list(starts.values())
            start = a
            while start > 0 and all(abs(seq[start - 1 + c] - seq[start - 1] - d) <= tol
                                    for seq, d in zip(seqs, shifts, strict=True)):
                start -= 1
            return c, start
    return None


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["1f1b", "interleaved_1f1b", "gpipe"]), st.integers(2, 5), st.integers(1, 3),
       st.integers(1, 3), st.integers(0, 40), st.integers(0, 3), st.booleans(), st.integers(0, 2**31 - 1))
def test_find_cycle_is_the_loops_answer(schedule, k, vpp, periods, transient, extra, short, seed):
    # sequences that repeat every `cycle` micro-batches after a transient (a jitter before it), one per stage, kind
    # and chunk; the vectorised search finds what the loops over them find (a cycle and where it began, or none:
    # too long a transient, a cycle beyond the longest looked for, a sequence too short)
    rng = np.random.default_rng(seed)
    v = vpp if schedule == "interleaved_1f1b" else 1
    cycle = fastforward.group_of(schedule, k) * periods
    total = fastforward.detection_microbatches(schedule, k, v) + extra * k
    pattern = rng.random(cycle)
    starts = {}
    for key in range(2 * k * v):
        steps = np.cumsum(np.tile(pattern, total // cycle + 1)[:total] + rng.random() * 0.1)
        steps[:transient] += rng.random(min(transient, total)) * 1e-3
        starts[(key, "F", 0)] = steps.tolist()
    if short:
        starts[(0, "F", 0)] = starts[(0, "F", 0)][:total // 2]
    step_s = max(max(s) for s in starts.values())
    assert fastforward.find_cycle(schedule, k, starts, step_s, total, v) == \
        _find_cycle_by_loops(schedule, k, starts, step_s, total, v)
    arrays = {key: np.asarray(s) for key, s in starts.items()}
    assert fastforward.find_cycle(schedule, k, arrays, step_s, total, v) == \
        _find_cycle_by_loops(schedule, k, starts, step_s, total, v)
