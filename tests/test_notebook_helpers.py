"""The notebook helpers 07_buying.ipynb uses (simdist.notebooks): a scenario dict written as a file, goodput
without a step, the band figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist import api
from simdist import notebooks as nb
from simdist.errors import SimdistError, SpecError
from simdist.predict.goodput import goodput
from simdist.spec.faults import CheckpointSpec


def test_write_scenario_validates_then_writes_what_run_reads(tmp_path: Path) -> None:
    spec = nb.lecture_mlp_spec(dp=2)
    path = nb.write_scenario(spec, tmp_path / "mlp.yaml")
    assert api.run(path).result["step_time_s"] == nb.run_spec(spec).result["step_time_s"]
    bad = {**spec, "parallel": {**spec["parallel"], "dp": 3}}  # 3 x 1 x 1 ranks on a 2-GPU cluster
    with pytest.raises(SimdistError, match="parallel"):
        nb.write_scenario(bad, tmp_path / "bad.yaml")
    typo = {**spec, "trainig": {}}
    with pytest.raises(SpecError, match="trainig"):
        nb.write_scenario(typo, tmp_path / "typo.yaml")
    assert not (tmp_path / "bad.yaml").exists() and not (tmp_path / "typo.yaml").exists()


def test_goodput_helper_is_the_run_jsons_goodput() -> None:
    # Llama 3's cluster: 16,384 GPUs in 2,048 hosts of 8, one NIC per GPU (Dubey et al. 2024 sec 3.3.1)
    cp = {"write": "30 s", "restart": "5 min"}
    ours = nb.goodput(16384, 405e9, checkpoint=cp)
    ref = goodput(num_gpus=16384, num_hosts=2048, num_nics=16384, num_params=405e9,
                  checkpoint=CheckpointSpec.model_validate(cp))
    assert ours == ref and ours["failures_per_day"] == pytest.approx(419 / 54, rel=1e-12)
    # a partial last host counts as a host; a host without NICs has none
    assert nb.goodput(12, 8e9, nics_per_node=0)["failures_per_day"] == goodput(
        num_gpus=12, num_hosts=2, num_nics=0, num_params=8e9, checkpoint=CheckpointSpec())["failures_per_day"]
    with pytest.raises(SpecError, match=r"faults\.checkpoint\.write"):
        nb.goodput(8, 8e9, checkpoint={"write": 30})
    with pytest.raises(SpecError, match="num_gpus"):
        nb.goodput(0, 8e9)


def test_band_chart_draws_each_band_and_prediction() -> None:
    bands = [{"p10": 1.0, "p50": 1.1, "p90": 1.5}, {"p10": 2.0, "p50": 2.2, "p90": 2.4}]
    fig = nb.band_chart(["a", "b"], bands, [1.05, 2.1], title="t")
    bar, p50, pred = fig.data
    assert list(bar.base) == [1.0, 2.0] and list(bar.x) == pytest.approx([0.5, 0.4])
    assert list(p50.x) == [1.1, 2.2] and list(pred.x) == [1.05, 2.1]
