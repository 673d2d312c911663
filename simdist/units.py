"""Units at the boundary: parse "450 GB/s", "400 Gb/s", "2 us", "80 GiB", "989 TFLOP/s" to SI floats.

Inside simdist every quantity is an SI float: seconds, bytes, bytes per second, FLOP per second.
Unit strings exist only in YAML files and on the command line.

Conventions (nccl-tests and the SI): k/M/G/T/P are powers of 1000 (GB = 1e9 bytes), Ki/Mi/Gi/Ti/Pi
are powers of 1024 (GiB = 2**30 bytes); a capital ``B`` is a byte and a lower-case ``b`` a bit
(Gb/s = 1e9 bits per second = 125e6 bytes per second).
"""

from __future__ import annotations

import math
import re

from simdist.errors import UnitError
from simdist.limits import MESSAGE_MAX, SWEEP_POINTS

__all__ = [
    "GB",
    "GiB",
    "format_bandwidth",
    "format_bytes",
    "format_time",
    "parse_bandwidth",
    "parse_bytes",
    "parse_flops",
    "parse_time",
]

KB, MB, GB, TB = 1e3, 1e6, 1e9, 1e12
KiB, MiB, GiB, TiB = 2.0**10, 2.0**20, 2.0**30, 2.0**40

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_PREFIX = r"(?P<prefix>Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P|E|)"
_NUMBER = r"(?P<number>[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"

_BANDWIDTH_RE = re.compile(rf"^{_NUMBER}\s*{_PREFIX}(?P<unit>B|b|bit|bits|byte|bytes)\s*(?:/\s*s|ps)$")
_BYTES_RE = re.compile(rf"^{_NUMBER}\s*{_PREFIX}(?P<unit>B|byte|bytes)$")
_TIME_RE = re.compile(rf"^{_NUMBER}\s*(?P<unit>s|sec|ms|us|µs|μs|ns|ps|min|h)$")
_FLOPS_RE = re.compile(rf"^{_NUMBER}\s*{_PREFIX}(?P<unit>FLOP/s|FLOPS|flop/s|flops)$")

_TIME_SCALE = {
    "s": 1.0,
    "sec": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ns": 1e-9,
    "ps": 1e-12,
    "min": 60.0,
    "h": 3600.0,
}


def _scale(prefix: str) -> float:
    return _BINARY[prefix] if prefix in _BINARY else _DECIMAL[prefix]


def _text(value: object, what: str, example: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UnitError(f"expected a {what} such as '{example}', got {value!r}", fix=f"write e.g. '{example}'")
    if isinstance(value, (int, float)):
        raise UnitError(
            f"{what} {value!r} has no unit",
            fix=f"write the unit, e.g. '{example}'",
        )
    return value.strip()


def _check(number: float, text: str, what: str, example: str, allow_zero: bool) -> float:
    if not math.isfinite(number):
        raise UnitError(f"{what} '{text}' is not finite", fix=f"write e.g. '{example}'")
    if number < 0 or (number == 0 and not allow_zero):
        bound = "non-negative" if allow_zero else "positive"
        raise UnitError(f"{what} '{text}' must be {bound}", fix=f"write e.g. '{example}'")
    return number


def parse_bandwidth(value: object) -> float:
    """Parse a bandwidth to bytes per second: '450 GB/s' -> 4.5e11, '400 Gb/s' -> 5e10."""
    text = _text(value, "bandwidth", "450 GB/s")
    m = _BANDWIDTH_RE.match(text)
    if not m:
        raise UnitError(
            f"cannot read bandwidth '{text}'",
            fix="write a number and a unit such as '450 GB/s', '400 Gb/s' or '50 GiB/s'",
        )
    bits = m["unit"] in ("b", "bit", "bits")
    number = float(m["number"]) * _scale(m["prefix"]) / (8.0 if bits else 1.0)
    return _check(number, text, "bandwidth", "450 GB/s", allow_zero=False)


def parse_bytes(value: object) -> float:
    """Parse a size to bytes: '80 GiB' -> 85899345920.0, '1 GB' -> 1e9."""
    text = _text(value, "size", "80 GiB")
    m = _BYTES_RE.match(text)
    if not m:
        raise UnitError(f"cannot read size '{text}'", fix="write a number and a unit such as '80 GiB' or '512 MB'")
    return _check(float(m["number"]) * _scale(m["prefix"]), text, "size", "80 GiB", allow_zero=True)


def parse_time(value: object) -> float:
    """Parse a duration to seconds: '2 us' -> 2e-6."""
    text = _text(value, "duration", "2 us")
    m = _TIME_RE.match(text)
    if not m:
        raise UnitError(f"cannot read duration '{text}'", fix="write a number and a unit such as '2 us', '1.5 ms'")
    return _check(float(m["number"]) * _TIME_SCALE[m["unit"]], text, "duration", "2 us", allow_zero=True)


def parse_flops(value: object) -> float:
    """Parse a compute rate to FLOP per second: '989 TFLOP/s' -> 9.89e14."""
    text = _text(value, "compute rate", "989 TFLOP/s")
    m = _FLOPS_RE.match(text)
    if not m or m["prefix"] in _BINARY:
        raise UnitError(f"cannot read compute rate '{text}'", fix="write a number and a unit such as '989 TFLOP/s'")
    return _check(float(m["number"]) * _DECIMAL[m["prefix"]], text, "compute rate", "989 TFLOP/s", allow_zero=True)


def _format(value: float, units: list[tuple[float, str]]) -> str:
    for scale, name in units:
        if abs(value) >= scale:
            return f"{value / scale:.4g} {name}"
    scale, name = units[-1]
    return f"{value / scale:.4g} {name}"


def format_bandwidth(bytes_per_s: float) -> str:
    """4.5e11 -> '450 GB/s' (decimal, the nccl-tests convention)."""
    return _format(bytes_per_s, [(1e12, "TB/s"), (1e9, "GB/s"), (1e6, "MB/s"), (1e3, "kB/s"), (1.0, "B/s")])


def format_bytes(nbytes: float) -> str:
    """85899345920 -> '80 GiB' (binary, as memory is sized)."""
    return _format(nbytes, [(TiB, "TiB"), (GiB, "GiB"), (MiB, "MiB"), (KiB, "KiB"), (1.0, "B")])


def format_time(seconds: float) -> str:
    """2e-6 -> '2 us'."""
    return _format(seconds, [(1.0, "s"), (1e-3, "ms"), (1e-6, "us"), (1e-9, "ns")])


_NCCL_SUFFIX = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_NCCL_SIZE_RE = re.compile(r"^(?P<number>\d+(?:\.\d+)?)\s*(?P<suffix>[KMGT]?)$", re.IGNORECASE)
_FACTOR_RE = re.compile(r"^(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")


_DIGITS = re.compile(r"[0-9]{1,18}")


def ascii_int(text: str) -> int | None:
    """The whole number ``text`` writes in ASCII digits (at most 18 of them), else None: the one parser of counts and
    indices inside names (``leaf12``, ``dgx-a100:1024``, a log's size column). ``str.isdigit`` accepts superscripts
    ('¹') and other scripts' digits that ``int`` then refuses or reads, and an unbounded digit string costs
    quadratic time to convert."""
    return int(text) if _DIGITS.fullmatch(text) else None


def parse_size(text: str) -> float:
    """A message size as nccl-tests writes it (``8``, ``32K``, ``8G``: K/M/G are powers of 1024),
    or with an explicit unit (``400 MiB``, ``1 GB``)."""
    raw = text.strip()
    m = _NCCL_SIZE_RE.match(raw)
    value = float(m["number"]) * _NCCL_SUFFIX[m["suffix"].upper()] if m else parse_bytes(raw)
    if value <= 0:
        raise UnitError(f"size '{raw}' must be positive", fix="write e.g. 8M or '8 MiB'")
    if value > MESSAGE_MAX.value:
        raise UnitError(f"size '{raw}' is above {MESSAGE_MAX.text()} ({MESSAGE_MAX.reason})", fix="write e.g. 8G")
    return value


def _range_count(begin: float, end: float, step: str, part: str) -> tuple[str, float, int]:
    """(kind 'x' or '+', factor or increment, number of sizes) of ``begin:end:step``, counted, not listed."""
    kind, rest = step[:1], step[1:].strip()
    if kind == "x":
        if not _FACTOR_RE.match(rest):
            raise UnitError(f"cannot read size range factor '{step}' in '{part}'",
                            fix="write x and a number above 1, e.g. 8:8G:x2")
        factor = float(rest)
        if not factor > 1 or not math.isfinite(factor):
            raise UnitError(f"size range factor '{step}' must exceed 1", fix="write e.g. x2")
        count = math.floor(math.log(end * (1 + 1e-12) / begin) / math.log(factor)) + 1
        return kind, factor, count
    if kind == "+":
        try:
            increment = parse_size(rest)
        except UnitError:
            raise UnitError(f"cannot read size range increment '{step}' in '{part}'",
                            fix="write + and a size, e.g. 1M:4M:+1M") from None
        return kind, increment, math.floor((end * (1 + 1e-12) - begin) / increment) + 1
    raise UnitError(f"cannot read size step '{step}'", fix="write xFACTOR (e.g. x2) or +INCREMENT (e.g. +1M)")


def parse_size_list(text: str, *, max_sizes: int = int(SWEEP_POINTS.value)) -> list[float]:
    """``8:8G:x2`` (nccl-tests -b/-e/-f: from 8 B to 8 GiB doubling), ``1M:4M:+1M`` (additive steps),
    or a comma list ``1M,64M,1G``; at most ``max_sizes`` sizes, counted before any is listed."""
    if not isinstance(text, str) or not text.strip():
        raise UnitError("no sizes given", fix="write e.g. 8:8G:x2 or 1M,64M")
    ranges: list[tuple[float, float, str, float, int]] = []
    total = 0
    for part in text.split(","):
        part = part.strip()
        if ":" not in part:
            value = parse_size(part)
            ranges.append((value, value, "+", 1.0, 1))
            total += 1
        else:
            pieces = part.split(":")
            if len(pieces) != 3:
                raise UnitError(f"cannot read size range '{part}'", fix="write begin:end:xFACTOR, e.g. 8:8G:x2")
            begin, end = parse_size(pieces[0]), parse_size(pieces[1])
            if end < begin:
                raise UnitError(f"size range '{part}' ends before it begins", fix="write begin:end with begin <= end")
            kind, step, count = _range_count(begin, end, pieces[2].strip(), part)
            ranges.append((begin, end, kind, step, count))
            total += count
        if total > max_sizes:
            raise UnitError(f"'{text}' names {total:,}+ sizes, above the limit of {max_sizes:,} for one sweep",
                            fix="use a larger factor or a shorter range, e.g. 8:8G:x2 (31 sizes)")
    sizes: list[float] = []
    for begin, end, kind, step, count in ranges:
        size, n = begin, 0
        while n < count + 1 and size <= end * (1 + 1e-12):  # the count guards the loop; the end decides
            sizes.append(size)
            size = size * step if kind == "x" else size + step
            n += 1
    return sizes
