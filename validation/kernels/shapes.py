"""What ``python -m validation.kernels`` measures: `KernelCase`s from a scenario's layer and from sweeps (no torch).

- **a scenario's layer** (``--scenario``): the GEMMs and the fused attention kernel of one layer's forward and
  backward as simdist costs them (simdist.plan.layer_cost.layer_work on the scenario's step configuration:
  tensor-parallel shards, micro-batch, sequence length, expert parallelism; the first layer of each kind: dense,
  MoE, sliding window), each distinct (m, n, k, batch) once (an MoE layer's grouped expert GEMMs: batch = the
  local experts, timed as one batched GEMM), named after the
  first kernel of that shape (``qkv``, ``mlp_up_weight_grad``, ...); materialized attention's batched GEMMs are
  timed as batched GEMMs.
- **a GEMM sweep** (``--gemm-sizes``): square m = n = k GEMMs, and for each size below the largest a skinny one
  (m = the size, n = k = the largest), so that the smallest dimension, which sets the efficiency knee, varies at
  a fixed large n k.
- **attention** (``--attention``): torch's scaled_dot_product_attention on (batch, heads, seq, head_dim), causal
  and not, forward and backward.
- **memory kernels** (``--memory-sizes``, elements): layer_norm over rows of ``--norm-width``, gelu, an add and a
  softmax, each counted as simdist counts its kernels (simdist.plan.layer_cost._mem: layernorm reads and writes
  each element, 8 FLOP; gelu 2 accesses, 8 FLOP; add 3 accesses, 1 FLOP; softmax 2 accesses, 5 FLOP).

FLOPs and bytes follow simdist.plan.layer_cost: a GEMM does 2 m n k per batch entry and reads A and B, writes C;
fused attention 4 b a s^2 d forward (halved when causal) and 2.5x that backward (the FlashAttention-2 paper's
count, Dao 2023 sec. 3.1.2), reading Q, K, V and writing O (backward twice that).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from validation.spawn import HarnessError

__all__ = ["MEMORY_OPS", "KernelCase", "attention_cases", "gemm_sweep", "memory_cases", "parse_attention",
           "scenario_cases"]

# (name, accesses per element, FLOP per element): simdist.plan.layer_cost's counts for these kernels
MEMORY_OPS: tuple[tuple[str, int, float], ...] = (("layer_norm", 2, 8.0), ("gelu", 2, 8.0), ("add", 3, 1.0),
                                                 ("softmax", 2, 5.0))


@dataclass(frozen=True, slots=True)
class KernelCase:
    """One kernel to time: ``kind`` gemm (m, n, k, batch), attention (batch, heads, seq, head_dim, causal,
    direction) or memory (elements, op name)."""

    kind: str
    name: str
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    heads: int = 0
    seq: int = 0
    head_dim: int = 0
    causal: bool = False
    direction: str = "forward"
    elements: int = 0
    width: int = 0

    def flops(self) -> float:
        if self.kind == "gemm":
            return 2.0 * self.m * self.n * self.k * self.batch
        if self.kind == "attention":
            forward = 4.0 * self.batch * self.heads * self.seq**2 * self.head_dim * (0.5 if self.causal else 1.0)
            return forward * (2.5 if self.direction == "backward" else 1.0)
        return dict((n, f) for n, _, f in MEMORY_OPS)[self.name] * self.elements

    def hbm_bytes(self, element_size: int) -> float:
        if self.kind == "gemm":
            return float(self.m * self.k + self.k * self.n + self.m * self.n) * self.batch * element_size
        if self.kind == "attention":
            io = 4.0 * self.batch * self.heads * self.seq * self.head_dim * element_size
            return io * (2.0 if self.direction == "backward" else 1.0)
        return float(dict((n, a) for n, a, _ in MEMORY_OPS)[self.name] * self.elements * element_size)


def gemm_sweep(sizes: tuple[int, ...]) -> list[KernelCase]:
    """Square GEMMs of each size, and skinny ones (m = size, n = k = the largest) below the largest."""
    if not sizes:
        return []
    top = max(sizes)
    cases = [KernelCase("gemm", "sweep_square", s, s, s) for s in sorted(set(sizes))]
    cases += [KernelCase("gemm", "sweep_skinny", s, top, top) for s in sorted(set(sizes)) if s < top]
    return cases


def parse_attention(text: str) -> tuple[tuple[int, int, int, int], ...]:
    """``b,heads,seq,head_dim[;...]`` as shapes; one `HarnessError` line for anything else."""
    shapes = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        try:
            values = tuple(int(v) for v in part.split(","))
        except ValueError:
            values = ()
        if len(values) != 4 or min(values) < 1:
            raise HarnessError(f"--attention '{part}' is not batch,heads,seq,head_dim of positive integers "
                               "(e.g. 1,8,512,64; several separated by ';')")
        shapes.append(values)
    return tuple(shapes)


def attention_cases(shapes: tuple[tuple[int, int, int, int], ...]) -> list[KernelCase]:
    """Each shape causal and not, forward and backward."""
    return [KernelCase("attention", "sdpa", batch=b, heads=a, seq=s, head_dim=d, causal=causal, direction=direction)
            for b, a, s, d in shapes for causal in (True, False) for direction in ("forward", "backward")]


def memory_cases(sizes: tuple[int, ...], width: int) -> list[KernelCase]:
    """Every memory op at each size (elements, rounded to whole rows of ``width`` for the row-wise ops)."""
    out = []
    for size in sorted(set(sizes)):
        rows = max(1, size // width)
        for name, _, _ in MEMORY_OPS:
            row_wise = name in ("layer_norm", "softmax")
            out.append(KernelCase("memory", name, elements=rows * width if row_wise else size, width=width))
    return out


def scenario_cases(path: str | Path) -> tuple[list[KernelCase], str]:
    """The GEMMs and fused attention of one layer of the scenario (module doc), and a one-line description."""
    from simdist.api import load_scenario
    from simdist.plan.layer_cost import layer_work
    from simdist.plan.layout import step_config_of
    from simdist.plan.model_presets import resolve_model

    scenario = load_scenario(path)
    model = resolve_model(scenario.spec.model, base_dir=Path(path).parent)
    cfg = step_config_of(scenario.spec, scenario.topology, model)
    kinds = list(zip(model.moe_layer_flags(), model.window_layer_flags(), strict=True)) if model.kind == "decoder" \
        else [(False, False)]
    firsts = [kinds.index(kind) for kind in dict.fromkeys(kinds)]  # the first layer of each kind (dense, MoE, window)
    kernels = []
    for i in firsts:
        work = layer_work(cfg.model, tp=cfg.mesh.tp, cp=cfg.mesh.cp, sequence_parallel=cfg.sequence_parallel,
                          micro_batch_size=cfg.micro_batch_size, precision=cfg.precision, tp_style=cfg.tp_style,
                          attention=cfg.attention, attention_mask=cfg.attention_mask, fp8_recipe=cfg.fp8_recipe,
                          layer=i, experts=cfg.expert_parallel)
        kernels += [*work.forward, *work.backward]
    cases: list[KernelCase] = []
    seen: set[tuple] = set()
    for kernel in kernels:
        if kernel.gemm_mnk and kernel.attention is None:  # GEMMs, and materialized attention's batched GEMMs
            m, n, k = kernel.gemm_mnk
            batch = max(1, round(kernel.flops / (2.0 * m * n * k)))
            key = ("gemm", m, n, k, batch)
            if key not in seen:
                seen.add(key)
                cases.append(KernelCase("gemm", kernel.name, m, n, k, batch))
        elif kernel.attention is not None:
            shape = kernel.attention
            heads = max(cfg.model.num_attention_heads // cfg.mesh.tp, 1)
            seq = int(shape.parts[0][2])
            key = ("attention", shape.direction)
            if key not in seen:
                seen.add(key)
                cases.append(KernelCase("attention", kernel.name, batch=cfg.micro_batch_size, heads=heads, seq=seq,
                                        head_dim=shape.head_dim, causal=cfg.attention_mask == "causal",
                                        direction=shape.direction))
    what = (f"{scenario.source}: layer(s) {', '.join(map(str, firsts))} of {model.num_layers}, hidden "
            f"{model.hidden_size}, tp {cfg.mesh.tp}, "
            f"micro-batch {cfg.micro_batch_size}, sequence {model.seq_length}")
    return cases, what
