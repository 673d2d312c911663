"""FP8 grouped experts' rows padded to the GEMMs' alignment (simdist.plan.moe_padding): Transformer Engine's padding
copies behind the alltoall and allgather dispatchers, the router's padding, the flex dispatcher's padded permute;
counted by hand on tiny shapes."""

from __future__ import annotations

import dataclasses

import pytest

from simdist.plan.expert_parallel import ExpertParallel, routed_tokens
from simdist.plan.kernel_work import LayerShape
from simdist.plan.layer_cost import layer_work
from simdist.plan.model import Model
from simdist.plan.moe_cost import _sync_point
from simdist.plan.moe_padding import align_rows, copies_padding, padding_kernels, router_pads
from tests.cli_harness import run_cli

# h 64, 8 experts of width 128, top-2, 128 tokens, every layer MoE
TINY = Model("tiny-moe", "decoder", num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=4,
             ffn_hidden_size=256, seq_length=128, vocab_size=1000, swiglu=True, num_experts=8, moe_router_topk=2,
             moe_ffn_hidden_size=128)
FP8 = {"layer": 1, "attention": "flash", "precision": "fp8", "fp8_recipe": "tensorwise"}


def _names(kernels) -> list[str]:
    return [k.name for k in kernels]


def _shape(recipe: str | None) -> LayerShape:
    return LayerShape(micro_batch_size=1, seq_q=128, seq_k=128, tp=1, cp=1, sequence_parallel=False, bpe=2,
                      recipe=recipe, dropout=False)


def test_the_alignment_is_the_recipes():
    assert align_rows("mxfp8") == 32
    assert align_rows("tensorwise") == align_rows("delayed") == align_rows("blockwise") == 16
    assert align_rows(None) == 1


def test_which_path_pads_where():
    alltoall, routed = ExpertParallel(ep=4), ExpertParallel(ep=4, padding_for_quantization=True)
    # copies: FP8 grouped experts behind alltoall / allgather, unless the router pads
    assert copies_padding("tensorwise", alltoall)
    assert copies_padding("mxfp8", ExpertParallel(ep=4, dispatcher="allgather"))
    assert not copies_padding("tensorwise", routed)
    # DeepEP / HybridEP pad in their permute
    assert not copies_padding("tensorwise", ExpertParallel(ep=4, dispatcher="flex", kernel="deepep"))
    assert not copies_padding(None, alltoall)  # bf16: no padding
    assert not copies_padding("tensorwise", ExpertParallel(ep=4, grouped_gemm=False))  # SequentialMLP
    assert router_pads("tensorwise", routed)
    assert not router_pads("tensorwise", dataclasses.replace(routed, dispatcher="flex", kernel="deepep"))
    assert not router_pads(None, routed)


def test_the_copies_move_what_the_module_docstring_counts():
    # 10 rows of h 4, bf16, fp32 probabilities: every copy reads and writes its tensor once
    before, after, first, last = padding_kernels(10, 4, 2, 4)
    assert _names(before) == ["moe_fp8_pad", "moe_fp8_pad_probs"] and _names(after) == ["moe_fp8_unpad"]
    assert _names(first) == ["moe_fp8_unpad_grad"] and _names(last) == ["moe_fp8_pad_probs_grad", "moe_fp8_pad_grad"]
    assert [k.hbm_bytes for k in before + after + first + last] == [160, 80, 160, 160, 80, 160]
    assert all(k.kind == "memory" and k.flops == 0 for k in before + after + first + last)


def test_routed_rows_gain_the_expected_padding():
    # 128 tokens x top-2 over ep 4: a balanced rank's 256 rows, 128 on each of its 2 experts
    ep4 = ExpertParallel(ep=4)
    assert routed_tokens(TINY, _shape(None), ep4).per_expert == 128
    # FP8: (16 - 1) / 2 = 7.5 rows more per expert on average (ceil: 136); MXFP8 15.5 (144)
    assert routed_tokens(TINY, _shape("tensorwise"), ep4).per_expert == 136
    assert routed_tokens(TINY, _shape("mxfp8"), ep4).per_expert == 144
    # padded in the router: every source rank's count, 4 x 7.5 = 30 rows more per expert (158), and each rank sends
    # 8 experts x 7.5 = 60 rows more than its 256
    padded = routed_tokens(TINY, _shape("tensorwise"), dataclasses.replace(ep4, padding_for_quantization=True))
    assert padded.per_expert == 158 and padded.sent == 256 + 60
    # model FLOPs never count the padding
    assert padded.balanced == routed_tokens(TINY, _shape(None), ep4).balanced == 256


def test_an_fp8_alltoall_layer_copies_around_its_experts():
    work = layer_work(TINY, experts=ExpertParallel(ep=4), **FP8)
    fwd, bwd = _names(work.forward), _names(work.backward)
    # the rows padded before fc1's casts and GEMM, unpadded after fc2
    assert fwd.index("moe_sort_chunks") < fwd.index("moe_fp8_pad") < fwd.index("expert_fc1")
    assert fwd.index("expert_fc2") < fwd.index("moe_fp8_unpad") < fwd.index("moe_unsort_chunks")
    assert bwd.index("moe_unsort_chunks_grad") < bwd.index("moe_fp8_unpad_grad") < bwd.index("expert_fc2_input_grad")
    assert bwd.index("expert_fc1_weight_grad") < bwd.index("moe_fp8_pad_grad") < bwd.index("moe_sort_chunks_grad")
    # the padded rows: 2 experts x 136 = 272 rows of h 64 at 2 B, read and written
    (pad,) = [k for k in work.forward if k.name == "moe_fp8_pad"]
    assert pad.hbm_bytes == 272 * 64 * 2 * 2
    # the router's padding removes the copies and moves the host's wait before permutation 1
    routed = layer_work(TINY, experts=ExpertParallel(ep=4, padding_for_quantization=True), **FP8)
    assert not any(n.startswith("moe_fp8_") for n in _names(routed.forward) + _names(routed.backward))
    # (a sync's index counts the kernels issued before it)
    assert routed.host_syncs[0] == _names(routed.forward).index("moe_permute") < work.host_syncs[0]
    # bf16 and the flex dispatcher: no copies
    for other in (layer_work(TINY, layer=1, attention="flash", experts=ExpertParallel(ep=4)),
                  layer_work(TINY, experts=ExpertParallel(ep=4, dispatcher="flex", kernel="deepep"), **FP8)):
        assert not any(n.startswith("moe_fp8_") for n in _names(other.forward))


def test_the_sync_point_follows_the_router_padding():
    assert _sync_point("alltoall", 4, 2, None) == "before_ep_alltoall"
    assert _sync_point("alltoall", 4, 2, None, router_padding=True) == "before_permutation_1"
    assert _sync_point("flex", 4, 2, None, router_padding=True) == "before_ep_alltoall"


@pytest.mark.parametrize(("model", "precision", "words"), [
    ("{preset: gpt3-175b, num_layers: 2}", "fp8", "without experts"),
    ("{preset: qwen3-30b-a3b, num_layers: 2}", "bf16", "precision is bf16"),
])
def test_router_padding_where_it_pads_nothing_is_one_clear_error(tmp_path, model, precision, words):
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"cluster: {{preset: dgx-h100, num_nodes: 1}}\nmodel: {model}\nparallel: {{dp: 8}}\n"
                        f"training: {{micro_batch_size: 1, global_batch_size: 8, precision: {precision}, "
                        "moe_router_padding_for_fp8: true}\n")
    result = run_cli(["run", str(scenario)])
    assert result.one_line_error() and "training.moe_router_padding_for_quantization" in result.err
    assert words in result.err
