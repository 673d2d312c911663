"""simdist's GEMM kernels against published kernel timings (validation/accuracy_kernels.py,
docs/accuracy-kernels.md): every row within 25 %, or inside the range its known deviation states (and failing
once it meets the requirement, so that the list shrinks)."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from validation import accuracy_kernels as acc

DOC = REPO / "docs" / "accuracy-kernels.md"
RECORDS = acc.records()


def test_the_report_is_the_scripts_output():
    assert DOC.read_text(encoding="utf-8") == acc.render(RECORDS)


def _id(r: acc.Record) -> str:
    return f"{r.gpu}-{r.kind}-{r.shape}-{r.data or 'real'}-{r.software[:24]}".replace(" ", "")


@pytest.mark.parametrize("rec", RECORDS, ids=_id)
def test_each_row_within_the_requirement_or_its_stated_deviation(rec: acc.Record):
    if rec.data not in acc.SUMMARY_DATA:  # zeros: listed for the spread; the same GEMM on random data is a row
        assert rec.error > 0.15
        return
    if rec.deviation is None:
        assert abs(rec.error) <= acc.REQUIREMENT, rec
    else:
        _, low, high = rec.deviation
        assert low <= rec.error <= high and abs(rec.error) > acc.REQUIREMENT, rec


def test_grouped_gemms_follow_the_experts_rows_and_count():
    """A grouped GEMM of g experts is priced as g GEMMs of the per-expert shape in one call: 2 g m n k FLOPs, and the
    16-expert call of half the rows runs at the 8-expert call's rate here (both fill whole waves on 132 SMs)."""
    rows = {(r.shape, r.software): r for r in RECORDS if r.kind == "grouped"}
    te27 = "Transformer Engine 2.7 + CUDA 12.9 general_grouped_gemm (multi-stream cuBLAS, Megatron-Core " \
           "TEGroupedMLP's default)"
    eight, sixteen = rows[("8 x (4096, 768, 2048)", te27)], rows[("16 x (2048, 768, 2048)", te27)]
    assert eight.predicted_tflops == pytest.approx(sixteen.predicted_tflops, rel=1e-9)
    # measured: TE 2.7's multi-stream cuBLAS within 16 % of simdist on both, simdist the slower
    assert 0.0 < eight.error <= 0.16 and 0.0 < sixteen.error <= 0.16


def test_every_row_cites_its_source_and_every_gpu_is_a_preset():
    assert len(RECORDS) == 43 and all(r.source for r in RECORDS)
    assert {r.gpu for r in RECORDS} == {"A100-SXM4-80GB", "H100-SXM5-80GB", "H200-SXM-141GB", "B200-SXM-180GB",
                                        "B300-SXM-288GB", "L40S-48GB"}


def test_b300_linears_of_transformer_engine_are_not_priced_optimistically():
    """Transformer Engine's GEMM profiling on B300 (a 5B model's QKV, attention output, MLP up and down at 15,872
    tokens): simdist's bf16 GEMMs are slower than torch.matmul's on every shape, and a te.Linear forward under
    autocast is priced as its fp8 GEMM plus the casts of its input and weight, within -10 % / +37 % of the whole
    call for current, delayed and MXFP8 scaling; on average simdist is the slower, so these kernels do not explain
    its optimism on the Blackwell training rows."""
    b300 = [r for r in RECORDS if r.gpu == "B300-SXM-288GB"]
    assert len(b300) == 16 and {r.kind for r in b300} == {"dense", "linear"}
    assert all(0.05 < r.error < 0.25 for r in b300 if r.kind == "dense")
    linear = [r for r in b300 if r.kind == "linear"]
    assert all(-0.10 < r.error < 0.37 for r in linear)
    assert sum(r.error for r in b300) / len(b300) > 0.0
    # a linear row is its GEMM and its two casts: dropping the casts would price it faster, never slower
    mx = next(r for r in linear if r.shape == "(15872, 4096, 16384)" and "MXFP8" in r.software)
    gemm_only = acc._tflops(acc.gpus_by_name()["B300-SXM-288GB"], 1, 15872, 4096, 16384, "mxfp8")
    assert gemm_only > mx.predicted_tflops * 1.05


def test_blackwell_mxfp8_grouped_gemms_are_priced_as_fp8_and_measured_slower():
    """torchao's MXFP8 grouped GEMMs on B200 (DeepSeek-V3 expert shapes, 8 groups), in two releases of the same
    benchmark: simdist prices them at the fp8 rate (above the 2,250 TFLOP/s bf16 peak, within the 4,500 fp8 one);
    torchao 0.15's kernels run 20 % (2D-3D forward and input gradient) and 38 % (2D-2D weight gradient) slower than
    that, 0.16's 12-13 % and 29 %: the one set of rows where simdist is optimistic, in both releases."""
    rows = {(r.shape, r.software.split(" _scaled")[0]): r for r in RECORDS
            if r.gpu == "B200-SXM-180GB" and r.kind == "grouped"}
    shapes = ("8 x (16384, 2048, 7168)", "8 x (16384, 7168, 2048)", "8 x (2048, 7168, 16384)")
    assert set(rows) == {(s, v) for s in shapes for v in ("torchao 0.15", "torchao 0.16")}
    assert all(2250.0 < r.predicted_tflops < 4500.0 for r in rows.values())
    for version, low, high in (("torchao 0.15", -0.25, -0.15), ("torchao 0.16", -0.15, -0.10)):
        assert low < rows[shapes[0], version].error < high
        assert low < rows[shapes[1], version].error < high
        wgrad = rows[shapes[2], version]
        assert wgrad.deviation is not None and wgrad.error < -0.25
    # the same kernels a release later run faster, never slower
    assert all(rows[s, "torchao 0.16"].measured_tflops > rows[s, "torchao 0.15"].measured_tflops for s in shapes)
