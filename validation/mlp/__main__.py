"""``python -m validation.mlp``: check and time the MLP's parallel cuts (usage: validation.mlp's docstring)."""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from simdist.calibrate.steps import write_step_measurements_csv
from simdist.files import check_target
from validation.collectives import host_memory_bytes
from validation.harness_cli import HarnessParser, cli_guard
from validation.mlp.cuts import DDP_BUCKET_BYTES
from validation.mlp.harness import ALL_CUTS, StepConfig, keep_partial, run_steps
from validation.mlp.model import MLPConfig
from validation.spawn import HarnessError


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = HarnessParser(prog="python -m validation.mlp",
                                     description="Check and time the CS336 MLP's data, tensor and pipeline cuts.")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--cuts", default="all", help=f"comma list of {','.join(ALL_CUTS)} (or all)")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--microbatches", type=int, default=0, help="pipeline micro-batches (default 2 x ranks)")
    parser.add_argument("--batch-split", default=None, help="data parallel examples per rank, e.g. 1,3")
    parser.add_argument("--bucket-mb", type=float, default=DDP_BUCKET_BYTES / 2**20, help="bucket size, MiB")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--out", default=None, help="write the timed steps to this CSV")
    parser.add_argument("--profile", default=None, metavar="DIR",
                        help="also profile each cut with torch.profiler: DIR/<cut>/rank<r>.*.pt.trace.json.gz")
    parser.add_argument("--profile-steps", type=int, default=3, help="profiled steps per cut (after one warm-up)")
    parser.add_argument("--no-timing", action="store_true", help="skip the timed steps (with --profile)")
    parser.add_argument("--check", action="store_true", help="compare gradients with the single-process reference")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the ranks are stopped")
    return parser.parse_args(argv)


def _positive(value: float, flag: str, *, zero: bool = False) -> None:
    """A finite number above 0 (or at least 0 with ``zero``), else one `HarnessError` line (exit 2)."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        bound = "0 or more" if zero else "above 0"
        raise HarnessError(f"{flag} must be a finite number {bound}, got {value:g}")


def _check_memory(args: argparse.Namespace) -> None:
    """Refuse a model whose weights and activations cannot fit this host (before spawning anything)."""
    memory = host_memory_bytes()
    # Assumption: per rank, ~6 copies of the weights (weights, gradients, the reference's weights, gradients and
    # update, a cut's own) and ~4 of the activations (forward, saved, gradients), fp32.
    need = 4 * args.ranks * (6 * args.layers * args.width**2 + 4 * args.layers * args.batch * args.width)
    if memory is not None and need > memory // 2:
        raise HarnessError(f"--layers {args.layers} x --width {args.width} (batch {args.batch}) on {args.ranks} ranks "
                           f"needs ~{need / 2**30:.1f} GiB, more than half of this host's {memory / 2**30:.1f} GiB "
                           f"(fix: lower --width, --layers, --batch or --ranks)")


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    cuts = ALL_CUTS if args.cuts == "all" else tuple(c.strip() for c in args.cuts.split(",") if c.strip())
    unknown = [c for c in cuts if c not in ALL_CUTS]
    if unknown or not cuts:
        raise HarnessError(f"--cuts: unknown cut(s) {', '.join(unknown) or '(none)'} "
                           f"(fix: use {','.join(ALL_CUTS)} or all)")
    if min(args.width, args.layers, args.batch, args.ranks, args.iters) < 1 or args.warmup < 0:
        raise HarnessError("--width, --layers, --batch, --ranks and --iters must be >= 1, --warmup >= 0")
    if args.microbatches < 0 or args.seed < 0:
        raise HarnessError("--microbatches and --seed must be >= 0 (--microbatches 0: 2 per rank)")
    _positive(args.tolerance, "--tolerance", zero=True)
    _positive(args.lr, "--lr")
    _positive(args.bucket_mb, "--bucket-mb")
    _positive(args.timeout, "--timeout")
    _check_memory(args)
    try:
        split = tuple(int(v) for v in args.batch_split.split(",")) if args.batch_split else None
    except ValueError:
        raise HarnessError(f"--batch-split '{args.batch_split}' is not a comma list of integers (e.g. 1,3)") from None
    if args.out is not None:
        check_target(args.out, field="--out")  # before timing anything: an unwritable --out would lose the results
    command = "python -m validation.mlp " + shlex.join(sys.argv[1:] if argv is None else argv)
    config = StepConfig(
        mlp=MLPConfig(num_layers=args.layers, width=args.width, batch=args.batch, seed=args.seed, lr=args.lr),
        cuts=cuts, backend=args.backend, warmup=args.warmup, iters=args.iters,
        num_microbatches=args.microbatches or min(args.batch, 2 * args.ranks), batch_split=split,
        bucket_bytes=max(1, int(args.bucket_mb * 2**20)), check=args.check,
        command=command, timed=not args.no_timing, profile_dir=args.profile, profile_steps=args.profile_steps)
    if args.profile_steps < 1:
        raise HarnessError("--profile-steps must be >= 1")
    if args.no_timing and not args.profile:
        raise HarnessError("--no-timing without --profile would do nothing (fix: add --profile DIR)")
    if args.profile is not None and Path(args.profile).is_file():
        raise HarnessError(f"--profile {args.profile} is a file (fix: name a folder)")
    try:
        rows, checks, meta = run_steps(config, args.ranks, timeout_s=args.timeout, partial=args.out)
    except HarnessError as exc:
        if args.out is None:
            raise
        raise exc.amended(keep_partial(exc.items, str(exc), args.out)) from None
    if not meta:
        return 0  # a torchrun rank other than 0
    for r in rows:
        print(f"{r.cut:24s} ranks {r.world_size}  step {r.time_s * 1e3:9.3f} ms (mean {r.time_mean_s * 1e3:.3f} ms)")
    failed = []
    for c in checks:
        ok = c.grad_rel_err <= args.tolerance
        failed += [] if ok else [c.cut]
        print(f"check {c.cut:24s} grad max|diff| {c.grad_abs_err:.2e} (relative {c.grad_rel_err:.2e}), "
              f"weights max|diff| {c.weight_abs_err:.2e}: {'ok' if ok else 'FAILED'}")
    if args.out:
        write_step_measurements_csv(rows, args.out, metadata=meta)
        print(f"wrote {len(rows)} step measurements to {args.out}")
    if failed:
        print(f"error: gradients differ from the single-process reference by more than {args.tolerance:g} "
              f"(relative) in: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(cli_guard(main))
