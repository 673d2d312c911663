"""Hardware comparison: best layout per cluster; time, cost and energy follow from the throughput."""

from __future__ import annotations

import json

import pytest

from simdist import api
from simdist.errors import PresetError, SpecError


@pytest.mark.slow
def test_compare_time_cost_energy(cli, tmp_path):
    page = tmp_path / "c.html"
    code, out, err = cli("compare", "--model", "llama3-8b", "--clusters", "dgx-a100,dgx-h100,gb200-nvl72",
                         "--gpus", "16", "--tokens", "1e9", "--global-batch", "144", "--price", "dgx-h100=2.5",
                         "--max-cp", "1", "--max-micro-batch", "2", "--schedules", "1f1b",  # what follows holds for
                         # any winning layout (the default's interleaved_1f1b layouts would take most of the time)
                         "--json", "--html", str(page))
    assert code == 0, err
    rows = {r["cluster"]: r for r in json.loads(out)["rows"]}
    a100, h100, gb = rows["dgx-a100"], rows["dgx-h100"], rows["gb200-nvl72"]
    assert h100["tokens_per_s"] > a100["tokens_per_s"]  # 3.2x the bf16 peak, same GPU count
    for r in (a100, h100):
        assert r["num_gpus"] == 16 and r["note"] == ""
        assert r["time_to_train_s"] == pytest.approx(1e9 / r["tokens_per_s"])
        assert r["gpu_hours"] == pytest.approx(16 * r["time_to_train_s"] / 3600)
    assert h100["cost_usd"] == pytest.approx(h100["gpu_hours"] * 2.5) and a100["cost_usd"] is None
    # Energy: GPUs at TDP (A100 400 W, H100 700 W), PUE 1.
    assert a100["energy_kwh"] == pytest.approx(16 * 400 * a100["time_to_train_s"] / 3.6e6)
    assert h100["energy_kwh"] == pytest.approx(16 * 700 * h100["time_to_train_s"] / 3.6e6)
    # A gb200-nvl72 node is a 72-GPU rack: 16 GPUs are 16 of one rack (cluster.placement), and the row says so.
    assert gb["num_gpus"] == 16 and gb["num_nodes"] == 1 and "16 of the 72 on each of 1 node(s)" in gb["note"]
    assert "days to train" in page.read_text()


def test_compare_bad_input(cli):
    with pytest.raises(SpecError, match="not compared"):
        api.compare("llama3-8b", ["dgx-a100"], 8, 1e9, prices=["dgx-h100=2"])
    with pytest.raises(PresetError, match="unknown cluster"):  # found after dgx-a100's search: a small space for it
        api.compare("llama3-8b", ["dgx-a100", "nope"], 8, 1e9, max_cp=1, max_micro_batch=2, schedules=("1f1b",))
    code, _, err = cli("compare", "--model", "llama3-8b", "--clusters", "dgx-a100", "--gpus", "8", "--tokens",
                       "1e9", "--price", "dgx-h100=2")
    assert code == 2 and err.startswith("error: --price") and len(err.strip().splitlines()) == 1
