"""Expert-parallel layout: the ep, etp and edp groups as Megatron-Core forms them (simdist.plan.mesh's expert
generator), where they land on a tiny topology, and the validity rules (simdist.plan.layout.check_experts)."""

from __future__ import annotations

import pytest

from simdist import api
from simdist.analytic.pricing import CommPricer
from simdist.collectives.group import Group
from simdist.collectives.nccl_model import p2p_nvlink_share
from simdist.hardware import load_topology
from simdist.plan.layout import LayoutRuleError, check_layout, step_config_of
from simdist.plan.mesh import Mesh, parse_order
from simdist.plan.model_presets import resolve_model
from simdist.spec.scenario import ScenarioSpec
from tests.conftest import TOY_TOPOLOGY

TINY_MOE = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 128, "vocab_size": 1000,
            "ffn_hidden_size": 256, "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 128}

DENSE = {k: v for k, v in TINY_MOE.items() if k not in ("num_experts", "moe_router_topk", "moe_ffn_hidden_size")}


def _spec(parallel: dict, training: dict | None = None, model: dict | None = None, gpus_per_node: int = 8,
          num_nodes: int = 2, schedule: str = "1f1b") -> ScenarioSpec:
    dp = parallel.get("dp", 1)
    return ScenarioSpec.model_validate({
        "cluster": {"file": str(TOY_TOPOLOGY), "num_nodes": num_nodes, "gpus_per_node": gpus_per_node,
                    "inter_node": {"nics_per_node": gpus_per_node}},
        "model": model or TINY_MOE,
        "parallel": parallel,
        "training": {"micro_batch_size": 1, "global_batch_size": 4 * dp, **(training or {})},
        "schedule": schedule,
    })


def test_expert_groups_are_megatrons_second_rank_generator():
    # tp 2, dp 4, pp 2, ep 2, etp 1 on 16 ranks, order tp-cp-ep-dp-pp: the expert generator is etp 1 - ep 2 -
    # edp 4 - pp 2 (edp = 16 / (etp x ep x pp)), so ep groups are consecutive pairs (taking the attention's tp
    # peers), edp groups every other rank of a stage, and the pipeline groups are the dense ones.
    mesh = Mesh(tp=2, dp=4, pp=2, ep=2, etp=1, order=parse_order("tp-cp-ep-dp-pp"))
    assert mesh.size("edp") == 4
    assert mesh.group("ep", 5) == (4, 5)
    assert mesh.group("edp", 5) == (1, 3, 5, 7)
    assert mesh.group("etp", 5) == (5,)
    assert mesh.group("tp", 5) == (4, 5) and mesh.group("dp", 5) == (1, 3, 5, 7)
    assert mesh.group("pp", 5) == (5, 13) and mesh.pipeline_groups_agree()
    # etp = tp (the default): ep strides over the tp peers, carved out of dp
    same = Mesh(tp=2, dp=4, pp=2, ep=2)
    assert same.group("etp", 5) == (4, 5) and same.group("ep", 5) == (5, 7) and same.group("edp", 5) == (1, 5)
    # the order decides where ep sits: outside dp, the ep peers are a stage's dp x tp apart
    outer = Mesh(tp=1, dp=4, pp=1, ep=2, order=parse_order("tp-cp-dp-ep-pp"))
    assert outer.group("ep", 1) == (1, 3) and outer.group("edp", 1) == (0, 1)


@pytest.mark.parametrize("ep,etp,order,nodes", [
    (8, 1, "tp-cp-ep-dp-pp", 1),   # ep 8 on an 8-GPU node: one NVLink domain
    (16, 1, "tp-cp-ep-dp-pp", 2),  # ep 16 spans both nodes
    (8, 2, "tp-cp-ep-dp-pp", 2),   # ep 8 of etp 2 each: 16 GPUs, across the fabric
    (8, 1, "tp-cp-dp-ep-pp", 2),   # ep outside edp (2): every other rank, over both nodes
])
def test_ep_inside_the_nvlink_domain_when_it_fits(ep, etp, order, nodes):
    mesh = Mesh(tp=etp, dp=16 // etp, ep=ep, etp=etp, order=parse_order(order))
    assert mesh.nodes_spanned("ep", 8) == nodes


def test_ep_across_the_fabric_costs_more_than_inside_a_node():
    # Two 8-GPU toy nodes (100 GB/s NVSwitch ports, 25 GB/s NICs): the same 8-way all_to_all inside one node
    # (ep inner to dp), or spread over both nodes (ep outer to dp: edp 2 inside, every other rank).
    topology = load_topology(TOY_TOPOLOGY, num_nodes=2, assignments=["gpus_per_node=8", "inter_node.nics_per_node=8"])
    inner = Mesh(dp=16, ep=8, order=parse_order("tp-cp-ep-dp-pp"))
    outer = Mesh(dp=16, ep=8, order=parse_order("tp-cp-dp-ep-pp"))
    assert inner.group("ep", 0) == tuple(range(8)) and outer.group("ep", 0) == tuple(range(0, 16, 2))
    pricer = CommPricer(topology)
    fast, slow = (pricer.time_s("all_to_all", m.group("ep", 0), 64e6) for m in (inner, outer))
    # inside: 7/8 of 64 MB over a 100 GB/s port at NCCL's all_to_all share of it; across: half the peers behind a
    # 25 GB/s NIC
    share = p2p_nvlink_share(Group(topology, inner.group("ep", 0)))
    assert share < 1.0
    assert fast == pytest.approx(7 / 8 * 64e6 / (100e9 * share), rel=0.05)
    assert slow > 3 * fast


def test_step_config_carries_the_expert_mesh():
    spec = _spec({"tp": 2, "dp": 8, "ep": 4, "etp": 1, "sequence_parallel": True})
    topology = api.cluster_of(spec)
    cfg = step_config_of(spec, topology, resolve_model(spec.model))
    assert (cfg.ep, cfg.etp, cfg.mesh.ep, cfg.mesh.size("etp"), cfg.mesh.size("edp")) == (4, 1, 4, 1, 4)


@pytest.mark.parametrize("parallel,training,model,field,match", [
    ({"dp": 16, "ep": 2}, {}, DENSE, "parallel.ep", "without experts"),
    ({"dp": 16, "ep": 16}, {}, None, "parallel.ep", "8 experts do not split over ep = 16"),
    ({"dp": 6, "ep": 4}, {}, None, "parallel.ep", "does not divide"),
    ({"tp": 2, "dp": 8, "ep": 8, "etp": 4}, {}, None, "parallel.ep", "does not divide"),
    ({"dp": 16, "ep": 2, "etp": 8}, {}, {**TINY_MOE, "moe_ffn_hidden_size": 100}, "parallel.etp",
     "100 does not split over etp = 8"),
    ({"dp": 16, "ep": 2}, {"moe_imbalance": 3.0}, None, "training.moe_imbalance", "exceeds ep = 2"),
    ({"dp": 8, "pp": 2, "ep": 2}, {"overlap_moe_expert_parallel_comm": True}, None,
     "training.overlap_moe_expert_parallel_comm", "interleaved_1f1b"),
    ({"dp": 16}, {"overlap_moe_expert_parallel_comm": True}, None, "training.overlap_moe_expert_parallel_comm",
     "needs ep > 1"),
    # Megatron-Core's TransformerConfig checks of the 1F1B A2A overlap
    ({"dp": 16, "ep": 2}, {"overlap_moe_expert_parallel_comm": True, "precision": "fp32"}, None,
     "training.overlap_moe_expert_parallel_comm", "bf16 or fp16 parameters"),
    ({"dp": 16, "ep": 2}, {"overlap_moe_expert_parallel_comm": True, "recompute": "selective",
                           "recompute_modules": ["moe"]}, None,
     "training.overlap_moe_expert_parallel_comm", "moe module recomputed"),
    ({"dp": 16, "ep": 2}, {"overlap_moe_expert_parallel_comm": True}, {**TINY_MOE, "mtp_num_layers": 2},
     "training.overlap_moe_expert_parallel_comm", "at most one multi-token-prediction layer"),
    ({"tp": 2, "dp": 4, "pp": 2, "ep": 2, "etp": 1, "order": "tp-pp-cp-ep-dp", "sequence_parallel": True}, {}, None,
     "parallel.order",
     "pipeline groups"),
    # the share the 1F1B A2A overlap hides is that overlap's: without it, it would do nothing
    ({"dp": 16, "ep": 2}, {"moe_a2a_overlap_share": 0.5}, None, "training.moe_a2a_overlap_share",
     "without overlap_moe_expert_parallel_comm"),
])
def test_expert_layout_rules(parallel, training, model, field, match):
    spec = _spec(parallel, training, model)
    with pytest.raises(LayoutRuleError, match=match) as err:
        check_layout(spec, resolve_model(spec.model))
    assert err.value.rule == "experts" and err.value.field == field


def test_ep_may_take_ranks_of_tp_where_etp_is_smaller():
    # Megatron-Core carves etp x ep out of a stage's tp x cp x dp: ep 8 with etp 1 on tp 2 x dp 4
    spec = _spec({"tp": 2, "dp": 4, "ep": 8, "etp": 1, "sequence_parallel": True}, num_nodes=1)
    check_layout(spec, resolve_model(spec.model))


def test_the_a2a_overlap_runs_in_fp8_and_holds_one_more_warm_up_micro_batch():
    # Megatron-Core checks bf16/fp16 parameters, which fp8 training has (--fp8-format beside --bf16): accepted
    spec = _spec({"dp": 16, "ep": 2}, {"overlap_moe_expert_parallel_comm": True, "precision": "fp8"})
    check_layout(spec, resolve_model(spec.model))
    # interleaved with the overlap: one chunk forward more before the first backward (schedules.py
    # get_pp_rank_microbatches), so stage 0 of pp 4 x vpp 2 holds (2 x 4 + 4 - 1 + 1) / 2 = 6 micro-batches, not 5.5
    from simdist.plan.activations import in_flight_microbatches

    base = in_flight_microbatches("interleaved_1f1b", num_stages=4, num_microbatches=16, vpp=2)
    assert base == 5.5
    assert in_flight_microbatches("interleaved_1f1b", num_stages=4, num_microbatches=16, vpp=2,
                                  extra_warmup=1) == base + 0.5 == 6.0
    # capped by the micro-batches there are
    assert in_flight_microbatches("interleaved_1f1b", num_stages=4, num_microbatches=2, vpp=2,
                                  extra_warmup=1) == 2.0
