"""Sliding-window attention priced from measured banded kernels (simdist.hardware.attention.window_efficiency,
data/attention_window.csv: cuDNN 9.22's GPT-OSS suite on GB200 and GB300)."""

from __future__ import annotations

import pytest

from simdist.hardware.attention import WINDOW_AS_CAUSAL, attention_efficiency, window_efficiency
from simdist.hardware.compute import kernel_time_s
from simdist.hardware.gpus import GPU_PRESETS
from simdist.plan.layer_cost import layer_work
from simdist.plan.model_presets import resolve_model
from simdist.spec.scenario import ModelSpec

GB200, GB300, H100 = GPU_PRESETS["gb200"], GPU_PRESETS["gb300"], GPU_PRESETS["h100-sxm"]


def _attention_ms(gpu, seq: int, window: int | None, direction: str = "forward") -> float:
    # The benchmark's own shape: batch 2, 128 query and key/value heads of 64, one layer, bf16, cuDNN.
    fields = dict(num_layers=1, hidden_size=128 * 64, num_attention_heads=128, seq_length=seq, vocab_size=100)
    if window:
        fields["window_size"] = window
    model = resolve_model(ModelSpec.model_validate(fields))
    work = layer_work(model, micro_batch_size=2, attention="cudnn")
    kernels = work.forward if direction == "forward" else work.backward
    name = "flash_attention" if direction == "forward" else "flash_attention_grad"
    (kernel,) = [k for k in kernels if k.name == name]
    return kernel_time_s(gpu, kernel, "bf16") * 1e3


@pytest.mark.parametrize(("gpu", "seq", "forward_ms", "backward_ms"), [
    (GB200, 4096, 0.210, 0.465), (GB200, 16384, 0.822, 1.818), (GB300, 8192, 0.397, 0.862),
])
def test_the_benchmarks_own_shape_takes_its_measured_time(gpu, seq, forward_ms, backward_ms):
    # Its FLOPs as simdist counts the band (window_share: s W - W^2 / 2 scores a head) are the benchmark's, so the
    # layer's attention kernels take the times cuDNN measured (plus the launch gap), forward and backward.
    assert _attention_ms(gpu, seq, 128) == pytest.approx(forward_ms, rel=0.02)
    assert _attention_ms(gpu, seq, 128, "backward") == pytest.approx(backward_ms, rel=0.02)


def test_a_window_runs_far_below_the_causal_kernel_over_as_many_keys():
    # The assumption it replaces priced the 128-key band as a causal kernel over 128 keys (the head dimension 64
    # causal curve clamped at its shortest measured sequence, 1024 keys on B200): 3.5 times as fast as measured on
    # GB200.
    band = window_efficiency(GB200, "cudnn", "forward", 128, 4096, 64)
    assert band == pytest.approx(161 / 2500, rel=1e-9)
    assert attention_efficiency(GB200, "cudnn", "forward", True, 128, 64) > 3 * band


def test_wider_windows_rise_to_the_causal_kernel_and_unmeasured_gpus_keep_it():
    causal = attention_efficiency(GB200, "cudnn", "forward", True, WINDOW_AS_CAUSAL, 64)
    at = [window_efficiency(GB200, "cudnn", "forward", w, 8192, 64) for w in (128, 256, 512, 1024, WINDOW_AS_CAUSAL)]
    assert at == sorted(at) and at[-1] == pytest.approx(causal, rel=1e-12)
    # halfway in log2(window) towards the causal kernel over as many keys (512)
    causal_512 = attention_efficiency(GB200, "cudnn", "forward", True, 512, 64)
    assert at[2] == pytest.approx(at[0] + 0.5 * (causal_512 - at[0]), rel=1e-9)
    # Hopper has no banded measurement: the causal kernel over the window's keys, as before
    assert window_efficiency(H100, "cudnn", "forward", 128, 4096, 64) == attention_efficiency(
        H100, "cudnn", "forward", True, 128, 64)


def test_a_window_as_long_as_the_sequence_is_the_causal_kernel():
    full = _attention_ms(GB200, 4096, None)
    assert _attention_ms(GB200, 4096, 4096) == pytest.approx(full, rel=1e-9)
    assert _attention_ms(GB200, 4096, 128) < full
