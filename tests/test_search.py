"""Layout search: enumeration, pruning, ranking, resume, Ctrl-C, executors, published orderings, CLI."""

from __future__ import annotations

import dataclasses
import json

import pytest

from simdist import api
from simdist.errors import LayoutError, SpecError
from simdist.search.evaluate import context, evaluate_batch, evaluate_one
from simdist.search.executors import Executor, ProcessExecutor
from simdist.search.rank import enumerate_feasible, run_search, sweep
from simdist.search.space import Candidate, SearchProblem

SMALL = SearchProblem("llama3-8b", "dgx-h100", 2, 32, max_cp=1, max_vpp=2, max_micro_batch=2)


def test_enumeration_prunes_with_reasons():
    feasible, pruned, n, gpus, _ = enumerate_feasible(SMALL)
    assert gpus == 16 and n == len(feasible) + len(pruned) and feasible
    rules = {p.rule for p in pruned}
    assert "memory" in rules
    for c in feasible:
        assert c.tp * c.pp * c.dp * c.cp == 16 and 32 % (c.micro_batch_size * c.dp) == 0
    # ZeRO-2/3 with pipeline stages is valid (run predicts it): in the space unless left out
    assert any(c.zero_stage >= 2 and c.pp > 1 for c in feasible)
    narrow, *_ = enumerate_feasible(dataclasses.replace(SMALL, zero_with_pp=False))
    assert narrow == [c for c in feasible if not (c.zero_stage >= 2 and c.pp > 1)]


def test_ranking_is_by_throughput_and_executor_independent():
    feasible, *_ = enumerate_feasible(SMALL)
    one, one_bounded, *_ = sweep(SMALL, feasible, Executor())
    with ProcessExecutor(2) as pool:
        two, two_bounded, *_ = sweep(SMALL, feasible, pool)
    assert one == two and one_bounded == two_bounded  # identical floats whichever process computed them
    assert len(one) + len(one_bounded) == len(feasible)
    out = run_search(SMALL, Executor(), top_k=1)
    speeds = [r["tokens_per_s"] for r in out.ranked]
    assert speeds == sorted(speeds, reverse=True)
    e = out.engine[0]
    assert e["key"] == out.ranked[0]["key"]
    assert abs(e["closed_form_error"]) < 0.05


def test_resume_and_interrupt(tmp_path):
    feasible, *_ = enumerate_feasible(SMALL)
    path = tmp_path / "r.jsonl"

    class Interrupting(Executor):  # Ctrl-C after the bounds and the first batch of exact evaluations
        def run(self, fn, jobs):
            if fn is evaluate_batch:
                yield 0, fn(*jobs[0])
                raise KeyboardInterrupt
            yield from super().run(fn, jobs)

    done, _, interrupted, new, resumed = sweep(SMALL, feasible, Interrupting(), results_file=path)
    assert interrupted and new == len(done) == min(64, len(feasible)) and resumed == 0
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"problem": SMALL.as_dict()} and len(lines) == 1 + new
    with path.open("a") as f:
        f.write('{"key": "torn')  # a sweep killed mid-write
    full, full_bounded, interrupted, _, resumed = sweep(SMALL, feasible, Executor(), results_file=path)
    assert not interrupted and resumed == new
    fresh, fresh_bounded, *_ = sweep(SMALL, feasible, Executor())
    assert full == fresh and full_bounded == fresh_bounded  # what is reported does not depend on the resume
    other = SearchProblem("llama3-8b", "dgx-h100", 2, 64)
    with pytest.raises(SpecError, match="different search"):
        sweep(other, feasible, Executor(), results_file=path)


def test_no_feasible_layout_names_the_constraint():
    with pytest.raises(LayoutError, match="memory constraint"):
        enumerate_feasible(SearchProblem("gpt3-175b", "dgx-a100", 1, 8))


def _tflops(problem: SearchProblem, c: Candidate) -> float:
    return evaluate_one(problem, c, context(problem))["model_tflops_per_gpu"]


@pytest.mark.parametrize("name", ["22b", "175b", "530b", "1t"])
def test_korthikanti_selective_sp_beats_full_recompute(name):
    # Korthikanti et al. 2022 Table 5: sequence parallelism + selective recompute is faster than full
    # recompute without SP for every model (scenarios/published/korthikanti2022-*.yaml).
    from simdist.analytic.step import CommPricer, analytic_step
    from simdist.plan.layout import step_config_of as step_config
    from simdist.plan.model_presets import resolve_model

    times = []
    for extra in ([], ["training.recompute=full", "parallel.sequence_parallel=false"]):
        sc = api.load_scenario(f"scenarios/published/korthikanti2022-{name}.yaml", extra)
        cfg = step_config(sc.spec, sc.topology, resolve_model(sc.spec.model))
        times.append(analytic_step(cfg, CommPricer(sc.topology)).step_time_s)
    assert times[0] < times[1]


# Narayanan et al. 2021 Table 2 (validation/reference/megatron2021_table2_zero3_vs_ptdp.csv): PTD-P (tp 8, pp 12
# for 175B, pp 35 for 530B) reaches 141-171 TFLOP/s per GPU where ZeRO-3 without model parallelism reaches 44-144.
# Their ZeRO-3 is DeepSpeed's of 2021: each parameter tensor gathered before each use and each gradient
# reduce-scattered, blocking, through list collectives (training.zero3_fetch: per_parameter, simdist.plan.step).
# Rows: (model, ZeRO-3 GPUs, micro-batch, batch, published ZeRO-3 TFLOP/s, PTD-P GPUs, batch, published PTD-P).
TABLE2 = [
    ("gpt3-175b", 384, 4, 1536, 144, 384, 1536, 153),
    ("gpt3-175b", 768, 2, 1536, 88, 768, 1536, 149),
    ("gpt3-175b", 1536, 1, 1536, 44, 1536, 1536, 141),
    ("megatron-530b", 640, 4, 2560, 138, 560, 2240, 171),
    ("megatron-530b", 1120, 2, 2240, 98, 1120, 2240, 167),
    ("megatron-530b", 2240, 1, 2240, 48, 2240, 2240, 159),
]


def _table2(row, fetch="per_parameter"):
    model, zg, mbs, zb, _, pg, pb, _ = row
    pp = 12 if model == "gpt3-175b" else 35
    zp = SearchProblem(model, "dgx-a100", zg // 8, zb, precision="fp16", zero3_fetch=fetch)
    pp_problem = SearchProblem(model, "dgx-a100", pg // 8, pb, precision="fp16", zero3_fetch=fetch)
    zero3 = evaluate_one(zp, Candidate(1, 1, zg, 1, 1, mbs, 3, "full", False, "1f1b"), context(zp))
    ptdp = evaluate_one(pp_problem, Candidate(8, pp, pg // (8 * pp), 1, 1, 1, 1, "full", False, "1f1b"),
                        context(pp_problem))
    return zero3, ptdp


@pytest.mark.parametrize("row", TABLE2, ids=lambda r: f"{r[0]}-{r[1]}")
def test_megatron_table2_ptdp_beats_zero3(row):
    zero3, ptdp = _table2(row)
    assert ptdp["model_tflops_per_gpu"] > zero3["model_tflops_per_gpu"]


def test_megatron_table2_zero3_step_times():
    # Published step time = Megatron's FLOPs (96 B s l h^2 (1 + s/6h + V/16lh), their eq. 3) / (GPUs x TFLOP/s).
    # Measured: the 175B rows within 15.5% (-15.2, -12.6, +7.8 %), the 530B rows 20-25% fast; the step time stays
    # flat from the middle to the largest GPU count as published (communication per GPU does not shrink). The search
    # prices FlashAttention-2 at its published A100 rate (simdist/hardware/data/attention_kernels.csv), which these
    # 2021 DeepSpeed runs did not have (they ran materialized attention): that is most of the 175B rows' shortfall.
    errors = []
    for row in TABLE2:
        model, gpus, _, batch, published, *_ = row
        layers, h = (96, 12288) if model == "gpt3-175b" else (105, 20480)
        flops = 96 * batch * 2048 * layers * h * h * (1 + 2048 / (6 * h) + 51200 / (16 * layers * h))
        zero3, _ = _table2(row)
        errors.append(zero3["step_time_s"] / (flops / (gpus * published * 1e12)) - 1)
    assert all(-0.16 < e < 0.16 for e in errors[:3]), errors
    assert all(-0.25 < e < 0.05 for e in errors[3:]), errors
    # prefetched (FSDP-style) ZeRO-3 would have beaten PTD-P on the largest 175B row: the mechanism matters
    fast, ptdp = _table2(TABLE2[2], fetch="prefetch")
    assert fast["step_time_s"] < 0.4 * _table2(TABLE2[2])[0]["step_time_s"]
    assert fast["model_tflops_per_gpu"] > ptdp["model_tflops_per_gpu"]


def test_cli_search_json_html_and_errors(cli, tmp_path):
    page = tmp_path / "s.html"
    code, out, err = cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                         "--global-batch", "32", "--max-cp", "1", "--max-vpp", "2", "--top", "1", "--json",
                         "--html", str(page))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ranked"] and doc["engine"][0]["key"] == doc["ranked"][0]["key"]
    assert "Pareto front" in page.read_text() and "timeline" in page.read_text()
    code, out, err = cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                         "--global-batch", "32", "--max-cp", "1", "--max-vpp", "2", "--top", "0", "--explain-pruned")
    assert code == 0 and "pruned layouts:" in out and "memory" in out
    for args, needle in (
        (["--model", "nope", "--cluster", "dgx-h100"], "--model"),
        (["--model", "llama3-8b", "--cluster", "nope"], "unknown cluster"),
        (["--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "8", "--global-batch", "8"], "memory"),
    ):
        full = ["search", *args] + ([] if "--gpus" in args else ["--gpus", "16", "--global-batch", "32"])
        code, out, err = cli(*full)
        assert code == 2 and err.startswith("error:") and needle in err and len(err.strip().splitlines()) == 1


def test_zero3_fetch_needs_zero3(cli, tmp_path):
    code, _, err = cli("run", "scenarios/default.yaml", "--set", "training.zero3_fetch=per_parameter")
    assert code == 2 and "training.zero3_fetch" in err and "zero_stage: 3" in err
