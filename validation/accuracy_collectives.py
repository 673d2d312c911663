"""Predicted vs measured NCCL collectives: the accuracy report of simdist's collective model.

    python -m validation.accuracy_collectives [--out docs/accuracy-collectives.md]

Every usable measured point of the reference tables in validation/reference/ (published tables copied
unchanged, source columns kept) becomes a `Measurement` and is predicted with
`simdist.api.collective` on the preset, rank count, node count, overrides and algorithm that its dataset
in `datasets()` states, each with the reason. `records()` returns one `Record` (dataset, measurement,
prediction) per point, which tests/test_accuracy_collectives.py reuses; `render()` writes the markdown
report, docs/accuracy-collectives.md, which a test keeps equal to this script's output.

Sizes and bandwidths follow nccl-tests (doc/PERFORMANCE.md; simdist.collectives.ops): busbw = algbw x
2(n-1)/n for all_reduce, x (n-1)/n for all_gather, reduce_scatter and all_to_all, with the size the full
buffer. The error of a point is predicted busbw / measured busbw - 1, which is also measured time /
predicted time - 1. Where a source gives only busbw (plateau bars, torch sweeps), the measured time is
size x factor / busbw; where it gives only a time (CS336), busbw is computed from it.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from simdist import api
from simdist.calibrate.measurements import Measurement
from simdist.collectives.group import Group
from simdist.collectives.ops import busbw_Bps, op_info
from simdist.hardware.presets import load_topology
from simdist.plan.moe_cost import expected_destination_ranks

REFERENCE = Path(__file__).resolve().parent / "reference"
REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "docs" / "accuracy-collectives.md"

MiB = 2**20
GiB = 2**30
PLATEAU_BYTES = 8 * GiB
"""Size at which a plateau bar (a slide's single busbw per fabric) is predicted: nccl-tests sweeps of
the slides end at 8-16 GiB, where every modelled algorithm is within 1 % of its asymptote."""

BANDS: tuple[tuple[str, float, float], ...] = (
    (">= 256 MiB", 256 * MiB, float("inf")),
    ("1 MiB - 256 MiB", 1 * MiB, 256 * MiB),
    ("< 1 MiB", 0.0, 1 * MiB),
)
"""Size bands of the report; the requirement is |error| <= 15 % from 256 MiB and <= 30 % from 1 MiB."""
TOLERANCE = ((256 * MiB, 0.15), (1 * MiB, 0.30))


@dataclass(frozen=True, slots=True)
class Mapping:
    """How a measured point is predicted: ``api.collective(cluster, op, num_ranks, ...)``."""

    cluster: str
    num_ranks: int
    num_nodes: int | None = None
    assignments: tuple[str, ...] = ()
    algorithm: str = "auto"
    fidelity: str = "auto"
    kernel: str = "nccl"
    """What runs an all_to_all (simdist.collectives.ep_kernels): nccl, or MoE dispatch's deepep / hybridep."""

    def describe(self) -> str:
        parts = [f"`{self.cluster}`", f"{self.num_ranks} ranks"]
        if self.num_nodes:
            parts.append(f"{self.num_nodes} nodes")
        parts += [f"`{a}`" for a in self.assignments]
        parts.append(f"algorithm {self.algorithm}")
        if self.kernel != "nccl":
            parts.append(f"kernel {self.kernel}")
        return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Point:
    measurement: Measurement
    mapping: Mapping
    label: str


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    title: str
    reference: str
    harness: str
    """How the numbers were measured (tool, timing), from the source."""
    mapping: str
    """Which preset, ranks, nodes, overrides and algorithm, and why."""
    points: tuple[Point, ...]
    host_overhead_s: tuple[float, float] | None = None
    """The harness's own per-call host overhead range, where its source states one (reported only)."""
    forced: tuple[str, str] | None = None
    """(algorithm, protocol) to report alongside, where the source suggests the run used it (reported only)."""


@dataclass(frozen=True, slots=True)
class Record:
    """One measured point and simdist's prediction of it."""

    dataset: str
    measurement: Measurement
    prediction: api.CollectiveRow
    mapping: Mapping
    label: str

    @property
    def measured_busbw_GBps(self) -> float:
        return self.measurement.busbw_Bps / 1e9

    @property
    def error(self) -> float:
        """predicted busbw / measured busbw - 1 (= measured time / predicted time - 1)."""
        return self.prediction.busbw_GBps / self.measured_busbw_GBps - 1.0

    @property
    def tolerance(self) -> float | None:
        """The requirement for this size (None: below 1 MiB, reported only)."""
        return next((tol for lo, tol in TOLERANCE if self.measurement.nbytes >= lo), None)

    @property
    def band(self) -> str:
        return next(name for name, lo, hi in BANDS if lo <= self.measurement.nbytes < hi)


@dataclass(frozen=True, slots=True)
class NotCovered:
    what: str
    reason: str


@dataclass(frozen=True, slots=True)
class Deviation:
    """Points of a dataset that miss the requirement, why, and what the model achieves on them instead."""

    reason: str
    points: frozenset[str]
    """Labels of the points outside the requirement."""
    bound: float
    """|error| the model stays within on those points (the tests assert it)."""


@dataclass(frozen=True, slots=True)
class Report:
    datasets: tuple[Dataset, ...]
    records: tuple[Record, ...]
    not_covered: tuple[NotCovered, ...] = field(default_factory=tuple)


# --------------------------------------------------------------------------- reading the references
def _rows(name: str) -> list[dict[str, str]]:
    with (REFERENCE / name).open(encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def _size_label(nbytes: float) -> str:
    for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{int(nbytes // scale)}{unit}"
    return f"{nbytes:.0f}B"


def _measurement(op: str, nbytes: int, ranks: int, *, source: str, label: str, busbw_GBps: float | None = None,
                 time_s: float | None = None, nodes: int | None = None, algorithm: str | None = None,
                 version: str | None = None) -> Measurement:
    """A Measurement from a busbw (time derived) or a time (busbw derived), nccl-tests conventions."""
    factor = op_info(op).busbw_factor(ranks)
    if time_s is None:
        assert busbw_GBps is not None
        time_s = nbytes * factor / (busbw_GBps * 1e9)
    busbw = busbw_GBps * 1e9 if busbw_GBps is not None else busbw_Bps(op, ranks, nbytes, time_s)
    return Measurement(op=op, nbytes=nbytes, num_ranks=ranks, time_s=time_s, algbw_Bps=busbw / factor,
                       busbw_Bps=busbw, source=source, algorithm=algorithm, num_nodes=nodes, label=label,
                       nccl_version=version or None)


# --------------------------------------------------------------------------- datasets
MLE = "nccl_collectives_ml_engineering.csv"
GTC = "nccl_busbw_nvidia_gtc_slides.csv"
CS336 = "cs336_lecture_collective_benchmarks.csv"
REPORTS = "nccl_user_reports_issues.csv"

# ml-engineering rows: "(NCCL default)" -> the tuner's choice (auto); "NVLS" -> nvls; "Ring ..." -> ring.
_MLE_ALGORITHM = {"NVLS": "nvls", "Ring": "ring", "Ring (NCCL_NVLS_ENABLE=0)": "ring"}

EFA = ("inter_node.kind=roce", "inter_node.fabric=fat_tree")
"""AWS p6-b200: 8 EFA v4 adapters of 400 Gb/s per node (the source's system column). EFA is RDMA over
AWS's Ethernet fabric (SRD), so the RoCE link kind (0.96 efficiency: the GTC24 slide's 400 Gb RDMA bar)
is the closest; AWS does not describe its fabric as rail-optimized, hence a non-blocking fat tree."""

TORCH_HOST_OVERHEAD_S = (20e-6, 30e-6)
"""PyTorch's per-call host overhead, "some 20-30us" (stas00/ml-engineering network/benchmarks/
all_reduce_bench.py docstring), inside every call that sweep times from an idle device."""
TORCH_PER_CALL = frozenset({"mle_h200_node_all_reduce_bench", "mle_p6b200_1node", "mle_p6b200_4node"})

MLE_DATASETS: dict[str, tuple[str, Mapping, str, str]] = {
    # name: (title, mapping, harness, why)
    "mle_a100_node_nccltests": (
        "8x A100 SXM (DGX A100 class), nccl-tests all_reduce sweep",
        Mapping("dgx-a100", 8),
        "nccl-tests `all_reduce_perf -b 32k -e 16G -f 2 -g 8 -n 50`: one thread drives all 8 GPUs, time = mean "
        "of 50 back-to-back iterations; NCCL version not stated; the author removed columns and reformatted "
        "sizes (\"massaged\").",
        "8 NVLink3 GPUs on NVSwitch = the `dgx-a100` preset; NCCL's default algorithm = `auto`.",
    ),
    "mle_h200_node_all_reduce_bench": (
        "8x H200 SXM, torch all_reduce_bench.py sweep",
        Mapping("hgx-h200", 8),
        "all_reduce_bench.py (torch 2.9.1, NCCL 2.27.7, one process per GPU): 5 warmups, 20 trials of one "
        "dist.all_reduce timed with CUDA events from an idle device, so every call includes PyTorch's per-call "
        "host overhead (\"some 20-30us\", all_reduce_bench.py docstring); NCCL_DEBUG showed Ring/LL up to 1 MiB, "
        "NVLS/Simple from 2 MiB.",
        "8 NVLink4 GPUs on NVSwitch with NVLS = `hgx-h200`; NCCL's default = `auto`.",
    ),
    "mle_p6b200_1node": (
        "AWS p6-b200, 8x B200 one node, torch all_reduce_bench.py sweep",
        Mapping("dgx-b200", 8),
        "all_reduce_bench.py (torch 2.9.1, NCCL 2.27.7) as above, with AWS's aws-ofi-nccl tuner plugin "
        "choosing the algorithm instead of NCCL's own tuner.",
        "8 NVLink5 GPUs on NVSwitch with NVLS = `dgx-b200`; `auto` (the AWS tuner's choices are not stated).",
    ),
    "mle_p6b200_4node": (
        "AWS p6-b200 x4 (32x B200), 8x EFA 400 Gb/s per node, torch all_reduce_bench.py sweep",
        Mapping("dgx-b200", 32, 4, EFA, fidelity="fast"),
        "all_reduce_bench.py as above over 4 nodes; AWS tuner plugin; the text says Ring on p5en.",
        "`dgx-b200` x 4 nodes with the EFA override (" + ", ".join(f"`{a}`" for a in EFA) + "): EFA is RDMA "
        "over AWS's Ethernet fabric, closest to the RoCE link kind; AWS does not call it rail-optimized, hence a "
        "non-blocking fat tree; 8 x 400 Gb/s as the preset. `auto`.",
    ),
    "mle_h200_nvls_gpucount": (
        "8x H200, NVLS vs ring at 4-8 GPUs, 8 GiB",
        Mapping("hgx-h200", 8),
        "nccl-tests at 8 GiB, with NVLS (NCCL's default) and with NCCL_NVLS_ENABLE=0.",
        "`hgx-h200`, the first n GPUs; the algorithm column states what ran: NVLS -> `nvls`, Ring (either "
        "row) -> `ring`.",
    ),
    "mle_b200_nvls_gpucount": (
        "AWS p6-b200 (8x B200), NVLS vs ring at 4-8 GPUs, 8 GiB",
        Mapping("dgx-b200", 8),
        "nccl-tests at 8 GiB (NCCL 2.27.7), with NVLS (default) and with NCCL_NVLS_ENABLE=0.",
        "`dgx-b200`, the first n GPUs; NVLS -> `nvls`, Ring -> `ring` as stated per row.",
    ),
    "mle_h200_collectives_16GiB": (
        "8x H200, all_reduce / all_gather / reduce_scatter at 16 GiB",
        Mapping("hgx-h200", 8),
        "nccl-tests `-b 16G -e 16G -g 8 -z 1`.",
        "`hgx-h200`; NVLS -> `nvls`, Ring -> `ring` as stated per row.",
    ),
    "mle_h200_ring_vs_sharp_16GiB": (
        "8x H200, ring all_reduce at 16 GiB (torch)",
        Mapping("hgx-h200", 8),
        "all_reduce_bench.py with NCCL_NVLS_ENABLE=0 (NCCL 2.27.7).",
        "`hgx-h200`, `ring` (NVLS disabled).",
    ),
}


def _mle() -> list[Dataset]:
    rows = _rows(MLE)
    out = []
    for name, (title, base, harness, why) in MLE_DATASETS.items():
        points = []
        for r in rows:
            if r["dataset"] != name:
                continue
            ranks, nodes = int(r["gpus"]), int(r["nodes"])
            algorithm = _MLE_ALGORITHM.get(r["algorithm"], "auto")
            mapping = Mapping(base.cluster, ranks, nodes if nodes > 1 else None, base.assignments, algorithm,
                              base.fidelity)
            nbytes = int(float(r["size_bytes"]))
            time_s = float(r["time_us"]) * 1e-6 if r["time_us"] else None
            m = _measurement(r["collective"], nbytes, ranks, source=r["source"], label=name,
                             busbw_GBps=float(r["busbw_GBps"]), time_s=time_s, nodes=nodes,
                             algorithm=None if algorithm == "auto" else algorithm, version=r["nccl_version"])
            label = _size_label(nbytes)
            if name in ("mle_h200_nvls_gpucount", "mle_b200_nvls_gpucount", "mle_h200_collectives_16GiB"):
                label = f"{r['collective']} {ranks} GPUs, {r['algorithm']}, {label}"
            points.append(Point(m, mapping, label))
        host = TORCH_HOST_OVERHEAD_S if name in TORCH_PER_CALL else None
        forced = ("ring", "Simple") if name == "mle_p6b200_4node" else None  # "Ring" per the source's text
        out.append(Dataset(name, title, MLE, harness, why, tuple(points), host, forced))
    return out


# GTC slide bars -> (cluster, ranks, nodes, overrides, algorithm, why). None: not covered, with the reason.
_PCIE_2X4 = ("host.cpu_sockets=1", "host.pcie_switches_per_socket=2")
_ONE_NIC = ("inter_node.nics_per_node=1",)
_GTC_MAP: dict[tuple[str, str, str], tuple[Mapping, str] | str] = {
    ("all_reduce", "intra-node", "PCIe Gen4"): (
        Mapping("pcie-gen4-8gpu", 8, assignments=_PCIE_2X4),
        "PCIe Gen4 preset; 2x4 GPUs under one CPU (the only PCIe layout the slides state, GTC25 slide 13): a "
        "ring crossing a CPU interconnect would be capped by it (xGMI/UPI 16-22 GB/s), below the bar"),
    ("all_reduce", "intra-node", "PCIe Gen5"): (
        Mapping("pcie-gen5-8gpu", 8, assignments=_PCIE_2X4), "PCIe Gen5 preset, 2x4 GPUs as above"),
    ("all_reduce", "intra-node", "PCI Gen 6"): (
        Mapping("pcie-gen5-8gpu", 8, assignments=(*_PCIE_2X4, "host.pcie.generation=6")),
        "no Gen6 preset: the Gen5 box with `host.pcie.generation=6`, 2x4 GPUs as above"),
    ("all_reduce", "intra-node", "NVLink2 (V100)"): "no V100 / NVLink2 preset",
    ("all_reduce", "intra-node", "NVLink3 (A100)"): (Mapping("dgx-a100", 8), "NCCL default on A100 = `auto`"),
    ("all_reduce", "intra-node", "NVLink4 (H100)"): (
        Mapping("dgx-h100", 8, algorithm="ring"), "the slide's non-SHARP NVLink bar: NVLS off, so `ring`"),
    ("all_reduce", "intra-node", "NVLink4 SHARP (H100)"): (Mapping("dgx-h100", 8, algorithm="nvls"), "NVLink SHARP"),
    ("all_reduce", "intra-node", "NVLink5 (B200)"): (
        Mapping("dgx-b200", 8, algorithm="ring"), "non-SHARP NVLink bar: `ring`"),
    ("all_reduce", "intra-node", "NVLink5 SHARP (B200)"): (Mapping("dgx-b200", 8, algorithm="nvls"), "NVLink SHARP"),
    ("all_reduce", "multi-node", "100GbE, TCP/IP sockets"): (
        Mapping("dgx-h100", 32, 4, (*_ONE_NIC, "inter_node.nic_bandwidth=100 Gb/s", "inter_node.kind=ethernet"),
                fidelity="fast"),
        "one 100 GbE NIC per node, kernel TCP (`ethernet`); 4 nodes x 8 GPUs as the GTC25 multi-node bars "
        "(GTC24 states no size; the plateau hardly depends on it); the GPU does not matter behind one NIC"),
    ("all_reduce", "multi-node", "200Gb RDMA (IB/RoCE)"): (
        Mapping("dgx-h100", 32, 4, (*_ONE_NIC, "inter_node.nic_bandwidth=200 Gb/s"), fidelity="fast"),
        "one 200 Gb/s RDMA NIC per node, 4 x 8 GPUs as above"),
    ("all_reduce", "multi-node", "400Gb RDMA (IB/RoCE)"): (
        Mapping("dgx-h100", 32, 4, _ONE_NIC, fidelity="fast"), "one 400 Gb/s RDMA NIC per node, 4 x 8 GPUs"),
    ("all_reduce", "multi-node", "2x200Gb RDMA (IB/RoCE)"): (
        Mapping("dgx-h100", 32, 4, ("inter_node.nics_per_node=2", "inter_node.nic_bandwidth=200 Gb/s"),
                fidelity="fast"),
        "two 200 Gb/s NICs per node, 32 GPUs as the slide states"),
    ("all_reduce", "multi-node", "NVL3 + 8x 200Gb RDMA (DGX A100)"): (
        Mapping("dgx-a100", 32, 4, fidelity="fast"), "4 DGX A100 (32 GPUs), `auto`"),
    ("all_reduce", "multi-node", "NVL4 + 8x 400Gb RDMA (DGX H100)"): (
        Mapping("dgx-h100", 32, 4, fidelity="fast"),
        "4 DGX H100 (32 GPUs), `auto` (NCCL runs NVLS across nodes only with IB SHARP, the other bar)"),
    ("all_reduce", "multi-node", "SHARP 8x 400Gb RDMA (DGX H100)"): (
        Mapping("dgx-h100", 32, 4, ("inter_node.sharp=true",), fidelity="fast"),
        "4 DGX H100 (32 GPUs) whose InfiniBand switches reduce (`inter_node.sharp=true`), `auto`: NCCL's NVLS across "
        "nodes (`nvls_sharp`: NVLS in each node, SHARP between them), which NCCL enables only with CollNet/SHARP"),
    ("all_reduce", "multi-node", "NVLink (GB200 NVL72)"): (
        Mapping("gb200-nvl72", 32, algorithm="ring", fidelity="fast"),
        "32 GPUs of one NVL72 NVLink domain; the non-SHARP bar: `ring`"),
    ("all_reduce", "multi-node", "NVLink5 SHARP (GB200 NVL72)"): (
        Mapping("gb200-nvl72", 32, algorithm="nvls"), "32 GPUs of one NVL72 domain, NVLink SHARP"),
    ("alltoall", "intra-node", "PCI Gen5, 2x4 GPUs"): (
        Mapping("pcie-gen5-8gpu", 8, assignments=_PCIE_2X4), "PCIe Gen5 preset with the stated 2x4 GPUs"),
    ("alltoall", "intra-node", "PCI Gen6, 2x4 GPUs"): (
        Mapping("pcie-gen5-8gpu", 8, assignments=(*_PCIE_2X4, "host.pcie.generation=6")),
        "the Gen5 box with `host.pcie.generation=6`, 2x4 GPUs"),
    ("alltoall", "intra-node", "NVLink3 (A100)"): (Mapping("dgx-a100", 8), "`dgx-a100`"),
    ("alltoall", "intra-node", "NVLink4 (H100)"): (Mapping("dgx-h100", 8), "`dgx-h100`"),
    ("alltoall", "intra-node", "NVLink5 (B200)"): (Mapping("dgx-b200", 8), "`dgx-b200`"),
    ("alltoall", "multi-node", "2x 200Gb RDMA (IB/RoCE)"): (
        Mapping("dgx-h100", 32, 4, ("inter_node.nics_per_node=2", "inter_node.nic_bandwidth=200 Gb/s"),
                fidelity="fast"), "two 200 Gb/s NICs per node, 32 GPUs"),
    ("alltoall", "multi-node", "2x 400Gb RDMA (IB/RoCE)"): (
        Mapping("dgx-h100", 32, 4, ("inter_node.nics_per_node=2",), fidelity="fast"),
        "two 400 Gb/s NICs per node, 32 GPUs"),
    ("alltoall", "multi-node", "8x 200Gb RDMA (DGX A100)"): (
        Mapping("dgx-a100", 32, 4, fidelity="fast"), "4 DGX A100"),
    ("alltoall", "multi-node", "8x 400Gb RDMA (DGX H100)"): (
        Mapping("dgx-h100", 32, 4, fidelity="fast"), "4 DGX H100"),
    ("alltoall", "multi-node", "NVLink5 (GB200 NVL72)"): (
        Mapping("gb200-nvl72", 32, fidelity="fast"), "32 GPUs of one NVL72 domain"),
}


def _gtc() -> tuple[list[Dataset], list[NotCovered]]:
    groups: dict[str, list[Point]] = {}
    why: dict[str, list[str]] = {}
    skipped = []
    for r in _rows(GTC):
        key = (r["collective"], r["scope"], r["interconnect"])
        target = _GTC_MAP[key]
        label = f"{r['talk']} {r['interconnect']}"
        if isinstance(target, str):
            skipped.append(NotCovered(f"{GTC}: {label} ({r['collective']})", target))
            continue
        mapping, reason = target
        op = "all_to_all" if r["collective"] == "alltoall" else r["collective"]
        name = f"gtc_{'alltoall' if op == 'all_to_all' else 'allreduce'}_plateaus"
        m = _measurement(op, PLATEAU_BYTES, mapping.num_ranks, source=r["source"], label=label,
                         busbw_GBps=float(r["busbw_GBps"]), nodes=mapping.num_nodes,
                         algorithm=None if mapping.algorithm == "auto" else mapping.algorithm)
        groups.setdefault(name, []).append(Point(m, mapping, label))
        line = f"{r['interconnect']}: {mapping.describe()} - {reason}"
        if line not in why.setdefault(name, []):
            why[name].append(line)
    harness = ("NVIDIA GTC24 S62129 / GTC25 S72583 slide bars (nccl-tests bus bandwidth, read off the images; "
               "plateau values, size not stated), GTC25: 8 GPUs intra-node, 32 GPUs multi-node.")
    titles = {"gtc_allreduce_plateaus": "NVIDIA GTC24/25 all_reduce busbw plateaus per fabric",
              "gtc_alltoall_plateaus": "NVIDIA GTC25 all_to_all busbw plateaus per fabric"}
    datasets = [Dataset(name, titles[name], GTC, harness,
                        f"Each bar at {_size_label(PLATEAU_BYTES)}:\n" + "\n".join(f"- {w}" for w in why[name]),
                        tuple(points)) for name, points in groups.items()]
    return datasets, skipped


def _cs336() -> Dataset:
    rows = _rows(CS336)
    runs: dict[tuple[str, str, int], list[dict[str, str]]] = {}
    for r in rows:
        runs.setdefault((r["run"], r["op"], int(r["world_size"])), []).append(r)
    points = []
    for (run, op_text, ranks), rs in runs.items():
        op = "reduce_scatter" if op_text.startswith("reduce_scatter") else op_text
        per_rank_bytes = int(rs[0]["tensor_bytes_output"])
        # nccl-tests size: all_reduce = the buffer; reduce_scatter = the full input (ranks x the output)
        nbytes = per_rank_bytes * (ranks if op == "reduce_scatter" else 1)
        durations = []
        for r in rs:
            text = r["duration_ms"]
            lo, _, hi = text.partition("-")
            durations.append((float(lo) + float(hi or lo)) / 2)  # "12-13" (rounded to ms): the midpoint
        time_s = statistics.mean(durations) * 1e-3  # the ranks' own timings of the same call
        m = _measurement(op, nbytes, ranks, source=rs[0]["source"], label=f"{run} {op_text} ws={ranks}",
                         time_s=time_s, nodes=1)
        points.append(Point(m, Mapping("dgx-h100", ranks), f"{run}: {op} {ranks} GPUs, {_size_label(nbytes)}"))
    return Dataset(
        "cs336_lecture", "Stanford CS336 lecture benchmark (H100 SXM node, 2-4 GPUs)", CS336,
        "torch.distributed, one timed call after one warm-up; time.time() around the call, "
        "torch.cuda.synchronize() and a barrier, so host overheads and the barrier are in the time; 2024 runs "
        "print milliseconds rounded to 1 ms (\"12-13\": the midpoint). Per-rank durations are averaged. The "
        "lecture's own GiB/s formula differs from nccl-tests, so the times are compared (the table's busbw is "
        "computed from them by nccl-tests' formula).",
        "4 (or 2) GPUs of an 8-GPU NV18 H100 node = the first ranks of `dgx-h100`; `auto`. reduce_scatter_tensor "
        "with an output of N floats per rank has the nccl-tests size ranks x N x 4 bytes.",
        tuple(points))


H20_AS_H100 = "dgx-h100"
"""No H20 preset: an H20 node is a DGX H100 for collectives (the same 900 GB/s NVLink 4 on NVSwitch gen3 with NVLS,
NVIDIA's H20 product brief; NCCL prices both as Hopper), and NVIDIA/nccl#1244's 16 CX7 NDR NICs over 2 nodes are the
preset's 8 x 400 Gb/s per node. The H20's lower compute does not enter a collective's time."""


def _nvls_tree_floor() -> Dataset:
    """NVIDIA/nccl#1244: 2 nodes x 8 H20, NCCL 2.21.5, NCCL_ALGO=NVLSTree, out-of-place times at 4, 64 and 512 B."""
    (row,) = [r for r in _rows(REPORTS) if r["thread"] == "NVIDIA/nccl#1244"]
    points = []
    for nbytes, time_us in ((4, 47.54), (64, 46.30), (512, 46.58)):  # the row's reported_numbers
        label = f"16x H20 NVLSTree {nbytes}B"
        m = _measurement("all_reduce", nbytes, 16, source=row["source_url"], label=label, time_s=time_us * 1e-6,
                         nodes=2, algorithm="nvls_tree", version="2.21.5")
        points.append(Point(m, Mapping(H20_AS_H100, 16, 2, algorithm="nvls_tree"), label))
    return Dataset(
        "nccl_issue_1244_nvls_tree_floor", "NVIDIA/nccl#1244: NVLSTree latency floor, 2 nodes x 8 H20", REPORTS,
        "nccl-tests all_reduce_perf (user report, excerpt): NCCL 2.21.5 with NCCL_ALGO=NVLSTree, 2 nodes x 8 H20, 16 "
        "CX7 NDR NICs; out-of-place time per all-reduce, ~46-48 us from 4 B to 512 B.",
        f"`{H20_AS_H100}` (no H20 preset: the H20's NVLink 4 and NVSwitch are the H100's, the "
        "NICs 8 x 400 Gb/s per node as the preset), 16 ranks on 2 nodes, `nvls_tree` as the run forced. Below 1 MiB: "
        "reported only. It checks the latency of NCCL's NVLSTree model (tuning.cc: 25 us + 2 log2(nNodes) x 20.9 us "
        "= 66.8 us at 2 nodes), which simdist pays with its wire latencies: the measured floor lies ~20 us below "
        "NCCL's own model, and the constants are kept as NCCL states them, not fitted to it.",
        tuple(points))


def _reports() -> Dataset:
    points = []
    for r in _rows(REPORTS):
        if r["thread"] != "NVIDIA/nccl-tests#212":
            continue
        for algorithm, busbw in (("ring", 370.0), ("nvls", 480.0)):
            label = f"8x H100 {algorithm} (maintainer: ~{busbw:.0f} GB/s)"
            m = _measurement("all_reduce", PLATEAU_BYTES, 8, source=r["source_url"], label=label, busbw_GBps=busbw,
                             nodes=1, algorithm=algorithm)
            points.append(Point(m, Mapping("dgx-h100", 8, algorithm=algorithm), label))
    return Dataset(
        "nccl_maintainer_h100", "NCCL maintainer statement: H100 ring ~370, NVLS ~480 GB/s busbw", REPORTS,
        "sjeaugey (NVIDIA), NVIDIA/nccl-tests#212: ~370 GB/s busbw with NCCL_ALGO=RING, NVLS peak ~480 GB/s on "
        f"8 GPUs at large sizes (predicted at {_size_label(PLATEAU_BYTES)}).",
        "`dgx-h100`, 8 ranks, `ring` and `nvls`.", tuple(points))


NOT_COVERED_FIXED: tuple[NotCovered, ...] = (
    NotCovered(f"{MLE}: mle_h100_32rank_example",
               "32 H100 ranks over 4 nodes whose inter-node fabric the source does not state ('use only "
               "qualitatively'): no mapping to a fabric can be justified"),
    NotCovered(f"{MLE}: mle_mi300x_p2p_effect", "AMD MI300X with RCCL: out of scope (no AMD presets)"),
    NotCovered(f"{REPORTS}: other rows",
               "consumer PCIe cards without presets (RTX 2080Ti/4090/5090, DGX Spark), a partially NVLinked "
               "A100 box, an H800 (no preset), vague figures (A100 '~200 GB/s'), latency floors below 1 MiB "
               "other than NVIDIA/nccl#1244's NVLSTree floor (predicted above) and nvbandwidth p2p: informative, "
               "not predicted"),
)


EP_KERNELS_DATA = "simdist/collectives/data/ep_dispatch_kernels.csv"
HYBRIDEP_SOURCE = "github.com/deepseek-ai/DeepEP docs/README_Hybrid-EP.md @ 41cad94449628adfb1cd1cadd82aeda83d4fbf0f"


def _hybridep() -> Dataset:
    """HybridEP's own benchmark (github.com/deepseek-ai/DeepEP docs/README_Hybrid-EP.md), Torch-API rows at the SM
    count simdist prices by default (GB200: 32; B200: 16, the only one published): each rank dispatches 4096 tokens of
    hidden 7168 in BF16, top-8 of 8 experts per rank drawn uniformly, so it receives (and in the combine sends) the
    tokens of every rank that chose one of its experts, its own included: R = 4096 x E x 7168 x 2 bytes, E = P (1 -
    C(8P - 8, 8) / C(8P, 8)) the expected ranks a token reaches; the rate is R / time. Predicted as simdist's even
    all_to_all of R bytes a rank (each rank sends what it receives, on average) with the hybridep kernel."""
    points = []
    text = (REPO / EP_KERNELS_DATA).read_text(encoding="utf-8")
    for r in csv.DictReader(text.splitlines()):
        if r["library"] != "hybridep" or r["measured"] != "torch_api" or r["nodes"] != "1" or r["num_sms"] != (
                "16" if r["gpu"] == "B200" else "32"):
            continue
        ranks = int(r["ranks"])
        reached = expected_destination_ranks(8 * ranks, 8, ranks)
        nbytes = round(4096 * reached * 7168 * 2)
        for what, rate in (("dispatch BF16", r["dispatch_bf16_GBps"]), ("combine", r["combine_GBps"])):
            label = f"HybridEP {r['gpu']} {ranks} ranks {r['num_sms']} SMs {what}"
            m = _measurement("all_to_all", nbytes, ranks, source=HYBRIDEP_SOURCE, label=label,
                             time_s=nbytes / (float(rate) * 1e9), nodes=1)
            cluster = "dgx-b200" if r["gpu"] == "B200" else "gb200-nvl72"
            points.append(Point(m, Mapping(cluster, ranks, kernel="hybridep"), label))
    return Dataset(
        "hybridep_dispatch_kernels", "HybridEP's dispatch and combine inside an NVLink domain (B200, GB200 NVL72)",
        EP_KERNELS_DATA,
        "the library's own benchmark (github.com/deepseek-ai/DeepEP tests/test_hybrid_ep.py: 4096 tokens per "
        "rank, hidden 7168, top-8, random uniform routing, 8 local experts; 'Torch API' timing, the call as "
        "Megatron-Core makes it); rates read from github.com/deepseek-ai/DeepEP docs/README_Hybrid-EP.md.",
        "`dgx-b200` (8 ranks) and `gb200-nvl72` (8-36 ranks of one rack), `--kernel hybridep`: a prior, not a "
        "check: simdist's HybridEP share of NVLink (simdist.collectives.ep_kernels) is these rows' mean, so the "
        "errors show only how the rows scatter about it (ranks, dispatch against combine).",
        tuple(points))


INTERNODE_CLUSTERS = {"H100": "dgx-h100"}
"""The preset each inter-node benchmark platform is priced on. # Assumption: the README's H100 nodes are DGX H100s
(8 GPUs on NVSwitch, a 400 Gb/s NIC each); it states the GPU only."""
BENCH_TOKENS, BENCH_HIDDEN, BENCH_TOPK, BENCH_LOCAL_EXPERTS = 4096, 7168, 8, 8
"""HybridEP's benchmark (github.com/deepseek-ai/DeepEP tests/test_hybrid_ep.py at the README's commit): tokens per
rank, hidden, top-k, local experts per rank."""


def _internode_rows() -> list[dict[str, str]]:
    text = (REPO / EP_KERNELS_DATA).read_text(encoding="utf-8")
    return [r for r in csv.DictReader(text.splitlines()) if r["nodes"] != "1" and r["measured"] == "torch_api"]


def _internode_case(r: dict[str, str]) -> tuple[Group, str, float]:
    """(the group, the kernel, the bytes a rank moves) of an inter-node benchmark row: the README's IB bytes, a token
    counted once per node it reaches, its own node included (github.com/deepseek-ai/DeepEP tests/utils.py
    count_rdma_send_from_routing_map), T x (expected distinct nodes of its top-k experts) x hidden x 2 B: the bytes
    simdist's cross-domain flex all_to_all is sized with (simdist.plan.moe_cost.expected_destination_ranks, the
    nodes as its groups)."""
    from simdist.collectives.ep_kernels import ep_kernel_name

    ranks, nodes = int(r["ranks"]), int(r["nodes"])
    reached = expected_destination_ranks(BENCH_LOCAL_EXPERTS * ranks, BENCH_TOPK, nodes)
    group = Group.first(load_topology(INTERNODE_CLUSTERS[r["gpu"]], num_nodes=nodes), ranks)
    return group, ep_kernel_name(r["library"], int(r["num_sms"])), BENCH_TOKENS * reached * BENCH_HIDDEN * 2.0


def internode_shares() -> list[tuple[str, str, int, int, float]]:
    """(library, GPU architecture, nodes, SMs, share) of every inter-node torch_api series of the EP kernels' data:
    simdist's all_to_all time of the benchmark case at share 1 over the published one, dispatch (BF16) and combine
    averaged (simdist.collectives.ep_kernels: the stored `data/ep_internode_shares.csv`, which tests rerun). The time
    is affine in the bytes, t = L + X / s at the share s it is priced with now; two sizes give L and X."""
    from simdist.analytic.select import evaluate
    from simdist.collectives.ep_kernels import ep_kernel_share
    from simdist.collectives.nccl_model import gpu_arch
    from simdist.collectives.request import Request

    out = []
    for r in _internode_rows():
        group, kernel, nbytes = _internode_case(r)
        now = ep_kernel_share(kernel, group)
        t1, t2 = (evaluate(Request("all_to_all", group, b, kernel=kernel), "direct", "Simple").predicted_s
                  for b in (nbytes, 2 * nbytes))
        latency, unshared = 2 * t1 - t2, now * (t2 - t1)
        shares = [unshared / (nbytes / (float(r[c]) * 1e9) - latency) for c in ("dispatch_bf16_GBps", "combine_GBps")]
        out.append((r["library"], gpu_arch(group.topology.gpu.name), int(r["nodes"]), int(r["num_sms"]),
                    round(statistics.fmean(shares), 3)))
    return out


def _hybridep_internode() -> Dataset:
    """HybridEP's inter-node rows (H100, 2-8 nodes) at the most SMs published (16), as Megatron-Core calls it."""
    points = []
    for r in _internode_rows():
        if r["library"] != "hybridep" or r["num_sms"] != "16":
            continue
        _, kernel, nbytes = _internode_case(r)
        ranks, nodes = int(r["ranks"]), int(r["nodes"])
        for what, rate in (("dispatch BF16", r["dispatch_bf16_GBps"]), ("combine", r["combine_GBps"])):
            label = f"HybridEP {r['gpu']} {ranks} ranks on {nodes} nodes {r['num_sms']} SMs {what}"
            m = _measurement("all_to_all", round(nbytes), ranks, source=HYBRIDEP_SOURCE, label=label,
                             time_s=nbytes / (float(rate) * 1e9), nodes=nodes)
            points.append(Point(m, Mapping(INTERNODE_CLUSTERS[r["gpu"]], ranks, num_nodes=nodes, kernel=kernel),
                                label))
    return Dataset(
        "hybridep_internode_kernels", "HybridEP's dispatch and combine across nodes (H100, 2-8 nodes of 8 GPUs)",
        EP_KERNELS_DATA,
        "the library's own benchmark (github.com/deepseek-ai/DeepEP tests/test_hybrid_ep.py: 4096 tokens per rank, "
        "hidden 7168, top-8, random uniform routing, 8 local experts; 'Torch API' timing; its 'IB bandwidth' counts "
        "a token once per node it reaches, its own node included, the bytes predicted here); rates read from "
        "github.com/deepseek-ai/DeepEP docs/README_Hybrid-EP.md, 'H100 Platform'.",
        "`dgx-h100` on 2, 4 and 8 nodes, `--kernel hybridep:16`: a prior, not a check: simdist's share of its own "
        "all_to_all rate across nodes (simdist.collectives.ep_kernels.internode_share) is derived from these rows, so "
        "the errors show only how dispatch and combine scatter about it.",
        tuple(points))


@cache
def datasets() -> tuple[tuple[Dataset, ...], tuple[NotCovered, ...]]:
    gtc, skipped = _gtc()
    return ((*_mle(), *gtc, _cs336(), _reports(), _nvls_tree_floor(), _hybridep(), _hybridep_internode()),
            (*skipped, *NOT_COVERED_FIXED))


KNOWN_DEVIATIONS: dict[str, Deviation] = {
    "mle_a100_node_nccltests": Deviation(
        "the measured curve carries a fixed cost that no modelled mechanism gives: 101 us flat from 1 to 4 MiB, "
        "and 150-420 us above a 235 GB/s line from 16 MiB to 512 MiB (least squares over 32 MiB-4 GiB: 268 us + "
        "size / 235.7 GB/s busbw). NCCL's own cost model (src/graph/tuning.cc: Ring LL128 14 + 14 x 1.9 = 40.6 us "
        "and Simple 8.4 + 14 x 3.4 = 56 us, LL 6.6 + 14 x 0.6 = 15 us, at NCCL's 12 x 20 GB/s NVLink3 figure) gives "
        "36, 57 and 74 us at 1, 2 and 4 MiB and 174 us at 16 MiB, close to simdist's, so the gap lies outside "
        "NCCL's model too. Possible causes, none stated for this "
        "run: nccl-tests -g 8 launching all 8 GPUs from one thread (the 44 us floor at 32 KiB), an older NCCL "
        "(version not stated), the author's reformatting (\"massaged\"). From 512 MiB within 2.3 %.",
        frozenset({"1MiB", "2MiB", "4MiB", "16MiB", "32MiB", "256MiB"}), 1.85),
    "mle_h200_node_all_reduce_bench": Deviation(
        "harness: every timed call includes PyTorch's per-call host overhead (20-30 us, the script's docstring), "
        "visible as the flat ~39 us from 32 KiB to 512 KiB where NCCL's own model gives ~15 us. simdist predicts "
        "the collective alone; with 20-30 us added both points are within the requirement (line below the table).",
        frozenset({"1MiB", "2MiB"}), 0.65),
    "mle_p6b200_1node": Deviation(
        "harness (PyTorch's 20-30 us per call, the flat ~48 us floor up to 1 MiB) and AWS's aws-ofi-nccl tuner "
        "plugin choosing algorithm and protocol instead of NCCL's tuner (per size not stated; the step from 741 to "
        "839 GB/s between 4 and 8 GiB is it switching to NVLS). With 20-30 us added, 4 and 8 MiB remain 25-60 % "
        "fast: the plugin's mid-size choices are not known.",
        frozenset({"1MiB", "2MiB", "4MiB", "8MiB", "16MiB", "32MiB", "64MiB"}), 1.40),
    "mle_p6b200_4node": Deviation(
        "not modelled: the AWS tuner plugin (the text says Ring), EFA's per-message latency (SRD over AWS's "
        "Ethernet fabric; the RoCE link latency is used) and PyTorch's host overhead. The measured ~360-390 us "
        "from 256 KiB to 2 MiB matches NCCL's own Ring/Simple latency for 32 ranks on 4 nodes (tuning.cc: 8.4 + "
        "54 x 3.4 + 8 x 14 = 304 us, x 1.4 'plateau effect of ring' = 426 us), what a tuner keeping Ring/Simple "
        "gets; simdist's NCCL-like tuner takes Ring/LL and Ring/LL128 there (ring/Simple forced: line below "
        "the table). Below 256 KiB the "
        "times (6.3 ms at 32 KiB) include first-call connection setup. From 512 MiB within 5.5 %.",
        frozenset({"1MiB", "2MiB", "4MiB", "8MiB", "16MiB", "32MiB", "64MiB", "128MiB", "256MiB"}), 3.40),
    "gtc_alltoall_plateaus": Deviation(
        "PCIe 2x4: the bars are about half of what the two 4-GPU "
        "switches' x16 uplinks carry; the path between the groups is not stated. Two NICs per node: 29 % above "
        "(the eight GPUs' traffic funnels through two NICs in the model; not analysed further).",
        frozenset({"GTC25 PCI Gen5, 2x4 GPUs", "GTC25 PCI Gen6, 2x4 GPUs",
                   "GTC25 2x 200Gb RDMA (IB/RoCE)", "GTC25 2x 400Gb RDMA (IB/RoCE)"}), 0.80),
    "cs336_lecture": Deviation(
        "harness: one call after one warm-up, timed on the host with time.time() around the call, "
        "torch.cuda.synchronize() and dist.barrier() (itself an all_reduce), so host costs and the barrier are "
        "inside a single sample; 2024 times are rounded to 1 ms. The 4-GPU 4-16 GiB runs, where these costs are "
        "diluted, agree within 3 %; the 2-GPU 8 GiB reduce_scatter (15 ms printed, 11.7 ms predicted) is not "
        "explained.",
        frozenset({"2025 lecture_08: all_reduce 4 GPUs, 400MiB", "2025 lecture_08: reduce_scatter 4 GPUs, 1600MiB",
                   "2024 lecture_08: reduce_scatter 2 GPUs, 8GiB"}), 0.30),
}
"""Points that miss the requirement, per dataset, with the reason; tests assert |error| <= bound for them
(and that they still miss it, so that this list shrinks when the model improves)."""


# --------------------------------------------------------------------------- predicting
def _predict(points: Iterable[Point]) -> list[api.CollectiveRow]:
    """Predictions in point order; one api.collective call per distinct mapping and op."""
    points = list(points)
    groups: dict[tuple[Mapping, str], list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault((p.mapping, p.measurement.op), []).append(i)
    out: list[api.CollectiveRow | None] = [None] * len(points)
    for (mp, op), idx in groups.items():
        sizes = [float(points[i].measurement.nbytes) for i in idx]
        rows = api.collective(mp.cluster, op, mp.num_ranks, sizes, algorithm=mp.algorithm, num_nodes=mp.num_nodes,
                              assignments=list(mp.assignments), fidelity=mp.fidelity, kernel=mp.kernel)
        for i, row in zip(idx, rows, strict=True):
            out[i] = row
    return [r for r in out if r is not None]


@cache
def report() -> Report:
    sets, skipped = datasets()
    records = []
    for d in sets:
        for p, row in zip(d.points, _predict(d.points), strict=True):
            records.append(Record(d.name, p.measurement, row, p.mapping, p.label))
    return Report(sets, tuple(records), tuple(skipped))


def records() -> list[Record]:
    """Every measured point with its prediction: (dataset, measurement, prediction, ...)."""
    return list(report().records)


# --------------------------------------------------------------------------- the markdown report
def mape(recs: Iterable[Record]) -> float | None:
    errs = [abs(r.error) for r in recs]
    return 100.0 * statistics.mean(errs) if errs else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _time(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} us" if seconds < 1e-3 else f"{seconds * 1e3:.3f} ms"


def _within(r: Record) -> bool:
    return r.tolerance is None or abs(r.error) <= r.tolerance


def _with_host_overhead(recs: list[Record], overhead_s: float) -> list[float]:
    """Errors of the tested points (>= 1 MiB) if ``overhead_s`` were added to every predicted time."""
    return [r.measurement.time_s / (r.prediction.time_s + overhead_s) - 1.0 for r in recs if r.tolerance is not None]


def _summary_row(name: str, recs: list[Record]) -> str:
    band = [mape(r for r in recs if r.band == b) for b, _, _ in BANDS]
    tested = [r for r in recs if r.tolerance is not None]
    ok = sum(_within(r) for r in tested)
    return f"| {name} | {len(recs)} | {_pct(mape(recs))} | " + " | ".join(map(_pct, band)) + f" | {ok}/{len(tested)} |"


@cache
def _fabric(mapping: Mapping) -> str:
    """What a point's collective crosses: 'NVLink, one node', 'NVLink, one NVL72 rack', 'PCIe, one node', or
    'InfiniBand, 4 nodes' (', SHARP' where the switches reduce; ', 2 NICs a node' where a node has fewer NICs than
    the group has GPUs there)."""
    topology = load_topology(mapping.cluster, num_nodes=mapping.num_nodes, assignments=list(mapping.assignments))
    group = Group.first(topology, mapping.num_ranks)
    if group.num_nodes == 1:
        inside = {"nvlink": "NVLink", "pcie": "PCIe", "net": "network"}[group.path_class(group.path(0, 1))]
        return f"{inside}, one " + ("NVL72 rack" if topology.gpus_per_node > 8 else "node")
    inter = topology.spec.inter_node
    kind = {"infiniband": "InfiniBand", "roce": "RoCE", "ethernet": "Ethernet"}.get(inter.kind, inter.kind)
    per_node = group.size // group.num_nodes
    nics = f", {inter.nics_per_node} NIC{'s' if inter.nics_per_node > 1 else ''} a node" \
        if inter.nics_per_node < per_node else ""
    return f"{kind}{', SHARP' if inter.sharp else ''}, {group.num_nodes} nodes{nics}"


def _by_fabric(records: Iterable[Record]) -> dict[tuple[str, str, str], list[Record]]:
    out: dict[tuple[str, str, str], list[Record]] = {}
    for r in records:
        algorithm = r.prediction.algorithm + ("" if r.mapping.kernel == "nccl" else f" ({r.mapping.kernel})")
        out.setdefault((_fabric(r.mapping), r.measurement.op, algorithm), []).append(r)
    return out


def _fabric_row(fabric: str, op: str, algorithm: str, recs: list[Record]) -> str:
    band = [mape(r for r in recs if r.band == b) for b, _, _ in BANDS]
    tested = [r for r in recs if r.tolerance is not None]
    bias = 100.0 * statistics.mean(r.error for r in recs)
    return (f"| {fabric} | {op} | {algorithm} | {len(recs)} | {_pct(mape(recs))} | {bias:+.1f} | "
            + " | ".join(map(_pct, band)) + f" | {sum(_within(r) for r in tested)}/{len(tested)} |")


def _forced_line(d: Dataset, recs: list[Record]) -> str:
    """Errors of the tested points if the dataset's ``forced`` algorithm/protocol is taken instead of auto."""
    assert d.forced is not None
    algorithm, protocol = d.forced
    tested = [r for r in recs if r.tolerance is not None]
    mp = tested[0].mapping
    rows = api.collective(mp.cluster, tested[0].measurement.op, mp.num_ranks,
                          [float(r.measurement.nbytes) for r in tested], algorithm=algorithm, protocol=protocol,
                          num_nodes=mp.num_nodes, assignments=list(mp.assignments), fidelity=mp.fidelity)
    errs = [row.busbw_GBps / r.measured_busbw_GBps - 1.0 for r, row in zip(tested, rows, strict=True)]
    ok = sum(abs(e) <= r.tolerance for e, r in zip(errs, tested, strict=True))  # type: ignore[operator]
    each = ", ".join(f"{r.label} {100 * e:+.0f}" for r, e in zip(tested, errs, strict=True))
    return (f"Informative, not the tuner's choice: with {algorithm}/{protocol} forced, the points from 1 MiB "
            f"have MAPE {100 * statistics.mean(map(abs, errs)):.1f} %, {ok}/{len(errs)} within ({each} %).")


def render(rep: Report | None = None) -> str:
    rep = rep or report()
    by_set = {d.name: [r for r in rep.records if r.dataset == d.name] for d in rep.datasets}
    lines = [
        "# Accuracy of simdist's collective model against published measurements",
        "",
        "Generated by `python -m validation.accuracy_collectives --out docs/accuracy-collectives.md` "
        "(validation/accuracy_collectives.py); tests/test_accuracy_collectives.py fails when this file differs "
        "from the script's output, so edit the script, not this file.",
        "",
        "## Method",
        "",
        "Every usable measured point of the reference tables in `validation/reference/` (copied unchanged from "
        "the project's shared reference set, source columns kept) is predicted with `simdist.api.collective` on "
        "the preset, ranks, nodes, overrides and algorithm stated per dataset below. `auto` is what NCCL's own "
        "tuner would take: the least predicted time over the algorithms NCCL runs for the op and the three "
        "protocols (`simdist.analytic.select`, `simdist.collectives.nccl_model.NCCL_RUNS`). A row whose source "
        "states what ran (NVLS; Ring with `NCCL_NVLS_ENABLE=0`) is predicted with that algorithm.",
        "",
        "Sizes and bandwidths follow nccl-tests: busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for "
        "all_gather, reduce_scatter and all_to_all, the size being the full buffer. error = predicted busbw / "
        "measured busbw - 1 = measured time / predicted time - 1 (positive: the prediction is faster). Where a "
        "source gives only busbw the measured time is derived from it, and vice versa. Plateau bars (one busbw "
        f"per fabric) are predicted at {_size_label(PLATEAU_BYTES)}. MAPE = mean |error|, in %.",
        "",
        "Requirement: |error| <= 15 % from 256 MiB and <= 30 % from 1 MiB; below 1 MiB errors are reported "
        "only. Points outside it are marked **!**; each dataset with such points states why under *Known "
        "deviation*, and its tests assert the bound the model achieves there instead (and fail once a point "
        "meets the requirement, so that the list shrinks).",
        "",
        "No model constant is fitted to these points. Four priors come from sources that reappear here, so "
        "those points check the mapping rather than the constant: the RDMA NIC efficiency 0.96 is the GTC24 "
        "slide's 400 Gb bar (48 of 50 GB/s), the PCIe presets' P2P efficiency 0.762 is NCCL's PCIe link "
        "model (24 / 48 / 96 GB/s for Gen4/5/6 x16), which the GTC PCIe bars equal, and NCCL's all_to_all "
        "inside an NVLink domain reaches the GTC25 all-to-all / all-reduce bar ratios of its GPU generation "
        "(`simdist.collectives.nccl_model.p2p_nvlink_share`: A100 0.905, H100 0.865, Blackwell 0.928, the mean "
        "of B200 and GB200 NVL72), so the four NVLink all_to_all bars check only how that ratio carries to "
        "simdist's ring; and HybridEP's share of NVLink (simdist.collectives.ep_kernels) is the mean of the "
        "hybridep_dispatch_kernels rows' own rates.",
        "",
        "## Summary",
        "",
        "| dataset | points | MAPE % | >= 256 MiB | 1 MiB - 256 MiB | < 1 MiB | within requirement |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for d in rep.datasets:
        mark = " (known deviation)" if d.name in KNOWN_DEVIATIONS else ""
        lines.append(_summary_row(f"[{d.name}](#{d.name.lower()}){mark}", by_set[d.name]))
    lines.append(_summary_row("**all**", list(rep.records)))
    lines += ["", "Band columns are MAPE % per size band; *within requirement* counts the points from 1 MiB.",
              "", "### By fabric and algorithm", "",
              "The same points grouped by the fabric the collective crosses (the group's links: one NVLink or PCIe "
              "domain, or nodes joined by their NICs, with SHARP where the switches reduce) and the algorithm "
              "simdist priced (auto's choice, or the one the source states), bias = mean signed error (positive: "
              "the prediction is faster).", "",
              "| fabric | op | algorithm | points | MAPE % | bias % | >= 256 MiB | 1 MiB - 256 MiB | < 1 MiB "
              "| within requirement |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (fabric, op, algorithm), recs in sorted(_by_fabric(rep.records).items()):
        lines.append(_fabric_row(fabric, op, algorithm, recs))
    for d in rep.datasets:
        recs = by_set[d.name]
        where = d.reference if "/" in d.reference else f"validation/reference/{d.reference}"
        lines += ["", f"## {d.name}", "", f"**{d.title}** (`{where}`)", "",
                  f"- Measured with: {d.harness}", f"- Predicted with: {d.mapping}"]
        dev = KNOWN_DEVIATIONS.get(d.name)
        if dev is not None:
            lines.append(f"- **Known deviation** ({len(dev.points)} points, |error| <= {100 * dev.bound:.0f} %): "
                         f"{dev.reason}")
        lines += ["", "| point | op | ranks | measured busbw GB/s | predicted busbw GB/s | error % | measured time "
                  "| predicted time | algorithm/protocol |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in recs:
            m, p = r.measurement, r.prediction
            flag = "" if _within(r) else " **!**"
            lines.append(f"| {r.label} | {m.op} | {m.num_ranks} | {r.measured_busbw_GBps:.2f} | {p.busbw_GBps:.2f} "
                         f"| {100 * r.error:+.1f}{flag} | {_time(m.time_s)} | {_time(p.time_s)} | "
                         f"{p.algorithm}/{p.protocol} |")
        lines += ["", f"MAPE {_pct(mape(recs))} %; by band: "
                  + ", ".join(f"{b} {_pct(mape(r for r in recs if r.band == b))}" for b, _, _ in BANDS) + "."]
        if d.host_overhead_s is not None:
            lo, hi = d.host_overhead_s
            parts = []
            for h in (lo, hi):
                errs = _with_host_overhead(recs, h)
                tol = [r.tolerance for r in recs if r.tolerance is not None]
                ok = sum(abs(e) <= t for e, t in zip(errs, tol, strict=True))
                parts.append(f"{h * 1e6:.0f} us: MAPE {100 * statistics.mean(map(abs, errs)):.1f} %, "
                             f"{ok}/{len(errs)} within")
            lines += ["", "Informative, not the model: the points from 1 MiB with the harness's stated host "
                      "overhead added to every predicted time - " + "; ".join(parts) + "."]
        if d.forced is not None:
            lines += ["", _forced_line(d, recs)]
    lines += ["", "## Not covered", "", "| what | why |", "|---|---|"]
    lines += [f"| {n.what} | {n.reason} |" for n in rep.not_covered]
    lines += ["", NOT_MODELLED.strip(), ""]
    return "\n".join(lines)


NOT_MODELLED = """
## What is not modelled, and why the errors are what they are

- **Plateaus (from 256 MiB) are link-bound**, and the link rates are priors with citations: NVLink's
  efficiency is NCCL's per-link figure (A100 20, H100 20.6, B200 40.1 GB/s per link), NVLS applies NCCL's
  nvlsEfficiency (Hopper 0.85, Blackwell 0.74), RDMA NICs 0.96, PCIe P2P NCCL's PCIe model. Hence the
  plateau MAPE of a few %. Rings enter and leave a node next to their NIC (as NCCL's ring search does),
  which matters with one or two NICs per node; the all_reduce rows that still miss are single-call
  timings (cs336_lecture).
- **Host-side time is not part of a simdist collective**: kernel launch and framework overheads (PyTorch's
  20-30 us per call in the torch sweeps, nccl-tests -g 8 launching 8 GPUs from one thread). They set the
  measured floors of 39-48 us below ~2 MiB, where simdist predicts 12-28 us, and are the bulk of the error
  below 1 MiB and at 1-2 MiB. Whether the validation should add a harness term per dataset is left open;
  the torch datasets show what their stated overhead would do.
- **NCCL's latency constants are used as they are** (baseLat once, hwLat per step per path class, NVLS's
  hwLat once): below ~4 MiB the prediction is NCCL's own latency model, and the measurements exceed it.
- **Not modelled from NCCL**: the channel count of its ring graph and the per-channel caps that need it
  (perChMaxRingLL128Bw, perChMaxTreeBw), the tree correction factor (it corrects NCCL's one-line tree model;
  simdist simulates the pipelined tree, so applying it would count the same effect twice), PXN, the
  multi-node ring's 'plateau effect' (x1.4 latency) and per-step network post overhead, and the rules by
  which NCCL keeps NVLS off at 4 (H200) or 4-5 (B200) GPUs: those rows are predicted with what ran.
  CollNetDirect, NVLS across nodes with IB SHARP (`nvls_sharp`), NVLSTree and PAT are modelled; of them
  only the GTC SHARP bar (`nvls_sharp`, chosen by `auto`) and NVIDIA/nccl#1244's NVLSTree latency floor
  are checked here.
- **Tuner plugins and fabrics without a model**: AWS's aws-ofi-nccl tuner choosing algorithms on p6-b200,
  EFA's latency, first-call connection setup.
- **all_to_all** is NCCL's p2p; inside an NVLink domain it is priced at the measured share of the ring's
  bandwidth of its GPU generation (0.87-0.94, the GTC25 bars: a p2p cost of NCCL's, not of the links);
  across nodes at the NICs' rate, as the ring.
- **Mid sizes (1-256 MiB)** therefore carry most of the error: where the harness cost is a small share
  and NCCL's own tuner chose (H200 torch sweep from 4 MiB) the prediction is within 13 %; the A100 sweep's
  mid-size cost is explained neither by a modelled mechanism nor by NCCL's own cost model.
"""


def main(argv: list[str] | None = None) -> int:
    from validation.spawn import HarnessParser

    parser = HarnessParser(prog="python -m validation.accuracy_collectives", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the markdown report here (default: print it)")
    args = parser.parse_args(argv)
    if args.out:
        from simdist.files import check_target

        check_target(args.out, field="--out")  # before the work, not after it
    text = render()
    if args.out:
        from simdist.files import write_text  # atomic, creates the folder, one-line errors

        write_text(args.out, text, field="--out")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    from validation.spawn import cli_guard

    raise SystemExit(cli_guard(main))
