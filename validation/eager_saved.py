"""Measure what autograd keeps of an eager decoder layer's element-wise modules, in bytes per element of their
input: what simdist.plan.activations.eager_saved_bytes adds to a fused layer's activations.

Three modules as eager PyTorch code writes them (simdist.plan.elementwise's eager op lists): the upcast RMSNorm
(Hugging Face's LlamaRMSNorm, torchtitan's and fms-fsdp's: cast to fp32, mean of squares, multiply by its reciprocal
square root, cast back, times the weight), the rotary embedding as complex numbers (torchtitan's apply_rotary_emb:
view the fp32 upcast of Q as complex, multiply by the constant frequencies, back to real and to bf16) and SwiGLU (silu
of the gate times the up projection). Each runs forward once on a bf16 input that requires a gradient, under
``torch.autograd.graph.saved_tensors_hooks``; the bytes are those of the distinct storages it saves, less the
module's constants (the norm's weight, the frequencies).

    python -m validation.eager_saved     # one line per module: bytes kept per input element

Needs torch (``pip install '.[validation]'``).
"""

from __future__ import annotations

import argparse
import sys

from validation.harness_cli import cli_guard

TOKENS, WIDTH, HEADS, HEAD_DIM = 256, 128, 4, 32


def _saved_bytes(fn, *args) -> int:
    """Bytes of the distinct storages autograd saves while ``fn(*args)`` runs forward."""
    import torch

    storages: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(storages.values())


def measure() -> dict[str, float]:
    """Bytes kept per input element by each module (module docstring)."""
    import torch
    import torch.nn.functional as F

    def rmsnorm(x, weight):
        upcast = x.to(torch.float32)
        normed = upcast * torch.rsqrt(upcast.pow(2).mean(-1, keepdim=True) + 1e-5)
        return weight * normed.to(x.dtype)

    def rotary(q, freqs):
        pairs = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * freqs).flatten(-2).type_as(q)

    def swiglu(gate, up):
        return F.silu(gate) * up

    x = torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16, requires_grad=True) * 1.0  # not a leaf: a layer's tensor
    weight = torch.ones(WIDTH, dtype=torch.bfloat16, requires_grad=True)
    q = torch.randn(TOKENS, HEADS, HEAD_DIM, dtype=torch.bfloat16, requires_grad=True) * 1.0
    freqs = torch.polar(torch.ones(TOKENS, 1, HEAD_DIM // 2), torch.randn(TOKENS, 1, HEAD_DIM // 2))
    gate = torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16, requires_grad=True) * 1.0
    up = torch.randn(TOKENS, WIDTH, dtype=torch.bfloat16, requires_grad=True) * 1.0
    rows = TOKENS * WIDTH
    # the per-row reciprocal square roots (TOKENS fp32) are the norm's statistics: counted apart
    norm = (_saved_bytes(rmsnorm, x, weight) - weight.untyped_storage().nbytes() - 4 * TOKENS) / rows
    rope = (_saved_bytes(rotary, q, freqs) - freqs.untyped_storage().nbytes()) / q.numel()
    return {"rmsnorm": norm, "rotary": rope, "swiglu": _saved_bytes(swiglu, gate, up) / rows}


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m validation.eager_saved",
                            description=__doc__.splitlines()[0]).parse_args(argv)
    for name, value in measure().items():
        print(f"{name:8s} {value:.2f} bytes kept per input element")
    return 0


if __name__ == "__main__":
    sys.exit(cli_guard(main))
