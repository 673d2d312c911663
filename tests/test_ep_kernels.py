"""The flex dispatcher's DeepEP / HybridEP kernels reach their published share of NVLink
(simdist.collectives.ep_kernels, data: simdist/collectives/data/ep_dispatch_kernels.csv): shares by hand from the
libraries' own tables, a collective's time by hand, both fidelities, and a MoE step that carries the kernel."""

from __future__ import annotations

import math

import pytest

from simdist import api
from simdist.analytic.pricing import CommPricer
from simdist.analytic.select import evaluate
from simdist.collectives.ep_kernels import DEFAULT_NUM_SMS, _shares, ep_kernel_name, ep_kernel_share
from simdist.collectives.group import Group
from simdist.collectives.nccl_model import p2p_nvlink_share
from simdist.collectives.request import Request
from simdist.hardware.presets import load_topology
from simdist.plan.opgraph import Comm
from simdist.predict.price import price_comm

GIB = 2**30
BLACKWELL_NVLINK = 40.1 * 18  # NCCL's SM100_NVLINK_BW x 18 links (GB/s)


def _share(ranks: int, rate: float, nvlink: float = BLACKWELL_NVLINK) -> float:
    return (ranks - 1) / ranks * rate / nvlink


def test_hybridep_share_by_hand_at_32_sms():
    # github.com/deepseek-ai/DeepEP docs/README_Hybrid-EP.md, Torch API, dispatch BF16 and combine: B200 8 ranks
    # (16 SMs only, so clamped), GB200 8/16/24/32/36 ranks at 32 SMs (Megatron-Bridge's HybridEP default)
    series = [(8, 535.94, 530.86), (8, 545.71, 568.94), (16, 523.48, 521.55), (24, 507.32, 483.76),
              (32, 484.22, 464.54), (36, 479.02, 447.89)]
    expected = sum((_share(r, d) + _share(r, c)) / 2 for r, d, c in series) / len(series)
    assert DEFAULT_NUM_SMS["hybridep"] == 32
    assert _shares("hybridep")["Blackwell"] == pytest.approx(expected, rel=1e-12)
    assert 0.6 < expected < 0.7


def test_deepep_share_interpolates_its_sm_count():
    # DeepEP at Megatron-Core's 20 SMs: halfway between the published 16 and 24 (B200 8 ranks; GB200 8, 16, 24)
    series = {8: ((348, 302), (494, 420)), "gb8": ((362.01, 310.21), (512.72, 425.95)),
              16: ((328.80, 278.34), (442.47, 378.32)), 24: ((324.64, 126.53), (450.22, 163.62))}
    ranks = {8: 8, "gb8": 8, 16: 16, 24: 24}
    each = [sum(_share(ranks[k], x) for pair in v for x in pair) / 4 for k, v in series.items()]
    assert DEFAULT_NUM_SMS["deepep"] == 20
    assert _shares("deepep")["Blackwell"] == pytest.approx(sum(each) / len(each), rel=1e-12)
    # DeepEP's V1 README on H800: 153 / 158 GB/s over 8 links of 20.6 GB/s (one row, 24 SMs: clamped)
    assert _shares("deepep")["Hopper"] == pytest.approx((_share(8, 153, 164.8) + _share(8, 158, 164.8)) / 2)


def test_flex_all_to_all_on_one_b200_node_by_hand():
    # 8 B200 on one NVSwitch, port B (effective): HybridEP's all_to_all of S bytes a rank moves (P-1)/P S through
    # every port at its share f of B: t(S) - t(S/2) = (P-1)/P x (S/2) / (B f), latencies cancelling
    group = Group.first(load_topology("dgx-b200"), 8)
    port = group.path(0, 1).effective_bandwidth_Bps
    f = _shares("hybridep")["Blackwell"]
    assert ep_kernel_share("hybridep", group) == f

    def t(nbytes, kernel):
        return evaluate(Request("all_to_all", group, nbytes, kernel=kernel), "direct", "Simple").predicted_s

    assert t(8 * GIB, "hybridep") - t(4 * GIB, "hybridep") == pytest.approx(7 / 8 * 4 * GIB / (port * f), rel=1e-9)
    # slower than NCCL's all_to_all there (0.928 of the ring), faster with more SMs is not modelled
    assert t(GIB, "hybridep") > t(GIB, "nccl")


def test_where_the_kernels_have_no_row_or_leave_the_domain():
    h100 = Group.first(load_topology("dgx-h100"), 8)
    assert ep_kernel_share("hybridep", h100) == _shares("deepep")["Hopper"]  # HybridEP on Hopper: DeepEP's rows
    a100 = Group.first(load_topology("dgx-a100"), 8)
    assert ep_kernel_share("deepep", a100) == p2p_nvlink_share(a100)  # no EP-kernel row: NCCL's share
    across = Group.first(load_topology("dgx-b200", num_nodes=2), 16)
    assert ep_kernel_share("hybridep", across) == 1.0  # bound by the NICs


def test_both_fidelities_price_the_kernel_alike():
    topology = load_topology("dgx-b200", num_nodes=2)
    ranks = tuple(range(8))
    closed = CommPricer(topology).time_s("all_to_all", ranks, 256e6, 1.0, "hybridep")
    engine = price_comm(topology, Comm("all_to_all", ranks, 256e6, "ep", kernel="hybridep")).time_s
    assert engine == pytest.approx(closed, rel=1e-12)
    assert closed > CommPricer(topology).time_s("all_to_all", ranks, 256e6)  # nccl


def test_a_flex_step_carries_its_backend(tmp_path):
    """One DGX B200, ep 8: the flex dispatcher's all_to_alls run HybridEP's or DeepEP's kernels, the alltoall
    dispatcher's NCCL's; the step's exposed expert-parallel time follows the kernels' shares, in both fidelities."""

    def run(dispatch: str, fidelity: str):
        f = tmp_path / f"{dispatch}.yaml"
        kind, backend = [*dispatch.split("-"), ""][:2]
        extra = f", moe_flex_dispatcher_backend: {backend}" if backend else ""
        f.write_text("cluster: {preset: dgx-b200, num_nodes: 1}\nmodel: {preset: qwen3-30b-a3b, seq_length: 1024}\n"
                     "parallel: {dp: 8, ep: 8}\n"
                     f"training: {{global_batch_size: 16, moe_token_dispatcher_type: {kind}{extra}}}\n")
        out = api.run(f, fidelity=fidelity)
        texts[dispatch] = out.text
        return out.result

    texts: dict[str, str] = {}

    hybrid, deep, _ = (run(d, "closed_form") for d in ("flex-hybridep", "flex-deepep", "alltoall"))  # (texts)
    ep = {k: r["breakdown"]["exposed_comm_s"]["ep"] for k, r in (("h", hybrid), ("d", deep))}
    assert ep["h"] < ep["d"]  # 0.65 of NVLink against 0.44, the same rows (once per destination rank)
    assert {c["kernel"] for c in hybrid["collectives"] if c["op"] == "all_to_all"} == {"hybridep"}
    assert "direct (hybridep)" in texts["flex-hybridep"] and "(hybridep)" not in texts["alltoall"]  # the text table
    engine = run("flex-hybridep", "engine")
    assert engine["step_time_s"] == pytest.approx(hybrid["step_time_s"], rel=1e-6)


def test_collective_cli_times_a_hybridep_dispatch(cli):
    # GPUs as HybridEP's README benchmarks them: 8 B200, each rank's buffer of tokens to its destinations; simdist's
    # algbw (size / time) is the README's own convention (bytes a rank receives, its own included, / time): at
    # HybridEP's 0.65 of NCCL's NVLink rate it lands near the measured 536 GB/s (Torch API, dispatch BF16)
    import json

    code, out, err = cli("collective", "--cluster", "dgx-b200", "--op", "all_to_all", "--ranks", "8",
                         "--bytes", "256M", "--kernel", "hybridep", "--json")
    assert code == 0, err
    row = json.loads(out)["rows"][0]
    assert row["algbw_GBps"] == pytest.approx(535.94, rel=0.05)
    code, out, _ = cli("collective", "--cluster", "dgx-b200", "--op", "all_to_all", "--ranks", "8", "--bytes", "256M",
                       "--json")
    assert json.loads(out)["rows"][0]["algbw_GBps"] > row["algbw_GBps"] * 1.3  # NCCL: 0.93 of the ring


def test_the_sm_count_moves_deepep_along_its_published_series(tmp_path):
    # DeepEP on B200 (8 ranks) from 16 to 48 SMs: 348 -> 646 GB/s dispatch; simdist follows the series
    b200 = Group.first(load_topology("dgx-b200"), 8)
    shares = [ep_kernel_share(f"deepep:{sms}", b200) for sms in (8, 16, 20, 32, 64)]
    assert shares[0] == shares[1] < shares[2] < shares[3] < shares[4]  # clamped below the published 16
    assert ep_kernel_share("deepep:20", b200) == ep_kernel_share("deepep", b200)  # Megatron's default
    assert ep_kernel_name("deepep", 20) == "deepep" and ep_kernel_name("hybridep", 64) == "hybridep:64"
    # the scenario field, under Megatron-Core's name or its deprecated aliases
    from simdist.plan.layout import step_config_of
    from simdist.plan.model_presets import resolve_model

    for field in ("moe_flex_dispatcher_num_sms", "moe_deepep_num_sms"):
        f = tmp_path / f"{field}.yaml"
        f.write_text("cluster: {preset: dgx-b200, num_nodes: 1}\nmodel: {preset: qwen3-30b-a3b, seq_length: 1024}\n"
                     "parallel: {dp: 8, ep: 8}\ntraining: {global_batch_size: 16, moe_token_dispatcher_type: flex, "
                     f"{field}: 32}}\n")
        sc = api.load_scenario(f)
        assert step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model)).expert_parallel.kernel == "deepep:32"


def test_hybridep_across_nodes_takes_its_published_share_of_simdists_own_rate():
    # github.com/deepseek-ai/DeepEP docs/README_Hybrid-EP.md, 'H100 Platform', Torch API at 16 SMs: derived shares
    # 0.71 on 2 nodes, 1.046 on 4, 0.889 on 8 (data/ep_internode_shares.csv); Megatron's 32 SMs clamp to the 16
    # published
    from simdist.collectives.ep_kernels import internode_share

    two = Group.first(load_topology("dgx-h100", num_nodes=2), 16)
    assert ep_kernel_share("hybridep", two) == internode_share("hybridep", "Hopper", 2) == 0.71
    assert ep_kernel_share("hybridep:8", two) == 0.755
    # 3 nodes: linear in log2 of the nodes between 2 and 4
    three = Group.first(load_topology("dgx-h100", num_nodes=3), 24)
    assert ep_kernel_share("hybridep", three) == pytest.approx(0.71 + (1.046 - 0.71) * (math.log2(3) - 1), rel=1e-12)
    # DeepEP has no inter-node rows priced (its V1 table routes to at most 4 nodes): 1; NCCL keeps its own share
    assert ep_kernel_share("deepep", two) == 1.0
    assert ep_kernel_share("nccl", two) == p2p_nvlink_share(two)

    # the benchmark case by hand: 4096 tokens x the nodes a token reaches (64 of 128 experts a node, top-8, its own
    # node included) x 7168 x 2 B; at the share, simdist's time is the published mean of dispatch and combine's rates
    reached = 2 * (1 - math.comb(64, 8) / math.comb(128, 8))
    nbytes = 4096 * reached * 7168 * 2

    def t(b):
        return evaluate(Request("all_to_all", two, b, kernel="hybridep:16"), "direct", "Simple").predicted_s

    latency = 2 * t(nbytes) - t(2 * nbytes)
    published = [nbytes / (rate * 1e9) - latency for rate in (54.47, 53.35)]  # dispatch BF16, combine
    assert (t(nbytes) - latency) == pytest.approx(2 / sum(1 / p for p in published), rel=2e-3)


def test_stored_internode_shares_are_what_their_derivation_gives():
    from simdist.collectives.ep_kernels import _internode
    from validation.ep_datasets import internode_shares

    stored = {(lib, arch, n, s): v for (lib, arch), series in _internode().items()
              for n, points in series.items() for s, v in points}
    derived = {(lib, arch, n, s): v for lib, arch, n, s, v in internode_shares()}
    assert stored == derived


@pytest.mark.parametrize("argv, field", [
    # an H100 has 132 SMs: kernels named on all of them (or more) leave the compute beside them none
    (["collective", "--cluster", "dgx-h100", "--op", "all_to_all", "--ranks", "8", "--bytes", "1M",
      "--kernel", "hybridep:132"], "--kernel"),
    (["check", "scenarios/published/nemo-qwen3-30b-h100-fp8.yaml", "--set",
      "training.moe_flex_dispatcher_num_sms=200"], "training.moe_flex_dispatcher_num_sms"),
])
def test_kernels_on_every_sm_of_the_gpu_exit_2_naming_the_field(argv, field):
    from tests.cli_harness import run_cli
    from tests.conftest import REPO

    r = run_cli(argv, cwd=REPO)
    assert r.code == 2 and r.one_line_error(), r.err
    assert r.err.strip().splitlines()[-1].startswith(f"error: {field}: hybridep's kernels on ")
    assert "has only 132" in r.err
    # one SM fewer runs
    ok = run_cli([*argv[:-1], argv[-1].replace("132", "131").replace("=200", "=131")], cwd=REPO)
    assert ok.code == 0, ok.err
