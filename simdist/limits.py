"""Limits on what one input may ask of simdist, in one place, each with its reason.

Every command estimates its work from its inputs (GPUs, ops to simulate, sizes in a sweep, layouts to
rank) before it allocates or simulates anything, and refuses what exceeds these limits with one line that
gives the numbers and the fix (`LimitError`, exit status 2). Physical bounds on spec fields (a hidden size,
a bandwidth) refuse values no hardware or model has, so that a typo (``1e30``) is an error, not a step of
1e50 s. ``docs/limits.md`` is generated from `LIMITS` (``python -m simdist.limits``; a test checks it).

The work limits describe today's engine on a 2-core machine (``benchmarks/``): a step of `MAX_STEP_OPS`
ops takes about two minutes and 2.5 GB. They are deliberately generous for valid inputs (the largest
published layouts pass) and exist to turn "hangs or runs out of memory" into a message; raise them here
when the engine gets faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from simdist.errors import LimitError

__all__ = ["LIMITS", "Limit", "check_step_work", "check_work", "limits_table", "step_ops_estimate"]


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit: its value, the unit it is counted in, and why it is where it is."""

    name: str
    value: float
    unit: str
    reason: str
    shown: str = ""
    """How a reader writes the value, where the unit has prefixes (``1 PB/s``, ``64 TiB``)."""

    def text(self) -> str:
        """The value as a reader writes it: ``1,048,576 GPUs``, ``1 PB/s``."""
        if self.shown:
            return self.shown
        v = self.value
        number = f"{int(v):,}" if float(v).is_integer() and abs(v) < 1e15 else f"{v:g}"
        return f"{number} {self.unit}".strip()


LIMITS: dict[str, Limit] = {}


def _limit(name: str, value: float, unit: str, reason: str, shown: str = "") -> Limit:
    LIMITS[name] = Limit(name, value, unit, reason, shown)
    return LIMITS[name]


# --------------------------------------------------------------------------- clusters (spec.topology)
GPUS = _limit(
    "gpus", 1_048_576, "GPUs per cluster",
    "about five times the largest clusters in service in 2025 (100,000-200,000 GPUs); a topology keeps tables "
    "per GPU and per NIC (8 bytes an entry), so 10^9 nodes would need over 100 GiB before any work")
NUM_NODES = _limit("num_nodes", 10**12, "nodes",
                   "a bound on the field alone; the cluster's GPUs (num_nodes x gpus_per_node) are limited below")
GPUS_PER_NODE = _limit(
    "gpus_per_node", 1024, "GPUs per node",
    "a node is one NVLink domain or server: the largest announced is 576 GPUs (NVL576); routing inside a node "
    "searches the node's graph once per GPU")
HOSTS_PER_NODE = _limit("hosts_per_node", 256, "hosts per node",
                        "a GB200 NVL72 rack holds 18 compute trays; 256 covers any rack")
CPU_SOCKETS = _limit("cpu_sockets", 16, "CPU sockets per host", "the largest servers have 8 sockets")
PCIE_SWITCHES = _limit("pcie_switches_per_socket", 64, "PCIe switches per socket",
                       "servers have 1-4 per socket; each adds a vertex to every route search of the node")
NVSWITCHES = _limit("num_switches", 1024, "NVSwitch chips per node", "an NVL72 rack has 18")
NICS_PER_NODE = _limit("nics_per_node", 4096, "NICs per node", "an NVL72 rack has 72; 4096 covers 4 per GPU")
NODE_COMPONENTS = _limit(
    "node_components", 4096, "components per node",
    "GPUs + NICs + PCIe switches + CPU sockets + NVSwitches of one node: each is a vertex of the node graph that "
    "routing searches once per GPU (work grows with GPUs x components)")
NODE_ROUTE_WORK = _limit(
    "node_route_work", 2_200_000, "GPU x component visits",
    "the nearest-NIC search visits every component of a node once per GPU: a node of 1024 GPUs and 1024 NICs "
    "takes about 5 s on a 2-core machine")
SWITCH_RADIX = _limit("switch_radix", 65_536, "ports per switch", "the largest switch chips have 512 ports")
OVERSUBSCRIPTION = _limit("oversubscription", 1024, "x",
                          "a leaf with 1024 times more downlink than uplink capacity is not a network fabric")

# --------------------------------------------------------------------------- quantities (spec fields with units)
BANDWIDTH_MIN = _limit("bandwidth_min", 1e6, "B/s",
                       "slower than any interconnect simdist models (10 Mb/s Ethernet is 1.25 MB/s)", "1 MB/s")
BANDWIDTH_MAX = _limit("bandwidth_max", 1e15, "B/s",
                       "100 times HBM3e (8 TB/s) and 1,000 times NVLink5 (0.9 TB/s per direction)", "1 PB/s")
LATENCY_MAX = _limit("latency_max", 1.0, "s",
                     "a link or call latency of a second is not a latency (Ethernet RTTs are microseconds)")
FLOPS_MIN = _limit("flops_min", 1e9, "FLOP/s",
                   "slower than any device simdist models (one CPU core, the cpu-core preset, is 96 GFLOP/s); a zero "
                   "rate would divide by zero in every kernel's time", "1 GFLOP/s")
FLOPS_MAX = _limit("flops_max", 1e18, "FLOP/s",
                   "200 times a B200's dense fp8 peak (4.5 PFLOP/s)", "1 EFLOP/s")
MEMORY_MIN = _limit("memory_min", 2.0**20, "B",
                    "a device memory smaller than 1 MiB holds no model layer (and zero would make every memory "
                    "fraction a division by zero)", "1 MiB")
MEMORY_MAX = _limit("memory_max", 2.0**46, "B",
                    "300 times a B200's HBM (192 GB); a host's RAM as a 'device' fits too", "64 TiB")
BUCKET_MIN = _limit("bucket_min", 1e6, "B",
                    "each bucket is a collective (PyTorch DDP's default is 25 MB); smaller buckets multiply the ops "
                    "to simulate", "1 MB")
BUCKET_MAX = _limit("bucket_max", 2.0**40, "B", "larger than any model's gradients per GPU", "1 TiB")
TDP_MAX = _limit("tdp_max", 10_000.0, "W", "a GB200 superchip is rated 2,700 W")

# --------------------------------------------------------------------------- models and training (spec.scenario)
NUM_LAYERS = _limit("num_layers", 4096, "layers", "the largest published dense models have about 128 layers")
HIDDEN_SIZE = _limit("hidden_size", 1_048_576, "", "40 times the widest published model (25,600, Megatron 1T)")
NUM_HEADS = _limit("num_attention_heads", 65_536, "heads", "published models use at most a few hundred heads")
FFN_HIDDEN_SIZE = _limit("ffn_hidden_size", 4_194_304, "", "4 x the hidden-size limit")
NUM_EXPERTS = _limit("num_experts", 65_536, "experts", "published MoE models route over at most a few hundred experts "
                     "per layer (DeepSeek-V3: 256)")
SEQ_LENGTH = _limit("seq_length", 16_777_216, "tokens", "16M tokens: beyond the longest published context (10M)")
VOCAB_SIZE = _limit("vocab_size", 16_777_216, "tokens", "64 times the largest published vocabularies (256k)")
GLOBAL_BATCH = _limit("global_batch_size", 16_777_216, "sequences",
                      "1,000 times the largest published batches (Llama 3: 16M tokens = 2,048 sequences)")
PIPELINE_STAGES = _limit("pipeline_stages", 4096, "stages", "a stage holds at least one layer: the layer limit")
MICROBATCHES = _limit("microbatches", 2**40, "micro-batches",
                      "`simdist bubble`'s closed form stays exact in floating point (and 10^12 micro-batches is "
                      "no training step)")
VPP = _limit("vpp", 4096, "chunks per stage", "a chunk holds at least one layer: the layer limit")

# --------------------------------------------------------------------------- work (estimated before running)
STEP_OPS = _limit(
    "step_ops", 2_500_000, "ops",
    "ops the engine simulates for one step (about 10 per simulated rank, micro-batch and model chunk): about "
    "two minutes and 2.5 GB on a 2-core machine today")
PIPELINE_OPS = _limit(
    "pipeline_ops", 100_000, "ops",
    "`simdist bubble` simulates stages x micro-batches x chunks x 2-3 steps at 10^4-10^5 per second; beyond "
    "this uniform pipelines are answered in closed form (exact there) and others refused")
SCHEDULE_GRID_STEPS = _limit(
    "schedule_grid_steps", 50_000, "steps",
    "`simdist schedule` prints every step as a cell of a text grid: 50,000 cells are about 0.5 MB of text")
MESSAGE_MAX = _limit("message_max", 2.0**50, "B", "beyond any GPU's memory", "1 PiB")
SWEEP_POINTS = _limit("sweep_points", 4096, "points",
                      "sizes or micro-batch counts in one sweep (8:8G:x2 is 31)")
PLAN_TRANSFERS = _limit(
    "plan_transfers", 200_000, "transfers",
    "a collective's plan holds one transfer per chunk per step (all-to-all, direct, halving-doubling and the "
    "detailed ring grow as ranks^2): 130,000 transfers take about 4 s to build and longer to simulate")
SWEEP_TRANSFERS = _limit(
    "sweep_transfers", 500_000, "transfer-equivalents",
    "one `simdist collective` sweep of one algorithm: its plans' transfers plus 170 per size (choosing the "
    "algorithm and protocol of a size costs about as much as simulating 170 transfers): about 15 s of CPU")
TREE_PRICING = _limit(
    "tree_pricing", 16_384, "rank-sizes",
    "ranks x sizes of a `simdist collective` sweep that prices the tree algorithm (--algorithm auto or tree): "
    "its closed form walks every rank's hops, about 10 ms per rank and size on a 2-core machine today")
SEARCH_GPUS = _limit(
    "search_gpus", 65_536, "GPUs",
    "`simdist search` and `compare` price each distinct collective group in closed form, at a cost that grows "
    "with its size: 131,072 GPUs take about 30 s")
SEARCH_CANDIDATES = _limit(
    "search_candidates", 250_000, "layouts",
    "layouts `simdist search` enumerates and prunes (the closed form ranks about 5,000 a second)")
COMPARE_CLUSTERS = _limit("compare_clusters", 16, "clusters", "each cluster compared is a whole layout search")
TOP_K = _limit("top_k", 64, "layouts", "each re-simulated layout is a full engine run")
WORKERS = _limit("workers", 256, "processes", "local worker processes of a sweep")
TOKENS = _limit("tokens", 1e18, "tokens", "10^5 times the largest training runs (15T tokens)")
PUE = _limit("pue", 10.0, "", "data centres run at a PUE of 1.1-2")
PRICE = _limit("price", 1e6, "USD per GPU-hour", "GPU-hours rent for a few dollars")
CORRECTION_MIN = _limit("correction_min", 1e-3, "x",
                        "a calibration factor a thousand times below the model does not describe this cluster's "
                        "links or kernels: a unit error, or another machine's measurements")
CORRECTION_MAX = _limit("correction_max", 1e3, "x",
                        "a calibration factor a thousand times above the model does not describe this cluster's "
                        "links or kernels: a unit error, or another machine's measurements")
LINK_FRACTION_MIN = _limit("link_fraction_min", 1e-6, "",
                           "a link at a millionth of its bandwidth carries nothing: it is down (faults.failed_links)")
LINK_FRACTION_MAX = _limit("link_fraction_max", 1.0, "", "a fault slows a link; it cannot make it faster")
MEASURED_TIME_MIN = _limit("measured_time_min", 1e-9, "s",
                           "a nanosecond: no collective or kernel call returns sooner (a time in the wrong unit?)")
MEASURED_TIME_MAX = _limit("measured_time_max", 86_400.0, "s", "a day for one call: a hung run, not a measurement")
STAGE_TIME_MIN = _limit("stage_time_min", 1e-9, "s", "a nanosecond: shorter than any kernel")
STAGE_TIME_MAX = _limit("stage_time_max", 1e9, "s", "about 30 years")
KERNEL_ROWS = _limit(
    "kernel_rows", 4_000, "kernels",
    "measured kernels one `simdist calibrate` or `validate` fits: the fit searches 57 knees x 100 efficiencies over "
    "every GEMM, again for each of its 100 bootstrap resamples (simdist.calibrate.kernel_fit): 4,000 kernels take "
    "about 10 s on a 2-core machine, 38 s without memory kernels (the launch overhead is then fitted per "
    "candidate); `python -m validation.kernels` writes a few hundred")

# --------------------------------------------------------------------------- input files (simdist.files, spec.load)
INPUT_BYTES = _limit("input_bytes", 64 * 2**20, "B",
                     "per input file: scenario, topology and calibration files are kilobytes; nccl-tests logs and "
                     "measurement CSVs megabytes", "64 MiB")
TRACE_BYTES = _limit("trace_bytes", 8 * 2**30, "B",
                     "per profiler trace, its JSON text after decompression: a rank's trace of a few steps is tens "
                     "to hundreds of MB; it is streamed, so this bounds the reading time (about 15 s per GB)", "8 GiB")
TRACE_EVENTS = _limit("trace_events", 20_000_000, "events",
                      "timed kernels, operators and annotations kept from one trace (about 200 bytes each: 4 GB); "
                      "a training step launches thousands to a few hundred thousand")
YAML_BYTES = _limit("yaml_bytes", 4 * 2**20, "B",
                    "per YAML file (parsing takes about a second per MiB); the bundled files are kilobytes", "4 MiB")
YAML_NODES = _limit("yaml_nodes", 100_000, "nodes",
                    "values in a YAML document with its aliases expanded (a billion-laughs file expands to 10^9); "
                    "the bundled files have a few hundred")
YAML_DEPTH = _limit("yaml_depth", 64, "levels", "nesting of a YAML document (the schemas nest 4 deep)")
RESULT_LINE_BYTES = _limit("result_line_bytes", 1_048_576, "B",
                           "one line of a search results file (a result row is about 1 kB)", "1 MiB")


def check_work(amount: float, limit: Limit, *, what: str, field: str | None = None, fix: str,
               source: str | None = None) -> None:
    """Refuse ``amount`` (an estimate of ``what``) above ``limit``: one line with the numbers and the fix."""
    if not math.isfinite(amount) or amount > limit.value:
        shown = f"{amount:,.0f}" if math.isfinite(amount) and amount < 1e15 else f"{amount:.3g}"
        raise LimitError(f"{what} is {shown} {limit.unit}, above the limit of {limit.text()} ({limit.reason})",
                         field=field, source=source, fix=fix)


# Assumption: a simulated rank emits at most about 12 ops per micro-batch and model chunk (forward, backward,
# recompute, their tensor/context-parallel collectives, p2p sends); measured 9-10 on the bundled scenarios
# (simdist run ... num_ops), so the estimate errs high.
OPS_PER_CHUNK_MICROBATCH = 12
# Assumption: an overlapped gradient bucket costs the engine about 10 ordinary ops: every bucket's collective is
# in flight at once on the same data-parallel links (measured: 14,000 bucket ops of GPT-3 175B took 5.5 s, about
# ten times an ordinary op's 45 us).
BUCKET_OP_WEIGHT = 10


def step_ops_estimate(spec: Any, num_gpus: int, *, simulate: str = "auto", num_params: float | None = None,
                      num_microbatches: int | None = None) -> tuple[int, str, int]:
    """(ops the engine would simulate for one step of a ScenarioSpec, how the estimate was made, of which buckets).

    Simulated ranks: one per pipeline stage (per replica too with unequal ``dp_batch_split``), every GPU with
    ``simulate="full"``. ``num_params``: the model's parameters, for overlapped gradient buckets (each bucket
    of the last backward is its own op: fp32 gradients of a chunk / bucket size). ``num_microbatches``: the
    micro-batches the engine will really simulate when the steady state is fast-forwarded
    (simdist.plan.fastforward: a few periods stand for all), else the spec's count.
    """
    p, t = spec.parallel, spec.training
    if t.dp_batch_split is not None:
        microbatches, replicas = max(t.dp_batch_split) // t.micro_batch_size, p.dp
    else:
        microbatches, replicas = t.global_batch_size // (t.micro_batch_size * p.dp), 1
    if num_microbatches is not None:
        microbatches = min(microbatches, num_microbatches)
    ranks = num_gpus if simulate == "full" else p.pp * replicas
    ops = OPS_PER_CHUNK_MICROBATCH * ranks * max(1, microbatches) * p.vpp
    how = (f"{ranks:,} simulated rank(s) x {microbatches:,} micro-batch(es) x {p.vpp} chunk(s) x "
           f"~{OPS_PER_CHUNK_MICROBATCH} ops")
    bucket_ops = 0
    if num_params and t.grad_reduce == "overlapped" and t.grad_bucket_size and p.zero_stage < 2:
        buckets = math.ceil(4.0 * num_params / (p.tp * p.pp * p.vpp) / max(t.grad_bucket_size, BUCKET_MIN.value))
        bucket_ops = BUCKET_OP_WEIGHT * ranks * p.vpp * buckets
        ops += bucket_ops
        how += f" + {ranks * p.vpp * buckets:,} gradient buckets x {BUCKET_OP_WEIGHT}"
    return ops, how, bucket_ops


def check_step_work(spec: Any, num_gpus: int, *, simulate: str = "auto", num_params: float | None = None,
                    num_microbatches: int | None = None, source: str | None = None) -> None:
    """Refuse a step whose simulation would exceed `STEP_OPS`, before anything is built (``num_microbatches``:
    see `step_ops_estimate`)."""
    ops, how, bucket_ops = step_ops_estimate(spec, num_gpus, simulate=simulate, num_params=num_params,
                                             num_microbatches=num_microbatches)
    if 2 * bucket_ops > ops:
        field, fix = "training.grad_bucket_size", "use larger gradient buckets (or none: one per model chunk)"
    else:
        field = "training.global_batch_size"
        fix = "raise training.micro_batch_size or parallel.dp, or lower training.global_batch_size"
        if simulate == "full":
            fix += ", or use --simulate representatives"
    check_work(ops, STEP_OPS, what=f"simulating this step ({how})", field=field, source=source, fix=fix)


def limits_table() -> str:
    """``docs/limits.md``: every limit, its value and its reason (generated; a test keeps it in sync)."""
    lines = ["# Limits", "",
             "Generated by `python -m simdist.limits` from `simdist/limits.py`; an input beyond a limit is refused",
             "with one line naming the numbers and the fix (exit status 2).", "",
             "| limit | value | reason |", "|---|---|---|"]
    lines += [f"| `{lim.name}` | {lim.text()} | {lim.reason} |" for lim in LIMITS.values()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - a generator script
    import sys

    sys.stdout.write(limits_table())
