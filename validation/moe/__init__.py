"""A small mixture-of-experts layer on real torch.distributed ranks: checked against one process, and timed.

Usage (spawns the ranks itself, or joins a torchrun launch)::

    python -m validation.moe --backend gloo --ranks 4 --experts 8 --topk 2 --imbalance 1.5 \\
        --time-tokens 256,1024 --out moe_a2a.csv --kernels-out moe_gemms.csv
    torchrun --nproc-per-node 8 -m validation.moe --backend nccl --ranks 8 --experts 64 --topk 8 --hidden 4096 \\
        --ffn 1536 --dtype bf16 --time-tokens 1024,4096,16384 --out a2a.csv --kernels-out gemms.csv

The layer (validation.moe.layer): router, top-k, dispatch all_to_all with unequal splits (per-expert counts
exchanged first), local experts, combine all_to_all, outputs weighted by the router's gate weights. The check and
the timings: validation.moe.harness. ``--imbalance X`` skews the routing towards rank 0's experts until the
busiest rank receives X times the mean rows (1: the router's own, near-even, routing).

Outputs: ``--out``: the dispatch all_to_all per timed size, nccl-tests style with an ``imbalance`` column
(simdist.calibrate.measurements); ``--kernels-out``: the experts' GEMMs (simdist.calibrate.kernels). Both are read
by ``simdist calibrate`` and ``simdist validate``. Exit status 0; 1 when a check exceeds ``--tolerance`` (the
files are still written); 2 for bad input or a failed run (one ``error:`` line).
"""

from validation.moe.harness import MoECheck, MoERunConfig, run_moe
from validation.moe.layer import MoEConfig, moe_forward, reference_forward

__all__ = ["MoECheck", "MoEConfig", "MoERunConfig", "moe_forward", "reference_forward", "run_moe"]
