"""What autograd keeps of an eager decoder layer's element-wise modules (simdist.plan.activations.eager_saved_bytes)
against what torch keeps (validation.eager_saved), and by hand on a tiny layer."""

from __future__ import annotations

import pytest

from simdist.plan.activations import EAGER_NORM_EXTRA_BYTES, activation_bytes_per_layer, eager_saved_bytes
from simdist.plan.model import Model

TINY = Model("tiny", "decoder", num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
             ffn_hidden_size=128, seq_length=128, vocab_size=1000, swiglu=True)


def test_the_extra_bytes_are_those_torch_keeps():
    pytest.importorskip("torch")
    from validation.eager_saved import measure

    kept = measure()
    # a fused norm keeps its 2-byte input; the eager one its fp32 upcast and normalised bf16 copy instead
    assert kept["rmsnorm"] == pytest.approx(2 + EAGER_NORM_EXTRA_BYTES)
    assert kept["rotary"] == 0.0  # the complex multiply saves only the constant frequencies
    assert kept["swiglu"] == 6.0  # gate and up (a fused kernel's too) and the SiLU output (eager only)


def test_an_eager_layer_keeps_by_hand():
    # 128 tokens: two norms x 4 B x 64, and the SiLU output 2 B x 128, an element each token
    assert eager_saved_bytes(TINY, 2, 128, 1, 1) == 128 * (2 * 4 * 64 + 2 * 128)
    # tp 2 with sequence parallelism: each rank's norms see half the tokens, its SiLU output is half as wide
    assert eager_saved_bytes(TINY, 2, 128, 2, 2) == 128 * (2 * 4 * 64 / 2 + 2 * 128 / 2)
    fused = activation_bytes_per_layer(TINY, attention="flash", style="fused")
    eager = activation_bytes_per_layer(TINY, attention="flash", style="eager")
    assert eager - fused == eager_saved_bytes(TINY, 2, 128, 1, 1)
    gelu = Model("gelu", "decoder", num_layers=2, hidden_size=64, num_attention_heads=4, ffn_hidden_size=256,
                 seq_length=128, vocab_size=1000)
    assert eager_saved_bytes(gelu, 2, 128, 1, 1) == 0.0
