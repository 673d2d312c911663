"""GPU and model presets are data files (gpus/*.yaml, models/*.yaml) with the citation of every value.

The pinned figures are the published ones the presets held when they were Python constants (the accuracy
tables depend on them); tests/test_presets.py checks the GPUs against validation/reference/hardware_gpu_specs.csv.
"""

from __future__ import annotations

import textwrap
import tomllib

import pytest

from simdist.errors import SpecError
from simdist.hardware.gpus import GPU_PRESETS, GPU_SOURCES
from simdist.plan.model_presets import _preset, model_presets
from simdist.spec.gpu import GpuSpec
from simdist.spec.preset_file import BUNDLED_KINDS, bundled_dir, read_preset
from tests.conftest import REPO

T = 1e12
# name: (fp32, tf32, bf16, fp8 FLOP/s, HBM bytes, HBM B/s, TDP W)
GPUS = {
    "a100-sxm-80gb": (19.5 * T, 156 * T, 312 * T, None, 80 * 2**30, 2.0e12, 400),
    "h100-sxm": (67 * T, 494.7 * T, 989 * T, 1979 * T, 80 * 2**30, 3.35e12, 700),
    "h200-sxm": (67 * T, 494.7 * T, 989 * T, 1979 * T, 141 * 2**30, 4.8e12, 700),
    "b200": (75 * T, 1100 * T, 2250 * T, 4500 * T, 180 * 2**30, 8.0e12, 1000),
    "gb200": (80 * T, 1250 * T, 2500 * T, 5000 * T, 186 * 2**30, 8.0e12, 1200),
    "b300": (75 * T, 1100 * T, 2250 * T, 4500 * T, 288 * 2**30, 8.0e12, 1000),
    "gb300": (80 * T, 1250 * T, 2500 * T, 5000 * T, 288 * 2**30, 8.0e12, 1400),
    "l40s": (91.6 * T, 183 * T, 362.05 * T, 733 * T, 48 * 2**30, 864e9, 350),
    "h100-pcie": (51 * T, 378 * T, 756 * T, 1513 * T, 80 * 2**30, 2.0e12, 350),
    "h100-sxm-hbm2e": (67 * T, 494.7 * T, 989 * T, 1979 * T, 96 * 2**30, 2.4e12, 700),
    "cpu-core": (96e9, 96e9, 96e9, None, 4 * 2**30, 10e9, 15),
}
# name: (layers, hidden, heads, query groups, ffn, seq, vocab, swiglu, tied)
MODELS = {
    "gpt3-175b": (96, 12288, 96, 96, 49152, 2048, 51200, False, True),
    "megatron-530b": (105, 20480, 128, 128, 81920, 2048, 51200, False, True),
    "megatron-1t": (128, 25600, 160, 160, 102400, 2048, 51200, False, True),
    "llama3-8b": (32, 4096, 32, 8, 14336, 8192, 128256, True, False),
    "llama3-70b": (80, 8192, 64, 8, 28672, 8192, 128256, True, False),
    "llama3-405b": (126, 16384, 128, 8, 53248, 8192, 128256, True, False),
    "cs336-mlp": (4, 1024, 0, 0, 0, 1, 0, False, False),
    "mixtral-8x7b": (32, 4096, 32, 8, 14336, 32768, 32000, True, False),
    "mixtral-8x22b": (56, 6144, 48, 8, 16384, 65536, 32768, True, False),
    "deepseek-v3": (61, 7168, 128, 128, 18432, 4096, 129280, True, False),
    "qwen3-30b-a3b": (48, 2048, 32, 4, 6144, 4096, 151936, True, False),
    "qwen3-235b-a22b": (94, 4096, 64, 4, 12288, 4096, 151936, True, False),
    "gpt-oss-120b": (36, 2880, 64, 8, 2880, 4096, 201088, True, False),
}
# name: (experts, top-k, expert width, shared width)  (tests/test_moe_models.py checks the parameter counts)
MOE = {
    "mixtral-8x7b": (8, 2, 14336, 0), "mixtral-8x22b": (8, 2, 16384, 0), "deepseek-v3": (256, 8, 2048, 2048),
    "qwen3-30b-a3b": (128, 8, 768, 0), "qwen3-235b-a22b": (128, 8, 1536, 0), "gpt-oss-120b": (128, 4, 2880, 0),
}


@pytest.mark.parametrize("name", sorted(GPUS))
def test_gpu_preset_values(name):
    g = GPU_PRESETS[name]
    fp32, tf32, bf16, fp8, capacity, bandwidth, tdp = GPUS[name]
    assert (g.peak.fp32, g.peak.tf32, g.peak.bf16, g.peak.fp16) == pytest.approx((fp32, tf32, bf16, bf16), rel=1e-12)
    assert g.peak.fp8 == (None if fp8 is None else pytest.approx(fp8, rel=1e-12))
    assert (g.hbm_capacity, g.hbm_bandwidth, g.tdp_w) == pytest.approx((capacity, bandwidth, tdp), rel=1e-12)
    assert set(GPU_PRESETS) == set(GPUS) == {p.stem for p in (REPO / "gpus").glob("*.yaml")}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_preset_values(name):
    m, source = _preset(name)  # read from its file when first asked for
    assert (m.num_layers, m.hidden_size, m.num_attention_heads, m.num_query_groups, m.ffn_hidden_size, m.seq_length,
            m.vocab_size, m.swiglu, m.tied_embeddings) == MODELS[name]
    assert m.name == name and m.kind == ("mlp" if name == "cs336-mlp" else "decoder") and source
    assert set(model_presets()) == set(MODELS) == {p.stem for p in (REPO / "models").glob("*.yaml")}
    assert (m.num_experts, m.moe_router_topk, m.moe_ffn_hidden_size,
            m.moe_shared_expert_intermediate_size) == MOE.get(name, (0, 0, 0, 0))


def test_every_gpu_value_is_cited():
    for name, sources in GPU_SOURCES.items():
        assert {"name", "form_factor", "peak.bf16", "peak.fp8", "hbm_bandwidth", "tdp_w"} <= set(sources), name
    assert "hardware_gpu_specs.csv, H100 SXM 80GB" in GPU_SOURCES["h100-sxm"]["peak.bf16"]


def _write(tmp_path, text):
    path = tmp_path / "g.yaml"
    path.write_text(text)
    return path


GOOD = textwrap.dedent("""\
    name: X
    form_factor: sxm
    peak: {fp32: 1 TFLOP/s, tf32: 2 TFLOP/s, bf16: 4 TFLOP/s, fp16: 4 TFLOP/s}
    hbm_capacity: 1 GiB
    hbm_bandwidth: 1 TB/s
    """)
CITED = textwrap.dedent("""\
    sources:
      name: a
      form_factor: a
      peak.fp32: a
      peak.tf32: a
      peak.bf16: a
      peak.fp16: a
      hbm_capacity: a
      hbm_bandwidth: a
    """)


def test_a_cited_preset_file_reads(tmp_path):
    spec, sources, _ = read_preset(_write(tmp_path, GOOD + CITED), GpuSpec)
    assert spec.peak.bf16 == 4e12 and sources["peak.bf16"] == "a"


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: t.replace("  peak.tf32: a\n", ""), "no source for peak.tf32"),
    (lambda t: t + "  peak.fp8: a\n", "cites peak.fp8, which the preset does not write"),
    (lambda t: "sources: none\n", "a preset needs 'sources'"),
])
def test_an_uncited_value_is_refused(tmp_path, change, message):
    path = _write(tmp_path, GOOD + change(CITED))
    with pytest.raises(SpecError, match=message) as err:
        read_preset(path, GpuSpec)
    assert err.value.field == "sources" and str(path) in err.value.source


def test_a_bad_value_names_its_field(tmp_path):
    with pytest.raises(SpecError) as err:
        read_preset(_write(tmp_path, GOOD.replace("1 TB/s", "fast") + CITED), GpuSpec)
    assert err.value.field == "hbm_bandwidth" and err.value.source.endswith("g.yaml:5")


def test_the_wheel_ships_every_preset_folder():
    """A non-editable install finds the presets in simdist/_bundled/<kind> (bundled_dir looks there first)."""
    force = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"][
        "force-include"]
    for kind in BUNDLED_KINDS:
        assert force[kind] == f"simdist/_bundled/{kind}"
        assert any(bundled_dir(kind).glob("*.yaml"))


def test_the_toy_fixtures_are_one_gpu():
    """tests/fixtures: the toy topology inlines the toy GPU, so mechanism tests can use either."""
    from simdist.hardware import load_topology
    from tests.conftest import TOY_TOPOLOGY, toy_gpu

    topology = load_topology(TOY_TOPOLOGY)
    assert topology.gpu == toy_gpu() and topology.gpu.peak.bf16 == 100e12 and topology.num_gpus == 8
