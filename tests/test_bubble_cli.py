"""`simdist bubble` and `simdist schedule`: JSON, tables, sweeps, charts and bad input."""

import json

import pytest

from simdist import api
from simdist.errors import SpecError


@pytest.mark.parametrize(("m", "bubble", "utilization"), [(4, 3 / 7, "57.1"), (16, 3 / 19, "84.2")])
def test_bubble_json_k4(cli, m, bubble, utilization):
    code, out, err = cli("bubble", "--schedule", "1f1b", "--stages", "4", "--microbatches", str(m), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["bubble_fraction"] == pytest.approx(bubble, abs=1e-9)
    assert doc["formula"] == pytest.approx(bubble, abs=1e-12)
    assert f"{doc['utilization'] * 100:.1f}" == utilization
    assert (doc["schedule"], doc["stages"], doc["microbatches"], doc["virtual"]) == ("1f1b", 4, m, 1)


def test_bubble_table(cli):
    code, out, _ = cli("bubble", "--schedule", "gpipe", "--stages", "4", "--microbatches", "4")
    assert code == 0
    assert "42.86%" in out and "57.14%" in out and "(K-1)/(M+K-1)" in out


def test_interleaved_json(cli):
    code, out, err = cli("bubble", "--schedule", "interleaved_1f1b", "--stages", "4", "--microbatches", "8",
                         "--virtual", "2", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["bubble_fraction"] == pytest.approx(3 / 19, abs=1e-9) and doc["virtual"] == 2


def test_slow_stage_via_cli(cli):
    code, out, _ = cli("bubble", "--schedule", "1f1b", "--stages", "4", "--microbatches", "16",
                       "--stage-times", "1,1,1.5,1", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["bubble_fraction"] > doc["formula"] + 0.05
    assert doc["backward_s"] == [2.0, 2.0, 3.0, 2.0]


@pytest.mark.parametrize(("argv", "needle"), [
    (["--schedule", "pipedream", "--stages", "4", "--microbatches", "8"], "--schedule: unknown schedule"),
    (["--schedule", "interleaved_1f1b", "--stages", "4", "--microbatches", "6", "--virtual", "2"],
     "multiple of the pipeline stages"),
    (["--schedule", "1f1b", "--stages", "0", "--microbatches", "8"], "--stages"),
    (["--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--virtual", "2"], "--virtual"),
    (["--schedule", "1f1b", "--stages", "4", "--microbatches", "8", "--stage-times", "1,2"], "--stage-times"),
    (["--schedule", "1f1b", "--stages", "4"], "--microbatches"),
])
def test_bad_input_exits_2_with_one_line(cli, argv, needle):
    code, out, err = cli("bubble", *argv)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1


def test_sweep_json_and_html(cli, tmp_path):
    page = tmp_path / "bubble.html"
    code, out, err = cli("bubble", "--schedule", "interleaved_1f1b", "--stages", "4", "--virtual", "2",
                         "--sweep-microbatches", "1:16", "--html", str(page), "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert [r["microbatches"] for r in rows] == [4, 8, 12, 16]  # interleaved keeps multiples of K
    for r in rows:
        assert r["bubble_fraction"] == pytest.approx(3 / (2 * r["microbatches"] + 3), abs=1e-9)
    text = page.read_text()
    assert "plotly" in text and "simulated" in text and "formula" in text


def test_sweep_table_falls_with_m(cli):
    code, out, _ = cli("bubble", "--schedule", "zb_h1", "--stages", "4", "--sweep-microbatches", "4,8,16")
    assert code == 0
    rows = [ln.split() for ln in out.splitlines() if not ln.startswith("#")]
    assert [r[0] for r in rows] == ["4", "8", "16"]
    assert rows[1][1] == "11.11%"  # (K-1)/(3M+K-1) = 3/27


def test_schedule_grid_command(cli):
    code, out, err = cli("schedule", "--schedule", "zb_h1", "--stages", "3", "--microbatches", "4")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split() == ["stage", "0", "F0", "F1", "F2", ".", ".", "B0", "W0", "F3", "B1", "W1", "B2", "W2",
                                "B3", "W3"]
    code, _, err = cli("schedule", "--schedule", "gpipe", "--stages", "2", "--microbatches", "2", "--virtual", "3")
    assert code == 2 and "--virtual" in err


def test_api_bubble_sweep_and_range():
    assert api.microbatch_range("2:8:2") == [2, 4, 6, 8]
    rows = api.bubble_sweep("gpipe", num_stages=3, microbatches=[1, 2])
    assert [r["bubble_fraction"] for r in rows] == pytest.approx([2 / 3, 2 / 4])
    with pytest.raises(SpecError):
        api.microbatch_range("8:1")
