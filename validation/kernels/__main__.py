"""``python -m validation.kernels``: time GEMMs, attention and memory kernels (usage: validation.kernels)."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from simdist.calibrate.kernels import write_kernel_measurements_csv
from simdist.files import check_target
from validation.collectives import parse_sizes
from validation.harness_cli import HarnessParser, cli_guard
from validation.kernels.measure import KernelRunConfig, keep_partial, measure
from validation.kernels.shapes import attention_cases, gemm_sweep, memory_cases, parse_attention, scenario_cases
from validation.spawn import HarnessError

# Defaults per device: (gemm sizes, attention shapes, memory sizes in elements, largest FLOPs of one kernel)
DEFAULTS = {
    "cpu": ("64:1024:x2", "1,4,256,64", "256K:4M:x4", 2e10),
    "cuda": ("256:16384:x2", "1,16,4096,128;4,16,2048,64", "1M:256M:x4", 1e16),
}
QUICK = ("16:128:x2", "1,2,64,32", "4K:64K:x4")  # --quick (CPU): tiny shapes, seconds


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = HarnessParser(prog="python -m validation.kernels",
                                     description="Time GEMM, attention and memory kernels on one device.")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default=None,
                        help="default: fp32 on cpu, bf16 on cuda")
    parser.add_argument("--scenario", default=None, help="also time this scenario's layer GEMMs and attention")
    parser.add_argument("--gemm-sizes", default=None, help="GEMM sweep sizes, e.g. 64:1024:x2 ('' for none)")
    parser.add_argument("--attention", default=None, help="SDPA shapes batch,heads,seq,head_dim;... ('' for none)")
    parser.add_argument("--memory-sizes", default=None, help="memory kernels' elements, e.g. 256K:4M:x4 ('' none)")
    parser.add_argument("--norm-width", type=int, default=1024, help="row width of layer_norm and softmax")
    parser.add_argument("--max-flops", type=float, default=None, help="skip kernels of more FLOPs (cpu 2e10)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and few iterations: seconds")
    parser.add_argument("--warmup", type=int, default=None, help="default 3 (quick 1)")
    parser.add_argument("--iters", type=int, default=None, help="default 10 (quick 3)")
    parser.add_argument("--out", default="kernels.csv")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the run is stopped")
    return parser.parse_args(argv)


def _cases(args: argparse.Namespace) -> tuple[list, list[str]]:
    gemm, attention, memory, max_flops = DEFAULTS[args.device]
    if args.quick:
        gemm, attention, memory = QUICK
    gemm = gemm if args.gemm_sizes is None else args.gemm_sizes
    attention = attention if args.attention is None else args.attention
    memory = memory if args.memory_sizes is None else args.memory_sizes
    max_flops = max_flops if args.max_flops is None else args.max_flops
    if not (math.isfinite(max_flops) and max_flops > 0):
        raise HarnessError(f"--max-flops must be a positive number, got {max_flops:g}")
    if args.norm_width < 1:
        raise HarnessError(f"--norm-width must be at least 1, got {args.norm_width}")
    cases = []
    notes = []
    if args.scenario:
        if not Path(args.scenario).is_file():
            raise HarnessError(f"--scenario {args.scenario}: no such file")
        mine, what = scenario_cases(args.scenario)
        cases += mine
        notes.append(f"scenario {what}")
    cases += gemm_sweep(parse_sizes(gemm, "--gemm-sizes") if gemm.strip() else ())
    cases += attention_cases(parse_attention(attention))
    cases += memory_cases(parse_sizes(memory, "--memory-sizes") if memory.strip() else (), args.norm_width)
    kept = [c for c in cases if c.flops() <= max_flops]
    if len(kept) < len(cases):
        notes.append(f"skipped {len(cases) - len(kept)} kernel(s) of more than {max_flops:g} FLOP (--max-flops)")
    if not kept:
        raise HarnessError("nothing to time (fix: give --gemm-sizes, --attention, --memory-sizes or --scenario, "
                           "or raise --max-flops)")
    return kept, notes


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    iters = args.iters if args.iters is not None else (3 if args.quick else 10)
    if warmup < 0 or iters < 1:
        raise HarnessError("--warmup must be >= 0 and --iters >= 1")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise HarnessError(f"--timeout must be a finite number above 0, got {args.timeout:g}")
    check_target(args.out, field="--out")  # before timing anything: an unwritable --out would lose the results
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise HarnessError("--device cuda, but torch sees no CUDA GPU here (fix: --device cpu)")
    cases, notes = _cases(args)
    for note in notes:
        print(note)
    command = "python -m validation.kernels " + shlex.join(sys.argv[1:] if argv is None else argv)
    dtype = args.dtype or ("bf16" if args.device == "cuda" else "fp32")
    config = KernelRunConfig(cases=tuple(cases), device=args.device, dtype=dtype, warmup=warmup, iters=iters,
                             min_iteration_s=2e-4 if args.quick else 1e-3, command=command)
    try:
        rows, meta = measure(config, timeout_s=args.timeout, partial=args.out)
    except HarnessError as exc:
        raise exc.amended(keep_partial(exc.items, str(exc), args.out)) from None
    write_kernel_measurements_csv(rows, args.out, metadata={**meta, **({"notes": "; ".join(notes)} if notes else {})})
    print(f"wrote {len(rows)} kernel measurements to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(cli_guard(main))
