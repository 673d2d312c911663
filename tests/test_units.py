import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simdist.errors import UnitError
from simdist.units import (
    GiB,
    format_bandwidth,
    parse_bandwidth,
    parse_bytes,
    parse_flops,
    parse_time,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("450 GB/s", 450e9),
        ("400 Gb/s", 50e9),  # bits: 400e9 / 8
        ("200Gb/s", 25e9),
        ("1.8 TB/s", 1.8e12),
        ("50 GiB/s", 50 * 2**30),
        ("100 Mbps", 12.5e6),
        ("12 B/s", 12.0),
    ],
)
def test_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2 us", 2e-6), ("2 µs", 2e-6), ("1.5 ms", 1.5e-3), ("100 ns", 1e-7), ("3 s", 3.0), ("0 us", 0.0)],
)
def test_time(text, expected):
    assert parse_time(text) == pytest.approx(expected, rel=1e-15)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80 GiB", 80 * 2**30), ("80 GB", 80e9), ("400 MiB", 400 * 2**20), ("1 KiB", 1024), ("8 B", 8)],
)
def test_bytes(text, expected):
    assert parse_bytes(text) == expected


def test_flops():
    assert parse_flops("989 TFLOP/s") == pytest.approx(989e12)
    assert parse_flops("2.5 PFLOPS") == pytest.approx(2.5e15)


@pytest.mark.parametrize(
    "bad",
    [400, 400.0, "400", "-400 Gb/s", "0 GB/s", "fast", "450 GB", "450 GB/min", None, True, "nan GB/s"],
)
def test_bad_bandwidth_is_one_clear_line(bad):
    with pytest.raises(UnitError) as info:
        parse_bandwidth(bad)
    message = str(info.value)
    assert "\n" not in message
    assert "fix:" in message


def test_unitless_message_says_unit():
    with pytest.raises(UnitError, match="no unit"):
        parse_bandwidth(400)


@given(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False))
def test_bits_are_an_eighth_of_bytes(x):
    assert parse_bandwidth(f"{x!r} Gb/s") * 8 == pytest.approx(parse_bandwidth(f"{x!r} GB/s"), rel=1e-12)


@given(st.floats(min_value=1e-3, max_value=1e6, allow_nan=False))
def test_binary_and_decimal_prefixes(x):
    assert parse_bytes(f"{x!r} GiB") == pytest.approx(x * GiB, rel=1e-12)
    assert parse_bytes(f"{x!r} GB") == pytest.approx(x * 1e9, rel=1e-12)
    assert parse_bytes(f"{x!r} GiB") / parse_bytes(f"{x!r} GB") == pytest.approx(2**30 / 1e9)


def test_format_round_trips_readably():
    assert format_bandwidth(450e9) == "450 GB/s"
    assert math.isclose(parse_bandwidth(format_bandwidth(123.4e9)), 123.4e9)
