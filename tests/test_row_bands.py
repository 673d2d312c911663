"""Prediction bands in `search` and `compare` rows (issue 16 item 5): each row's band is the band `simdist run`
reports for that layout at the same fidelity, days to train scale with it, and the tables and chart show it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simdist import api
from simdist.errors import SpecError

SPACE = {"max_pp": 1, "max_cp": 1, "max_vpp": 1, "max_micro_batch": 1, "schedules": ("1f1b",), "contention": False}
"""A small space, ranked by the contention-free closed form (`run --fidelity closed_form`'s; the contention
estimate's band is that band scaled: tests/test_search_contention.py)."""
QUANTILES = ("p10", "p50", "p90")


def _scenario(tmp_path: Path) -> Path:
    """Llama 3 8B on two DGX H100 nodes, one 64-port switch (a small fabric: the searches take a second)."""
    path = tmp_path / "s.yaml"
    path.write_text("""
cluster: {preset: dgx-h100, num_nodes: 2, inter_node: {kind: roce, fabric: fat_tree}}
model: {preset: llama3-8b}
parallel: {tp: 1, pp: 1, dp: 16}
training: {micro_batch_size: 1, global_batch_size: 64, precision: bf16}
""")
    return path


def _layout_sets(layout: dict) -> list[str]:
    """A ranked row's layout as the `--set` items of `simdist run`."""
    return [*(f"parallel.{k}={layout[k]}" for k in ("tp", "pp", "dp", "cp", "vpp", "zero_stage", "sequence_parallel")),
            f"training.micro_batch_size={layout['micro_batch_size']}", f"training.recompute={layout['recompute']}",
            f"schedule={layout['schedule']}"]


def test_search_rows_carry_the_band_run_reports_for_their_layout(tmp_path: Path) -> None:
    from simdist.search.rank import closed_form_band

    path = _scenario(tmp_path)
    out = api.search(scenario=path, top_k=2, rows=3, **SPACE)
    doc = out.doc
    assert len(doc["engine"]) == 2
    for e in doc["engine"]:
        band = e["step_time_band_s"]
        assert band["p10"] <= band["p50"] <= band["p90"] and band["p10"] < band["p90"]
        # the engine's re-simulation is `simdist run` of the layout: the same step and the same band
        run = api.run(path, _layout_sets(e["layout"])).result
        assert run["step_time_s"] == pytest.approx(e["engine_step_time_s"], rel=1e-12)
        assert run["step_time_band_s"] == pytest.approx(band, rel=1e-12)
    # a closed-form row's band (rows the engine did not re-simulate) is `run --fidelity closed_form`'s
    row = doc["ranked"][2]
    cf = api.run(path, _layout_sets(row["layout"]), fidelity="closed_form").result
    assert cf["step_time_s"] == pytest.approx(row["step_time_s"], rel=1e-12)
    from simdist.api.search import scenario_problem

    band = closed_form_band(scenario_problem(path, [], **SPACE), row)
    assert band == pytest.approx(cf["step_time_band_s"], rel=1e-12)
    # the table shows p10-p90 beside the engine's step, for the re-simulated rows only
    header = next(line for line in out.text.splitlines() if "engine s" in line)
    assert "p10-p90 s" in header
    first = doc["engine"][0]["step_time_band_s"]
    assert f"{first['p10']:.3f}-{first['p90']:.3f}" in out.text


def test_grid_summary_carries_the_winners_band(tmp_path: Path) -> None:
    out = api.search(scenario=_scenario(tmp_path), grid=['cluster.inter_node.nic_bandwidth="200 Gb/s","400 Gb/s"'],
                     top_k=1, **SPACE)
    for point, row in zip(out.doc["points"], out.doc["summary"], strict=True):
        assert row["step_time_band_s"] == point["engine"][0]["step_time_band_s"]
        assert f"{row['step_time_band_s']['p10']:.3f}-{row['step_time_band_s']['p90']:.3f}" in out.text


def test_compare_rows_carry_the_band_and_days_scale_with_it(cli, tmp_path: Path) -> None:
    code, out, err = cli("compare", "--model", "llama3-8b", "--cluster", "dgx-a100:16", "--cluster", "dgx-h100:8",
                         "--tokens", "1e10", "--global-batch", "64", "--max-pp", "1", "--max-cp", "1", "--max-vpp", "1",
                         "--max-micro-batch", "1", "--schedules", "1f1b", "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    for r in rows:
        assert r["fidelity"] == "engine" and r["layout"].split("-")[1] == "pp1"  # the bounds reached the search
        band, days = r["step_time_band_s"], r["time_to_train_days_band"]
        assert band["p10"] <= band["p50"] <= band["p90"]
        for q in QUANTILES:  # days = tokens / (tokens per step / step): the band scales the same way
            assert days[q] == pytest.approx(r["time_to_train_days"] * band[q] / r["step_time_s"], rel=1e-12)
    from simdist.report.notebook_figures import compare_figure
    from simdist.report.search_table import compare_text

    text = compare_text(rows, tokens=1e10, pue=1.0)
    assert "days p10-p90" in text
    for r in rows:
        d = r["time_to_train_days_band"]
        assert f"{d['p10']:.2f}-{d['p90']:.2f}" in text
    from simdist.report.search_html import compare_figure as html_compare_figure

    up = [r["time_to_train_days_band"]["p90"] - r["time_to_train_days"] for r in rows]
    down = [r["time_to_train_days"] - r["time_to_train_days_band"]["p10"] for r in rows]
    for figure in (compare_figure, html_compare_figure):  # the days bars carry the band as asymmetric error bars
        days_panel = figure(rows).data[0]
        assert list(days_panel.error_y.array) == pytest.approx(up)
        assert list(days_panel.error_y.arrayminus) == pytest.approx(down)
        assert figure(rows).data[1].error_y.array is None  # cost has no band of its own


def test_compare_space_bounds_are_checked(cli) -> None:
    with pytest.raises(SpecError, match="--max-pp"):
        api.compare("llama3-8b", None, None, 1e9, sized=["dgx-h100:8"], max_pp=0)
    code, _, err = cli("compare", "--model", "llama3-8b", "--cluster", "dgx-h100:8", "--tokens", "1e9",
                       "--schedules", "zigzag")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "schedule" in err
