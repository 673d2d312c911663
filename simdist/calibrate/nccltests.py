"""Read nccl-tests results: the text a ``*_perf`` binary prints, and the JSON its ``-J file`` option writes.

Text (``all_reduce_perf -b 8 -e 8G -f 2 -g 8``): ``#`` header lines, then one row per size::

    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
         1048576        262144     float     sum      -1    101.9   10.29   18.00      0    101.6   10.32   18.06      0

The first four measured columns are out-of-place, the last four in-place; time is in microseconds and
bandwidths in GB/s (1e9 bytes/s). algbw = size / time and busbw = algbw x the op's factor (nccl-tests
doc/PERFORMANCE.md); the values the file reports are kept as they are. Rows are located by the column
header of the same file; when a row does not match it (other versions print other preambles: no
``root``, ``error`` instead of ``#wrong``, ``N/A`` under ``-c 0``) the last eight fields are read
from the right. A trailing ``-S`` timestamp and ``[1,0]<stdout>:`` prefixes of mpirun are dropped.

Everything is read from the content, never from the file's name (a log saved as ``node17.log`` reads as
``all_reduce_perf.txt`` does). The op comes from ``# Collective test starting: all_reduce_perf`` (recent
nccl-tests), else from the rows themselves (`op_from_row`: what nccl-tests prints differs per test), else
from a ``*_perf`` name in the text; the file name only breaks a tie the rows leave (all_gather and
all_to_all print alike). The rank count comes from the ``#  Rank  3 Group  0 Pid ... on host device 3
[0x..] NVIDIA H100 80GB HBM3`` lines (which also name the GPU, kept as ``device``), else from
``nThread x nGpus``; the algorithm from an ``NCCL_ALGO set by environment to Ring`` line
(NCCL_DEBUG=INFO) when present.

What a row says about its test (nccl-tests src/*.cu ``*GetCollByteCount`` and ``*RunTest``; src/common.cu
prints ``size`` = max(send, receive bytes) and ``count`` = the per-call element count): ``count x element
size = size`` for all_reduce, broadcast, reduce and sendrecv, ``= size / ranks`` for all_gather,
reduce_scatter, alltoall, scatter and gather; ``redop`` is ``none`` for the data-movement tests
(all_gather, alltoall, broadcast, scatter, gather); ``root`` is -1 for the rootless ones; and
busbw / algbw is the op's factor (sendrecv 1, all_reduce 2(n-1)/n: doc/PERFORMANCE.md).

JSON (``-J out.json``, nccl-tests src/util.cu, format ``"version": 2``): a top-level object with
``args`` (argv: ``args[0]`` names the binary), ``env`` ("NAME=value" strings), ``nccl_version`` (an
int, 22703 = 2.27.3), ``config`` (``nthreads``, ``ngpus``, ``devices``: one ``{rank, hostname, device,
device_hex, device_info}`` per process, device_info naming the GPU) and ``results``: one object per size
with ``size``, ``count``, ``type``, ``redop``, ``root`` and ``out_of_place`` / ``in_place`` objects
holding ``time`` (us; ``cpu_time`` with -C 1), ``alg_bw``, ``bus_bw`` (GB/s) and ``nwrong`` (null with
-c 0). Ranks = devices x nthreads x ngpus. The op: ``args[0]``, else each result's content as in text.
"""

from __future__ import annotations

import math
import re
from pathlib import PurePath

from simdist.calibrate.measurements import Measurement
from simdist.errors import SimdistError, SpecError
from simdist.files import JsonProblem, loads_json
from simdist.units import ascii_int

__all__ = ["looks_like_nccltests_text", "op_from_binary", "op_from_row", "parse_nccltests_json",
           "parse_nccltests_text"]

_OPS_BY_KEY = {
    "allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "alltoall": "all_to_all", "sendrecv": "send_recv",
    "scatter": "scatter", "gather": "gather",
}
_MPI_PREFIX = re.compile(r"^\[\d+,\d+\]<std(?:out|err)>:")
_STARTING = re.compile(r"Collective test starting:\s*(\S+)")
_BINARY = re.compile(r"([A-Za-z_]+?_perf)(?:_mpi)?(?![A-Za-z0-9])")
_DEVICE = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device")
_DEVICE_NAME = re.compile(r"device\s+\d+\s+\[[^\]]*\]\s+(.+?)\s*$")  # src/util.cu: "device %2d [%04x:..] %s"
_THREADS = re.compile(r"nThread\s+(\d+)\s+nGpus\s+(\d+)")
_LIBRARY = re.compile(r"nccl-library=(\d+)")
_NCCL_VERSION = re.compile(r"NCCL version\s+(\d+\.\d+\.\d+)")
_ALGO = re.compile(r"NCCL_ALGO set by environment to\s+(\S+)")
# A failed run: "host: Test NCCL failure common.cu:1005 'unhandled system error'", "Test CUDA failure ...",
# ".. host pid 123: Test failure common.cu:891", or "# Out of bounds values : 3 FAILED" (nccl-tests src/common.cu).
_FAILED = re.compile(r"Test (?:NCCL |CUDA )?failure|Out of bounds values\s*:\s*[1-9]\d*\s+FAILED")
_FOOTER = re.compile(r"^#\s*(Out of bounds values|Avg bus bandwidth|Collective test concluded)")
_DETECT = re.compile(r"Collective test starting|^#\s*Using devices|^#\s+size\s+count|Avg bus bandwidth", re.M)
_DATE, _CLOCK = re.compile(r"^\d{4}-\d\d-\d\d$"), re.compile(r"^\d\d:\d\d:\d\d$")
# Element sizes of nccl-tests' type names (src/common.cu test_typenames).
_TYPE_BYTES = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2, "float": 4,
               "double": 8, "bfloat16": 2, "f8e4m3": 1, "f8e5m2": 1}
# (whole buffer per call, a reduction, rooted) -> the tests that print rows so (module doc).
_ROW_KINDS: dict[tuple[bool, bool, bool], tuple[str, ...]] = {
    (True, True, False): ("all_reduce", "send_recv"), (True, False, True): ("broadcast",),
    (True, True, True): ("reduce",), (False, False, False): ("all_gather", "all_to_all"),
    (False, True, False): ("reduce_scatter",), (False, False, True): ("scatter", "gather"),
}
_TEXT_FIX = "pass the unedited stdout of an nccl-tests binary (rows: size count type redop root, then " \
            "time algbw busbw #wrong out-of-place and in-place)"
_JSON_FIX = "pass the file nccl-tests writes with -J (JSON format version 2)"


def op_from_binary(name: str) -> str | None:
    """``./build/all_reduce_perf`` -> 'all_reduce', ``AllReduce`` -> 'all_reduce'; None if not a collective."""
    base = PurePath(name.strip()).name.lower()
    base = re.sub(r"(_perf)?(_mpi)?$", "", base)
    return _OPS_BY_KEY.get(base.replace("_", ""))


def looks_like_nccltests_text(text: str) -> bool:
    """True when ``text`` has an nccl-tests header or footer line."""
    return bool(_DETECT.search("\n".join(_MPI_PREFIX.sub("", line) for line in text.splitlines())))


def _op_in(text: str) -> str | None:
    for m in _BINARY.finditer(text):
        parts = m[1].split("_")  # 'node3_all_reduce_perf': try the tails
        for k in range(len(parts) - 1):
            if op := op_from_binary("_".join(parts[k:])):
                return op
    return None


def _version(code: int) -> str:
    """NCCL_VERSION_CODE -> 'X.Y.Z' (X*10000+Y*100+Z since 2.9, X*1000+Y*100+Z before)."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


class _Section:
    """What the header lines of one test said (a file may hold several tests one after the other)."""

    def __init__(self, version: str | None, algorithm: str | None) -> None:
        self.op: str | None = None
        self.ranks: dict[int, str] = {}  # rank -> host
        self.devices: dict[int, str] = {}  # rank -> GPU name
        self.local_ranks = 0  # nThread x nGpus
        self.header: list[str] | None = None
        self.version, self.algorithm = version, algorithm

    def device(self) -> str | None:
        names = sorted(set(self.devices.values()))
        return " + ".join(names) if names else None


def op_from_row(size: int, count: int, dtype: str | None, redop: str | None, root: str | None, ranks: int,
                algbw: float, busbw: float) -> tuple[str, ...]:
    """The nccl-tests ops a result row is consistent with (module doc); () when the row cannot tell."""
    width = _TYPE_BYTES.get((dtype or "").lower())
    if width is None or ranks < 2 or count <= 0 or redop is None or root is None:
        return ()
    try:
        rooted = int(root) >= 0
    except ValueError:
        return ()
    if count * width == size:
        whole = True
    elif count * width * ranks == size:
        whole = False
    else:
        return ()
    kinds = _ROW_KINDS.get((whole, redop.lower() != "none", rooted), ())
    if kinds == ("all_reduce", "send_recv") and ranks > 2 and algbw >= 0.1:
        # busbw / algbw is 2(n-1)/n for all_reduce, 1 for sendrecv (nccl-tests doc/PERFORMANCE.md)
        ratio = busbw / algbw
        kinds = ("all_reduce",) if abs(ratio - 2 * (ranks - 1) / ranks) < abs(ratio - 1.0) else ("send_recv",)
    return kinds


def _pick_op(candidates: tuple[str, ...], mentioned: str | None, source: str, where: str) -> str:
    """The op of a row its content leaves ``candidates`` for: the only one, else the one the text or (last) the
    file name names."""
    if len(candidates) == 1:
        return candidates[0]
    named = _op_in(PurePath(source).name)
    for hint in (mentioned, named):
        if hint is not None and (not candidates or hint in candidates):
            return hint
    if candidates:
        binary = {"all_to_all": "alltoall", "send_recv": "sendrecv"}.get(candidates[0], candidates[0]) + "_perf"
        raise SpecError(f"cannot tell which collective this nccl-tests output measures: its rows could be "
                        f"{' or '.join(candidates)}", source=where,
                        fix=f"keep the '# Collective test starting: {binary}' line of the output (nccl-tests 2.14+), "
                            "or add it above the rows")
    raise SpecError("cannot tell which collective this nccl-tests output measures", source=where,
                    fix="keep the '# Collective test starting: all_reduce_perf' line and the '#  Rank ...' device "
                        "lines of the nccl-tests output")


def parse_nccltests_text(
    text: str, source: str, *, op: str | None = None, num_ranks: int | None = None, in_place: bool = True
) -> list[Measurement]:
    """Measurements from nccl-tests stdout: out-of-place rows, then (``in_place``) in-place ones flagged so.

    ``op`` and ``num_ranks`` override what the text says. Raises `SpecError` naming ``source:line``.
    """
    sec, mentioned = _Section(None, None), None
    seen_header = bool(re.search(r"^\s*(\[\d+,\d+\]<stdout>:)?#\s+size\s+count", text, re.M))
    in_table = not seen_header
    out: list[Measurement] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _MPI_PREFIX.sub("", raw).strip()
        if m := _ALGO.search(line):
            sec.algorithm = m[1].lower()
        if m := _NCCL_VERSION.search(line):
            sec.version = m[1]
        if m := _STARTING.search(line):
            sec = _Section(sec.version, sec.algorithm)  # a new test begins
            sec.op = op_from_binary(m[1])
        mentioned = mentioned or _op_in(line)
        if _FAILED.search(line):
            raise SpecError(f"the nccl-tests run failed: {' '.join(line.split())[:160]}", source=f"{source}:{number}",
                            fix="rerun it (NCCL_DEBUG=INFO says why); a failed run's timings are not measurements")
        if line.startswith("#"):
            in_table = _header_line(line, sec, in_table)
            continue
        tokens = line.split()
        if not in_table or not tokens or ascii_int(tokens[0]) is None:
            continue  # NCCL INFO lines, warnings, launcher noise
        where = f"{source}:{number}"
        ranks = num_ranks or max(len(sec.ranks), sec.local_ranks)
        if not ranks:
            raise SpecError("cannot tell the number of ranks", source=where,
                            fix="keep the '#  Rank  0 Group  0 Pid ...' device lines of the nccl-tests output")
        null_body = re.search(r"\S {30,}\S", line) is not None  # -O 0 prints 32 blanks for out-of-place
        nbytes, dtype, blocks, preamble = _row(tokens, sec.header, where, null_body)
        row_op = op or sec.op
        if row_op is None:
            _, t_alg_bus = blocks[0]
            candidates = op_from_row(nbytes, preamble["count"], dtype, preamble["redop"], preamble["root"], ranks,
                                     t_alg_bus[1], t_alg_bus[2])
            row_op = _pick_op(candidates, mentioned, source, where)
        for block_in_place, (t_us, alg, bus) in blocks:
            if block_in_place and not in_place:
                continue
            out.append(Measurement(
                op=row_op, nbytes=nbytes, num_ranks=ranks, time_s=t_us * 1e-6, algbw_Bps=alg * 1e9,
                busbw_Bps=bus * 1e9, source=source, dtype=dtype, algorithm=sec.algorithm,
                in_place=block_in_place, num_nodes=len(set(sec.ranks.values())) or None,
                nccl_version=sec.version, device=sec.device(),
            ))
    if not out:
        raise SpecError("no nccl-tests result rows found", source=source, fix=_TEXT_FIX)
    return out


def _header_line(line: str, sec: _Section, in_table: bool) -> bool:
    """Update ``sec`` from one '#' line; return whether result rows may follow."""
    if m := _DEVICE.match(line):
        sec.ranks[int(m[1])] = m[2]
        if name := _DEVICE_NAME.search(line):
            sec.devices[int(m[1])] = name[1]
    elif m := _THREADS.search(line):
        sec.local_ranks = int(m[1]) * int(m[2])
    elif m := _LIBRARY.search(line):
        sec.version = _version(int(m[1]))
    elif _FOOTER.match(line):
        return False
    names = line.lstrip("#").split()
    if names[:2] == ["size", "count"] and {"time", "cputime"} & set(names):
        sec.header = [n for n in names if n != "timestamp"]
        return True
    return in_table


def _row(tokens: list[str], header: list[str] | None, where: str, null_body: bool
         ) -> tuple[int, str | None, list, dict]:
    """(size, dtype, [(in_place, (time_us, algbw_GBps, busbw_GBps)), ...], {count, redop, root}) of one row."""
    if len(tokens) >= 2 and _DATE.match(tokens[-2]) and _CLOCK.match(tokens[-1]):
        tokens = tokens[:-2]  # -S 1 timestamp
    n = len(tokens)
    if header and n == len(header):
        starts = [i for i, name in enumerate(header) if name in ("time", "cputime")]
        blocks = [(False, starts[-2]), (True, starts[-1])] if len(starts) > 1 else [(False, starts[0])]
    elif header and n == len(header) - 4 and null_body:  # -O 0 / replay: no out-of-place block
        blocks = [(True, n - 4)]
    else:
        if n < 10:
            raise SpecError(f"result row has {n} fields (a truncated line?)", source=where, fix=_TEXT_FIX)
        blocks = [(False, n - 8), (True, n - 4)]
    first = min(start for _, start in blocks)
    nbytes = int(tokens[0])
    dtype = next((t for t in tokens[2:first] if not re.fullmatch(r"-?\d+", t)), None)
    named = dict(zip(header, tokens, strict=False)) if header and n >= len(header) - 4 else {}
    pre = tokens[:first]  # size count type redop root (older versions: no root)
    preamble = {"count": (ascii_int(pre[1]) or 0) if len(pre) > 1 else 0,
                "redop": named.get("redop", pre[3] if len(pre) > 3 else None),
                "root": named.get("root", pre[4] if len(pre) > 4 else None)}
    values = []
    for in_place, start in blocks:
        try:
            t_us, alg, bus = (float(x) for x in tokens[start : start + 3])
        except ValueError:
            bad = next(x for x in tokens[start : start + 3] if not _is_float(x))
            expected = f", the header {len(header)}" if header else ""
            raise SpecError(f"cannot read result row ({n} fields{expected}): '{bad}' is not a number",
                            source=where, fix=_TEXT_FIX) from None
        values.append((in_place, t_us, alg, bus))
    return nbytes, dtype, [(ip, (t, a, b)) for ip, t, a, b in values], preamble


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_nccltests_json(
    text: str, source: str, *, op: str | None = None, num_ranks: int | None = None, in_place: bool = True
) -> list[Measurement]:
    """Measurements from an nccl-tests ``-J`` file (schema in the module docstring)."""
    try:
        doc = loads_json(text)
    except JsonProblem as exc:
        where = source if exc.lineno is None else f"{source}:{exc.lineno}"
        raise SpecError(f"not valid JSON ({exc.reason})", source=where, fix=_JSON_FIX) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise SpecError("no 'results' list: not an nccl-tests -J file", source=source, fix=_JSON_FIX)
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    devices = [d for d in config.get("devices") or [] if isinstance(d, dict)]
    args = doc.get("args") or []
    env = dict(e.split("=", 1) for e in doc.get("env") or [] if isinstance(e, str) and "=" in e)
    ranks = num_ranks or len(devices) * int(config.get("nthreads", 1)) * int(config.get("ngpus", 1))
    if not ranks:
        raise SpecError("cannot tell the number of ranks", field="config.devices", source=source,
                        fix="pass the unedited -J file (config.devices lists one entry per process)")
    version = doc.get("nccl_version")
    names = sorted({str(d.get("device_info") or d.get("name") or "").strip() for d in devices} - {""})
    common = dict(
        num_ranks=ranks, source=source, algorithm=env["NCCL_ALGO"].lower() if env.get("NCCL_ALGO") else None,
        num_nodes=len({d.get("hostname") for d in devices}) or None,
        nccl_version=_version(version) if isinstance(version, int) else None,
        device=" + ".join(names) or None,
    )
    file_op = op or (op_from_binary(str(args[0])) if args else None)
    out: list[Measurement] = []
    for i, result in enumerate(doc["results"]):
        name = str(result.get("experiment_name") or "") if isinstance(result, dict) else ""
        row_op = file_op or op_from_binary(name) or _json_row_op(result, ranks, source, i)
        try:
            for key, flag in (("out_of_place", False), ("in_place", True)):
                block = result.get(key)
                if block is None or (flag and not in_place):
                    continue
                t_us = _json_number(block, "cpu_time" if "cpu_time" in block else "time", key)
                out.append(Measurement(
                    op=row_op, nbytes=int(_json_number(result, "size", "")), time_s=t_us * 1e-6,
                    algbw_Bps=_json_number(block, "alg_bw", key) * 1e9,
                    busbw_Bps=_json_number(block, "bus_bw", key) * 1e9,
                    dtype=result.get("type"), in_place=flag, **common,
                ))
        except SimdistError as exc:
            raise exc.located(source=source, field_prefix=f"results[{i}]") from None
        except (AttributeError, TypeError):
            raise SpecError("result is not an object with size and out_of_place/in_place objects",
                            field=f"results[{i}]", source=source, fix=_JSON_FIX) from None
    if not out:
        raise SpecError("the 'results' list is empty", source=source, fix=_JSON_FIX)
    return out


def _json_row_op(result: object, ranks: int, source: str, index: int) -> str:
    """The op a -J result's own fields say (`op_from_row`), for a file whose args do not name the binary."""
    if not isinstance(result, dict):
        raise SpecError("result is not an object", field=f"results[{index}]", source=source, fix=_JSON_FIX)
    block = result.get("out_of_place") or result.get("in_place") or {}
    try:
        candidates = op_from_row(int(result.get("size", 0)), int(result.get("count", 0)), result.get("type"),
                                 result.get("redop"), str(result.get("root", "")).strip(), ranks,
                                 float(block.get("alg_bw", 0) or 0), float(block.get("bus_bw", 0) or 0))
    except (TypeError, ValueError, AttributeError):
        candidates = ()
    try:
        return _pick_op(candidates, None, source, source)
    except SpecError as exc:
        raise SpecError(exc.problem, field="args", source=source,
                        fix="keep args[0] (the nccl-tests binary, e.g. all_reduce_perf)") from None


def _json_number(obj: dict, key: str, where: str) -> float:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        field = f"{where}.{key}" if where else key
        raise SpecError(f"{value!r} is not a non-negative number", field=field, fix=_JSON_FIX)
    return float(value)
