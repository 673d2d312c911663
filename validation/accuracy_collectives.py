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

import statistics
from collections.abc import Iterable
from functools import cache

from simdist import api
from simdist.collectives.group import Group
from simdist.hardware.presets import load_topology
from validation.collective_points import (
    BANDS,
    PLATEAU_BYTES,
    Dataset,
    Deviation,
    Mapping,
    NotCovered,
    Point,
    Record,
    Report,
    size_label,
)
from validation.ep_datasets import ep_datasets
from validation.nccl_datasets import nccl_datasets


@cache
def datasets() -> tuple[tuple[Dataset, ...], tuple[NotCovered, ...]]:
    """Every dataset of the report (validation.nccl_datasets, validation.ep_datasets) and what is left unpredicted."""
    nccl, skipped = nccl_datasets()
    return (*nccl, *ep_datasets()), tuple(skipped)


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
        f"per fabric) are predicted at {size_label(PLATEAU_BYTES)}. MAPE = mean |error|, in %.",
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
    from validation.harness_cli import report_main

    return report_main("python -m validation.accuracy_collectives", __doc__.splitlines()[0], render, argv)


if __name__ == "__main__":
    from validation.harness_cli import cli_guard

    raise SystemExit(cli_guard(main))
