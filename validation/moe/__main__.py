"""``python -m validation.moe``: check and time the expert-parallel MoE layer (usage: validation.moe's docstring)."""

from __future__ import annotations

import argparse
import math
import shlex
import sys

from simdist.calibrate.kernels import write_kernel_measurements_csv
from simdist.calibrate.measurements import write_measurements_csv
from simdist.files import check_target
from validation.collectives import host_memory_bytes
from validation.harness_cli import HarnessParser, cli_guard
from validation.moe.harness import DTYPES, MoERunConfig, keep_partial, run_moe
from validation.moe.layer import MoEConfig
from validation.spawn import HarnessError

TOLERANCE = 1e-9
"""Largest max |difference| / max |reference| of the float64 check (module doc of validation.moe.harness)."""


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = HarnessParser(prog="python -m validation.moe",
                                     description="Check and time a small expert-parallel MoE layer.")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--ranks", type=int, default=4, help="ranks = the expert-parallel group")
    parser.add_argument("--experts", type=int, default=8, help="routed experts (a multiple of --ranks)")
    parser.add_argument("--topk", type=int, default=2, help="experts per token")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--ffn", type=int, default=128, help="each expert's FFN width")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per rank of the check")
    parser.add_argument("--imbalance", type=float, default=1.0,
                        help="busiest rank's received rows / the mean (1: the router's own routing)")
    parser.add_argument("--no-check", action="store_true", help="skip the comparison with one process")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE)
    parser.add_argument("--time-tokens", default="256,1024",
                        help="tokens per rank of each timed size, comma list ('' or 0: no timing)")
    parser.add_argument("--dtype", choices=DTYPES, default="fp32", help="dtype of the timed sizes")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write the all_to_all timings to this CSV")
    parser.add_argument("--kernels-out", default=None, help="write the expert GEMM timings to this CSV")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the ranks are stopped")
    return parser.parse_args(argv)


def _tokens(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise HarnessError(f"--time-tokens '{text}' is not a comma list of integers (e.g. 256,1024)") from None
    if any(v < 0 for v in values):
        raise HarnessError(f"--time-tokens '{text}': token counts must be 0 or more")
    return tuple(v for v in values if v > 0)


def _validate(args: argparse.Namespace) -> tuple[int, ...]:
    """Every argument checked before anything is spawned: one `HarnessError` line (exit 2)."""
    counts = {"--ranks": args.ranks, "--experts": args.experts, "--topk": args.topk, "--hidden": args.hidden,
              "--ffn": args.ffn, "--tokens": args.tokens, "--iters": args.iters}
    for flag, value in counts.items():
        if value < 1:
            raise HarnessError(f"{flag} must be at least 1, got {value}")
    if args.warmup < 0 or args.seed < 0:
        raise HarnessError("--warmup and --seed must be 0 or more")
    if args.experts % args.ranks:
        raise HarnessError(f"--experts {args.experts} is not divisible by --ranks {args.ranks} "
                           f"(fix: a multiple of {args.ranks}, each rank holds experts / ranks)")
    if args.topk > args.experts:
        raise HarnessError(f"--topk {args.topk} exceeds --experts {args.experts}")
    most = args.ranks * min(1.0, (args.experts // args.ranks) / args.topk)  # validation.moe.layer.solve_bias
    if not (math.isfinite(args.imbalance) and 1.0 <= args.imbalance <= most):
        raise HarnessError(f"--imbalance must be a number from 1 to {most:g} (one rank holding "
                           f"{args.experts // args.ranks} of {args.experts} experts receives at most that many times "
                           f"the mean with top-{args.topk}), got {args.imbalance:g}")
    for flag, value in (("--tolerance", args.tolerance), ("--timeout", args.timeout)):
        if not (math.isfinite(value) and value > 0):
            raise HarnessError(f"{flag} must be a finite number above 0, got {value:g}")
    if args.backend == "gloo" and args.dtype != "fp32":
        raise HarnessError(f"--dtype {args.dtype} on gloo: gloo's CPU all_to_all is timed in fp32 (fix: --dtype fp32, "
                           "or --backend nccl)")
    tokens = _tokens(args.time_tokens)
    for flag in ("out", "kernels_out"):
        path = getattr(args, flag)
        if path is not None:  # before timing anything: an unwritable output would lose the results
            check_target(path, field=f"--{flag.replace('_', '-')}")
    memory = host_memory_bytes()
    largest = max((*tokens, args.tokens))
    # Assumption: per rank ~8 buffers of the routed rows (tokens x topk x max(hidden, ffn)), float64 at most.
    need = 8 * 8 * args.ranks * largest * args.topk * max(args.hidden, args.ffn)
    if args.backend == "gloo" and memory is not None and need > memory // 2:
        raise HarnessError(f"{largest} tokens x top-{args.topk} x {max(args.hidden, args.ffn)} on {args.ranks} ranks "
                           f"needs ~{need / 2**30:.1f} GiB, more than half of this host's {memory / 2**30:.1f} GiB "
                           f"(fix: lower --time-tokens, --tokens, --hidden or --ffn)")
    return tokens


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    tokens = _validate(args)
    command = "python -m validation.moe " + shlex.join(sys.argv[1:] if argv is None else argv)
    layer = MoEConfig(num_experts=args.experts, topk=args.topk, hidden=args.hidden, ffn_hidden=args.ffn,
                      tokens_per_rank=args.tokens, seed=args.seed)
    config = MoERunConfig(layer=layer, imbalance=args.imbalance, check=not args.no_check, time_tokens=tokens,
                          warmup=args.warmup, iters=args.iters, backend=args.backend, dtype=args.dtype,
                          command=command)
    try:
        a2a, gemms, check, meta = run_moe(config, args.ranks, timeout_s=args.timeout,
                                          partial=(args.out, args.kernels_out))
    except HarnessError as exc:
        if args.out is None and args.kernels_out is None:
            raise
        raise exc.amended(keep_partial(exc.items, str(exc), args.out, args.kernels_out)) from None
    if not meta:
        return 0  # a torchrun rank other than 0
    for m in a2a:
        print(f"dispatch all_to_all {m.nbytes:>12d} B per rank on {m.num_ranks} ranks, imbalance {m.imbalance:.3f}: "
              f"{m.time_s * 1e6:10.1f} us")
    print(f"{len(gemms)} expert GEMMs timed" if gemms else "no expert GEMM timed")
    if args.out and a2a:
        write_measurements_csv(a2a, args.out, metadata=meta)
        print(f"wrote {len(a2a)} all_to_all measurements to {args.out}")
    if args.kernels_out and gemms:
        write_kernel_measurements_csv(gemms, args.kernels_out, metadata=meta)
        print(f"wrote {len(gemms)} expert GEMM measurements to {args.kernels_out}")
    if check is None:
        return 0
    ok = check.worst <= args.tolerance
    print(f"check on {check.world_size} ranks (imbalance {check.imbalance:.3f}, bias {check.bias:.3g}): max |diff| / "
          f"max |reference| output {check.output_rel_err:.1e}, input grad {check.input_grad_rel_err:.1e}, expert "
          f"grads {check.expert_grad_rel_err:.1e}, router grad {check.router_grad_rel_err:.1e}: "
          + ("ok" if ok else "FAILED"))
    if not ok:
        print(f"error: the expert-parallel layer differs from the single-process one by {check.worst:.2e} (relative), "
              f"more than --tolerance {args.tolerance:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(cli_guard(main))
