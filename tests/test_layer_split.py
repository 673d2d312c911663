"""The layer split over pipeline stages and chunks (simdist.plan.layer_split): Megatron-LM's accounting and layout
strings, DeepSpeed's partition methods, explicit per-chunk lists, and what `simdist run` chooses and prints."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simdist import api
from simdist.errors import LayoutError
from simdist.plan.layer_split import (
    auto_split,
    choose_split,
    deepspeed_layers,
    layout_string,
    parse_layout,
    partition_balanced,
    partition_uniform,
)
from simdist.plan.layout import LayoutRuleError, step_config_of
from simdist.plan.model import Model
from simdist.plan.model_presets import resolve_model
from simdist.spec.scenario import ModelSpec

LLAMA405 = resolve_model(ModelSpec(preset="llama3-405b"))


def _model(num_layers: int) -> Model:
    return Model(name="t", kind="decoder", num_layers=num_layers, hidden_size=1024, num_attention_heads=16,
                 num_query_groups=16, ffn_hidden_size=4096, seq_length=512, vocab_size=32000)


def test_llama3_405b_on_16_stages_of_8_chunks_is_megatrons_accounting() -> None:
    # 126 layers + embedding + loss = 128 = 16 x 8: one layer a chunk, the first chunk only the embedding, the last
    # only the loss; per stage 7 + 14 x 8 + 7, the paper's lighter first and last stage (Dubey et al. 2024 3.3.2).
    split = choose_split(LLAMA405, pp=16, vpp=8)
    assert split.parts[0] == 0 and split.parts[-1] == 0 and set(split.parts[1:-1]) == {1}
    assert split.layers_per_stage == (7, *[8] * 14, 7)
    assert split.chunk_layers(0) == (0, 1, 1, 1, 1, 1, 1, 1) and split.chunk_layers(15) == (1, 1, 1, 1, 1, 1, 1, 0)
    assert "account_for_embedding_in_pipeline_split" in split.method and split.method.startswith("auto")
    assert split.layout == "E|(t|)*126,L"
    explicit = choose_split(LLAMA405, pp=16, vpp=8, account_for_embedding=True, account_for_loss=True)
    assert explicit.parts == split.parts
    assert choose_split(LLAMA405, pp=16, vpp=8, pipeline_layout=split.layout).parts == split.parts
    # lighter_ends on interleaved stages: the missing layer comes off the embedding's and the loss's chunk
    assert choose_split(LLAMA405, pp=16, vpp=8, pipeline_split="lighter_ends").parts == split.parts


def test_megatron_layout_string_of_its_docstring() -> None:
    # transformer_config.py's example 'E|(tt|)*2,(t|)*4,mL' (pp 4, vpp 2) without the MTP layer: part c*pp + s is
    # chunk c of stage s: stage 0 holds the embedding and then one layer, stages 1-2 two layers then one, stage 3 one
    # layer then the loss.
    assert parse_layout("E|(tt|)*2,(t|)*4,L") == ["E", "tt", "tt", "t", "t", "t", "t", "L"]
    split = choose_split(_model(8), pp=4, vpp=2, pipeline_layout="E|(tt|)*2,(t|)*4,L")
    assert split.layers_per_chunk == ((0, 1), (2, 1), (2, 1), (1, 0))
    assert parse_layout("Et*3|t*2L") == ["Ettt", "ttL"]


@pytest.mark.parametrize(("layout", "pp", "vpp", "field", "needle"), [
    ("E|t*10|L", 2, 1, "parallel.pipeline_layout", "not a multiple of pp"),
    ("E|t*5|t*5|L", 2, 1, "parallel.vpp", "set parallel.vpp: 2"),
    ("t*10|EL", 2, 1, "parallel.pipeline_layout", "start with the embedding"),
    ("Et*5|t*4L", 2, 1, "parallel.pipeline_layout", "9 decoder layers"),
    ("Et*5|t*5mL", 2, 1, "parallel.pipeline_layout", "mtp_num_layers = 0"),  # the model has no MTP
    ("Et*5|t*5xL", 2, 1, "parallel.pipeline_layout", "unknown character"),
])
def test_bad_layouts_name_the_field(layout: str, pp: int, vpp: int, field: str, needle: str) -> None:
    with pytest.raises(LayoutError, match=needle) as err:
        choose_split(_model(10), pp=pp, vpp=vpp, pipeline_layout=layout)
    assert err.value.field == field


def _mtp_model(num_layers: int, mtp: int = 1) -> Model:
    return Model(name="t", kind="decoder", num_layers=num_layers, hidden_size=1024, num_attention_heads=16,
                 num_query_groups=16, ffn_hidden_size=4096, seq_length=512, vocab_size=32000, mtp_num_layers=mtp)


def test_megatron_layouts_with_multi_token_prediction_layers() -> None:
    # Megatron-LM's docstring example 'E|(tt|)*2,(t|)*4,mL' (pp 4, vpp 2) with its MTP layer, and the DeepSeek-V3
    # proxy layout of Megatron-LM pull request #6311 ('Ett|(tt|)*6mL': 14 layers, MTP 1, pp 4 x vpp 2): the m's sit
    # with the loss on the last part, where simdist prices the MTP layers; the split is the decoder layers'.
    assert parse_layout("E|(tt|)*2,(t|)*4,mL") == ["E", "tt", "tt", "t", "t", "t", "t", "mL"]
    split = choose_split(_mtp_model(8), pp=4, vpp=2, pipeline_layout="E|(tt|)*2,(t|)*4,mL")
    assert split.layers_per_chunk == ((0, 1), (2, 1), (2, 1), (1, 0))
    proxy = choose_split(_mtp_model(14), pp=4, vpp=2, pipeline_layout="Ett|(tt|)*6mL")
    assert proxy.parts == (2, 2, 2, 2, 2, 2, 2, 0)
    # the same split without the m's: simdist still places the MTP layer on the last part (Megatron-LM asks for m's)
    assert choose_split(_mtp_model(14), pp=4, vpp=2, pipeline_layout="Ett|(tt|)*6L").parts == proxy.parts
    assert layout_string(proxy.parts, 1) == "Et*2|(t*2|)*6,mL"
    assert tuple(p.count("t") for p in parse_layout(layout_string((4, 4), 2))) == (4, 4)
    assert layout_string((4, 4), 2) == "Et*4|t*4mmL"


@pytest.mark.parametrize(("layout", "mtp", "needle", "fix"), [
    ("Et*7|t*7mmL", 1, "holds 2 multi-token prediction layers", "write 1 m's before the L"),
    ("Et*7|t*6mtL", 1, "decoder layer (t) after a multi-token", "after the last t"),
    ("Et*7|t*7m|L", 1, "on part 1, not on the last part", "in the last part"),  # Megatron's standalone MTP stage
])
def test_bad_multi_token_prediction_layouts_name_the_field(layout: str, mtp: int, needle: str, fix: str) -> None:
    pp = len(parse_layout(layout))
    with pytest.raises(LayoutError, match=needle.replace("(", r"\(").replace(")", r"\)")) as err:
        choose_split(_mtp_model(14, mtp), pp=pp, vpp=1, pipeline_layout=layout)
    assert err.value.field == "parallel.pipeline_layout" and fix in err.value.fix


def test_a_deepseek_layout_with_its_mtp_layer_runs_and_prints_it() -> None:
    # the bundled DeepSeek-V3 shape with 14 layers and its MTP layer, Megatron-LM's layout given with the m: the step
    # runs in the closed form, and the layout it reports (with the m) is one Megatron-LM accepts for this model
    sc = api.scenario_of({
        "cluster": {"preset": "dgx-h100", "num_nodes": 8},
        "model": {"preset": "deepseek-v3", "num_layers": 14, "mtp_num_layers": 1, "seq_length": 2048,
                  "moe_layer_freq": [0, 0, 0, *[1] * 11]},
        "parallel": {"tp": 1, "pp": 4, "vpp": 2, "dp": 16, "ep": 16, "use_distributed_optimizer": True,
                     "pipeline_layout": "Ett|(tt|)*6mL"},
        "training": {"micro_batch_size": 1, "global_batch_size": 256, "moe_token_dispatcher_type": "alltoall"},
        "schedule": "interleaved_1f1b"})
    result = api.predict(sc.spec, sc.topology, fidelity="closed_form").result
    assert result["layout"]["pipeline_layout"] == "Et*2|(t*2|)*6,mL"
    assert result["layout"]["layers_per_chunk"] == [[2, 2], [2, 2], [2, 2], [2, 0]]
    no_m = sc.spec.model_copy(update={"parallel": sc.spec.parallel.model_copy(update={
        "pipeline_layout": "Ett|(tt|)*6L"})})
    same = api.predict(no_m, sc.topology, fidelity="closed_form").result
    assert same["step_time_s"] == pytest.approx(result["step_time_s"], rel=1e-12)


def test_layout_string_round_trips() -> None:
    for parts in [(0, 1, 1, 1, 0), (4, 4), (3, 4, 4, 4, 4, 3), (1,), (0, 0, 2, 0, 0), (2, 0, 3, 3, 3, 1)]:
        text = layout_string(parts)
        assert tuple(p.count("t") for p in parse_layout(text)) == parts, text
    assert layout_string((0, 1, 1, 1, 0)) == "E|(t|)*3,L"


def test_auto_chooses_megatrons_defaults_in_order() -> None:
    assert auto_split(_model(96), 8, 3)[0] == (4,) * 24  # divides: Megatron's default
    parts, how = auto_split(_model(70), 12, 1)  # 72 = 12 x 6: BLOOM's 70 layers with the embedding and the loss
    assert parts == (5, *[6] * 10, 5) and "account_for_embedding" in how
    parts, how = auto_split(_model(11), 4, 1)  # 13 no, 12 = 4 x 3: the loss alone takes a layer's place
    assert parts == (3, 3, 3, 2) and how.startswith("account_for_loss")
    parts, how = auto_split(_model(80), 12, 1)  # 80, 81, 82 do not divide by 12: a layout spreading 82 units
    units = [parts[0] + 1, *parts[1:-1], parts[-1] + 1]
    assert sum(parts) == 80 and max(units) - min(units) == 1 and "layout" in how
    parts, _ = auto_split(_model(3), 4, 2)  # 8 parts, 5 units: the ends alone, the 3 layers spread in between
    assert parts[0] == parts[-1] == 0 and sum(parts) == 3 and max(parts) == 1


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 200), st.integers(1, 24), st.integers(1, 8))
def test_auto_always_splits_every_layer_once_and_evenly(n: int, pp: int, vpp: int) -> None:
    # Any layer count on any pp and vpp: every layer placed once; counting the embedding and the loss as a layer
    # each (Megatron's accounting), no part holds more than one unit above another unless the whole split is the
    # default even one (where the ends also carry the embedding and the loss).
    parts, how = auto_split(_model(n), pp, vpp)
    assert len(parts) == pp * vpp and sum(parts) == n and min(parts) >= 0
    if not how.startswith("even"):
        units = list(parts)
        units[0] += 1
        units[-1] += 1
        assert max(units) - min(units) <= 1, (parts, how)


def test_deepspeed_partitions_hand_checked() -> None:
    # GPTModelPipe of a 4-layer bf16 model: cast, embedding, 4 layers, norm, output layer, cast back = 9 entries.
    m = _model(4)
    names = [name for name, _ in deepspeed_layers(m, "bf16")]
    assert names == ["_to_float16", "EmbeddingPipe", *["ParallelTransformerLayerPipe"] * 4, "LayerNorm",
                     "LMHeadPipe", "float16_to_fp32"]
    assert partition_uniform(9, 2) == [0, 5, 9]  # 5 + 4 entries: 3 layers, then 1 with the head
    assert choose_split(m, pp=2, vpp=1, partition_method="uniform").layers_per_stage == (3, 1)
    assert choose_split(m, pp=2, vpp=1, partition_method="type:transformer").layers_per_stage == (2, 2)
    # balanced: [5], [1, 1, 1, 1], [5] has spread 1, the least of any contiguous split
    assert partition_balanced([5, 1, 1, 1, 1, 5], 3) == [0, 1, 5, 6]
    assert partition_uniform(2, 4) == [0, 1, 2, 2, 2]


def test_deepspeed_parameters_make_the_embedding_stages_lighter() -> None:
    # A vocabulary of 4 layers' worth of parameters on each end: balancing parameters takes layers off stages 0 and 3.
    m = _model(16)
    m = Model(**{**{f: getattr(m, f) for f in m.__slots__}, "vocab_size": 4 * m.params_per_layer // m.hidden_size})
    split = choose_split(m, pp=4, vpp=1, partition_method="parameters")
    assert split.layers_per_stage[0] < 4 < split.layers_per_stage[1] and split.layers_per_stage[-1] < 4
    assert sum(split.layers_per_stage) == 16


@pytest.mark.parametrize(("kw", "field", "needle"), [
    ({"partition_method": "type:nothing"}, "parallel.partition_method", "matches none"),
    ({"partition_method": "profile"}, "parallel.partition_method", "unknown partition_method"),
    ({"partition_method": "uniform", "vpp": 2}, "parallel.partition_method", "one chunk per stage"),
    ({"layers_per_stage": [5, 5], "pipeline_layout": "Et*5|t*5L"}, "parallel.pipeline_layout", "given twice"),
    ({"layers_per_stage": [[1, 2], [3]], "vpp": 2}, "parallel.layers_per_stage", "lists 1 chunks"),
    ({"layers_per_stage": [[1, 2], [3, 3]], "vpp": 2}, "parallel.layers_per_stage", "holds 9 layers"),
    ({"account_for_loss": True, "pp": 4}, "parallel.pp", "do not split evenly"),
])
def test_bad_splits_name_the_field(kw: dict, field: str, needle: str) -> None:
    args = {"pp": 2, "vpp": 1, **kw}
    with pytest.raises(LayoutError, match=needle) as err:
        choose_split(_model(10), **args)
    assert err.value.field == field


def test_per_chunk_list_with_embedding_and_loss_chunks_runs_in_both_fidelities() -> None:
    # 6 layers on 2 stages x 2 chunks, the first chunk only the embedding and the last only the loss: the engine
    # and the closed form see the same chunks (the chunk cost of 0 layers is the embedding / the head alone).
    sc = api.scenario_of({
        "cluster": {"preset": "dgx-h100", "num_nodes": 2, "gpus_per_node": 1,
                    "host": {"cpu_sockets": 1, "pcie_switches_per_socket": 1}, "inter_node": {"nics_per_node": 1}},
        "model": {"num_layers": 6, "hidden_size": 1024, "num_attention_heads": 16, "seq_length": 512,
                  "vocab_size": 32000},
        "parallel": {"pp": 2, "vpp": 2, "layers_per_stage": [[0, 3], [3, 0]]},
        "training": {"global_batch_size": 4}, "schedule": "interleaved_1f1b"})
    cfg = step_config_of(sc.spec, sc.topology, resolve_model(sc.spec.model))
    assert cfg.model_parts() == (0, 3, 3, 0) and cfg.layers_per_stage == (3, 3)
    engine = api.predict(sc.spec, sc.topology).result
    closed = api.predict(sc.spec, sc.topology, fidelity="closed_form").result
    assert closed["step_time_s"] == pytest.approx(engine["step_time_s"], rel=1e-9)
    assert engine["layout"]["layers_per_chunk"] == [[0, 3], [3, 0]]
    assert engine["layout"]["pipeline_layout"] == "E|(t*3|)*2,L"


def test_check_counts_a_bad_split_under_the_layers_rule() -> None:
    spec = api.load_scenario("scenarios/default.yaml").spec
    bad = spec.model_copy(update={"parallel": spec.parallel.model_copy(update={"pipeline_layout": "E|t|L"})})
    from simdist.plan.layout import check_layout
    with pytest.raises(LayoutRuleError) as err:
        check_layout(bad, resolve_model(bad.model))
    assert err.value.rule == "layers"


def test_cli_run_prints_the_split_it_chose() -> None:
    # The Llama 3 405B layout of 126 layers on pp 16 x vpp 8 runs as written and says how it split the layers.
    proc = subprocess.run([sys.executable, "-m", "simdist", "run", "scenarios/llama3-405b-interleaved.yaml",
                           "--fidelity", "closed_form", "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    layout = json.loads(proc.stdout)["layout"]
    assert layout["layers_per_stage"] == [7, *[8] * 14, 7] and layout["vpp"] == 8
    assert layout["layers_per_chunk"][0] == [0, 1, 1, 1, 1, 1, 1, 1]
    assert layout["pipeline_layout"] == "E|(t|)*126,L" and "account_for_loss" in layout["pipeline_split"]
    text = subprocess.run([sys.executable, "-m", "simdist", "run", "scenarios/llama3-405b-interleaved.yaml",
                           "--fidelity", "closed_form"], capture_output=True, text=True, timeout=300)
    assert text.returncode == 0, text.stderr
    assert "pipeline split: auto: account_for_embedding_in_pipeline_split" in text.stdout
    assert "layers per stage 7, 8 x 14, 7; layout E|(t|)*126,L" in text.stdout.replace("\n", " ")
