"""`simdist schema` documents itself: every field of every input file has a description."""

from __future__ import annotations

import json

import pytest

from simdist import api
from tests.cli_harness import run_cli


def _undocumented(schema: dict) -> list[str]:
    missing = []
    for model, node in [("(top)", schema), *schema.get("$defs", {}).items()]:
        props = node.get("properties", {})
        missing += [f"{model}.{name}" for name, prop in props.items() if not prop.get("description")]
    return missing


@pytest.mark.parametrize("kind", ["scenario", "topology", "calibration"])
def test_every_field_has_a_description(kind):
    schema = api.schema(kind)
    assert _undocumented(schema) == []
    assert sum(len(d.get("properties", {})) for d in schema.get("$defs", {}).values()) > 20


def test_a_field_without_a_description_would_be_found():
    assert _undocumented({"properties": {"a": {"type": "integer"}, "b": {"description": "b"}}}) == ["(top).a"]


def test_bounds_are_in_the_schema():
    topology = api.schema("topology")["$defs"]
    assert topology["InterNodeSpec"]["properties"]["switch_radix"]["minimum"] == 2
    assert topology["HostSpec"]["properties"]["cpu_sockets"]["maximum"] == 16
    assert topology["ScaleUpSpec"]["properties"]["bandwidth"]["x-bounds"] == "at least 1 MB/s, at most 1 PB/s"


def test_simdist_schema_prints_them():
    r = run_cli(["schema", "calibration"])
    assert r.code == 0 and "description" in json.loads(r.out)["properties"]["topology"]
