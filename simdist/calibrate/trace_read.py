"""Read a PyTorch profiler trace (Kineto's Chrome-trace JSON, one file per rank), streamed: `read_trace`.

``torch.profiler`` writes one ``*.pt.trace.json`` (``.gz`` when compressed) per rank: a JSON object whose
``traceEvents`` array holds every timed event (Trace Event Format, Google: complete events ``"ph": "X"`` with
``ts`` and ``dur`` in microseconds) and whose ``deviceProperties`` and ``distributedInfo`` describe the GPUs and the
process groups (PyTorch torch/csrc/profiler/kineto_shim.cpp and torch/profiler/profiler.py, which add them). What
this module keeps of it:

- GPU kernels, memcpys and memsets (``cat``: kernel, gpu_memcpy, gpu_memset) with their stream and ``External
  id`` (the CPU operator that launched them);
- CPU operators (``cpu_op``) with ``Input Dims`` and ``Input type`` (``record_shapes=True``), and the collective
  operators' arguments (``record_param_comms`` / ``nccl:*``: "Collective name", "In msg nelems", "Group size", ...);
- user annotations: the step boundaries ``ProfilerStep#N`` and gloo's collectives (``gloo:all_reduce``, ... on the
  gloo worker thread, timed from start to completion);
- ``distributedInfo`` (backend, rank, world size, process groups) and the first GPU's name.

Streaming: the file is parsed by ijson (PyPI ``ijson``, its C backend yajl2_c) one event at a time, never loaded
whole: a trace of hundreds of MB costs memory for the events kept, not for its text. A file whose text exceeds
`simdist.limits.TRACE_BYTES`, or with more kept events than `TRACE_EVENTS`, is refused with one line. Every problem
(not JSON, not a Kineto trace, truncated by a crashed profiler, no events) is one `SpecError` naming the file.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from simdist.errors import SpecError
from simdist.limits import TRACE_BYTES, TRACE_EVENTS

__all__ = ["GPU_CATEGORIES", "Trace", "TraceEvent", "looks_like_trace", "read_trace", "trace_files"]

GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
"""Kineto's categories of work timed on the GPU (libkineto ActivityType: CONCURRENT_KERNEL, GPU_MEMCPY, GPU_MEMSET)."""
_COMM_KEYS = ("Collective name", "In msg nelems", "Out msg nelems", "In split size", "Out split size", "Group size",
              "dtype", "Process Group Name", "Process Group Ranks", "Rank", "Global rank start", "Global rank stride")
"""record_param_comms' arguments (torch/csrc/distributed/c10d/ParamCommsUtils.hpp, saveNcclMeta in
torch/csrc/profiler/util.cpp): what was communicated, in how large a group."""


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One kept event: ``cat`` (kernel, gpu_memcpy, gpu_memset, cpu_op, user_annotation), ``name``, its start and
    duration in microseconds, ``lane`` (a GPU stream or a CPU thread id), the launching operator's ``ext_id``."""

    cat: str
    name: str
    ts_us: float
    dur_us: float
    lane: int
    ext_id: int | None = None
    dims: tuple | None = None
    """``Input Dims`` of an operator: one list of sizes per input (empty for a non-tensor input)."""
    types: tuple[str, ...] | None = None
    """``Input type``: "float", "c10::BFloat16", "c10::Half", ..."""
    comm: dict[str, Any] | None = None
    """A collective operator's arguments (`_COMM_KEYS`), where the trace records them."""
    concrete: tuple | None = None
    """``Concrete Inputs``: the scalar arguments as text (an attention operator's is_causal)."""
    simulated: bool = False
    """A kernel of a trace simdist wrote (simdist.report.kineto_trace): one op of the simulated step."""

    @property
    def on_gpu(self) -> bool:
        return self.cat in GPU_CATEGORIES

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


@dataclass(slots=True)
class Trace:
    """One rank's trace: its events and what the file says about the run."""

    path: str
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    device: str | None = None
    """The first GPU's name (``deviceProperties``); None for a CPU-only trace."""
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    """``distributedInfo.pg_config``: each group's name, size and ranks."""
    events: list[TraceEvent] = field(default_factory=list)
    classified: list[Any] | None = None
    """What simdist.calibrate.trace_kernels.classify made of the events, kept by it (computed once per trace)."""

    @property
    def steps(self) -> list[tuple[float, float]]:
        """The ``ProfilerStep#N`` windows (start, end) in microseconds, in order."""
        return sorted((e.ts_us, e.end_us) for e in self.events
                      if e.cat == "user_annotation" and e.name.startswith("ProfilerStep#"))

    def counts(self) -> dict[str, int]:
        """How many events of each kept category: what a trace without what is needed does have."""
        out: dict[str, int] = {}
        for e in self.events:
            out[e.cat] = out.get(e.cat, 0) + 1
        return out


class _Bounded(io.RawIOBase):
    """A readable stream that refuses to deliver more than `TRACE_BYTES` (of the decompressed text)."""

    def __init__(self, raw: IO[bytes], path: str) -> None:
        self._raw, self._path, self._read = raw, path, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        self._read += len(data)
        if self._read > TRACE_BYTES.value:
            raise SpecError(f"{self._path}: the trace's text is larger than {TRACE_BYTES.text()}, the limit for a "
                            f"trace ({TRACE_BYTES.reason})", field="TRACE",
                            fix="profile fewer steps (torch.profiler.schedule(active=1..3)) or fewer ranks per file")
        buffer[: len(data)] = data
        return len(data)


def _open(path: Path) -> IO[bytes]:
    """The trace's bytes, decompressed when it is gzip (told by its magic bytes, not its name)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed by the caller through the returned stream
    except OSError as err:
        raise SpecError(f"cannot read {path}: {err.strerror or err}", field="TRACE", fix="check the path") from None
    if fh.read(2) == b"\x1f\x8b":
        fh.seek(0)
        return io.BufferedReader(_Bounded(gzip.GzipFile(fileobj=fh), str(path)), 1 << 20)
    fh.seek(0)
    return io.BufferedReader(_Bounded(fh, str(path)), 1 << 20)


def looks_like_trace(path: str | Path) -> bool:
    """Whether ``path`` is a Kineto trace: gzip, or a JSON object with ``traceEvents`` or ``schemaVersion`` near its
    start (where PyTorch writes them); a measurement CSV or an nccl-tests log is not."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(4096)
    except OSError:
        return False
    if head[:2] == b"\x1f\x8b":
        return True
    text = head.lstrip()
    return text[:1] == b"{" and (b'"traceEvents"' in head or b'"schemaVersion"' in head)


def _ints(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _event(raw: Any, shared: dict[Any, Any]) -> TraceEvent | None:
    """The kept form of one trace event, None for an event this reader does not use. ``shared``: one copy of each
    distinct name, dims and types value of the read (a trace repeats a few thousand of them over its events)."""

    def one(value: Any) -> Any:
        return shared.setdefault(value, value)
    if not isinstance(raw, dict) or raw.get("ph") != "X":
        return None
    cat, name = raw.get("cat"), raw.get("name")
    if not isinstance(cat, str) or not isinstance(name, str):
        return None
    cat = cat.lower()
    args = raw.get("args") if isinstance(raw.get("args"), dict) else {}
    try:
        ts, dur = float(raw["ts"]), float(raw.get("dur", 0.0))
    except (KeyError, TypeError, ValueError):
        return None
    if cat in GPU_CATEGORIES:
        lane = _ints(args.get("stream"))
        comm = {k: args[k] for k in _COMM_KEYS if k in args} or None  # newer traces put them on NCCL kernels too
        return TraceEvent(one(cat), one(name), ts, dur, lane if lane is not None else -1,
                          _ints(args.get("External id")), comm=comm, simulated=bool(args.get("simulated")))
    if cat == "cpu_op" or (cat == "user_annotation" and (name.startswith(("ProfilerStep#", "gloo:", "nccl:")))):
        dims = args.get("Input Dims")
        types = args.get("Input type")
        comm = {k: args[k] for k in _COMM_KEYS if k in args} or None
        concrete = args.get("Concrete Inputs") if "attention" in name else None
        return TraceEvent(one(cat), one(name), ts, dur, _ints(raw.get("tid")) or 0,
                          _ints(args.get("External id")),
                          one(_freeze(dims)) if isinstance(dims, list) else None,
                          one(tuple(str(t) for t in types)) if isinstance(types, list) else None, comm,
                          tuple(str(c) for c in concrete) if isinstance(concrete, list) else None)
    return None


def _freeze(value: Any) -> Any:
    return tuple(_freeze(v) for v in value) if isinstance(value, list) else value


def _metadata(trace: Trace, key: str, value: Any) -> None:
    if key == "distributedInfo" and isinstance(value, dict):
        trace.rank, trace.world_size = _ints(value.get("rank")), _ints(value.get("world_size"))
        trace.backend = str(value["backend"]) if value.get("backend") is not None else None
        groups = value.get("pg_config")
        trace.process_groups = [g for g in groups if isinstance(g, dict)] if isinstance(groups, list) else []
    elif key == "deviceProperties" and isinstance(value, list) and value and isinstance(value[0], dict):
        name = value[0].get("name")
        trace.device = str(name) if name else None


def read_trace(path: str | Path) -> Trace:
    """Read one rank's Kineto trace (module doc); every problem is one `SpecError` naming the file."""
    import ijson  # the streaming parser, imported where a trace is read (simdist's other commands do not need it)

    p = Path(path)
    if not p.is_file():
        what = "a folder" if p.is_dir() else "not found"
        raise SpecError(f"{p}: {what}", field="TRACE",
                        fix="give the trace files (*.pt.trace.json or .json.gz), e.g. DIR/*.pt.trace.json*")
    trace = Trace(path=str(p))
    kept = 0
    try:
        with _open(p) as fh:
            # the small top-level keys PyTorch writes before traceEvents, read up to it
            top = ijson.parse(fh, use_float=True)
            seen_events = False
            for prefix, event, value in top:
                if prefix == "" and event == "map_key":
                    if value == "traceEvents":
                        seen_events = True
                        break
                    if value in ("distributedInfo", "deviceProperties"):
                        _metadata(trace, value, _build(top, value))
                elif prefix == "" and event not in ("start_map", "end_map"):
                    raise SpecError(f"{p}: not a Kineto trace (a JSON {event}, not an object)", field="TRACE",
                                    fix="give the *.pt.trace.json files torch.profiler writes")
        if not seen_events:
            raise SpecError(f"{p}: not a Kineto trace (no traceEvents array)", field="TRACE",
                            fix="give the *.pt.trace.json files torch.profiler writes (export_chrome_trace or "
                                "tensorboard_trace_handler)")
        with _open(p) as fh:
            shared: dict[Any, Any] = {}
            for raw in ijson.items(fh, "traceEvents.item", use_float=True):
                ev = _event(raw, shared)
                if ev is None:
                    continue
                kept += 1
                if kept > TRACE_EVENTS.value:
                    raise SpecError(f"{p}: more than {TRACE_EVENTS.text()} timed events ({TRACE_EVENTS.reason})",
                                    field="TRACE", fix="profile fewer steps (torch.profiler.schedule(active=1..3))")
                trace.events.append(ev)
        if trace.rank is None and trace.device is None:  # metadata written after the events (merged traces)
            with _open(p) as fh:
                for key in ("distributedInfo",):
                    for value in ijson.items(fh, key, use_float=True):
                        _metadata(trace, key, value)
                        break
    except ijson.IncompleteJSONError as err:
        if "premature EOF" not in str(err) and "incomplete" not in str(err).lower():
            raise SpecError(f"{p}: not JSON ({_first_line(err)})", field="TRACE",
                            fix="give the *.pt.trace.json files torch.profiler writes") from None
        raise SpecError(f"{p}: the JSON ends early ({_first_line(err)}): a trace cut short, e.g. by a crashed "
                        "profiler", field="TRACE", fix="profile again and let the profiler finish") from None
    except ijson.JSONError as err:
        raise SpecError(f"{p}: not JSON ({_first_line(err)})", field="TRACE",
                        fix="give the *.pt.trace.json files torch.profiler writes") from None
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        raise SpecError(f"{p}: cannot read it ({_first_line(err)})", field="TRACE",
                        fix="give an intact trace file (gzip or JSON)") from None
    if not trace.events:
        raise SpecError(f"{p}: no timed CPU operators, GPU kernels or annotations in its traceEvents",
                        field="TRACE", fix="profile with activities=[CPU, CUDA] and record_shapes=True")
    return trace


def _build(events: Iterator[tuple[str, str, Any]], prefix: str) -> Any:
    """The value at ``prefix`` from an ijson.parse stream positioned at its map_key: built from its events."""
    from ijson.common import ObjectBuilder

    builder = ObjectBuilder()
    depth = 0
    for _, event, value in events:
        builder.event(event, value)
        if event in ("start_map", "start_array"):
            depth += 1
        elif event in ("end_map", "end_array"):
            depth -= 1
        if depth == 0:
            break
    return builder.value


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:160] if text else type(err).__name__


def trace_files(paths: list[str | Path]) -> list[Path]:
    """The trace files named, a folder standing for its ``*.pt.trace.json[.gz]`` files (the profiler's names; where it
    has none, its ``*.json[.gz]`` files that are Kineto traces), sorted."""
    out: list[Path] = []
    for path in paths:
        p = Path(path)
        if p.is_dir():
            files = sorted(q for q in p.iterdir() if q.is_file())
            found = [q for q in files if q.name.endswith((".pt.trace.json", ".pt.trace.json.gz"))] or [
                q for q in files if q.name.endswith((".json", ".json.gz")) and looks_like_trace(q)]
            if not found:
                raise SpecError(f"{p}: a folder without *.json or *.json.gz files", field="TRACE",
                                fix="give the folder torch.profiler's tensorboard_trace_handler wrote to")
            out += found
        else:
            out.append(p)
    return out

