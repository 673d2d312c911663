"""Preset figures against the published specs in validation/reference/ (copied from the shared set)."""

import csv
from pathlib import Path

import pytest

from simdist.hardware import GPU_PRESETS, load_topology, preset_names
from simdist.hardware.gpus import CPU_PRESETS
from simdist.hardware.summary import describe

REFERENCE = Path(__file__).resolve().parents[1] / "validation" / "reference"

EXPECTED_PRESETS = {
    "dgx-a100", "dgx-h100", "hgx-h200", "dgx-b200", "gb200-nvl72", "pcie-gen4-8gpu", "pcie-gen5-8gpu",
    "cpu-loopback", "dgx-b300", "gb300-nvl72", "hgx-h200-4gpu", "llama3-24k",
    "mpft-100k", "kempner-h200",
}


def _gpu_rows():
    with open(REFERENCE / "hardware_gpu_specs.csv", newline="") as fh:
        return {row["gpu"]: row for row in csv.DictReader(fh)}


def test_all_presets_present():
    assert set(preset_names()) == EXPECTED_PRESETS


@pytest.mark.parametrize(
    ("preset", "row"),
    [
        ("a100-sxm-80gb", "A100 SXM 80GB"),
        ("h100-sxm", "H100 SXM 80GB"),
        ("h200-sxm", "H200 SXM"),
        ("b200", "B200 SXM"),
        ("gb200", "GB200 (per Blackwell GPU)"),
        ("b300", "B300 SXM"),
    ],
)
def test_gpu_presets_match_reference_csv(preset, row):
    ref = _gpu_rows()[row]
    gpu = GPU_PRESETS[preset]
    assert gpu.peak.bf16 == pytest.approx(float(ref["dense_bf16_tflops"]) * 1e12)
    assert gpu.peak.fp16 == pytest.approx(float(ref["dense_fp16_tflops"]) * 1e12)
    fp8 = ref["dense_fp8_tflops"]
    if fp8.startswith("n/a"):
        assert gpu.peak.fp8 is None
    else:
        assert gpu.peak.fp8 == pytest.approx(float(fp8) * 1e12)
    # capacities are binary (the Assumption in gpus/a100-sxm-80gb.yaml), bandwidths decimal
    assert gpu.hbm_capacity == pytest.approx(float(ref["hbm_gb"]) * 2**30)
    assert gpu.hbm_bandwidth == pytest.approx(float(ref["hbm_bw_TBps"]) * 1e12)
    assert gpu.tdp_w == pytest.approx(float(ref["max_power_W"]))


def test_gpu_dtype_ordering_is_physical():
    for name, gpu in GPU_PRESETS.items():
        if name in CPU_PRESETS:  # a CPU core: no tensor cores, every dtype at the fp32 rate (gpus/cpu-core.yaml)
            assert gpu.peak.fp32 == gpu.peak.tf32 == gpu.peak.bf16 == gpu.peak.fp16 and gpu.peak.fp8 is None
            continue
        assert gpu.peak.fp32 < gpu.peak.tf32 < gpu.peak.bf16 == gpu.peak.fp16
        if gpu.peak.fp8 is not None:
            # fp8 doubles the bf16 rate (L40S datasheet rounds: 733 vs 2 x 362.05)
            assert gpu.peak.fp8 == pytest.approx(2 * gpu.peak.bf16, rel=0.03)


@pytest.mark.parametrize(
    ("preset", "nvlink_GBps", "nics", "nic_GBps", "domain"),
    [
        ("dgx-a100", 300, 8, 25, 8),
        ("dgx-h100", 450, 8, 50, 8),
        ("hgx-h200", 450, 8, 50, 8),
        ("dgx-b200", 900, 8, 50, 8),
        ("gb200-nvl72", 900, 72, 50, 72),
        ("dgx-b300", 900, 8, 100, 8),
        ("gb300-nvl72", 900, 72, 100, 72),
        ("pcie-gen4-8gpu", None, 4, 25, 1),
        ("pcie-gen5-8gpu", None, 4, 50, 1),
        ("hgx-h200-4gpu", 450, 4, 50, 4),  # 3 links of 150 GB/s per GPU (a node given as a graph)
        ("kempner-h200", 450, 2, 50, 4),  # the same board, one NIC per GPU pair
    ],
)
def test_preset_figures(preset, nvlink_GBps, nics, nic_GBps, domain):
    d = describe(load_topology(preset, num_nodes=2))
    if nvlink_GBps is None:
        assert d["nvlink"] is None
        assert "nvlink" not in d["links_by_kind"]
    else:
        assert d["nvlink"]["bandwidth_per_gpu_Bps"] == nvlink_GBps * 1e9
        links = d["nvlink"].get("links_per_gpu", 1)
        assert d["links_by_kind"]["nvlink"]["bandwidths_Bps"] == [nvlink_GBps * 1e9 / links]
    assert d["nics"]["per_node"] == nics
    assert d["nics"]["bandwidth_Bps"] == nic_GBps * 1e9
    assert d["nvlink_domain_size"] == domain


def test_nvlink_generation_bandwidth_matches_interconnect_csv():
    with open(REFERENCE / "hardware_interconnect_specs.csv", newline="") as fh:
        rows = {r["generation"]: r for r in csv.DictReader(fh) if r["family"] == "NVLink"}
    for preset, gen in [("dgx-a100", "NVLink 3 (A100)"), ("dgx-h100", "NVLink 4 (H100/H200/GH200)"),
                        ("dgx-b200", "NVLink 5 (B200/GB200/B300)"), ("dgx-b300", "NVLink 5 (B200/GB200/B300)"),
                        ("gb300-nvl72", "NVLink 5 (B200/GB200/B300)")]:
        spec = load_topology(preset).spec
        assert spec.scale_up.bandwidth == float(rows[gen]["unidir_per_gpu_or_port"]) * 1e9


def test_nvl72_is_one_domain_of_72_in_18_trays():
    t = load_topology("gb200-nvl72")
    d = describe(t)
    assert d["num_gpus"] == 72 and d["nvlink_domain_size"] == 72 and d["hosts_per_node"] == 18
    # every GPU pair of the rack is two NVLink hops apart, across trays too
    for src, dst in [(0, 1), (0, 4), (3, 71), (40, 17)]:
        r = t.route(src, dst)
        assert r.hops == 2 and r.bandwidth_Bps == 900e9
        assert [t.link(i).kind for i in r.links] == ["nvlink", "nvlink"]
    # num_nodes counts racks
    assert load_topology("gb200-nvl72", num_nodes=3).num_gpus == 216


def test_nvls_only_where_the_switch_has_it():
    assert {n: bool(load_topology(n).spec.scale_up and load_topology(n).spec.scale_up.nvls)
            for n in preset_names()} == {
        "dgx-a100": False, "dgx-h100": True, "hgx-h200": True, "dgx-b200": True, "gb200-nvl72": True,
        "pcie-gen4-8gpu": False, "pcie-gen5-8gpu": False, "cpu-loopback": False, "dgx-b300": True,
        "gb300-nvl72": True, "hgx-h200-4gpu": False, "llama3-24k": True,
        "mpft-100k": True, "kempner-h200": False,
    }


def test_cpu_loopback_is_gloo_ranks_on_one_host():
    """Ranks = gpus_per_node (default 4); rank to rank crosses two loopback links (20 us, 4 GB/s priors)."""
    t = load_topology("cpu-loopback")
    assert t.num_gpus == 4 and t.gpu.name == "CPU-core-AVX2" and t.spec.scale_up is None
    assert t.gpu.peak_flops("fp32") == 96e9  # 2 FMA x 8 lanes x 2 FLOP x 3.0 GHz
    r = t.route(0, 3)
    assert r.hops == 2 and r.bandwidth_Bps == 4e9 and [t.link(i).kind for i in r.links] == ["pcie", "pcie"]
    assert load_topology("cpu-loopback", assignments=["gpus_per_node=2"]).num_gpus == 2
