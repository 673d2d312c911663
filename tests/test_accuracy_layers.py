"""simdist's transformer layers against published layer timings (validation/accuracy_layers.py,
docs/accuracy-layers.md): the Korthikanti A100 rows (two of them the GEMM knee's fit) within 3.1 %
(tests/test_layer_cost.py), the Transformer Engine H100 rows checks whose errors are pinned as they stand."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from validation import accuracy_layers as acc

DOC = REPO / "docs" / "accuracy-layers.md"
RECORDS = acc.records()
TE = [r for r in RECORDS if r.dataset == "te_transformer_layer"]
TUTORIAL = {r.label: r for r in RECORDS if r.dataset == "te_getting_started"}


def test_the_report_is_the_scripts_output():
    assert DOC.read_text(encoding="utf-8") == acc.render(RECORDS)


def test_the_rows_and_their_kinds():
    assert len(RECORDS) == 20 and all(r.source for r in RECORDS)
    assert sum(r.fit for r in RECORDS) == 4 and not any(r.fit for r in TE + list(TUTORIAL.values()))
    assert {r.gpu for r in TE} == {"H100-SXM5-80GB"} and len(TE) == 4
    assert {r.gpu for r in TUTORIAL.values()} == {"H100-SXM5-80GB"} and len(TUTORIAL) == 6


@pytest.mark.parametrize("rec", [r for r in RECORDS if r.dataset == "korthikanti2022_table4"], ids=lambda r: r.label)
def test_korthikanti_rows_within_3_percent(rec):
    assert abs(rec.error) <= 0.031


@pytest.mark.parametrize("rec", TE, ids=lambda r: r.label)
def test_te_rows_are_optimistic_by_at_most_26_percent(rec):
    # a check, not a fit: simdist is faster than each of these measurements (docs/accuracy-layers.md); the bound
    # holds the present state so that a change of the model that moves them is seen here
    assert -0.26 <= rec.error < 0.0


def test_te_tensor_parallel_rows_within_6_percent_and_sequence_parallel_priced_faster():
    # The TP forwards agree within 6 %; simdist prices the SP forward faster than the TP one by the norms' and
    # dropouts' bytes it saves (its collectives move the same bytes), where the measurements have it 5-20 % slower.
    tp = [r for r in TE if "TP 8" in r.label]
    sp = [r for r in TE if "SP 8" in r.label]
    assert all(abs(r.error) <= 0.06 for r in tp)
    assert sp[0].predicted_ms < tp[0].predicted_ms
    assert all(s.measured_ms > t.measured_ms for s, t in zip(sp, tp, strict=True))


@pytest.mark.parametrize("rec", list(TUTORIAL.values()), ids=lambda r: r.label)
def test_tutorial_rows_within_11_percent_and_never_optimistic(rec):
    # one H100 layer's kernels, no communication (Transformer Engine's getting-started tutorial): a check, not a
    # fit; simdist is at or above each measured time (docs/accuracy-layers.md), te.TransformerLayer in FP8 the most
    assert 0.0 <= rec.error <= 0.11


def test_tutorial_speedups_of_fused_attention_and_fp8_within_6_percent():
    # the two mechanisms the tutorial isolates, as ratios of its own rows: the materialized attention (scores in
    # HBM, softmax and dropout over them) against cuDNN's fused kernel, and FP8 GEMMs (delayed scaling, casts per
    # forward) against bf16, with everything else the same build
    def speedup(slow, fast, of):
        return getattr(TUTORIAL[slow], of) / getattr(TUTORIAL[fast], of)

    for slow, fast in (("TE Unfused", "TE Unfused + TE Attention"),
                       ("TE Unfused + TE Attention", "TE Unfused + TE Attention + FP8")):
        measured, predicted = speedup(slow, fast, "measured_ms"), speedup(slow, fast, "predicted_ms")
        assert measured > 1.3 and abs(predicted / measured - 1) <= 0.06, (slow, fast, measured, predicted)
