"""The pydantic base of every input model and the unit-bearing, bounded field types.

Specs are frozen and reject unknown fields (``extra="forbid"``): a typo in a YAML file is an error,
never a silently ignored setting. Quantity fields take strings with units ("450 GB/s", "2 us",
"80 GiB") and hold SI floats; a bare number is refused because its unit would be a guess. Floats are
finite (``nan`` and ``.inf`` are refused), and counts and quantities that drive the simulation are bounded
by the physical limits of `simdist.limits`, each refusal giving its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    model_validator,
)

from simdist.errors import UnitError
from simdist.limits import (
    BANDWIDTH_MAX,
    BANDWIDTH_MIN,
    BUCKET_MAX,
    BUCKET_MIN,
    FLOPS_MAX,
    FLOPS_MIN,
    LATENCY_MAX,
    MEMORY_MAX,
    MEMORY_MIN,
    Limit,
)
from simdist.units import parse_bandwidth, parse_bytes, parse_flops, parse_time


class Spec(BaseModel):
    """Base of all input models: frozen, strict about unknown fields, aliases accepted by name too. Each model's
    validator is built when it is first used (``defer_build``), not at import: a run validates a few top-level
    models, whose validators hold the nested ones, so most of them are never built on their own."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True, allow_inf_nan=False,
                              defer_build=True)

    @model_validator(mode="before")
    @classmethod
    def _one_name_per_field(cls, data: Any) -> Any:
        """A field given under two of its names (``tp`` in a file and ``--set parallel.tensor_model_parallel_size``):
        one value under both is kept once; two values are one error naming both (pydantic would keep one and call
        the other an unknown field)."""
        if not isinstance(data, dict):
            return data
        for info in cls.model_fields.values():
            alias = info.validation_alias
            if not isinstance(alias, AliasChoices):
                continue
            present = [c for c in alias.choices if isinstance(c, str) and c in data]
            if len(present) < 2:
                continue
            if len({repr(data[n]) for n in present}) > 1:
                shown = " and ".join(f"{n} ({data[n]!r})" for n in present)
                raise FieldProblem((present[-1],), f"{shown} name the same field (fix: give one of them, e.g. set "
                                                   f"{present[0]} where {present[-1]} is set)")
            data = {k: v for k, v in data.items() if k not in present[1:]}
        return data


def _bounds(what: str, low: Limit | None, high: Limit | None, raw: object, value: float) -> float:
    if low is not None and value < low.value:
        raise ValueError(f"{what} {raw!r} is below {low.text()} ({low.reason})")
    if high is not None and value > high.value:
        raise ValueError(f"{what} {raw!r} is above {high.text()} ({high.reason})")
    return value


def _unit_field(parse: Callable[[object], float], what: str, low: Limit | None,
                high: Limit | None) -> Callable[[object], float]:
    def validate(value: object) -> float:
        try:
            number = parse(value)
        except UnitError as err:
            # pydantic attaches the field path to a ValueError; the loader turns it into one line.
            raise ValueError(err.one_line()) from None
        return _bounds(what, low, high, value, number)

    return validate


def _quantity(parse: Callable[[object], float], unit: str, scale: float, example: str, what: str, *,
              low: Limit | None = None, high: Limit | None = None) -> Any:
    schema: dict[str, Any] = {"type": "string", "description": f"{what} with a unit", "examples": [example]}
    if low is not None or high is not None:  # "x-bounds": a field's own description replaces the type's
        schema["x-bounds"] = ", ".join(
            f"{name} {lim.text()}" for name, lim in (("at least", low), ("at most", high)) if lim is not None)
        schema["description"] += f"; {schema['x-bounds']}"
    return Annotated[
        float,
        BeforeValidator(_unit_field(parse, what.split(",")[0], low, high)),
        # JSON (schema and dumps) speak unit strings, so a dumped spec reads back unchanged.
        PlainSerializer(lambda v: f"{v / scale:.12g} {unit}", return_type=str, when_used="json"),
        WithJsonSchema(schema),
    ]


Bandwidth = _quantity(parse_bandwidth, "GB/s", 1e9, "450 GB/s", "bandwidth per direction, e.g. '400 Gb/s'",
                      low=BANDWIDTH_MIN, high=BANDWIDTH_MAX)
Latency = _quantity(parse_time, "us", 1e-6, "2 us", "latency", high=LATENCY_MAX)
"""A latency or per-call overhead the simulation adds (at most a second)."""
Duration = _quantity(parse_time, "us", 1e-6, "2 us", "duration")
"""Any finite duration (informational fields, e.g. a fit's confidence interval)."""
Memory = _quantity(parse_bytes, "B", 1.0, "80 GiB", "memory size", low=MEMORY_MIN, high=MEMORY_MAX)
BucketSize = _quantity(parse_bytes, "B", 1.0, "25 MB", "bucket size", low=BUCKET_MIN, high=BUCKET_MAX)
ByteSize = _quantity(parse_bytes, "B", 1.0, "80 GiB", "size")
AnyBandwidth = _quantity(parse_bandwidth, "GB/s", 1e9, "450 GB/s", "bandwidth")
"""Any finite bandwidth (informational fields, e.g. a fit's confidence interval)."""
FlopRate = _quantity(parse_flops, "TFLOP/s", 1e12, "989 TFLOP/s", "compute rate", low=FLOPS_MIN, high=FLOPS_MAX)


def _at_most(limit: Limit) -> Callable[[int], int]:
    def check(value: int) -> int:
        if value > limit.value:
            raise ValueError(f"{value:,} is above the limit of {limit.text()} ({limit.reason})")
        return value

    return check


def count(limit: Limit | None = None, *, minimum: int = 1) -> Any:
    """A whole number >= ``minimum`` (a float such as 2.5 or a string is refused), at most ``limit``."""
    if limit is None:
        return Annotated[int, Field(strict=True, ge=minimum)]
    return Annotated[int, Field(strict=True, ge=minimum), AfterValidator(_at_most(limit)),
                     WithJsonSchema({"type": "integer", "minimum": minimum, "maximum": int(limit.value)})]


def _within(low: Limit, high: Limit, what: str) -> Callable[[float], float]:
    def check(value: float) -> float:
        return _bounds(what, low, high, value, value)

    return check


def bounded(low: Limit, high: Limit, what: str = "value") -> Any:
    """A finite float in [low, high], each refusal giving the limit's reason (simdist.limits)."""
    return Annotated[float, AfterValidator(_within(low, high, what)),
                     WithJsonSchema({"type": "number", "minimum": low.value, "maximum": high.value})]


Count = count()
"""A positive whole number (a float such as 2.5 or a string is refused)."""

NonNegativeCount = count(minimum=0)
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]
"""An efficiency in (0, 1]: achieved / nominal bandwidth."""


class FieldProblem(ValueError):
    """A model validator's error about particular fields: the loader locates it at ``path`` (relative to the
    model), so that e.g. a cluster too large is reported at ``--num-nodes`` or the file line that set it."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.path = path
