"""Fuzzing every surface: the spec schemas (scenario, topology) and the arguments of every command.

Each case runs the CLI in this process (tests/cli_harness.py) in a fresh folder with a per-case time limit
enforced by the harness (a hang or unbounded work fails the case; nothing asserts speed) and asserts:
exit 0 or 2; no traceback; on exit 2 exactly one ``error:`` line; with ``--json`` and exit 0, strict JSON;
no temporary file left anywhere, and on exit 2 no file written at all. Identical inputs give byte-identical
JSON across runs and processes.

Values are drawn from the schemas (their types, enums and unit examples) and from a pool of hostile ones:
huge and tiny numbers, negatives, zero, nan, inf, wrong types, unit strings without or with absurd units.
``SIMDIST_FUZZ_SCALE=10`` runs ten times as many cases (``derandomize`` keeps CI's cases fixed).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdist.spec import ScenarioSpec, TopologySpec
from tests.cli_harness import REPO, run_cli

SCALE = float(os.environ.get("SIMDIST_FUZZ_SCALE", "1"))
TIMEOUT_S = 60.0
"""Per-case limit: far above any bounded case, so only a hang or unbounded work reaches it."""
CASES: Counter[str] = Counter()
"""Cases tried per test (printed at the end of the session by conftest's terminal summary, if any)."""


def _settings(examples: int):
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, derandomize=SCALE == 1,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large], database=None)


# --------------------------------------------------------------------------- hostile values
HUGE = [2**31, 2**53 + 1, 2**63, 10**12, 10**30, 10**400]
INTS = st.one_of(st.sampled_from([0, -1, 1, 2, 3, 4, 7, 8, 16, 64, 1000, *HUGE]), st.integers(-10**6, 10**6))
FLOATS = st.one_of(st.sampled_from([0.0, -0.0, -1.5, 0.5, 2.5, 1e-300, 5e-324, 1e300, 1.7976931348623157e308,
                                    float("nan"), float("inf"), float("-inf")]),
                   st.floats(allow_nan=True, allow_infinity=True))
UNITS = ["GB/s", "Gb/s", "B/s", "TB/s", "us", "ms", "s", "ns", "GiB", "B", "MB", "TFLOP/s", "PFLOP/s", "parsecs", ""]
UNIT_STRINGS = st.builds(lambda n, u: f"{n} {u}".strip(),
                         st.sampled_from(["0", "-1", "1", "450", "1e30", "1e-30", "1e400", "nan", "inf", "0.5", "x"]),
                         st.sampled_from(UNITS))
TEXT = st.one_of(st.sampled_from(["", "abc", "null", "~", "[1, 2]", "{a: 1}", "1f1b", "auto", "dgx-h100", "∞",
                                  "x" * 300, "\t", "0x10", "1_000", "yes", "True"]),
                 st.text(max_size=20))
ANY = st.recursive(st.one_of(INTS, FLOATS, TEXT, UNIT_STRINGS, st.booleans(), st.none()),
                   lambda inner: st.one_of(st.lists(inner, max_size=3),
                                           st.dictionaries(st.sampled_from(["a", "tp", "name", "preset"]), inner,
                                                           max_size=2)),
                   max_leaves=6)


# --------------------------------------------------------------------------- the schemas' leaves
def _resolve(node: dict, defs: dict) -> dict:
    if "$ref" in node:
        return defs[node["$ref"].split("/")[-1]]
    for key in ("anyOf", "oneOf"):
        for option in node.get(key, []):
            if "$ref" in option:
                return defs[option["$ref"].split("/")[-1]]
    return node


def _leaves(schema: dict, defs: dict, prefix: tuple = (), depth: int = 0) -> list[tuple[tuple, dict]]:
    out: list[tuple[tuple, dict]] = []
    for name, prop in _resolve(schema, defs).get("properties", {}).items():
        target = _resolve(prop, defs)
        path = (*prefix, name)
        if "properties" in target and depth < 3:
            out += _leaves(target, defs, path, depth + 1)
        out.append((path, prop))
    return out


def _plausible(prop: dict) -> st.SearchStrategy:
    """Values a user might write for this field: its enum, its unit examples, numbers near its bounds."""
    options: list[st.SearchStrategy] = []
    flat = [prop, *prop.get("anyOf", [])]
    for p in flat:
        if "enum" in p or "const" in p:
            options.append(st.sampled_from(p.get("enum", [p.get("const")])))
        if p.get("type") == "integer":
            lo, hi = p.get("minimum", 0), p.get("maximum", 10**6)
            options.append(st.sampled_from(sorted({lo - 1, lo, lo + 1, min(hi, 8), hi, hi + 1})))
        if p.get("type") == "number":
            options.append(st.sampled_from([0.5, 1.0, 2.0, 1e9, 0.0, -1.0]))
        if p.get("type") == "string" and p.get("examples"):
            options.append(UNIT_STRINGS)
            options.append(st.sampled_from(p["examples"]))
        if p.get("type") == "boolean":
            options.append(st.booleans())
    return st.one_of(*options) if options else ANY


TOPOLOGY_SCHEMA = TopologySpec.model_json_schema()
TOPOLOGY_LEAVES = _leaves(TOPOLOGY_SCHEMA, TOPOLOGY_SCHEMA.get("$defs", {}))
SCENARIO_SCHEMA = ScenarioSpec.model_json_schema()
SCENARIO_LEAVES = [(p, s) for p, s in _leaves(SCENARIO_SCHEMA, SCENARIO_SCHEMA.get("$defs", {}))
                   if p[0] != "cluster"] + [(("cluster", *p), s) for p, s in TOPOLOGY_LEAVES if p != ("name",)]


def _mutations(leaves: list[tuple[tuple, dict]]) -> st.SearchStrategy:
    one = st.sampled_from(leaves).flatmap(
        lambda leaf: st.tuples(st.just(leaf[0]), st.one_of(_plausible(leaf[1]), ANY, st.just("<delete>"))))
    return st.lists(one, min_size=1, max_size=3)


def _apply(doc: dict, mutations: list[tuple[tuple, object]]) -> dict:
    out = copy.deepcopy(doc)
    for path, value in mutations:
        node = out
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        if value == "<delete>":
            node.pop(path[-1], None)
        else:
            node[path[-1]] = value
    return out


def _dump(doc: dict) -> str:
    try:
        return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    except (yaml.YAMLError, OverflowError, ValueError):  # e.g. an int too large for the emitter
        return json.dumps(doc, default=str)


# --------------------------------------------------------------------------- the invariants of one case
def _check(argv: list, folder: Path, *, inputs: set[str], name: str) -> None:
    r = run_cli(argv, cwd=folder, timeout_s=TIMEOUT_S)
    CASES[f"{name} exit {r.code}"] += 1
    assert r.code in (0, 2), (argv, r.code, r.err)
    assert "Traceback" not in r.err, (argv, r.err)
    if r.code == 2:
        assert r.one_line_error(), (argv, r.err)
        written = {str(p.relative_to(folder)) for p in folder.rglob("*")} - inputs
        assert not written, (argv, written)  # a refused input writes nothing
    elif "--json" in argv:
        json.loads(r.out, parse_constant=lambda c: pytest.fail(f"{argv}: {c} in JSON"))
    leftovers = [p for p in folder.rglob("*") if p.name.endswith(".tmp")]
    assert not leftovers, (argv, leftovers)


def _fresh(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("case")


TINY = yaml.safe_load("""\
name: tiny
cluster: {preset: dgx-a100, num_nodes: 1}
model: {num_layers: 4, hidden_size: 256, num_attention_heads: 4, seq_length: 128, vocab_size: 1024}
parallel: {tp: 2, pp: 2, dp: 2}
training: {global_batch_size: 8, micro_batch_size: 1}
""")
DGX = yaml.safe_load((REPO / "topologies" / "dgx-a100.yaml").read_text())


@_settings(70)
@given(mutations=_mutations(SCENARIO_LEAVES), command=st.sampled_from(["run", "check"]))
def test_fuzz_scenario_schema(tmp_path_factory, mutations, command):
    folder = _fresh(tmp_path_factory)
    (folder / "s.yaml").write_text(_dump(_apply(TINY, mutations)), encoding="utf-8")
    _check([command, "s.yaml", "--json"], folder, inputs={"s.yaml"}, name="scenario")


@_settings(70)
@given(mutations=_mutations(TOPOLOGY_LEAVES))
def test_fuzz_topology_schema(tmp_path_factory, mutations):
    folder = _fresh(tmp_path_factory)
    (folder / "t.yaml").write_text(_dump(_apply(DGX, mutations)), encoding="utf-8")
    _check(["topo", "show", "t.yaml", "--json"], folder, inputs={"t.yaml"}, name="topology")


# --------------------------------------------------------------------------- every command's arguments
def _flag(name: str, values: st.SearchStrategy, *, required: bool = False) -> st.SearchStrategy:
    given_ = values.map(lambda v: [name, str(v)])
    # a required flag is given three times in four, so that most cases get past the usage check
    return st.one_of(given_, given_, given_, st.just([])) if required else st.one_of(st.just([]), given_)


NUM = st.one_of(INTS, FLOATS, TEXT).map(str)
SIZES = st.one_of(st.sampled_from(["8:8G:x2", "1M", "1M,1G", "1:1G:+1", "8:8G:xabc", "8:8G:x", "1:4096:+1", "",
                                   "-1", "1e400", "8:4:x2", "1K:1M:x1.5", "0", "1T", "1:2", ",,"]), TEXT)
FILES = st.sampled_from(["missing.yaml", ".", "/dev/null", "/dev/zero", str(REPO / "scenarios" / "default.yaml"),
                         str(REPO / "topologies" / "dgx-h100.yaml"), "in.yaml"])
OUT = st.sampled_from(["out.html", "sub/dir/out.html", ".", "in.yaml/x.html", "out"])
PRESETS = st.sampled_from(["dgx-a100", "dgx-h100", "gb200-nvl72", "pcie-gen4-8gpu", "cpu-loopback", "nope", ""])
SETS = st.lists(st.builds(lambda p, v: f"{'.'.join(p)}={v}", st.sampled_from([p for p, _ in TOPOLOGY_LEAVES]),
                          st.one_of(NUM, UNIT_STRINGS)), max_size=2)


SCHEDULES = st.sampled_from(["gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "x"])
MICROBATCHES = st.one_of(st.sampled_from(["1", "4", "8", "16", "100000000"]), NUM)
GRID_MICROBATCHES = st.one_of(st.sampled_from(["1", "4", "8", "10000"]), NUM)
GPUS = st.one_of(st.sampled_from(["8", "16", "0", "7", "10000000"]), NUM)
BATCH = st.one_of(st.sampled_from(["8", "16", "0", "1e9"]), NUM)
CLUSTERS = st.sampled_from(["dgx-h100", "dgx-h100,dgx-a100", "", "nope", ","])
TOKENS = st.one_of(st.sampled_from(["1e9", "nan", "inf", "0", "-1", "1e400"]), NUM)


def _sets(assignments: list[str]) -> list[str]:
    return [x for a in assignments for x in ("--set", a)]


COMMANDS = {
    "topo show": st.tuples(st.one_of(PRESETS, FILES).map(lambda n: ["topo", "show", n]),
                           _flag("--num-nodes", st.one_of(st.sampled_from(["1", "2", "0", "-1", "1000000000", "1e3",
                                                                           "x", "131072"]), NUM)),
                           SETS.map(_sets), _flag("--html", OUT), st.sampled_from([["--json"], []])),
    "bubble": st.tuples(st.just(["bubble"]),
                        _flag("--schedule", SCHEDULES, required=True),
                        _flag("--stages", st.one_of(st.sampled_from(["1", "2", "4", "8"]), NUM), required=True),
                        _flag("--microbatches", MICROBATCHES, required=True),
                        _flag("--virtual", st.one_of(st.sampled_from(["1", "2"]), NUM)),
                        _flag("--forward-time", NUM), _flag("--backward-time", NUM), _flag("--p2p-time", NUM),
                        _flag("--stage-times", st.one_of(st.sampled_from(["1,1,1,1", "1,nan", "1,,2", "a"]), TEXT)),
                        _flag("--sweep-microbatches", st.sampled_from(["1:8", "1:100000000", "8:1", "1,2,x", "0:4",
                                                                       "1:8:0", "4:64:4", "a:b", ""])),
                        _flag("--html", OUT), st.sampled_from([["--json"], []])),
    "schedule": st.tuples(st.just(["schedule"]),
                          _flag("--schedule", SCHEDULES, required=True),
                          _flag("--stages", st.one_of(st.sampled_from(["1", "2", "4", "100000"]), NUM), required=True),
                          _flag("--microbatches", GRID_MICROBATCHES, required=True),
                          _flag("--virtual", NUM)),
    "collective": st.tuples(st.just(["collective"]), _flag("--cluster", PRESETS, required=True),
                            _flag("--op", st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                                           "all_to_all", "send_recv", "barrier", "nope"]),
                                  required=True),
                            _flag("--ranks", st.one_of(st.sampled_from(["1", "2", "8", "16", "64", "0", "-8",
                                                                        "1000000000"]), NUM), required=True),
                            _flag("--bytes", SIZES),
                            _flag("--algorithm", st.sampled_from(["auto", "ring", "tree", "direct", "nvls",
                                                                  "halving_doubling", "hierarchical", "ring,tree",
                                                                  "", ",", "nope"])),
                            _flag("--protocol", st.sampled_from(["auto", "LL", "LL128", "Simple", "x"])),
                            _flag("--fidelity", st.sampled_from(["auto", "detailed", "fast", "x"])),
                            _flag("--num-nodes", st.sampled_from(["1", "2", "8", "0", "-1", "1000000000000"])),
                            _flag("--root", st.one_of(st.sampled_from(["0", "1", "7", "-1", "8"]), NUM)),
                            _flag("--compare", st.sampled_from([str(REPO / "tests" / "data" /
                                                                    "all_reduce_perf_a100x8.txt"), "missing.csv",
                                                                "in.yaml", "/dev/null"])),
                            _flag("--html", OUT), st.sampled_from([["--json"], []])),
    "search": st.tuples(st.just(["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--top", "0"]),
                        _flag("--gpus", GPUS, required=True),
                        _flag("--global-batch", BATCH, required=True),
                        _flag("--seq", st.one_of(st.sampled_from(["0", "2048", "-1", "1000000000"]), NUM)),
                        _flag("--max-tp", NUM), _flag("--max-pp", NUM), _flag("--max-vpp", NUM),
                        _flag("--max-cp", st.sampled_from(["1", "2", "0", "1000000"])),
                        _flag("--max-micro-batch", st.sampled_from(["1", "2", "0", "1000000000"])),
                        _flag("--schedules", st.sampled_from(["1f1b", "gpipe,zb_h1", "", "x"])),
                        _flag("--workers", st.sampled_from(["1", "0", "-1", "100000"])),
                        _flag("--rows", NUM), _flag("--out", OUT), _flag("--html", OUT),
                        st.sampled_from([["--json"], []])),
    "compare": st.tuples(st.just(["compare", "--model", "llama3-8b", "--global-batch", "8"]),
                         _flag("--clusters", CLUSTERS, required=True),
                         _flag("--gpus", st.one_of(st.sampled_from(["8", "0", "-8"]), NUM), required=True),
                         _flag("--tokens", TOKENS, required=True),
                         _flag("--pue", NUM),
                         _flag("--price", st.sampled_from(["dgx-h100=2.5", "dgx-h100=nan", "x=1", "dgx-h100", "=",
                                                           "dgx-h100=-1", "dgx-h100=1e400"])),
                         _flag("--html", OUT), st.sampled_from([["--json"], []])),
    "check/run": st.tuples(st.sampled_from([["check"], ["run"]]), FILES.map(lambda f: [f]), SETS.map(_sets),
                           _flag("--simulate", st.sampled_from(["auto", "full", "representatives", "x"])),
                           _flag("--out", OUT), st.sampled_from([["--json"], []])),
    "schema/assumptions/topo": st.sampled_from([["schema", "scenario"], ["schema", "x"], ["schema"],
                                                ["assumptions", "--json"], ["topo", "list"], ["topo", "gpus", "--json"],
                                                ["topo"], [], ["--help"], ["nope"], ["run", "--nope"]]).map(
        lambda a: (a,)),
    "calibrate/validate": st.tuples(st.sampled_from([["calibrate"], ["validate"]]),
                                    st.lists(FILES, max_size=2),
                                    _flag("--topology", PRESETS, required=True), _flag("--calibration", FILES),
                                    _flag("--holdout", st.sampled_from(["sizes", "large", "ranks", "none", "x"])),
                                    _flag("--num-nodes", NUM), _flag("--out", OUT),
                                    st.sampled_from([["--json"], []])),
}


@_settings(260)
@given(case=st.sampled_from(sorted(COMMANDS)).flatmap(lambda name: st.tuples(st.just(name), COMMANDS[name])))
def test_fuzz_command_arguments(tmp_path_factory, case):
    name, parts = case
    argv = [x for part in parts for x in part]
    folder = _fresh(tmp_path_factory)
    (folder / "in.yaml").write_text(yaml.safe_dump(TINY), encoding="utf-8")
    _check(argv, folder, inputs={"in.yaml"}, name=f"cli {name}")


# --------------------------------------------------------------------------- determinism
DETERMINISTIC = [
    ["run", str(REPO / "scenarios" / "default.yaml"), "--json"],
    ["collective", "--cluster", "dgx-h100", "--num-nodes", "2", "--op", "all_reduce", "--ranks", "16", "--bytes",
     "1K:1G:x8", "--json"],
    ["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8", "--json"],
    ["bubble", "--schedule", "zb_h1", "--stages", "4", "--sweep-microbatches", "1:12", "--json"],
    ["topo", "show", "gb200-nvl72", "--num-nodes", "2", "--json"],
]


@pytest.mark.parametrize("argv", DETERMINISTIC, ids=lambda a: a[0])
def test_identical_inputs_give_byte_identical_json(argv):
    first, second = run_cli(argv), run_cli(argv)
    assert first.code == second.code == 0, first.err
    assert first.out == second.out


def test_identical_json_across_processes_and_hash_seeds():
    argv = [sys.executable, "-m", "simdist", *DETERMINISTIC[0][:-1], "--json"]
    outs = [subprocess.run(argv, capture_output=True, cwd=REPO, timeout=600,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert outs[0] == outs[1] and outs[0] == run_cli(DETERMINISTIC[0]).out.encode()
