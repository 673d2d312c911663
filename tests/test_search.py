"""Layout search: enumeration, pruning, ranking, resume, Ctrl-C, executors, published orderings, CLI."""

from __future__ import annotations

import json

import pytest

from simdist import api
from simdist.errors import LayoutError, SpecError
from simdist.search.evaluate import context, evaluate_one
from simdist.search.executors import Executor, ProcessExecutor
from simdist.search.rank import enumerate_feasible, run_search, sweep
from simdist.search.space import Candidate, SearchProblem

SMALL = SearchProblem("llama3-8b", "dgx-h100", 2, 32, max_cp=1, max_vpp=2, max_micro_batch=2)


def test_enumeration_prunes_with_reasons():
    feasible, pruned, n, gpus, _ = enumerate_feasible(SMALL)
    assert gpus == 16 and n == len(feasible) + len(pruned) and feasible
    rules = {p.rule for p in pruned}
    assert {"memory", "zero-with-pp"} <= rules
    for c in feasible:
        assert c.tp * c.pp * c.dp * c.cp == 16 and 32 % (c.micro_batch_size * c.dp) == 0
        assert not (c.zero_stage >= 2 and c.pp > 1)


def test_ranking_is_by_throughput_and_executor_independent():
    feasible, *_ = enumerate_feasible(SMALL)
    one, *_ = sweep(SMALL, feasible, Executor())
    with ProcessExecutor(2) as pool:
        two, *_ = sweep(SMALL, feasible, pool)
    assert one == two  # identical floats whichever process computed them
    out = run_search(SMALL, Executor(), top_k=1)
    speeds = [r["tokens_per_s"] for r in out.ranked]
    assert speeds == sorted(speeds, reverse=True)
    e = out.engine[0]
    assert e["key"] == out.ranked[0]["key"]
    assert abs(e["closed_form_error"]) < 0.05


def test_resume_and_interrupt(tmp_path):
    feasible, *_ = enumerate_feasible(SMALL)
    path = tmp_path / "r.jsonl"

    class Interrupting(Executor):
        def run(self, fn, jobs):
            yield 0, fn(*jobs[0])
            raise KeyboardInterrupt

    done, interrupted, new, resumed = sweep(SMALL, feasible, Interrupting(), results_file=path)
    assert interrupted and new == len(done) == min(64, len(feasible)) and resumed == 0
    lines = path.read_text().splitlines()
    assert json.loads(lines[0]) == {"problem": SMALL.as_dict()} and len(lines) == 1 + new
    with path.open("a") as f:
        f.write('{"key": "torn')  # a sweep killed mid-write
    full, interrupted, new2, resumed = sweep(SMALL, feasible, Executor(), results_file=path)
    assert not interrupted and resumed == new and new2 == len(feasible) - new
    fresh, *_ = sweep(SMALL, feasible, Executor())
    assert full == fresh
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
    from simdist.plan.model_presets import resolve_model
    from simdist.predict.step import step_config

    times = []
    for extra in ([], ["training.recompute=full", "parallel.sequence_parallel=false"]):
        sc = api.load_scenario(f"scenarios/published/korthikanti2022-{name}.yaml", extra)
        cfg = step_config(sc.spec, sc.topology, resolve_model(sc.spec.model))
        times.append(analytic_step(cfg, CommPricer(sc.topology)).step_time_s)
    assert times[0] < times[1]


# Narayanan et al. 2021 Table 2 (validation/reference/megatron2021_table2_zero3_vs_ptdp.csv): PTD-P (tp 8,
# pp 12) reaches 141-153 TFLOP/s per GPU where ZeRO-3 (tp 1, pp 1) reaches 44-144. The closed form (and the
# engine) price ZeRO-3's gathers as bandwidth-optimal NCCL collectives (one per model chunk, ~1.8 s for 175B
# over 8 HDR NICs per node) and so rank ZeRO-3 above PTD-P: a known gap of the model, kept visible here.
@pytest.mark.xfail(strict=True, reason="ZeRO-3 traffic is priced bandwidth-optimal; measured DeepSpeed ZeRO-3 "
                                        "was 1.1x-3.2x slower than PTD-P (see the search report)")
@pytest.mark.parametrize("gpus,mbs", [(384, 4), (1536, 1)])
def test_megatron_table2_ptdp_beats_zero3_175b(gpus, mbs):
    p = SearchProblem("gpt3-175b", "dgx-a100", gpus // 8, 1536, precision="fp16")
    zero3 = _tflops(p, Candidate(1, 1, gpus, 1, 1, mbs, 3, "full", False, "1f1b"))
    ptdp = _tflops(p, Candidate(8, 12, gpus // 96, 1, 1, 1, 1, "full", False, "1f1b"))
    assert ptdp > zero3


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
    assert code == 0 and "pruned layouts:" in out and "zero-with-pp" in out
    for args, needle in (
        (["--model", "nope", "--cluster", "dgx-h100"], "--model"),
        (["--model", "llama3-8b", "--cluster", "nope"], "unknown cluster"),
        (["--model", "gpt3-175b", "--cluster", "dgx-a100", "--gpus", "8", "--global-batch", "8"], "memory"),
    ):
        full = ["search", *args] + ([] if "--gpus" in args else ["--gpus", "16", "--global-batch", "32"])
        code, out, err = cli(*full)
        assert code == 2 and err.startswith("error:") and needle in err and len(err.strip().splitlines()) == 1
