"""Where an MoE layer's forward waits for the device (the dispatcher's token counts), what the host CPU costs per op
(Grace vs x86), and optimizer state kept in narrower dtypes: hand-checked tiny cases."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist import api
from simdist.hardware.compute import compute_efficiency, kernels_time_s
from simdist.hardware.gpus import GPU_PRESETS
from simdist.hardware.host import HostOverhead, host_op_factor, host_overhead
from simdist.plan.chunk_cost import chunk_cost
from simdist.plan.expert_parallel import ExpertParallel
from simdist.plan.layer_cost import layer_work
from simdist.plan.layout import step_config_of
from simdist.plan.memory import model_state_bytes, optimizer_state_bytes, stage_memory
from simdist.plan.model import Model
from simdist.plan.model_presets import resolve_model

TINY = Model("tiny-moe", "decoder", num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=4,
             ffn_hidden_size=256, seq_length=128, vocab_size=1000, swiglu=True, num_experts=8, moe_router_topk=2,
             moe_ffn_hidden_size=128, moe_layer_freq=(0, 1, 1, 1))


def names(work) -> list[str]:
    return [k.name for k in work.forward]


# ----------------------------------------------------------------------------- where the forward synchronizes
@pytest.mark.parametrize("experts, before", [
    # Megatron-Core alltoall, dropless, ep > 1: before the expert-parallel all-to-all, after permutation 1
    (ExpertParallel(ep=4), "after moe_permute"),
    # a capacity factor: before permutation 1 (num_out_tokens)
    (ExpertParallel(ep=4, capacity_factor=1.5), "before moe_permute"),
    # allgather: after the gathers, before the local permutation
    (ExpertParallel(ep=4, dispatcher="allgather"), "before moe_sort_chunks"),
    # flex (DeepEP): at the dispatch
    (ExpertParallel(ep=4, dispatcher="flex"), "before_a2a"),
])
def test_a_dropless_moe_layer_forward_waits_once_for_the_token_counts(experts, before):
    work = layer_work(TINY, layer=1, attention="flash", experts=experts)
    (cut,) = work.host_syncs
    order = names(work)
    if before == "after moe_permute":
        assert order[cut - 1] == "moe_permute"
    elif before == "before_a2a":
        first_a2a = next(c for c in work.comm if c.op == "all_to_all" and c.phase == "forward")
        assert cut == first_a2a.issued_after
    else:
        assert order[cut] == before.split()[1]
    # no synchronization in the backward, nor in a dense layer, nor in a redo that is not the whole forward
    assert layer_work(TINY, layer=0, attention="flash", experts=experts).host_syncs == ()
    assert work.recompute_syncs == ()
    full = layer_work(TINY, layer=1, attention="flash", experts=experts, recompute="full")
    assert full.recompute_syncs == full.host_syncs == work.host_syncs


def test_a_synchronization_splits_the_forward_into_two_host_bound_runs(tmp_path):
    p = tmp_path / "tiny.yaml"
    p.write_text(
        "cluster: {preset: dgx-h100, num_nodes: 1}\n"
        "model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, num_query_groups: 4, ffn_hidden_size: 256,"
        " seq_length: 128, vocab_size: 1000, swiglu: true, num_experts: 8, moe_router_topk: 2,"
        " moe_ffn_hidden_size: 128, moe_layer_freq: [1, 1]}\n"
        "parallel: {tp: 1, pp: 1, dp: 8, ep: 4}\n"
        "training: {micro_batch_size: 1, global_batch_size: 16, precision: bf16}\n", encoding="utf-8")
    sc = api.load_scenario(str(p))
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    # a host that takes 1 ms per op: every run of kernels is host-bound, so each run costs its ops x 1 ms
    host = HostOverhead(launch_s=0.5e-3, dispatch_s=0.5e-3, step_gap_s=7e-6)
    cfg = dataclasses.replace(cfg, host=host)
    work = layer_work(cfg.model, layer=0, attention=cfg.attention, experts=cfg.expert_parallel)
    (cut,) = work.host_syncs
    n = len(work.forward)
    gpu = kernels_time_s(cfg.gpu, work.forward, cfg.precision, compute_efficiency(cfg.gpu))
    assert gpu < n * 1e-3  # host-bound indeed
    eff = compute_efficiency(cfg.gpu)
    times = [kernels_time_s(cfg.gpu, [k], cfg.precision, eff) for k in work.forward]
    cost = chunk_cost(cfg, ((0, 2),), False, False)
    # each of the 2 layers: max(GPU, host) of the kernels before the sync (the host ahead of an emptying queue); after
    # it the gap, then each kernel as the host issues it: host-bound, the last reaches the GPU 7 us + the issue time
    # of the ones before it after the sync and runs its own GPU time. Each kernel issues in 1 ms per op; the router's
    # auxiliary-loss chain and the grouped GEMMs in their calls' and launches' halves of it (Kernel.calls, launches)
    issue = [host.issue_s(k) for k in work.forward]
    assert issue.count(1e-3) >= n - 6 and max(issue) == pytest.approx(0.5e-3 * (21 + 28), rel=1e-12)
    assert cost.forward_s == pytest.approx(2 * (sum(issue[:-1]) + 7e-6 + times[-1]), rel=1e-12)
    # a GPU-bound layer (a host of 1 ns per op): the two runs' GPU times add up to the whole; the gap is added
    fast = dataclasses.replace(cfg, host=HostOverhead(launch_s=0.5e-9, dispatch_s=0.5e-9, step_gap_s=7e-6))
    assert chunk_cost(fast, ((0, 2),), False, False).forward_s == pytest.approx(2 * (gpu + 7e-6), rel=1e-12)
    # a host between the two runs' GPU time per op: one run is host-bound, the other GPU-bound, and the split costs
    # time (the host's lead from the GPU-bound run is lost at the sync); after the sync the GPU runs each kernel once
    # it has been issued and the one before it is done: max over i of (i x op + the GPU time of kernels i..)
    pre = kernels_time_s(cfg.gpu, work.forward[:cut], cfg.precision, eff)
    post = gpu - pre
    units = [i / 1e-3 for i in issue]  # each kernel's issue time in ops
    op = (pre / sum(units[:cut]) * post / sum(units[cut:])) ** 0.5
    assert min(pre / sum(units[:cut]), post / sum(units[cut:])) < op < max(pre / sum(units[:cut]),
                                                                            post / sum(units[cut:]))
    mid = dataclasses.replace(cfg, host=HostOverhead(launch_s=op / 2, dispatch_s=op / 2, step_gap_s=0.0))
    ramp = max(sum(units[cut:cut + i]) * op + sum(times[cut + i:]) for i in range(n - cut))
    expect = max(pre, sum(units[:cut]) * op) + ramp
    assert ramp >= max(post, sum(units[cut:-1]) * op + times[-1]) and expect > max(gpu, sum(units) * op) * (1 + 1e-6)
    assert chunk_cost(mid, ((0, 2),), False, False).forward_s == pytest.approx(2 * expect, rel=1e-12)


def test_after_a_wait_the_gpu_runs_each_kernel_as_the_host_issues_it():
    # 10 us per op, a 20 us gap: kernels of 1, 1, 50, 1 and 1 us reach the GPU at 20, 30, 40, 50, 60 us; the 50 us
    # kernel starts at 40 and ends at 90, the two after it at 91 and 92: 92 us, where the run's GPU time (54 us) and
    # the host's time to issue it (the last kernel at 60 us, ending at 61) are both shorter
    host = HostOverhead(launch_s=5e-6, dispatch_s=5e-6, step_gap_s=20e-6)
    us = 1e-6
    assert host.ramp_time_s([1 * us, 1 * us, 50 * us, 1 * us, 1 * us], [host.op_s] * 5) == pytest.approx(
        92 * us, rel=1e-12)
    assert host.ramp_time_s([], []) == pytest.approx(20 * us)
    # kernels no shorter than an op: the GPU never waits after the first one arrives
    assert host.ramp_time_s([12 * us, 10 * us, 30 * us], [host.op_s] * 3) == pytest.approx((20 + 52) * us, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1e-3), min_size=1, max_size=40), st.floats(0.0, 1e-4), st.floats(0.0, 1e-4))
def test_the_ramp_lies_between_its_bounds(kernels, op, gap):
    host = HostOverhead(launch_s=op / 2, dispatch_s=op / 2, step_gap_s=gap)
    t = host.ramp_time_s(kernels, [host.op_s] * len(kernels))
    n, gpu = len(kernels), sum(kernels)
    # never before the GPU has run everything, nor before the host has issued the last kernel and it has run
    assert t >= gap + max(gpu, (n - 1) * host.op_s + kernels[-1]) - 1e-12
    # never after the host issued everything with the GPU idle meanwhile, then ran it all
    assert t <= gap + gpu + (n - 1) * host.op_s + 1e-12


# ----------------------------------------------------------------------------- host CPU
def test_a_grace_host_issues_each_op_2_75_times_as_slowly_as_a_dgx_x86_host():
    x86, grace = host_overhead(GPU_PRESETS["h100-sxm"]), host_overhead(GPU_PRESETS["gb200"])
    # TransformerEngine issue #2053: torch.nn.Linear forward CPU time 37.08 us (GB200) / 13.48 us (DGX H100)
    assert host_op_factor(GPU_PRESETS["gb200"]) == 2.75 == host_op_factor(GPU_PRESETS["gb300"])
    assert host_op_factor(GPU_PRESETS["b200"]) == 1.0 == host_op_factor(None)
    assert grace.launch_s == pytest.approx(2.75 * x86.launch_s, rel=1e-12)
    assert grace.dispatch_s == pytest.approx(2.75 * x86.dispatch_s, rel=1e-12)
    assert grace.step_gap_s == x86.step_gap_s  # a GPU-side idle, not host compute
    assert host_overhead(GPU_PRESETS["cpu-core"]).op_s == 0.0
    # the same table's Linear forward is one framework op, dispatch and launch, on either host (within its rounding)
    assert x86.op_s == pytest.approx(13.48e-6, rel=1e-9)
    assert grace.op_s == pytest.approx(37.08e-6, rel=2e-3)


# ----------------------------------------------------------------------------- optimizer state dtypes
def test_bf16_moments_keep_8_bytes_of_optimizer_state_per_parameter():
    # DeepSeek-V3 / Megatron-LM --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16:
    # fp32 master (4) + bf16 m (2) + bf16 v (2)
    assert optimizer_state_bytes("bf16", exp_avg="bf16", exp_avg_sq="bf16") == 8.0
    assert optimizer_state_bytes("bf16", exp_avg="fp8", exp_avg_sq="bf16", main_params="fp16") == 5.0
    assert optimizer_state_bytes("fp32", exp_avg="bf16", exp_avg_sq="bf16") == 4.0  # no master copy in fp32
    assert optimizer_state_bytes("bf16") is None  # the defaults: model_state_bytes' 12
    _, _, default = model_state_bytes(1e9, dp=4, zero_stage=1)
    _, _, narrow = model_state_bytes(1e9, dp=4, zero_stage=1, optimizer_bytes=8.0)
    assert default == 12e9 / 4 and narrow == 8e9 / 4
    kw = dict(layers_on_stage=4, first_stage=True, last_stage=True, dp=4, zero_stage=1, layers=(0, 1, 2, 3),
              experts=ExpertParallel(ep=4))
    a, b = stage_memory(TINY, **kw), stage_memory(TINY, optimizer_bytes=8.0, **kw)
    assert b.optimizer_bytes == pytest.approx(a.optimizer_bytes * 8 / 12, rel=1e-12)
    assert (b.params_bytes, b.grads_bytes, b.activations_bytes) == (a.params_bytes, a.grads_bytes, a.activations_bytes)


def test_the_bundled_deepseek_v3_scenario_fits_as_nvidia_ran_it():
    sc = api.load_scenario("scenarios/deepseek-v3-gb200.yaml")
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    assert cfg.optimizer_state_bytes == 8.0 and cfg.execution.recompute_modules == ("mlp", "mla_up_proj")
    from simdist.plan.step_memory import step_memory

    memory = step_memory(cfg)
    assert all(m.fits for m in memory)
    # the guide's recompute and BF16 moments are what leave it room: without them its peak stage grows by 44 %, to
    # 184 of 186 GiB (it fits, barely, since the combine keeps no expert outputs: Megatron-LM !2668)
    bare = dataclasses.replace(cfg, optimizer_state_bytes=None, recompute="none")
    peak, bare_peak = (max(m.total_bytes for m in step_memory(c)) for c in (cfg, bare))
    assert bare_peak > 1.4 * peak and all(b.total_bytes > m.total_bytes for b, m in zip(step_memory(bare), memory,
                                                                                         strict=True))


# ----------------------------------------------------------------------------- routing load as a distribution
def test_routing_distributions_give_the_busiest_ranks_expected_load():
    from simdist.plan.moe_routing import routing_imbalance

    # two experts on two ranks, two routed copies: loads (2, 0), (1, 1), (0, 2) with probabilities 1/4, 1/2, 1/4, so
    # E[max] = 2 x 1/2 + 1 x 1/2 = 1.5 against a mean of 1 (standard error 0.5 / sqrt(20000) = 0.0035)
    assert routing_imbalance("multinomial", num_experts=2, ep=2, tokens=2, topk=1, draws=20000) == \
        pytest.approx(1.5, abs=0.015)
    # Zipf, one expert per rank and ten million copies (fluctuation ~1e-4): the busiest rank holds the most popular
    # expert, p_1 = 1 / H_4 = 1 / (1 + 1/2 + 1/3 + 1/4), so the factor is ep x p_1 = 4 / 2.0833 = 1.92
    assert routing_imbalance("zipf", num_experts=4, ep=4, tokens=10**7, topk=1, skew=1.0) == \
        pytest.approx(4 / (1 + 1 / 2 + 1 / 3 + 1 / 4), rel=2e-3)
    kw = dict(num_experts=64, ep=8, tokens=4096, topk=4)
    # skew 0 is the uniform multinomial; balanced routing and a single rank are exactly 1
    assert routing_imbalance("zipf", skew=0.0, **kw) == routing_imbalance("multinomial", **kw) > 1.0
    assert routing_imbalance("balanced", **kw) == 1.0 == routing_imbalance("zipf", **{**kw, "ep": 1})
    # more skew, a busier rank; more tokens, less fluctuation
    skews = [routing_imbalance("zipf", skew=s, **kw) for s in (0.25, 0.5, 1.0, 2.0)]
    assert skews == sorted(skews) and skews[-1] <= kw["ep"]
    assert routing_imbalance("multinomial", **{**kw, "tokens": 40960}) < routing_imbalance("multinomial", **kw)


def test_a_scenario_routes_by_a_distribution_or_states_the_imbalance(tmp_path):
    base = ("cluster: {preset: dgx-h100, num_nodes: 1}\n"
            "model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, num_query_groups: 4, ffn_hidden_size: 256,"
            " seq_length: 128, vocab_size: 1000, swiglu: true, num_experts: 8, moe_router_topk: 2,"
            " moe_ffn_hidden_size: 128, moe_layer_freq: [1, 1]}\n"
            "parallel: {tp: 1, pp: 1, dp: 8, ep: 4}\n")
    p = tmp_path / "s.yaml"
    p.write_text(base + "training: {micro_batch_size: 1, global_batch_size: 16, moe_routing: zipf, "
                        "moe_routing_skew: 1.5}\n", encoding="utf-8")
    sc = api.load_scenario(str(p))
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    from simdist.plan.moe_routing import routing_imbalance

    # the ep group of 4 routes 4 x 128 tokens per micro-batch, 2 copies each
    assert cfg.expert_parallel.imbalance == routing_imbalance("zipf", num_experts=8, ep=4, tokens=512, topk=2,
                                                              skew=1.5) > 1.2
    for training, field in (("moe_routing: zipf, moe_imbalance: 1.5", "moe_imbalance"),
                            ("moe_routing: multinomial, moe_routing_skew: 2", "moe_routing_skew")):
        p.write_text(base + f"training: {{micro_batch_size: 1, global_batch_size: 16, {training}}}\n",
                     encoding="utf-8")
        with pytest.raises(Exception, match=field):
            api.load_scenario(str(p))
