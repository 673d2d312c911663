"""Reading input files: YAML with line numbers, ``--set key=value`` overrides, one-line errors.

A validation failure becomes one `SpecError` naming the file and line, the field path and the fix,
so that the CLI can print it as a single line (exit status 2).
"""

from __future__ import annotations

import copy
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from simdist.errors import SpecError
from simdist.files import read_text
from simdist.limits import YAML_BYTES, YAML_DEPTH, YAML_NODES
from simdist.spec.base import FieldProblem

M = TypeVar("M", bound=BaseModel)
Path_ = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Document:
    """Parsed YAML plus where each field came from (for error messages)."""

    data: Any
    source: str
    lines: dict[Path_, str] = field(default_factory=dict)
    """Where each field was written: ``file:line`` (or ``--set``), by path."""

    def where(self, path: Path_) -> str:
        """``file:line`` of the deepest known prefix of ``path`` (just ``file`` if none)."""
        for end in range(len(path), -1, -1):
            place = self.lines.get(tuple(path[:end]))
            if place is not None:
                return place
        return self.source

    def sub(self, *path: str | int) -> Document:
        """The part of this document under ``path`` (data and locations re-rooted)."""
        data = self.data
        for part in path:
            data = data.get(part) if isinstance(data, dict) else None
        n = len(path)
        lines = {key[n:]: place for key, place in self.lines.items() if key[:n] == tuple(path)}
        return Document(data=data, source=lines.get((), self.source), lines=lines)

    def overlay(self, other: Document) -> Document:
        """``other`` deep-merged over this document; locations follow whichever wrote the field."""
        base = self.data if isinstance(self.data, dict) else {}
        top = other.data if isinstance(other.data, dict) else {}
        lines = dict(self.lines)
        lines.update({key: place for key, place in other.lines.items() if key})
        return Document(data=deep_merge(base, top), source=self.source, lines=lines)

    def with_assignments(self, assignments: list[str], source: str = "--set") -> Document:
        """Apply ``key=value`` overrides; errors in them are located at ``source``."""
        lines = dict(self.lines)
        for text in assignments:
            keys, _ = parse_assignment(text)
            lines[tuple(keys)] = source
        data = apply_overrides(self.data if isinstance(self.data, dict) else {}, assignments)
        return Document(data=data, source=self.source, lines=lines)


def _line_map(node: yaml.Node, path: Path_, source: str, out: dict[Path_, str]) -> None:
    out.setdefault(path, f"{source}:{node.start_mark.line + 1}")
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else str(key_node.value)
            out[(*path, key)] = f"{source}:{key_node.start_mark.line + 1}"
            _line_map(value_node, (*path, key), source, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_map(item, (*path, i), source, out)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_duplicates(node: yaml.MappingNode, source: str) -> None:
    seen: dict[tuple[str, str], int] = {}
    for key_node, _ in node.value:
        if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = (key_node.tag, key_node.value)
        line = key_node.start_mark.line + 1
        if key in seen:
            raise SpecError(f"key '{key_node.value}' is given twice (lines {seen[key]} and {line})",
                            source=f"{source}:{line}", fix="keep one of them")
        seen[key] = line


def _check_tree(root: yaml.Node, source: str) -> None:
    """Refuse duplicate keys, recursive aliases, nesting beyond YAML_DEPTH and documents whose aliases expand
    them beyond YAML_NODES values (billion laughs): one pass, each distinct node once."""
    size: dict[int, int] = {}
    visiting: set[int] = set()
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 0, False)]
    while stack:
        node, depth, done = stack.pop()
        nid = id(node)
        if done:
            visiting.discard(nid)
            size[nid] = total = 1 + sum(size[id(c)] for c in _children(node))
            if total > YAML_NODES.value:
                raise SpecError(
                    f"aliases expand this document to {total:,}+ values, above the limit of {YAML_NODES.text()}",
                    source=f"{source}:{node.start_mark.line + 1}",
                    fix="write the values out instead of nesting aliases (is this a billion-laughs file?)")
            continue
        if nid in size:
            continue
        if depth > YAML_DEPTH.value:
            raise SpecError(f"nested deeper than {YAML_DEPTH.text()}", source=f"{source}:{node.start_mark.line + 1}",
                            fix="see `simdist schema` for the fields and their nesting")
        if isinstance(node, yaml.MappingNode):
            _check_duplicates(node, source)
        visiting.add(nid)
        stack.append((node, depth, True))
        for child in _children(node):
            if id(child) in visiting:
                raise SpecError("an alias refers to a value that contains it (a recursive alias)",
                                source=f"{source}:{child.start_mark.line + 1}", fix="remove the alias")
            if id(child) not in size:
                stack.append((child, depth + 1, False))


_COMPOSER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load(text: str, source: str) -> tuple[yaml.Node | None, Any]:
    """(node tree, data) of YAML text through the checks of `_check_tree`; a problem is one SpecError."""
    try:
        node = yaml.compose(text, Loader=_COMPOSER)
        if node is None:
            return None, None
        _check_tree(node, source)
        constructor = yaml.SafeLoader("")
        try:
            data = constructor.construct_document(node)
        finally:
            constructor.dispose()
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = getattr(err, "problem", None) or str(err)
        raise SpecError(f"malformed YAML: {problem}", source=where, fix="check indentation and quoting") from None
    except RecursionError:
        raise SpecError(f"nested deeper than {YAML_DEPTH.text()}", source=source,
                        fix="see `simdist schema` for the fields and their nesting") from None
    except (TypeError, ValueError) as err:  # e.g. a mapping used as a key, a bad !!binary or timestamp
        raise SpecError(f"malformed YAML: {err}", source=source, fix="check the value's syntax") from None
    return node, data


def parse_yaml(text: str, source: str) -> Document:
    """Parse YAML text safely (see `_check_tree`); a syntax error names the file and line."""
    node, data = _load(text, source)
    lines: dict[Path_, str] = {}
    if node is not None:
        _line_map(node, (), source, lines)
    return Document(data=data, source=source, lines=lines)


def read_yaml(path: str | Path) -> Document:
    """Read a YAML file that must hold a mapping."""
    p = Path(path)
    doc = parse_yaml(read_text(p, limit=YAML_BYTES), str(p))
    if not isinstance(doc.data, dict):
        raise SpecError("expected a mapping of fields at the top level", source=str(p), fix="see `simdist schema`")
    return doc


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` laid over it, recursively for nested mappings (inputs untouched)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def parse_assignment(text: str) -> tuple[list[str], Any]:
    """``'inter_node.nic_bandwidth=400 Gb/s'`` -> (['inter_node', 'nic_bandwidth'], '400 Gb/s')."""
    key, sep, raw = text.partition("=")
    keys = [k.strip() for k in key.split(".")]
    if not sep or not all(keys):
        raise SpecError(f"cannot read override '{text}'", source="--set", fix="write key=value, e.g. num_nodes=4")
    try:
        value = _load(raw, "--set")[1] if raw.strip() else None
    except SpecError as err:
        if "malformed YAML" not in err.problem:
            raise  # an alias bomb or a duplicate key: refused, not taken as text
        value = raw
    return keys, value


def apply_overrides(data: dict[str, Any], assignments: list[str]) -> dict[str, Any]:
    """Apply ``--set a.b=value`` assignments to a copy of ``data`` (values read as YAML scalars)."""
    out = copy.deepcopy(data)
    for text in assignments:
        keys, value = parse_assignment(text)
        node = out
        for depth, key in enumerate(keys[:-1]):
            child = node.get(key)
            if child is None:
                child = node[key] = {}
            if not isinstance(child, dict):
                raise SpecError(
                    f"cannot set '{'.'.join(keys)}': '{'.'.join(keys[: depth + 1])}' is not a mapping",
                    source="--set",
                    fix="set the field itself",
                )
            node = child
        node[keys[-1]] = value
    return out


def _field_names(model: type[BaseModel] | None, path: Path_) -> list[str] | None:
    """Field names of the model found at ``path`` below ``model`` (for 'valid fields are ...')."""
    for part in path:
        if model is None:
            return None
        info = model.model_fields.get(str(part))
        if info is None:
            return None
        model = _model_in(info.annotation)
    return sorted(model.model_fields) if model is not None else None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _clean_loc(loc: tuple[Any, ...], data: Any) -> Path_:
    """Drop pydantic's union-branch tags (``'GpuSpec'``, ``'str'``) that are not keys of the data."""
    out: list[str | int] = []
    node = data
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and part < len(node)
        if in_dict or in_list:
            out.append(part)
            node = node[part]
        elif isinstance(node, dict) and isinstance(part, str) and not _looks_like_tag(part):
            out.append(part)  # a missing or unknown field: keep its name
            node = None
        # else: a union tag; skip it
    return tuple(out)


def _looks_like_tag(part: str) -> bool:
    return part in {"str", "int", "float", "bool", "none"} or part[:1].isupper() or "[" in part


def _render(path: Path_) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


_TYPE_FIXES = {
    "list_type": "write a list, e.g. [a, b]", "dict_type": "write a mapping, e.g. {key: value}",
    "model_type": "write a mapping of this section's fields", "model_attributes_type": "write a mapping of this "
    "section's fields", "string_type": "write text", "bool_type": "write true or false",
    "bool_parsing": "write true or false", "float_type": "write a number", "float_parsing": "write a number",
    "finite_number": "write a finite number", "greater_than": "write a larger value",
    "greater_than_equal": "write a larger value", "less_than": "write a smaller value",
    "less_than_equal": "write a smaller value", "too_short": "give more items", "too_long": "give fewer items"}
"""What to write instead, per pydantic error type that names no fix of its own."""


def spec_error(err: ValidationError, doc: Document, model: type[BaseModel], prefix: str = "") -> SpecError:
    """Turn a pydantic error into one SpecError (the most specific problem first)."""
    errors = err.errors(include_url=False)
    # Prefer errors that point at a real field over union-branch noise; then the deepest one.
    ranked = sorted(errors, key=lambda e: (e["type"] == "model_type", -len(e["loc"])))
    first = ranked[0]
    cause = (first.get("ctx") or {}).get("error")
    loc = tuple(first["loc"]) + (tuple(cause.path) if isinstance(cause, FieldProblem) else ())
    path = _clean_loc(loc, doc.data)
    kind = first["type"]
    message = str(first["msg"])
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    fix: str | None = None
    if kind == "extra_forbidden":
        names = _field_names(model, path[:-1])
        message = f"unknown field '{path[-1]}'"
        fix = f"remove it or use one of: {', '.join(names)}" if names else "remove it"
    elif kind == "missing":
        message = "missing required field"
        fix = f"add '{path[-1]}:' here" if path else None
    elif kind in ("int_from_float", "int_type", "int_parsing"):
        fix = "write a whole number, e.g. 2"
    elif kind == "literal_error":
        given = first.get("input")
        shown = repr(given) if len(repr(given)) <= 60 else repr(given)[:57] + "..."
        message = f"{shown} is not accepted: {message[0].lower()}{message[1:]}"
        fix = "use one of the values listed"
    elif kind in _TYPE_FIXES:  # the value's type or bound: say what to write
        fix = _TYPE_FIXES[kind]
    elif "(fix: " in message:
        message, _, rest = message.partition(" (fix: ")
        fix = rest.rstrip(")")
        # a unit error already names its value; keep the field path in front
    field = _render(path)
    if prefix:
        field = f"{prefix}.{field}" if field else prefix
    return SpecError(message, field=field or None, source=doc.where(path), fix=fix)


def validate(model: type[M], doc: Document, prefix: str = "") -> M:
    """Validate ``doc.data`` as ``model``; any failure is one SpecError naming file, line and field."""
    try:
        return model.model_validate(doc.data)
    except ValidationError as err:
        raise spec_error(err, doc, model, prefix) from None
