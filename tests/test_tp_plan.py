"""Where a TP module's input changes layout (training.tp_input_layouts), what a compiled full recompute redoes, and
the loss without loss parallelism (training.loss_parallel): simdist's per-layer collectives against hand counts, and
against the collectives torch really issues for a block planned as KempnerForge plans it (validation.tp_plan_check,
two gloo ranks; skipped without torch)."""

from __future__ import annotations

import shutil

import pytest

from simdist.errors import SpecError
from simdist.plan.layer_cost import layer_work
from simdist.plan.model import Model
from simdist.plan.model_ends import head_work
from simdist.plan.tp_plan import forward_gathers, input_reductions

# validation.tp_plan_check's block: h 64, 4 query heads of 16, one K/V head (a quarter of h), SwiGLU of 128
BLOCK = Model("tp-plan-block", "decoder", num_layers=1, hidden_size=64, num_attention_heads=4, num_query_groups=1,
              ffn_hidden_size=128, seq_length=32, vocab_size=256, swiglu=True)
LLAMA = Model("llama-ish", "decoder", num_layers=2, hidden_size=1024, num_attention_heads=8, num_query_groups=2,
              ffn_hidden_size=4096, seq_length=2048, vocab_size=32000, swiglu=True)


def counts(model: Model, *, tp_inputs: str, style: str, recompute: str, sp: bool = True,
           early_stop: bool = False) -> dict[str, int]:
    """{op: collectives of one layer's forward, backward and recompute}."""
    w = layer_work(model, tp=2, sequence_parallel=sp, micro_batch_size=2, recompute=recompute, style=style,
                   tp_inputs=tp_inputs, early_stop=early_stop)
    out: dict[str, int] = {}
    for c in w.comm:
        if c.axis == "tp":
            out[c.op] = out.get(c.op, 0) + 1
    return out


@pytest.mark.parametrize(("style", "recompute", "gathers", "scatters"), [
    # forward: 5 gathers (q, k, v, gate, up) + 2 scatters (o, down); backward: 2 gathers + 5 scatters
    ("eager", "none", 7, 7),
    # compiled: the forward's gathers of one input merged (2)
    ("compiled", "none", 4, 7),
    # compiled full recompute: the forward again but for the down projection's scatter (2 gathers, 1 scatter)
    ("compiled", "full", 6, 8),
    # eager full recompute: the whole forward again (5 gathers, 2 scatters)
    ("eager", "full", 12, 9),
])
def test_per_projection_inputs_issue_one_collective_per_projection(style, recompute, gathers, scatters):
    assert counts(LLAMA, tp_inputs="per_projection", style=style, recompute=recompute) == {
        "all_gather": gathers, "reduce_scatter": scatters}


def test_eager_early_stop_redoes_the_down_projection_but_not_its_scatter():
    # torch's non-reentrant checkpoint stops once the down projection has packed its input: 5 + 1 redone
    w = layer_work(LLAMA, tp=2, sequence_parallel=True, micro_batch_size=2, recompute="full", style="eager",
                   tp_inputs="per_projection", early_stop=True)
    assert sum(c.op == "reduce_scatter" for c in w.comm) == 8 and sum(c.op == "all_gather" for c in w.comm) == 12
    names = [k.name for k in w.forward]
    assert [k.name for k in w.recompute] == names[:names.index("mlp_down") + 1]
    # a compiled layer ignores it (the partitioner's cut), an MoE layer's recompute is whole either way
    compiled = layer_work(LLAMA, tp=2, sequence_parallel=True, micro_batch_size=2, recompute="full",
                          style="compiled", early_stop=True)
    assert "mlp_down" not in [k.name for k in compiled.recompute]


@pytest.mark.parametrize("style", ["fused", "eager", "compiled"])
def test_module_inputs_keep_megatrons_four_and_four(style):
    assert counts(LLAMA, tp_inputs="module", style=style, recompute="none") == {"all_gather": 4, "reduce_scatter": 4}


def test_without_sequence_parallelism_each_projection_all_reduces_its_input_gradient():
    # Megatron: 2 forward all-reduces (o, down), 2 backward (the column regions); per projection: 2 + 5
    assert counts(LLAMA, tp_inputs="module", style="eager", recompute="none", sp=False) == {"all_reduce": 4}
    assert counts(LLAMA, tp_inputs="per_projection", style="eager", recompute="none", sp=False) == {"all_reduce": 7}


def test_compiled_full_recompute_skips_the_down_projection_and_nothing_else():
    eager = layer_work(LLAMA, tp=2, sequence_parallel=True, micro_batch_size=2, recompute="full", style="eager")
    compiled = layer_work(LLAMA, tp=2, sequence_parallel=True, micro_batch_size=2, recompute="full",
                          style="compiled")
    assert [k.name for k in eager.recompute] == [k.name for k in eager.forward]
    gemms = [k.name for k in compiled.recompute if k.kind == "gemm"]
    assert gemms == ["qkv", "projection", "mlp_up"]
    # the forward's kernels up to the down projection, none after it (its residual add)
    down = [k.name for k in compiled.forward].index("mlp_down")
    assert [k.name for k in compiled.recompute] == [k.name for k in compiled.forward[:down]]
    assert compiled.forward[down + 1:] and all(k.kind == "memory" for k in compiled.forward[down + 1:])


def test_loss_without_loss_parallelism_gathers_the_logits_and_covers_the_vocabulary():
    m, v, tp, bpe = 2 * 2048, 32000, 4, 2
    split = head_work(LLAMA, tp=tp, sequence_parallel=True, micro_batch_size=2, style="eager")
    whole = head_work(LLAMA, tp=tp, sequence_parallel=True, micro_batch_size=2, style="eager", loss_parallel=False)
    gathers = [c.nbytes for c in whole.comm if c.op == "all_gather" and c.phase == "forward"]
    assert gathers == [m * 1024 * bpe, m * v * bpe]  # the norm's output, then the logits
    assert not [c for c in whole.comm if c.op == "all_reduce"]  # no vocab-parallel reductions
    # the loss kernels after the logits GEMM (eager: upcast, log_softmax, nll_loss) read and write tp times more
    after = [k.name for k in split.forward].index("logits") + 1
    loss = [k.hbm_bytes for k in split.forward[after:]]
    loss_whole = [k.hbm_bytes for k in whole.forward[after:]]
    assert len(loss) == 3 and [b * tp for b in loss] == pytest.approx(loss_whole)
    # the model FLOPs do not change (the logits GEMM is still the rank's vocabulary shard)
    assert whole.model_flops == split.model_flops


def test_bad_layout_name_names_the_field():
    with pytest.raises(SpecError) as err:
        forward_gathers("per_module", 3, compiled=False)
    assert err.value.field == "training.tp_input_layouts"
    assert input_reductions("module", 3) == 1


def test_scenario_fields_and_torchtitans_name(tmp_path):
    from simdist.spec.training import TrainingSpec

    base = {"global_batch_size": 8}
    t = TrainingSpec.model_validate({**base, "tp_input_layouts": "per_projection", "disable_loss_parallel": True})
    assert (t.tp_input_layouts, t.loss_parallel) == ("per_projection", False)
    assert TrainingSpec.model_validate({**base, "disable_loss_parallel": False}).loss_parallel is True
    with pytest.raises(Exception, match="contradicts"):
        TrainingSpec.model_validate({**base, "disable_loss_parallel": True, "loss_parallel": True})


torch = pytest.importorskip("torch", reason="validation extra (torch) not installed")


def test_torch_issues_what_simdist_counts_for_an_eager_block():
    from validation.tp_plan_check import count_collectives

    measured = count_collectives("eager", False, timeout_s=120)
    expected = counts(BLOCK, tp_inputs="per_projection", style="eager", recompute="none")
    assert (measured["all_gather"], measured["reduce_scatter"]) == (expected["all_gather"], expected["reduce_scatter"])


def test_torch_issues_what_simdist_counts_for_an_eager_checkpointed_block():
    from validation.tp_plan_check import count_collectives

    measured = count_collectives("eager", True, timeout_s=120)
    expected = counts(BLOCK, tp_inputs="per_projection", style="eager", recompute="full", early_stop=True)
    assert (measured["all_gather"], measured["reduce_scatter"]) == (expected["all_gather"], expected["reduce_scatter"])


@pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                    reason="Inductor's CPU kernels need a C++ compiler")
def test_torch_compile_merges_the_gathers_and_skips_the_down_projection_in_recompute():
    from validation.tp_plan_check import count_collectives

    measured = count_collectives("compiled", True, timeout_s=240)
    expected = counts(BLOCK, tp_inputs="per_projection", style="compiled", recompute="full")
    assert (measured["all_gather"], measured["reduce_scatter"]) == (expected["all_gather"], expected["reduce_scatter"])
    # 7 projections' forward, 14 gradient matmuls, and the recompute's 6 (all but the down projection)
    assert measured["mm"] == 7 + 14 + 6
    # Inductor's concatenations around them (simdist.plan.tp_plan.layout_copy): one per collective at batch 2
    from tests.test_tp_layout_copies import copies

    assert measured["copies"] == sum(copies(BLOCK, style="compiled", batch=2, recompute="full").values()) == 14


def test_host_time_harness_runs_the_same_block_plain_and_under_dtensor():
    # The harness's op counts, not its times (no wall-clock assertions): under the DTensor plan the block runs the
    # plain block's matmuls and element-wise ops plus DTensor's redistributions and views, so it runs more ATen ops;
    # full checkpointing runs the forward's again in the backward, plain and under DTensor alike.
    from validation.tp_plan_check import host_time

    bare, checkpointed = host_time(False, repeats=3, timeout_s=120), host_time(True, repeats=3, timeout_s=120)
    for t in (bare, checkpointed):
        assert {"plain_s", "dtensor_s"} <= set(t)  # (the times themselves are not asserted: they are this CPU's)
        assert t["dtensor_aten_ops"] > t["plain_aten_ops"] > 0
    assert checkpointed["plain_aten_ops"] > bare["plain_aten_ops"]
    assert checkpointed["dtensor_aten_ops"] > bare["dtensor_aten_ops"]
