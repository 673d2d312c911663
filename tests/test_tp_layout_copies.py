"""The copies DTensor makes around a sequence-parallel collective of batch-first activations
(simdist.plan.tp_plan.layout_copy): one of the whole input before every reduce-scatter, one of the whole output after
every all-gather of a local batch above 1, none in Megatron-LM's sequence-first style; the eager copy before a
reduce-scatter of micro-batch 2 at the bandwidth KempnerForge's H200 trace measured."""

from __future__ import annotations

import csv

import pytest

from simdist.hardware.compute import compute_efficiency, kernel_time_s
from simdist.hardware.gpus import gpu_preset
from simdist.plan.kernel_work import LayerShape
from simdist.plan.layer_cost import layer_work
from simdist.plan.model import Model
from simdist.plan.tp_plan import layout_copy
from tests.conftest import REPO

LLAMA = Model("llama-ish", "decoder", num_layers=2, hidden_size=1024, num_attention_heads=8, num_query_groups=2,
              ffn_hidden_size=4096, seq_length=2048, vocab_size=32000, swiglu=True)


def copies(model: Model, *, style: str, batch: int, recompute: str = "none", tp_inputs: str = "per_projection",
           sp: bool = True, async_tp: bool = False) -> dict[str, int]:
    """{copy kernel: count in one layer's forward, backward and recompute}."""
    w = layer_work(model, tp=2, sequence_parallel=sp, micro_batch_size=batch, recompute=recompute, style=style,
                   tp_inputs=tp_inputs, early_stop=style == "eager", async_tp=async_tp)
    out: dict[str, int] = {}
    for k in (*w.forward, *w.backward, *w.recompute):
        if k.name.startswith("tp_") and k.name.endswith("_copy"):
            out[k.name] = out.get(k.name, 0) + 1
    return out


def shape(style: str, batch: int, *, sp: bool = True, tp: int = 4) -> LayerShape:
    return LayerShape(batch, 4096, 4096, tp, 1, sp, 2, None, dropout=False, style=style, norm="rmsnorm")


def test_a_copy_per_scatter_and_per_gather_of_a_batch_above_one():
    # eager per-projection plan: 7 all-gathers and 7 reduce-scatters a layer (tests/test_tp_plan.py)
    assert copies(LLAMA, style="eager", batch=2) == {"tp_gather_copy": 7, "tp_scatter_copy": 7}
    # a local batch of 1: the gathered chunks are a view (pytorch/pytorch PR #169404)
    assert copies(LLAMA, style="eager", batch=1) == {"tp_scatter_copy": 7}
    # compiled, the module plan: Megatron's 4 and 4, each with its copy
    assert copies(LLAMA, style="compiled", batch=2, tp_inputs="module") == {"tp_gather_copy": 4, "tp_scatter_copy": 4}
    # Megatron-LM's sequence-first activations: none; no sequence parallelism (all-reduces): none
    assert copies(LLAMA, style="fused", batch=2) == {}
    assert copies(LLAMA, style="eager", batch=2, sp=False) == {}
    # async TP: Inductor's fused_all_gather_matmul / fused_matmul_reduce_scatter move each shard into place
    assert copies(LLAMA, style="compiled", batch=2, tp_inputs="module", async_tp=True) == {}


def test_copy_kernels_by_hand():
    nbytes = 2 * 4096 * 5120 * 2  # a micro-batch of 2 x 4096 tokens of width 5120 in bf16: 80 MiB
    assert layout_copy("all_gather", shape("fused", 2), nbytes) == []
    assert layout_copy("all_gather", shape("eager", 1), nbytes) == []
    (gather,) = layout_copy("all_gather", shape("eager", 2), nbytes)
    (scatter,) = layout_copy("reduce_scatter", shape("eager", 2), nbytes)
    assert gather.hbm_bytes == scatter.hbm_bytes == 2 * nbytes and gather.kind == scatter.kind == "memory"
    assert scatter.strided_copy and not gather.strided_copy  # chunks of a batch-first tensor along dim 1: strided
    assert not layout_copy("reduce_scatter", shape("eager", 1), nbytes)[0].strided_copy  # contiguous at batch 1
    assert not layout_copy("reduce_scatter", shape("compiled", 2), nbytes)[0].strided_copy  # Inductor's copy
    assert layout_copy("reduce_scatter", shape("eager", 2, tp=1), nbytes) == []
    with pytest.raises(ValueError):
        layout_copy("all_reduce", shape("eager", 2), nbytes)


def test_the_strided_copy_takes_the_time_the_h200_trace_measured():
    # KempnerForge's trace: CatArrayBatchedCopy 6,420 calls in 1,100.6 ms, one before each 80 MiB reduce-scatter.
    with open(REPO / "validation" / "reference" / "kempner_h200_profiled_kernels.csv", newline="") as fh:
        row = next(r for r in csv.DictReader(line for line in fh if not line.startswith("#"))
                   if r["name"].startswith("void at::native::(anonymous namespace)::CatArrayBatchedCopy"))
    measured_s = float(row["cuda_total_ms"]) / int(row["calls"]) / 1e3
    gpu = gpu_preset("h200-sxm")
    eff = compute_efficiency(gpu)
    (scatter,) = layout_copy("reduce_scatter", shape("eager", 2), 2 * 4096 * 5120 * 2)
    t = kernel_time_s(gpu, scatter, "bf16")
    # 2 x 80 MiB at 4.8 TB/s x 0.92 x 0.222 = 171.2 us, plus the launch gap
    assert t - eff.launch_overhead_s == pytest.approx(2 * 80 * 2**20 / (4.8e12 * 0.92 * 0.222), rel=1e-9)
    assert t == pytest.approx(measured_s, rel=0.02)
    # a streaming copy of the same bytes (the compiled one, or eager at batch 1) is 4x faster
    (stream,) = layout_copy("reduce_scatter", shape("compiled", 2), 2 * 4096 * 5120 * 2)
    assert kernel_time_s(gpu, stream, "bf16") < t / 3.5


torch = pytest.importorskip("torch", reason="validation extra (torch) not installed")


@pytest.mark.parametrize("batch", [2, 1])
def test_torch_makes_the_copies_simdist_counts_for_an_eager_block(batch):
    from tests.test_tp_plan import BLOCK
    from validation.tp_plan_check import count_collectives

    measured = count_collectives("eager", False, batch=batch, timeout_s=120)
    assert measured["copies"] == sum(copies(BLOCK, style="eager", batch=batch).values()) == (14 if batch == 2 else 7)
