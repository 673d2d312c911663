"""The frameworks' own argument names, accepted in scenario files beside simdist's.

Kinds: a field's other names (``alias``: Megatron-LM's ``tensor_model_parallel_size`` for ``tp``), a boolean
switch of a framework that sets one of simdist's fields (``switch``: Megatron-LM's ``overlap_grad_reduce: true`` is
``grad_reduce: overlapped``), a framework's enumerated option that sets several of simdist's fields (``choice``:
PyTorch FSDP's ``sharding_strategy: SHARD_GRAD_OP`` is ``zero_stage: 3`` with ``reshard_after_forward: false``), and
torchtitan's activation-checkpointing section (``torchtitan_checkpointing``).
A translated name that contradicts the field it sets, given too, is refused with both named.
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices

from simdist.spec.base import FieldProblem

__all__ = ["alias", "choice", "switch", "torchtitan_checkpointing"]


def alias(*names: str) -> AliasChoices:
    return AliasChoices(*names)


def switch(data: Any, name: str, field: str, on: Any, off: Any, framework: str = "Megatron-LM") -> Any:
    """Translate ``framework``'s boolean argument ``name`` (e.g. ``overlap_grad_reduce: true``) into simdist's
    ``field`` (``on`` when true, ``off`` when false; ``off`` None: false leaves the default), refusing a
    contradiction with ``field`` given too."""
    if not isinstance(data, dict) or name not in data:
        return data
    value = data[name]
    if not isinstance(value, bool):
        raise FieldProblem((name,), f"{name} is a {framework} switch: write true or false (fix: "
                                    f"write {name}: true, or set {field} instead)")
    out = {k: v for k, v in data.items() if k != name}
    wanted = on if value else off
    if wanted is None:
        if field in out and out[field] == on:
            raise FieldProblem((name,), f"{name}: false contradicts {field}: {on} (fix: drop one of them)")
        return out
    if field in out and out[field] != wanted:
        raise FieldProblem((name,), f"{name}: {str(value).lower()} contradicts {field}: {out[field]} "
                                    "(fix: drop one of them)")
    out[field] = wanted
    return out


def choice(data: Any, name: str, options: dict[str, dict[str, Any]], framework: str) -> Any:
    """Translate ``framework``'s enumerated argument ``name`` into the simdist fields of ``options[value]``
    (values compared case-insensitively), refusing an unknown value or a contradiction with a field given too."""
    if not isinstance(data, dict) or name not in data:
        return data
    value = data[name]
    key = str(value).lower() if isinstance(value, str | int) and not isinstance(value, bool) else None
    table = {k.lower(): v for k, v in options.items()}
    if key not in table:
        raise FieldProblem((name,), f"{name}: {value!r} is not a {framework} value simdist knows (fix: write one "
                                    f"of {', '.join(options)})")
    out = {k: v for k, v in data.items() if k != name}
    for field, wanted in table[key].items():
        if field in out and out[field] != wanted:
            raise FieldProblem((name,), f"{name}: {value} means {field}: {wanted}, which contradicts {field}: "
                                        f"{out[field]} (fix: drop one of them)")
        out[field] = wanted
    return out


def torchtitan_checkpointing(data: Any) -> Any:
    """torchtitan's ``activation_checkpoint: {mode, selective_ac_option}`` (or ``selective_ac_option`` alone, with mode
    selective) as simdist's
    recompute fields: mode none / full as themselves; selective with ``op`` is recompute: op; selective with an
    integer N is full recompute of every N-th layer (torchtitan: "apply full AC to every N-th layer")."""
    if not isinstance(data, dict):
        return data
    nested = data.get("activation_checkpoint")
    if nested is None and "selective_ac_option" not in data:
        return data
    out = {k: v for k, v in data.items() if k not in ("activation_checkpoint", "selective_ac_option")}
    given = dict(nested) if isinstance(nested, dict) else {}
    if nested is not None and not isinstance(nested, dict):
        raise FieldProblem(("activation_checkpoint",), "activation_checkpoint is torchtitan's section: write "
                                                       "{mode: selective, selective_ac_option: op} (fix: or set "
                                                       "recompute)")
    if "selective_ac_option" in data:
        given["selective_ac_option"] = data["selective_ac_option"]
    unknown = set(given) - {"mode", "selective_ac_option"}
    if unknown:
        raise FieldProblem(("activation_checkpoint",), f"activation_checkpoint: unknown key {sorted(unknown)[0]} (fix: "
                                                       "use mode and selective_ac_option)")
    mode = str(given.get("mode", "selective")).lower()
    option = given.get("selective_ac_option", "2" if mode == "selective" else None)
    if mode in ("none", "full"):
        wanted: dict[str, Any] = {"recompute": mode}
    elif mode == "selective" and str(option).lower() == "op":
        wanted = {"recompute": "op"}
    elif mode == "selective" and str(option).isascii() and str(option).isdecimal() and int(str(option)) >= 1:
        wanted = {"recompute": "full", "recompute_method": "every", "recompute_num_layers": int(str(option))}
    else:
        raise FieldProblem(("activation_checkpoint",), f"activation_checkpoint mode {given.get('mode')!r} with "
                                                       f"selective_ac_option {option!r} is not torchtitan's (fix: mode "
                                                       "none, full or selective; selective_ac_option op or a layer "
                                                       "interval such as 2)")
    for field, value in wanted.items():
        if field in out and out[field] != value:
            raise FieldProblem(("activation_checkpoint",), f"activation_checkpoint means {field}: {value}, which "
                                                           f"contradicts {field}: {out[field]} (fix: drop one of them)")
        out[field] = value
    return out
