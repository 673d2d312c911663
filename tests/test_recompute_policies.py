"""Activation recompute policies (simdist.plan.recompute for time, simdist.plan.activations for memory), each checked
against a hand count on a tiny Llama-style layer, and in both fidelities."""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist import api
from simdist.plan.activations import activation_bytes_per_layer
from simdist.plan.layer_cost import layer_work
from simdist.plan.model import Model

# h 64, 4 heads of 16 (q 64 wide), 2 KV heads (k, v 32 wide each), SwiGLU ffn 128, 32 tokens
TINY = Model("tiny", "decoder", num_layers=4, hidden_size=64, num_attention_heads=4, num_query_groups=2,
             ffn_hidden_size=128, seq_length=32, vocab_size=256, swiglu=True)
T, H, Q, KV, F = 32, 64, 64, 32, 128


def _work(recompute, **kw):
    return layer_work(TINY, attention="flash", recompute=recompute, **kw)


def _gemm_flops(kernels):
    return sum(k.flops for k in kernels if k.kind == "gemm")


def test_full_redoes_the_whole_forward():
    w = _work("full")
    assert w.recompute == w.forward


def test_selective_modules():
    core = _work("selective")
    assert [k.name for k in core.recompute] == ["flash_attention"]  # Korthikanti's attention core
    norms = _work("selective", recompute_modules=("layernorm",))
    assert [k.name for k in norms.recompute] == ["rmsnorm", "rmsnorm"]
    mlp = _work("selective", recompute_modules=("mlp",))
    assert [k.name for k in mlp.recompute] == ["mlp_up", "swiglu", "mlp_down"]
    both = _work("selective", recompute_modules=("core_attn", "mlp"))
    assert len(both.recompute) == 4


def test_op_policy_redoes_every_second_matmul_and_every_pointwise_op():
    w = _work("op", style="eager")
    # torchtitan's counter over wq, wk, wv, wo, w1, w3, w2: wk (h x kv), wo (q x h) and w3 (h x f) are redone
    assert _gemm_flops(w.recompute) == pytest.approx(2 * T * (H * KV + Q * H + H * F))
    assert not [k for k in w.recompute if k.kind == "attention"]  # the attention's output is kept
    memory_kernels = [k for k in w.forward if k.kind == "memory"]
    assert [k for k in w.recompute if k.kind == "memory"] == memory_kernels


def test_memory_of_each_policy_by_hand():
    e = 2  # bf16

    def mem(recompute, **kw):
        return activation_bytes_per_layer(TINY, recompute=recompute, attention="flash", **kw)

    none = mem("none")
    lse = 4 * 4 * T  # fp32 log-sum-exp per head and token
    assert mem("full") == e * T * H
    assert mem("selective") == pytest.approx(none - lse)
    # layernorm: the two norms' outputs (the QKV and first MLP matmuls' inputs) are not kept
    assert mem("selective", modules=("core_attn", "layernorm")) == pytest.approx(none - lse - 2 * e * T * H)
    # mlp: SwiGLU's 2f-wide input and the down projection's f-wide input (3 x e x T x f)
    assert mem("selective", modules=("core_attn", "mlp")) == pytest.approx(none - lse - 3 * e * T * F)
    # op: the block's input, wq, wv, the attention's output, w1, w2 (16-bit) and the fp32 log-sum-exp
    assert mem("op") == pytest.approx(e * T * (H + Q + KV + Q + F + H) + lse)
    # eager modules keep each norm's fp32 upcast and normalised copy (4 B an element more than a fused norm's input)
    # and the SiLU output; the complex rotary keeps nothing more (validation.eager_saved)
    assert mem("none", style="eager") == pytest.approx(none + T * (2 * 4 * H + e * F))


SCENARIO = """
cluster: {{preset: dgx-h100, num_nodes: 1, placement: {{num_nodes: 1, gpus_per_node: 8}}}}
model: {{num_layers: 4, hidden_size: 1024, num_attention_heads: 8, num_query_groups: 4, ffn_hidden_size: 2816,
         seq_length: 2048, vocab_size: 4096, swiglu: true}}
parallel: {{dp: 8}}
training: {{global_batch_size: 16, attention: flash, recompute: {recompute}{extra}}}
"""


@pytest.mark.parametrize(("recompute", "extra"), [
    ("none", ""), ("selective", ", recompute_modules: [core_attn, mlp]"), ("op", ""), ("full", ""),
    ("full", ", recompute_method: every, recompute_num_layers: 2"),
    ("full", ", recompute_method: block, recompute_num_layers: 1"),
])
def test_both_fidelities_agree_and_order_the_policies(tmp_path: Path, recompute, extra):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(recompute=recompute, extra=extra))
    engine = api.run(path).result
    closed = api.run(path, fidelity="closed_form").result
    assert closed["step_time_s"] == pytest.approx(engine["step_time_s"], rel=1e-9)
    (tmp_path / "none.yaml").write_text(SCENARIO.format(recompute="none", extra=""))
    (tmp_path / "full.yaml").write_text(SCENARIO.format(recompute="full", extra=""))
    none, full = api.run(tmp_path / "none.yaml").result, api.run(tmp_path / "full.yaml").result
    assert none["step_time_s"] <= engine["step_time_s"] <= full["step_time_s"]
    act = [m["memory"][0]["activations_bytes"] for m in (none, engine, full)]
    assert act[0] >= act[1] >= act[2]


def test_every_and_block_recompute_their_share_of_layers(tmp_path: Path):
    def breakdown(extra):
        path = tmp_path / "s.yaml"
        path.write_text(SCENARIO.format(recompute="full", extra=extra))
        return api.run(path, fidelity="closed_form").result["breakdown"]["recompute_s"]

    all_layers = breakdown("")
    assert breakdown(", recompute_method: every, recompute_num_layers: 2") == pytest.approx(all_layers / 2)
    assert breakdown(", recompute_method: block, recompute_num_layers: 1") == pytest.approx(all_layers / 4)


def test_torchtitan_names():
    from simdist.spec.training import TrainingSpec

    op = TrainingSpec.model_validate({"global_batch_size": 8,
                                      "activation_checkpoint": {"mode": "selective", "selective_ac_option": "op"}})
    assert op.recompute == "op"
    every = TrainingSpec.model_validate({"global_batch_size": 8, "selective_ac_option": 2})
    assert (every.recompute, every.recompute_method, every.recompute_num_layers) == ("full", "every", 2)
    with pytest.raises(ValueError):
        TrainingSpec.model_validate({"global_batch_size": 8, "recompute_modules": ["mlp"]})


def test_op_policy_redoes_an_attention_its_save_list_does_not_name():
    # torchtitan's op_sac_save_list before PR #2095 (2025-12-01) named SDPA's flash and efficient ops, not its cuDNN
    # op: a block whose SDPA picked cuDNN runs its attention forward again in the backward, and keeps neither the
    # attention's output (T x q, 16-bit) nor its fp32 log-sum-exp
    kept = layer_work(TINY, attention="cudnn", recompute="op", style="eager")
    redone = layer_work(TINY, attention="cudnn", recompute="op", style="eager", op_keeps_attention=False)
    attention = [k for k in redone.forward if k.kind == "attention"]
    assert [k for k in redone.recompute if k.kind == "attention"] == attention
    assert [k for k in redone.recompute if k.kind != "attention"] == list(kept.recompute)

    def mem(keeps):
        return activation_bytes_per_layer(TINY, recompute="op", attention="cudnn", op_keeps_attention=keeps)
    assert mem(True) - mem(False) == pytest.approx(2 * T * Q + 4 * 4 * T)


def test_op_policy_save_list_in_both_fidelities(tmp_path: Path):
    # a scenario whose save list leaves out its attention kernel (cuDNN) recomputes it: more recompute time, less
    # memory, the two fidelities agreeing; a save list without recompute: op is refused
    def run(extra, fidelity=None):
        path = tmp_path / "s.yaml"
        path.write_text(SCENARIO.format(recompute="op", extra=extra).replace("attention: flash", "attention: cudnn"))
        return api.run(path, fidelity=fidelity).result

    saved, redone = run(""), run(", op_sac_saved_attention: [flash, efficient, flex]")
    assert redone["step_time_s"] == pytest.approx(run(", op_sac_saved_attention: [flash, efficient, flex]",
                                                      "closed_form")["step_time_s"], rel=1e-9)
    assert redone["breakdown"]["recompute_s"] > saved["breakdown"]["recompute_s"]
    assert redone["memory"][0]["activations_bytes"] < saved["memory"][0]["activations_bytes"]
    assert run(", op_sac_saved_attention: [cudnn]")["step_time_s"] == saved["step_time_s"]
    from simdist.spec.training import TrainingSpec
    with pytest.raises(ValueError, match="op_sac_saved_attention"):
        TrainingSpec.model_validate({"global_batch_size": 8, "op_sac_saved_attention": ["flash"]})


def test_op_policy_save_list_by_kernel_family():
    from simdist.plan.recompute import OP_SAC_SAVED_ATTENTION, op_saves_attention

    assert all(op_saves_attention(k, OP_SAC_SAVED_ATTENTION) for k in ("flash2", "efficient", "cudnn", "flex"))
    assert not any(op_saves_attention(k, OP_SAC_SAVED_ATTENTION) for k in ("flash3", "flash4", "triton",
                                                                          "materialized"))
    assert not op_saves_attention("cudnn", ("flash", "efficient", "flex"))  # torchtitan before 2025-12-01
    assert op_saves_attention("flash2", ("flash",))
