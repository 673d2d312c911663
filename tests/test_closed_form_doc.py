"""docs/closed-form-vs-engine.md (issue 13 item 1's generated table) stays the script's output.

The whole table takes about a minute to regenerate (two predictions per row, 247 rows), so the document is checked
in three cheaper ways: it lists exactly the layouts `validation.closed_form_agreement` draws, in order; its summary
meets the targets it states and counts its own rows; and a sample of its rows equals a fresh prediction (to the
digits shown). A change to the step model that moves the table fails the last test until the document is
regenerated: ``python -m validation.closed_form_agreement --out docs/closed-form-vs-engine.md``.
"""

from __future__ import annotations

import functools
import re

import pytest

from tests.conftest import REPO, markdown_rows
from validation import closed_form_agreement as agreement

DOC = REPO / "docs" / "closed-form-vs-engine.md"
SAMPLE_EVERY = 10
"""Every 10th row of the table is predicted again (25 rows: scenarios and all three clusters)."""


@functools.cache
def doc_rows() -> list[list[str]]:
    """The cells of the document's per-layout table, in order (`agreement.table_line`)."""
    return markdown_rows(DOC.read_text(encoding="utf-8"), 8)


@functools.cache
def layouts() -> list[tuple]:
    return agreement.layouts(80, False)


def _number(cell: str) -> float:
    return float(cell.removesuffix(" %"))


def test_the_document_lists_every_layout_the_script_draws_in_order() -> None:
    assert [(group, label) for group, label, _ in layouts()] == [(c[0], c[1]) for c in doc_rows()]


def test_the_document_summary_meets_its_targets_and_counts_its_rows() -> None:
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"- (\d+) rows; (\d+) where the engine finds no contention: median \|closed form / engine - 1\| = "
                  r"([\d.]+) %, max ([\d.]+) %", text)
    assert m, "the summary line is missing"
    total, uncontended, median, worst = int(m[1]), int(m[2]), float(m[3]), float(m[4])
    assert total == len(doc_rows())
    assert 0 < uncontended <= total
    assert median <= 100 * agreement.AGREE_MEDIAN and worst <= 100 * agreement.AGREE_MAX
    contended = re.search(r"- (\d+) rows with contention", text)
    assert contended and int(contended[1]) + uncontended == total


@pytest.mark.slow  # about 10 s: 25 layouts predicted by both fidelities
@pytest.mark.parametrize("index", range(0, len(doc_rows()), SAMPLE_EVERY))
def test_a_sample_of_rows_equals_a_fresh_prediction(index: int) -> None:
    shown = doc_rows()[index]
    (cells,) = markdown_rows(agreement.table_line(agreement.row(*layouts()[index])), 8)
    assert cells[:2] == shown[:2]
    # engine s and closed form s to the 6 digits shown; the percentages to the last digit shown (a sign or a last
    # digit may flip on rounding: -0.0000 % against +0.0000 %)
    for k, rel in ((2, 1e-5), (3, 1e-5)):
        assert _number(cells[k]) == pytest.approx(_number(shown[k]), rel=rel), (shown[1], cells, shown)
    for k, step in ((4, 1e-4), (5, 1e-2), (6, 1e-2), (7, 1e-2)):
        assert abs(_number(cells[k]) - _number(shown[k])) <= step * 1.01, (shown[1], cells, shown)
