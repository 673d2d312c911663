"""Calibration against measurements: read measured collective times (our CSV, nccl-tests text or JSON).

`read_measurements` detects the format; `Measurement` is the schema (simdist.calibrate.measurements).
This package sits above simdist.report in the layering, so it may hand its data to report's figures;
report never imports it.
"""

from simdist.calibrate.measurements import Measurement, read_measurements, write_measurements_csv
from simdist.calibrate.nccltests import parse_nccltests_json, parse_nccltests_text

__all__ = ["Measurement", "parse_nccltests_json", "parse_nccltests_text", "read_measurements",
           "write_measurements_csv"]
