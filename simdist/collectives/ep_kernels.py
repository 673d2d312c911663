"""Expert-parallel dispatch kernels that are not NCCL: DeepEP and HybridEP inside an NVLink domain.

Megatron-Core's flex token dispatcher (``moe_token_dispatcher_type: flex``) moves tokens with DeepEP's or HybridEP's
own kernels (``moe_flex_dispatcher_backend``), not NCCL's all_to_all. simdist prices their dispatch and combine as the
same all_to_all over the expert-parallel group (simdist.plan.moe_cost) at the share of the ring's NVLink rate their
published benchmarks reach (`ep_kernel_share`), in the protocol's rate factor as NCCL's own all_to_all pays its p2p
share (simdist.collectives.nccl_model.p2p_nvlink_share), so both fidelities pay it.

Data: ``data/ep_dispatch_kernels.csv``, the libraries' own benchmark tables (github.com/deepseek-ai/DeepEP
docs/README_Hybrid-EP.md: HybridEP and DeepEP on B200 and GB200, tests/test_hybrid_ep.py; DeepEP's V1 README on H800).
Each row's rate is the bytes a rank receives (dispatch) or sends (combine) over NVLink, its own tokens included, over
the time of the call ("Torch API": the kernel with its metadata preprocessing and launch, as Megatron-Core calls it;
the kernel alone runs 25-40 % faster). simdist's all_to_all of those bytes on P ranks of one NVSwitch domain moves
(P-1)/P of them through each GPU's port at NCCL's NVLink rate B (its per-link figure x links: B200 / GB200 40.1 x 18 =
721.8 GB/s, H800 20.6 x 8 = 164.8), so a row's share is (P-1)/P x rate / B: HybridEP on B200 / GB200 0.56-0.69, DeepEP
on B200 / GB200 0.17-0.78 (it grows with the SMs it is given and falls with the ranks), DeepEP on H800 0.81-0.84.

`ep_kernel_share` averages, per GPU architecture, the dispatch (BF16; FP8 where only that is published) and combine
rates of every published series (GPU, ranks) at the kernel's SM count (``training.moe_flex_dispatcher_num_sms``;
Megatron's `DEFAULT_NUM_SMS` unless given; linear between the published counts, clamped at their ends). A kernel is
named ``deepep`` / ``hybridep`` at the default count, ``deepep:24`` at another (`ep_kernel_name`).
Across NVLink domains (a group on several nodes) the kernels send a token over RDMA once per node it reaches
(simdist.plan.moe_cost sizes that all_to_all) and their published rate is again below what simdist's own all_to_all
of the same bytes reaches: HybridEP's H100 table (README_Hybrid-EP.md, 'H100 Platform', EP 16/32/64 on 2/4/8 nodes of
8 GPUs, 4-16 SMs) counts each token once per node it reaches, its own node included (github.com/deepseek-ai/DeepEP
tests/utils.py count_rdma_send_from_routing_map), the bytes simdist sizes, so a row's share is simdist's time for that
case at share 1 over the published one: 0.71 on 2 nodes, 1.05 on 4, 0.89 on 8 at 16 SMs (`data/ep_internode_shares.csv`,
derived by validation.ep_datasets.internode_shares, which tests/test_ep_kernels.py reruns). `ep_kernel_share`
interpolates it in the SMs (clamped) and then in log2 of the nodes (clamped).
# Assumption: the kernels' rate scales with the bytes moved (dispatch in BF16 as simdist sizes it; FP8 dispatch moves
# fewer bytes at a lower byte rate, not modelled apart); a library without rows on an architecture takes the other
# library's share there (HybridEP on Hopper: DeepEP's H800 rows), then NCCL's p2p share. Across domains only HybridEP
# on Hopper has published rows (its benchmark's nodes taken as DGX H100s: 8 GPUs, a 400 Gb/s NIC each); DeepEP there,
# and both on other architectures, keep 1 (DeepEP's V1 internode table routes each token to at most 4 nodes, a
# routing simdist does not size).
"""

from __future__ import annotations

import csv
from functools import cache
from importlib import resources

import numpy as np

from simdist.collectives.group import Group
from simdist.errors import SpecError

__all__ = ["DEFAULT_NUM_SMS", "EP_KERNELS", "check_kernel_sms", "dispatch_kernel", "ep_kernel_name", "ep_kernel_share",
           "inside_nvlink_domain", "internode_share", "kernel_sms", "parse_kernel"]

EP_KERNELS = ("nccl", "deepep", "hybridep")
"""What moves an expert-parallel all_to_all's tokens: NCCL's all_to_all (the alltoall dispatcher's), or the flex
dispatcher's DeepEP or HybridEP kernels."""

DEFAULT_NUM_SMS = {"deepep": 20, "hybridep": 32}
"""SMs a flex backend's kernels run on as Megatron runs them: DeepEP 20 (Megatron-Core transformer_config.py,
moe_deepep_num_sms: "historical default 20"), HybridEP 32 (Megatron-Bridge perf_recipes/_common.py
_benchmark_common: moe_hybridep_num_sms = 32 for every HybridEP recipe)."""

_ARCH = {"B200": "Blackwell", "GB200": "Blackwell", "H800": "Hopper"}
_NCCL_NVLINK_GBPS = {"B200": 40.1 * 18, "GB200": 40.1 * 18, "H800": 20.6 * 8}
"""NCCL's NVLink rate per GPU of each benchmarked platform: its per-link figure (src/graph/topo.h SM100_NVLINK_BW 40.1,
SM90_NVLINK_BW 20.6) x the GPU's links (B200 / GB200 18, H800 8: NVIDIA's H800 spec, 400 GB/s of NVLink)."""


@cache
def _series() -> dict[tuple[str, str, int], list[tuple[int, float]]]:
    """(library, gpu, ranks) -> [(SMs, share of NCCL's NVLink rate)] of the Torch-API rows, dispatch and combine."""
    text = (resources.files("simdist.collectives") / "data" / "ep_dispatch_kernels.csv").read_text(encoding="utf-8")
    out: dict[tuple[str, str, int], list[tuple[int, float]]] = {}
    for r in csv.DictReader(text.splitlines()):
        if r["measured"] != "torch_api" or r["nodes"] != "1":
            continue
        ranks = int(r["ranks"])
        dispatch = r["dispatch_bf16_GBps"] or r["dispatch_fp8_GBps"]
        for rate in (dispatch, r["combine_GBps"]):
            share = (ranks - 1) / ranks * float(rate) / _NCCL_NVLINK_GBPS[r["gpu"]]
            out.setdefault((r["library"], r["gpu"], ranks), []).append((int(r["num_sms"]), share))
    return out


def dispatch_kernel(dispatcher: str, backend: str, num_sms: int | None) -> str:
    """The kernel a MoE token dispatcher's all_to_alls run on: the flex dispatcher's ``backend`` (`ep_kernel_name`),
    every other dispatcher NCCL's."""
    return ep_kernel_name(backend, num_sms) if dispatcher == "flex" else "nccl"


def ep_kernel_name(library: str, num_sms: int | None = None) -> str:
    """The kernel identifier a collective carries: ``library`` at Megatron's default SM count, ``library:num_sms``
    at another."""
    return library if num_sms is None or num_sms == DEFAULT_NUM_SMS[library] else f"{library}:{num_sms}"


def check_kernel_sms(kernel: str, num_sms: int, gpu_name: str, field: str) -> None:
    """A SpecError naming ``field`` where ``kernel`` names as many SMs as its GPU has (``num_sms``) or more: the
    compute beside its persistent blocks would have none (simdist.plan.step_config.StepConfig.expert_interference).
    Megatron's defaults (`DEFAULT_NUM_SMS`) are not checked: they are the frameworks' own, on every GPU it runs."""
    library, sms = parse_kernel(kernel)
    if sms is not None and sms >= num_sms:
        raise SpecError(f"{library}'s kernels on {sms} SMs ({kernel}), but the {gpu_name} has only {num_sms}: the "
                        "compute beside them would have none", field=field,
                        fix=f"give fewer than {num_sms} SMs (Megatron's defaults: DeepEP {DEFAULT_NUM_SMS['deepep']}, "
                            f"HybridEP {DEFAULT_NUM_SMS['hybridep']})")


def kernel_sms(kernel: str) -> int:
    """SMs a flex kernel identifier's kernels hold (`parse_kernel`; Megatron's `DEFAULT_NUM_SMS` if it names none)."""
    library, sms = parse_kernel(kernel)
    return DEFAULT_NUM_SMS[library] if sms is None else sms


def parse_kernel(kernel: str) -> tuple[str, int | None]:
    """(library, SMs or None) of a kernel identifier (`ep_kernel_name`); a SpecError naming --kernel if malformed."""
    library, _, sms = kernel.partition(":")
    if library not in EP_KERNELS or (sms and (library == "nccl" or not sms.isdigit() or int(sms) < 1)):
        raise SpecError(f"unknown kernel '{kernel}'", field="--kernel",
                        fix=f"use one of: {', '.join(EP_KERNELS)} (deepep and hybridep may name SMs: deepep:24)")
    return library, int(sms) if sms else None


@cache
def _shares(library: str, num_sms: int | None = None) -> dict[str, float]:
    """GPU architecture -> the library's mean share at ``num_sms`` (None: its default; the module docstring)."""
    sms = DEFAULT_NUM_SMS[library] if num_sms is None else num_sms
    by_arch: dict[str, list[float]] = {}
    for (lib, gpu, _), points in _series().items():
        if lib != library:
            continue
        counts = sorted({s for s, _ in points})
        # each SM count's mean of dispatch and combine, then linear in SMs between the published counts
        means = [float(np.mean([v for s, v in points if s == c])) for c in counts]
        by_arch.setdefault(_ARCH[gpu], []).append(float(np.interp(sms, counts, means)))
    return {arch: float(np.mean(v)) for arch, v in by_arch.items()}


@cache
def _internode() -> dict[tuple[str, str], dict[int, list[tuple[int, float]]]]:
    """(library, GPU architecture) -> {nodes: [(SMs, share)]} of ``data/ep_internode_shares.csv``."""
    text = (resources.files("simdist.collectives") / "data" / "ep_internode_shares.csv").read_text(encoding="utf-8")
    out: dict[tuple[str, str], dict[int, list[tuple[int, float]]]] = {}
    for r in csv.DictReader(line for line in text.splitlines() if not line.startswith("#")):
        out.setdefault((r["library"], r["arch"]), {}).setdefault(int(r["nodes"]), []).append(
            (int(r["num_sms"]), float(r["share"])))
    return out


@cache
def internode_share(library: str, arch: str, nodes: int, num_sms: int | None = None) -> float:
    """The share of simdist's all_to_all rate ``library``'s kernels reach across ``nodes`` NVLink domains
    (the module docstring): the published series at ``num_sms`` (default: the library's), clamped, then in log2 of
    the nodes, clamped; 1 without published rows."""
    series = _internode().get((library, arch))
    if not series:
        return 1.0
    sms = DEFAULT_NUM_SMS[library] if num_sms is None else num_sms
    counts = sorted(series)
    at = []
    for n in counts:
        points = sorted(series[n])
        at.append(float(np.interp(sms, [c for c, _ in points], [v for _, v in points])))
    return float(np.interp(np.log2(nodes), np.log2(counts), at))


def inside_nvlink_domain(group: Group) -> bool:
    """Whether ``group``'s peers share one NVLink domain, reached over NVLink only (where an all_to_all kernel's share
    of NVLink applies), kept in the group's memo: asked for by every protocol an all_to_all is priced with."""
    hit = group.memo.get("inside_nvlink_domain")
    if hit is None:
        hit = group.memo["inside_nvlink_domain"] = (group.size >= 2 and group.num_nodes == 1
                                                    and group.path_class(group.path(0, 1)) == "nvlink")
    return hit


def ep_kernel_share(kernel: str, group: Group) -> float:
    """The share of the ring's NVLink rate ``kernel``'s all_to_all reaches on ``group`` inside one NVLink domain; of
    simdist's all_to_all rate across domains (`internode_share`); 1 where neither applies (a group not on NVLink)."""
    from simdist.collectives.nccl_model import gpu_arch, p2p_nvlink_share  # it imports this module

    if kernel == "nccl":
        return p2p_nvlink_share(group)
    arch = gpu_arch(group.topology.gpu.name)
    library, sms = parse_kernel(kernel)
    if group.num_nodes >= 2:
        return internode_share(library, arch, group.num_nodes, sms)
    if not inside_nvlink_domain(group):
        return 1.0
    share = _shares(library, sms).get(arch)
    if share is None:  # no row of this library on the architecture: the other library's, at its default count
        share = next((s for k in DEFAULT_NUM_SMS if k != library
                      if (s := _shares(k).get(arch)) is not None), None)
    return share if share is not None else p2p_nvlink_share(group)
