"""DeepSpeed's pipeline partition methods (``parallel.partition_method``): how Megatron-DeepSpeed's PipelineModule
cuts its layer list over the pipeline stages (simdist.plan.layer_split reads the decoder layers per stage)."""

from __future__ import annotations

import re

from simdist.errors import LayoutError
from simdist.plan.model import Model

__all__ = ["deepspeed_layers", "deepspeed_parts", "partition_balanced", "partition_uniform"]


def _fail(problem: str, field: str, fix: str) -> LayoutError:
    return LayoutError(problem, field=field, fix=fix)


def deepspeed_layers(model: Model, precision: str) -> list[tuple[str, int]]:
    """(class name, parameters) of each entry of Megatron-DeepSpeed's GPTModelPipe layer list, in order
    (megatron/model/gpt_model.py, dense models): the fp16/bf16 cast, the embedding, the decoder layers, the final
    norm, the output layer (the tied embedding again, or LMHeadPipe), the cast back to fp32.

    # Assumption: parameter counts as DeepSpeed's _count_layer_params sees them, unsharded (tensor parallelism
    # shards every large matrix alike, so the balance is the same); the embedding counts vocab x h (learned
    # position embeddings, s x h, are left out) and the tied output layer counts it again (DeepSpeed builds the
    # tied layer on the last stage too).
    """
    h, v = model.hidden_size, model.vocab_size
    half = precision in ("fp16", "bf16", "fp8")
    layers: list[tuple[str, int]] = []
    if half:
        layers.append(("_to_float16", 0))
    if model.kind == "decoder":
        layers.append(("EmbeddingPipe", v * h))
    layers += [("ParallelTransformerLayerPipe", n) for n in model.layer_counts()]
    if model.kind == "decoder":
        layers.append(("RMSNorm", h) if model.swiglu else ("LayerNorm", 2 * h))
        layers.append(("EmbeddingPipe", v * h) if model.tied_embeddings else ("LMHeadPipe", v * h))
    if half:
        layers.append(("float16_to_fp32", 0))
    return layers


def partition_uniform(num_items: int, num_parts: int) -> list[int]:
    """Part boundaries (num_parts + 1 offsets) of DeepSpeed's ``uniform`` method (deepspeed/runtime/utils.py
    partition_uniform): num_items // num_parts items each, the first num_items % num_parts parts one more; with
    fewer items than parts, one item each and the rest empty."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    base, extra = divmod(num_items, num_parts)
    bounds = [0]
    for p in range(num_parts):
        bounds.append(bounds[-1] + base + (1 if p < extra else 0))
    return bounds


def partition_balanced(weights: list[int], num_parts: int) -> list[int]:
    """Part boundaries of DeepSpeed's balanced partition (deepspeed/runtime/utils.py partition_balanced, used by
    the ``parameters`` and ``type:`` methods): a dynamic programme over prefixes that, for each prefix and part
    count, keeps the split whose parts' (largest - smallest) weight is least, each state carrying its largest and
    smallest part, ties going to the latest cut; with no more items than parts, `partition_uniform`."""
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # state (i items, j parts) -> (spread, largest part, smallest part, cut)
    best: dict[tuple[int, int], tuple[float, float, float, int]] = {(0, 0): (0.0, 0.0, inf, 0)}
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            chosen: tuple[float, float, float, int] | None = None
            for k in range(i):
                prev = best.get((k, j - 1))
                part = prefix[i] - prefix[k]
                hi = max(prev[1], part) if prev is not None else inf
                lo = min(prev[2], part) if prev is not None else inf
                spread = hi - lo if prev is not None else inf
                if chosen is None or chosen[0] >= spread:
                    chosen = (spread, hi, lo, k)
            assert chosen is not None
            best[(i, j)] = chosen
    bounds = [n]
    for j in range(m, 0, -1):
        bounds.append(best[(bounds[-1], j)][3])
    return bounds[::-1]


def deepspeed_parts(method: str, model: Model, pp: int, vpp: int, precision: str) -> tuple[int, ...]:
    """Decoder layers per stage of DeepSpeed's ``partition_method`` over `deepspeed_layers`; a one-line
    LayoutError naming parallel.partition_method where it cannot split."""
    field = "parallel.partition_method"
    if vpp > 1:
        raise _fail("DeepSpeed's pipeline (partition_method) runs one chunk per stage, but vpp > 1", field,
                    "set parallel.vpp: 1, or split with pipeline_layout / layers_per_stage")
    layers = deepspeed_layers(model, precision)
    if method == "uniform":
        bounds = partition_uniform(len(layers), pp)
    elif method == "parameters":
        bounds = partition_balanced([w for _, w in layers], pp)
    elif method.startswith("type:"):
        try:
            pattern = re.compile(method[5:], re.IGNORECASE)
        except re.error as err:
            raise _fail(f"partition_method {method!r}: bad regular expression ({err})", field,
                        "write type:transformer or type:transformer|embedding") from None
        weights = [1 if pattern.search(name) else 0 for name, _ in layers]
        if not any(weights):
            raise _fail(f"partition_method {method!r} matches none of the layers "
                        f"({', '.join(sorted({name for name, _ in layers}))})", field,
                        "write type:transformer (DeepSpeed's 'found no valid layers to partition')")
        bounds = partition_balanced(weights, pp)
    else:
        raise _fail(f"unknown partition_method {method!r}", field,
                    "use uniform, parameters or type:REGEX (DeepSpeed PipelineModule's methods)")
    names = [name for name, _ in layers]
    stages = [names[bounds[s]:bounds[s + 1]] for s in range(pp)]
    if model.kind == "decoder" and "EmbeddingPipe" not in stages[0]:
        raise _fail(f"partition_method {method!r} leaves stage 0 without the embedding ({len(layers)} layers on "
                    f"{pp} stages)", field, "use fewer stages, or partition_method: parameters")
    return tuple(st.count("ParallelTransformerLayerPipe") for st in stages)
