"""What one MoE / MLA / sliding-window layer executes and moves (simdist.plan.moe_cost, simdist.plan.attention_cost),
chunks of mixed layers, memory over ep, and model FLOPs from the active parameters: hand-computed tiny cases and the
published DeepSeek-V3 figure."""

from __future__ import annotations

import dataclasses
import math

import pytest

from simdist import api
from simdist.errors import LayoutError
from simdist.hardware.compute import compute_efficiency, gemm_efficiency, kernel_time_s, kernels_time_s
from simdist.hardware.gemm import architecture, quantization
from simdist.hardware.gpus import GPU_PRESETS
from simdist.plan.activations import activation_bytes_per_layer
from simdist.plan.chunk_cost import chunk_cost
from simdist.plan.expert_parallel import ExpertParallel, expected_destination_ranks
from simdist.plan.layer_cost import layer_work, model_flops_per_sequence
from simdist.plan.layout import step_config_of
from simdist.plan.memory import stage_memory
from simdist.plan.model import Model
from simdist.plan.model_ends import embedding_work, head_work, mtp_work
from simdist.plan.model_presets import resolve_model
from simdist.plan.step_config import layer_kinds

H100 = GPU_PRESETS["h100-sxm"]
# h 64, 8 experts of width 128, top-2, 128 tokens; layer 0 dense (ffn 256), layers 1-3 MoE (DeepSeek's first dense).
TINY = Model("tiny-moe", "decoder", num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=4,
             ffn_hidden_size=256, seq_length=128, vocab_size=1000, swiglu=True, num_experts=8, moe_router_topk=2,
             moe_ffn_hidden_size=128, moe_layer_freq=(0, 1, 1, 1))
T, K, H, F = 128, 2, 64, 128  # tokens, topk, hidden, expert width (SwiGLU: fc1 is h -> 2F)


def kernels(work, name: str, backward: bool = False):
    return [k for k in (work.backward if backward else work.forward) if k.name == name]


def a2a(work):
    return [c for c in work.comm if c.op == "all_to_all"]


# ----------------------------------------------------------------------------- imbalance, capacity
def test_doubling_imbalance_doubles_the_busiest_ranks_expert_work_and_the_all_to_all_imbalance():
    one = layer_work(TINY, layer=1, attention="flash", experts=ExpertParallel(ep=4, imbalance=1.0))
    two = layer_work(TINY, layer=1, attention="flash", experts=ExpertParallel(ep=4, imbalance=2.0))
    # ep 4: 2 local experts; a balanced rank receives T x topk = 256 rows, 128 per expert; the busiest 2x.
    (fc1_one,), (fc1_two,) = kernels(one, "expert_fc1"), kernels(two, "expert_fc1")
    assert fc1_one.gemm_mnk == (128, 2 * F, H) and fc1_two.gemm_mnk == (256, 2 * F, H)
    assert fc1_one.flops == 2 * 128 * 2 * F * H * 2  # one grouped GEMM of the 2 local experts
    assert fc1_two.flops == 2 * fc1_one.flops
    # model FLOPs: the balanced rows only (imbalance is time, not work)
    assert fc1_one.model_flops == fc1_two.model_flops == 2 * (T * K) * 2 * F * H
    assert one.model_flops == two.model_flops and two.hardware_flops > one.hardware_flops
    # expert compute time: each GEMM on the roofline (peak x size efficiency x tile/wave quantization, NVIDIA's
    # matrix-multiplication guide), hand-evaluated for both shapes
    eff = compute_efficiency(H100)

    def gemm_s(m: int, n: int, k: int, batch: int, nbytes: float) -> float:
        rate = H100.peak_flops("bf16") * gemm_efficiency(eff, (m, n, k)) * quantization(H100, (m, n, k), "bf16", batch)
        return max(2.0 * m * n * k * batch / rate, nbytes / (H100.hbm_bandwidth * eff.memory_efficiency)) \
            + eff.launch_overhead_s

    for te, work in ((128, one), (256, two)):
        (fc1,), (fc2,) = kernels(work, "expert_fc1"), kernels(work, "expert_fc2")
        assert kernel_time_s(H100, fc1, "bf16") == pytest.approx(gemm_s(te, 2 * F, H, 2, fc1.hbm_bytes), rel=1e-12)
        assert kernel_time_s(H100, fc2, "bf16") == pytest.approx(gemm_s(te, H, F, 2, fc2.hbm_bytes), rel=1e-12)
    # every element-wise kernel of the busiest rank's rows (sort, activation, unsort) moves twice the bytes; the
    # sender's own permutation does not change
    for name in ("moe_sort_chunks", "expert_swiglu", "moe_unsort_chunks"):
        assert kernels(two, name)[0].hbm_bytes == 2 * kernels(one, name)[0].hbm_bytes
    assert kernels(two, "moe_permute")[0].hbm_bytes == kernels(one, "moe_permute")[0].hbm_bytes
    # dispatch + combine, forward and backward: a balanced rank's send buffer T x topk x h x 2 B, imbalance 1 -> 2
    assert [(c.phase, c.axis, c.nbytes, c.imbalance) for c in a2a(one)] == [
        ("forward", "ep", T * K * H * 2.0, 1.0)] * 2 + [("backward", "ep", T * K * H * 2.0, 1.0)] * 2
    assert [c.imbalance for c in a2a(two)] == [2.0] * 4 and [c.nbytes for c in a2a(two)] == [c.nbytes for c in a2a(one)]


def test_the_experts_activation_weights_the_rows_and_the_unpermutation_only_sums():
    """Megatron-LM !2668 (April 2025): the router probabilities travel with the permuted rows and the experts'
    activation multiplies them in (TEGroupedMLP's weighted bias-SwiGLU), so the unpermutation sums a token's copies and
    its backward is a gather. ep 4: a rank sends T x topk = 256 rows and its 2 local experts get 256 rows of width F."""
    work = layer_work(TINY, layer=1, attention="flash", experts=ExpertParallel(ep=4, router_dtype="fp32"))
    rows, e = T * K, 2
    (act,), (act_grad,) = kernels(work, "expert_swiglu"), kernels(work, "expert_swiglu_grad", backward=True)
    # SwiGLU: read gate and up, write the output (3 x 2 B an element), plus each row's fp32 probability read once;
    # backward: 5 x 2 B an element, plus the probability read and its gradient written (8 B a row)
    assert act.hbm_bytes == pytest.approx(rows * F * 3 * e + rows * 4, rel=1e-12)
    assert act_grad.hbm_bytes == pytest.approx(rows * F * 5 * e + rows * 8, rel=1e-12)
    # without moe_router_dtype the probabilities are the hidden states' bf16 (Megatron-Core's TopKRouter.gating)
    plain = layer_work(TINY, layer=1, attention="flash", experts=ExpertParallel(ep=4))
    (act16,), (act16_grad,) = kernels(plain, "expert_swiglu"), kernels(plain, "expert_swiglu_grad", backward=True)
    assert act16.hbm_bytes == pytest.approx(rows * F * 3 * e + rows * 2, rel=1e-12)
    assert act16_grad.hbm_bytes == pytest.approx(rows * F * 5 * e + rows * 4, rel=1e-12)
    assert act.flops == pytest.approx(rows * F * 7.0) and act_grad.flops == pytest.approx(rows * F * 10.0)
    (unperm,), (unperm_grad,) = kernels(work, "moe_unpermute"), kernels(work, "moe_unpermute_grad", backward=True)
    # forward: the 256 returned rows read, the 128 tokens written, one add an element; backward: the tokens'
    # gradients gathered into the rows (read and write 2 B an element), no FLOPs
    assert unperm.hbm_bytes == rows * H * e + T * H * e and unperm.flops == rows * H
    assert unperm_grad.hbm_bytes == rows * H * 2 * e and unperm_grad.flops == 0


def test_capacity_factor_caps_the_busiest_rank_and_drops_below_the_balanced_share():
    capped = layer_work(TINY, layer=1, experts=ExpertParallel(ep=4, imbalance=2.0, capacity_factor=1.5))
    # min(2.0, 1.5) x 128 rows per local expert = 192; the busiest peer receives 1.5 x the mean
    assert kernels(capped, "expert_fc1")[0].gemm_mnk[0] == 192
    assert [c.imbalance for c in a2a(capped)] == [1.5] * 4
    dropping = layer_work(TINY, layer=1, experts=ExpertParallel(ep=4, imbalance=1.0, capacity_factor=0.5))
    # every expert keeps half its balanced share: 64 rows, and every rank sends half its routed rows
    assert kernels(dropping, "expert_fc1")[0].gemm_mnk[0] == 64
    assert [c.nbytes for c in a2a(dropping)] == [T * K * H * 2.0 * 0.5] * 4
    assert [c.imbalance for c in a2a(dropping)] == [1.0] * 4


# ----------------------------------------------------------------------------- grouped vs per-expert GEMMs
def test_grouped_gemm_is_one_call_whose_tiles_share_waves_per_expert_gemms_pay_a_wave_and_a_launch_each():
    grouped = layer_work(TINY, layer=1, experts=ExpertParallel(ep=4, grouped_gemm=True))
    looped = layer_work(TINY, layer=1, experts=ExpertParallel(ep=4, grouped_gemm=False))
    (g,), each = kernels(grouped, "expert_fc1"), kernels(looped, "expert_fc1")
    assert len(each) == 2 and all(k.gemm_mnk == g.gemm_mnk == (128, 256, 64) for k in each)
    assert sum(k.flops for k in each) == g.flops and sum(k.model_flops for k in each) == g.model_flops
    assert grouped.model_flops == looped.model_flops
    # H100 (132 SMs), 128 x 128 tiles: one expert's 128 x 256 output is 2 tiles in one wave; the grouped call's 4
    # tiles fit the same wave, so its useful share of the wave doubles
    assert architecture(H100).num_sms == 132
    assert quantization(H100, (128, 256, 64), "bf16", batch=2) == pytest.approx(
        2 * quantization(H100, (128, 256, 64), "bf16", batch=1), rel=1e-12)
    assert kernels_time_s(H100, each, "bf16") == pytest.approx(2 * kernel_time_s(H100, each[0], "bf16"), rel=1e-12)
    assert kernels_time_s(H100, each, "bf16") > kernel_time_s(H100, g, "bf16")


# ----------------------------------------------------------------------------- dispatchers
def test_allgather_dispatcher_gathers_over_etp_then_ep_and_reduce_scatters_back_in_fp32():
    w = layer_work(TINY, layer=1, experts=ExpertParallel(ep=2, etp=2, dispatcher="allgather"))
    fwd = [(c.op, c.axis, c.nbytes) for c in w.comm if c.phase == "forward"]
    # the tp_ep group's all-gather of every token (T x etp x ep rows of h), with its routing map (1 B) and
    # probabilities (the hidden states' bf16 without moe_router_dtype: 2 B)
    assert fwd == [("all_gather", "etp", T * 2 * H * 2.0), ("all_gather", "etp", T * 2 * 8 * 3.0),
                   ("all_gather", "ep", T * 4 * H * 2.0), ("all_gather", "ep", T * 4 * 8 * 3.0),
                   ("reduce_scatter", "ep", T * 4 * H * 4.0), ("reduce_scatter", "etp", T * 2 * H * 4.0)]
    assert not a2a(w)
    # the busiest rank's rows are T x topk x etp whatever the dispatcher
    assert kernels(w, "expert_fc1")[0].gemm_mnk == (T * K * 2 // 4, 2 * F // 2, H)


def test_flex_dispatcher_sends_a_token_once_per_destination_rank():
    # 8 experts, 2 per rank (ep 4), top-2: a token misses a rank with probability C(6, 2) / C(8, 2) = 15 / 28
    assert expected_destination_ranks(8, 2, 4) == pytest.approx(4 * (1 - 15 / 28), rel=1e-12)
    w = layer_work(TINY, layer=1, experts=ExpertParallel(ep=4, dispatcher="flex"))
    assert [c.nbytes for c in a2a(w)] == [pytest.approx(T * 4 * (13 / 28) * H * 2.0)] * 4
    assert expected_destination_ranks(8, 2, 1) == 1.0 and expected_destination_ranks(8, 8, 4) == 4.0


def test_flex_across_nvlink_domains_crosses_the_network_once_per_remote_domain():
    """ep 4 as 2 NVLink domains of 2 ranks (4 experts each): a token misses a domain with probability
    C(4, 2) / C(8, 2) = 6 / 28, so it reaches D = 2 (1 - 6 / 28) = 44 / 28 domains on average. Priced as the even
    all-to-all of T x D rows, whose cross-domain half is the one copy per remote domain (22 / 28 of a token) the
    network carries; alltoall would send 2 copies (topk) and flex inside one domain 4 x 13 / 28."""
    hier = layer_work(TINY, layer=1, experts=ExpertParallel(ep=4, dispatcher="flex", domains=2))
    assert [c.nbytes for c in a2a(hier)] == [pytest.approx(T * (44 / 28) * H * 2.0, rel=1e-12)] * 4
    flat = layer_work(TINY, layer=1, experts=ExpertParallel(ep=4, dispatcher="flex"))
    assert a2a(hier)[0].nbytes < a2a(flat)[0].nbytes < T * K * H * 2.0
    # the rows the experts and the unpermutation process are the same: only the wire changes
    assert [k for k in hier.forward if k.kind != "comm"] == [k for k in flat.forward if k.kind != "comm"]
    # Megatron's alltoall ignores the domains (NCCL's all-to-all sends every copy)
    a, b = (layer_work(TINY, layer=1, experts=ExpertParallel(ep=4, domains=d)) for d in (1, 2))
    assert [c.nbytes for c in a2a(a)] == [c.nbytes for c in a2a(b)] == [T * K * H * 2.0] * 4
    with pytest.raises(LayoutError, match="unevenly over 3 NVLink domains"):
        layer_work(TINY, layer=1, experts=ExpertParallel(ep=4, dispatcher="flex", domains=3))


def test_a_step_counts_the_nvlink_domains_its_expert_groups_span(tmp_path):
    """Two 8-GPU DGX H100 nodes, ep 16: the group spans both nodes; ep 8 stays in one (dp 16 outer)."""
    from simdist.plan.model_presets import resolve_model

    def cfg(ep: int):
        f = tmp_path / f"ep{ep}.yaml"
        f.write_text("cluster: {preset: dgx-h100, num_nodes: 2}\nmodel: {preset: qwen3-30b-a3b, seq_length: 1024}\n"
                     f"parallel: {{dp: 16, ep: {ep}}}\n"
                     "training: {global_batch_size: 16, moe_token_dispatcher_type: flex}\n")
        sc = api.load_scenario(f)
        return step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))

    two, one = cfg(16), cfg(8)
    assert (two.expert_parallel.domains, one.expert_parallel.domains) == (2, 1)
    assert two.expert_parallel.domains == 2
    # ep 12 of 24 experts on three nodes: 8 ranks in the first node, 4 in the second; DeepEP cannot run it
    f = tmp_path / "uneven.yaml"
    f.write_text("cluster: {preset: dgx-h100, num_nodes: 3}\nmodel: {num_layers: 2, hidden_size: 1024, "
                 "num_attention_heads: 8, ffn_hidden_size: 2048, seq_length: 1024, vocab_size: 32000, swiglu: true, "
                 "num_experts: 24, moe_router_topk: 2, moe_ffn_hidden_size: 512}\nparallel: {dp: 24, ep: 12}\n"
                 "training: {global_batch_size: 24, moe_token_dispatcher_type: flex}\n")
    sc = api.load_scenario(f)
    with pytest.raises(LayoutError, match="8/4 ranks in the 2 NVLink domains") as err:
        step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    assert err.value.field == "parallel.ep"


def test_expert_tensor_parallelism_adds_its_gather_and_scatter_on_the_etp_axis():
    w = layer_work(TINY, layer=1, experts=ExpertParallel(ep=2, etp=2))
    rows = T * K * 2  # received over ep, then gathered over the expert-TP pair
    assert [(c.op, c.phase) for c in w.comm if c.axis == "etp"] == [
        ("all_gather", "forward"), ("reduce_scatter", "forward"), ("all_gather", "backward"),
        ("reduce_scatter", "backward")]
    assert {c.nbytes for c in w.comm if c.axis == "etp"} == {rows * H * 2.0}
    assert kernels(w, "expert_fc1")[0].gemm_mnk == (rows // 4, 2 * F // 2, H)  # 4 local experts, f / etp


def test_moe_layout_rules_are_one_line_errors():
    with pytest.raises(LayoutError, match="ep 3 does not divide num_experts 8"):
        layer_work(TINY, layer=1, experts=ExpertParallel(ep=3))
    with pytest.raises(LayoutError, match="sequence parallelism"):
        layer_work(TINY, layer=1, tp=2, experts=ExpertParallel(ep=2))


def test_dense_layers_of_an_moe_model_use_ffn_hidden_size_and_recompute_repeats_the_all_to_alls():
    dense = layer_work(TINY, layer=0, experts=ExpertParallel(ep=4))
    assert kernels(dense, "mlp_up")[0].gemm_mnk == (T, 2 * 256, H) and not dense.comm
    full = layer_work(TINY, layer=1, recompute="full", experts=ExpertParallel(ep=4, imbalance=1.5))
    redone = [c for c in a2a(full) if c.recompute]
    assert len(redone) == 2 and all(c.imbalance == 1.5 and c.phase == "backward" for c in redone)


# ----------------------------------------------------------------------------- MLA, DeepSeek-V3
DSV3 = Model("deepseek-v3", "decoder", num_layers=61, hidden_size=7168, num_attention_heads=128, num_query_groups=128,
             ffn_hidden_size=18432, seq_length=4096, vocab_size=129280, swiglu=True, num_experts=256,
             moe_router_topk=8, moe_ffn_hidden_size=2048, moe_shared_expert_intermediate_size=2048,
             moe_layer_freq=(0,) * 3 + (1,) * 58, multi_latent_attention=True, q_lora_rank=1536, kv_lora_rank=512,
             qk_head_dim=128, qk_pos_emb_head_dim=64, v_head_dim=128, qk_layernorm=True)
"""DeepSeek-V3's config.json (deepseek-ai/DeepSeek-V3): first_k_dense_replace 3, n_shared_experts 1."""


def test_deepseek_v3_model_flops_per_token_are_six_times_its_active_parameters():
    s, layers = DSV3.seq_length, DSV3.num_layers
    # attention scores, forward and backward, causal half: QK^T over 128 x (128 + 64), PV over 128 x 128
    scores = 3 * 2 * 0.5 * s * 128 * (192 + 128) * layers
    matmul = model_flops_per_sequence(DSV3) / s - scores
    # every GEMM weight a token passes through, 6 FLOPs each: the active parameters less the embedding lookup and
    # the norms (two per layer, the two latent norms, the final norm)
    norms = layers * (2 * 7168 + 1536 + 512) + 7168
    assert matmul == pytest.approx(6 * (DSV3.num_active_params - 129280 * 7168 - norms), rel=1e-12)
    # DeepSeek-V3 technical report (arXiv:2412.19437) sec. 1 / Table 1: 37B activated parameters per token
    assert matmul == pytest.approx(6 * 37e9, rel=0.02)


def test_mla_attention_kernels_use_unequal_qk_and_v_head_dims():
    w = layer_work(DSV3, layer=0, attention="flash", micro_batch_size=1, tp=8, sequence_parallel=True)
    (attn,) = kernels(w, "flash_attention")
    scores = 1 * (128 // 8) * 4096 * 4096
    assert attn.flops == 0.5 * (2 * scores * 192 + 2 * scores * 128)
    (grad,) = kernels(w, "flash_attention_grad", backward=True)
    assert grad.flops == 0.5 * 2 * scores * (3 * 192 + 2 * 128)
    shapes = {k.name: k.gemm_mnk for k in w.forward if k.kind == "gemm"}
    m, m_l = 4096, 4096 // 8  # the duplicated down projections run on the peer's own tokens
    assert shapes["q_down"] == (m_l, 1536, 7168) and shapes["kv_down"] == (m_l, 512 + 64, 7168)
    assert shapes["q_up"] == (m, 16 * 192, 1536) and shapes["kv_up"] == (m, 16 * 256, 512)
    assert shapes["projection"] == (m, 7168, 16 * 128)
    # sequence parallelism gathers the two latents, not the b x s x h input
    gathers = [c.nbytes for c in w.comm if c.op == "all_gather" and c.phase == "forward"]
    assert gathers[:2] == [m * 1536 * 2.0, m * 576 * 2.0]


def test_sliding_window_counts_its_band_of_scores():
    gpt_oss = Model("swa", "decoder", num_layers=2, hidden_size=256, num_attention_heads=4, num_query_groups=4,
                    ffn_hidden_size=512, seq_length=1024, vocab_size=1000, swiglu=True, window_size=128,
                    window_attn_skip_freq=2)
    assert gpt_oss.window_layer_flags() == (True, False)
    window, full = (layer_work(gpt_oss, layer=i, attention="flash") for i in (0, 1))
    d, s, w = 64, 1024, 128
    band = s * w - w * w / 2  # query i sees min(i, W) keys
    assert kernels(window, "flash_attention")[0].flops == 4 * 4 * band * d
    assert kernels(full, "flash_attention")[0].flops == 4 * 4 * (s * s / 2) * d


# ----------------------------------------------------------------------------- chunks, memory, a run
def test_layer_kinds_group_a_chunks_layers_by_kind():
    assert layer_kinds(TINY, 0, 2) == ((0, 1), (1, 1))
    assert layer_kinds(TINY, 2, 2) == ((1, 2),)  # layers 2 and 3 are both like layer 1
    assert layer_kinds(DSV3, 0, 61) == ((0, 3), (3, 58))


def _tiny_scenario(tmp_path, h: int = 64, **parallel) -> str:
    p = tmp_path / "tiny.yaml"
    layout = {"tp": 1, "pp": 2, "dp": 4, **parallel}
    p.write_text(
        "cluster: {preset: dgx-h100, num_nodes: 1}\n"
        f"model: {{num_layers: 4, hidden_size: {h}, num_attention_heads: 4, num_query_groups: 4, ffn_hidden_size:"
        f" {4 * h}, seq_length: {2 * h}, vocab_size: 1000, swiglu: true, num_experts: 8, moe_router_topk: 2,"
        f" moe_ffn_hidden_size: {2 * h}, moe_layer_freq: [0, 1, 1, 1]}}\n"
        f"parallel: {layout}\n".replace("'", "")
        + "training: {micro_batch_size: 1, global_batch_size: 16, precision: bf16}\n", encoding="utf-8")
    return str(p)


def test_chunks_of_mixed_layers_hold_their_experts_over_ep(tmp_path):
    sc = api.load_scenario(_tiny_scenario(tmp_path, ep=4))
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    assert cfg.model_parts() == (2, 2) and cfg.part_layers(0) == ((0, 1), (1, 1))
    first = chunk_cost(cfg, cfg.part_layers(0), True, False)
    expert = 8 * 3 * H * F  # one MoE layer's routed experts
    attention = TINY.attention_params
    assert first.expert_params == expert / 4
    # layer 0 dense, layer 1 MoE (router replicated, experts over ep), the embedding
    assert first.num_params == pytest.approx(attention + TINY.dense_mlp_params + attention + 64 + 8 * 64 + expert / 4
                                             + 1000 * 64, rel=1e-12)
    second = chunk_cost(cfg, cfg.part_layers(1), False, True)
    assert second.expert_params == 2 * expert / 4
    # an int n of a model whose layers differ is refused
    with pytest.raises(LayoutError, match="mixes kinds of layers"):
        chunk_cost(cfg, 2, True, False)


def test_expert_state_is_split_over_ep_and_sharded_over_the_expert_data_parallel_group():
    kw = dict(layers_on_stage=4, first_stage=True, last_stage=True, dp=4, zero_stage=1, layers=(0, 1, 2, 3))
    one = stage_memory(TINY, experts=ExpertParallel(ep=1), **kw)
    four = stage_memory(TINY, experts=ExpertParallel(ep=4), **kw)
    routed = 3 * 8 * 3 * H * F
    # bf16: 2 B of weights and 4 B of fp32 gradients per parameter; the experts are a quarter per GPU under ep 4
    assert one.params_bytes - four.params_bytes == pytest.approx(2 * routed * (1 - 1 / 4), rel=1e-12)
    assert one.grads_bytes - four.grads_bytes == pytest.approx(4 * routed * (1 - 1 / 4), rel=1e-12)
    # ZeRO-1: 12 B of optimizer state over dp = 4 (ep 1: edp 4), or of a quarter of the experts over edp = 1
    assert one.optimizer_bytes - four.optimizer_bytes == pytest.approx(12 * routed / 4 - 12 * routed / 4, abs=1e-6)
    dense = TINY.num_params - routed
    assert four.optimizer_bytes == pytest.approx(12 * dense / 4 + 12 * routed / 4, rel=1e-12)
    # the busiest rank's routed activations grow with the imbalance
    hot = stage_memory(TINY, experts=ExpertParallel(ep=4, imbalance=2.0), **kw)
    assert hot.activations_bytes > four.activations_bytes


def test_an_moe_scenario_runs_and_its_mfu_counts_active_parameters(tmp_path):
    path = _tiny_scenario(tmp_path, h=1024, ep=4)  # big enough that the expert GEMMs, not the host, set the pace
    one = api.run(path, fidelity="closed_form")
    two = api.run(path, ["training.moe_imbalance=2.0"], fidelity="closed_form")
    assert two.result["step_time_s"] > one.result["step_time_s"]
    # the same model FLOPs per step: MFU falls by exactly the step-time ratio
    assert two.result["mfu"] * two.result["step_time_s"] == pytest.approx(
        one.result["mfu"] * one.result["step_time_s"], rel=1e-9)
    assert "moe_router_topk routed experts" in one.result["flop_convention"]
    model = resolve_model(api.load_scenario(path).spec.model)
    assert one.result["model"]["num_active_params"] == model.num_active_params < model.num_params
    assert math.isfinite(one.result["memory_per_gpu_bytes"])


def test_mtp_modules_run_on_the_last_part(tmp_path):
    plain = _tiny_scenario(tmp_path, ep=4)
    sc = api.load_scenario(plain, ["model.mtp_num_layers=1"])
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    base = step_config_of(sc.spec, sc.topology, dataclasses.replace(cfg.model, mtp_num_layers=0))
    with_mtp, without = (chunk_cost(c, c.part_layers(1), False, True) for c in (cfg, base))
    kw = dict(tp=1, micro_batch_size=1)
    extra = sum(k.model_flops for w in (layer_work(cfg.model, layer=3, attention=cfg.attention,
                                                   experts=cfg.expert_parallel),
                                        mtp_work(cfg.model, **kw), embedding_work(cfg.model, **kw),
                                        head_work(cfg.model, **kw)) for k in w.forward if k.kind != "memory")
    assert with_mtp.model_flops_forward == pytest.approx(without.model_flops_forward + extra, rel=1e-12)
    # its layer (like layer 3: routed experts over ep) and its own norms and 2h x h projection
    own = 3 * H + 2 * H * H
    assert with_mtp.num_params - without.num_params == pytest.approx(
        cfg.model.layer_params(3) - 8 * 3 * H * F + 8 * 3 * H * F / 4 + own, rel=1e-12)
    assert with_mtp.expert_params - without.expert_params == 8 * 3 * H * F / 4
    # first part untouched
    assert chunk_cost(cfg, cfg.part_layers(0), True, False) == chunk_cost(base, base.part_layers(0), True, False)


def test_qk_norm_adds_its_kernels_and_keeps_the_flops():
    qk = Model("qk", "decoder", num_layers=1, hidden_size=256, num_attention_heads=4, num_query_groups=2,
               ffn_hidden_size=512, seq_length=256, vocab_size=1000, swiglu=True, qk_layernorm=True)
    plain = Model(**{**{f: getattr(qk, f) for f in qk.__slots__}, "qk_layernorm": False})
    a, b = layer_work(qk), layer_work(plain)
    (norm,) = kernels(a, "qk_norm")
    assert norm.hbm_bytes == 256 * (256 + 128) * 2 * 2  # read and write Q (4 x 64) and K (2 x 64), 2 B each
    # and, Megatron-Core splitting the QKV output for the norms, the split's three copies (Q: 2 groups of 2 heads)
    assert [k.name for k in a.forward if k.name not in {k.name for k in b.forward}] == [
        "query_reshape_copy", "key_contiguous", "value_contiguous", "qk_norm"]
    assert a.model_flops == b.model_flops and len(a.forward) == len(b.forward) + 4


def test_activations_of_an_moe_layer_and_of_mla_by_hand():
    e, s, h = 2, 128, 64
    common = 4 * e * s * h + 2 * s * (2 * 64 + 2 * 64) + 4 * 4 * s  # norms' and QKV/MLP inputs; Q, K, V, proj; lse
    rows = 2 * s  # ep 4: T x topk = 256 rows on 2 local experts
    # expert tensors, router, each row's probability (the weighted activation's, in the hidden states' bf16 without
    # moe_router_dtype; the unpermutation keeps nothing since Megatron-LM !2668: before it, the expert outputs
    # s x K x h for the probabilities' gradient)
    routed = e * rows * (h + 3 * F) + s * 8 * (4 + 1) + 2 * rows
    assert activation_bytes_per_layer(TINY, attention="flash", layer=1, experts=ExpertParallel(ep=4)) == \
        common + routed
    assert activation_bytes_per_layer(TINY, attention="flash", layer=1,
                                      experts=ExpertParallel(ep=4, router_dtype="fp32")) == common + routed + 2 * rows
    assert activation_bytes_per_layer(TINY, attention="flash", layer=0) == common + 3 * e * s * 256
    hot = activation_bytes_per_layer(TINY, attention="flash", layer=1, experts=ExpertParallel(ep=4, imbalance=2.0))
    assert hot - (common + routed) == rows * (e * (h + 3 * F) + 2)  # the busiest rank keeps twice the expert rows
    # MLA (DeepSeek-V3, tp 8 with sequence parallelism): Q, K of 16 x 192, V and the projection input of 16 x 128,
    # the two latents' norm and up-projection inputs on the peer's own tokens
    s, h, t = 4096, 7168, 8
    mla = activation_bytes_per_layer(DSV3, tp=8, sequence_parallel=True, attention="flash", layer=0)
    expect = (4 * e * s * h / t + e * s * (2 * 16 * 192 + 2 * 16 * 128) + 2 * e * s * (1536 + 512) / t
              + 3 * e * s * 18432 / t + 4 * 128 * s / t)
    assert mla == pytest.approx(expect, rel=1e-12)


def test_fp8_routed_experts_keep_their_linears_inputs_at_one_byte_as_grouped_linear_saves_them():
    # Transformer Engine's GroupedLinear saves each expert's quantized input (fc1's, and fc2's: the activation's
    # output) under fp8; the activation keeps its 16-bit input. TINY's MoE layer 1 on one rank: 128 tokens x top-2
    # = 256 rows (32 per expert). A row keeps fc1's input (H = 64), fc1's output (2F = 256) and fc2's input (F = 128):
    # bf16 2 x (64 + 256 + 128) = 896 B, fp8 64 + 2 x 256 + 128 = 704 B, 192 B less a row, 49,152 B in all
    from simdist.plan.activations import _routed_activation_bytes

    # fp32 scores and the routing map per token and expert; each row's probability (bf16 without moe_router_dtype)
    router = T * 8 * 5 + 2 * 256
    assert _routed_activation_bytes(TINY, 2, T, ExpertParallel()) == 256 * 896 + router
    assert _routed_activation_bytes(TINY, 2, T, ExpertParallel(), lin=1) == 256 * 704 + router
    # moe_act recomputed: fc2's input is not kept (F = 128 elements at 1 B: 128 B a row less)
    assert _routed_activation_bytes(TINY, 2, T, ExpertParallel(), act=False, lin=1) == 256 * 576 + router
    # through the layer: fp8 saves the dense layer 0 its MLP's down-projection input (F' = 256 wide: 1 B x 128 tokens
    # x 256 less) and the MoE layer 1 its routed rows' 49,152 B; every other tensor of the two layers is alike
    saved = {layer: activation_bytes_per_layer(TINY, layer=layer, precision="bf16", attention="flash")
             - activation_bytes_per_layer(TINY, layer=layer, precision="fp8", attention="flash") for layer in (0, 1)}
    assert saved[1] - saved[0] == 256 * 192 - 128 * 256


# ----------------------------------------------------------------------------- fp8 casts as TE launches them
def test_te_current_scaling_casts_each_expert_in_three_kernels_delayed_scaling_fuses_the_experts_into_one():
    # Transformer Engine @ d0067d0: Float8CurrentScalingQuantizer::quantize_impl launches compute_amax,
    # compute_scale_from_amax and quantize per tensor; a GroupedLinear's input is split per expert and quantized tensor
    # by tensor except under delayed scaling (one nvte_multi_cast_transpose). TINY's MoE layer 1 on ep 4: 2 local
    # experts of 128 rows each; fc1's input is 256 rows x H = 64.
    from simdist.plan.kernel_work import fp8_cast

    n = 256 * H
    tensorwise = fp8_cast("expert_fc1", n, "tensorwise", parts=2)
    assert [k.name for k in tensorwise] == ["expert_fc1_fp8_amax", "expert_fc1_fp8_scale", "expert_fc1_fp8_cast"] * 2
    # each expert's amax reads its 128 x 64 bf16 rows; the cast reads them again and writes the fp8 copy and its
    # transpose; the scale kernel moves the two fp32 words: 6 bytes an element and 2 x 8 bytes in all
    assert [k.hbm_bytes for k in tensorwise] == [128 * H * 2.0, 8.0, 128 * H * 4.0] * 2
    assert sum(k.hbm_bytes for k in tensorwise) == 6.0 * n + 16.0
    delayed = fp8_cast("expert_fc1", n, "delayed", parts=2)
    assert [(k.name, k.hbm_bytes) for k in delayed] == [("expert_fc1_fp8_cast", 4.0 * n)]
    mxfp8 = fp8_cast("expert_fc1", n, "mxfp8", parts=2)
    assert len(mxfp8) == 2 and sum(k.hbm_bytes for k in mxfp8) == pytest.approx((2 + 2 * (1 + 1 / 32)) * n, rel=1e-12)
    # torchao's casts (not Transformer Engine): one kernel a tensor, whatever the recipe
    assert len(fp8_cast("x", n, "tensorwise", transformer_engine=False, parts=2)) == 1
    assert fp8_cast("x", n, None, parts=2) == []


def test_a_te_moe_layer_under_current_scaling_launches_its_expert_casts_per_expert_and_pays_their_launches():
    experts = ExpertParallel(ep=4)  # 2 local experts, one grouped GEMM a linear
    kw = dict(layer=1, attention="flash", precision="fp8", experts=experts)
    cs, delayed = layer_work(TINY, fp8_recipe="tensorwise", **kw), layer_work(TINY, fp8_recipe="delayed", **kw)

    def count(work, suffix, backward=False):
        return sum(k.name.startswith("expert_") and k.name.endswith(suffix)
                   for k in (work.backward if backward else work.forward))

    # forward: fc1's and fc2's inputs, 2 experts each, 3 kernels an expert under current scaling, 1 kernel a linear
    # under delayed scaling; backward: the two linears' output gradients alike
    assert (count(cs, "_fp8_amax"), count(cs, "_fp8_scale"), count(cs, "_fp8_cast")) == (4, 4, 4)
    assert (count(cs, "_fp8_amax", True), count(cs, "_fp8_cast", True)) == (4, 4)
    assert (count(delayed, "_fp8_cast"), count(delayed, "_fp8_cast", True), count(delayed, "_fp8_amax")) == (2, 2, 0)
    # the same bytes, more kernels: every extra launch costs the GPU its launch gap
    gap = compute_efficiency(H100).launch_overhead_s
    extra = (len(cs.forward) + len(cs.backward)) - (len(delayed.forward) + len(delayed.backward))
    assert extra > 0
    assert kernels_time_s(H100, [*cs.forward, *cs.backward], "fp8") > kernels_time_s(
        H100, [*delayed.forward, *delayed.backward], "fp8") + extra * gap
