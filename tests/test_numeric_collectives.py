"""Plans run on real numbers (simdist.collectives.numeric via nb.run_collective_on_data) give what numpy
computes for every op, algorithm and peer count from 2 to 9, and the lecture's four-rank example."""

import numpy as np
import pytest

from simdist import api
from simdist import notebooks as nb
from simdist.collectives.numeric import chunk_indices, run_plan
from simdist.collectives.ring import ring_all_reduce
from simdist.errors import SimdistError, SpecError

OPS = ("all_reduce", "reduce", "broadcast", "reduce_scatter", "all_gather", "scatter", "gather", "all_to_all",
       "send_recv")
SINGLE_NODE = ("ring", "tree", "direct", "halving_doubling", "nvls")
LECTURE = [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]]


def expected(op: str, xs: list[np.ndarray], root: int) -> list[np.ndarray | None]:
    """numpy's answer per rank (None: that rank receives nothing)."""
    p = len(xs)
    total = np.sum(xs, axis=0)
    if op == "all_reduce":
        return [total] * p
    if op == "reduce":
        return [total if r == root else None for r in range(p)]
    if op == "broadcast":
        return [xs[root]] * p
    if op == "reduce_scatter":
        return np.split(total, p)
    if op == "all_gather":
        return [np.concatenate(xs)] * p
    if op == "scatter":
        return np.split(xs[root], p)
    if op == "gather":
        return [np.concatenate(xs) if r == root else None for r in range(p)]
    if op == "all_to_all":
        return [np.concatenate([np.split(x, p)[r] for x in xs]) for r in range(p)]
    if op == "send_recv":
        return [None, xs[0]] + [None] * (p - 2)
    raise AssertionError(op)


def check(op: str, algorithm: str, p: int, rng: np.random.Generator, *, root: int = 0, **where) -> bool:
    """Run and compare; False when the algorithm does not apply (op or group shape)."""
    per_rank = 2 * p if op in ("reduce_scatter", "scatter", "all_to_all") else 5
    xs = [rng.integers(-50, 50, per_rank).astype(float) for _ in range(p)]
    try:
        got = nb.run_collective_on_data(op, [x.tolist() for x in xs], algorithm, root=root, **where)
    except SimdistError as err:
        assert "does not implement" in err.problem, err  # only an op the algorithm lacks may be refused
        return False
    for r, (g, want) in enumerate(zip(got, expected(op, xs, root), strict=True)):
        if want is None:
            assert g == [], (op, algorithm, p, r)
        else:
            np.testing.assert_array_equal(g, want, err_msg=f"{algorithm} {op} P={p} rank {r}")
    return True


@pytest.mark.parametrize("algorithm", SINGLE_NODE)
def test_every_op_on_2_to_9_peers_equals_numpy(algorithm):
    rng = np.random.default_rng(7)
    # 9 peers span two dgx-h100 nodes (8 + 1); NVLS needs one NVLink domain: a GB200 NVL72 rack
    cluster = "gb200-nvl72" if algorithm == "nvls" else "dgx-h100"
    ran = set()
    for p in range(2, 10):
        for op in OPS:
            root = p - 1 if op in ("reduce", "broadcast", "scatter", "gather") else 0
            if check(op, algorithm, p, rng, root=root, cluster=cluster):
                ran.add(op)
    lacks = {"nvls": 6, "halving_doubling": 6, "tree": 6, "ring": 4, "direct": 0}[algorithm]
    assert len(ran) == len(OPS) - lacks


@pytest.mark.parametrize(("p", "per_node"), [(4, 2), (6, 3), (6, 2), (8, 4), (9, 3)])
def test_hierarchical_on_equal_nodes_equals_numpy(p, per_node):
    rng = np.random.default_rng(p)
    cut = [f"gpus_per_node={per_node}", "host.cpu_sockets=1", "host.pcie_switches_per_socket=1",
           f"inter_node.nics_per_node={per_node}"]
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        assert check(op, "hierarchical", p, rng, assignments=cut)
    # the ring and tree on the same multi-node groups too
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        assert check(op, "ring", p, rng, assignments=cut)
    assert check("all_reduce", "tree", p, rng, assignments=cut)


def test_lecture_example_reduce_scatter_then_all_gather():
    pieces = nb.run_collective_on_data("reduce_scatter", LECTURE)
    assert pieces == [[6.0], [10.0], [14.0], [18.0]]
    assert nb.run_collective_on_data("all_gather", pieces) == [[6.0, 10.0, 14.0, 18.0]] * 4
    assert nb.run_collective_on_data("all_reduce", LECTURE) == [[6.0, 10.0, 14.0, 18.0]] * 4


def test_chunks_partition_the_buffer_and_spare_chunks_are_empty():
    plan = ring_all_reduce(4, 16.0, channels=2)  # 8 chunks over 3 values: 5 empty
    idx = chunk_indices(plan, 3)
    assert sorted(np.concatenate(idx).tolist()) == [0, 1, 2] and sum(len(i) == 0 for i in idx) == 5
    out = run_plan(plan, [np.array([1.0, 2, 3])] * 4)
    assert [o.tolist() for o in out] == [[4.0, 8.0, 12.0]] * 4


@pytest.mark.parametrize(("op", "inputs", "field"), [
    ("barrier", [[1.0], [2.0]], "op"),
    ("all_reduce", [[1.0]], "inputs"),
    ("all_reduce", [[1.0, 2.0], [3.0]], "inputs"),
    ("reduce_scatter", [[1.0, 2.0, 3.0]] * 2, "inputs"),
    ("all_reduce", [[1.0, float("nan")]] * 2, "inputs"),
    ("all_reduce", [["a"], ["b"]], "inputs"),
])
def test_bad_inputs_are_user_errors(op, inputs, field):
    with pytest.raises(SpecError) as err:
        nb.run_collective_on_data(op, inputs)
    assert err.value.field == field and err.value.fix


def test_unknown_op_and_inapplicable_algorithm_are_user_errors():
    with pytest.raises(SimdistError, match="unknown collective"):
        nb.run_collective_on_data("all_sum", LECTURE)
    with pytest.raises(SimdistError, match="nvls"):
        nb.run_collective_on_data("all_reduce", LECTURE, "nvls", cluster="dgx-a100")


def test_lecture_mlp_spec_runs_and_shows_the_384_kib_all_gather():
    out = nb.run_spec(nb.lecture_mlp_spec(tp=4))
    gathers = [c for c in out.result["collectives"] if c["op"] == "all_gather"]
    # column-parallel TP: one all-gather of the 128 x 1024 fp32 activation (512 KiB) per layer forward;
    # a ring rank sends 3/4 of it: 384 KiB (Stanford CS336 Spring 2025 lecture 8, lecture_08.py, tensor parallelism)
    assert gathers and gathers[0]["nbytes"] == 128 * 1024 * 4 and gathers[0]["count"] == 4
    row = api.collective("dgx-h100", "all_gather", 4, [gathers[0]["nbytes"]], algorithm="ring")[0]
    assert row.max_bytes_sent_per_rank == 384 * 2**10
    assert out.result["layout"]["tp"] == 4 and out.result["step_time_s"] > 0


def test_lecture_mlp_spec_bad_split_and_run_spec_bad_input():
    with pytest.raises(SpecError, match="does not split"):
        nb.lecture_mlp_spec(dp=3)
    with pytest.raises(SpecError):
        nb.run_spec(["not", "a", "dict"])  # type: ignore[arg-type]
    spec = nb.lecture_mlp_spec(dp=2)
    spec["parallel"]["dp"] = 4  # 4 ranks on a 2-GPU cluster
    with pytest.raises(SimdistError, match="parallel"):
        nb.run_spec(spec)
