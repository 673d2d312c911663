"""What a step's compute is made of (simdist.plan.kernel_mix): the kernels the chunk costs price, by kind."""

from __future__ import annotations

import pytest

from simdist import api
from simdist.plan.chunk_cost import chunk_cost
from simdist.plan.kernel_mix import kernel_mix
from simdist.predict.step import checked_step

K22 = "scenarios/published/korthikanti2022-22b.yaml"


def _cfg(assignments: list[str]):
    sc = api.load_scenario(K22, assignments)
    return checked_step(sc.spec, sc.topology)[1]


@pytest.mark.parametrize("assignments", [
    [],
    ["training.recompute=full", "parallel.sequence_parallel=false"],
    ["cluster.num_nodes=2", "parallel.pp=2", "training.global_batch_size=16"],
])
def test_the_mix_is_made_of_the_kernels_the_chunk_costs_price(assignments):
    # The 22B layer's kernels last tens to hundreds of microseconds, far longer than the host takes to issue them,
    # and nothing here adds a tax: every chunk's forward, backward and recompute seconds are its kernels' roofline
    # times, so the mix over every model part adds up to the chunk costs' sum.
    cfg = _cfg(assignments)
    last = cfg.num_parts - 1
    costs = [chunk_cost(cfg, cfg.part_layers(p), p == 0, p == last) for p in range(cfg.num_parts)]
    mix = kernel_mix(cfg)
    assert mix.total_s == pytest.approx(sum(c.forward_s + c.backward_s + c.recompute_s for c in costs), rel=1e-9)
    assert sum(mix.share(k) for k in ("gemm", "attention", "memory")) == pytest.approx(1.0, rel=1e-12)
    assert mix.share("gemm") > 0.5 and mix.num_kernels > 0
    assert mix.kernels_per_ms == pytest.approx(mix.num_kernels / (mix.total_s * 1e3), rel=1e-12)


def test_full_recompute_adds_the_forward_kernels_again():
    # recompute full reruns each layer's forward before its backward: the same kernels once more (the head's and
    # embedding's are not recomputed), so the count grows by the layers' forward kernels.
    plain, full = _cfg(["parallel.sequence_parallel=false"]), _cfg(
        ["training.recompute=full", "parallel.sequence_parallel=false"])
    a, b = kernel_mix(plain), kernel_mix(full)
    assert b.num_kernels > a.num_kernels and b.gemm_s > a.gemm_s * 1.3


def test_fp8_gemms_shrink_the_gemm_share():
    # H100 FP8: the GEMMs run about 1.8x faster and the casts add memory-bound kernels; attention stays bf16.
    bf16 = _cfg(["cluster.preset=dgx-h100"])
    fp8 = _cfg(["cluster.preset=dgx-h100", "training.precision=fp8"])
    a, b = kernel_mix(bf16), kernel_mix(fp8)
    assert b.gemm_s < a.gemm_s * 0.65 and b.memory_s > a.memory_s and b.attention_s == pytest.approx(a.attention_s)
    assert b.share("gemm") < a.share("gemm")


@pytest.mark.parametrize("scopes", [["attn"], ["attn", "mlp"]])
def test_replayed_parts_keep_the_chunk_costs_sum_and_add_one_copy_per_replay(scopes):
    # Megatron-Core's partial CUDA graphs (simdist.plan.graph_scope): the replayed kernels at the graph's gap, and a
    # copy of the layer's hidden states before each replay: one a layer and direction, attn and mlp being one graph
    # (TransformerLayer._te_cuda_graph_capture runs both halves in one capture), one stretch of kernels; the 22B layer
    # is GPU-bound, so the chunk costs are the mix.
    eager, graphed = _cfg([]), _cfg([f"training.cuda_graph_scope=[{','.join(scopes)}]"])
    last = graphed.num_parts - 1
    costs = [chunk_cost(graphed, graphed.part_layers(p), p == 0, p == last) for p in range(graphed.num_parts)]
    a, b = kernel_mix(eager), kernel_mix(graphed)
    assert b.total_s == pytest.approx(sum(c.forward_s + c.backward_s + c.recompute_s for c in costs), rel=1e-9)
    layers = graphed.model.num_layers // graphed.mesh.pp
    assert b.num_kernels - a.num_kernels == 2 * layers
    assert b.gaps_s < a.gaps_s
