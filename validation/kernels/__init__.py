"""Time compute kernels on one device and write a kernel measurement CSV that ``simdist calibrate`` fits.

Usage::

    python -m validation.kernels --device cpu --out kernels.csv                      # the default sweep, one core
    python -m validation.kernels --device cpu --quick --out kernels.csv              # tiny shapes: seconds (CI)
    python -m validation.kernels --device cuda --dtype bf16 --scenario scenarios/llama3-405b-16k.yaml \\
        --gemm-sizes 256:16384:x2 --attention 1,16,4096,128 --memory-sizes 1M:256M:x4 --out kernels.csv
    simdist calibrate kernels.csv --topology cpu-loopback --holdout sizes --out cal.yaml
    simdist validate kernels.csv --calibration cal.yaml --holdout sizes

What is measured: validation.kernels.shapes (a scenario's layer GEMMs and fused attention, a GEMM sweep, SDPA,
norm and element-wise kernels); how: validation.kernels.measure (one supervised rank, warm-up, back-to-back calls,
medians); the CSV: simdist.calibrate.kernels; the fit: simdist.calibrate.kernel_fit.
"""

from validation.kernels.measure import KernelRunConfig, measure
from validation.kernels.shapes import KernelCase, attention_cases, gemm_sweep, memory_cases, scenario_cases

__all__ = ["KernelCase", "KernelRunConfig", "attention_cases", "gemm_sweep", "measure", "memory_cases",
           "scenario_cases"]
