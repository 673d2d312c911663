"""The published reference tables in validation/reference/: unchanged copies, every row with its source.

The copies were taken from the project's shared reference set; ``validation/reference/SHA256SUMS`` records the
originals' checksums, so the check needs nothing outside the repository.
"""

from __future__ import annotations

import csv
import hashlib

import pytest

from tests.conftest import REPO

REFERENCE = REPO / "validation" / "reference"


def _sums() -> dict[str, str]:
    sums = {}
    for line in (REFERENCE / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        digest, name = line.split(maxsplit=1)
        sums[name.lstrip("*")] = digest
    return sums


def _rows(path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(line for line in fh if not line.startswith("#")))


def test_every_published_table_has_a_checksum():
    measured_here = {p.name for p in REFERENCE.glob("gloo_cpu_*.csv")}  # simdist's own harness: no original
    assert set(_sums()) == {p.name for p in REFERENCE.glob("*.csv")} - measured_here
    assert len(_sums()) >= 13


@pytest.mark.parametrize("name", sorted(_sums()))
def test_reference_copy_is_unchanged(name):
    assert hashlib.sha256((REFERENCE / name).read_bytes()).hexdigest() == _sums()[name]


@pytest.mark.parametrize("path", sorted(REFERENCE.glob("*.csv")), ids=lambda p: p.name)
def test_every_row_cites_its_source(path):
    rows = _rows(path)
    column = next(c for c in rows[0] if c.startswith("source"))
    assert rows and all((row[column] or "").strip() for row in rows)


@pytest.mark.parametrize("name", ["nccl_tuning_latency_constants.csv", "nccl_tuning_bandwidth_caps.csv"])
def test_packaged_nccl_tables_are_rows_of_the_reference(name):
    """simdist/collectives/data/ carries the NCCL v2.30.7-1 rows of the reference tables, unchanged."""
    reference = {tuple(row.items()) for row in _rows(REFERENCE / name)}
    packaged = _rows(REPO / "simdist" / "collectives" / "data" / name)
    assert packaged and all(tuple(row.items()) in reference for row in packaged)
    assert {row["nccl_version"] for row in packaged} == {"v2.30.7-1"}
