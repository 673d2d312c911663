"""Expert-parallel communication: routing imbalance as an uneven all_to_all (simdist.collectives.uneven), priced
the same by the closed form (simdist.analytic.pricing) and the engine's pricing (simdist.predict.price)."""

from __future__ import annotations

import pytest

from simdist.analytic.pricing import CommPricer
from simdist.analytic.select import rank_choices
from simdist.collectives.group import Group
from simdist.collectives.nccl_model import p2p_nvlink_share
from simdist.collectives.request import Request
from simdist.collectives.uneven import imbalanced_matrix
from simdist.errors import SimdistError
from simdist.hardware import load_topology
from simdist.plan.opgraph import Comm
from simdist.predict.price import price_comm
from tests.conftest import TOY_TOPOLOGY

# tests/fixtures/toy-nvswitch.yaml: 4 GPUs per node on one 100 GB/s NVSwitch, efficiencies 1.0; NCCL's all_to_all
# inside the node reaches the share p2p_nvlink_share of it (simdist.collectives.nccl_model, the toy's GPU generation)
TOY = load_topology(TOY_TOPOLOGY, num_nodes=2)
PORT_BPS = 100e9 * p2p_nvlink_share(Group.first(TOY, 4))


def test_imbalanced_matrix_keeps_every_send_and_loads_the_busiest_receiver():
    m = imbalanced_matrix(4, 400.0, 2.5)
    assert [sum(row) for row in m] == pytest.approx([400.0] * 4)  # every rank sends its balanced buffer
    assert sum(row[0] for row in m) == pytest.approx(2.5 * 400.0)  # peer 0 receives 2.5 x the mean
    assert [sum(row[j] for row in m) for j in (1, 2, 3)] == pytest.approx([(4 * 400.0 - 1000.0) / 3] * 3)
    assert imbalanced_matrix(4, 400.0, 1.0) == tuple((100.0,) * 4 for _ in range(4))
    t = imbalanced_matrix(4, 400.0, 2.5, transpose=True)
    assert sum(t[0]) == pytest.approx(1000.0)  # combine: the busiest peer sends
    with pytest.raises(SimdistError, match="moe_imbalance"):
        imbalanced_matrix(4, 400.0, 4.5)  # more than every token on one peer


@pytest.mark.parametrize("x", [1.0, 1.5, 2.0, 4.0])
def test_uneven_all_to_all_on_one_node_takes_the_busiest_port_time(x):
    # One NVSwitch node, P = 4, S bytes per rank: the busiest peer's port receives (P - 1) x S / P, so the transfer
    # part is x times the even one's (P - 1) S / (P B) (simdist.analytic.direct's module docstring); the latency
    # part is the even all_to_all's.
    S, P = 64e6, 4
    ranks = tuple(range(P))
    even = CommPricer(TOY).time_s("all_to_all", ranks, S)
    latency = even - (P - 1) * S / (P * PORT_BPS)
    closed = CommPricer(TOY).time_s("all_to_all", ranks, S, x)
    assert closed == pytest.approx(latency + x * (P - 1) * S / (P * PORT_BPS), rel=1e-12)
    engine = price_comm(TOY, Comm("all_to_all", ranks, S, "ep", imbalance=x)).time_s
    assert engine == pytest.approx(closed, rel=1e-12)


def test_uneven_all_to_all_is_the_uneven_request_and_its_transpose_costs_the_same():
    # The imbalance is priced as the collectives layer's uneven all_to_all (Request.matrix), not a scaled even one;
    # on alike peers the combine (the busiest sends) costs what the dispatch (the busiest receives) does.
    ranks, S = tuple(range(8)), 8e6  # two nodes: the busiest peer's NIC is the bottleneck
    group = Group(TOY, ranks)
    dispatch = rank_choices(Request("all_to_all", group, S, matrix=imbalanced_matrix(8, S, 2.0)))[0].predicted_s
    combine = rank_choices(Request("all_to_all", group, S,
                                   matrix=imbalanced_matrix(8, S, 2.0, transpose=True)))[0].predicted_s
    assert CommPricer(TOY).time_s("all_to_all", ranks, S, 2.0) == pytest.approx(dispatch, rel=1e-12)
    assert combine == pytest.approx(dispatch, rel=1e-12)
    assert dispatch > 1.5 * CommPricer(TOY).time_s("all_to_all", ranks, S)


# ----------------------------------------------------------------------------- in a step
def _cfg(parallel: dict, training: dict | None = None, gpus_per_node: int = 4, num_nodes: int = 1,
         model: dict | None = None):
    from simdist import api
    from simdist.plan.layout import step_config_of
    from simdist.plan.model_presets import resolve_model
    from tests.test_moe_layout import TINY_MOE, _spec

    spec = _spec(parallel, training, {**TINY_MOE, **(model or {})}, gpus_per_node=gpus_per_node,
                 num_nodes=num_nodes)
    topology = api.cluster_of(spec)
    return step_config_of(spec, topology, resolve_model(spec.model)), topology, spec


def test_doubling_the_imbalance_doubles_the_all_to_alls_transfer_in_the_step():
    # tests/test_moe_layout.TINY_MOE (4 MoE layers, top-2) at h 1024, seq 2048, with ep = dp = 4 on one 4-GPU toy
    # node, 4 micro-batches of 1: every layer runs 4 all_to_alls per micro-batch (dispatch and combine, forward and
    # backward), each rank sending S = 2048 tokens x 2 experts x 1024 x 2 B; none overlaps compute (pp 1,
    # blocking), so the exposed ep time is 64 x t(x), t(x) = latency + x (P - 1) S / (P B) (the busiest port;
    # Simple protocol at 8 MB): doubling x adds 64 (P - 1) S / (P B).
    from simdist.analytic.step import analytic_observables

    P, S, runs = 4, 2048 * 2 * 1024 * 2, 4 * 4 * 4
    ep_s = {}
    for x in (1.0, 2.0):
        cfg, topology, _ = _cfg({"dp": 4, "ep": 4}, {"moe_imbalance": x},
                                model={"hidden_size": 1024, "seq_length": 2048})
        ep_s[x] = analytic_observables(cfg, CommPricer(topology), fast_forward=False)[0]["ep_s"]
        assert ep_s[x] == pytest.approx(runs * CommPricer(topology).time_s("all_to_all", (0, 1, 2, 3), S, x),
                                        rel=1e-12)
    assert ep_s[2.0] - ep_s[1.0] == pytest.approx(runs * (P - 1) * S / (P * PORT_BPS), rel=1e-9)


def test_expert_gradients_reduce_over_the_expert_data_parallel_group():
    # dp 8, ep 4 on 8 GPUs: edp = 8 / 4 = 2. The stage's dense gradients all-reduce over dp (8 ranks), the routed
    # experts' over edp (2 ranks: the ranks holding the same experts); ZeRO-1 shards each over its own group.
    from simdist.plan.data_parallel import optimizer_params, tail
    from simdist.plan.step import chunk_costs_of

    cfg, _, _ = _cfg({"dp": 8, "ep": 4}, gpus_per_node=8)
    (cost,) = chunk_costs_of(cfg).values()
    assert 0 < cost.expert_params < cost.num_params
    reductions = {p.comm.axis: p.comm for p in tail(cfg, [cost]).pieces if p.comm is not None}
    assert reductions["dp"].op == reductions["edp"].op == "all_reduce"
    assert reductions["dp"].nbytes * reductions["dp"].count == pytest.approx((cost.num_params - cost.expert_params) * 4)
    assert reductions["edp"].nbytes * reductions["edp"].count == pytest.approx(cost.expert_params * 4)
    assert cfg.mesh.group("edp", 0) == (0, 4) and cfg.mesh.group("ep", 0) == (0, 1, 2, 3)
    z1, _, _ = _cfg({"dp": 8, "ep": 4, "zero_stage": 1}, gpus_per_node=8)
    assert optimizer_params(z1, cost.num_params, cost.expert_params) == pytest.approx(
        (cost.num_params - cost.expert_params) / 8 + cost.expert_params / 2)
    shards = {p.comm.axis: p.comm for p in tail(z1, [cost]).pieces if p.comm is not None and p.comm.op == "all_gather"}
    assert shards["edp"].nbytes == pytest.approx(cost.expert_params * 2)  # bf16 parameters gathered over edp


def test_run_reports_all_to_all_time_per_axis(tmp_path):
    # simdist run's JSON and text breakdown name the expert axes where the step exposes their communication
    import json

    from simdist import api
    from simdist.report.step_table import render_text
    from tests.test_moe_layout import TINY_MOE

    path = tmp_path / "moe.yaml"
    path.write_text(json.dumps({
        "cluster": {"file": str(TOY_TOPOLOGY), "num_nodes": 1, "gpus_per_node": 4, "inter_node": {"nics_per_node": 4}},
        "model": TINY_MOE, "parallel": {"dp": 4, "ep": 4},
        "training": {"micro_batch_size": 1, "global_batch_size": 8, "moe_imbalance": 2.0}}), encoding="utf-8")
    result = api.run(path).result
    exposed = result["breakdown"]["exposed_comm_s"]
    assert set(exposed) == {"tp", "cp", "pp", "dp", "ep", "etp", "edp"} and exposed["ep"] > 0
    assert "exposed comm ep" in render_text(result)
    assert any(c["axis"] == "ep" and c["op"] == "all_to_all" for c in result["collectives"])


def test_1f1b_a2a_overlap_hides_the_all_to_alls_behind_compute_but_the_unpaired_steps():
    # --overlap-moe-expert-parallel-comm on pp 1: each step's all_to_alls run beside its compute
    # (simdist.plan.comm_overlap.overlapped_comm); where a step's compute outlasts them, the step loses its
    # all_to_all time but for the compute they slow meanwhile (simdist.plan.interference: x / (1 + x) of their
    # time). Megatron-Core runs the first micro-batch's forward and the last one's backward alone
    # (combined_1f1b_schedule_for_no_pipelining: "executed alone, no a2a overlapping"): of M micro-batches'
    # all_to_alls, one micro-batch's stay exposed.
    from simdist.analytic.step import _num_microbatches, analytic_observables

    model = {"hidden_size": 512, "num_attention_heads": 8, "seq_length": 1024}
    for gbs in (8, 16):  # 2 and 4 micro-batches of 1 per replica
        obs = {}
        for overlap in (False, True):
            cfg, topology, _ = _cfg({"dp": 4, "ep": 4}, {"overlap_moe_expert_parallel_comm": overlap,
                                                         "global_batch_size": gbs}, model=model)
            obs[overlap] = analytic_observables(cfg, CommPricer(topology), fast_forward=False)[0]
        plain, hidden = obs[False], obs[True]
        M = gbs // 4
        assert _num_microbatches(cfg) == M and plain["ep_s"] > 0
        assert hidden["ep_s"] == pytest.approx(plain["ep_s"] / M, rel=1e-12)
        x = cfg.interference
        paired = plain["ep_s"] * (M - 1) / M  # the all_to_alls of the steps run in pairs
        slowed = x / (1 + x) * paired
        assert hidden["compute_s"] == pytest.approx(plain["compute_s"] + slowed, rel=1e-12)
        assert hidden["step_s"] == pytest.approx(plain["step_s"] - paired + slowed, rel=1e-12)


def test_a2a_overlap_share_keeps_the_rest_of_each_hidden_all_to_all_in_the_path():
    # training.moe_a2a_overlap_share s: of each all_to_all the overlap hides, s of its bytes run beside the compute
    # (slowing it by x / (1 + x) of their time) and 1 - s after it, in the step's path: two all_to_alls, each paying
    # the latency term L of an all_to_all of time L + b / B. Over the n paired all_to_alls (on pp 1 with M
    # micro-batches one micro-batch's run alone, exposed, and M - 1 are paired): in the path n L + (1 - s) n b / B,
    # beside the compute n L + s n b / B, together the paired time n (L + b / B) and one more n L.
    from simdist.analytic.step import _num_microbatches, analytic_observables

    # 32 MiB all_to_alls: the toy prices them, and any piece of them down to a tenth, on one protocol, so
    # affinely in their bytes (smaller ones switch protocol: simdist.collectives.nccl_model)
    model = {"hidden_size": 2048, "num_attention_heads": 16, "seq_length": 4096}
    obs = {}
    for share in (None, 1.0, 0.8, 0.5, 0.2):
        training = {"overlap_moe_expert_parallel_comm": share is not None, "global_batch_size": 16}
        if share is not None:
            training["moe_a2a_overlap_share"] = share
        cfg, topology, _ = _cfg({"dp": 4, "ep": 4}, training, model=model)
        obs[share] = analytic_observables(cfg, CommPricer(topology), fast_forward=False)[0]
    M, x = _num_microbatches(cfg), cfg.interference
    exposed, paired = obs[None]["ep_s"] / M, obs[None]["ep_s"] * (M - 1) / M
    assert M == 4 and cfg.moe_overlap_share == 0.2
    assert obs[1.0]["ep_s"] == pytest.approx(exposed, rel=1e-12)  # 1: the model as before, nothing split
    slope = (obs[0.2]["ep_s"] - obs[0.5]["ep_s"]) / 0.3  # n b / B
    assert (obs[0.5]["ep_s"] - obs[0.8]["ep_s"]) / 0.3 == pytest.approx(slope, rel=1e-9)  # affine in 1 - s
    latency = obs[0.5]["ep_s"] - exposed - 0.5 * slope  # n L
    assert latency > 0 and slope + latency == pytest.approx(paired, rel=1e-9)
    for share in (0.8, 0.5, 0.2):  # the compute beside them is slowed by what still runs there
        beside = latency + share * slope
        assert obs[share]["compute_s"] == pytest.approx(obs[None]["compute_s"] + x / (1 + x) * beside, rel=1e-9)
    assert obs[1.0]["step_s"] < obs[0.8]["step_s"] < obs[0.5]["step_s"] < obs[0.2]["step_s"]


def test_a2a_overlap_share_in_both_fidelities():
    # the share splits the hidden all_to_alls in the step recipes both fidelities read: the engine's rule (every
    # collective alone) meets the closed form on the interleaved pipeline of the test below
    from simdist import api
    from simdist.analytic.step import analytic_observables
    from simdist.plan.layout import step_config_of
    from simdist.plan.model_presets import resolve_model
    from tests.test_analytic_step import _agree, _graph_observables
    from tests.test_moe_layout import TINY_MOE, _spec

    model = {**TINY_MOE, "hidden_size": 512, "num_attention_heads": 8, "seq_length": 1024}
    steps = []
    for share in (1.0, 0.4):
        spec = _spec({"pp": 2, "vpp": 2, "dp": 2, "ep": 2}, {"overlap_moe_expert_parallel_comm": True,
                                                             "moe_a2a_overlap_share": share}, model,
                     gpus_per_node=4, num_nodes=1, schedule="interleaved_1f1b")
        topology = api.cluster_of(spec)
        cfg = step_config_of(spec, topology, resolve_model(spec.model))
        obs = analytic_observables(cfg, CommPricer(topology), fast_forward=False)[0]
        _agree(_graph_observables(cfg, topology), obs, 1e-9)
        steps.append(obs)
    assert steps[1]["ep_s"] > steps[0]["ep_s"] and steps[1]["step_s"] > steps[0]["step_s"]


def test_interleaved_a2a_overlap_exposes_each_stages_warm_up_and_cool_down():
    # pp 2, vpp 2 (one MoE layer per chunk), 4 micro-batches: with the overlap Megatron's interleaved warm-up is
    # (K - s - 1) x 2 + (V - 1) x K + 1 forwards (schedules.py get_pp_rank_microbatches, "one extra micro-batch"
    # with overlap_moe_expert_parallel_comm: 5 on stage 0, 3 on stage 1), which the combined 1F1B runs alone, as the
    # backwards of its cool-down (as many): of each stage's M x V = 8 forwards and backwards, stage 0 exposes the
    # all_to_alls of 5 and stage 1 of 3, half the un-overlapped step's on average; the engine's timeline (its step
    # emitter finds the same steps as the closed form's program) agrees
    from simdist import api
    from simdist.analytic.program import program
    from simdist.analytic.step import _num_microbatches, analytic_observables
    from simdist.plan.layout import step_config_of
    from simdist.plan.model_presets import resolve_model
    from tests.test_analytic_step import _agree, _graph_observables
    from tests.test_moe_layout import TINY_MOE, _spec

    model = {**TINY_MOE, "hidden_size": 512, "num_attention_heads": 8, "seq_length": 1024}
    obs = {}
    for overlap in (False, True):
        spec = _spec({"pp": 2, "vpp": 2, "dp": 2, "ep": 2}, {"overlap_moe_expert_parallel_comm": overlap}, model,
                     gpus_per_node=4, num_nodes=1, schedule="interleaved_1f1b")
        topology = api.cluster_of(spec)
        cfg = step_config_of(spec, topology, resolve_model(spec.model))
        obs[overlap] = analytic_observables(cfg, CommPricer(topology), fast_forward=False)[0]
        _agree(_graph_observables(cfg, topology), obs[overlap], 1e-9)  # the engine's rule, every collective alone
    M, K, V = _num_microbatches(cfg), 2, 2
    prog = program("interleaved_1f1b", K, M, V, True)
    alone = prog.steps[1] >= 6 * V
    warm_up = [int((alone & (prog.steps[0] == s) & (prog.kinds[0] == 0)).sum()) for s in range(K)]
    cool_down = [int((alone & (prog.steps[0] == s) & (prog.kinds[0] == 1)).sum()) for s in range(K)]
    assert M == 4 and warm_up == cool_down == [(K - s - 1) * 2 + (V - 1) * K + 1 for s in range(K)] == [5, 3]
    assert obs[True]["ep_s"] == pytest.approx(obs[False]["ep_s"] * 4 / 8, rel=1e-9)


def test_flex_kernels_beside_compute_take_their_sms_from_it():
    # The flex dispatcher's kernels hold s of the GPU's N SMs while they run (a persistent grid,
    # moe_flex_dispatcher_num_sms): the compute beside them runs on N - s, N / (N - s) as long, x = s / (N - s)
    # (simdist.plan.step_config.StepConfig.expert_interference), in place of the GPU's NCCL interference
    from simdist.analytic.step import _num_microbatches, analytic_observables
    from simdist.hardware.gemm import architecture

    model = {"hidden_size": 512, "num_attention_heads": 8, "seq_length": 1024}
    flex = {"moe_token_dispatcher_type": "flex", "moe_flex_dispatcher_backend": "hybridep",
            "moe_flex_dispatcher_num_sms": 16}
    obs = {}
    for overlap in (False, True):
        cfg, topology, _ = _cfg({"dp": 4, "ep": 4}, {**flex, "overlap_moe_expert_parallel_comm": overlap},
                                model=model)
        obs[overlap] = analytic_observables(cfg, CommPricer(topology), fast_forward=False)[0]
    n = architecture(cfg.gpu).num_sms
    assert cfg.expert_parallel.kernel == "hybridep:16" and cfg.expert_interference == pytest.approx(16 / (n - 16))
    plain, hidden = obs[False], obs[True]
    x = cfg.expert_interference
    M = _num_microbatches(cfg)  # the first forward and last backward run alone: their all_to_alls slow nothing
    assert M >= 2
    assert hidden["compute_s"] == pytest.approx(plain["compute_s"] + x / (1 + x) * plain["ep_s"] * (M - 1) / M,
                                                rel=1e-12)
