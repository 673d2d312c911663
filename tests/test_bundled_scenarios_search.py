"""Every bundled scenario works with `simdist search` and `simdist compare` (issue 32).

A search over a scenario keeps its cluster as `simdist run` builds it (its ``cluster.placement``, its failed links:
simdist.predict.cluster) and its Megatron-LM ``pipeline_layout`` where a candidate has its part count; compare
sizes a rack-scale cluster by part of each rack where the GPUs split evenly (simdist.search.compare.size_cluster).
The spaces are narrowed (no interleaving, micro-batch 1, no context parallelism) so that each search takes a second
or a few; what is checked is that each is accepted and ranks a layout, its placements included.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

SCENARIOS = sorted(Path("scenarios").glob("*.yaml"))


@pytest.mark.slow
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_search_accepts_every_bundled_scenario(cli, path):
    code, out, err = cli("search", str(path), "--top", "0", "--max-vpp", "1", "--max-micro-batch", "1", "--max-cp",
                         "1", "--schedules", "1f1b", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["ranked"], f"{path}: no layout ranked"


@pytest.mark.slow
@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_compare_accepts_every_bundled_scenario(cli, path):
    cluster = yaml.safe_load(path.read_text())["cluster"]
    name = cluster.get("preset") or cluster["file"]
    code, out, err = cli("compare", str(path), "--clusters", name, "--gpus", "64", "--tokens", "1e9", "--max-vpp", "1",
                         "--max-micro-batch", "1", "--max-cp", "1", "--schedules", "1f1b", "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert len(rows) == 1 and rows[0]["cluster"] == name
    # a layout, or the reason there is none (the 405B models need more than 64 GPUs' memory)
    assert "layout" in rows[0] or "memory" in rows[0]["error"]


def test_a_rack_is_used_in_part_where_the_gpus_split_evenly():
    from simdist.search.compare import size_cluster

    part = size_cluster("gb200-nvl72", 256)
    assert (part.num_nodes, part.num_gpus, part.gpus_used_per_node) == (4, 256, 64)
    assert "64 of the 72 on each of 4 node(s)" in part.note
    whole = size_cluster("dgx-h100", 260)  # 8-GPU servers are taken whole
    assert (whole.num_nodes, whole.num_gpus, whole.gpus_used_per_node) == (33, 264, 0)
    odd = size_cluster("gb200-nvl72", 145)  # 145 GPUs do not split evenly over 3 racks: whole racks
    assert (odd.num_nodes, odd.num_gpus, odd.gpus_used_per_node) == (3, 216, 0)
