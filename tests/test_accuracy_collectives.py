"""Accuracy against published measurements: every point of validation/accuracy_collectives.py.

Requirement (the project's accuracy issue): predicted busbw within 15 % of measured from 256 MiB and within
30 % from 1 MiB. Points a dataset's KNOWN_DEVIATIONS entry lists (ids ending in ``-KNOWN-DEVIATION``) miss
it for the reason given there and in docs/accuracy-collectives.md; their test asserts the bound the model
achieves instead, and fails once the point meets the requirement, so that the list is kept honest.
"""

from __future__ import annotations

import csv

import pytest

from tests.conftest import REPO
from validation import accuracy_collectives as acc
from validation.collective_points import REFERENCE, MiB, Record
from validation.nccl_datasets import GTC, MLE

DOC = REPO / "docs" / "accuracy-collectives.md"


def _tested_points() -> list[tuple[str, str]]:
    """(dataset, label) of every point from 1 MiB, from the mapping alone (no prediction at collection)."""
    sets, _ = acc.datasets()
    return [(d.name, p.label) for d in sets for p in d.points if p.measurement.nbytes >= 1 * MiB]


def _id(point: tuple[str, str]) -> str:
    dataset, label = point
    dev = acc.KNOWN_DEVIATIONS.get(dataset)
    return f"{dataset}-{label}" + ("-KNOWN-DEVIATION" if dev is not None and label in dev.points else "")


def _record(dataset: str, label: str) -> Record:
    (rec,) = [r for r in acc.records() if r.dataset == dataset and r.label == label]
    return rec


@pytest.mark.parametrize("point", _tested_points(), ids=_id)
def test_predicted_busbw_within_requirement(point):
    rec = _record(*point)
    tol = rec.tolerance
    assert tol is not None
    dev = acc.KNOWN_DEVIATIONS.get(rec.dataset)
    if dev is not None and rec.label in dev.points:
        # Known deviation: the model achieves |error| <= dev.bound here (reason in KNOWN_DEVIATIONS).
        assert abs(rec.error) <= dev.bound, f"{100 * rec.error:+.1f} % is worse than the recorded deviation"
        assert abs(rec.error) > tol, "now within the requirement: remove the point from KNOWN_DEVIATIONS"
    else:
        assert abs(rec.error) <= tol, (
            f"{rec.dataset} {rec.label}: predicted {rec.prediction.busbw_GBps:.1f} GB/s "
            f"({rec.prediction.algorithm}/{rec.prediction.protocol}), measured {rec.measured_busbw_GBps:.1f} GB/s")


def test_known_deviations_name_real_points():
    sets, _ = acc.datasets()
    labels = {d.name: {p.label for p in d.points} for d in sets}
    for name, dev in acc.KNOWN_DEVIATIONS.items():
        assert dev.points <= labels[name], f"{name}: {sorted(dev.points - labels[name])}"
        assert dev.reason and 0 < dev.bound < 5


def test_report_is_up_to_date():
    """docs/accuracy-collectives.md is exactly what the script writes now (regenerate it if not)."""
    assert DOC.read_text(encoding="utf-8") == acc.render(), (
        "stale report: run python -m validation.accuracy_collectives --out docs/accuracy-collectives.md")


def test_every_reference_row_is_predicted_or_listed_as_not_covered():
    sets, not_covered = acc.datasets()
    used = {d.name for d in sets}
    skipped = " ".join(n.what for n in not_covered)
    with (REFERENCE / MLE).open(encoding="utf-8", newline="") as fh:
        for name in {r["dataset"] for r in csv.DictReader(fh)}:
            assert name in used or name in skipped, name
    with (REFERENCE / GTC).open(encoding="utf-8", newline="") as fh:
        gtc_rows = list(csv.DictReader(fh))
    gtc_points = sum(len(d.points) for d in sets if d.reference == GTC)
    gtc_skipped = sum(n.what.startswith(GTC) for n in not_covered)
    assert gtc_points + gtc_skipped == len(gtc_rows)


def test_predictions_use_the_stated_mapping():
    """Each prediction ran where its dataset says: ranks, and the algorithm when one is stated."""
    for rec in acc.records():
        assert rec.prediction.num_ranks == rec.mapping.num_ranks == rec.measurement.num_ranks
        assert rec.prediction.nbytes == rec.measurement.nbytes
        if rec.mapping.algorithm != "auto":
            assert rec.prediction.algorithm == rec.mapping.algorithm


def test_auto_takes_only_algorithms_nccl_runs():
    """NCCL's tuner chooses among its own algorithms; the validation relies on auto doing the same."""
    from simdist.collectives.nccl_model import nccl_algorithms

    for rec in acc.records():
        if rec.mapping.algorithm == "auto":
            assert rec.prediction.algorithm in nccl_algorithms(rec.measurement.op)
