"""Frameworks as named sets of defaults: how Megatron-Core, NeMo, torchtitan, PyTorch FSDP, DeepSpeed and Composer run
a training step, as values of simdist's own fields.

A scenario names its framework in ``training.framework``; every field of ``training:`` and ``parallel:`` that the
framework decides and the file leaves out takes the framework's value (``data/frameworks.csv``: one row per
framework and field, with the source of the value: the framework's code or documentation at a named commit). A field
the file gives (under its name or any alias the section accepts) wins. ``megatron_core`` has no rows: simdist's field
defaults are Megatron-LM's own. The profiles are data read by the one step model; they add no code path of their own.
"""

from __future__ import annotations

import copy
import csv
from functools import cache
from importlib import resources
from typing import Any

import yaml

from simdist.spec.training import FRAMEWORKS

__all__ = ["framework_defaults", "framework_rows", "with_framework_defaults"]


@cache
def framework_rows() -> tuple[tuple[str, str, Any, str], ...]:
    """(framework, field path such as ``training.kernel_fusion``, value, source) of every row of frameworks.csv."""
    text = (resources.files("simdist.spec") / "data" / "frameworks.csv").read_text(encoding="utf-8")
    rows = []
    for r in csv.DictReader(line for line in text.splitlines() if not line.startswith("#")):
        if r["framework"] not in FRAMEWORKS:
            raise ValueError(f"frameworks.csv: unknown framework {r['framework']!r}")
        rows.append((r["framework"], r["field"], yaml.safe_load(r["value"]), r["source"]))
    return tuple(rows)


def framework_defaults(framework: str) -> dict[str, Any]:
    """{field path: value} of ``framework``'s profile."""
    return {path: value for name, path, value, _ in framework_rows() if name == framework}


def _names(section: type, field: str) -> tuple[str, ...]:
    """Every key of a section's mapping that sets ``field``: its name, its aliases, and the frameworks' names that
    translate into it (the section's ``SETS`` table)."""
    info = section.model_fields[field]
    names = [field]
    alias = info.validation_alias
    if alias is not None:
        names += [c for c in getattr(alias, "choices", [alias]) if isinstance(c, str)]
    names += [k for k, fields in getattr(section, "TRANSLATED", {}).items() if field in fields]
    return tuple(names)


def _given(section: type, data: dict, path: list[str]) -> bool:
    """Whether ``data`` (a section's mapping) sets the field at ``path`` (nested: host_overhead.step_gap)."""
    head, rest = path[0], path[1:]
    keys = [k for k in _names(section, head) if k in data]
    if not keys:
        return False
    if not rest:
        return True
    inner = data[keys[0]]
    nested = section.model_fields[head].annotation
    return isinstance(inner, dict) and _given(nested, inner, rest)  # type: ignore[arg-type]


def _put(data: dict, path: list[str], value: Any) -> None:
    for key in path[:-1]:
        data = data.setdefault(key, {})
    data[path[-1]] = value


GROUPS = (("training.recompute", "training.recompute_method", "training.recompute_num_layers",
           "training.recompute_modules"),)
"""Fields a framework sets together: where the file gives any of them, the profile sets none of them (a file's
``recompute: full`` is every layer, not the profile's every second one)."""


def with_framework_defaults(data: Any, sections: dict[str, type]) -> Any:
    """A scenario mapping with its framework's defaults filled in where the file leaves a field out (``sections``:
    the section name -> its spec class, for ``training`` and ``parallel``). Anything malformed is left for the specs
    to refuse with their own messages."""
    if not isinstance(data, dict) or not isinstance(data.get("training"), dict):
        return data
    training = data["training"]
    name = training.get("framework", "megatron_core")
    if not isinstance(name, str):
        return data
    from simdist.spec.training import TrainingSpec

    name = TrainingSpec._framework_names(name)  # the accepted spellings
    defaults = framework_defaults(name) if name in FRAMEWORKS else {}
    if not defaults:
        return data
    out = dict(data)
    for section in sections:
        given = out.get(section)
        if given is None:
            out[section] = {}
        elif isinstance(given, dict):
            out[section] = copy.deepcopy(given)
    def given(path: str) -> bool:
        section, *field = path.split(".")
        mapping = out.get(section)
        return isinstance(mapping, dict) and section in sections and _given(sections[section], mapping, field)

    taken = {p for group in GROUPS if any(given(q) for q in group) for p in group}
    for path, value in defaults.items():
        section, *field = path.split(".")
        mapping = out.get(section)
        if section not in sections or not isinstance(mapping, dict) or path in taken:
            continue
        if not given(path):
            _put(mapping, field, value)
    return out

