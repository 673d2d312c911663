"""Checks of a Hugging Face ``config.json`` before it is read as a model (``model: {hf_config: ...}``).

simdist reads a dense decoder's keys (simdist.plan.model_presets); a file it would misread is refused here,
with the key named: a mixture-of-experts config (its expert MLPs would be costed as one dense MLP, so the
prediction would be silently wrong; MoE support comes with expert parallelism), and sizes beyond the
physical limits that inline model fields have (simdist.limits).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from simdist.errors import SpecError
from simdist.files import read_text
from simdist.limits import FFN_HIDDEN_SIZE, HIDDEN_SIZE, NUM_HEADS, NUM_LAYERS, SEQ_LENGTH, VOCAB_SIZE, Limit

__all__ = ["MOE_KEYS", "check_hf_config"]

MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok",
            "n_shared_experts", "moe_intermediate_size", "num_experts_per_token", "router_topk", "moe_topk")
"""Keys of transformers' MoE configs (Mixtral, Qwen2-MoE/OLMoE, DeepSeek-V2/V3, DBRX, Jamba, ...)."""

_BOUNDS: dict[str, Limit] = {
    "hidden_size": HIDDEN_SIZE, "num_attention_heads": NUM_HEADS, "num_key_value_heads": NUM_HEADS,
    "num_hidden_layers": NUM_LAYERS, "intermediate_size": FFN_HIDDEN_SIZE, "max_position_embeddings": SEQ_LENGTH,
    "vocab_size": VOCAB_SIZE, "head_dim": HIDDEN_SIZE,
}


def _is_moe(value: Any) -> bool:
    """A key that makes the model a mixture of experts: more than one expert (null, 0 and 1 are dense)."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, (int, float)):
        return not math.isfinite(value) or value > 1
    return bool(value)


def check_hf_config(path: str | Path, *, field: str = "model.hf_config") -> dict[str, Any]:
    """The config as a JSON object, refused (one SpecError) if simdist cannot read it as a dense decoder."""
    p = Path(path)
    text = read_text(p, field=field)
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        where = f"line {err.lineno}" if isinstance(err, json.JSONDecodeError) else "nesting"
        raise SpecError(f"{p} is not JSON ({where})", field=field, fix="give a Hugging Face config.json") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{p} is not a JSON object", field=field, fix="give a Hugging Face config.json")
    sub = doc.get("text_config")  # multimodal configs nest the language model
    inner = sub if isinstance(sub, dict) else {}
    for key in MOE_KEYS:
        for where, d in (("", doc), ("text_config.", inner)):
            if key in d and _is_moe(d[key]):
                raise SpecError(
                    f"{p} describes a mixture-of-experts model ({where}{key}: {d[key]!r}); simdist would cost its "
                    "expert MLPs as one dense MLP", field=f"{field}.{where}{key}",
                    fix="describe a dense model (MoE support comes with expert parallelism)")
    for key, limit in _BOUNDS.items():
        value = doc.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and (
                not math.isfinite(value) or value > limit.value):
            raise SpecError(f"{p}: {key} {value!r} is above the limit of {limit.text()} ({limit.reason})",
                            field=f"{field}.{key}", fix="give the model's real size")
    return doc
