"""Memory per GPU (simdist.plan.memory) against closed forms and published figures."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist.errors import LayoutError, SpecError
from simdist.plan.activations import activation_bytes_per_layer, in_flight_microbatches
from simdist.plan.memory import MemoryBreakdown, model_state_bytes, optimizer_state_bytes, stage_memory
from simdist.plan.model import Model

GIB = 2**30
GB = 1e9

# Korthikanti et al. 2022 (arXiv:2205.05198) Table 3, copied from
# validation/reference/korthikanti2022_table3_configs.csv (source column: "paper text, Table 3"):
# name: (attention heads a, hidden h, layers L, tp, pp, global batch, micro-batch, interleaving v); s = 2048,
# vocabulary 51200, data parallel 1. "interleaved, 3 stages" is read as v = 3.
KORTHIKANTI_TABLE3 = {
    "22B": (64, 6144, 48, 8, 1, 4, 4, 1),
    "175B": (96, 12288, 96, 8, 8, 64, 1, 3),
    "530B": (128, 20480, 105, 8, 35, 280, 1, 3),
    "1T": (160, 25600, 128, 8, 64, 512, 1, 1),
}
SEQ, VOCAB = 2048, 51200


def gpt(name: str) -> Model:
    a, h, layers = KORTHIKANTI_TABLE3[name][:3]
    return Model(name, "decoder", layers, h, a, a, 4 * h, SEQ, VOCAB)


def table2(name: str, which: str) -> float:
    """Korthikanti Table 2, written out independently: bytes per layer for one micro-batch."""
    a, h, _, t, _, _, b, _ = KORTHIKANTI_TABLE3[name]
    s = SEQ
    sbh = s * b * h
    return {
        "none": sbh * (34 + 5 * a * s / h),
        "tp": sbh * (10 + 24 / t + 5 * a * s / (h * t)),
        "tp_sp": sbh / t * (34 + 5 * a * s / h),
        "tp_selective": sbh * (10 + 24 / t),
        "tp_sp_selective": sbh * 34 / t,
        "full": 2 * sbh,
        "full_sp": 2 * sbh / t,
    }[which]


CASES = {
    "none": {"tp": 1},
    "tp": {},
    "tp_sp": {"sequence_parallel": True},
    "tp_selective": {"recompute": "selective"},
    "tp_sp_selective": {"sequence_parallel": True, "recompute": "selective"},
    "full": {"recompute": "full"},
    "full_sp": {"recompute": "full", "sequence_parallel": True},
}


@pytest.mark.parametrize("name", list(KORTHIKANTI_TABLE3))
@pytest.mark.parametrize("which", list(CASES))
def test_korthikanti_table2_exact(name: str, which: str) -> None:
    _, _, _, t, _, _, b, _ = KORTHIKANTI_TABLE3[name]
    kwargs = {"tp": t, "micro_batch_size": b, **CASES[which]}
    got = activation_bytes_per_layer(gpt(name), **kwargs)
    assert got == pytest.approx(table2(name, which), rel=1e-12)


@pytest.mark.parametrize("name", list(KORTHIKANTI_TABLE3))
def test_reduction_factors_of_the_formulas(name: str) -> None:
    a, h, _, t, _, _, _, _ = KORTHIKANTI_TABLE3[name]
    m = gpt(name)
    ratio_term = 5 * a * SEQ / h
    none = activation_bytes_per_layer(m)
    full = activation_bytes_per_layer(m, recompute="full")
    assert none / full == pytest.approx((34 + ratio_term) / 2, rel=1e-12)
    tp_sp = activation_bytes_per_layer(m, tp=t, sequence_parallel=True)
    tp_sp_sel = activation_bytes_per_layer(m, tp=t, sequence_parallel=True, recompute="selective")
    assert tp_sp_sel / tp_sp == pytest.approx(34 / (34 + ratio_term), rel=1e-12)
    # cp splits everything (s/cp tokens per rank)
    assert activation_bytes_per_layer(m, tp=t, cp=4) == pytest.approx(activation_bytes_per_layer(m, tp=t) / 4)


@pytest.mark.parametrize("name", ["530B", "1T"])
def test_five_fold_reduction_claim(name: str) -> None:
    # Korthikanti abstract / sec. 1: sequence parallelism + selective recompute "reduce activation memory by 5x"
    # against tensor parallelism alone. Their formulas give 21 / 4.25 = 4.94 for a s / h = 12.8 (530B, 1T).
    t = KORTHIKANTI_TABLE3[name][3]
    m = gpt(name)
    base = activation_bytes_per_layer(m, tp=t)
    best = activation_bytes_per_layer(m, tp=t, sequence_parallel=True, recompute="selective")
    assert base / best == pytest.approx(5.0, rel=0.02)


def test_gqa_and_swiglu_coefficients_by_hand() -> None:
    # h = 4096, 32 heads of 128, 8 KV groups (kv = 1024), f = 14336, SwiGLU, no dropout; s = 4096, b = 1, t = 4.
    m = Model("llama-ish", "decoder", 32, 4096, 32, 8, 14336, 4096, 128256, swiglu=True)
    s, h, kv, f, t, a = 4096, 4096, 1024, 14336, 4, 32
    sel = activation_bytes_per_layer(m, tp=t, recompute="selective")
    # replicated: 2 norms + QKV input + fc1 input, 2 bytes each; sharded: Q, out-proj input (h), K, V (kv);
    # MLP: 2f swiglu input + f down-proj input
    assert sel == pytest.approx(s * (8 * h + (2 * 2 * h + 2 * 2 * kv + 3 * 2 * f) / t), rel=1e-12)
    none = activation_bytes_per_layer(m, tp=t)
    assert none - sel == pytest.approx(2 * a * s * s / t, rel=1e-12)  # softmax output only, no dropout
    # t > groups: each rank keeps one whole K/V head group
    t16 = activation_bytes_per_layer(m, tp=16, recompute="selective", sequence_parallel=True)
    assert t16 == pytest.approx(s * (8 * h / 16 + (2 * 2 * h / 16 + 2 * 2 * 128 + 3 * 2 * f / 16)), rel=1e-12)


def test_fp8_keeps_the_linear_layers_inputs_in_fp8() -> None:
    # Transformer Engine saves each fp8 linear's input as its fp8 cast (1 byte): the QKV and fc1 inputs
    # (replicated), the out-projection input (h / t) and the down-projection input (f / t); the norms' inputs,
    # Q, K, V for attention and the swiglu input stay 16-bit. Same shapes as the hand count above.
    m = Model("llama-ish", "decoder", 32, 4096, 32, 8, 14336, 4096, 128256, swiglu=True)
    s, h, kv, f, t = 4096, 4096, 1024, 14336, 4
    fp8 = activation_bytes_per_layer(m, tp=t, recompute="selective", precision="fp8")
    assert fp8 == pytest.approx(s * ((2 * 2 + 2 * 1) * h + (3 * h + 2 * 2 * kv + 5 * f) / t), rel=1e-12)
    bf16 = activation_bytes_per_layer(m, tp=t, recompute="selective")
    assert bf16 - fp8 == pytest.approx(s * (2 * h + (h + f) / t), rel=1e-12)  # one byte less on each of four
    # full recompute keeps only the 16-bit layer input
    assert activation_bytes_per_layer(m, tp=t, recompute="full", precision="fp8") == 2 * s * h


def test_gradients_in_the_parameters_dtype_halve_their_bytes() -> None:
    # Megatron-LM --accumulate-allreduce-grads-in-fp32 off (Megatron-Bridge's ddp.grad_reduce_in_fp32: false):
    # bf16 gradients, 2 + 2 + 12 = 16 bytes per parameter; fp32 training keeps fp32 gradients whatever the switch.
    assert model_state_bytes(1e9, grad_reduce_in_fp32=False) == (2e9, 2e9, 12e9)
    assert model_state_bytes(1e9, precision="fp16", grad_reduce_in_fp32=True) == (2e9, 4e9, 12e9)
    assert model_state_bytes(1e9, precision="fp32", grad_reduce_in_fp32=False) == (4e9, 4e9, 8e9)


def test_lecture_mlp_fp32() -> None:
    # CS336 MLP: per layer the matmul input and the GELU input, fp32, batch 128, width 1024.
    m = Model("mlp", "mlp", 4, 1024)
    assert activation_bytes_per_layer(m, micro_batch_size=128, precision="fp32") == 2 * 4 * 128 * 1024
    assert activation_bytes_per_layer(m, micro_batch_size=128, precision="fp32", tp=4) == 4 * 128 * 1024 * 1.25
    assert activation_bytes_per_layer(m, micro_batch_size=128, precision="fp32", recompute="full") == 4 * 128 * 1024
    # fp32 doubles the 16-bit terms of a decoder except the 1-byte dropout masks
    g = gpt("22B")
    sbh, a_s_h = SEQ * 6144, 64 * SEQ / 6144
    assert activation_bytes_per_layer(g, precision="fp32") == pytest.approx(sbh * (64 + 2 + 9 * a_s_h))


@pytest.mark.parametrize(
    ("zero", "expected_gb"), [(0, 120.0), (1, 31.4), (2, 16.6), (3, 1.9)]
)
def test_zero_paper_figure1(zero: int, expected_gb: float) -> None:
    # Rajbhandari et al. 2020 Figure 1: Psi = 7.5B, N_d = 64, K = 12; the figure rounds to 0.1 GB (fp16 training).
    total = sum(model_state_bytes(7.5e9, dp=64, zero_stage=zero, precision="fp16"))
    assert total / GB == pytest.approx(expected_gb, abs=0.05)


def test_bf16_keeps_fp32_gradients_as_megatron() -> None:
    # Megatron-LM docs/source/api-guide/dist_optimizer.md: bf16 params + fp32 grads = 18 bytes/param, and
    # 6 + 12/d with the distributed optimizer (ZeRO-1).
    assert sum(model_state_bytes(1e9)) == 18e9
    assert sum(model_state_bytes(1e9, dp=4, zero_stage=1)) == pytest.approx(6e9 + 12e9 / 4)


def test_fp32_model_state_is_16_bytes_per_param() -> None:
    assert model_state_bytes(1e9, precision="fp32") == (4e9, 4e9, 8e9)
    assert model_state_bytes(1e9, precision="tf32", dp=8, zero_stage=1) == (4e9, 4e9, 1e9)


def test_in_flight_counts() -> None:
    assert in_flight_microbatches("1f1b", num_stages=4, num_microbatches=8, stage=0) == 4
    assert in_flight_microbatches("1f1b", num_stages=4, num_microbatches=8, stage=3) == 1
    assert in_flight_microbatches("1f1b", num_stages=4, num_microbatches=2, stage=0) == 2
    assert in_flight_microbatches("zb_h1", num_stages=4, num_microbatches=8, stage=1) == 3
    for stage in range(4):
        assert in_flight_microbatches("gpipe", num_stages=4, num_microbatches=8, stage=stage) == 8
    # Interleaved stage 0: p (1 + (p - 1)/(p v)) (Korthikanti sec. 4.2.3): p = 8, v = 3 -> 8 + 7/3
    assert in_flight_microbatches("interleaved_1f1b", num_stages=8, num_microbatches=64, vpp=3) == pytest.approx(
        8 + 7 / 3
    )
    # last stage: (v p - p + 1) chunk-micro-batches = 17 / 3
    last = in_flight_microbatches("interleaved_1f1b", num_stages=8, num_microbatches=64, vpp=3, stage=7)
    assert last == pytest.approx(17 / 3)
    assert in_flight_microbatches("interleaved_1f1b", num_stages=4, num_microbatches=8, vpp=1) == 4


def test_bad_inputs_raise_user_errors() -> None:
    with pytest.raises(SpecError) as exc:
        in_flight_microbatches("pipedream", num_stages=2, num_microbatches=2)
    assert exc.value.field == "schedule" and "1f1b" in (exc.value.fix or "")
    with pytest.raises(SpecError):
        activation_bytes_per_layer(gpt("22B"), recompute="some")
    with pytest.raises(LayoutError):
        activation_bytes_per_layer(gpt("22B"), tp=0)
    with pytest.raises(LayoutError):
        in_flight_microbatches("1f1b", num_stages=4, num_microbatches=8, stage=4)
    with pytest.raises(SpecError):
        model_state_bytes(1e9, zero_stage=4)


def first_stage(name: str, *, sp: bool, recompute: str, capacity: float = 80 * GIB) -> MemoryBreakdown:
    _, _, layers, t, p, gbs, b, v = KORTHIKANTI_TABLE3[name]
    sched = "interleaved_1f1b" if v > 1 else "1f1b"
    flight = in_flight_microbatches(sched, num_stages=p, num_microbatches=gbs // b, vpp=v)
    return stage_memory(gpt(name), layers_on_stage=layers // p, first_stage=True, last_stage=p == 1, tp=t, pp=p,
                        vpp=v, sequence_parallel=sp, micro_batch_size=b, recompute=recompute,
                        in_flight_microbatches=flight, capacity_bytes=capacity)


@pytest.mark.parametrize("name", list(KORTHIKANTI_TABLE3))
def test_korthikanti_configs_fit_with_sp_and_selective(name: str) -> None:
    # They trained all four on 80 GB A100s with sequence parallelism + selective recompute (Table 5).
    mem = first_stage(name, sp=True, recompute="selective")
    assert mem.fits, mem.as_dict()
    # Korthikanti sec. 4.2.3: the first stage holds L layers' worth (p micro-batches of L/p layers), times
    # (1 + (p-1)/(p v)) when interleaved; plus the embedding dropout mask sbh/t per micro-batch (sec. 4.3).
    _, h, layers, t, p, _, b, v = KORTHIKANTI_TABLE3[name]
    factor = 1 + (p - 1) / (p * v) if v > 1 else 1
    sbh_t = SEQ * b * h / t
    expected = layers * factor * 34 * sbh_t + p * factor * sbh_t
    if p == 1:
        expected = layers * 34 * sbh_t + sbh_t + 4 * sbh_t * (1 + VOCAB / h)
    assert mem.activations_bytes == pytest.approx(expected, rel=1e-9)


def test_gpt3_175b_without_the_techniques_does_not_fit() -> None:
    # Tensor parallelism alone (no SP, no recompute) exceeds 80 GB for 175B, the paper's motivation (sec. 1).
    assert not first_stage("175B", sp=False, recompute="none").fits
    assert first_stage("175B", sp=False, recompute="full").fits


def test_gpt3_175b_without_parallelism_does_not_fit() -> None:
    m = gpt("175B")
    assert m.num_params == pytest.approx(175e9, rel=0.01)
    mem = stage_memory(m, layers_on_stage=96, first_stage=True, last_stage=True, recompute="full",
                       capacity_bytes=80 * GIB)
    assert not mem.fits
    # bf16 with Megatron-LM's fp32 gradients: 2 + 4 + 12 bytes per parameter.
    assert mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes == pytest.approx(18 * m.num_params, rel=1e-9)
    d = mem.as_dict()
    assert d["total_bytes"] == pytest.approx(mem.total_bytes) and d["fits"] is False


def test_tied_embedding_copy_on_last_stage() -> None:
    m = Model("tied", "decoder", 4, 1024, 8, 8, 4096, 512, 32000, tied_embeddings=True)
    both = stage_memory(m, layers_on_stage=4, first_stage=True, last_stage=True)
    assert both.params_bytes == pytest.approx(2 * m.num_params)
    last = stage_memory(m, layers_on_stage=2, first_stage=False, last_stage=True, pp=2)
    assert last.params_bytes == pytest.approx(2 * (2 * m.params_per_layer + 32000 * 1024 + 2 * 1024))


RECOMPUTES = ["none", "selective", "full"]

decoders = st.builds(
    lambda layers, heads, head_dim, groups, seq, swiglu: Model(
        "m", "decoder", layers, heads * head_dim, heads, max(1, heads // groups), 4 * heads * head_dim, seq, 1000,
        swiglu=swiglu,
    ),
    st.integers(1, 8), st.sampled_from([4, 8, 16]), st.sampled_from([32, 64]), st.sampled_from([1, 2, 4]),
    st.sampled_from([128, 1024]), st.booleans(),
)
layouts = st.fixed_dictionaries({
    "sequence_parallel": st.booleans(), "micro_batch_size": st.integers(1, 4),
    "precision": st.sampled_from(["bf16", "fp32"]), "zero_stage": st.integers(0, 3),
    "first_stage": st.booleans(), "last_stage": st.booleans(), "in_flight_microbatches": st.sampled_from([1.0, 4.0]),
})


@settings(max_examples=60, deadline=None)
@given(decoders, layouts, st.sampled_from(RECOMPUTES))
def test_memory_monotone_in_tp(model: Model, layout: dict, recompute: str) -> None:
    totals = [stage_memory(model, layers_on_stage=model.num_layers, tp=t, recompute=recompute, **layout).total_bytes
              for t in (1, 2, 4, 8)]
    assert all(x >= y for x, y in itertools.pairwise(totals)), totals


@settings(max_examples=60, deadline=None)
@given(decoders, layouts, st.sampled_from([1, 2, 4]))
def test_memory_monotone_in_dp_with_zero(model: Model, layout: dict, tp: int) -> None:
    layout = {**layout, "zero_stage": max(1, layout["zero_stage"])}
    totals = [stage_memory(model, layers_on_stage=model.num_layers, tp=tp, dp=d, **layout).total_bytes
              for d in (1, 2, 8, 64)]
    assert all(x > y for x, y in itertools.pairwise(totals)), totals


@settings(max_examples=60, deadline=None)
@given(decoders, layouts, st.sampled_from([1, 2, 8]))
def test_recompute_ordering(model: Model, layout: dict, tp: int) -> None:
    mems = [stage_memory(model, layers_on_stage=model.num_layers, tp=tp, recompute=r, **layout) for r in RECOMPUTES]
    acts = [m.activations_bytes for m in mems]
    assert acts[0] > acts[1] > acts[2] > 0, acts
    assert mems[0].total_bytes >= mems[1].total_bytes >= mems[2].total_bytes
    assert all(math.isclose(m.params_bytes, mems[0].params_bytes) for m in mems)


def test_gradient_dtype_sets_the_data_parallel_reduction_bytes() -> None:
    # The bucketed all-reduce after the backward moves the gradient buffer: 4 bytes a parameter by Megatron-LM's
    # default for bf16, 2 with grad_reduce_in_fp32 false (simdist.plan.data_parallel.tail).
    import dataclasses

    from simdist import api
    from simdist.plan.chunk_cost import chunk_cost
    from simdist.plan.data_parallel import tail
    from simdist.plan.layout import step_config_of
    from simdist.plan.model_presets import resolve_model
    from tests.test_analytic_step import _spec

    spec = _spec({"tp": 1, "pp": 1, "dp": 2, "cp": 1, "vpp": 1, "zero_stage": 0, "recompute": "none",
                  "schedule": "1f1b", "grad_reduce": "bucketed", "bucket": None, "microbatches": 2, "mbs": 1,
                  "sp": False, "per_parameter": False})
    cfg = step_config_of(spec, api.cluster_of(spec), resolve_model(spec.model))
    cost = chunk_cost(cfg, cfg.layers_per_stage[0], True, True)

    def reduced(c) -> float:
        return sum(p.comm.nbytes * p.comm.count for p in tail(c, [cost]).pieces if p.comm and p.comm.axis == "dp")

    assert reduced(cfg) == pytest.approx(4 * cost.num_params)
    assert reduced(dataclasses.replace(cfg, grad_reduce_in_fp32=False)) == pytest.approx(2 * cost.num_params)


def test_pytorch_fsdp_keeps_the_fp32_parameter_as_the_master_weight() -> None:
    # FSDP2's MixedPrecisionPolicy (pytorch torch/distributed/fsdp/_fully_shard/_fsdp_api.py): the optimizer step uses
    # the sharded fp32 parameter, and the reduced gradient is cast back to its dtype: 4 + 4 + 8 bytes per parameter
    # over the 8 shards, whatever dtype the reduction ran in
    for fp32_reduce in (True, False):
        assert model_state_bytes(1e9, dp=8, zero_stage=3, grad_reduce_in_fp32=fp32_reduce,
                                 master_copy=False) == (0.5e9, 0.5e9, 1e9)
    # Megatron-LM's scheme on the same shards: 16-bit parameters, fp32 gradients, fp32 main copy and moments
    assert model_state_bytes(1e9, dp=8, zero_stage=3) == (0.25e9, 0.5e9, 1.5e9)
    # fp32 training keeps no 16-bit copy either way
    assert model_state_bytes(1e9, precision="fp32", master_copy=False) == (4e9, 4e9, 8e9)
    # narrower moments: no main copy to count beside them
    assert optimizer_state_bytes("bf16", exp_avg="bf16", exp_avg_sq="bf16", master_copy=False) == 4.0
    assert optimizer_state_bytes("bf16", exp_avg="bf16", exp_avg_sq="bf16") == 8.0
    # a model built in bf16 (KempnerForge): bf16 shards and gradients, bf16 moments: 2 + 2 + 4
    assert model_state_bytes(1e9, dp=8, zero_stage=3, master_copy=False, master_dtype="bf16",
                             optimizer_bytes=4.0) == (0.25e9, 0.25e9, 0.5e9)


def test_a_torchtitan_step_holds_16_bytes_a_parameter_where_megatron_fsdp_holds_18(tmp_path) -> None:
    from simdist import api
    from tests.conftest import TOY_TOPOLOGY

    text = f"""
cluster: {{file: {TOY_TOPOLOGY}, num_nodes: 2}}
model: {{num_layers: 4, hidden_size: 1024, num_attention_heads: 8, seq_length: 1024, vocab_size: 4096, swiglu: true}}
parallel: {{dp: 8, zero_stage: 3}}
training: {{framework: FRAMEWORK, micro_batch_size: 1, global_batch_size: 16, grad_reduce_in_fp32: true}}
"""
    memory = {}
    for framework in ("megatron_core", "torchtitan"):
        path = tmp_path / f"{framework}.yaml"
        path.write_text(text.replace("FRAMEWORK", framework))
        memory[framework] = api.run(path).result["memory"][0]
    mega, titan = memory["megatron_core"], memory["torchtitan"]
    shard = mega["params_bytes"] / 2  # Megatron-FSDP's 16-bit shard: 2 bytes a parameter
    assert (titan["params_bytes"], titan["grads_bytes"], titan["optimizer_bytes"]) == pytest.approx(
        (4 * shard, 4 * shard, 8 * shard), rel=1e-12)
    assert (mega["grads_bytes"], mega["optimizer_bytes"]) == pytest.approx((4 * shard, 12 * shard), rel=1e-12)

    # the same model built in bf16 with bf16 moments (KempnerForge): 2 + 2 + 4 bytes a parameter
    path = tmp_path / "bf16.yaml"
    path.write_text(text.replace("FRAMEWORK", "torchtitan").replace(
        "grad_reduce_in_fp32: true}", "grad_reduce_in_fp32: true, main_params_dtype: bf16, exp_avg_dtype: bf16, "
        "exp_avg_sq_dtype: bf16}"))
    bf16 = api.run(path).result["memory"][0]
    assert (bf16["params_bytes"], bf16["grads_bytes"], bf16["optimizer_bytes"]) == pytest.approx(
        (2 * shard, 2 * shard, 4 * shard), rel=1e-12)
    # Megatron's master copy is fp32 or fp16 (--main-params-dtype): bf16 is refused, naming the field
    path.write_text(text.replace("FRAMEWORK", "megatron_core").replace(
        "grad_reduce_in_fp32: true}", "grad_reduce_in_fp32: true, main_params_dtype: bf16}"))
    with pytest.raises(SpecError) as err:
        api.run(path)
    assert err.value.field == "training.main_params_dtype"
