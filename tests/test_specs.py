"""Input models: strictness, aliases, overrides, and errors that name file, line, field and fix."""

import pytest
from pydantic import ValidationError

from simdist.errors import SpecError
from simdist.hardware import resolve_topology_spec
from simdist.spec import ParallelSpec, ScenarioSpec, TopologySpec
from simdist.spec.load import apply_overrides, deep_merge, parse_yaml, read_yaml, validate

MINIMAL_SCENARIO = """\
cluster: {preset: dgx-h100}
model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4}
training: {global_batch_size: 8}
"""


def test_specs_are_frozen_and_forbid_extra_fields():
    spec = resolve_topology_spec("dgx-h100")
    with pytest.raises(ValidationError):
        spec.num_nodes = 3  # type: ignore[misc]
    with pytest.raises(ValidationError, match="Extra inputs"):
        TopologySpec.model_validate({**spec.model_dump(mode="json"), "colour": "green"})


def test_topology_spec_round_trips_through_json_with_units():
    spec = resolve_topology_spec("dgx-h100", num_nodes=4)
    dumped = spec.model_dump(mode="json")
    assert dumped["scale_up"]["bandwidth"] == "450 GB/s"
    assert dumped["inter_node"]["nic_bandwidth"] == "50 GB/s"
    assert TopologySpec.model_validate(dumped) == spec


def test_megatron_aliases():
    p = ParallelSpec.model_validate(
        {"tensor_model_parallel_size": 8, "pipeline_model_parallel_size": 4, "data_parallel_size": 2,
         "virtual_pipeline_model_parallel_size": 2, "context_parallel_size": 1}
    )
    assert (p.tp, p.pp, p.dp, p.vpp, p.cp) == (8, 4, 2, 2, 1)
    assert p.world_size == 64


def test_scenario_line_numbers_in_errors():
    doc = parse_yaml(MINIMAL_SCENARIO + "parallel: {tp: 2.5}\n", "s.yaml")
    with pytest.raises(SpecError) as info:
        validate(ScenarioSpec, doc)
    assert str(info.value).startswith("s.yaml:4: parallel.tp:")
    assert "whole number" in str(info.value)


def test_unknown_field_lists_valid_ones():
    doc = parse_yaml(MINIMAL_SCENARIO.replace("global_batch_size: 8", "global_batch_size: 8, lr: 3"), "s.yaml")
    with pytest.raises(SpecError) as info:
        validate(ScenarioSpec, doc)
    text = str(info.value)
    assert text.startswith("s.yaml:3: training.lr: unknown field 'lr'")
    assert "global_batch_size" in text and "micro_batch_size" in text


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ngpu: [a100\nnum_nodes: 2\n")
    with pytest.raises(SpecError) as info:
        read_yaml(path)
    assert f"{path}:3" in str(info.value) and "malformed YAML" in str(info.value)


def test_batch_must_divide():
    # a layout rule (simdist.plan.layout, the one validity check), not a field's: the spec parses, the layout fails
    from simdist.plan.layout import LayoutRuleError, check_layout
    from simdist.plan.model_presets import resolve_model

    doc = parse_yaml(MINIMAL_SCENARIO.replace("global_batch_size: 8", "global_batch_size: 9, micro_batch_size: 2"),
                     "s.yaml")
    spec = validate(ScenarioSpec, doc)
    with pytest.raises(LayoutRuleError, match="multiple of") as err:
        check_layout(spec, resolve_model(spec.model))
    assert err.value.rule == "batch" and err.value.field == "training.global_batch_size"


def test_model_needs_exactly_one_source():
    doc = parse_yaml(MINIMAL_SCENARIO.replace("{num_layers: 2, hidden_size: 64, num_attention_heads: 4}",
                                              "{hf_config: c.json, num_layers: 2}"), "s.yaml")
    with pytest.raises(SpecError, match="only one model source"):
        validate(ScenarioSpec, doc)


def test_deep_merge_and_overrides_leave_inputs_alone():
    base = {"a": {"b": 1, "c": 2}, "d": 3}
    merged = deep_merge(base, {"a": {"b": 10}})
    assert merged == {"a": {"b": 10, "c": 2}, "d": 3}
    assert base == {"a": {"b": 1, "c": 2}, "d": 3}
    out = apply_overrides(base, ["a.c=400 Gb/s", "e.f=2"])
    assert out["a"]["c"] == "400 Gb/s" and out["e"] == {"f": 2}
    with pytest.raises(SpecError, match="not a mapping"):
        apply_overrides(base, ["d.x=1"])
    with pytest.raises(SpecError, match="key=value"):
        apply_overrides(base, ["novalue"])


def test_cluster_override_of_inter_node():
    spec = resolve_topology_spec(
        "dgx-a100",
        assignments=["inter_node.kind=roce", "inter_node.nic_bandwidth=400 Gb/s", "inter_node.nics_per_node=8"],
        num_nodes=4,
    )
    assert spec.inter_node.kind == "roce"
    assert spec.inter_node.nic_bandwidth == 50e9
    assert spec.num_nodes == 4
    # untouched fields keep the preset's values
    assert spec.inter_node.fabric == "rail_optimized"
    assert spec.scale_up.bandwidth == 300e9


@pytest.mark.parametrize(
    ("assignment", "needle"),
    [
        ("inter_node.nic_bandwidth=400", "has no unit"),
        ("inter_node.nic_bandwidth=-400 Gb/s", "must be positive"),
        ("scale_up.efficiency=1.5", "less than or equal to 1"),
        ("num_nodes=0", "greater than or equal to 1"),
        ("gpus_per_node=6", "spread evenly"),
        ("host.cpu_interconnect=null", "cpu_interconnect"),
    ],
)
def test_bad_overrides_are_named(assignment, needle):
    with pytest.raises(SpecError) as info:
        resolve_topology_spec("dgx-h100", assignments=[assignment])
    text = str(info.value)
    assert needle in text
    assert text.startswith("--set") or "topologies" in text
    assert "\n" not in text
