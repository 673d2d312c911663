"""docs/prediction-bands.md stays `validation.bands`' output.

Regenerating the whole document predicts every published row again (about 30 s), so a sample is checked: the
document lists every row of validation/accuracy_training.py in order, its summary counts its rows, and every 6th
row equals a fresh prediction to the digits shown. Regenerate with ``python -m validation.bands --out
docs/prediction-bands.md`` when the step model moves it.
"""

from __future__ import annotations

import functools
import re

import pytest

from tests.conftest import REPO, markdown_rows
from validation import bands
from validation.accuracy_training import rows

DOC = REPO / "docs" / "prediction-bands.md"
SAMPLE_EVERY = 6


@functools.cache
def doc_rows() -> list[list[str]]:
    """The cells of the document's per-row table, in order (`bands.row_cells`)."""
    return markdown_rows(DOC.read_text(encoding="utf-8").split("## Rows", 1)[1], 8)


def test_the_document_lists_every_published_row_in_order() -> None:
    assert [r.label for r in rows()] == [c[0] for c in doc_rows()]


def test_the_summary_counts_the_rows_shown() -> None:
    text = DOC.read_text(encoding="utf-8")
    m = re.search(r"\n\| (\d+) \| (\d+)/(\d+) \([\d]+%\) \| (\d+) \| (\d+) \|", text)
    assert m, "the summary row is missing"
    total, inside, of, below, above = (int(g) for g in m.groups())
    shown = doc_rows()
    assert total == of == len(shown)
    assert inside == sum(c[7] == "yes" for c in shown)
    assert inside + below + above == total


@pytest.mark.slow  # about 1 s a row
@pytest.mark.parametrize("index", range(0, len(rows()), SAMPLE_EVERY))
def test_a_sample_of_rows_equals_a_fresh_prediction(index: int) -> None:
    shown = doc_rows()[index]
    fresh = bands.row_cells(bands.predict(rows()[index]))
    assert fresh[:2] == shown[:2] and fresh[7] == shown[7]
    # to the last digit shown (a value on a rounding edge may print one digit apart)
    for k in range(2, 6):
        assert abs(float(fresh[k]) - float(shown[k])) <= 0.0101, (shown, fresh)
    assert abs(float(fresh[6].rstrip("%")) - float(shown[6].rstrip("%"))) <= 0.101, (shown, fresh)
