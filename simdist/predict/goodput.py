"""Goodput: the expected fraction of wall-clock time a training job trains, given failures and checkpoints.

Failure rates come from simdist/predict/data/goodput.yaml (the Llama 3 405B run's unexpected interruptions by
cause, Dubey et al. 2024 Table 5), each cause's rate per component-hour (GPU, NIC, host) scaled to the cluster.
A synchronous job stops at any component's failure, so its rate is the sum: lambda = sum_c n_c r_c, and
MTBF = 1 / lambda.

Checkpointing every tau seconds of training, each write stalling delta seconds, and each failure costing the
restart R plus the work since the last checkpoint (on average half a period, (tau + delta) / 2), the first-order
goodput is (Young 1974, "A first order approximation to the optimum checkpoint interval", CACM 17(9); Daly 2006,
"A higher order estimate of the optimum checkpoint interval for restart dumps", FGCS 22(3), eq. 1-2):

    goodput = tau / (tau + delta) x (1 - (R + (tau + delta) / 2) / MTBF)       (clipped at 0)

with Young's optimum interval tau = sqrt(2 delta MTBF) unless the scenario gives one.
# Assumption: failures are independent and memoryless (exponential inter-arrival, first order in
# tau / MTBF), and planned maintenance (47 of Llama 3's 466 interruptions) is scheduled, not charged.
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from simdist.spec.faults import CheckpointSpec

DATA = Path(__file__).parent / "data" / "goodput.yaml"
SECONDS_PER_HOUR = 3600.0


@lru_cache(maxsize=1)
def failure_data() -> dict[str, Any]:
    """The data file (simdist/predict/data/goodput.yaml)."""
    return yaml.safe_load(DATA.read_text(encoding="utf-8"))


def rates_per_hour() -> dict[str, float]:
    """Unexpected interruptions per component-hour, by component (gpu, nic, host), from the data file."""
    data = failure_data()
    seen = data["observed"]
    hours = seen["days"] * 24.0
    out: dict[str, float] = {"gpu": 0.0, "nic": 0.0, "host": 0.0}
    counts = {"gpu": seen["gpus"], "nic": seen["nics"], "host": seen["hosts"]}
    for cause in data["causes"].values():
        out[cause["per"]] += cause["count"] / (counts[cause["per"]] * hours)
    return out


def goodput(*, num_gpus: int, num_hosts: int, num_nics: int, num_params: float, checkpoint: CheckpointSpec
            ) -> dict[str, Any]:
    """The run JSON's ``goodput``: MTBF, checkpoint write/restart/interval, and the fraction of time training."""
    data = failure_data()
    rates = rates_per_hour()
    per_hour = rates["gpu"] * num_gpus + rates["nic"] * num_nics + rates["host"] * num_hosts
    mtbf_s = SECONDS_PER_HOUR / per_hour if per_hour > 0 else math.inf
    cp = data["checkpoint"]
    write_s = (checkpoint.write if checkpoint.write is not None
               else num_params * float(cp["bytes_per_parameter"]) / float(cp["storage_write_Bps"]))
    restart_s = checkpoint.restart if checkpoint.restart is not None else float(cp["restart_s"])
    optimum = math.sqrt(2.0 * write_s * mtbf_s) if math.isfinite(mtbf_s) else math.inf
    interval_s = checkpoint.interval if checkpoint.interval is not None else optimum
    period = interval_s + write_s
    if not math.isfinite(mtbf_s):
        fraction = 1.0
    elif period <= 0:
        fraction = max(0.0, 1.0 - restart_s / mtbf_s)
    else:
        fraction = interval_s / period * max(0.0, 1.0 - (restart_s + period / 2.0) / mtbf_s)
    return {
        "fraction": fraction, "mtbf_s": mtbf_s, "failures_per_day": 24.0 * per_hour,
        "checkpoint_write_s": write_s, "restart_s": restart_s, "checkpoint_interval_s": interval_s,
        "optimal_interval_s": optimum,
        "how": "Young/Daly first order: tau/(tau+delta) x (1 - (R + (tau+delta)/2)/MTBF); failure rates per GPU, "
               "NIC and host from " + data["source"],
    }
