"""Predicted vs measured transformer layers: one layer's forward and backward, on one GPU and under tensor
parallelism, the level between a GEMM (docs/accuracy-kernels.md) and a training step (docs/accuracy-training.md).

    python -m validation.accuracy_layers [--out docs/accuracy-layers.md]

Two tables of validation/reference/:
- korthikanti2022_table4_layer_time_22B.csv: Korthikanti et al. 2022 Table 4, one 22B layer (hidden 6144, 64 heads),
  TP 8, micro-batch 4, sequence 2048, Megatron-LM on DGX A100, five variants of sequence parallelism and recompute.
  The A100's GEMM size knee (simdist/hardware/data/compute_efficiency.csv, gemm_knee_dim) is fitted to two of its
  rows: these are the fit, listed for the comparison, not checks.
- te_layer_times_published.csv: Transformer Engine's te.TransformerLayer of GPT-3 175B's shape (hidden 12288, 96
  heads, ffn 4 x hidden, batch 1, sequence 2048, bf16) on 8 H100 with TP 8, with and without sequence parallelism,
  forward, timed by NVIDIA's nvFuser team as their tensor-parallel baseline (github.com/NVIDIA/Fuser pull requests
  #3546 and #3591). Checks: nothing is fitted to them.
- te_getting_started_layer_times.csv: Transformer Engine's getting-started tutorial (docs/getting_started, 2026-01),
  one layer of hidden 4096, 32 heads, ffn 16384 (GELU tanh, biases), batch 8 x sequence 2048, bf16, forward and
  backward on one H100, in six builds: plain PyTorch (LayerNorm, Linear, attention as bmm / scale / softmax / dropout
  / bmm), TE's unfused modules, TE's fused attention, FP8 (delayed scaling), TE's fused LayerNormLinear and
  LayerNormMLP, and te.TransformerLayer. Checks of the H100's kernels without communication: nothing is fitted.

Each layer is simdist.plan.layer_cost.layer_work on the GPU preset, its kernels back to back on the compute stream
at simdist.hardware.compute.kernel_time_s, its tensor-parallel collectives priced alone on the cluster preset's
first 8 GPUs (simdist.analytic.select.rank_choices) and issued after the kernels they follow: one that is not
overlappable holds the compute stream until it ends (`phase_time_s`; tests/test_layer_cost.py pins the Korthikanti
rows with it). A forward timed from an idle device (the TE rows: torch.cuda.synchronize() ends every round) also
waits the host's first launch: the step gap of simdist.hardware.host (20 us) is added to those rows.
# Assumption: the TE layer's attention is cuDNN's fused attention (Transformer Engine's FusedAttention on Hopper) and
# its attention dropout (TE's default 0.1) costs nothing extra; its hidden dropout is the fused dropout-residual
# kernels layer_work builds (Megatron-LM's, with TE's defaults hidden_dropout 0.1 and bias on every linear).
# Assumption: the tutorial's "NVIDIA H100 GPU" is the H100 SXM 80GB at its 700 W rating (NVIDIA's own cluster).
# The tutorial's builds map on layer_work's options: plain PyTorch and TE's unfused modules on its eager kernels
# (ATen's LayerNorm pair where TE's unfused builds run te.LayerNorm's one fused kernel: 0.16 ms of a 50 ms layer),
# TE's fused modules and te.TransformerLayer on its fused ones; the tutorial's materialized attention divides the
# scores by sqrt(d) in a kernel of its own (`torch.bmm(...) / norm_factor`), one more pass over the scores forward
# and one backward, added here (layer_work's materialized attention is Megatron-LM's, the scale fused in its
# softmax); the plain PyTorch layer has no dropout after its MLP, so that dropout's kernels are taken out; FP8
# weights are cast in every forward (no is_first_microbatch caching in the tutorial's loop); te.TransformerLayer's
# dropouts are 0, its fused bias-dropout-add kernels priced with their 1-byte masks (0.1 ms of 22 ms). Each
# timed iteration also runs y.sum() and its backward (two passes over 128 MiB, 0.1 ms): left out.

error = predicted / measured - 1: negative where simdist is faster than the measurement (optimistic), as in the
other reports.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from simdist.analytic.select import rank_choices
from simdist.collectives.group import Group
from simdist.collectives.request import Request
from simdist.hardware.compute import kernel_time_s
from simdist.hardware.gpus import GPU_PRESETS
from simdist.hardware.host import host_overhead
from simdist.hardware.presets import load_topology
from simdist.plan.kernel_work import elementwise
from simdist.plan.layer_cost import CommWork, Kernel, layer_work
from simdist.plan.model import Model
from simdist.plan.model_presets import resolve_model
from simdist.spec import ModelSpec
from simdist.spec.gpu import GpuSpec
from validation.accuracy_kernels import reference_rows, report_cli

METHOD = (
    "Rows: Korthikanti et al. 2022 Table 4 (one 22B layer, hidden 6144, 64 heads, TP 8, micro-batch 4, sequence 2048, "
    "Megatron-LM on DGX A100; the A100's GEMM size knee, gemm_knee_dim in simdist/hardware/data/"
    "compute_efficiency.csv, is fitted to its 'Baseline no recompute' and 'Selective Recompute' rows, marked fit) and "
    "Transformer Engine's te.TransformerLayer of GPT-3 175B's shape (hidden 12288, 96 heads, ffn 4 x hidden, batch 1, "
    "sequence 2048, bf16) on 8 H100 at TP 8, with and without sequence parallelism, forward, timed by NVIDIA's "
    "nvFuser team as their tensor-parallel baseline (validation/reference/te_layer_times_published.csv; checks). "
    "Each layer is simdist.plan.layer_cost.layer_work on the GPU preset: its kernels back to back at "
    "simdist.hardware.compute.kernel_time_s, its tensor-parallel collectives priced alone on the cluster preset's "
    "first 8 GPUs and issued after the kernels they follow, a non-overlappable one holding the compute stream until "
    "it ends (`phase_time_s`). The TE rows time one forward from an idle device, so the host's first launch (the "
    "step gap of simdist.hardware.host, 20 us) is added. Assumption: TE's attention is cuDNN's fused attention and "
    "its attention dropout costs nothing extra; its hidden dropout is the fused dropout-residual kernel layer_work "
    "builds. The te_getting_started rows (validation/reference/te_getting_started_layer_times.csv; checks) are "
    "Transformer Engine's getting-started tutorial: one layer of hidden 4096, 32 heads, ffn 16384 (GELU tanh, "
    "biases), batch 8 x sequence 2048, forward and backward on one H100 (Assumption: the H100 SXM 80GB at 700 W) "
    "in six builds from plain PyTorch to te.TransformerLayer in FP8, timed as the mean of 100 back-to-back "
    "iterations: their kernels summed, no communication; plain PyTorch and TE's unfused modules on layer_work's "
    "eager kernels, TE's fused modules on its fused ones, the tutorial's own score scaling kernel (`/ norm_factor` "
    "on the materialized scores) added, the plain layer's missing MLP dropout taken out, FP8 weights cast in "
    "every forward (the module docstring lists the rest). error = predicted / measured - 1 (negative: simdist "
    "faster than the measurement).")

REFERENCE = Path(__file__).resolve().parent / "reference"
KORTHIKANTI = "korthikanti2022_table4_layer_time_22B.csv"
TE_LAYERS = "te_layer_times_published.csv"
TE_TUTORIAL = "te_getting_started_layer_times.csv"

GPT22B = Model("22b", "decoder", num_layers=48, hidden_size=6144, num_attention_heads=64, num_query_groups=64,
               ffn_hidden_size=4 * 6144, seq_length=2048, vocab_size=51200, tied_embeddings=True)
"""Korthikanti et al. 2022 Table 3's 22B model (the layer of their Table 4)."""

KORTHIKANTI_VARIANTS = {  # Table 4 row -> (sequence_parallel, recompute)
    "Baseline no recompute": (False, "none"),
    "Sequence Parallelism": (True, "none"),
    "Baseline with recompute": (False, "full"),
    "Selective Recompute": (False, "selective"),
    "Selective + Sequence": (True, "selective"),
}


def phase_time_s(gpu: GpuSpec, group: Group, kernels: Iterable[Kernel], comms: Iterable[CommWork],
                 precision: str = "bf16") -> float:
    """One pass of a layer: ``kernels`` back to back on the compute stream; ``comms`` in order on the TP stream, each
    issued after ``issued_after`` kernels and priced alone on ``group``; a non-overlappable one holds the compute
    stream until it ends."""
    kernels = list(kernels)
    t = comm_free = 0.0
    pending = sorted(comms, key=lambda c: c.issued_after)
    for i in range(len(kernels) + 1):
        while pending and pending[0].issued_after == i:
            c = pending.pop(0)
            comm_free = max(t, comm_free) + rank_choices(Request(c.op, group, c.nbytes))[0].predicted_s
            if not c.overlappable:
                t = comm_free
        if i < len(kernels):
            t += kernel_time_s(gpu, kernels[i], precision)
    return max(t, comm_free)


def layer_times_s(gpu: GpuSpec, group: Group, model: Model, *, micro_batch_size: int, sequence_parallel: bool,
                  recompute: str = "none", attention: str = "materialized") -> tuple[float, float]:
    """(forward, backward with its recompute) seconds of one layer at TP = the group's size."""
    w = layer_work(model, tp=group.size, micro_batch_size=micro_batch_size, sequence_parallel=sequence_parallel,
                   recompute=recompute, attention=attention)
    forward = phase_time_s(gpu, group, w.forward, [c for c in w.comm if c.phase == "forward"])
    redo = phase_time_s(gpu, group, w.recompute, [c for c in w.comm if c.recompute]) if w.recompute else 0.0
    backward = phase_time_s(gpu, group, w.backward, [c for c in w.comm if c.phase == "backward" and not c.recompute])
    return forward, redo + backward


@dataclass(frozen=True, slots=True)
class Record:
    dataset: str
    label: str
    direction: str
    gpu: str
    measured_ms: float
    predicted_ms: float
    fit: bool
    """A row a constant was fitted to (listed for the comparison), not a check."""
    source: str

    @property
    def error(self) -> float:
        return self.predicted_ms / self.measured_ms - 1


def _korthikanti() -> list[Record]:
    gpu, group = GPU_PRESETS["a100-sxm-80gb"], Group.first(load_topology("dgx-a100"), 8)
    out = []
    for r in reference_rows(REFERENCE / KORTHIKANTI):
        sp, recompute = KORTHIKANTI_VARIANTS[r["experiment"]]
        times = layer_times_s(gpu, group, GPT22B, micro_batch_size=4, sequence_parallel=sp, recompute=recompute)
        for direction, seconds in zip(("forward", "backward"), times, strict=True):
            # the fit rows of compute_efficiency.csv's gemm_knee_dim: 'Baseline no recompute', 'Selective Recompute'
            fit = r["experiment"] in ("Baseline no recompute", "Selective Recompute")
            out.append(Record("korthikanti2022_table4", f"22B {r['experiment']}", direction, gpu.name,
                              float(r[f"{direction}_ms"]), seconds * 1e3, fit, r["source"]))
    return out


def _te_layers() -> list[Record]:
    gpu = GPU_PRESETS["h100-sxm"]
    group = Group.first(load_topology("dgx-h100"), 8)
    gap_s = host_overhead(gpu).step_gap_s  # the round starts on an idle device: the first launch's latency
    out = []
    for r in reference_rows(REFERENCE / TE_LAYERS):
        model = dataclasses.replace(resolve_model(ModelSpec(preset="gpt3-175b")), seq_length=int(r["seq_length"]))
        assert (model.hidden_size, model.num_attention_heads, model.ffn_hidden_size) == (
            int(r["hidden_size"]), int(r["num_attention_heads"]), int(r["ffn_hidden_size"])), r["label"]
        assert int(r["tensor_parallel"]) == group.size and int(r["num_gpus"]) == group.size, r["label"]
        forward, backward = layer_times_s(gpu, group, model, micro_batch_size=int(r["micro_batch_size"]),
                                          sequence_parallel=r["sequence_parallel"] == "true", attention="cudnn")
        seconds = {"forward": forward, "backward": backward}[r["direction"]] + gap_s
        out.append(Record("te_transformer_layer", r["label"], r["direction"], gpu.name, float(r["measured_ms"]),
                          seconds * 1e3, False, r["source"]))
    return out


def _tutorial_kernels(model: Model, r: dict[str, str]) -> tuple[list[Kernel], list[Kernel], str]:
    """The forward and backward kernels of one build of Transformer Engine's tutorial layer, and its precision."""
    precision, b = r["precision"], int(r["micro_batch_size"])
    w = layer_work(model, micro_batch_size=b, precision=precision, attention=r["attention"],
                   attention_mask=r["attention_mask"], style=r["kernels"], fp8_recipe=r["fp8_recipe"] or "delayed",
                   fp8_weight_cache=False)
    forward, backward = list(w.forward), list(w.backward)
    if r["score_scale"] == "separate":  # `/ norm_factor` on the bf16 scores: read and write them, both passes
        scores = b * model.num_attention_heads * model.seq_length ** 2
        forward.append(elementwise("score_scale", scores, 4.0))
        backward.append(elementwise("score_scale_grad", scores, 4.0))
    if int(r["hidden_dropouts"]) == 1 and r["kernels"] == "eager":  # no dropout after the MLP
        hidden = b * model.seq_length * model.hidden_size * 5.0  # a bf16 read and write and a 1-byte mask each
        dropped = (forward.pop(max(i for i, k in enumerate(forward) if k.name == "dropout")),
                   backward.pop(min(i for i, k in enumerate(backward) if k.name == "dropout_grad")))
        assert all(k.hbm_bytes == hidden for k in dropped), r["label"]  # the MLP's, not the scores' dropout
    return forward, backward, precision


def _te_tutorial() -> list[Record]:
    gpu = GPU_PRESETS["h100-sxm"]
    out = []
    for r in reference_rows(REFERENCE / TE_TUTORIAL):
        h, heads, f = int(r["hidden_size"]), int(r["num_attention_heads"]), int(r["ffn_hidden_size"])
        assert (r["activation"], r["bias"], r["num_gpus"]) == ("gelu_tanh", "true", "1"), r["label"]
        model = Model("te-tutorial", "decoder", num_layers=1, hidden_size=h, num_attention_heads=heads,
                      num_query_groups=heads, ffn_hidden_size=f, seq_length=int(r["seq_length"]), vocab_size=0,
                      add_bias_linear=True)
        forward, backward, precision = _tutorial_kernels(model, r)
        seconds = sum(kernel_time_s(gpu, k, precision) for k in (*forward, *backward))
        out.append(Record("te_getting_started", r["label"], "forward + backward", gpu.name,
                          float(r["measured_ms"]), seconds * 1e3, False, r["source"]))
    return out


@cache
def records() -> tuple[Record, ...]:
    return (*_korthikanti(), *_te_layers(), *_te_tutorial())


def _te_summary(te: list[Record]) -> str:
    """What the TE rows say, from their numbers (each label ends in its measurement's date)."""
    if not te:
        return ""
    tp = {r.label[-12:]: r for r in te if "TP 8" in r.label}
    sp = {r.label[-12:]: r for r in te if "SP 8" in r.label}
    side = "faster than measured (optimistic)" if all(r.error < 0 for r in te) else "on both sides of the measurement"
    text = (f"The {len(te)} Transformer Engine rows: simdist {side}, by {min(-100 * r.error for r in te):.1f} to "
            f"{max(-100 * r.error for r in te):.1f} %, as the Hopper rows of docs/accuracy-training.md are. ")
    days = sorted(set(tp) & set(sp))
    if len(days) < 2:
        return text
    first, last = days[0], days[-1]
    faster = 100 * (1 - sp[first].predicted_ms / tp[first].predicted_ms)
    slower = ", ".join(f"{100 * (sp[d].measured_ms / tp[d].measured_ms - 1):.1f}" for d in days)
    spread_tp = 100 * abs(tp[last].measured_ms / tp[first].measured_ms - 1)
    spread_sp = 100 * abs(sp[last].measured_ms / sp[first].measured_ms - 1)
    return text + (
        f"simdist prices the sequence-parallel forward {faster:.1f} % faster than the tensor-parallel one (a tenth of "
        "the norms' and dropouts' bytes per GPU; two all-gathers and two reduce-scatters moving what the two "
        f"all-reduces move); measured on the same day it is {slower} % slower, and the same forward measured days "
        f"apart differs by {spread_tp:.1f} % (TP) and {spread_sp:.1f} % (SP): the SP rows' errors carry that spread, "
        "and what makes TE's sequence-parallel forward slower than its tensor-parallel one is not in simdist.")


def _tutorial_summary(rows: list[Record]) -> str:
    """What the single-GPU tutorial rows say, from their numbers."""
    if not rows:
        return ""
    errs = [100 * r.error for r in rows]
    text = (f"The {len(rows)} tutorial rows (one H100, no communication): {min(errs):+.1f} to {max(errs):+.1f} %, "
            f"bias {statistics.fmean(errs):+.1f} %: ")
    if statistics.fmean(errs) >= 0:
        text += ("simdist prices one H100's layer kernels, eager or fused, bf16 or FP8, at or above their measured "
                 "time, so the kernels of one H100 are not where the optimism of the tensor-parallel rows above, or "
                 "of the Hopper rows of docs/accuracy-training.md, comes from.")
    else:
        text += "simdist prices one H100's layer kernels faster than measured."
    return text


def render(recs: Iterable[Record] | None = None) -> str:
    recs = list(records() if recs is None else recs)
    checks = [r for r in recs if not r.fit]
    lines = [
        "# Accuracy of simdist's transformer layers, on one GPU and under tensor parallelism",
        "",
        "Generated by `python -m validation.accuracy_layers --out docs/accuracy-layers.md` "
        "(validation/accuracy_layers.py); tests/test_accuracy_layers.py fails when this file differs from the "
        "script's output, so edit the script, not this file.",
        "",
        "## Method",
        "",
        METHOD,
        "",
        "## Summary",
        "",
        "| dataset | GPU | rows | fit rows | MAPE % (checks) | bias % (checks) | min error % | max error % |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in dict.fromkeys(r.dataset for r in recs):
        rows = [r for r in recs if r.dataset == name]
        errs = [100 * r.error for r in rows if not r.fit]
        mape = f"{statistics.fmean(abs(e) for e in errs):.1f}" if errs else "-"
        bias = f"{statistics.fmean(errs):+.1f}" if errs else "-"
        every = [100 * r.error for r in rows]
        lines.append(f"| {name} | {rows[0].gpu} | {len(rows)} | {sum(r.fit for r in rows)} | {mape} | {bias} | "
                     f"{min(every):+.1f} | {max(every):+.1f} |")
    lines += [
        "",
        _te_summary([r for r in checks if r.dataset == "te_transformer_layer"]),
        "",
        _tutorial_summary([r for r in checks if r.dataset == "te_getting_started"]),
        "",
        "## Rows",
        "",
        "| dataset | row | pass | GPU | measured ms | predicted ms | error % | kind |",
        "|---|---|---|---|---:|---:|---:|---|",
    ]
    for r in recs:
        lines.append(f"| {r.dataset} | {r.label} | {r.direction} | {r.gpu} | {r.measured_ms:.3f} | "
                     f"{r.predicted_ms:.3f} | {100 * r.error:+.1f} | {'fit' if r.fit else 'check'} |")
    lines += ["", "Sources:", ""]
    lines += [f"- {s}" for s in dict.fromkeys(r.source for r in recs)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    report_cli(render, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
