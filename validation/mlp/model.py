"""The CS336 lecture's MLP (lecture 8, "parallelism" code): square layers, GELU after each, loss = mean of x^2.

``x -> gelu(x @ W_1) -> ... -> gelu(x @ W_L)``, loss = mean over the batch and the width of the final
activation squared; weights ``randn(width, width) / sqrt(width)`` (the lecture's ``get_init_params``), no bias,
SGD update. Weights and data come from seeded generators so every rank and the single-process reference
build identical tensors; a cut then takes its shard (rows of the batch, columns of a weight, whole layers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["SGD", "MLPConfig", "full_loss_scale", "init_weights", "make_data", "reference_step", "stage_forward"]


@dataclass(frozen=True, slots=True)
class MLPConfig:
    num_layers: int = 4
    width: int = 1024
    batch: int = 128
    seed: int = 0
    lr: float = 1e-2


def init_weights(cfg: MLPConfig, device: Any = "cpu") -> list[Any]:
    """Full ``width x width`` weights, one per layer, identical on every process (seeded CPU generator)."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed)
    # CS336 lecture 8 get_init_params: randn(num_inputs, num_outputs) / sqrt(num_outputs).
    return [(torch.randn(cfg.width, cfg.width, generator=gen) / math.sqrt(cfg.width)).to(device)
            for _ in range(cfg.num_layers)]


def make_data(cfg: MLPConfig, device: Any = "cpu") -> Any:
    """The global batch, ``batch x width``, identical on every process."""
    import torch

    gen = torch.Generator().manual_seed(cfg.seed + 1)
    return torch.randn(cfg.batch, cfg.width, generator=gen).to(device)


def stage_forward(weights: list[Any], x: Any) -> Any:
    """``gelu(x @ W)`` for each weight in turn."""
    import torch.nn.functional as F

    for w in weights:
        x = F.gelu(x @ w)
    return x


def full_loss_scale(cfg: MLPConfig) -> float:
    """1 / (batch x width): a shard's sum of squares times this is its share of the global mean."""
    return 1.0 / (cfg.batch * cfg.width)


def reference_step(cfg: MLPConfig, device: Any = "cpu") -> tuple[list[Any], list[Any]]:
    """One single-process step on the whole batch: (gradients, updated weights), both full."""
    weights = [w.clone().requires_grad_() for w in init_weights(cfg, device)]
    loss = stage_forward(weights, make_data(cfg, device)).square().mean()
    loss.backward()
    grads = [w.grad.detach().clone() for w in weights]
    SGD(weights, cfg.lr).step()
    return grads, [w.detach().clone() for w in weights]


class SGD:
    """Plain SGD, w <- w - lr g (torch.optim.SGD without momentum; its constructor costs seconds on first use)."""

    def __init__(self, params: list[Any], lr: float) -> None:
        self.params, self.lr = params, lr

    def zero_grad(self) -> None:
        for p in self.params:
            if p.grad is not None:
                p.grad.zero_()

    def step(self) -> None:
        import torch

        with torch.no_grad():
            for p in self.params:
                p.add_(p.grad, alpha=-self.lr)
