"""Hybrid sharding (HSDP: parallel.dp_shard): ZeRO-3 / FSDP shards inside groups of dp_shard data-parallel ranks and
all-reduces each reduced shard over its replicas (simdist.plan.mesh's dps and dpr, simdist.plan.fsdp.replica_reduce)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist import api
from simdist.errors import SimdistError
from simdist.plan.chunk_cost import chunk_cost
from simdist.plan.layout import step_config_of
from simdist.plan.mesh import Mesh
from simdist.plan.model_presets import resolve_model
from simdist.plan.recipe import step_recipe
from simdist.predict.step import predict_step
from tests.conftest import TOY_TOPOLOGY

SCENARIO = f"""
cluster: {{file: {TOY_TOPOLOGY}, num_nodes: 2}}
model: {{num_layers: 4, hidden_size: 1024, num_attention_heads: 8, seq_length: 1024, vocab_size: 4096, swiglu: true}}
parallel: {{dp: 8, zero_stage: 3, dp_shard: 4}}
training: {{micro_batch_size: 1, global_batch_size: 16, zero3_fetch: per_layer}}
"""


def test_shard_and_replica_groups():
    mesh = Mesh(tp=2, cp=1, dp=8, dp_shard=4)
    assert mesh.group("dps", 0) == (0, 2, 4, 6) and mesh.group("dps", 9) == (9, 11, 13, 15)
    assert mesh.group("dpr", 2) == (2, 10)
    assert mesh.size("dps") == 4 and mesh.size("dpr") == 2
    with_cp = Mesh(tp=2, cp=2, dp=4, dp_shard=2)
    assert with_cp.group("dps_cp", 0) == (0, 2, 4, 6)  # cp, then the shard group's dp ranks
    assert Mesh(dp=8).size("dps") == 8 and Mesh(dp=8).size("dpr") == 1


def _file(tmp_path: Path, text: str = SCENARIO) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


def _load(tmp_path: Path, text: str = SCENARIO):
    return api.load_scenario(_file(tmp_path, text))


def test_the_shards_reduce_over_the_node_then_all_reduce_over_the_replicas(tmp_path):
    s = _load(tmp_path)
    cfg = step_config_of(s.spec, s.topology, resolve_model(s.spec.model))
    cost = chunk_cost(cfg, cfg.part_layers(0), True, True)
    pieces = step_recipe(cfg, cost, "B").pieces
    scatters = [p for p in pieces if p.comm and p.comm.op == "reduce_scatter"]
    reduces = [p for p in pieces if p.comm and p.comm.op == "all_reduce"]
    assert {p.comm.axis for p in scatters} == {"dps"} and {p.comm.axis for p in reduces} == {"dpr"}
    # each all-reduce moves the shard its reduce-scatter left: 1 / dp_shard of the bytes
    assert sum(p.comm.nbytes for p in reduces) == pytest.approx(sum(p.comm.nbytes for p in scatters) / 4)
    gathers = [p for p in step_recipe(cfg, cost, "F").pieces if p.comm and p.comm.op == "all_gather"]
    assert {p.comm.axis for p in gathers} == {"dps"}


def test_the_reduced_graph_equals_every_rank(tmp_path):
    s = _load(tmp_path)
    reduced = predict_step(s.spec, s.topology, simulate="representatives")
    full = predict_step(s.spec, s.topology, simulate="full")
    assert reduced.result["step_time_s"] == pytest.approx(full.result["step_time_s"], rel=1e-9)


def test_the_shards_are_the_shard_groups(tmp_path):
    hsdp = api.run(_file(tmp_path)).result["memory"][0]
    (tmp_path / "f.yaml").write_text(SCENARIO.replace(", dp_shard: 4", ""))
    fsdp = api.run(tmp_path / "f.yaml").result["memory"][0]
    # optimizer state sharded over 4 ranks instead of 8: twice as much
    assert hsdp["optimizer_bytes"] == pytest.approx(2 * fsdp["optimizer_bytes"], rel=1e-9)


def test_hybrid_sharding_needs_zero3(tmp_path):
    with pytest.raises(SimdistError) as err:
        api.run(_file(tmp_path, SCENARIO.replace("zero_stage: 3", "zero_stage: 1")))
    assert err.value.field == "parallel.dp_shard"


def test_torchtitan_and_fsdp_names(tmp_path):
    from simdist.spec import ParallelSpec

    p = ParallelSpec.model_validate({"data_parallel_shard_degree": 4, "data_parallel_replicate_degree": 2})
    assert (p.dp, p.dp_shard) == (8, 4)
    with pytest.raises(ValueError):
        ParallelSpec.model_validate({"dp": 8, "sharding_strategy": "HYBRID_SHARD"})
    h = ParallelSpec.model_validate({"dp": 8, "dp_shard": 4, "sharding_strategy": "HYBRID_SHARD"})
    assert h.zero_stage == 3 and h.dp_shard == 4
