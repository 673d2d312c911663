"""Predicted vs published training iteration times: writes docs/accuracy-training.md.

    python -m validation.accuracy_training --out docs/accuracy-training.md

Datasets (copied unchanged into validation/reference/, source columns kept):
- Korthikanti et al. 2022 (arXiv:2205.05198) Table 5: iteration time of 22B, 175B, 530B, 1T GPT models
  on Selene, with "present work" (sequence parallelism + selective recompute) and the full-recompute
  baseline without sequence parallelism; plus the 530B run with 8-way data parallelism (sec 6.3).
- Narayanan et al. 2021 (arXiv:2104.04473) Table 2, PTD-P and ZeRO-3 rows: achieved TFLOP/s per GPU of 175B
  and 530B at three GPU counts each. Their TFLOP/s counts F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs per
  iteration (eq. (3), full recomputation included), so the measured iteration time is F / (GPUs x TFLOP/s).
- NVIDIA Megatron-Bridge's performance summary (github.com/NVIDIA-NeMo/Megatron-Bridge,
  docs/performance-summary-archive.md): tokens per second per GPU of Megatron-Core pre-training on DGX H100,
  DGX B200, DGX B300, GB200 NVL72 and GB300 NVL72 in BF16, FP8 and MXFP8 (2025-26), each with its layout; the
  step time is global batch x sequence / (tokens/s/GPU x GPUs). A check of the H100/B200-era step model, never a
  fit (rows with a scenario).

Each row is predicted by `simdist.api.run` on a scenario file under scenarios/published/ (plus the
overrides listed). No model constant is fitted to these rows: compute efficiency is calibrated on the 22B
single-layer times of Korthikanti Table 4 (simdist/hardware/data/compute_efficiency.csv), the network on
NCCL's constants and link specifications.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "validation" / "reference"
SCENARIOS = ROOT / "scenarios" / "published"
TOLERANCE = 0.15
ZERO3_TOLERANCE = 0.25
"""The ZeRO-3 rows of Narayanan 2021 Table 2 measure DeepSpeed's 2021 implementation, modelled by its mechanism
(training.zero3_fetch: per_parameter): the 530B rows come out 20-22 % fast, so their bound is wider, stated here."""
BRIDGE_TOLERANCE = 0.25
"""The Megatron-Bridge rows run Megatron-Core's 2026 optimizations, some of which simdist does not model yet
(parameter-gather overlap with the optimizer step, CUDA graphs; TP communication overlap it does:
training.tp_comm_overlap): a check with a stated bound, reported with its bias, not a calibration target."""
BRIDGE_MOE_TOLERANCE = 0.5
"""The MoE rows of the Megatron-Bridge table: a check of a young model (issue 15) against runs that use CUDA graphs,
fused routers and the SMs of DeepEP / HybridEP dispatch, which simdist does not model (their dispatch itself it
prices where a scenario says flex); the bound says how far off it may be."""
FULL = ["training.recompute=full", "parallel.sequence_parallel=false"]
FSDP_FAMILY = "fsdp_family_published_runs"
"""The PyTorch FSDP-family check set (IBM/Meta FSDP1 on A100 and H100, KempnerForge FSDP2 on H200, OLMo-core's FSDP2
with torch.compile in BF16 and torchao float8 on H100, torchtitan's Llama3-8b config on 8 A100 and on 8 H100 in BF16 and
torchao float8)."""
FSDP_FAMILY_TARGET = 0.15
"""Issue 30's goal for these rows; rows beyond it are flagged in the document (**!**)."""
FSDP_FAMILY_BOUND = 0.45
"""The test's guard against regressions on these rows, wider than the goal: at this commit the H100 and the TP 4 x
FSDP rows of Llama 3 70B come out 12-30 % fast and KempnerForge's eager TP 4 x pipeline rows (C24-C26:
torch.distributed.pipelining's 1F1B with DTensor TP, torch.compile off) 27-43 % fast (docs/accuracy-training.md
lists them); the bound fails the suite if a change makes any row worse than that, while the goal stays visible in
the document."""
BRIDGE = "megatron_bridge_performance_summary"
BRIDGE_MOE = "megatron_bridge_performance_summary_moe"
CONTENDED = frozenset({"nemo-deepseek-v3-b200-mxfp8.yaml", "nemo-qwen3-235b-h100-fp8.yaml"})
"""Megatron-Bridge rows of 256 GPUs predicted by the engine, not the closed form: their expert-parallel all-to-all
crosses 4 DGX nodes (EP 32) beside the pipeline's and the other groups' traffic, and the engine's contended step is
25 % (DeepSeek-V3 on 256 B200: 19.10 s against 15.29 s) and 41 % (Qwen3-235B on 256 H100: 76.0 s against 54.0 s)
above the contention-free closed form, where the other rows' differ by under 1 %; their engine runs take 10-30 s."""
"""The mixture-of-experts rows of the same table (DeepSeek-V3, Qwen3 MoE, GPT-OSS): their own MAPE and bias."""


@dataclass(frozen=True)
class Row:
    dataset: str
    label: str
    scenario: str
    overrides: tuple[str, ...]
    measured_s: float
    source: str
    framework: str = "megatron"
    """The framework that ran it (megatron, deepspeed, fsdp, torchtitan): the per-framework summary."""
    generation: str = "ampere"
    """The GPU generation (ampere, hopper, blackwell): the per-generation summary."""
    fidelity: str | None = None
    """None: the scenario's default (the engine); "closed_form" where the engine's own run is too slow for the test
    suite and its contention share was found negligible (stated in the row's scenario file)."""
    tokens_per_gpu: float = 0.0
    """Tokens one GPU processes in a step (FSDP-family rows: global batch x sequence / GPUs); 0 where not needed."""


def tolerance(row: Row) -> float:
    if row.dataset == FSDP_FAMILY:
        return FSDP_FAMILY_BOUND
    if row.dataset == BRIDGE_MOE:
        return BRIDGE_MOE_TOLERANCE
    if row.dataset == BRIDGE:
        return BRIDGE_TOLERANCE
    return ZERO3_TOLERANCE if row.dataset == "megatron2021_table2_zero3" else TOLERANCE


def _narayanan_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    # Narayanan et al. 2021 eq. (3): F = 96 B s l h^2 (1 + s / (6h) + V / (16 l h)).
    return 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def _bridge_source(source: str) -> str:
    """What a Megatron-Bridge row is from: its performance summary, or the skill document of a controlled A/B."""
    if "skills/" in source:
        return "skill " + source.split("skills/")[1].split("/")[0]
    return "performance summary"


def rows() -> list[Row]:
    out: list[Row] = []
    with open(REFERENCE / "korthikanti2022_table5_iteration_time.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            model = r["model"].split()[0].lower()
            name = "530b-dp8" if "8-way DP" in r["model"] else model
            scenario = f"korthikanti2022-{name}.yaml"
            src = f"Korthikanti 2022 Table 5 ({r['model']}, {r['num_gpus']} GPUs)"
            out.append(Row("korthikanti2022_table5", f"{r['model']} SP + selective", scenario, (),
                           float(r["iter_time_present_work_s"]), src))
            if r["iter_time_full_recompute_s"]:
                out.append(Row("korthikanti2022_table5", f"{r['model']} full recompute", scenario, tuple(FULL),
                               float(r["iter_time_full_recompute_s"]), src))
    with open(REFERENCE / "megatron2021_table2_zero3_vs_ptdp.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            ptdp = r["scheme"].startswith("PTD")
            params = float(r["params_billion"])
            model = "175b" if params < 200 else "530b"
            layers, hidden = (96, 12288) if model == "175b" else (105, 20480)
            gpus, batch = int(r["num_gpus"]), int(r["global_batch_size"])
            flops = _narayanan_flops(batch, int(r["seq_len"]), layers, hidden, 51200)
            measured = flops / (gpus * float(r["achieved_tflops_per_gpu"]) * 1e12)
            scheme = "ptdp" if ptdp else "zero3"
            out.append(Row("megatron2021_table2" if ptdp else "megatron2021_table2_zero3",
                           f"{model.upper()} {'PTD-P' if ptdp else 'ZeRO-3'} {gpus} GPUs",
                           f"megatron2021-{model}-{scheme}-{gpus}.yaml", (), measured,
                           f"Narayanan 2021 Table 2 ({r['achieved_tflops_per_gpu']} TFLOP/s per GPU)",
                           "megatron" if ptdp else "deepspeed"))
    with open(REFERENCE / f"{BRIDGE}.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            if not r["scenario"]:
                continue  # a published run simdist cannot express yet
            gpus = int(r["num_gpus"])
            measured = int(r["global_batch_size"]) * int(r["seq_length"]) / (float(r["tokens_per_s_per_gpu"]) * gpus)
            moe = bool(r["ep"])
            # Assumption: see Row.fidelity; these layouts' engine runs take 6-20 s each
            closed = (gpus >= 256 or moe) and r["scenario"] not in CONTENDED
            out.append(Row(BRIDGE_MOE if moe else BRIDGE, f"{r['model']} {r['precision']} {gpus}x {r['system']}",
                           r["scenario"], (),
                           measured, f"Megatron-Bridge {_bridge_source(r['source'])} ({r['container']}, "
                           f"{r['tokens_per_s_per_gpu']} tokens/s/GPU)", "megatron",
                           "hopper" if "H100" in r["system"] else "blackwell", "closed_form" if closed else None))
    with open(REFERENCE / f"{FSDP_FAMILY}.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            if not r["scenario"]:
                continue  # its note says why: a setting not published, or a run at the edge of memory
            gpus = int(r["num_gpus"])
            measured = int(r["global_batch_size"]) * int(r["seq_length"]) / (float(r["tokens_per_s_per_gpu"]) * gpus)
            # the framework profile the row's scenario runs: FSDP1 (IBM/Meta) or torchtitan's FSDP2 (KempnerForge and
            # OLMo-core, both torchtitan-style FSDP2 loops)
            framework = "fsdp" if r["framework"].startswith("PyTorch FSDP1") else "torchtitan"
            tags = (" compiled" if r["compile"] == "yes" else "") + (" FP8" if "float8" in r["precision"] else "")
            out.append(Row(FSDP_FAMILY, f"{r['id']} {r['model'].split(' (')[0]} {gpus}x {r['gpu'].split('-')[0]} "
                           f"{r['layout']}{tags}", r["scenario"], (), measured,
                           f"{r['source'].split(' (')[0]} ({r['published_metric']})", framework,
                           "ampere" if r["gpu"].startswith("A100") else "hopper",
                           tokens_per_gpu=int(r["global_batch_size"]) * int(r["seq_length"]) / gpus))
    return out


@dataclass(frozen=True)
class Result:
    row: Row
    predicted_s: float
    mfu: float
    bubble: float
    memory_gib: float
    fits: bool
    composition: dict[str, float] = field(default_factory=dict)
    """What simdist says the step is made of (`COMPOSITION`): the report's "What the errors track"."""

    @property
    def error(self) -> float:
        return self.predicted_s / self.row.measured_s - 1


COMPOSITION = {
    "gemm": "GEMMs' share of the kernels' seconds",
    "attention": "attention kernels' share",
    "memory": "memory-bound kernels' share",
    "kernels_per_ms": "kernels per ms of kernel time",
    "exposed_comm": "exposed communication's share of the step",
    "bubble": "the bubble's share of the step",
}
"""The quantities of a row's step the report correlates its error with: the kernel shares and kernels per
millisecond of simdist.plan.kernel_mix (one micro-batch of every model part), the exposed communication (every axis)
and the bubble of the run's breakdown, over its step time."""


def predict(row: Row) -> Result:
    from simdist.api import load_scenario, run
    from simdist.plan.kernel_mix import kernel_mix
    from simdist.predict.step import checked_step

    out = run(SCENARIOS / row.scenario, list(row.overrides), fidelity=row.fidelity)
    r = out.result
    sc = load_scenario(SCENARIOS / row.scenario, list(row.overrides))
    mix = kernel_mix(checked_step(sc.spec, sc.topology)[1])
    step, b = r["step_time_s"], r["breakdown"]
    composition = {"gemm": mix.share("gemm"), "attention": mix.share("attention"), "memory": mix.share("memory"),
                   "kernels_per_ms": mix.kernels_per_ms,
                   "exposed_comm": sum(b["exposed_comm_s"].values()) / step, "bubble": b["bubble_s"] / step}
    return Result(row, step, r["mfu"], r["bubble_fraction"], r["memory_per_gpu_bytes"] / 2**30,
                  r["fits_in_memory"], composition)


def _pearson(xs: list[float], ys: list[float]) -> float:
    """Pearson's correlation coefficient (0 where either side does not vary)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx, syy = sum((x - mx) ** 2 for x in xs), sum((y - my) ** 2 for y in ys)
    return sxy / (sxx * syy) ** 0.5 if sxx > 0 and syy > 0 else 0.0


def _tracks(results: list[Result]) -> list[str]:
    """The report's "What the errors track" section."""
    off = [r for r in results if r.row.generation != "ampere"]
    lines = ["", "## What the errors track", "",
             "For each row, simdist's own account of its step (`validation.accuracy_training.COMPOSITION`): the "
             "share of its kernels' roofline seconds in GEMMs, attention and memory-bound kernels and how many "
             "kernels a millisecond of them holds (`simdist.plan.kernel_mix`, one micro-batch of every model part), "
             "and the shares of the predicted step that exposed communication and the bubble take. Pearson's r between "
             f"each and the error, over all {len(results)} rows and over the {len(off)} rows off the A100 (the GPU "
             "whose compute constants are fitted, on Korthikanti's layer times), and the bias of the third of the "
             "rows with the most of it against the third with the least. A negative r: simdist is the more "
             "optimistic the more of the step that part is, so that part's mechanism is where its bias comes from. "
             "Nothing is fitted to this; it says where to look.",
             "", f"| quantity | r, all {len(results)} | r, off A100 | bias % of the third with the most | "
             "bias % of the third with the least |", "|---|---:|---:|---:|---:|"]
    third = max(1, len(results) // 3)
    for key, label in COMPOSITION.items():
        values = [r.composition[key] for r in results]
        ranked = sorted(results, key=lambda r: r.composition[key])
        low = sum(r.error for r in ranked[:third]) / third * 100
        high = sum(r.error for r in ranked[-third:]) / third * 100
        r_all = _pearson(values, [r.error for r in results])
        r_off = _pearson([r.composition[key] for r in off], [r.error for r in off])
        lines.append(f"| {label} | {r_all:+.2f} | {r_off:+.2f} | {high:+.1f} | {low:+.1f} |")
    return lines


GENERATION_PAIRS = (("A1", "A5"), ("A9", "A13"), ("A3", "A7"), ("A4", "A8"), ("T0", "T1"))
"""FSDP-family rows of one model, framework and recipe on A100 and on H100 (`fsdp_family_published_runs.csv` ids):
the ratio of their measured throughputs per GPU is what the two GPUs' kernels, clocks and memory systems make of the
same step, with the framework's own costs on both sides. IBM's 34B and 70B pairs also differ in GPU count (128 A100,
96 H100) and fabric; the rest only in the GPU. IBM's H100 is taken as the 700 W H100 SXM, torchtitan's T1 as the
500 W HBM2e H100 its authors benchmark on (gpus/h100-sxm-hbm2e.yaml), each as its scenario says."""


def _generation_pairs(results: list[Result]) -> list[str]:
    """The report's "One run on A100 and on H100" section: measured and predicted speedups per GPU of each pair."""
    by_id = {r.row.label.split(" ", 1)[0]: r for r in results if r.row.dataset == FSDP_FAMILY}
    lines = ["", "## One run on A100 and on H100", "",
             "Pairs of rows that ran the same model with the same framework and recipe on A100 and on H100 "
             "(`validation.accuracy_training.GENERATION_PAIRS`): the H100 run's throughput per GPU over the A100 "
             "run's, measured and predicted. predicted / measured = (1 + A100 error) / (1 + H100 error), so a "
             "ratio above 1 says simdist makes the H100 faster against the A100 than it is, whatever the "
             "framework's own costs on both.", "",
             "| pair | A100 error % | H100 error % | measured speedup | predicted speedup | predicted / measured |",
             "|---|---:|---:|---:|---:|---:|"]
    for a100, h100 in GENERATION_PAIRS:
        a, h = by_id.get(a100), by_id.get(h100)
        if a is None or h is None:
            continue
        # throughput per GPU = tokens per GPU per step / step time; the tokens per GPU cancel between measured and
        # predicted, so the predicted speedup is the measured one scaled by (1 + e_A100) / (1 + e_H100)
        measured = (h.row.tokens_per_gpu / h.row.measured_s) / (a.row.tokens_per_gpu / a.row.measured_s)
        ratio = (1 + a.error) / (1 + h.error)
        lines.append(f"| {a100} / {h100} | {a.error * 100:+.1f} | {h.error * 100:+.1f} | {measured:.2f} | "
                     f"{measured * ratio:.2f} | {ratio:.2f} |")
    return lines


def report(results: list[Result]) -> str:
    lines = [
        "# Accuracy of simdist's training-step model against published iteration times",
        "",
        "Generated by `python -m validation.accuracy_training --out docs/accuracy-training.md` "
        "(validation/accuracy_training.py); tests/test_accuracy_training.py fails when this file differs from "
        "the script's output, so edit the script, not this file.",
        "",
        "## Method",
        "",
        "Every row is predicted with `simdist run` on the scenario file named (under `scenarios/published/`) "
        "with the overrides listed. error = predicted / measured - 1 (positive: the prediction is slower). "
        f"Requirement: |error| <= {TOLERANCE:.0%} for every row, {ZERO3_TOLERANCE:.0%} for the ZeRO-3 rows "
        "(DeepSpeed's ZeRO-3 of 2021, modelled as `training.zero3_fetch: per_parameter`: each parameter tensor "
        "gathered before each use and each gradient reduce-scattered, blocking, through list collectives that "
        "copy one view per rank). Korthikanti et al. 2022 (arXiv:2205.05198) "
        "Table 5 gives iteration times; Narayanan et al. 2021 (arXiv:2104.04473) Table 2 gives TFLOP/s per "
        "GPU counted with their eq. (3), F = 96 B s l h^2 (1 + s/6h + V/16lh), so the measured time is "
        "F / (GPUs x TFLOP/s). The Megatron-Bridge rows (NVIDIA's Megatron-Core performance summary, "
        "github.com/NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md) give tokens/s/GPU of FP8 and "
        "MXFP8 pre-training on DGX H100, DGX B200, DGX B300, GB200 NVL72 and GB300 NVL72, so the measured time is "
        "global batch x "
        f"sequence / (tokens/s/GPU x GPUs); their bound is {BRIDGE_TOLERANCE:.0%}, a check: the recipes' "
        "partial CUDA graphs (none for these dense rows), TP communication overlap and parameter-gather overlap "
        "are set as the recipes run them (`training.cuda_graph_scope`, `training.tp_comm_overlap`, "
        "`training.overlap_param_gather`); each row takes the "
        "settings of the release that published it (Megatron-Bridge v0.4.2's scripts/performance/configs for the "
        "26.04.01 rows, not the later perf_recipes of the 26.06 container), and the rows of "
        "256 GPUs or more are predicted with the closed form (`--fidelity closed_form`; on these layouts the "
        "engine's contended step is within 1 % of it, and takes 6-20 s a row). The mixture-of-experts rows of the "
        f"same table (DeepSeek-V3, Qwen3 MoE, GPT-OSS; routing force-balanced there) are a dataset of their own with "
        f"a {BRIDGE_MOE_TOLERANCE:.0%} bound, closed form too, but for the two whose expert-parallel all-to-all "
        "crosses four DGX nodes (DeepSeek-V3 on 256 B200, Qwen3-235B on 256 H100: the engine's contended step is "
        "25 % and 41 % above the contention-free closed form there, so they run in the engine): their recipes' "
        "partial CUDA graphs (attn, moe_router, moe_preprocess, as each config of the release sets them) are in "
        "their scenarios, and their memory is reported, not required to fit. The PyTorch "
        "FSDP-family rows (`validation/reference/fsdp_family_published_runs.csv`: IBM and Meta's "
        "FSDP1 runs of the Llama 2 family on 128 A100 and 96 H100, eager and compiled; KempnerForge's FSDP2 + "
        "DTensor TP runs on 1-360 H200, with and without torch.compile, three of them with pipeline "
        "parallelism (torch.distributed.pipelining); OLMo-core's README throughput table of its training "
        "scripts, FSDP2 + "
        "torch.compile in BF16 and torchao float8 on H100, taken at the scripts' default launch of one 8-GPU node; "
        "torchtitan's own Llama3-8b config, FSDP2 + torch.compile + per-op SAC on one 8-GPU host, on A100 (a log "
        "in pytorch/torchtitan issue #929) and on H100 in BF16 and torchao float8 (torchao's float8 README)) "
        "are predicted with the framework profiles `training.framework: fsdp` and "
        "`torchtitan` (README, Frameworks); their goal is the issue's "
        f"{FSDP_FAMILY_TARGET:.0%} (rows beyond it flagged **!**), their test bound {FSDP_FAMILY_BOUND:.0%} guards "
        "against regressions, and their memory is reported, not required to fit (what an eager layer's norms, rotary "
        "embedding and SwiGLU keep is measured on torch's autograd: `python -m validation.eager_saved`). Rows of "
        "that file without a scenario "
        "are not predicted, for the reason in its note column (a selective-checkpointing share not published, a "
        "run at the edge of memory). bias = mean signed error: negative means simdist is optimistic.",
        "",
        "No constant is fitted to these rows. Compute efficiency comes from the 22B single-layer times of "
        "Korthikanti Table 4 (`simdist/hardware/data/compute_efficiency.csv`), communication from NCCL's cost "
        "constants and the link specifications of each row's cluster preset (`dgx-a100`: Selene's DGX A100 nodes "
        "with 8 HDR InfiniBand NICs; `dgx-h100`, `dgx-b200`, `dgx-b300`, `gb200-nvl72`, `gb300-nvl72` for the "
        "Megatron-Bridge rows).",
        "",
        "## Summary",
        "",
        "| dataset | rows | MAPE % | bias % | max abs error % | within its bound |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    datasets = sorted({r.row.dataset for r in results})
    for ds in [*datasets, None]:
        sel = [r for r in results if ds is None or r.row.dataset == ds]
        errs = [abs(r.error) * 100 for r in sel]
        bias = sum(r.error for r in sel) / len(sel) * 100  # mean signed error: + the predictions are slow
        name = ds or "**all**"
        ok = sum(abs(r.error) <= tolerance(r.row) for r in sel)
        lines.append(f"| {name} | {len(sel)} | {sum(errs) / len(errs):.1f} | {bias:+.1f} | {max(errs):.1f} | "
                     f"{ok}/{len(sel)} |")
    for title, key in (("framework", "framework"), ("GPU generation", "generation")):
        lines += ["", f"### By {title}", "", f"| {title} | rows | MAPE % | bias % | max abs error % | within 15 % |",
                  "|---|---:|---:|---:|---:|---:|"]
        for value in sorted({getattr(r.row, key) for r in results}):
            sel = [r for r in results if getattr(r.row, key) == value]
            errs = [abs(r.error) * 100 for r in sel]
            bias = sum(r.error for r in sel) / len(sel) * 100
            ok = sum(abs(r.error) <= FSDP_FAMILY_TARGET for r in sel)
            lines.append(f"| {value} | {len(sel)} | {sum(errs) / len(errs):.1f} | {bias:+.1f} | {max(errs):.1f} | "
                         f"{ok}/{len(sel)} |")
    lines += _tracks(results)
    lines += _generation_pairs(results)
    lines += ["", "## Rows", "",
              "| row | scenario | overrides | measured s | predicted s | error % | MFU | bubble | memory GiB | fits |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        over = " ".join([*(f"`--set {o}`" for o in r.row.overrides),
                         *([f"`--fidelity {r.row.fidelity}`"] if r.row.fidelity else [])]) or "-"
        goal = FSDP_FAMILY_TARGET if r.row.dataset == FSDP_FAMILY else tolerance(r.row)
        flag = "" if abs(r.error) <= goal else " **!**"
        lines.append(
            f"| {r.row.label} | `{r.row.scenario}` | {over} | {r.row.measured_s:.2f} | {r.predicted_s:.2f} | "
            f"{r.error * 100:+.1f}{flag} | {r.mfu:.1%} | {r.bubble:.1%} | {r.memory_gib:.1f} | "
            f"{'yes' if r.fits else 'no'} |")
    lines += ["", "Sources: " + "; ".join(sorted({r.row.source.split(' (')[0] for r in results})) + ".", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from validation.harness_cli import report_main

    return report_main("python -m validation.accuracy_training", __doc__.splitlines()[0],
                       lambda: report([predict(r) for r in rows()]), argv)


if __name__ == "__main__":
    from validation.harness_cli import cli_guard

    raise SystemExit(cli_guard(main))
