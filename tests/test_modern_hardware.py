"""Blackwell Ultra presets (B300, GB300 NVL72), jobs on part of a cluster (cluster.placement), the head dim
(kv_channels), and inline hardware that could divide by zero."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from simdist import api
from simdist.errors import SimdistError
from simdist.hardware import GPU_PRESETS, load_topology
from simdist.hardware.placement import job_topology
from simdist.plan.layer_cost import layer_work
from simdist.plan.model_presets import resolve_model
from simdist.spec.scenario import ModelSpec

RACK64 = """
name: Llama 3 70B on 64 GPUs of one GB300 NVL72 rack
cluster: {preset: gb300-nvl72, placement: {gpus_per_node: 64}}
model: {preset: llama3-70b}
parallel: {tp: 8, pp: 4, dp: 2, sequence_parallel: true, zero_stage: 1}
training: {micro_batch_size: 1, global_batch_size: 16}
"""

INLINE_GPU = """
name: inline GPU named like a preset
cluster:
  preset: dgx-h100
  gpu: {name: H100-SXM5-80GB, form_factor: sxm, hbm_capacity: 80 GiB, hbm_bandwidth: 3.35 TB/s,
        peak: {fp32: 0 TFLOP/s, tf32: 494.7 TFLOP/s, bf16: 989 TFLOP/s, fp16: 989 TFLOP/s}}
model: {num_layers: 4, hidden_size: 1024, num_attention_heads: 16, seq_length: 512, vocab_size: 32000}
parallel: {tp: 8}
training: {global_batch_size: 8}
"""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "simdist", *args], capture_output=True, text=True, timeout=300)


# ----------------------------------------------------------------------------- presets
def test_b300_and_gb300_figures() -> None:
    b300, gb300 = GPU_PRESETS["b300"], GPU_PRESETS["gb300"]
    assert (b300.peak.bf16, b300.peak.fp8, b300.peak.tf32, b300.peak.fp32) == (2250e12, 4500e12, 1100e12, 75e12)
    # GB300 NVL72 rack figures / 72 GPUs, sparse halved: fp8 720 PF, bf16 360 PF, tf32 180 PF; 576 TB/s of HBM
    assert gb300.peak.fp8 == 720e15 / 72 / 2 and gb300.peak.bf16 == 360e15 / 72 / 2
    assert gb300.peak.tf32 == 180e15 / 72 / 2 and gb300.hbm_bandwidth == pytest.approx(576e12 / 72)
    assert b300.hbm_capacity == gb300.hbm_capacity == 288 * 2**30


def test_gb300_nvl72_is_one_domain_of_72_with_800g_nics() -> None:
    t = load_topology("gb300-nvl72", num_nodes=2)
    assert t.gpus_per_node == 72 and t.spec.hosts_per_node == 18 and t.gpu.name.startswith("GB300")
    assert t.route(0, 71).hops == 2 and t.route(0, 71).bandwidth_Bps == 900e9
    assert t.fabric is not None and t.fabric.nic_bandwidth_Bps == 100e9  # ConnectX-8, 800 Gb/s
    assert load_topology("dgx-b300").gpu.name == "B300-SXM-288GB"


# ----------------------------------------------------------------------------- partial jobs
def test_a64_gpu_job_on_one_nvl72_rack_runs_and_says_the_rest_is_idle(tmp_path: Path) -> None:
    path = tmp_path / "rack64.yaml"
    path.write_text(RACK64)
    proc = _cli("run", str(path), "--json")
    assert proc.returncode == 0, proc.stderr
    layout = json.loads(proc.stdout)["layout"]
    assert layout["num_gpus"] == 64 and layout["cluster_gpus"] == 72 and layout["idle_gpus"] == 8
    assert layout["placement"] == {"num_nodes": 1, "gpus_per_node": 64}
    text = _cli("run", str(path))
    assert text.returncode == 0 and "partial job: 64 of the cluster's 72 GPUs" in text.stdout
    assert "8 GPUs idle" in text.stdout


def test_a_layout_that_does_not_fill_the_cluster_stays_an_error(tmp_path: Path) -> None:
    path = tmp_path / "rack.yaml"
    path.write_text(RACK64.replace(", placement: {gpus_per_node: 64}", ""))
    proc = _cli("run", str(path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "64 GPUs, but the cluster has 72" in proc.stderr and "cluster.placement" in proc.stderr
    path.write_text(RACK64.replace("gpus_per_node: 64", "gpus_per_node: 66"))
    proc = _cli("check", str(path))
    assert proc.returncode == 2 and "cluster.placement.gpus_per_node" in proc.stderr and "whole hosts" in proc.stderr


def test_four_racks_of_64_keep_the_racks_routes() -> None:
    # 256 GPUs as 4 racks x 64 of an 8-rack cluster: rank r on used rack r // 64. Inside a rack the job's GPUs route
    # as on the full cluster (the NVSwitch crossbar); between racks through their own 800 Gb/s NIC, at the full
    # cluster's bottleneck (on this fat tree a pair may share a leaf the full cluster splits: placement.py).
    full = load_topology("gb300-nvl72", num_nodes=8)
    job = job_topology(full, num_nodes=4, gpus_per_node=64)
    assert job.num_gpus == 256 and job.cluster_num_gpus == 576 and job.spec.inter_node.nics_per_node == 64
    for a, b in [(0, 63), (5, 64 + 5), (70 - 8, 3 * 64 + 17)]:
        ra, rb = divmod(a, 64), divmod(b, 64)
        rf = full.route(ra[0] * 72 + ra[1], rb[0] * 72 + rb[1])
        rj = job.route(a, b)
        assert rj.bandwidth_Bps == rf.bandwidth_Bps
        if ra[0] == rb[0]:
            assert (rj.hops, rj.latency_s) == (rf.hops, rf.latency_s)
    sc = api.scenario_of({"cluster": {"preset": "gb300-nvl72", "num_nodes": 8,
                                      "placement": {"num_nodes": 4, "gpus_per_node": 64}},
                          "model": {"preset": "llama3-8b"}, "parallel": {"tp": 4, "dp": 64},
                          "training": {"global_batch_size": 64}})
    assert sc.topology.num_gpus == 256
    with pytest.raises(SimdistError, match="at most 8 nodes"):
        job_topology(full, num_nodes=9, gpus_per_node=64)


# ----------------------------------------------------------------------------- inline hardware
@pytest.mark.parametrize(("old", "new", "field"), [
    ("fp32: 0 TFLOP/s", "fp32: 0 TFLOP/s", "cluster.gpu.peak.fp32"),
    ("fp32: 0 TFLOP/s", "fp32: 1e-300 TFLOP/s", "cluster.gpu.peak.fp32"),
    ("hbm_capacity: 80 GiB, ", "hbm_capacity: 0 GiB, ", "cluster.gpu.hbm_capacity"),
])
def test_inline_gpu_that_would_divide_by_zero_exits_2_with_one_line(tmp_path: Path, old: str, new: str,
                                                                   field: str) -> None:
    # An inline GPU named like a preset used to pass `simdist check` and crash `simdist run` with a
    # ZeroDivisionError (a zero fp32 rate divides every element-wise kernel's FLOPs).
    text = INLINE_GPU if old == new else INLINE_GPU.replace("fp32: 0 TFLOP/s", "fp32: 67 TFLOP/s").replace(
        old.replace("fp32: 0", "fp32: 67"), new)
    path = tmp_path / "gpu.yaml"
    path.write_text(text)
    for command in ("check", "run"):
        proc = _cli(command, str(path))
        assert proc.returncode == 2, proc.stdout
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and field in proc.stderr


# ----------------------------------------------------------------------------- head dim
def test_kv_channels_sets_the_head_dim_of_qwen3_shapes() -> None:
    # Qwen3-32B (its config.json): h 5120, 64 heads of head_dim 128 (64 x 128 = 8192 != 5120), 8 KV heads,
    # intermediate 25600, 64 layers, vocab 151936, untied: 32.8B parameters (Qwen3 technical report Table 1).
    m = resolve_model(ModelSpec(num_layers=64, hidden_size=5120, num_attention_heads=64, num_query_groups=8,
                                kv_channels=128, ffn_hidden_size=25600, vocab_size=151936, swiglu=True,
                                tied_embeddings=False, seq_length=4096))
    h, q, kv, f = 5120, 64 * 128, 8 * 128, 25600
    assert m.head_dim == 128 and m.q_hidden_size == q
    assert m.params_per_layer == h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h
    assert m.num_params == pytest.approx(32.76e9, rel=1e-3)
    shapes = {k.name: k.gemm_mnk for k in layer_work(m, attention="flash").forward if k.gemm_mnk}
    assert shapes["qkv"] == (4096, q + 2 * kv, h) and shapes["projection"] == (4096, h, q)
    assert shapes["flash_attention"] == (4096, 4096, 128)
    # without kv_channels, head dim = h / a as before (Llama 3 8B: 4096 / 32)
    assert resolve_model(ModelSpec(preset="llama3-8b")).head_dim == 128


def test_hf_config_head_dim_is_read(tmp_path: Path) -> None:
    config = {"model_type": "qwen3", "architectures": ["Qwen3ForCausalLM"], "hidden_act": "silu",
              "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "num_hidden_layers": 28, "intermediate_size": 3072, "max_position_embeddings": 40960,
              "vocab_size": 151936, "tie_word_embeddings": True}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    m = resolve_model(ModelSpec(hf_config=path, seq_length=4096))
    assert m.head_dim == 128 and m.q_hidden_size == 2048 and m.swiglu


def test_nvls_on_an_nvlink3_switch_exits_2_with_one_line(tmp_path: Path) -> None:
    # NCCL's nvlsEfficiency is 0 before Hopper: NVLS on a DGX A100 used to divide by zero in `simdist run`.
    path = tmp_path / "nvls.yaml"
    path.write_text(INLINE_GPU.replace("  gpu: {name: H100-SXM5-80GB, form_factor: sxm, hbm_capacity: 80 GiB, "
                                       "hbm_bandwidth: 3.35 TB/s,\n        peak: {fp32: 0 TFLOP/s, tf32: 494.7 "
                                       "TFLOP/s, bf16: 989 TFLOP/s, fp16: 989 TFLOP/s}}\n", "")
                    .replace("preset: dgx-h100", "{preset: dgx-a100, scale_up: {nvls: true}}")
                    .replace("cluster:\n  {", "cluster: {"))
    proc = _cli("run", str(path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "cluster.scale_up.nvls" in proc.stderr
