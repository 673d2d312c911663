"""The z-loss beside the cross-entropy (training.z_loss_multiplier: PaLM's multiplier x logsumexp(logits)^2, OLMo-core's
z_loss_multiplier): its log-sum-exp over the logits and gradient, as each loss style runs them (simdist.plan.elementwise
``z_loss``), counted by hand on a one-GPU step in both fidelities."""

from __future__ import annotations

from pathlib import Path

import pytest

from simdist import api
from simdist.errors import SimdistError
from simdist.hardware.compute import kernels_time_s
from simdist.hardware.host import host_overhead
from simdist.plan.model_ends import head_work
from simdist.plan.model_presets import resolve_model
from tests.conftest import TOY_TOPOLOGY, toy_gpu

SCENARIO = f"""
cluster: {{file: {TOY_TOPOLOGY}, num_nodes: 1, gpus_per_node: 1, inter_node: {{nics_per_node: 1}}}}
model: {{num_layers: 2, hidden_size: 256, num_attention_heads: 4, ffn_hidden_size: 704, seq_length: 1024,
         vocab_size: 32768, swiglu: true}}
training: {{global_batch_size: 1, attention: flash, kernel_fusion: eager, optimizer_implementation: foreach,
           cross_entropy_loss_fusion: {{fusion}}, z_loss_multiplier: {{z}}}}
"""


def _path(tmp_path: Path, z: float, fusion: bool = False) -> Path:
    path = tmp_path / f"z{z}-{fusion}.yaml"
    path.write_text(SCENARIO.replace("{z}", repr(z)).replace("{fusion}", str(fusion).lower()))
    return path


def test_each_loss_style_runs_the_z_loss_as_its_code_does(tmp_path):
    model = resolve_model(api.load_scenario(_path(tmp_path, 1e-5)).spec.model)
    n = 1024 * 32768  # logits of one micro-batch: tokens x vocabulary
    for style, fwd_bytes, bwd_bytes, kernels in (("eager", 6 * 4, 9 * 4, 8), ("compiled", 2, 3 * 2, 2),
                                                ("fused", 0, 0, 0)):
        plain = head_work(model, tp=1, loss_style=style)
        z = head_work(model, tp=1, loss_style=style, z_loss=True)
        extra = [k for k in (*z.forward, *z.backward) if k.name.startswith(("z_loss", "logits_grad_accumulate"))]
        assert len(z.forward) + len(z.backward) - len(plain.forward) - len(plain.backward) == len(extra) == kernels
        # eager: amax, the difference, exp, the row sums over the fp32 logits (1 + 2 + 2 + 1 passes of 4 B), and
        # the gradient's difference, exp and product (2 + 2 + 2) and its sum with the loss's gradient (3)
        assert sum(k.hbm_bytes for k in z.forward) - sum(k.hbm_bytes for k in plain.forward) == fwd_bytes * n
        assert sum(k.hbm_bytes for k in z.backward) - sum(k.hbm_bytes for k in plain.backward) == bwd_bytes * n
    # a fused loss computes lse^2 and its gradient in its own pass: nothing of its own
    fused = head_work(model, tp=1, loss_style="eager", loss_fusion=True)
    assert head_work(model, tp=1, loss_style="eager", loss_fusion=True, z_loss=True) == fused


def test_a_one_gpu_step_pays_the_z_loss_kernels_in_both_fidelities(tmp_path):
    times = {}
    for z in (0.0, 1e-5):
        path = _path(tmp_path, z)
        engine = api.run(path).result["step_time_s"]
        closed = api.run(path, fidelity="closed_form").result["step_time_s"]
        assert closed == pytest.approx(engine, rel=1e-9)
        times[z] = engine
    sc = api.load_scenario(_path(tmp_path, 1e-5))
    model = resolve_model(sc.spec.model)
    gpu, host = toy_gpu(), host_overhead(toy_gpu())

    def issued(kernels) -> float:
        return host.run_time_s(kernels_time_s(gpu, kernels, "bf16"), kernels)

    def head_s(z: bool) -> float:
        w = head_work(model, tp=1, style="eager", loss_style="eager", z_loss=z)
        return issued(w.forward) + issued(w.backward)

    assert times[1e-5] - times[0.0] == pytest.approx(head_s(True) - head_s(False), rel=1e-9)
    assert times[1e-5] > times[0.0]
    # under the fused loss the z-loss costs nothing more
    assert api.run(_path(tmp_path, 1e-5, fusion=True)).result["step_time_s"] == pytest.approx(
        api.run(_path(tmp_path, 0.0, fusion=True)).result["step_time_s"], rel=1e-12)


def test_the_multiplier_takes_the_frameworks_names_and_refuses_a_negative(tmp_path):
    path = _path(tmp_path, 0.0)
    assert api.load_scenario(path, ["training.z_loss_multiplier=0.0001"]).spec.training.z_loss_multiplier == 1e-4
    for name in ("lse_square_scale", "z_loss"):  # flash-attn's Triton loss, the generic name
        alias = tmp_path / f"{name}.yaml"
        alias.write_text(path.read_text().replace("z_loss_multiplier: 0.0", f"{name}: 0.0001"))
        assert api.load_scenario(alias).spec.training.z_loss_multiplier == 1e-4
    with pytest.raises(SimdistError, match="z_loss_multiplier"):
        api.load_scenario(path, ["training.z_loss_multiplier=-1"])
