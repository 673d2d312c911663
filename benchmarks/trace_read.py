"""Benchmark of reading a large PyTorch profiler trace: wall time and peak memory of `simdist.calibrate.trace_read`.

Run from the repository root with the project's virtualenv active:

    python benchmarks/trace_read.py [--copies 40]

It builds a trace of ``--copies`` copies of the real A100 trace in tests/data/traces/hta_nccl_a100 (its events
shifted in time, one after the other: 40 copies make about 344 MB of JSON), writes it gzipped to a temporary
folder, and reads it in a fresh process (``python -c``), printing the JSON's size, the events kept, the read's
wall seconds and the process's peak resident memory (MB = 1e6 bytes, VmHWM of /proc/self/status: Linux): the
streamed reader's memory follows the events kept, not the file's text.
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "traces" / "hta_nccl_a100" / "nccl_data.json.gz"
PROBE = """
import sys, time
sys.path.insert(0, {root!r})
from simdist.calibrate.trace_read import read_trace
t0 = time.perf_counter()
t = read_trace({path!r})
dt = time.perf_counter() - t0
# VmHWM, not ru_maxrss: the latter keeps the forking parent's peak across exec
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM"))
print(len(t.events), dt, hwm * 1024 / 1e6)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=40)
    args = parser.parse_args(argv)
    doc = json.loads(gzip.decompress(SOURCE.read_bytes()))
    events = doc["traceEvents"]
    span = max(e.get("ts", 0) + e.get("dur", 0) for e in events if isinstance(e.get("ts"), (int, float)))
    span -= min(e["ts"] for e in events if isinstance(e.get("ts"), (int, float)))
    big = []
    for c in range(args.copies):
        for e in events:
            e2 = dict(e)
            if isinstance(e2.get("ts"), (int, float)):
                e2["ts"] = e2["ts"] + c * span
            big.append(e2)
    doc["traceEvents"] = big
    text = json.dumps(doc).encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.pt.trace.json.gz"
        path.write_bytes(gzip.compress(text, compresslevel=1))
        gz_mb = path.stat().st_size / 1e6
        out = subprocess.run([sys.executable, "-c", PROBE.format(root=str(ROOT), path=str(path))],
                             capture_output=True, text=True, check=True)
        kept, seconds, peak_mb = out.stdout.split()
    print(f"trace of {args.copies} copies: {len(text) / 1e6:.0f} MB of JSON ({gz_mb:.0f} MB gzipped), "
          f"{len(big):,} events; kept {int(kept):,}; read in {float(seconds):.1f} s, "
          f"peak memory {float(peak_mb):.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
