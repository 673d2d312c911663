"""Fuzzing every surface: the spec schemas (scenario, topology), the arguments of every command (budgets and grids
included), faults, calibration files, report.json files, NCCL topology dumps and the validation harnesses' arguments
(each harness's main, stopped where it would start measuring).

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


# --------------------------------------------------------------------------- faults, calibrations, report.json, dumps
NODE_NAMES = st.one_of(st.sampled_from(["leaf0", "leaf1", "spine0", "spine\u00b9", "n0/nic0", "n1/nic0", "n0/gpu0",
                                        "n99/nic0", "leaf-1", "", "leaf0 ", "LEAF0"]), TEXT)
GPU_NAMES = st.one_of(st.sampled_from(["h100-sxm", "b200", "a100-sxm-80gb", "cpu-core", "nope", ""]), TEXT)
FAULTS = st.fixed_dictionaries({}, optional={
    "stragglers": st.lists(st.fixed_dictionaries({}, optional={"rank": INTS, "slower_by": FLOATS}), max_size=2),
    "degraded_links": st.lists(st.fixed_dictionaries({}, optional={
        "src": NODE_NAMES, "dst": NODE_NAMES, "bandwidth_fraction": FLOATS}), max_size=2),
    "failed_links": st.lists(st.fixed_dictionaries({}, optional={"src": NODE_NAMES, "dst": NODE_NAMES}), max_size=3),
    "heterogeneous_nodes": st.lists(st.fixed_dictionaries({}, optional={
        "nodes": st.lists(INTS, max_size=3), "gpu": GPU_NAMES}), max_size=2),
    "checkpoint": st.fixed_dictionaries({}, optional={k: st.one_of(UNIT_STRINGS, ANY)
                                                       for k in ("write", "interval", "restart")}),
    "bogus": ANY})
TWO_NODES = {**TINY, "cluster": {"preset": "dgx-a100", "num_nodes": 2}, "parallel": {"tp": 2, "pp": 2, "dp": 4},
             "training": {"global_batch_size": 8, "micro_batch_size": 1}}


@_settings(25)
@given(faults=FAULTS, fidelity=st.sampled_from(["engine", "closed_form"]))
def test_fuzz_faults(tmp_path_factory, faults, fidelity):
    folder = _fresh(tmp_path_factory)
    (folder / "s.yaml").write_text(_dump({**TWO_NODES, "faults": faults}), encoding="utf-8")
    _check(["run", "s.yaml", "--fidelity", fidelity, "--json"], folder, inputs={"s.yaml"}, name="faults")


def _calibration_leaves() -> list[tuple[tuple, dict]]:
    from simdist.spec.calibration import CalibrationSpec, CollectiveCalibration, ComputeCalibration

    out = []
    for prefix, model in (((), CalibrationSpec), (("collectives", "all_reduce"), CollectiveCalibration),
                          (("compute",), ComputeCalibration)):
        schema = model.model_json_schema()
        out += [((*prefix, *path), leaf) for path, leaf in _leaves(schema, schema.get("$defs", {}))]
    return [*out, (("collectives", "nope"), {}), (("overrides", "gpu"), {}),
            (("overrides", "scale_up", "bandwidth"), {})]


CALIBRATION = {"topology": "dgx-a100", "gpu": "NVIDIA A100-SXM4-80GB", "num_nodes": 1,
               "overrides": {"scale_up": {"efficiency": 0.8}},
               "collectives": {"all_reduce": {"latency": "10 us", "bandwidth_factor": 0.9,
                                              "size_range": ["1 KiB", "1 GiB"], "above_range_factor": 0.95}},
               "compute": {"gemm_peak_efficiency": 0.7, "launch_overhead": "5 us"}}


@_settings(25)
@given(mutations=_mutations(_calibration_leaves()), command=st.sampled_from(["run", "check"]))
def test_fuzz_calibration_files(tmp_path_factory, mutations, command):
    folder = _fresh(tmp_path_factory)
    (folder / "s.yaml").write_text(_dump(TINY), encoding="utf-8")
    (folder / "cal.yaml").write_text(_dump(_apply(CALIBRATION, mutations)), encoding="utf-8")
    argv = [command, "s.yaml", "--calibration", "cal.yaml", "--json"] if command == "run" else [
        "check", "s.yaml", "--set", "calibration=cal.yaml", "--json"]
    _check(argv, folder, inputs={"s.yaml", "cal.yaml"}, name="calibration")


@pytest.fixture(scope="module")
def report_json(tmp_path_factory) -> dict:
    """A report.json of the tiny scenario (``simdist run --out``), as JSON."""
    folder = tmp_path_factory.mktemp("report")
    (folder / "s.yaml").write_text(_dump(TINY), encoding="utf-8")
    assert run_cli(["run", "s.yaml", "--fidelity", "closed_form", "--out", "out"], cwd=folder).code == 0
    return json.loads((folder / "out" / "report.json").read_text())


REPORT_EDITS = st.sampled_from(["truncate", "5000 digits", "not a scenario", "list", "drop key", "nan"])


@_settings(20)
@given(mutations=_mutations(SCENARIO_LEAVES), edit=st.one_of(st.none(), REPORT_EDITS), cut=st.floats(0.0, 1.0))
def test_fuzz_report_json(tmp_path_factory, report_json, mutations, edit, cut):
    folder = _fresh(tmp_path_factory)
    doc = copy.deepcopy(report_json)
    doc["scenario_resolved"] = _apply(doc["scenario_resolved"], mutations)
    if edit == "not a scenario":
        doc["scenario_resolved"] = [1, 2]
    elif edit == "list":
        doc = [doc]
    elif edit == "drop key":
        doc.pop("scenario_resolved")
    text = json.dumps(doc, default=str)
    if edit == "truncate":
        text = text[:int(len(text) * cut)]
    elif edit == "5000 digits":
        text = text.replace('"tp": ', '"tp": ' + "9" * 5000, 1)
    elif edit == "nan":
        text = text.replace('"step_time_s": ', '"step_time_s": NaN, "x": ', 1)
    (folder / "report.json").write_text(text, encoding="utf-8")
    _check(["run", "report.json", "--json"], folder, inputs={"report.json"}, name="report.json")


DUMP = (REPO / "tests" / "data" / "machines" / "dgx-h100.nccl-topo.xml").read_text()
DUMP_ATTRIBUTES = ("sm", "count", "link_speed", "link_width", "speed", "dev", "busid", "target", "tclass", "class",
                   "familyid", "modelid", "vendor", "arch")


@st.composite
def dump_text(draw) -> str:
    """The NCCL dump with a few edits: an attribute's value replaced, a line dropped or doubled, the text cut."""
    lines = DUMP.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        if not lines:
            break
        how = draw(st.sampled_from(["attribute", "drop", "double", "cut", "element"]))
        i = draw(st.integers(0, len(lines) - 1))
        if how == "attribute":
            name = draw(st.sampled_from(DUMP_ATTRIBUTES))
            value = draw(st.one_of(NUM, TEXT)).replace('"', "'").replace("&", "").replace("<", "")
            lines = [ln.replace(f' {name}="', f' {name}="{value}" x{name}="', 1) if k == i else ln
                     for k, ln in enumerate(lines)]
        elif how == "drop":
            del lines[i]
        elif how == "double":
            lines.insert(i, lines[i])
        elif how == "cut":
            lines = lines[:i]
        else:
            lines.insert(i, draw(st.sampled_from(["<gpu dev='9' sm='90'/>", "<nic/>", "<pci/>", "<bogus>", "</cpu>",
                                                 "<cpu><pci busid='x'><gpu dev='0'/></pci></cpu>"])))
    return "\n".join(lines)


@_settings(25)
@given(text=dump_text())
def test_fuzz_topology_dumps(tmp_path_factory, text):
    folder = _fresh(tmp_path_factory)
    (folder / "dump.xml").write_text(text, encoding="utf-8")
    _check(["topo", "import", "dump.xml", "--out", "node.yaml"], folder, inputs={"dump.xml"}, name="topo dump")


# --------------------------------------------------------------------------- every command's arguments
NUM = st.one_of(INTS, FLOATS, TEXT).map(str)
SIZES = st.one_of(st.sampled_from(["1:1G:+1", "8:8G:xabc", "8:8G:x", "1:4096:+1", "", "-1", "1e400", "8:4:x2", "0",
                                   "1T", "1:2", ",,"]), TEXT)
FILES = st.sampled_from(["missing.yaml", ".", "/dev/null", "/dev/zero", "in.yaml", "bad.yaml",
                         str(REPO / "topologies" / "dgx-h100.yaml")])
OUT = st.sampled_from(["out.html", "sub/dir/out.html", ".", "in.yaml/x.html", "out", "fifo"])
BAD_OUT = st.sampled_from([".", "in.yaml/x.html", "fifo", "in.yaml"])
PRESETS = st.sampled_from(["dgx-a100", "dgx-h100", "gb200-nvl72", "pcie-gen4-8gpu", "hgx-h200", "dgx-b200"])
SETS = st.builds(lambda p, v: f"{'.'.join(p)}={v}", st.sampled_from([p for p, _ in TOPOLOGY_LEAVES]),
                 st.one_of(NUM, UNIT_STRINGS))
JSON = st.sampled_from(["--json", None])
GRID_ITEMS = st.builds(lambda p, vs: f"{'.'.join(p)}={','.join(vs)}", st.sampled_from([p for p, _ in SCENARIO_LEAVES]),
                       st.lists(st.one_of(NUM, UNIT_STRINGS), min_size=1, max_size=3))


def _c(*values: object) -> st.SearchStrategy:
    return st.sampled_from([str(v) for v in values])


# Each command: its base arguments (valid), and per option a strategy of valid values and one of hostile ones.
# A case gives some options valid values and at most two hostile ones, so that cases reach past the first check.
COMMANDS: dict[str, tuple[list[str], dict[str, tuple[st.SearchStrategy, st.SearchStrategy]]]] = {
    "topo show": (["topo", "show", "dgx-h100"], {
        "--num-nodes": (_c(1, 2, 16, 131072), st.one_of(_c(0, -1, 1000000000, "1e3", "x", 131073), NUM)),
        "--set": (_c("inter_node.kind=roce", "inter_node.oversubscription=2", "inter_node.fabric=fat_tree"), SETS),
        "--html": (_c("out.html", "sub/dir/t.html"), BAD_OUT), "--json": (JSON, JSON)}),
    "topo show FILE": (["topo", "show", "dgx-a100"], {
        "": (st.sampled_from([str(REPO / "topologies" / f"{n}.yaml") for n in ("dgx-a100", "pcie-gen5-8gpu")]),
             st.one_of(FILES, PRESETS.map(lambda n: n + "x"))), "--json": (JSON, JSON)}),
    "bubble": (["bubble", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8"], {
        "--schedule": (_c("gpipe", "1f1b", "zb_h1"), _c("x", "", "interleaved_1f1b")),
        "--stages": (_c(1, 2, 4, 8), st.one_of(_c(0, -1, 100000, 4097), NUM)),
        "--microbatches": (_c(1, 4, 8, 16, 100000000), st.one_of(_c(0, -3, 2**40 + 1, 10**30), NUM)),
        "--virtual": (_c(1), st.one_of(_c(0, 2, 5000), NUM)),
        "--forward-time": (_c(0.5, 1, 2), NUM), "--backward-time": (_c(1, 2, 3), NUM), "--p2p-time": (_c(0, 0.1), NUM),
        "--sweep-microbatches": (_c("1:8", "2,4,8", "4:64:4"),
                                 _c("1:100000000", "8:1", "1,2,x", "0:4", "1:8:0", "a:b", "", "1:3000")),
        "--html": (_c("b.html"), BAD_OUT), "--json": (JSON, JSON)}),
    "bubble interleaved": (["bubble", "--schedule", "interleaved_1f1b", "--stages", "4", "--microbatches", "8",
                            "--virtual", "2"], {
        "--stages": (_c(2, 4), NUM), "--microbatches": (_c(8, 16, 100000000), NUM), "--virtual": (_c(2, 3), NUM),
        "--stage-times": (_c("1,1,1,1", "1,2"), st.one_of(_c("1,nan", "1,,2", "a", "0,1", "1e400,1"), TEXT)),
        "--json": (JSON, JSON)}),
    "schedule": (["schedule", "--schedule", "1f1b", "--stages", "4", "--microbatches", "8"], {
        "--schedule": (_c("gpipe", "1f1b", "zb_h1"), _c("x", "")), "--stages": (_c(1, 2, 4), _c(0, 100000, "x")),
        "--microbatches": (_c(1, 4, 8), _c(0, 10000, -1, "1.5")), "--virtual": (_c(1), NUM)}),
    "collective": (["collective", "--cluster", "dgx-h100", "--op", "all_reduce", "--ranks", "8", "--bytes", "1M"], {
        "--cluster": (PRESETS, st.one_of(_c("nope", "", "in.yaml", "/dev/zero"), TEXT)),
        "--op": (_c("all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv", "barrier", "reduce"),
                 _c("nope", "", "ALL_REDUCE")),
        "--ranks": (_c(2, 4, 8, 16), st.one_of(_c(0, 1, -8, 1000000000, 9, "1e3"), NUM)),
        "--bytes": (_c("1M", "1K:1M:x4", "8,1G", "1M:4M:+1M"), SIZES),
        "--algorithm": (_c("auto", "ring", "tree", "direct", "ring,auto"), _c("", ",", "nope", "nvls", "hierarchical")),
        "--protocol": (_c("auto", "LL", "LL128", "Simple"), _c("x", "ll")),
        "--fidelity": (_c("auto", "detailed", "fast"), _c("x", "")),
        "--num-nodes": (_c(1, 2), _c(0, -1, 10**12, 200000, "x")), "--root": (_c(0, 1), st.one_of(_c(-1, 64), NUM)),
        "--compare": (_c(REPO / "tests" / "data" / "all_reduce_perf_a100x8.txt"),
                      _c("missing.csv", "in.yaml", "/dev/null", ".")),
        "--calibration": (FILES, FILES),
        "--html": (_c("c.html"), BAD_OUT), "--json": (JSON, JSON)}),
    # search and compare: a base space a quarter of the default's (--schedules 1f1b: the default adds interleaved_1f1b,
    # whose layouts take most of a search's time; --max-cp 1 --max-micro-batch 2), so that the cases that search all
    # of it (a huge --rows) take seconds; a case that draws one of these options searches what it draws instead.
    "search": (["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--global-batch", "8",
                "--schedules", "1f1b", "--max-cp", "1", "--max-micro-batch", "2"], {
        "--gpus": (_c(8, 16), st.one_of(_c(0, 7, 10000000, -8), NUM)),
        "--global-batch": (_c(8, 16, 64), st.one_of(_c(0, "1e9", 16777217), NUM)),
        "--seq": (_c(1024, 4096), st.one_of(_c(0, -1, 10**9), NUM)),
        "--max-tp": (_c(1, 2, 8), NUM), "--max-pp": (_c(1, 4), NUM), "--max-vpp": (_c(2, 3), st.one_of(_c(5000), NUM)),
        "--max-cp": (_c(1, 2), _c(0, 10**7)), "--max-micro-batch": (_c(1, 4), _c(0, 10**9)),
        "--schedules": (_c("1f1b", "gpipe,zb_h1", "interleaved_1f1b"), _c("", "x", ",")),
        "--zero3-fetch": (_c("prefetch", "per_parameter"), _c("x")),
        "--top": (_c(0, 1), st.one_of(_c(-1, 65, 10**6), NUM)), "--workers": (_c(1), _c(0, -1, 100000)),
        "--rows": (_c(0, 3), NUM), "--out": (_c("r.jsonl"), BAD_OUT), "--resume": (_c("r.jsonl"), FILES),
        "--html": (_c("s.html"), BAD_OUT), "--precision": (_c("bf16", "fp8"), _c("fp4", "")),
        "--explain-pruned": (_c(None), _c(None)), "--json": (JSON, JSON)}),
    "compare": (["compare", "--model", "llama3-8b", "--clusters", "dgx-h100", "--gpus", "8", "--tokens", "1e9",
                 "--global-batch", "8", "--schedules", "1f1b", "--max-cp", "1", "--max-micro-batch", "2"], {
        "--schedules": (_c("1f1b", "gpipe,zb_h1", "interleaved_1f1b"), _c("", "x", ",", "1f1b,,gpipe")),
        "--clusters": (_c("dgx-h100,dgx-a100", "gb200-nvl72"), _c("", "nope", ",", "cpu-loopback")),
        "--gpus": (_c(8, 16), st.one_of(_c(0, -8), NUM)),
        "--tokens": (_c("1e9", "300e9", "1e-300"), st.one_of(_c("nan", "inf", "0", "-1", "1e400", "1e19"), NUM)),
        "--pue": (_c(1, 1.2), NUM), "--price": (_c("dgx-h100=2.5"), _c("dgx-h100=nan", "x=1", "dgx-h100", "=",
                                                                       "dgx-h100=-1", "dgx-h100=1e400")),
        "--html": (_c("c.html"), BAD_OUT), "--json": (JSON, JSON)}),
    # budgets size the clusters (each size a search): 20 kW buys 3 nodes of dgx-h100, 24 GPUs, a global batch of 48
    "compare budget": (["compare", "--model", "llama3-8b", "--cluster", "dgx-h100", "--tokens", "1e9",
                        "--global-batch", "48", "--schedules", "1f1b", "--max-cp", "1", "--max-micro-batch", "2",
                        "--max-pp", "1", "--budget-kw", "20"], {
        "--budget-kw": (_c(6, 20), st.one_of(_c(0, -1, "nan", "inf", "1e400", "1e9", "x", ""), NUM)),
        "--budget-usd-per-hour": (_c(100), st.one_of(_c(0, "nan", "1e12", "-5"), NUM)),
        "--price": (_c("dgx-h100=2.5"), _c("dgx-h100=0", "dgx-h100=nan", "dgx-a100=1", "dgx-h100=1e400")),
        "--days": (_c("1e9"), st.one_of(_c(0, -1, "nan", "inf", "1e-300"), NUM)),
        "--pue": (_c(1.2), NUM), "--json": (JSON, JSON)}),
    "search grid": (["search", "in.yaml", "--grid", "training.micro_batch_size=1,2", "--schedules", "1f1b",
                     "--max-cp", "1", "--max-micro-batch", "2", "--max-pp", "2", "--top", "0"], {
        "--grid": (_c("training.recompute=none,full", "schedule=1f1b,gpipe", "training.micro_batch_size=1"),
                   st.one_of(_c("", "=", "x=1,2", "training.micro_batch_size=", "training.micro_batch_size=0,-1",
                                "training.micro_batch_size=1,,2", "model.num_layers=1e400", "a.b.c=1",
                                "training.recompute=\x1b[31m", "training.micro_batch_size=" + ",".join(
                                    str(i) for i in range(1, 200))), GRID_ITEMS)),
        "--out": (_c("g.jsonl"), BAD_OUT), "--json": (JSON, JSON)}),
    "check/run": (["run", "in.yaml"], {
        "": (_c("in.yaml"), FILES), "--set": (_c("training.global_batch_size=16", "parallel.order=tp-dp-cp-pp",
                                                 "schedule=gpipe", "training.recompute=full"),
                                              st.builds(lambda p, v: f"{'.'.join(p)}={v}",
                                                        st.sampled_from([p for p, _ in SCENARIO_LEAVES]),
                                                        st.one_of(NUM, UNIT_STRINGS))),
        "--simulate": (_c("auto", "full", "representatives"), _c("x", "")),
        "--out": (_c("out", "sub/out"), BAD_OUT), "--strict": (_c(None), _c(None)), "--json": (JSON, JSON)}),
    "calibrate": (["calibrate", str(REPO / "tests" / "data" / "all_reduce_perf_a100x8.txt"), "--topology",
                   "dgx-a100"], {
        "": (_c(REPO / "tests" / "data" / "all_reduce_perf_a100x8.json"), FILES),
        "--topology": (_c("dgx-a100"), st.one_of(_c("nope", ""), TEXT)), "--holdout": (_c("sizes", "large", "none"),
                                                                                      _c("x", "")),
        "--num-nodes": (_c(1), _c(0, -1, 10**12)), "--seed": (_c(0, 7), _c(-1, "x", 10**400)),
        "--out": (_c("cal.yaml"), BAD_OUT), "--json": (JSON, JSON)}),
    "other": (["schema", "scenario"], {"": (_c("topology", "calibration"), _c("x", "", "Scenario")),
                                       "--json": (_c(None), _c("--nope"))}),
}
OTHER = [["assumptions", "--json"], ["topo", "list"], ["topo", "gpus", "--json"], ["topo"], [], ["--help"], ["nope"],
         ["run", "--nope"], ["validate", "x.csv"], ["check"], ["topo", "show"], ["schema"]]


POSITIONAL = {"topo show FILE": 2, "check/run": 1, "calibrate": 1, "other": 1, "search grid": 1}


@st.composite
def command_case(draw, name: str) -> list[str]:
    base, options = COMMANDS[name]
    names = sorted(options)
    given_ = draw(st.lists(st.sampled_from(names), unique=True, max_size=4))
    hostile = set(draw(st.lists(st.sampled_from(names), unique=True, max_size=2)))
    argv = list(base)
    for option in sorted(set(given_) | hostile):
        valid, bad = options[option]
        value = draw(bad if option in hostile else valid)
        if option == "":  # a positional: replaces the base's
            argv[POSITIONAL[name]] = value
        elif value in (None, "None"):
            argv.append(option) if option not in ("--json",) else None
        elif option == "--json":
            argv.append("--json")
        else:
            if option in argv:  # replace the base's value
                i = argv.index(option)
                del argv[i:i + 2]
            argv += [option, value]
    if name == "check/run" and draw(st.booleans()):
        argv[0] = "check"
    return argv


def _check_in_case_folder(argv: list[str], folder: Path, name: str) -> None:
    (folder / "in.yaml").write_text(yaml.safe_dump(TINY), encoding="utf-8")
    (folder / "bad.yaml").write_text("a: &a [1, 2]\nb: [*a, *a]\na: 3\n", encoding="utf-8")
    os.mkfifo(folder / "fifo")
    _check(argv, folder, inputs={"in.yaml", "bad.yaml", "fifo"}, name=f"cli {name}")


# Each command its own cases (13 for each of the 13: 169, and the 12 fixed command lines once each: 181 in all), so
# that no command is left to the luck of one shared draw.
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COMMANDS))
@_settings(13)
@given(data=st.data())
def test_fuzz_command_arguments(tmp_path_factory, name, data):
    argv = data.draw(command_case(name), label="argv")
    _check_in_case_folder(argv, _fresh(tmp_path_factory), name)


@pytest.mark.parametrize("argv", OTHER, ids=lambda argv: " ".join(argv) or "(no arguments)")
def test_other_command_lines(tmp_path_factory, argv):
    _check_in_case_folder(argv, _fresh(tmp_path_factory), "misc")


# --------------------------------------------------------------------------- the harnesses' arguments
class _Measuring(Exception):
    """A harness got past its argument checks to the measurement (stopped there: the fuzz checks the arguments)."""


HARNESSES = {  # module: (its main's module, the function that starts measuring, its options)
    "kernels": ("validation.kernels.__main__", "measure",
                ["--device", "--dtype", "--scenario", "--gemm-sizes", "--attention", "--memory-sizes", "--norm-width",
                 "--max-flops", "--quick", "--warmup", "--iters", "--out", "--timeout"]),
    "collectives": ("validation.collectives", "benchmark",
                    ["--backend", "--ranks", "--bytes", "--ops", "--warmup", "--iters", "--out", "--samples",
                     "--timeout"]),
    "mlp": ("validation.mlp.__main__", "run_steps",
            ["--backend", "--ranks", "--cuts", "--width", "--layers", "--batch", "--microbatches", "--batch-split",
             "--bucket-mb", "--lr", "--seed", "--warmup", "--iters", "--out", "--check", "--tolerance", "--timeout"]),
    "moe": ("validation.moe.__main__", "run_moe",
            ["--backend", "--ranks", "--experts", "--topk", "--hidden", "--ffn", "--tokens", "--imbalance",
             "--no-check", "--tolerance", "--time-tokens", "--dtype", "--warmup", "--iters", "--seed", "--out",
             "--kernels-out", "--timeout"]),
    "loop": ("validation.loop", "measure", ["--backend", "--ranks", "--out-dir", "--quick", "--ops", "--iters"]),
}
HARNESS_VALUES = st.one_of(NUM, SIZES, _c("cpu", "cuda", "gloo", "nccl", "fp32", "bf16", "all_reduce,all_gather", "x",
                                          ".", "out.csv", "fifo", "/dev/full", "single,tensor_parallel", "1,4,64,32"))


@pytest.mark.parametrize("harness", sorted(HARNESSES))
@_settings(12)
@given(data=st.data())
def test_fuzz_harness_arguments(tmp_path_factory, monkeypatch, capsys, harness, data):
    pytest.importorskip("torch")
    import importlib

    from validation.harness_cli import cli_guard

    module_name, starts, options = HARNESSES[harness]
    module = importlib.import_module(module_name)

    def measuring(*args, **kwargs):
        raise _Measuring

    monkeypatch.setattr(module, starts, measuring)
    argv: list[str] = []
    for option in data.draw(st.lists(st.sampled_from(options), max_size=4), label="options"):
        argv += [option, data.draw(HARNESS_VALUES, label=option)]
    folder = _fresh(tmp_path_factory)
    os.mkfifo(folder / "fifo")
    monkeypatch.chdir(folder)
    capsys.readouterr()
    try:
        code = cli_guard(module.main, argv)
    except _Measuring:  # valid arguments: nothing to refuse
        CASES[f"harness {harness} measuring"] += 1
        return
    err = capsys.readouterr().err
    CASES[f"harness {harness} exit {code}"] += 1
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1, (argv, code, err)
    assert "Traceback" not in err and "usage:" not in err, (argv, err)
    assert {p.name for p in folder.iterdir()} == {"fifo"}, (argv, list(folder.iterdir()))  # nothing written


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
