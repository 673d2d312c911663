"""PyTorch profiler traces: read (simdist.calibrate.trace_read), classified and measured (trace_kernels), the step
broken down (trace_step), fitted (`simdist calibrate TRACE...`) and compared (`simdist validate --trace`), on the
harness's gloo traces of tests/data/traces (the CS336 MLP, 4 x 512, batch 64, 2 ranks) and on simdist's own."""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from simdist import api
from simdist.api.trace import read_traces, validate_trace
from simdist.calibrate.trace_kernels import classify, collective_op, kernel_kind, trace_measurements
from simdist.calibrate.trace_read import looks_like_trace, read_trace
from simdist.calibrate.trace_step import measured_step
from simdist.errors import SimdistError
from tests.conftest import REPO

DATA = REPO / "tests" / "data" / "traces" / "gloo_mlp"
DP = DATA / "data_parallel_bucketed"
SCENARIO = {"name": "CS336 MLP 4 x 512, dp 2 on gloo", "cluster": {"preset": "cpu-loopback", "gpus_per_node": 2},
            "model": {"kind": "mlp", "num_layers": 4, "hidden_size": 512}, "parallel": {"dp": 2},
            "training": {"micro_batch_size": 32, "global_batch_size": 64, "precision": "fp32",
                         "grad_reduce": "bucketed"}}


def _raw(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _scenario(tmp_path: Path) -> Path:
    path = tmp_path / "mlp.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    return path


def test_a_rank_trace_is_read_with_its_run():
    t = read_trace(DP / "rank1.pt.trace.json.gz")
    assert (t.rank, t.world_size, t.backend, t.device) == (1, 2, "gloo", None)
    assert len(t.steps) == 3  # --profile-steps 3
    raw = _raw(DP / "rank1.pt.trace.json.gz")
    ops = [e for e in raw["traceEvents"] if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    assert t.counts()["cpu_op"] == len(ops)
    assert looks_like_trace(DP / "rank1.pt.trace.json.gz") and not looks_like_trace(REPO / "README.md")


def test_gemms_are_the_mlps_matmuls_with_their_shapes():
    t = read_trace(DP / "rank0.pt.trace.json.gz")
    gemms = [c for c in classify(t) if c.kind == "gemm"]
    # per step: 4 forward matmuls, 4 weight gradients, 3 input gradients (the first layer's input needs none)
    assert len(gemms) == 3 * 11
    _, kernels, _ = trace_measurements([t])
    shapes = {(k.m, k.n, k.k) for k in kernels if k.kernel == "gemm"}
    # a rank's 32 rows through 512 x 512 layers: x W (32 x 512 x 512) and x^T dY (512 x 512 x 32)
    assert shapes == {(32, 512, 512), (512, 512, 32)}
    fwd = next(k for k in kernels if (k.m, k.n, k.k) == (32, 512, 512))
    assert fwd.flops == 2 * 32 * 512 * 512 and fwd.hbm_bytes == (32 * 512 + 512 * 512 + 32 * 512) * 4


def test_a_collective_is_timed_as_its_shortest_rank():
    traces = read_traces([DP])
    measurements, _, notes = trace_measurements(traces)
    (m,) = measurements
    assert (m.op, m.nbytes, m.num_ranks) == ("all_reduce", 4 * 512 * 512 * 4, 2)  # one 25 MiB bucket of 4 MiB
    per_rank = []
    for r in (0, 1):
        raw = _raw(DP / f"rank{r}.pt.trace.json.gz")["traceEvents"]
        steps = [e for e in raw if e.get("name", "").startswith("ProfilerStep#")]
        inside = [e for e in raw if e.get("name") == "gloo:all_reduce"
                  and any(s["ts"] <= e["ts"] <= s["ts"] + s["dur"] for s in steps)]
        per_rank.append([e["dur"] for e in sorted(inside, key=lambda e: e["ts"])])
    assert m.time_s == pytest.approx(statistics.median(min(a, b) for a, b in zip(*per_rank, strict=True)) * 1e-6)
    assert not any("one rank" in n for n in notes)
    _, _, alone = trace_measurements(traces[:1])
    assert any("one rank" in n for n in alone)


def test_the_step_breakdown_adds_up_and_is_the_profilers_steps():
    run, ranks = measured_step(read_traces([DP]))
    for r in ranks:
        assert r.compute_s + r.exposed_comm_s + r.idle_s == pytest.approx(r.step_s, rel=1e-9)
        assert r.exposed_comm_s <= r.comm_s + 1e-12
    durations = []
    for rank in (0, 1):
        raw = _raw(DP / f"rank{rank}.pt.trace.json.gz")["traceEvents"]
        steps = sorted((e for e in raw if e.get("name", "").startswith("ProfilerStep#")), key=lambda e: e["ts"])
        durations.append(statistics.median(e["dur"] for e in steps[1:]) * 1e-6)  # the first of 3 left out
    assert run.step_s == pytest.approx(max(durations))


def test_calibrate_fits_the_traces_collectives(tmp_path):
    doc = api.calibrate([str(DP)], "cpu-loopback", num_nodes=1)
    factor = doc["calibration"]["collectives"]["all_reduce"]["bandwidth_factor"]
    assert doc["calibration"]["fit"]["kernels"]["points"] > 0
    # the same traces with every all_reduce taking twice as long: the fit must follow (half the bandwidth)
    slow = tmp_path / "slow"
    slow.mkdir()
    for path in DP.iterdir():
        raw = _raw(path)
        for e in raw["traceEvents"]:
            if e.get("name") == "gloo:all_reduce":
                e["dur"] *= 2
        (slow / path.name).write_bytes(gzip.compress(json.dumps(raw).encode()))
    slower = api.calibrate([str(slow)], "cpu-loopback", num_nodes=1)["calibration"]["collectives"]["all_reduce"]
    assert slower["bandwidth_factor"] == pytest.approx(factor / 2, rel=0.02)


def test_validate_trace_compares_the_step(tmp_path):
    doc = validate_trace([DP], _scenario(tmp_path), html=tmp_path / "cmp.html")
    rows = {r["what"]: r for r in doc["rows"]}
    assert set(rows) == {"step_s", "compute_s", "exposed_comm_s", "idle_s"}
    assert rows["step_s"]["measured_s"] == pytest.approx(doc["measured"]["step_s"])
    assert rows["step_s"]["predicted_s"] == pytest.approx(api.run(_scenario(tmp_path)).result["step_time_s"])
    assert {"gemm", "memory"} <= set(doc["categories"]) and len(doc["kernels"]) <= 10
    assert "plotly" in (tmp_path / "cmp.html").read_text()


def test_simdists_own_trace_replays_exactly(tmp_path):
    """`simdist run --out` writes Kineto traces; read back, they give the predicted step and breakdown."""
    scenario = _scenario(tmp_path)
    out = api.run(scenario, out_dir=tmp_path / "out")
    assert "rank0.pt.trace.json" in out.files
    doc = validate_trace([tmp_path / "out" / "rank0.pt.trace.json"], scenario)
    rows = {r["what"]: r for r in doc["rows"]}
    for what in ("step_s", "compute_s", "exposed_comm_s"):
        assert rows[what]["measured_s"] == pytest.approx(rows[what]["predicted_s"], rel=1e-6), what
    ((m,),) = [trace_measurements(read_traces([tmp_path / "out"]))[0]]
    assert (m.op, m.num_ranks) == ("all_reduce", 2)


@pytest.mark.parametrize(("name", "kind"), [
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm"),
    ("nvjet_tst_192x192_64x4_2x1_v_bz_coopA_TNT", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>(Params)", "gemm"),
    ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>(Flash_fwd_params)", "attention"),
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel::Params)", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128", "attention"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "collective"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "memory"),
    ("triton_poi_fused_add_mul_0", "memory"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, int*)",
     "collective"),
    ("void deep_ep::internode_ll::combine<false, false, 7168>(void*, void*, int*, void*, void const*)", "collective"),
    ("void hybrid_ep::dispatch_kernel<__nv_bfloat16, 8, 32>(hybrid_ep::dispatch_kernel_param_t<__nv_bfloat16>)",
     "collective"),
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int)", "memory"),
])
def test_kernel_names_classify(name, kind):
    assert kernel_kind(name) == kind


@pytest.mark.parametrize(("name", "op"), [
    ("allreduce", "all_reduce"), ("_allgather_base", "all_gather"),
    ("reduce_scatter_tensor_coalesced", "reduce_scatter"), ("gloo:all_reduce", "all_reduce"),
    ("gloo:send", "send_recv"), ("all_to_allv", "all_to_all"),
    ("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL", "reduce_scatter"),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t", "all_gather"), ("nonsense", None),
    ("void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int**, int)", "all_to_all"),
    ("void hybrid_ep::combine_kernel<8, 32>(hybrid_ep::combine_kernel_param_t)", "all_to_all"),
    ("void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*)", None),
])
def test_collective_names(name, op):
    assert collective_op(name) == op


# --------------------------------------------------------------------------- bad input: one line, exit 2

def _cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simdist", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def _bad(tmp_path: Path, name: str, content: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


@pytest.mark.slow  # a subprocess each
@pytest.mark.parametrize(("content", "says"), [
    (b"not json at all", "not JSON"),
    (b"[1, 2, 3]", "not a Kineto trace"),
    (b'{"schemaVersion": 1, "other": []}', "no traceEvents"),
    (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1', "ends early"),
    (b'{"schemaVersion": 1, "traceEvents": [{"ph": "M", "name": "process_name"}]}', "no timed"),
])
def test_bad_traces_are_one_line(tmp_path, content, says):
    path = _bad(tmp_path, "rank0.pt.trace.json", content)
    out = _cli("validate", "--trace", path, _scenario(tmp_path))
    assert out.returncode == 2, out.stderr
    assert says in out.stderr and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_truncated_gzip_trace_is_one_line(tmp_path):
    data = (DP / "rank0.pt.trace.json.gz").read_bytes()
    path = _bad(tmp_path, "rank0.pt.trace.json.gz", data[: len(data) // 2])
    out = _cli("calibrate", path, "--topology", "cpu-loopback")  # gzip: told a trace by its magic bytes
    assert out.returncode == 2 and "Traceback" not in out.stderr and str(path) in out.stderr


def test_a_trace_without_steps_cannot_be_validated(tmp_path):
    raw = _raw(DP / "rank0.pt.trace.json.gz")
    raw["traceEvents"] = [e for e in raw["traceEvents"] if not e.get("name", "").startswith("ProfilerStep#")]
    path = _bad(tmp_path, "rank0.pt.trace.json", json.dumps(raw).encode())
    with pytest.raises(SimdistError, match=r"no ProfilerStep#N annotation.*cpu_op"):
        validate_trace([path], _scenario(tmp_path))


def test_traces_of_different_runs_are_refused(tmp_path):
    with pytest.raises(SimdistError, match="rank 0 appears twice"):
        read_traces([DP / "rank0.pt.trace.json.gz", DP / "rank0.pt.trace.json.gz"])
    raw = _raw(DP / "rank1.pt.trace.json.gz")
    raw["distributedInfo"]["world_size"] = 4
    other = _bad(tmp_path, "rank1.pt.trace.json", json.dumps(raw).encode())
    with pytest.raises(SimdistError, match="different sizes"):
        read_traces([DP / "rank0.pt.trace.json.gz", other])
    with pytest.raises(SimdistError, match=r"without \*\.json"):
        read_traces([tmp_path / "empty"] if (tmp_path / "empty").mkdir() is None else [])


def test_a_trace_larger_than_the_limit_is_refused(monkeypatch):
    from simdist.calibrate import trace_read
    from simdist.limits import Limit

    monkeypatch.setattr(trace_read, "TRACE_BYTES", Limit("trace_bytes", 10_000, "B", "a test's limit"))
    with pytest.raises(SimdistError, match="larger than 10,000 B"):
        read_trace(DP / "rank0.pt.trace.json.gz")


@pytest.mark.slow
def test_validate_trace_needs_one_scenario():
    out = _cli("validate", "--trace", DP / "rank0.pt.trace.json.gz")
    assert out.returncode == 2 and "one scenario file" in out.stderr and "Traceback" not in out.stderr


# --------------------------------------------------------------------------- a real GPU trace (HTA's test data)
HTA = REPO / "tests" / "data" / "traces" / "hta_nccl_a100" / "nccl_data.json.gz"


def test_a_real_gpu_trace_is_read_and_classified():
    t = read_trace(HTA)
    assert (t.rank, t.world_size, t.backend, t.device) == (0, 2, "nccl", "NVIDIA A100-PG509-200")
    assert len(t.steps) == 3
    assert {k: t.counts()[k] for k in ("kernel", "gpu_memcpy", "gpu_memset")} == {
        "kernel": 2700, "gpu_memcpy": 960, "gpu_memset": 114}
    # by name alone: HTA's get_kernel_type finds 21 communication kernels (15 AllReduce, 6 Broadcast); 249 GEMM
    # (cuBLAS / CUTLASS gemm, splitKreduce) and 324 convolution kernels (cuDNN fprop/dgrad/wgrad, implicit GEMMs)
    names = [e.name for e in t.events if e.cat == "kernel"]
    by_name = {kind: sum(kernel_kind(n) == kind for n in names) for kind in ("collective", "attention", "gemm")}
    assert by_name == {"collective": 21, "attention": 0, "gemm": 249 + 324}
    classes = [c.kind for c in classify(t)]
    assert classes.count("collective") == 21 and len(classes) == 2700 + 960 + 114  # every GPU event in the steps
    assert classes.count("gemm") >= 573  # and the kernels aten::mm/addmm launched besides (split-K reductions)


def test_a_real_gpu_traces_collectives_are_its_record_param_comms():
    measurements, _, notes = trace_measurements([read_trace(HTA)])
    # record_param_comms: allreduce of Float (4 B) with In msg nelems 2049000, 2431040, 6563840, 6637568, 7875584,
    # 3 calls each; broadcast of Long (8 B) x 53 and Float x 53120
    sizes = {(m.op, m.nbytes, m.num_ranks, m.label) for m in measurements}
    assert sizes == {("all_reduce", 4 * n, 2, "3 calls") for n in (2049000, 2431040, 6563840, 6637568, 7875584)} | {
        ("broadcast", 8 * 53, 2, "3 calls"), ("broadcast", 4 * 53120, 2, "3 calls")}
    assert any("one rank" in n for n in notes)
    run, _ = measured_step([read_trace(HTA)])
    assert run.compute_s + run.exposed_comm_s + run.idle_s == pytest.approx(run.step_s)
    assert 0 < run.exposed_comm_s <= run.comm_s


def test_a_trace_of_another_gpu_is_warned_about(tmp_path):
    doc = validate_trace([HTA], _scenario(tmp_path))
    assert any("A100-PG509-200" in w and "CPU-core" in w for w in doc["warnings"]), doc["warnings"]


@pytest.mark.slow  # spawns 2 gloo ranks of the harness
def test_the_loop_from_the_harness_profile_to_validate(tmp_path):
    """Harness profile -> simdist calibrate -> simdist validate --trace, as the README's three commands."""
    pytest.importorskip("torch")
    prof = _cli_module("validation.mlp", "--ranks", "2", "--cuts", "data_parallel_bucketed", "--width", "128",
                       "--layers", "2", "--batch", "16", "--no-timing", "--profile", tmp_path / "traces",
                       "--profile-steps", "2")
    assert prof.returncode == 0, prof.stderr
    traces = tmp_path / "traces" / "data_parallel_bucketed"
    assert len(list(traces.glob("rank*.pt.trace.json.gz"))) == 2
    cal = _cli("calibrate", traces, "--topology", "cpu-loopback", "--out", tmp_path / "cal.yaml")
    assert cal.returncode == 0, cal.stderr
    fitted = yaml.safe_load((tmp_path / "cal.yaml").read_text())
    # the one gradient bucket: 2 layers x 128 x 128 fp32 = 128 KiB, the size the fit saw
    assert fitted["collectives"]["all_reduce"]["size_range"] == ["131072 B", "131072 B"]
    scenario = tmp_path / "mlp.yaml"
    scenario.write_text(yaml.safe_dump({**SCENARIO, "model": {"kind": "mlp", "num_layers": 2, "hidden_size": 128},
                                        "training": {**SCENARIO["training"], "micro_batch_size": 8,
                                                     "global_batch_size": 16}}))
    out = _cli("validate", "--trace", traces, scenario, "--calibration", tmp_path / "cal.yaml", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert {r["what"] for r in doc["rows"]} == {"step_s", "compute_s", "exposed_comm_s", "idle_s"}
    assert doc["measured"]["steps"] == 2 and {"gemm", "memory"} <= set(doc["categories"])


def _cli_module(module: str, *args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def _gpu_trace(path: Path, events: list[dict]) -> Path:
    """A one-rank GPU trace of one profiler step (0-1000 us) holding ``events`` (kernels on streams, CPU operators)."""
    raw = {"distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 2},
           "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
           "traceEvents": [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "ts": 0, "dur": 1000,
                            "pid": 1, "tid": 1}, *events]}
    path.write_bytes(gzip.compress(json.dumps(raw).encode()))
    return path


def _kernel(name: str, ts: float, dur: float, stream: int, ext: int | None = None) -> dict:
    args = {"stream": stream, **({"External id": ext} if ext is not None else {})}
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream, "args": args}


def test_an_expert_all_to_all_is_timed_with_its_exposed_part(tmp_path):
    # A GEMM from 0 to 400 us; HybridEP's dispatch from 300 to 600 (100 us of it beside the GEMM), DeepEP's combine
    # from 700 to 750 (alone); NCCL's all_to_all as ncclDevKernel_SendRecv from 800 to 900, which its
    # record_param_comms operator names (a pipeline send's kernel has the same name): every one an all_to_all.
    # Per op: 300 + 50 + 100 = 450 us of all_to_all, 350 us of it exposed (no compute beside it), the share of the
    # 1F1B overlap's README recipe: 1 - exposed (overlap on) / all_to_all time (overlap off).
    comms = {"Collective name": "all_to_allv", "dtype": "BFloat16", "In msg nelems": 1024, "Out msg nelems": 1024,
             "Group size": 2}
    path = _gpu_trace(tmp_path / "rank0.pt.trace.json.gz", [
        _kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 0, 400, 7),
        _kernel("void hybrid_ep::dispatch_kernel<__nv_bfloat16, 8, 32>(param)", 300, 300, 20),
        _kernel("void deep_ep::intranode::combine<__nv_bfloat16, 8, 768>(int4*)", 700, 50, 20),
        _kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 800, 100, 21, ext=9),
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 790, "dur": 5, "pid": 1, "tid": 1,
         "args": {"External id": 9, **comms}},
    ])
    run, _ = measured_step([read_trace(path)])
    assert run.comm_by_op_s == pytest.approx({"all_to_all": 450e-6})
    assert run.exposed_by_op_s == pytest.approx({"all_to_all": 350e-6})
    assert run.compute_s + run.exposed_comm_s + run.idle_s == pytest.approx(run.step_s)
