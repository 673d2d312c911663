"""A head dimension one direction of a kernel does not measure scales like the other direction
(simdist.hardware.attention, step 3): Hopper's cuDNN backward is published at head dimension 128 only, its forward at
64, 128 and 256."""

from __future__ import annotations

import pytest

from simdist.hardware.attention import attention_efficiency, window_efficiency
from simdist.hardware.gpus import GPU_PRESETS

H100, H200 = GPU_PRESETS["h100-sxm"], GPU_PRESETS["h200-sxm"]


@pytest.mark.parametrize("seq", [1024, 4096, 16384])
@pytest.mark.parametrize("head_dim", [64, 96, 256])
def test_hoppers_cudnn_backward_scales_with_the_head_dimension_as_its_forward(seq, head_dim):
    def eff(direction: str, hd: int) -> float:
        return attention_efficiency(H100, "cudnn", direction, True, seq, hd)
    # backward(d) = backward(128) x forward(d) / forward(128): the nearest measured head dimension is 128
    assert eff("backward", head_dim) == pytest.approx(eff("backward", 128) * eff("forward", head_dim)
                                                      / eff("forward", 128), rel=1e-12)
    # a smaller head dimension does less work per tile loaded: slower, as its forward is
    if head_dim < 128:
        assert eff("backward", head_dim) < eff("backward", 128)


def test_a_head_dimension_beyond_every_measured_one_takes_the_nearest():
    # cuDNN on Hopper measures no head dimension below 64 in either direction: 32 is priced as 64 (both directions;
    # its backward as 64's, from step 3, not as the backward's own nearest, 128)
    for direction in ("forward", "backward"):
        assert attention_efficiency(H100, "cudnn", direction, True, 4096, 32) == attention_efficiency(
            H100, "cudnn", direction, True, 4096, 64)


# NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/gpt_oss_20260227_034819.csv
# @ df73764a (NVIDIA H200, cuDNN 9.19.1, bf16, batch 2, GPT-OSS's heads: 64 query and 8 key/value heads of 64, causal
# top_left with a sliding window of 1024 keys; FLOPs as simdist.plan.attention_cost.window_share counts the band):
# (seq_len, forward TFLOP/s, backward TFLOP/s). A check, never a fit.
H200_BAND_1024 = [(2048, 310, 264), (4096, 336, 289), (8192, 349, 300), (16384, 355, 303), (32768, 358, 299)]


@pytest.mark.parametrize(("seq", "forward", "backward"), H200_BAND_1024)
def test_head_dim_64s_backward_on_hopper_is_not_priced_faster_than_cudnn_measures_it(seq, forward, backward):
    # Hopper has no banded measurement: the band is priced as the causal kernel over 1024 keys, whose backward at head
    # dimension 64 comes from step 3. Measured it runs 1.6-14 % faster than that; priced at head dimension 128's
    # backward (the clamp before step 3 was reachable) it was 22-40 % faster than measured.
    rate = window_efficiency(H200, "cudnn", "backward", 1024, seq, 64) * 989.0
    assert 0.85 * backward <= rate <= backward
    assert window_efficiency(H200, "cudnn", "forward", 1024, seq, 64) * 989.0 <= forward


B200, GB200, GB300 = GPU_PRESETS["b200"], GPU_PRESETS["gb200"], GPU_PRESETS["gb300"]


@pytest.mark.parametrize(("gpu", "peak", "causal", "seq", "tflops"), [
    # Dao-AILab/flash-attention PR #2605 (2026-05-30), its benchmark_attn.py, the cuDNN column: bf16, 32 heads
    # of 64, batch x seq_len = 32k tokens (data/attention_kernels.csv)
    (B200, 2250, True, 4096, 769), (B200, 2250, False, 16384, 905), (GB300, 2500, True, 8192, 1071),
])
def test_blackwells_cudnn_forward_at_head_dim_64_is_its_measured_rate(gpu, peak, causal, seq, tflops):
    assert attention_efficiency(gpu, "cudnn", "forward", causal, seq, 64) * peak == pytest.approx(tflops, rel=1e-9)


@pytest.mark.parametrize("gpu", [B200, GB200, GB300])
def test_blackwells_cudnn_backward_at_head_dim_64_follows_its_forward(gpu):
    # no backward at head dimension 64 is published for Blackwell: step 3 scales head dimension 128's by the forward
    def eff(direction: str, hd: int) -> float:
        return attention_efficiency(gpu, "cudnn", direction, True, 4096, hd)
    assert eff("backward", 64) == pytest.approx(eff("backward", 128) * eff("forward", 64) / eff("forward", 128),
                                                rel=1e-12)
    # GPT-OSS's head dimension runs its causal forward at 55-61 % of head dimension 128's rate at 4k tokens
    assert 0.5 < eff("forward", 64) / eff("forward", 128) < 0.65
