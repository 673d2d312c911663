"""Training-step simulation: seed checks from the lecture, exact composition, stragglers, bad input, CLI."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from simdist import api
from simdist.errors import LayoutError
from simdist.hardware.compute import kernels_time_s
from simdist.hardware.host import host_overhead
from simdist.hardware.presets import load_topology
from simdist.plan.layer_cost import layer_work
from simdist.plan.mesh import Mesh, parse_order
from simdist.plan.model import Model
from simdist.plan.model_ends import head_work
from simdist.plan.optimizer import optimizer_step_kernels
from simdist.plan.step import StepConfig, build_step, split_layers
from simdist.predict.step import predict_step
from simdist.spec.load import Document, validate
from simdist.spec.scenario import ScenarioSpec
from tests.conftest import TOY_TOPOLOGY, toy_gpu

KIB = 1024
MLP = Model("cs336-mlp", "mlp", num_layers=4, hidden_size=1024)


def scenario_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def small_cluster(num_gpus: int) -> str:
    """A DGX H100 node cut down to ``num_gpus`` GPUs (one socket, one PCIe switch, one NIC per GPU)."""
    return (f"{{preset: dgx-h100, gpus_per_node: {num_gpus}, host: {{cpu_sockets: 1, pcie_switches_per_socket: 1}}, "
            f"inter_node: {{nics_per_node: {num_gpus}}}}}")


def mlp_scenario(tmp_path: Path, *, tp: int = 1, dp: int = 1, pp: int = 1, extra_training: str = "",
                 schedule: str = "1f1b", batch: int = 128) -> Path:
    return scenario_file(tmp_path, f"""
name: lecture MLP
cluster: {small_cluster(tp * dp * pp)}
model: {{preset: cs336-mlp}}
parallel: {{tp: {tp}, pp: {pp}, dp: {dp}, tp_style: column}}
training: {{micro_batch_size: {batch // dp}, global_batch_size: {batch}, precision: fp32{extra_training}}}
schedule: {schedule}
""")


# ----------------------------------------------------------------------------- mesh
def test_mesh_tp_innermost_keeps_tensor_groups_in_a_node() -> None:
    mesh = Mesh(tp=8, dp=4, pp=2)
    assert mesh.group("tp", 13) == tuple(range(8, 16))
    assert mesh.group("dp", 3) == (3, 11, 19, 27)
    assert mesh.group("pp", 5) == (5, 37)
    assert mesh.nodes_spanned("tp", 8) == 1 and mesh.nodes_spanned("dp", 8) == 4
    assert all(mesh.rank(**mesh.coords(r)) == r for r in range(mesh.num_ranks))


def test_mesh_order_is_a_permutation() -> None:
    assert parse_order("dp-tp-cp-pp") == ("dp", "tp", "cp", "pp")
    with pytest.raises(LayoutError, match=r"parallel\.order"):
        parse_order("tp-dp-pp")


def test_llama3_405b_split_lighter_ends() -> None:
    # Dubey et al. 2024 sec 3.3.2: 126 layers on 16 stages, one layer fewer on the first and last stage.
    split = split_layers(126, 16, "lighter_ends")
    assert split[0] == split[-1] == 7 and set(split[1:-1]) == {8} and sum(split) == 126
    with pytest.raises(LayoutError, match=r"parallel\.pp"):
        split_layers(126, 16, "even")


# ----------------------------------------------------------------------------- lecture seed checks
def test_lecture_tensor_parallel_all_gather_bytes() -> None:
    # B=128, d=1024, P=4, fp32: each rank holds a 128 x 256 slice (128 KiB); the assembled activation is
    # 512 KiB; the all-gather sends and receives 384 KiB per rank.
    work = layer_work(MLP, tp=4, micro_batch_size=128, precision="fp32", tp_style="column")
    gathers = [c for c in work.comm if c.op == "all_gather" and c.phase == "forward"]
    assert gathers and gathers[0].nbytes == 512 * KIB
    assert gathers[0].nbytes / 4 == 128 * KIB
    row = api.collective("dgx-h100", "all_gather", 4, [gathers[0].nbytes], algorithm="ring")[0]
    assert row.max_bytes_sent_per_rank == 384 * KIB
    assert row.max_bytes_received_per_rank == 384 * KIB


def test_data_parallel_all_reduces_exactly_the_gradient_bytes(tmp_path: Path) -> None:
    path = mlp_scenario(tmp_path, dp=4)
    pred = api.run(path)
    dp_rows = [c for c in pred.result["collectives"] if c["axis"] == "dp"]
    assert [c["op"] for c in dp_rows] == ["all_reduce"]
    grad_bytes = MLP.num_params * 4  # fp32 gradients of every weight and bias
    assert sum(c["nbytes"] * c["count"] for c in dp_rows) == pytest.approx(grad_bytes, rel=1e-12)


def test_per_parameter_reduction_issues_one_all_reduce_per_tensor(tmp_path: Path) -> None:
    path = mlp_scenario(tmp_path, dp=4, extra_training=", grad_reduce: per_parameter")
    per_parameter = api.run(path).result
    rows = [c for c in per_parameter["collectives"] if c["axis"] == "dp"]
    assert sum(c["count"] for c in rows) == 2 * MLP.num_layers  # weight and bias per layer
    assert sum(c["nbytes"] * c["count"] for c in rows) == pytest.approx(MLP.num_params * 4, rel=1e-12)
    bucketed = api.run(path, ["training.grad_reduce=bucketed"]).result
    # Eight small all-reduces pay eight latencies: slower than one bucket of the same bytes.
    assert per_parameter["breakdown"]["exposed_comm_s"]["dp"] > bucketed["breakdown"]["exposed_comm_s"]["dp"]


def test_unequal_local_batches_make_the_larger_rank_the_straggler(tmp_path: Path) -> None:
    # dp = 2 with local batches 32 | 96: the rank with three micro-batches finishes its backward last and
    # the other waits for it in the gradient all-reduce.
    path = mlp_scenario(tmp_path, dp=2, extra_training=", dp_batch_split: [32, 96]")
    text = path.read_text().replace("micro_batch_size: 64", "micro_batch_size: 32")
    path.write_text(text)
    out = api.run(path)
    topo = load_topology("dgx-h100")
    spec = validate(ScenarioSpec, Document(data=__import__("yaml").safe_load(text), source=str(path), lines={}))
    pred = predict_step(spec, topo)
    graph, trace = pred.plan.graph, pred.trace
    last_backward = {}
    for i, op in enumerate(graph.ops):
        if op.kind == "backward":
            last_backward[op.rank] = max(last_backward.get(op.rank, 0.0), trace.end_s[i])
    small, large = pred.plan.stage_ranks[(0, 0)], pred.plan.stage_ranks[(0, 1)]
    assert last_backward[large] > last_backward[small] * 2.5
    allreduce_start = {graph.ops[i].rank: trace.start_s[i] for i, op in enumerate(graph.ops)
                       if op.comm is not None and op.comm.axis == "dp"}
    assert allreduce_start[small] == pytest.approx(last_backward[large]) == allreduce_start[large]
    assert "data-parallel replica" in out.result["layout"]["note"]


# ----------------------------------------------------------------------------- exact composition
def test_single_gpu_step_is_the_sum_of_its_kernels(tmp_path: Path) -> None:
    # One GPU, one micro-batch: forward, backward, optimizer run back to back; the simulated step is exactly
    # the sum of their roofline times (nothing overlaps, nothing waits), each run of kernels at least the host's
    # time to issue them (simdist.hardware.host); the optimizer step clips the gradients first (Megatron-LM's
    # default --clip-grad 1.0: simdist.plan.optimizer).
    path = scenario_file(tmp_path, f"""
name: lecture MLP on one toy GPU
cluster: {{file: {TOY_TOPOLOGY}, num_nodes: 1, gpus_per_node: 1, inter_node: {{nics_per_node: 1}}}}
model: {{preset: cs336-mlp}}
parallel: {{tp: 1, pp: 1, dp: 1, tp_style: column}}
training: {{micro_batch_size: 128, global_batch_size: 128, precision: fp32}}
schedule: 1f1b
""")
    result = api.run(path).result
    gpu = toy_gpu()
    assert result["layout"] and gpu.peak.fp32 == 10e12  # the fixture's round numbers, not a preset's
    host = host_overhead(gpu)
    layer = layer_work(MLP, micro_batch_size=128, precision="fp32", tp_style="column")
    head = head_work(MLP, tp=1, micro_batch_size=128, precision="fp32")

    def issued(kernels) -> float:
        return host.run_time_s(kernels_time_s(gpu, kernels, "fp32"), kernels)

    per_layer = issued(layer.forward) + issued(layer.backward)
    expected = (MLP.num_layers * per_layer + issued(head.forward) + issued(head.backward)
                + issued(optimizer_step_kernels(MLP.num_params, precision="fp32")))
    assert result["step_time_s"] == pytest.approx(expected, rel=1e-9)


def test_breakdown_adds_up_to_the_step_time() -> None:
    out = api.run(Path("scenarios/default.yaml"))
    r = out.result
    b = r["breakdown"]
    total = (b["compute_s"] + b["recompute_s"] + sum(b["exposed_comm_s"].values()) + b["bubble_s"] + b["optimizer_s"]
             + b["idle_s"])
    assert total == pytest.approx(r["step_time_s"], rel=1e-9)
    assert 0 < r["bubble_fraction"] < 0.2
    assert r["hardware_tflops_per_gpu"] >= r["model_tflops_per_gpu"] > 0
    assert r["mfu"] == pytest.approx(r["model_tflops_per_gpu"] * 1e12 / 312e12)
    assert r["fits_in_memory"] and len(r["memory"]) == 8


def test_uniform_pipeline_bubble_matches_formula_in_a_real_step(tmp_path: Path) -> None:
    # An mlp of 8 layers on pp=4 with 1F1B: stages are identical except the loss on the last stage; with
    # pipeline sends over NVLink (microseconds) the simulated bubble stays close to (K-1)/(M+K-1).
    path = scenario_file(tmp_path, """
cluster: {preset: dgx-h100}
model: {kind: mlp, num_layers: 8, hidden_size: 8192}
parallel: {tp: 2, pp: 4, tp_style: column}
training: {micro_batch_size: 1024, global_batch_size: 16384, precision: bf16}
schedule: 1f1b
""")
    r = api.run(path).result
    m, k = 16, 4
    assert r["bubble_fraction"] == pytest.approx((k - 1) / (m + k - 1), abs=0.03)
    gpipe = api.run(path, ["schedule=gpipe"]).result
    assert gpipe["memory_per_gpu_bytes"] > r["memory_per_gpu_bytes"]


def test_zero3_gathers_parameters_and_zero1_reduce_scatters(tmp_path: Path) -> None:
    base = mlp_scenario(tmp_path, dp=8)
    z1 = {c["op"] for c in api.run(base, ["parallel.zero_stage=1"]).result["collectives"] if c["axis"] == "dp"}
    z3 = {c["op"] for c in api.run(base, ["parallel.zero_stage=3"]).result["collectives"] if c["axis"] == "dp"}
    assert z1 == {"reduce_scatter", "all_gather"}
    assert z3 == {"reduce_scatter", "all_gather"}
    m0 = api.run(base).result["memory_per_gpu_bytes"]
    m3 = api.run(base, ["parallel.zero_stage=3"]).result["memory_per_gpu_bytes"]
    assert m3 < m0


def test_zero3_per_parameter_blocks_per_tensor(tmp_path: Path) -> None:
    # DeepSpeed 2021 ZeRO-3 (simdist.plan.data_parallel._per_parameter): one all_gather per tensor before the
    # forward and again before the backward, one reduce_scatter per tensor, each blocking and each paying
    # dp host copies (list collectives). The MLP has 2 tensors per layer.
    base = mlp_scenario(tmp_path, dp=8)
    fast = api.run(base, ["parallel.zero_stage=3"]).result
    slow = api.run(base, ["parallel.zero_stage=3", "training.zero3_fetch=per_parameter"]).result
    runs = {}
    for c in slow["collectives"]:
        if c["axis"] == "dp":
            runs[c["op"]] = runs.get(c["op"], 0) + c["count"]
    layers = 4
    assert runs == {"all_gather": 2 * 2 * layers, "reduce_scatter": 2 * layers}
    # dp views copied per collective, each a launch on the host (host_overhead.csv's launch_s: 5 us on a DGX host)
    host = 8 * host_overhead(api.load_scenario(base).topology.gpu).launch_s
    assert host == 8 * 5e-6
    assert slow["step_time_s"] >= fast["step_time_s"] + 3 * 2 * layers * host


def test_a_list_collectives_copies_cost_a_launch_each_on_its_host() -> None:
    # ProcessGroupNCCL copies each rank's view from C++: a launch per copy (host_overhead.csv's launch_s), a Grace
    # host's scaled by host_cpu.csv; a CPU core standing in for a device runs the copy at its per-op overhead
    from simdist.hardware.gpus import GPU_PRESETS

    cfg = StepConfig(model=MLP, gpu=GPU_PRESETS["h100-sxm"], mesh=Mesh(dp=8), schedule="gpipe",
                     micro_batch_size=1, global_batch_size=8, layers_per_stage=(4,))
    assert cfg.copy_launch_s == 5e-6
    assert dataclasses.replace(cfg, gpu=GPU_PRESETS["gb200"]).copy_launch_s == pytest.approx(2.75 * 5e-6)
    assert dataclasses.replace(cfg, gpu=GPU_PRESETS["cpu-core"]).copy_launch_s == 5e-6  # its launch_overhead_s


def test_overlapped_gradient_reduction_hides_communication(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, """
cluster: {preset: dgx-a100, num_nodes: 4}
model: {num_layers: 8, hidden_size: 4096, num_attention_heads: 32, seq_length: 2048, vocab_size: 51200}
parallel: {tp: 8, pp: 1, dp: 4}
training: {micro_batch_size: 1, global_batch_size: 4, grad_bucket_size: 100 MB}
""")
    plain = api.run(path).result
    overlapped = api.run(path, ["training.grad_reduce=overlapped"]).result
    assert overlapped["breakdown"]["exposed_comm_s"]["dp"] < plain["breakdown"]["exposed_comm_s"]["dp"]
    assert overlapped["step_time_s"] < plain["step_time_s"]


# ----------------------------------------------------------------------------- bad input
def test_heads_not_divisible_by_tp(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, """
cluster: {preset: dgx-h100}
model: {num_layers: 4, hidden_size: 768, num_attention_heads: 12}
parallel: {tp: 8}
training: {global_batch_size: 8}
""")
    with pytest.raises(LayoutError, match=r"parallel.tp.*12 attention heads"):
        api.run(path)


def test_layout_that_does_not_fit_is_reported_then_refused_with_strict(tmp_path: Path) -> None:
    path = scenario_file(tmp_path, """
cluster: {preset: dgx-a100}
model: {preset: gpt3-175b}
parallel: {tp: 8}
training: {global_batch_size: 1}
""")
    r = api.run(path).result
    assert r["fits_in_memory"] is False
    with pytest.raises(LayoutError, match="GiB per GPU"):
        api.run(path, strict=True)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "simdist", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("sets", "needle"), [
    (["parallel.dp=2"], "tp x pp x dp x cp = 8 x 8 x 2 x 1 = 128"),
    (["training.global_batch_size=63"], "global_batch_size"),
    (["schedule=zigzag"], "schedule"),
    (["parallel.vpp=13", "parallel.pipeline_split=even"], "parallel.vpp"),  # 12 layers per stage, 13 even chunks
    (["parallel.pipeline_layout=E|t*96|L"], "parallel.pipeline_layout"),  # 3 parts, not a multiple of pp = 8
])
def test_cli_bad_layouts_exit_2_with_one_line(sets: list[str], needle: str) -> None:
    args = ["run", "scenarios/default.yaml"]
    for s in sets:
        args += ["--set", s]
    proc = run_cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_cli_run_json_and_out_dir(tmp_path: Path) -> None:
    proc = run_cli("run", "scenarios/default.yaml", "--json", "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for key in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu",
                "bubble_fraction", "memory_per_gpu_bytes", "fits_in_memory", "breakdown"):
        assert key in doc
    assert set(doc["breakdown"]["exposed_comm_s"]) == {"tp", "cp", "pp", "dp"}
    files = {p.name for p in (tmp_path / "out").iterdir()}
    trace = json.loads((tmp_path / "out" / "trace.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    # and one PyTorch profiler (Kineto) trace per simulated rank (simdist.report.kineto_trace)
    ranks = {e["pid"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert files == {"report.json", "trace.json", "report.html"} | {f"rank{r}.pt.trace.json" for r in ranks}
    assert json.loads((tmp_path / "out" / "report.json").read_text())["step_time_s"] == doc["step_time_s"]
    assert math.isfinite(doc["step_time_s"])


@pytest.mark.slow
def test_cli_run_prints_table_and_report_path(tmp_path: Path) -> None:
    proc = run_cli("run", "scenarios/default.yaml", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "step time" in proc.stdout and "MFU" in proc.stdout
    assert f"report: {tmp_path / 'report.html'}" in proc.stdout


def test_step_config_carries_the_scenario(tmp_path: Path) -> None:
    cfg = StepConfig(model=MLP, gpu=toy_gpu(), mesh=Mesh(pp=2), schedule="gpipe",
                     micro_batch_size=32, global_batch_size=128, layers_per_stage=(2, 2), precision="fp32",
                     tp_style="column")
    plan = build_step(cfg)
    kinds = [op.kind for op in plan.graph.ops if op.rank == 0 and op.stream == "compute"]
    assert kinds == ["forward"] * 4 + ["backward"] * 4 + ["optimizer"]


P2P_SCENARIO = """\
name: p2p
cluster: {preset: dgx-a100, num_nodes: 1}
model: {num_layers: 4, hidden_size: 256, num_attention_heads: 4, seq_length: 128, vocab_size: 1024}
parallel: {tp: 2, pp: 2, dp: 2}
training: {global_batch_size: 8, micro_batch_size: 1}
"""


@pytest.mark.parametrize(("sets", "nbytes"), [
    # b x s x h x 2 bytes (bf16) = 1 x 128 x 256 x 2 = 65,536 per micro-batch (Narayanan et al. 2021 sec 3.2),
    # of which each tp peer sends 1/tp with Megatron's scatter/gather (sec 4.1, on by default)
    ([], 32768.0),
    (["parallel.scatter_gather=false"], 65536.0),
    (["parallel.scatter_gather=false", "training.micro_batch_size=2", "training.global_batch_size=16"], 131072.0),
    (["parallel.scatter_gather=false", "model.seq_length=256"], 131072.0),
    (["parallel.scatter_gather=false", "parallel.sequence_parallel=true"], 32768.0),
])
def test_pipeline_sends_carry_one_micro_batch_of_boundary_activations(tmp_path: Path, sets, nbytes) -> None:
    path = scenario_file(tmp_path, P2P_SCENARIO)
    r = api.run(path, sets).result
    sends = [c for c in r["collectives"] if c["axis"] == "pp"]
    assert [(c["op"], c["nbytes"], c["num_ranks"]) for c in sends] == [("send_recv", nbytes, 2)]
    # one boundary (pp 2): each of the M micro-batches crosses it forward and its gradient back
    assert sends[0]["count"] == 2 * r["layout"]["num_microbatches"]
