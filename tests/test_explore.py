"""Search and compare over a base scenario (grids, placement, budgets); reports that reproduce (issue 16: 1, 2, 6)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from simdist import api
from simdist.errors import SpecError
from simdist.search.space import placement_orders

REPO = Path(__file__).resolve().parents[1]
SMALL = ["--max-cp", "1", "--max-vpp", "2", "--max-micro-batch", "2", "--schedules", "1f1b"]
"""Bounds that keep a search of llama3-8b on one or two nodes small (the space, not the question, is smaller)."""
SMALL_API = {"max_cp": 1, "max_vpp": 2, "max_micro_batch": 2, "schedules": ("1f1b",)}
"""`SMALL` as `api.compare` keywords."""


def _scenario(tmp_path: Path, **cluster) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump({
        "name": "Llama 3 8B on DGX H100 over InfiniBand",
        "cluster": {"preset": "dgx-h100", "num_nodes": 2, **cluster},
        "model": {"preset": "llama3-8b"},
        "parallel": {"tp": 8, "pp": 2, "dp": 1},
        "training": {"global_batch_size": 32, "micro_batch_size": 1},
    }))
    return path


def test_placement_orders_dedupe_and_keep_tp_innermost():
    default = ("tp", "cp", "dp", "pp")
    # cp = 1: only where dp and pp go differs; tp first in every order.
    assert placement_orders({"tp": 8, "cp": 1, "dp": 2, "pp": 8}, default) == ["", "tp-cp-pp-dp"]
    # one axis > 1 besides tp: every order places the ranks alike.
    assert placement_orders({"tp": 8, "cp": 1, "dp": 16, "pp": 1}, default) == [""]
    orders = placement_orders({"tp": 2, "cp": 2, "dp": 2, "pp": 2}, default)
    assert len(orders) == 6 and orders[0] == "" and all(o.startswith("tp-") for o in orders[1:])


def test_scenario_search_equals_the_preset_form_and_run(cli, tmp_path):
    """A scenario that says what the flags say ranks the same layouts with the same numbers; each row's layout
    run by `simdist run --fidelity closed_form` gives the row's step time (one builder, one validity check)."""
    scenario = _scenario(tmp_path)
    # (ranked by the contention-free closed form, which is `run --fidelity closed_form`'s)
    code, out, err = cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16",
                         "--global-batch", "32", "--top", "0", "--no-placement", "--no-contention", *SMALL, "--json")
    assert code == 0, err
    flags = json.loads(out)
    code, out, err = cli("search", str(scenario), "--top", "0", "--no-placement", "--no-contention", *SMALL, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert [r["key"] for r in doc["ranked"]] == [r["key"] for r in flags["ranked"]]
    assert [r["step_time_s"] for r in doc["ranked"]] == [r["step_time_s"] for r in flags["ranked"]]
    assert doc["scenario_resolved"]["cluster"]["num_nodes"] == 2 and doc["simdist_version"]
    assert doc["inputs_sha256"] != flags["inputs_sha256"]
    best = doc["ranked"][0]["layout"]
    sets = [f"parallel.{k}={best[k]}" for k in ("tp", "pp", "dp", "cp", "vpp", "zero_stage", "sequence_parallel")]
    sets += [f"training.micro_batch_size={best['micro_batch_size']}", f"training.recompute={best['recompute']}",
             f"schedule={best['schedule']}"]
    run = api.run(scenario, sets, fidelity="closed_form").result
    assert run["step_time_s"] == pytest.approx(doc["ranked"][0]["step_time_s"], rel=1e-12)


def test_grid_varies_any_field_and_resizes(cli, tmp_path):
    scenario = _scenario(tmp_path)
    code, out, err = cli("search", str(scenario), "--grid", 'cluster.inter_node.nic_bandwidth="100 Gb/s","400 Gb/s"',
                         "--grid", "cluster.num_nodes=1,2", "--top", "0", "--no-placement", *SMALL, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["grid"] == {"cluster.inter_node.nic_bandwidth": ["100 Gb/s", "400 Gb/s"],
                           "cluster.num_nodes": ["1", "2"]}
    assert [p["values"] for p in doc["points"]] == [
        {"cluster.inter_node.nic_bandwidth": b, "cluster.num_nodes": n}
        for b in ("100 Gb/s", "400 Gb/s") for n in ("1", "2")]
    points = {(p["values"]["cluster.inter_node.nic_bandwidth"], p["values"]["cluster.num_nodes"]): p
              for p in doc["points"]}
    assert points[("100 Gb/s", "2")]["num_gpus"] == 16 and points[("100 Gb/s", "1")]["num_gpus"] == 8
    assert points[("100 Gb/s", "2")]["scenario_resolved"]["cluster"]["inter_node"]["nic_bandwidth"] == "100 Gb/s"
    # One node never crosses the NICs: the same best step at either bandwidth; on two nodes a slower NIC cannot
    # make the best layout faster.
    one = [points[(b, "1")]["ranked"][0]["step_time_s"] for b in ("100 Gb/s", "400 Gb/s")]
    assert one[0] == one[1]
    two = [points[(b, "2")]["ranked"][0]["step_time_s"] for b in ("100 Gb/s", "400 Gb/s")]
    assert two[0] >= two[1]
    assert [s["step_time_s"] for s in doc["summary"]] == [p["ranked"][0]["step_time_s"] for p in doc["points"]]
    code, out, err = cli("search", str(scenario), "--grid", "cluster.inter_node.oversubscription=1,2", "--top", "0",
                         "--no-placement", *SMALL)
    assert code == 0 and "best layout per grid point" in out and "== cluster.inter_node.oversubscription=2" in out


def test_search_with_a_topology_file_and_set(cli, tmp_path):
    scenario = _scenario(tmp_path)
    topo = REPO / "docs" / "examples" / "h100-roce-4nic.yaml"
    code, out, err = cli("search", str(scenario), "--cluster", str(topo), "--gpus", "16", "--top", "0",
                         "--no-placement", *SMALL, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["num_gpus"] == 16 and doc["scenario_resolved"]["cluster"]["file"] == str(topo.resolve())
    assert "RoCE" in doc["cluster_title"] and "4x 400 Gb/s" in doc["cluster_title"]
    code, out, err = cli("search", str(scenario), "--set", "cluster.inter_node.kind=roce", "--top", "0",
                         "--no-placement", *SMALL, "--json")
    assert code == 0, err
    title = json.loads(out)["cluster_title"]
    assert "RoCE" in title and "InfiniBand" not in title


def test_search_scenario_bad_input_is_one_line(cli, tmp_path):
    scenario = _scenario(tmp_path)
    for args, needle in (
            (["--grid", "cluster.num_nodes"], "--grid"),
            (["--grid", "cluster.inter_node.kind=roce,token_ring"], "--grid"),
            (["--model", "llama3-8b"], "--model"),
            (["--gpus", "12"], "--gpus")):
        code, _, err = cli("search", str(scenario), *args, "--top", "0", *SMALL)
        assert code == 2 and needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    code, _, err = cli("search", "--model", "llama3-8b", "--gpus", "8", "--global-batch", "8")
    assert code == 2 and "--cluster" in err


def test_placement_search_reports_its_gain(cli, tmp_path):
    """With the axis order searched the winner is never slower than without (the default order is a candidate),
    and the report gives every order of the winning layout, the best chosen by the engine when it runs."""
    scenario = _scenario(tmp_path, inter_node={"fabric": "fat_tree", "oversubscription": 4, "switch_radix": 4})
    args = ["search", str(scenario), "--gpus", "32", "--set", "training.global_batch_size=64", *SMALL, "--json"]
    code, out, err = cli(*args, "--top", "0", "--no-placement")
    assert code == 0, err
    plain = json.loads(out)
    code, out, err = cli(*args, "--top", "0")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ranked"][0]["step_time_s"] <= plain["ranked"][0]["step_time_s"]
    p = doc["placement"]
    assert p["default_order"] == "tp-cp-dp-pp" and p["chosen_by"] == "closed_form" and p["gain"] >= 0
    assert p["orders"][0]["order"] == "tp-cp-dp-pp" and p["default_step_time_s"] == p["orders"][0]["step_time_s"]
    assert p["step_time_s"] == min(o["step_time_s"] for o in p["orders"])
    assert p["gain"] == pytest.approx(p["default_step_time_s"] / p["step_time_s"] - 1)
    same = {r["key"]: r["step_time_s"] for r in plain["ranked"]}
    default_key = p["orders"][0]["key"]
    if default_key in same:  # the default order's row, as the search without placement has it
        assert p["default_step_time_s"] == same[default_key]
    code, out, err = cli(*args, "--top", "1")
    assert code == 0, err
    p = json.loads(out)["placement"]
    assert p["chosen_by"] == "engine" and all("engine_step_time_s" in o for o in p["orders"])
    assert p["engine_step_time_s"] == min(o["engine_step_time_s"] for o in p["orders"])
    assert p["engine_gain"] == pytest.approx(p["default_engine_step_time_s"] / p["engine_step_time_s"] - 1)


def test_explain_pruned_counts_by_reason_first(cli):
    code, out, err = cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch",
                         "16", "--top", "0", "--no-placement", *SMALL, "--explain-pruned")
    assert code == 0, err
    lines = out.splitlines()
    head = next(i for i, ln in enumerate(lines) if ln.startswith("pruned layouts:"))
    each = next(i for i, ln in enumerate(lines) if ln == "each pruned layout:")
    counts = [int(ln.split(": ")[1]) for ln in lines[head + 1:each]
              if ln.startswith("  ") and not ln.startswith("    ")]
    assert counts and counts == sorted(counts, reverse=True)
    listed = [ln for ln in lines[each + 1:] if ln.startswith("  ")]
    assert sum(counts) == int(lines[head].split(": ")[1].split(",")[0]) == len(listed)


def test_heatmap_labels_infeasible_cells(cli, tmp_path):
    page = tmp_path / "s.html"
    code, out, err = cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch",
                         "16", "--top", "0", "--no-placement", *SMALL, "--json", "--html", str(page))
    assert code == 0, err
    doc = json.loads(out)
    feasible = {(r["layout"]["tp"], r["layout"]["pp"]) for r in (*doc["ranked"], *doc["bounded"])}
    for cell, reason in doc["infeasible_cells"].items():
        tp, pp = (int(v) for v in cell.split(","))
        assert (tp, pp) not in feasible and reason.split(" ")[0] in {*api_rules(), "memory"}
        assert reason in page.read_text()


def api_rules() -> tuple[str, ...]:
    from simdist.plan.layout import RULES

    return RULES


def test_compare_clusters_each_with_its_size_one_fidelity(cli, tmp_path):
    """'16 A100 against 8 H100': each its own count; step, tokens/s and MFU all from the engine (MFU scales as
    1 / step against the closed form's)."""
    page = tmp_path / "c.html"
    code, out, err = cli("compare", "--model", "llama3-8b", "--cluster", "dgx-a100:16", "--cluster", "dgx-h100:8",
                         "--tokens", "1e9", "--global-batch", "144", "--price", "dgx-h100=2.5", *SMALL, "--json",
                         "--html", str(page))
    assert code == 0, err
    rows = {r["cluster"]: r for r in json.loads(out)["rows"]}
    assert rows["dgx-a100"]["num_gpus"] == 16 and rows["dgx-h100"]["num_gpus"] == 8
    for r in rows.values():
        assert r["fidelity"] == "engine"
        assert r["mfu"] / r["closed_form_mfu"] == pytest.approx(r["closed_form_step_time_s"] / r["step_time_s"])
        assert r["tokens_per_s"] * r["step_time_s"] == pytest.approx(144 * 8192)
    text = page.read_text()
    assert "days to train" in text and "energy (MWh)" in text and "cost (M USD)" in text
    from simdist.report.search_html import compare_figure

    fig = compare_figure(list(rows.values()))  # three panels side by side, each on its own axis: no twin axes
    assert len(fig.data) == 3 and {t.xaxis for t in fig.data} == {"x", "x2", "x3"}
    assert all(fig.layout[f"yaxis{k}"].overlaying is None for k in ("", "2", "3"))


def test_compare_equal_budget_sizes_by_hand(cli):
    """60 USD/h at 2.5 USD per H100-hour buys floor(60 / 20) = 3 nodes; 9 kW at 700 W x 8 per node powers
    floor(9 / 5.6) = 1 node."""
    doc = api.compare("llama3-8b", None, None, 1e9, sized=["dgx-h100"], global_batch_size=144,
                      prices=["dgx-h100=2.5"], budget_usd_per_hour=60, **SMALL_API)
    (row,) = doc["rows"]
    assert row["num_gpus"] == 24 and row["usd_per_hour"] == 60 and doc["answer"]["cluster"] == "dgx-h100 x 24"
    doc = api.compare("llama3-8b", None, None, 1e9, sized=["dgx-h100"], global_batch_size=144, budget_kw=9, **SMALL_API)
    assert doc["rows"][0]["num_gpus"] == 8 and doc["rows"][0]["power_kw"] == pytest.approx(5.6)
    with pytest.raises(SpecError, match="price of dgx-a100"):
        api.compare("llama3-8b", None, None, 1e9, sized=["dgx-a100"], budget_usd_per_hour=60)
    with pytest.raises(SpecError, match="no GPU count"):
        api.compare("llama3-8b", None, None, 1e9, sized=["dgx-a100"])
    code, _, err = cli("compare", "--model", "llama3-8b", "--cluster", "dgx-a100:8", "--tokens", "1e9",
                       "--budget-kw", "9", "--days", "3")
    assert code == 2 and "together" in err and len(err.strip().splitlines()) == 1


def test_compare_deadline_picks_the_cheapest_that_makes_it():
    doc = api.compare("llama3-8b", None, None, 1e10, sized=["dgx-a100:8", "dgx-h100:8", "dgx-h100:16"],
                      global_batch_size=144, prices=["dgx-a100=1", "dgx-h100=2.5"], days=10,
                      **SMALL_API)
    rows = doc["rows"]
    for r in rows:
        assert r["meets_deadline"] == (r["time_to_train_days"] <= 10)
    making = [r for r in rows if r["meets_deadline"]]
    assert making and doc["answer"]["cluster"] == min(making, key=lambda r: r["cost_usd"])["label"]


def test_compare_deadline_sizes_by_doubling():
    doc = api.compare("llama3-8b", None, None, 1e9, sized=["dgx-h100"], global_batch_size=64, days=0.2, **SMALL_API)
    (row,) = doc["rows"]
    assert row["meets_deadline"] and row["time_to_train_days"] <= 0.2
    nodes = row["num_nodes"]
    assert nodes & (nodes - 1) == 0  # a power of two
    if nodes > 1:  # half as many nodes does not make it
        half = api.compare("llama3-8b", None, None, 1e9, sized=[f"dgx-h100:{8 * nodes // 2}"],
                           global_batch_size=64, **SMALL_API)["rows"][0]
        assert "error" in half or half["time_to_train_days"] > 0.2


def test_run_report_reproduces_and_titles_follow_overrides(cli, tmp_path):
    scenario = REPO / "scenarios" / "default.yaml"
    out = tmp_path / "report"
    code, _, err = cli("run", str(scenario), "--set", "inter_node.kind=roce", "--set",
                       "training.global_batch_size=32", "--fidelity", "closed_form", "--out", str(out))
    assert code == 0, err
    first = json.loads((out / "report.json").read_text())
    assert "InfiniBand" not in first["name"] and "RoCE" in first["name"]
    assert first["scenario_resolved"]["cluster"]["inter_node"]["kind"] == "roce"
    assert first["scenario_resolved"]["training"]["global_batch_size"] == 32
    assert first["overrides"] == ["cluster.inter_node.kind=roce", "training.global_batch_size=32"]
    assert first["run_options"] == {"simulate": "auto", "fidelity": "closed_form"}
    assert len(first["inputs_sha256"]) == 64 and first["simdist_version"]
    code, _, err = cli("run", str(out / "report.json"), "--out", str(tmp_path / "again"))
    assert code == 0, err
    second = json.loads((tmp_path / "again" / "report.json").read_text())
    for key in ("step_time_s", "mfu", "tokens_per_s", "bubble_fraction", "memory_per_gpu_bytes", "inputs_sha256",
                "layout", "breakdown", "name"):
        if key in first:
            assert second[key] == first[key], key
    # the scenario as written: its own name, another hash
    plain = api.run(scenario, fidelity="closed_form").result
    assert plain["inputs_sha256"] != first["inputs_sha256"] and plain["name"] == first["scenario_name"]
    code, _, err = cli("run", str(tmp_path / "x.json"))
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_version(cli):
    import simdist

    code, out, _ = cli("--version")
    assert code == 0 and out.strip() == f"simdist {simdist.__version__}"
    assert math.isfinite(float(simdist.__version__.split(".")[0]))


def test_ctrl_c_in_the_engine_phase_keeps_the_ranking(cli, tmp_path, monkeypatch):
    """Ctrl-C while the engine re-simulates: the closed-form ranking is printed, exit 130, and how to resume."""
    import simdist.search.rank as rank

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(rank, "resimulate", interrupted)
    results = tmp_path / "r.jsonl"
    code, out, err = cli("search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch",
                         "16", "--top", "1", "--no-placement", *SMALL, "--out", str(results))
    assert code == 130 and "tokens/s" in out and f"--resume {results}" in err


def test_ctrl_c_in_a_grid_keeps_the_points_that_finished(cli, tmp_path, monkeypatch):
    import sys

    search = sys.modules["simdist.api.search"]  # the module (simdist.api.search is also the function's name)
    real = search._search_one
    calls = []

    def second_interrupted(problem, **kwargs):
        calls.append(problem)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(problem, **kwargs)

    monkeypatch.setattr(search, "_search_one", second_interrupted)
    code, out, err = cli("search", str(_scenario(tmp_path)), "--grid", "cluster.inter_node.oversubscription=1,2,4",
                         "--top", "0", "--no-placement", *SMALL, "--json")
    assert code == 130 and "1 of 3 grid points" in err and "--out" in err
    doc = json.loads(out)
    assert doc["interrupted"] and len(doc["points"]) == 1 and doc["points"][0]["values"] == {
        "cluster.inter_node.oversubscription": "1"}


def test_search_an_hf_config_model_from_another_folder(cli, tmp_path, monkeypatch):
    """A scenario naming a Hugging Face config.json next to it searches from any working directory (its path is
    made absolute in the resolved base), and ranks as the preset of the same model does."""
    from tests.test_model_presets import LLAMA3_8B_CONFIG

    folder = tmp_path / "exp"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA3_8B_CONFIG))
    scenario = _scenario(folder)
    data = yaml.safe_load(scenario.read_text())
    data["model"] = {"hf_config": "config.json"}
    scenario.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(tmp_path)
    code, out, err = cli("search", str(scenario), "--gpus", "8", "--top", "0", "--no-placement", *SMALL, "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["scenario_resolved"]["model"]["hf_config"] == str((folder / "config.json").resolve())
    code, out, err = cli("search", str(_scenario(tmp_path)), "--gpus", "8", "--top", "0", "--no-placement", *SMALL,
                         "--json")
    preset = json.loads(out)
    assert [r["step_time_s"] for r in doc["ranked"]] == [r["step_time_s"] for r in preset["ranked"]]
