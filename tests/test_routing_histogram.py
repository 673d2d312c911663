"""A measured routing histogram (training.moe_routing: histogram): hand-checkable draws, the step it gives, and one
clear error per malformed file."""

import json
import subprocess
import sys

import pytest

from simdist import api
from simdist.plan.layout import step_config_of
from simdist.plan.model_presets import resolve_model
from simdist.plan.moe_routing import routing_imbalance
from simdist.spec.routing_histogram import read_routing_histogram

BASE = ("cluster: {preset: dgx-h100, num_nodes: 1}\n"
        "model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, num_query_groups: 4, ffn_hidden_size: 256,"
        " seq_length: 128, vocab_size: 1000, swiglu: true, num_experts: 8, moe_router_topk: 2,"
        " moe_ffn_hidden_size: 128, moe_layer_freq: [1, 1]}\n"
        "parallel: {tp: 1, pp: 1, dp: 8, ep: 4}\n")


def _scenario(tmp_path, rows: str, *, name: str = "hist.csv", training: str = ""):
    (tmp_path / name).write_text(rows, encoding="utf-8")
    p = tmp_path / "s.yaml"
    p.write_text(BASE + "training: {micro_batch_size: 1, global_batch_size: 16, moe_routing: histogram, "
                        f"moe_routing_file: {name}{training}}}\n", encoding="utf-8")
    return p


def _csv(counts, layer=None) -> str:
    head = "layer,expert,tokens\n" if layer is not None else "expert,tokens\n"
    return head + "".join((f"{layer}," if layer is not None else "") + f"{e},{c}\n" for e, c in enumerate(counts))


def test_shares_kept_on_their_ranks_give_the_busiest_ranks_load():
    # every token goes to experts 0 and 1, both on rank 0 of ep 4 (two experts per rank): that rank takes all the
    # copies, 4 x the mean, whatever the draw
    only_rank0 = ((0.5, 0.5, 0, 0, 0, 0, 0, 0),)
    assert routing_imbalance("histogram", num_experts=8, ep=4, tokens=64, topk=2, shares=only_rank0) == 4.0
    # rank 0 holds 0.4 + 0.2 = 0.6 of the shares, the others 0.4 / 3 each: with ten million copies the fluctuation
    # is ~1e-4, so the busiest rank's load is 0.6 x N against a mean of N / 4: factor 2.4
    skewed = ((0.4, 0.2, 0.1, 0.1, 0.05, 0.05, 0.05, 0.05),)
    assert routing_imbalance("histogram", num_experts=8, ep=4, tokens=10**7, topk=1, shares=skewed) == \
        pytest.approx(2.4, rel=1e-3)
    # a uniform histogram is the multinomial distribution, draw for draw (same seed, same shares, no shuffle)
    kw = dict(num_experts=8, ep=4, tokens=256, topk=2)
    assert routing_imbalance("histogram", shares=((1 / 8,) * 8,), **kw) == routing_imbalance("multinomial", **kw)
    # per-layer histograms: the mean of the layers' factors
    layers = (skewed[0], (1 / 8,) * 8)
    each = [routing_imbalance("histogram", shares=(s,), **kw) for s in layers]
    assert routing_imbalance("histogram", shares=layers, **kw) == pytest.approx(sum(each) / 2, rel=1e-12)
    assert each[0] > each[1] > 1.0


def test_the_file_reads_as_shares_per_layer(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("# tokens per expert, two MoE layers\nlayer,expert,tokens\n"
                    + "".join(f"7,{e},{c}\n" for e, c in enumerate((3, 1, 0, 0)))
                    + "".join(f"3,{e},{c}\n" for e, c in enumerate((1, 1, 1, 1))), encoding="utf-8")
    hist = read_routing_histogram(path)
    assert hist.num_experts == 4
    assert hist.layers == ((0.75, 0.25, 0.0, 0.0), (0.25, 0.25, 0.25, 0.25))  # in the file's order of layers


def test_a_scenario_steps_as_if_it_stated_the_histograms_imbalance(tmp_path):
    counts = (40, 10, 10, 10, 10, 10, 5, 5)
    sc = api.load_scenario(str(_scenario(tmp_path, _csv(counts))))
    model = resolve_model(sc.spec.model)
    cfg = step_config_of(sc.spec, sc.topology, model)
    shares = tuple(c / sum(counts) for c in counts)
    # the ep group of 4 routes 4 x 128 tokens per micro-batch, 2 copies each
    want = routing_imbalance("histogram", num_experts=8, ep=4, tokens=512, topk=2, shares=(shares,))
    assert cfg.expert_parallel.imbalance == want > 1.5  # rank 0 holds 0.5 of the shares: about 2 x the mean
    assert sc.spec.training.moe_routing_file.is_absolute()  # resolved from the scenario's folder
    # the same step as a scenario stating that imbalance, in both fidelities
    path = str(tmp_path / "s.yaml")
    stated = ["training.moe_routing=null", "training.moe_routing_file=null", f"training.moe_imbalance={want!r}"]
    balanced = ["training.moe_routing=balanced", "training.moe_routing_file=null"]
    for fidelity in ("closed_form", "engine"):
        step = api.run(path, fidelity=fidelity).result["step_time_s"]
        assert step == api.run(path, stated, fidelity=fidelity).result["step_time_s"]
        assert step > api.run(path, balanced, fidelity=fidelity).result["step_time_s"]


@pytest.mark.parametrize(("rows", "message"), [
    ("expert,tokens\n0,4\n1,-1\n", "hist.csv:3: tokens -1 is negative"),
    ("expert,count\n0,1\n", "hist.csv:1: the header 'expert,count' lacks the column(s) tokens"),
    ("expert,tokens,extra\n0,1,2\n", "has the unknown column(s) extra"),
    ("expert,tokens\n0,1\n2,1\n", "lists experts up to 2 but not expert 1"),
    ("expert,tokens\n0,1\n1,x\n", "hist.csv:3: tokens 'x' is not a number"),
    ("expert,tokens\n0,1\n1,nan\n", "tokens 'nan' is not a number"),
    ("expert,tokens\n0.5,1\n", "expert '0.5' is not an index"),
    ("expert,tokens\n0,1\n0,2\n", "hist.csv:3: expert 0 is listed twice"),
    ("expert,tokens\n0,1,5\n", "3 cells, the header names 2"),
    ("# only a comment\n", "has no rows"),
    ("expert,tokens\n", "has a header but no rows"),
    ("expert,tokens\n" + "".join(f"{e},0\n" for e in range(8)), "routes no tokens"),
    ("layer,expert,tokens\n0,0,1\n0,1,1\n1,0,1\n", "layer 1 lists 1 experts, the first layer 2"),
    ("layer,expert,tokens\n,0,1\n", "the layer cell is empty"),
    ("expert,tokens\n0,1\n1,1\n", "lists 2 experts, the model has 8"),
    (_csv([1] * 8, layer=0) + "".join(f"1,{e},1\n" for e in range(8)) + "".join(f"2,{e},1\n" for e in range(8)),
     "holds 3 layers' histograms, the model has 2 MoE layers"),
])
def test_a_malformed_file_is_one_error_naming_the_field_and_line(tmp_path, rows, message):
    p = _scenario(tmp_path, rows)
    out = subprocess.run([sys.executable, "-m", "simdist", "run", str(p)], capture_output=True, text=True,
                         cwd=tmp_path)
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "training.moe_routing_file" in lines[0] and message in lines[0], out.stderr
    assert "fix:" in lines[0] and "Traceback" not in out.stderr


def test_the_two_fields_go_together_and_a_missing_file_is_named(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(BASE + "training: {micro_batch_size: 1, global_batch_size: 16, moe_routing: histogram}\n",
                 encoding="utf-8")
    with pytest.raises(Exception, match="moe_routing: histogram reads its shares from moe_routing_file"):
        api.load_scenario(str(p))
    p.write_text(BASE + "training: {micro_batch_size: 1, global_batch_size: 16, moe_routing_file: h.csv}\n",
                 encoding="utf-8")
    with pytest.raises(Exception, match="moe_routing_file is the histogram of moe_routing: histogram"):
        api.load_scenario(str(p))
    p.write_text(BASE + "training: {micro_batch_size: 1, global_batch_size: 16, moe_routing: histogram, "
                        "moe_routing_file: nowhere.csv}\n", encoding="utf-8")
    with pytest.raises(Exception, match="file not found"):
        api.load_scenario(str(p))


def test_a_report_records_the_files_hash_and_reruns_from_its_folder(tmp_path):
    p = _scenario(tmp_path, _csv((40, 10, 10, 10, 10, 10, 5, 5)))
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "simdist", "run", str(p), "--out", str(out), "--fidelity",
                          "closed_form"], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["scenario_resolved"]["training"]["moe_routing_file"] == str((tmp_path / "hist.csv").resolve())
    # the file lies outside the report's folder: a rerun from the report refuses to read it unless trusted
    again = subprocess.run([sys.executable, "-m", "simdist", "run", str(out / "report.json"), "--json"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert again.returncode == 2 and "moe_routing_file" in again.stderr and "--trust-paths" in again.stderr
    trusted = subprocess.run([sys.executable, "-m", "simdist", "run", str(out / "report.json"), "--json",
                              "--trust-paths"], capture_output=True, text=True, cwd=tmp_path)
    assert trusted.returncode == 0, trusted.stderr
    assert json.loads(trusted.stdout)["step_time_s"] == report["step_time_s"]
    # a changed histogram changes the inputs' hash
    before = report["inputs_sha256"]
    (tmp_path / "hist.csv").write_text(_csv((10,) * 8), encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "simdist", "run", str(p), "--out", str(out), "--fidelity",
                          "closed_form"], capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads((out / "report.json").read_text(encoding="utf-8"))["inputs_sha256"] != before
