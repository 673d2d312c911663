"""The CS336 lecture's MLP and its three parallel cuts as real torch.distributed training steps.

Usage (spawns the ranks itself, or joins a torchrun launch)::

    python -m validation.mlp --backend gloo --ranks 4 --cuts all --width 1024 --layers 4 --batch 128 \\
        --iters 10 --out steps.csv --check
    python -m validation.mlp --backend gloo --ranks 2 --cuts data_parallel --batch-split 1,3 --check
    torchrun --nproc-per-node 4 -m validation.mlp --backend nccl --ranks 4 --out steps.csv --check

Cuts (``--cuts all`` or a comma list): single, data_parallel, data_parallel_bucketed, tensor_parallel,
pipeline_gpipe, pipeline_1f1b (validation.mlp.cuts). ``--check`` compares every cut's gradients and
updated weights with a single-process reference (same seeds) and fails, exit status 1 and one line, when
the largest gradient difference exceeds ``--tolerance`` (1e-5) relative to the largest reference
gradient. Each step is timed (validation.mlp.harness) and written with
``simdist.calibrate.steps.write_step_measurements_csv``, after ``# key: value`` metadata lines.
"""

from validation.mlp.cuts import Cut, GatherColumns, build_cut, even_split, weighted_gradient_sum_
from validation.mlp.harness import ALL_CUTS, CheckResult, StepConfig, run_steps
from validation.mlp.model import MLPConfig, reference_step

__all__ = ["ALL_CUTS", "CheckResult", "Cut", "GatherColumns", "MLPConfig", "StepConfig", "build_cut", "even_split",
           "reference_step", "run_steps", "weighted_gradient_sum_"]
