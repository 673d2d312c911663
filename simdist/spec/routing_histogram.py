"""A measured routing histogram (``training.moe_routing: histogram`` with ``training.moe_routing_file``): how many
tokens each expert received, read from a CSV file the user exported from a real run.

Where the numbers come from: Megatron-Core logs the tokens each expert receives per MoE layer
(``--moe-per-layer-logging`` with the router's ``tokens_per_expert``; megatron/core/transformer/moe/moe_utils.py),
and any framework's router can count them (``torch.bincount`` of the top-k indices). Summed over many steps they
give each expert's share of the routed tokens, which simdist.plan.moe_routing turns into per-micro-batch draws.

The format, one row per expert (and per MoE layer where the file has a ``layer`` column)::

    # lines starting with '#' are comments
    layer,expert,tokens
    0,0,10234
    0,1,9876
    ...

- ``expert``: the expert's index, 0 .. E - 1 (Megatron-Core's global expert index: rank r holds experts
  r x E/ep .. (r + 1) x E/ep - 1), each listed once per layer;
- ``tokens``: how many routed tokens it received (any non-negative number: counts or shares, only ratios matter);
- ``layer`` (optional): a label of the MoE layer the row belongs to; each distinct label is one histogram. Without
  it, the file is one histogram that every MoE layer follows.

Every problem is one SpecError naming the file's line and what to write instead.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from simdist.errors import SpecError
from simdist.files import read_text

__all__ = ["FIELD", "RoutingHistogram", "read_routing_histogram"]

FIELD = "training.moe_routing_file"
_COLUMNS = ("expert", "tokens")
_FIX_HEADER = "start the file with the header 'expert,tokens' (or 'layer,expert,tokens')"


@dataclass(frozen=True, slots=True)
class RoutingHistogram:
    """Per MoE layer (in the order the file first names them), each expert's share of the routed tokens."""

    layers: tuple[tuple[float, ...], ...]
    path: str

    @property
    def num_experts(self) -> int:
        return len(self.layers[0])


def read_routing_histogram(path: str | Path) -> RoutingHistogram:
    """The histogram in ``path`` (cached while the file is unchanged); one SpecError for any problem."""
    p = Path(path)
    try:
        st = os.stat(p)
        key = (st.st_mtime_ns, st.st_size)
    except OSError:
        key = (0, 0)  # read_text names the problem
    return _read(str(p), key)


@lru_cache(maxsize=32)
def _read(path: str, _stamp: tuple[int, int]) -> RoutingHistogram:
    text = read_text(path, field=FIELD)
    numbered = [(i, line) for i, line in enumerate(text.splitlines(), start=1)
                if line.strip() and not line.lstrip().startswith("#")]
    if not numbered:
        raise SpecError(f"{path} has no rows", field=FIELD, fix=_FIX_HEADER + ", then one row per expert")
    header_line, header = numbered[0]
    columns = [c.strip().lower() for c in next(csv.reader([header]))]
    missing = [c for c in _COLUMNS if c not in columns]
    unknown = [c for c in columns if c not in (*_COLUMNS, "layer")]
    if missing or unknown or len(set(columns)) != len(columns):
        what = (f"lacks the column(s) {', '.join(missing)}" if missing else
                f"has the unknown column(s) {', '.join(unknown)}" if unknown else "repeats a column")
        raise SpecError(f"{path}:{header_line}: the header {header.strip()!r} {what}", field=FIELD, fix=_FIX_HEADER)
    at = {c: columns.index(c) for c in columns}
    counts: dict[str, dict[int, float]] = {}
    first_line: dict[str, int] = {}
    for line_no, line in numbered[1:]:
        cells = next(csv.reader(io.StringIO(line)))
        where = f"{path}:{line_no}"
        if len(cells) != len(columns):
            raise SpecError(f"{where}: {len(cells)} cells, the header names {len(columns)}", field=FIELD,
                            fix=f"write {','.join(columns)} on every row")
        expert = _number(cells[at["expert"]], "expert", where)
        if expert != int(expert) or expert < 0:
            raise SpecError(f"{where}: expert {cells[at['expert']].strip()!r} is not an index 0, 1, 2, ...",
                            field=FIELD, fix="write the expert's index, counting from 0")
        tokens = _number(cells[at["tokens"]], "tokens", where)
        if tokens < 0:
            raise SpecError(f"{where}: tokens {tokens:g} is negative", field=FIELD,
                            fix="write how many tokens the expert received (0 or more)")
        layer = cells[at["layer"]].strip() if "layer" in at else ""
        if "layer" in at and not layer:
            raise SpecError(f"{where}: the layer cell is empty", field=FIELD, fix="name the MoE layer of every row")
        per_layer = counts.setdefault(layer, {})
        first_line.setdefault(layer, line_no)
        if int(expert) in per_layer:
            label = f" of layer {layer}" if layer else ""
            raise SpecError(f"{where}: expert {int(expert)}{label} is listed twice", field=FIELD,
                            fix="list each expert once per layer (sum its counts)")
        per_layer[int(expert)] = tokens
    if not counts:
        raise SpecError(f"{path} has a header but no rows", field=FIELD, fix="add one row per expert")
    layers = []
    num_experts = None
    for layer, per_layer in counts.items():
        label = f"layer {layer}" if layer else "the histogram"
        n = max(per_layer) + 1
        gaps = [e for e in range(n) if e not in per_layer]
        if gaps:
            raise SpecError(f"{path}:{first_line[layer]}: {label} lists experts up to {n - 1} but not expert "
                            f"{gaps[0]}", field=FIELD, fix="list every expert 0 .. E-1 (0 tokens where none came)")
        if num_experts is not None and n != num_experts:
            raise SpecError(f"{path}:{first_line[layer]}: {label} lists {n} experts, the first layer {num_experts}",
                            field=FIELD, fix="give every layer the same experts")
        num_experts = n
        total = sum(per_layer.values())
        if total <= 0:
            raise SpecError(f"{path}:{first_line[layer]}: {label} routes no tokens (every count is 0)", field=FIELD,
                            fix="give the counts of a run's routed tokens")
        layers.append(tuple(per_layer[e] / total for e in range(n)))
    return RoutingHistogram(layers=tuple(layers), path=path)


def _number(cell: str, column: str, where: str) -> float:
    try:
        value = float(cell.strip())
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise SpecError(f"{where}: {column} {cell.strip()!r} is not a number", field=FIELD,
                        fix=f"write a finite number in the {column} column")
    return value
