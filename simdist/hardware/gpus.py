"""GPU presets: dense peak FLOP/s per dtype, HBM capacity and bandwidth, board power.

Values come from ``../shared/reference/hardware_gpu_specs.csv`` (copied to
``validation/reference/hardware_gpu_specs.csv``) where it has them: the dense bf16/fp16 and fp8
peaks, HBM size and bandwidth and TDP. The fp32 and tf32 rates, which the CSV does not list, come
from NVIDIA's datasheets as cited beside each value; "sparse" datasheet figures are halved to dense.

# Assumption: NVIDIA's HBM capacities are binary sizes (HBM stacks are 2**k bytes: A100/H100
# "80 GB" = 5 stacks x 16 GiB; nvidia-smi reports 81920 MiB for A100 80GB), so "80 GB" -> 80 GiB.
# Fit-in-memory checks then use the capacity the allocator can actually address, minus reserves
# that the memory model (not this table) accounts for.
"""

from __future__ import annotations

from simdist.errors import PresetError
from simdist.spec.gpu import GpuSpec

_CSV = "hardware_gpu_specs.csv (ml-engineering @ 744d01e compute/accelerator/README.md)"


def _gpu(name: str, form_factor: str, peak: dict[str, str | None], capacity: str, bandwidth: str,
         tdp_w: float) -> GpuSpec:
    return GpuSpec.model_validate(
        {"name": name, "form_factor": form_factor, "peak": peak, "hbm_capacity": capacity,
         "hbm_bandwidth": bandwidth, "tdp_w": tdp_w}
    )


GPU_PRESETS: dict[str, GpuSpec] = {
    # A100 SXM4 80GB. bf16/fp16 312 dense, 80 GB HBM2e at 2.0 TB/s, 400 W: _CSV (also Megatron 2021:
    # "312 teraFLOP/s"). fp32 19.5 and tf32 156 dense: NVIDIA A100 datasheet (tf32 312 with sparsity).
    # No fp8 tensor cores.
    "a100-sxm-80gb": _gpu(
        "A100-SXM4-80GB", "sxm",
        {"fp32": "19.5 TFLOP/s", "tf32": "156 TFLOP/s", "bf16": "312 TFLOP/s", "fp16": "312 TFLOP/s", "fp8": None},
        "80 GiB", "2.0 TB/s", 400,
    ),
    # H100 SXM5 80GB. bf16 989 dense, fp8 1979 dense, 80 GB HBM3 at 3.35 TB/s, 700 W: _CSV.
    # fp32 67 (66.9 vector) and tf32 494.7 dense (989 with sparsity): NVIDIA H100 datasheet
    # (SXM column), as tabulated by glennklockwood.com/garden/processors/h100.
    "h100-sxm": _gpu(
        "H100-SXM5-80GB", "sxm",
        {"fp32": "67 TFLOP/s", "tf32": "494.7 TFLOP/s", "bf16": "989 TFLOP/s", "fp16": "989 TFLOP/s",
         "fp8": "1979 TFLOP/s"},
        "80 GiB", "3.35 TB/s", 700,
    ),
    # H200 SXM 141GB: same GH100 compute as H100 SXM (_CSV: "= H100"); 141 GB HBM3e at 4.8 TB/s, 700 W: _CSV.
    "h200-sxm": _gpu(
        "H200-SXM-141GB", "sxm",
        {"fp32": "67 TFLOP/s", "tf32": "494.7 TFLOP/s", "bf16": "989 TFLOP/s", "fp16": "989 TFLOP/s",
         "fp8": "1979 TFLOP/s"},
        "141 GiB", "4.8 TB/s", 700,
    ),
    # B200 (HGX/DGX B200, 1000 W). bf16 2250 dense, fp8 4500 dense, 180 GB HBM3e at 8.0 TB/s: _CSV
    # (NVIDIA's HGX table gives 7.7 TB/s; the CSV's compiled 8.0 is kept and flagged there).
    # fp32 75 and tf32 1100 dense (2.2 PF sparse): NVIDIA GB200 NVL72 / HGX B200 spec table.
    "b200": _gpu(
        "B200-SXM-180GB", "sxm",
        {"fp32": "75 TFLOP/s", "tf32": "1100 TFLOP/s", "bf16": "2250 TFLOP/s", "fp16": "2250 TFLOP/s",
         "fp8": "4500 TFLOP/s"},
        "180 GiB", "8.0 TB/s", 1000,
    ),
    # GB200 (one Blackwell GPU of a GB200 superchip, 1200 W). bf16 2500 dense, fp8 5000 dense,
    # 186 GB HBM3e at 8.0 TB/s: _CSV (which flags a conflicting 2250 bf16 figure in a secondary blog).
    # fp32 80 and tf32 1250 dense (2.5 PF sparse): NVIDIA GB200 NVL72 spec table, per GPU.
    "gb200": _gpu(
        "GB200-Blackwell-186GB", "superchip",
        {"fp32": "80 TFLOP/s", "tf32": "1250 TFLOP/s", "bf16": "2500 TFLOP/s", "fp16": "2500 TFLOP/s",
         "fp8": "5000 TFLOP/s"},
        "186 GiB", "8.0 TB/s", 1200,
    ),
    # B300 (Blackwell Ultra, HGX/DGX B300 SXM). bf16 2250 dense, fp8 4500 dense, 288 GB HBM3e at 8.0 TB/s,
    # 1000 W: _CSV (B300 SXM row). NVIDIA's HGX B300 table as compiled by verda.com/blog/gb300-nvl72-architecture
    # (per GPU, sparsity halved) agrees on bf16 2.25 PF and fp8 4.5 PF and gives fp32 75 and tf32 1100 dense (used
    # here), but 7.7 TB/s and 1.1 kW; the CSV's 8.0 TB/s and 1000 W are kept and the conflict flagged.
    # glennklockwood.com/garden/processors/B300 (HGX B300): fp32 75, tf32 1125 dense, bf16 2250, fp8 4500.
    "b300": _gpu(
        "B300-SXM-288GB", "sxm",
        {"fp32": "75 TFLOP/s", "tf32": "1100 TFLOP/s", "bf16": "2250 TFLOP/s", "fp16": "2250 TFLOP/s",
         "fp8": "4500 TFLOP/s"},
        "288 GiB", "8.0 TB/s", 1000,
    ),
    # GB300 (one Blackwell Ultra GPU of a GB300 NVL72 rack). NVIDIA GB300 NVL72 specifications (rack / 72 GPUs,
    # sparse figures halved): fp8 720 PF sparse -> 5000 dense, fp16/bf16 360 PF -> 2500, tf32 180 PF -> 1250;
    # 20.7 TB HBM3e (288 GB per GPU) at 576 TB/s -> 8.0 TB/s; as tabulated per GPU by verda.com/blog/
    # gb300-nvl72-architecture (also fp32 80 TF, 1.4 kW) and glennklockwood.com/garden/processors/B300 (360 PF fp8
    # dense per rack, 20 TB at 576 TB/s, 1400 W). Not in the reference CSV. 288 GB -> 288 GiB by the binary-size
    # assumption above (drivers report ~279 GB usable, verda.com).
    "gb300": _gpu(
        "GB300-Blackwell-288GB", "superchip",
        {"fp32": "80 TFLOP/s", "tf32": "1250 TFLOP/s", "bf16": "2500 TFLOP/s", "fp16": "2500 TFLOP/s",
         "fp8": "5000 TFLOP/s"},
        "288 GiB", "8.0 TB/s", 1400,
    ),
    # L40S (Ada, PCIe Gen4 x16 card, no NVLink). NVIDIA L40S datasheet: fp32 91.6, tf32 183 dense
    # (366 sparse), bf16/fp16 362.05 dense (733 sparse), fp8 733 dense (1466 sparse); 48 GB GDDR6 at
    # 864 GB/s; 350 W. Not in the reference CSV.
    "l40s": _gpu(
        "L40S-48GB", "pcie",
        {"fp32": "91.6 TFLOP/s", "tf32": "183 TFLOP/s", "bf16": "362.05 TFLOP/s", "fp16": "362.05 TFLOP/s",
         "fp8": "733 TFLOP/s"},
        "48 GiB", "864 GB/s", 350,
    ),
    # H100 PCIe 80GB (PCIe Gen5 x16 card). NVIDIA H100 datasheet, PCIe column (sparse figures halved):
    # fp32 51, tf32 378, bf16/fp16 756, fp8 1513; 80 GB HBM2e at 2.0 TB/s; 350 W. Not in the reference CSV.
    "h100-pcie": _gpu(
        "H100-PCIe-80GB", "pcie",
        {"fp32": "51 TFLOP/s", "tf32": "378 TFLOP/s", "bf16": "756 TFLOP/s", "fp16": "756 TFLOP/s",
         "fp8": "1513 TFLOP/s"},
        "80 GiB", "2.0 TB/s", 350,
    ),
    # cpu-core: not a GPU. One x86 core standing in for a "device" so that gloo ranks on one CPU host
    # (topologies/cpu-loopback.yaml) can be priced by the same roofline and calibrated from measured steps.
    # fp32 peak 96 GFLOP/s = 2 FMA pipes x 8 fp32 lanes (256-bit AVX2) x 2 FLOP per FMA x 3.0 GHz
    # (Intel 64 and IA-32 Architectures Optimization Reference Manual, Haswell+: two 256-bit FMA ports;
    # AMD Software Optimization Guide for Zen 2/3: two 256-bit FMA pipes).
    # Assumption: a 3.0 GHz sustained all-core clock (server parts run 2.4-3.5 GHz); calibration (fit of
    # gemm_peak_efficiency on the measured single-process MLP step) absorbs the difference.
    # Assumption: tf32, bf16 and fp16 get the fp32 rate. x86 cores without AMX / AVX512-BF16 have no faster
    # path for them (PyTorch's CPU kernels compute in fp32, upcasting bf16/fp16; tf32 is a CUDA-only mode),
    # so this is an upper bound for bf16/fp16; fp8: none.
    # Assumption: 10 GB/s of DRAM bandwidth per core, the single-thread STREAM triad figure of recent server
    # cores (a socket's 8 x DDR4-3200 = 204.8 GB/s shared by up to 64 cores is 3.2 GB/s each when all stream
    # at once; one busy core alone reaches ~10-20 GB/s). 4 GiB of memory per rank, 15 W per core (a 64-core
    # 225-280 W socket / 64, rounded), both Assumptions only used for memory-fit checks and reports.
    # form_factor "pcie": the spec has no CPU form factor; this pseudo-device sits behind the host's links
    # like a PCIe card (topologies/cpu-loopback.yaml).
    "cpu-core": _gpu(
        "CPU-core-AVX2", "pcie",
        {"fp32": "96 GFLOP/s", "tf32": "96 GFLOP/s", "bf16": "96 GFLOP/s", "fp16": "96 GFLOP/s", "fp8": None},
        "4 GiB", "10 GB/s", 15,
    ),
}

CPU_PRESETS = frozenset({"cpu-core"})
"""GPU_PRESETS entries that are CPU cores standing in for devices (no tensor cores: every dtype at one rate)."""


def gpu_preset(name: str) -> GpuSpec:
    """The GPU preset called ``name``; an unknown name lists the valid ones."""
    try:
        return GPU_PRESETS[name]
    except KeyError:
        raise PresetError(
            f"unknown GPU preset '{name}'",
            field="gpu",
            fix=f"use one of: {', '.join(sorted(GPU_PRESETS))}, or describe the GPU inline",
        ) from None
