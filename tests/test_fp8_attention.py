"""training.fp8_attention (Megatron-LM --fp8-dot-product-attention): Transformer Engine's FP8 DotProductAttention runs
cuDNN's fp8 kernels at their measured fp8 / bf16 throughput ratio (simdist/hardware/data/attention_fp8.csv) and keeps
Q, K and V at 1 byte an element; refused where Transformer Engine cannot run it."""

from __future__ import annotations

import pytest

from simdist import api
from simdist.analytic.step import CommPricer, analytic_step
from simdist.errors import SpecError
from simdist.hardware.attention import attention_efficiency, fp8_ratio
from simdist.hardware.gpus import GPU_PRESETS
from simdist.plan.activations import activation_bytes_per_layer
from simdist.plan.layer_cost import layer_work
from simdist.plan.layout import step_config_of
from simdist.plan.model import Model
from simdist.plan.model_presets import resolve_model
from simdist.spec import ModelSpec
from simdist.spec.scenario import ScenarioSpec

GB200, GB300, H100 = GPU_PRESETS["gb200"], GPU_PRESETS["gb300"], GPU_PRESETS["h100-sxm"]
# Llama-style: 4 query heads of 64 over 2 key-value groups (GQA), 128 tokens
TINY = Model("tiny", "decoder", num_layers=2, hidden_size=256, num_attention_heads=4, num_query_groups=2,
             ffn_hidden_size=512, seq_length=128, vocab_size=1000, swiglu=True)


def test_the_fp8_kernel_runs_at_its_measured_ratio_to_bf16_in_one_benchmark_file() -> None:
    # cudnn-frontend's llama3.1 suite on GB200 (cuDNN 9.22): causal forward at 4096 tokens 1408 TFLOP/s in bf16, 1805
    # in fp8, 1685 in mxfp8; the backward 1148, 1178, 1054
    bf16 = attention_efficiency(GB200, "cudnn", "forward", True, 4096, 128)
    assert attention_efficiency(GB200, "cudnn", "forward", True, 4096, 128, "fp8") == pytest.approx(
        bf16 * 1805 / 1408, rel=1e-12)
    assert attention_efficiency(GB200, "cudnn", "forward", True, 4096, 128, "mxfp8") == pytest.approx(
        bf16 * 1685 / 1408, rel=1e-12)
    assert fp8_ratio("blackwell", "cudnn", "mxfp8", "backward", True, 4096) == pytest.approx(1054 / 1148, rel=1e-12)
    # halfway between 4096 and 8192 in log2(seq): the mean of the two ratios; clamped past the measured 2k-32k
    mid = fp8_ratio("blackwell", "cudnn", "fp8", "forward", False, 4096 * 2 ** 0.5)
    assert mid == pytest.approx((2093 / 1599 + 2241 / 1771) / 2, rel=1e-12)
    assert fp8_ratio("blackwell", "cudnn", "fp8", "forward", False, 1024) == pytest.approx(1881 / 1433, rel=1e-12)
    # GB300 has its own figures (2532 / 1703 causal forward at 4096); Hopper has none: its bf16 rate
    assert fp8_ratio("blackwell_ultra", "cudnn", "fp8", "forward", True, 4096) == pytest.approx(2532 / 1703)
    assert attention_efficiency(H100, "cudnn", "forward", True, 4096, 128, "fp8") == attention_efficiency(
        H100, "cudnn", "forward", True, 4096, 128)
    assert fp8_ratio("blackwell", "cudnn", "bf16", "forward", True, 4096) == 1.0


def test_the_attention_kernels_carry_the_recipes_data_type() -> None:
    def dtypes(**kw) -> set[str]:
        w = layer_work(TINY, attention="cudnn", **kw)
        return {k.attention.dtype for k in (*w.forward, *w.backward) if getattr(k, "attention", None) is not None}

    assert dtypes(precision="fp8", fp8_recipe="mxfp8", fp8_attention=True) == {"mxfp8"}
    assert dtypes(precision="fp8", fp8_recipe="tensorwise", fp8_attention=True) == {"fp8"}
    assert dtypes(precision="fp8", fp8_recipe="delayed", fp8_attention=True) == {"fp8"}
    assert dtypes(precision="fp8", fp8_recipe="mxfp8") == {"bf16"}  # fp8 GEMMs, bf16 attention: Megatron's default
    assert dtypes(precision="bf16", fp8_attention=True) == {"bf16"}


def test_fp8_attention_keeps_q_k_and_v_at_one_byte() -> None:
    # per token: Q is 4 x 64 = 256 wide, K and V 2 x 64 = 128 each; 2 bytes -> 1 byte an element saves 512 B a token
    kw = dict(precision="fp8", attention="cudnn", recompute="none")
    saved = (activation_bytes_per_layer(TINY, **kw) - activation_bytes_per_layer(TINY, fp8_attention=True, **kw))
    assert saved == 128 * (256 + 128 + 128)
    # tp 2 splits the query heads and the key-value groups: half of it
    saved_tp = (activation_bytes_per_layer(TINY, tp=2, **kw)
                - activation_bytes_per_layer(TINY, tp=2, fp8_attention=True, **kw))
    assert saved_tp == saved / 2
    # in bf16 the flag changes nothing (the scenario check refuses it there)
    assert activation_bytes_per_layer(TINY, precision="bf16", attention="cudnn", fp8_attention=True) == \
        activation_bytes_per_layer(TINY, precision="bf16", attention="cudnn")


def test_mla_keeps_q_k_and_v_in_fp8_and_its_up_projection_recompute_drops_what_it_kept() -> None:
    ds = resolve_model(ModelSpec(preset="deepseek-v3", seq_length=512))
    a, d_qk, d_v = ds.num_attention_heads, ds.qk_head_dim + ds.qk_pos_emb_head_dim, ds.v_head_dim
    kw = dict(precision="fp8", attention="cudnn", recompute="none", layer=0)
    saved = activation_bytes_per_layer(ds, **kw) - activation_bytes_per_layer(ds, fp8_attention=True, **kw)
    assert saved == 512 * (2 * a * d_qk + a * d_v)  # Q, K (d_qk wide a head) and V, 1 byte less an element each
    sel = dict(kw, recompute="selective", modules=("mla_up_proj",))
    # recomputing the up projections drops Q, K, V and the projection input whatever they were kept at
    assert activation_bytes_per_layer(ds, **sel) == activation_bytes_per_layer(ds, fp8_attention=True, **sel)


SPEC = {"cluster": {"preset": "gb200-nvl72", "num_nodes": 1, "placement": {"num_nodes": 1, "gpus_per_node": 4}},
        "model": {"num_layers": 4, "hidden_size": 4096, "num_attention_heads": 32, "num_query_groups": 8,
                  "seq_length": 4096, "vocab_size": 32000, "swiglu": True, "ffn_hidden_size": 14336},
        "parallel": {"tp": 4, "sequence_parallel": True},
        "training": {"micro_batch_size": 1, "global_batch_size": 1, "precision": "fp8", "fp8_recipe": "mxfp8",
                     "attention": "cudnn", "host_overhead": {"launch": "0 us", "dispatch": "0 us"}}}
# (host costs off: the kernels' prices are what these tests compare; four TP 4 layers on a Grace host issue their
# kernels more slowly than the GPU runs them at the default per-op cost, and the step would be the host's)


def _step(fidelity: str = "closed_form", **training):
    spec = ScenarioSpec.model_validate({**SPEC, "training": {**SPEC["training"], **training}})
    topology = api.cluster_of(spec)
    return step_config_of(spec, topology, resolve_model(spec.model)), topology


def test_both_fidelities_price_the_fp8_kernels_and_the_aliases_name_the_field() -> None:
    plain, topo = _step()
    fp8, _ = _step(fp8_attention=True)
    assert fp8.execution.fp8_attention and not plain.execution.fp8_attention
    for alias in ("fp8_dot_product_attention", "fp8_dpa"):
        assert _step(**{alias: True})[0].execution == fp8.execution
    a = analytic_step(plain, CommPricer(topo)).step_time_s
    b = analytic_step(fp8, CommPricer(topo)).step_time_s
    assert a != b  # mxfp8 attention: forward faster, backward slower at 4096 tokens (the ratios above)
    from simdist.predict.step import predict_step

    engine = {flag: predict_step(ScenarioSpec.model_validate(
        {**SPEC, "training": {**SPEC["training"], "fp8_attention": flag}}), topo).result["step_time_s"]
              for flag in (False, True)}
    assert engine[True] - engine[False] == pytest.approx(b - a, rel=1e-6)


@pytest.mark.parametrize(("training", "message"), [
    ({"precision": "bf16", "fp8_recipe": "delayed"}, "needs precision fp8"),
    ({"attention": "flash2"}, "needs attention cudnn"),
    ({"fp8_recipe": "blockwise"}, "delayed, tensorwise or mxfp8 recipe"),
])
def test_fp8_attention_where_transformer_engine_cannot_run_it_is_one_clear_error(training, message) -> None:
    with pytest.raises(SpecError, match=message) as err:
        _step(fp8_attention=True, **training)
    assert err.value.field == "training.fp8_attention"
