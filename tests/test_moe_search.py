"""Search and compare over expert-parallel layouts: ep and etp enumerated with the other axes for a mixture-of-experts
model (valid ones only: simdist.plan.layout.check_experts), and `simdist compare` of an MoE model."""

from __future__ import annotations

import json

from simdist import api
from simdist.search.space import Candidate, SearchProblem, count_candidates, expert_layouts, raw_candidates
from tests.conftest import TOY_TOPOLOGY
from tests.test_moe_layout import TINY_MOE


def test_expert_layouts_of_a_stage():
    problem = SearchProblem(model="m", cluster="c", num_nodes=1, global_batch_size=8)
    # 8 experts on tp 2 x dp 4 = 8 ranks: ep a power of two dividing 8; etp tp (0) or 1; etp x ep divides 8
    assert expert_layouts(problem, 8, 2, 1, 4) == [(1, 0), (1, 1), (2, 0), (2, 1), (4, 0), (4, 1), (8, 1)]
    assert expert_layouts(problem, 6, 1, 1, 8) == [(1, 0), (2, 0)]  # 4 and 8 do not divide 6 experts
    assert expert_layouts(problem, 0, 2, 1, 4) == [(1, 0)]  # a dense model
    capped = SearchProblem(model="m", cluster="c", num_nodes=1, global_batch_size=8, max_ep=2)
    assert [e for e, _ in expert_layouts(capped, 8, 1, 1, 8)] == [1, 2]


def test_candidate_keys_and_dicts_of_dense_layouts_are_unchanged():
    dense = Candidate(2, 1, 4, 1, 1, 1, 0, "none", True, "1f1b")
    assert dense.key == "tp2-pp1-dp4-cp1-v1-mbs1-z0-none-sp-1f1b" and "ep" not in dense.as_dict()
    moe = Candidate(2, 1, 4, 1, 1, 1, 0, "none", True, "1f1b", ep=4, etp=1)
    assert moe.key.endswith("-ep4-etp1") and Candidate.from_dict(moe.as_dict()) == moe
    assert Candidate.from_dict(dense.as_dict()) == dense
    assert "max_ep" not in SearchProblem(model="m", cluster="c", num_nodes=1, global_batch_size=8).as_dict()


def test_count_matches_the_enumeration_for_an_moe_model():
    problem = SearchProblem(model="m", cluster="c", num_nodes=1, global_batch_size=8, max_pp=2, max_micro_batch=2,
                            schedules=("1f1b",))
    kw = {"num_gpus": 8, "gpus_per_node": 4, "num_layers": 4, "num_experts": 8}
    listed = list(raw_candidates(problem, **kw))
    assert len(listed) == count_candidates(problem, **kw) > count_candidates(problem, **{**kw, "num_experts": 0})
    assert {c.ep for c in listed} == {1, 2, 4, 8}


def _scenario(tmp_path, num_layers: int = 4) -> str:
    path = tmp_path / "moe.yaml"
    path.write_text(json.dumps({
        "cluster": {"file": str(TOY_TOPOLOGY), "num_nodes": 2, "gpus_per_node": 4, "inter_node": {"nics_per_node": 4}},
        "model": {**TINY_MOE, "num_layers": num_layers}, "parallel": {"dp": 8, "ep": 8},
        "training": {"micro_batch_size": 1, "global_batch_size": 16}}), encoding="utf-8")
    return str(path)


def test_search_ranks_expert_parallel_layouts(tmp_path):
    out = api.search(scenario=_scenario(tmp_path), max_pp=1, max_cp=1, max_micro_batch=1, schedules=("1f1b",),
                     top_k=1, rows=100)
    doc = out.doc
    ranked = doc["ranked"]
    eps = {r["layout"].get("ep", 1) for r in ranked}
    assert eps == {1, 2, 4, 8}  # every ep dividing 8 experts and 8 ranks is feasible and ranked
    # the invalid ones were pruned by the experts rule: tp > 1 without sequence parallelism
    assert doc["pruned_counts"].get("experts", 0) > 0
    assert "ep" in out.text and "etp" in out.text  # the table shows the expert axes


def test_compare_an_moe_model(tmp_path):
    out = api.compare(scenario=_scenario(tmp_path, num_layers=1), sized=[f"{TOY_TOPOLOGY}:4"], tokens=1e9,
                      assignments=["training.global_batch_size=4"])
    (row,) = out["rows"]
    assert row.get("error") is None and row["num_gpus"] == 4 and row["tokens_per_s"] > 0
