"""The measured-step CSV schema (simdist.calibrate.steps): round trip, metadata, one-line errors on bad files."""

from __future__ import annotations

import dataclasses

import pytest

from simdist.calibrate.measurements import Measurement, read_measurements, write_measurements_csv
from simdist.calibrate.steps import (
    STEP_CSV_COLUMNS,
    StepMeasurement,
    read_csv_metadata,
    read_step_measurements,
    write_step_measurements_csv,
)
from simdist.errors import SpecError

ROW = StepMeasurement(cut="pipeline_1f1b", world_size=4, num_layers=4, width=1024, global_batch=128,
                      num_microbatches=8, dtype="fp32", time_s=0.0123456789, time_mean_s=0.011, num_samples=10,
                      backend="gloo", device="AMD EPYC", source="validation.mlp")


def test_round_trip_keeps_every_field_and_the_metadata(tmp_path):
    rows = [ROW, dataclasses.replace(ROW, cut="single", world_size=1, num_microbatches=1, time_s=1e-4)]
    path = tmp_path / "steps.csv"
    meta = {"torch_version": "2.13.0+cpu", "command": "python -m validation.mlp --ranks 4",
            "nvidia_smi_topo_m": "\tGPU0\tGPU1\nGPU0\t X \tNV12"}
    write_step_measurements_csv(rows, path, metadata=meta)
    assert read_step_measurements(path) == rows
    assert read_csv_metadata(path) == meta  # a multi-line value (nvidia-smi topo -m) comes back whole
    assert path.read_text().splitlines()[len(meta) + 1] == ",".join(STEP_CSV_COLUMNS)


def test_collective_csv_metadata_is_skipped_by_its_reader(tmp_path):
    m = Measurement(op="all_reduce", nbytes=1024, num_ranks=4, time_s=1e-3, algbw_Bps=1.024e6, busbw_Bps=1.536e6,
                    source="x")
    path = tmp_path / "c.csv"
    write_measurements_csv([m], path, metadata={"backend": "gloo", "cpu_model": "AMD EPYC"})
    assert path.read_text().startswith("# backend: gloo\n# cpu_model: AMD EPYC\nop,")
    # A blank device column takes the run's device from the metadata: the CPU model of a gloo run.
    assert read_measurements(path) == [dataclasses.replace(m, device="AMD EPYC")]
    assert read_csv_metadata(path) == {"backend": "gloo", "cpu_model": "AMD EPYC"}


def _write(tmp_path, text):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    return path


HEADER = ",".join(STEP_CSV_COLUMNS)
GOOD = "data_parallel,4,4,1024,128,1,fp32,0.01,0.01,10,gloo,cpu,x"


@pytest.mark.parametrize(("body", "line", "words"), [
    ("", None, "empty"),
    ("# only: metadata\n", None, "empty"),
    (f"{HEADER}\n", None, "no rows"),
    ("cut,world_size\nsingle,1\n", 1, "lacks column"),
    (f"{HEADER}\n{GOOD.replace('data_parallel', 'zero3')}\n", 2, "unknown cut 'zero3'"),
    (f"{HEADER}\n{GOOD.replace(',0.01,0.01,', ',fast,0.01,')}\n", 2, "'fast' is not a number"),
    (f"{HEADER}\n{GOOD.replace(',0.01,0.01,', ',0,0.01,')}\n", 2, "not a positive number"),
    (f"{HEADER}\n{GOOD.replace(',4,4,', ',4.5,4,')}\n", 2, "not a positive integer"),
    (f"{HEADER}\n{GOOD},extra\n", 2, "fields"),
    (f"# m: 1\n{HEADER}\n{GOOD}\n{GOOD.replace(',128,1,', ',128,4,')}\n", 4, "no micro-batches"),
    (f"{HEADER}\n{GOOD.replace(',4,4,', ',1,4,')}\n", 2, "at least 2 ranks"),
    (f"{HEADER}\n{GOOD.replace('gloo', 'ucc')}\n", 2, "unknown backend"),
])
def test_bad_files_raise_one_line_naming_file_and_line(tmp_path, body, line, words):
    path = _write(tmp_path, body)
    with pytest.raises(SpecError) as info:
        read_step_measurements(path)
    message = str(info.value)
    assert "\n" not in message and words in message and "fix:" in message
    assert message.startswith(f"{path}:{line}" if line else str(path))


def test_missing_file_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="no such step measurement file"):
        read_step_measurements(tmp_path / "nope.csv")
