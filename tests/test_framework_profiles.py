"""Framework profiles (training.framework, simdist.spec.framework): a framework's values fill the fields the file
leaves out, the file's own values win, fields set together stay together, and every value has a source."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simdist.api import scenario_of
from simdist.errors import SimdistError
from simdist.spec.framework import GROUPS, framework_defaults, framework_rows
from simdist.spec.training import FRAMEWORKS
from tests.conftest import REPO, TOY_TOPOLOGY


def _spec(training: dict, parallel: dict | None = None):
    data = {"cluster": {"file": str(TOY_TOPOLOGY), "num_nodes": 2},
            "model": {"num_layers": 4, "hidden_size": 512, "num_attention_heads": 8, "seq_length": 512,
                      "vocab_size": 4096, "swiglu": True},
            "parallel": {"dp": 8, **(parallel or {})},
            "training": {"micro_batch_size": 1, "global_batch_size": 8, **training}}
    return scenario_of(data).spec


def test_torchtitan_profile_fills_what_the_file_leaves_out():
    spec = _spec({"framework": "torchtitan"})
    t, p = spec.training, spec.parallel
    assert p.zero_stage == 3 and t.zero3_fetch == "per_layer" and t.fsdp_version == 2
    assert t.grad_reduce_in_fp32 is True and t.kernel_fusion == "eager" and t.optimizer_implementation == "fused"
    # selective_ac_option = 2: full checkpointing of every second block
    assert (t.recompute, t.recompute_method, t.recompute_num_layers) == ("full", "every", 2)
    assert t.host_overhead.step_gap == 0.0


def test_megatron_core_is_simdists_own_defaults():
    assert framework_defaults("megatron_core") == {}
    plain, named = _spec({}), _spec({"framework": "megatron"})  # another spelling of megatron_core
    assert named.training.framework == "megatron_core"
    assert plain.training.model_dump(exclude={"framework"}) == named.training.model_dump(exclude={"framework"})


def test_the_files_value_wins_under_any_of_its_names():
    assert _spec({"framework": "torchtitan", "kernel_fusion": "fused"}).training.kernel_fusion == "fused"
    # torchtitan's own name for its degree of sharding, DeepSpeed's name for clipping
    assert _spec({"framework": "deepspeed", "gradient_clipping": 1.0}).training.clip_grad == 1.0
    assert _spec({"framework": "fsdp"}, {"zero_stage": 1}).parallel.zero_stage == 1


def test_fields_set_together_are_left_to_the_file():
    # the file's `recompute: full` is every layer, not the profile's every second one
    t = _spec({"framework": "torchtitan", "recompute": "full"}).training
    assert (t.recompute, t.recompute_method, t.recompute_num_layers) == ("full", None, None)
    t = _spec({"framework": "torchtitan", "recompute": "none"}).training
    assert t.recompute == "none" and t.recompute_method is None
    assert GROUPS[0][0] == "training.recompute"


def test_every_profile_value_is_valid_and_sourced():
    for framework in FRAMEWORKS:
        _spec({"framework": framework})  # the profile alone validates
    for framework, field, _value, source in framework_rows():
        assert framework in FRAMEWORKS and field.split(".")[0] in ("training", "parallel")
        assert len(source) > 20, (framework, field)  # a named file, commit or document, not a placeholder


def test_an_unknown_framework_is_one_clear_error(tmp_path):
    with pytest.raises(SimdistError) as err:
        _spec({"framework": "jax"})
    assert "framework" in str(err.value)
    path = tmp_path / "s.yaml"
    path.write_text(f"cluster: {{file: {TOY_TOPOLOGY}, num_nodes: 1}}\nmodel: {{preset: llama3-8b}}\n"
                    "parallel: {dp: 4}\ntraining: {framework: jax, micro_batch_size: 1, global_batch_size: 8}\n")
    out = subprocess.run([sys.executable, "-m", "simdist", "run", str(path)], capture_output=True, text=True)
    assert out.returncode == 2 and "framework" in out.stderr and "Traceback" not in out.stderr


def test_the_readme_lists_every_profile_value():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    table = {line.split("|")[1].strip(" `"): line for line in text.splitlines()
             if line.startswith("| `") and "|" in line[3:]}
    raw = {}
    for line in (REPO / "simdist/spec/data/frameworks.csv").read_text(encoding="utf-8").splitlines():
        if line and not line.startswith(("#", "framework,")):
            framework, field, value = line.split(",", 3)[:3]
            raw.setdefault(framework, []).append(f"`{field.split('.', 1)[1]}: {value}`")
    for framework, cells in raw.items():
        assert framework in table, f"README's Frameworks table has no row for {framework}"
        for cell in cells:
            assert cell in table[framework], f"README's {framework} row does not list {cell}"
