"""The pydantic base of every input model and the unit-bearing field types.

Specs are frozen and reject unknown fields (``extra="forbid"``): a typo in a YAML file is an error,
never a silently ignored setting. Quantity fields take strings with units ("450 GB/s", "2 us",
"80 GiB") and hold SI floats; a bare number is refused because its unit would be a guess.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, WithJsonSchema

from simdist.errors import UnitError
from simdist.units import parse_bandwidth, parse_bytes, parse_flops, parse_time


class Spec(BaseModel):
    """Base of all input models: frozen, strict about unknown fields, aliases accepted by name too."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


def _unit_field(parse: Callable[[object], float]) -> Callable[[object], float]:
    def validate(value: object) -> float:
        try:
            return parse(value)
        except UnitError as err:
            # pydantic attaches the field path to a ValueError; the loader turns it into one line.
            raise ValueError(err.one_line()) from None

    return validate


def _quantity(parse: Callable[[object], float], unit: str, scale: float, example: str, what: str):
    return Annotated[
        float,
        BeforeValidator(_unit_field(parse)),
        # JSON (schema and dumps) speak unit strings, so a dumped spec reads back unchanged.
        PlainSerializer(lambda v: f"{v / scale:.12g} {unit}", return_type=str, when_used="json"),
        WithJsonSchema({"type": "string", "description": f"{what} with a unit", "examples": [example]}),
    ]


Bandwidth = _quantity(parse_bandwidth, "GB/s", 1e9, "450 GB/s", "bandwidth per direction, e.g. '400 Gb/s'")
Duration = _quantity(parse_time, "us", 1e-6, "2 us", "duration")
ByteSize = _quantity(parse_bytes, "B", 1.0, "80 GiB", "size")
FlopRate = _quantity(parse_flops, "TFLOP/s", 1e12, "989 TFLOP/s", "compute rate")

Count = Annotated[int, Field(strict=True, ge=1)]
"""A positive whole number (a float such as 2.5 or a string is refused)."""

NonNegativeCount = Annotated[int, Field(strict=True, ge=0)]
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]
"""An efficiency in (0, 1]: achieved / nominal bandwidth."""
