"""What each event of a profiler trace is (`kinds_of`) and the measurements a set of rank traces gives
(`trace_measurements`), in simdist.calibrate's own schemas: `simdist calibrate` fits them as it fits a kernel CSV
or an nccl-tests log.

Classes (`KINDS`): gemm, attention, memory (bandwidth-bound kernels: element-wise, norms, softmax, reductions,
copies), collective, compute (a simulated op of a trace simdist wrote, simdist.report.kineto_trace: many kernels in
one), and free (view and allocation operators, which launch no kernel and move no data).

- **GPU traces**: every kernel, memcpy and memset. Its class is its launching operator's (the CPU operator with its
  ``External id``: aten::mm, aten::addmm, aten::bmm, the SDPA operators, record_param_comms) where that one says,
  else its name's (`kernel_kind`: NCCL's ``ncclDevKernel_*``/``ncclKernel_*``, cuBLAS/CUTLASS GEMM names,
  FlashAttention/cuDNN/memory-efficient attention names, as HolisticTraceAnalysis classifies them: its
  hta/utils/utils.py get_kernel_type puts ``nccl`` names in communication, memcpy/memset in memory, the rest in
  computation; simdist splits computation further by name).
- **CPU-only traces** (gloo): the leaf operators (no other operator inside them on their thread) of the threads that
  run the ``ProfilerStep#N`` annotations, the free ones left out, and gloo's collectives (``gloo:all_reduce`` and
  the like, annotated on gloo's worker thread from start to completion).

Measurements:
- a GEMM or attention operator with its shapes (``Input Dims``: profile with ``record_shapes=True``) and a
  memory-bound operator with its bytes give one `KernelMeasurement` per (class, operator, dtype, shape): the median
  of its times (on a GPU, an operator's time is the summed duration of the kernels it launched);
- a collective with its size and group gives one `Measurement` per (op, bytes, group size): the median over its
  calls of each call's shortest time over the ranks given. A collective starts when its last rank arrives, so a rank
  that came early times its wait too; the shortest time over ranks is the collective's own (the same reasoning
  HTA's and Lumos's trace replays use to separate a collective from its arrival skew). With one rank's trace the
  waits stay in (`trace_measurements` says so in its notes).

Only events inside the ``ProfilerStep#N`` windows count where the trace has them (all events otherwise).
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from simdist.calibrate.kernels import KernelMeasurement
from simdist.calibrate.measurements import Measurement
from simdist.calibrate.trace_read import Trace, TraceEvent
from simdist.collectives.ops import algbw_Bps, busbw_Bps

__all__ = ["DTYPES", "KINDS", "Classified", "classify", "collective_op", "kernel_kind", "op_of", "trace_measurements"]

KINDS = ("gemm", "attention", "memory", "compute", "collective", "free")
DTYPES = {"float": ("fp32", 4), "c10::BFloat16": ("bf16", 2), "c10::Half": ("fp16", 2),
          "c10::Float8_e4m3fn": ("fp8", 1), "c10::Float8_e5m2": ("fp8", 1), "double": ("fp64", 8),
          "long int": ("int64", 8), "int": ("int32", 4), "bool": ("bool", 1), "unsigned char": ("uint8", 1),
          "signed char": ("int8", 1), "short int": ("int16", 2)}
"""``Input type`` spellings (c10's scalar type names as the profiler prints them) -> (simdist dtype, bytes)."""
_NCCL_DTYPES = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Long": 8, "Int": 4, "Char": 1, "Byte": 1,
                "Float8_e4m3fn": 1, "Float8_e5m2": 1, "Bool": 1}
"""record_param_comms' ``dtype`` (c10 ScalarType names) -> bytes per element."""
GEMM_OPS = {"aten::mm": "mm", "aten::addmm": "addmm", "aten::bmm": "bmm", "aten::baddbmm": "baddbmm",
            "aten::_scaled_mm": "mm", "aten::addbmm": "baddbmm"}
_CAUSAL_ARG = {"aten::scaled_dot_product_attention": 5, "aten::_scaled_dot_product_flash_attention": 4,
               "aten::_scaled_dot_product_flash_attention_for_cpu": 4,
               "aten::_scaled_dot_product_efficient_attention": 6, "aten::_scaled_dot_product_cudnn_attention": 6,
               "aten::_scaled_dot_product_attention_math": 5, "aten::_flash_attention_forward": 7,
               "aten::_scaled_dot_product_flash_attention_backward": 11,
               "aten::_scaled_dot_product_flash_attention_for_cpu_backward": 8,
               "aten::_scaled_dot_product_efficient_attention_backward": 10,
               "aten::_scaled_dot_product_cudnn_attention_backward": 12}
"""Where each SDPA operator's is_causal sits among its arguments (aten/src/ATen/native/native_functions.yaml)."""
_QUERY_ARG = {n: 1 if n.endswith("_backward") else 0 for n in _CAUSAL_ARG}
"""The query's position: a backward operator's first input is the output gradient."""
_FREE = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::as_strided", "aten::t", "aten::transpose", "aten::permute",
    "aten::reshape", "aten::_reshape_alias", "aten::slice", "aten::select", "aten::narrow", "aten::expand",
    "aten::squeeze", "aten::unsqueeze", "aten::detach", "aten::detach_", "aten::alias", "aten::resolve_conj",
    "aten::resolve_neg", "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::result_type",
    "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::lift_fresh", "aten::view_as",
    "aten::numpy_T", "aten::set_", "aten::is_nonzero", "aten::_has_compatible_shallow_copy_type", "aten::size",
    "aten::stride", "aten::new_empty", "aten::new_empty_strided", "aten::_local_scalar_dense", "aten::item",
    "aten::record_stream", "aten::to", "aten::_to_copy", "aten::contiguous", "aten::clone",
})
"""Operators that launch nothing (views, allocation) or whose work is a child operator's (to/_to_copy/contiguous/
clone call copy_, which is timed itself): not kernels."""
_NCCL = re.compile(r"nccl(?:Symk?)?(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
_COMM = re.compile(r"nccl|multimem_all_reduce|cross_device_reduce|all_reduce_(?:one|two)_shot", re.IGNORECASE)
_EP = re.compile(r"\b(?:deep_ep|hybrid_ep)::(?!layout::)(?:\w+::)*\w*(?:dispatch|combine)", re.IGNORECASE)
"""The expert-parallel token dispatchers' communication kernels, an all-to-all in simdist's terms: DeepEP's
(deep_ep::intranode / internode / internode_ll: notify_dispatch, dispatch, cached_notify_combine, combine, ...;
csrc/kernels at github.com/deepseek-ai/DeepEP) and HybridEP's (hybrid_ep::dispatch_kernel and combine_kernel, its
csrc/hybrid_ep/backend/hybrid_ep_backend.cuh), not DeepEP's layout kernel (deep_ep::layout::get_dispatch_layout,
which counts tokens on the GPU)."""
_ATTENTION = re.compile(r"flash_fwd|flash_bwd|flash::|flashattn|pytorch_flash|fmha|attention|attn|"
                        r"cudnn_generated_fort_native_sdpa", re.IGNORECASE)
_FUSED = re.compile(r"^(?:void )?triton_(?:poi|red|per|for|spl)_")
"""Inductor's fused point-wise / reduction kernels: memory-bound, whatever matmul their names mention."""
_GEMM = re.compile(r"gemm|gemv|nvjet|splitKreduce|^bmm_|Cijk_|triton_tem_.*mm|implicit_gemm|fprop|dgrad|wgrad|"
                   r"scudnn", re.IGNORECASE)
"""GEMM libraries' kernels (cuBLAS/cuBLASLt, CUTLASS, nvjet) and convolutions, which run as implicit GEMMs
(cuDNN's fprop/dgrad/wgrad): compute-bound matrix work."""


def kernel_kind(name: str) -> str:
    """A GPU kernel's class by its name alone, rules in this order (HTA's get_kernel_type puts ``nccl`` kernels in
    communication; the rest refines its "computation"): communication (NCCL's device kernels, custom all-reduce
    kernels, DeepEP's and HybridEP's dispatch and combine); attention (FlashAttention, PyTorch's flash and
    memory-efficient, cuDNN SDPA); Inductor's fused element-wise kernels (memory-bound, before the GEMM test: their
    names may say addmm); GEMMs and convolutions; everything else memory-bound."""
    if _COMM.search(name) or _EP.search(name):
        return "collective"
    if _ATTENTION.search(name):
        return "attention"
    if _FUSED.search(name):
        return "memory"
    if _GEMM.search(name):
        return "gemm"
    return "memory"


def collective_op(name: str) -> str | None:
    """simdist's op for a collective's name: record_param_comms' "Collective name" (allreduce, _allgather_base,
    reduce_scatter_tensor_coalesced, ...), gloo's annotation (gloo:all_reduce), an NCCL kernel's name, or an
    expert-parallel dispatcher's kernel (DeepEP, HybridEP: all_to_all)."""
    if _EP.search(name):
        return "all_to_all"
    m = _NCCL.search(name)
    text = m.group(1) if m else name.split(":", 1)[-1]
    key = re.sub(r"(_base|_coalesced|_into_tensor|_tensor)", "", text.lower()).replace("_", "")
    return {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "alltoall": "all_to_all", "alltoallv": "all_to_all", "broadcast": "broadcast", "reduce": "reduce",
            "send": "send_recv", "recv": "send_recv", "sendrecv": "send_recv", "barrier": "barrier",
            "gather": "gather", "scatter": "scatter"}.get(key)


def op_of(c: Classified) -> str | None:
    """simdist's op of a classified collective: its operator's "Collective name" where the trace links one (NCCL runs
    an all_to_all as ncclDevKernel_SendRecv, a pipeline send's kernel too: record_param_comms tells them apart),
    else its kernel's or annotation's name's (`collective_op`)."""
    info = c.op.comm if c.op is not None else None
    return (collective_op(str(info.get("Collective name", ""))) if info else None) or collective_op(c.name)


def _elements(dims: Sequence) -> int:
    return math.prod(int(d) for d in dims) if dims else 0


def _dtype(types: tuple[str, ...] | None, index: int = 0) -> tuple[str, int] | None:
    if not types or index >= len(types):
        return None
    return DTYPES.get(types[index])


@dataclass(frozen=True, slots=True)
class Classified:
    """One timed unit of work of a rank: a kernel (GPU) or a leaf operator (CPU), with its class and times."""

    kind: str
    name: str
    """The operator's name where known (aten::mm), else the kernel's."""
    start_us: float
    end_us: float
    op: TraceEvent | None
    """The operator it ran for (shapes, dtypes, collective arguments), None where the trace does not link it."""


def _inside(t: float, windows: list[tuple[float, float]]) -> bool:
    return not windows or any(a <= t <= b for a, b in windows)


def classify(trace: Trace) -> list[Classified]:
    """The rank's kernels (GPU trace) or leaf operators and gloo collectives (CPU trace), classified (module doc),
    inside its step windows where it has them; computed once and kept on the trace (``trace.classified``)."""
    if trace.classified is not None:
        return trace.classified
    windows = trace.steps
    ops = [e for e in trace.events if e.cat == "cpu_op"]
    gpu = [e for e in trace.events if e.on_gpu]
    out: list[Classified] = []
    if gpu:
        by_ext: dict[int, TraceEvent] = {}
        comm_by_ext: dict[int, TraceEvent] = {}
        for o in ops:
            if o.ext_id is None:
                continue
            if o.comm is not None:
                comm_by_ext[o.ext_id] = o
            if o.name in GEMM_OPS or o.name in _CAUSAL_ARG or o.ext_id not in by_ext:
                by_ext[o.ext_id] = o
        for k in gpu:
            launch = by_ext.get(k.ext_id) if k.ext_id is not None else None
            if not _inside(launch.ts_us if launch is not None else k.ts_us, windows):
                continue
            comm = k if k.comm is not None else comm_by_ext.get(k.ext_id) if k.ext_id is not None else None
            if k.cat != "kernel":
                kind = "memory"
            elif k.comm is not None or _COMM.search(k.name) or _EP.search(k.name):
                kind, launch = "collective", comm or launch
            elif k.simulated:
                kind = "compute"
            elif launch is not None and launch.name in GEMM_OPS:
                kind = "gemm"
            elif launch is not None and launch.name in _CAUSAL_ARG:
                kind = "attention"
            else:
                kind = kernel_kind(k.name)
            name = launch.name if launch is not None and kind != "collective" else k.name
            out.append(Classified(kind, name, k.ts_us, k.end_us, launch))
        trace.classified = out
        return out
    step_threads = {e.lane for e in trace.events if e.cat == "user_annotation" and e.name.startswith("ProfilerStep#")}
    by_thread: dict[int, list[TraceEvent]] = defaultdict(list)
    for o in ops:
        # free operators are left out first: an operator with only views inside it is a leaf
        if (not step_threads or o.lane in step_threads) and o.name not in _FREE:
            by_thread[o.lane].append(o)
    for lane_ops in by_thread.values():
        lane_ops.sort(key=lambda e: (e.ts_us, -e.dur_us))
        for i, o in enumerate(lane_ops):
            nxt = lane_ops[i + 1] if i + 1 < len(lane_ops) else None
            if nxt is not None and nxt.ts_us < o.end_us:
                continue  # an operator with another inside it: its work is its children's
            if not _inside(o.ts_us, windows) or o.comm is not None:
                continue
            if o.name.startswith("c10d::") or o.name.startswith("autograd::") or o.name == "record_param_comms":
                continue  # enqueueing a collective; gloo times the collective itself (below)
            kind = "gemm" if o.name in GEMM_OPS else "attention" if o.name in _CAUSAL_ARG else "memory"
            out.append(Classified(kind, o.name, o.ts_us, o.end_us, o))
    for e in trace.events:
        if e.cat == "user_annotation" and e.name.startswith("gloo:") and _inside(e.ts_us, windows):
            out.append(Classified("collective", e.name, e.ts_us, e.end_us, e))
    trace.classified = out
    return out


def _gemm_shape(op: TraceEvent) -> tuple[int, int, int, int] | None:
    """(m, n, k, batch) of a GEMM operator from its input dims."""
    dims = op.dims or ()
    form = GEMM_OPS[op.name]
    mats = [tuple(int(x) for x in d) for d in dims if d]
    if form == "mm" and len(mats) >= 2 and len(mats[0]) == 2 and len(mats[1]) == 2:
        (m, k), (_, n) = mats[0], mats[1]
        return m, n, k, 1
    if form == "addmm" and len(mats) >= 3 and len(mats[1]) == 2 and len(mats[2]) == 2:
        (m, k), (_, n) = mats[1], mats[2]
        return m, n, k, 1
    three = [d for d in mats if len(d) == 3]
    if form in ("bmm", "baddbmm") and len(three) >= 2:
        (b, m, k), (_, _, n) = three[-2], three[-1]
        return m, n, k, b
    return None


def _kernel_row(kind: str, op: TraceEvent, times_s: list[float], device: str, source: str
                ) -> KernelMeasurement | None:
    """The measurement of one (class, operator, dtype, shape) group, None where its work cannot be told."""
    if kind == "gemm":
        if op.name not in GEMM_OPS:  # a convolution's implicit GEMMs: no (m, n, k) to price them by
            return None
        shape, dt = _gemm_shape(op), _dtype(op.types, 1 if GEMM_OPS[op.name] == "addmm" else 0)
        if shape is None or dt is None or dt[0] not in ("fp32", "bf16", "fp16", "fp8"):
            return None
        m, n, k, b = shape
        flops, nbytes = 2.0 * m * n * k * b, float((m * k + k * n + m * n) * b * dt[1])
        extra = {"m": m, "n": n, "k": k, "batch": b}
    elif kind == "attention":
        if op.name not in _CAUSAL_ARG:
            return None
        q = _QUERY_ARG.get(op.name, 0)
        dims, dt = op.dims or (), _dtype(op.types, q)
        if len(dims) < q + 2 or len(dims[q]) != 4 or len(dims[q + 1]) != 4 or dt is None:
            return None
        (b, h, s, d), sk = (int(x) for x in dims[q]), int(dims[q + 1][2])
        index = _CAUSAL_ARG[op.name]
        causal = bool(op.concrete and index < len(op.concrete) and op.concrete[index].lower() == "true")
        backward = op.name.endswith("_backward")
        # simdist.plan.layer_cost's count: 4 b h s s_k d forward, 2.5x that backward, halved when causal
        flops = 4.0 * b * h * s * sk * d * (2.5 if backward else 1.0) * (0.5 if causal else 1.0)
        nbytes = float(sum(_elements(x) for x in dims[q:q + 3]) * dt[1] * 2)
        family = "flash2" if "flash" in op.name and "cpu" not in op.name and device else (
            "cudnn" if "cudnn" in op.name else "cpu" if not device else "efficient")
        extra = {"m": s, "n": sk, "k": d, "batch": b * h, "seq_len": s, "head_dim": d, "causal": causal,
                 "direction": "backward" if backward else "forward", "attention_kernel": family}
    else:
        tensors = [(d, _dtype(op.types, i)) for i, d in enumerate(op.dims or ()) if d]
        sized = [(_elements(d), t[1]) for d, t in tensors if t is not None]
        if not sized:
            return None
        # Assumption: a bandwidth-bound operator reads its tensor inputs and writes one output as large as the
        # largest of them (element-wise, norms, copies); reductions write less, so their bytes are an upper bound.
        nbytes = float(sum(n * e for n, e in sized) + max(n * e for n, e in sized))
        flops, dt, extra = 0.0, _dtype(op.types, 0) or ("fp32", 4), {}
        if nbytes <= 0:
            return None
    med = statistics.median(times_s)
    if med <= 0:
        return None
    return KernelMeasurement(kernel=kind, name=op.name, dtype=dt[0], flops=flops, hbm_bytes=nbytes, time_s=med,
                             time_mean_s=statistics.fmean(times_s), num_samples=len(times_s), device=device,
                             source=source, **extra)


def _comm_of(c: Classified, trace: Trace) -> tuple[str, int, int] | None:
    """(op, nccl-tests bytes, group size) of a collective, None where the trace does not say."""
    op_event = c.op
    info = op_event.comm if op_event is not None else None
    if info:
        op = op_of(c)
        size = _NCCL_DTYPES.get(str(info.get("dtype", "")), 0)
        n = int(info.get("Group size") or 0)
        if op is None or not size or n < 1:
            return None
        inside, outside = int(info.get("In msg nelems") or 0), int(info.get("Out msg nelems") or 0)
        elements = outside if op in ("all_gather", "gather") else inside
        return op, elements * size, n
    if op_event is None or op_event.cat != "user_annotation":
        return None
    op = collective_op(c.name)
    dt = _dtype(op_event.types, 0)
    groups = {int(g.get("pg_size") or 0) for g in trace.process_groups}
    # gloo's annotations do not name their group: only a run of one group size (or the world) says it
    n = groups.pop() if len(groups) == 1 else trace.world_size if not groups else 0
    if op is None or dt is None or not n or not op_event.dims:
        return None
    elements = sum(_elements(d) for d in op_event.dims if d)
    if op == "all_gather" and len(op_event.dims) == 1:
        elements *= n  # the input alone: the full output is n of it
    return op, elements * dt[1], n


def trace_measurements(traces: Sequence[Trace]) -> tuple[list[Measurement], list[KernelMeasurement], list[str]]:
    """The collective and kernel measurements of the rank traces (module doc), and notes on what was left out."""
    notes: list[str] = []
    kernel_groups: dict[tuple, tuple[TraceEvent, list[float], str, str]] = {}
    calls: dict[tuple[str, int, int], list[list[float]]] = defaultdict(list)  # per key: per call, each rank's time
    unknown_comm = 0
    for trace in traces:
        seen: dict[tuple[str, int, int], int] = defaultdict(int)
        # a GPU operator's time is the sum of the kernels it launched
        per_op: dict[int, tuple[str, TraceEvent, float]] = {}
        for c in classify(trace):
            if c.kind == "collective":
                key = _comm_of(c, trace)
                if key is None:
                    unknown_comm += collective_op(c.name) != "barrier"  # a barrier moves no data: not counted
                    continue
                i = seen[key]
                seen[key] += 1
                while len(calls[key]) <= i:
                    calls[key].append([])
                calls[key][i].append((c.end_us - c.start_us) * 1e-6)
                continue
            if c.kind == "free" or c.op is None:
                continue
            ident = id(c.op)
            kind, op, t = per_op.get(ident, (c.kind, c.op, 0.0))
            per_op[ident] = (kind, op, t + (c.end_us - c.start_us) * 1e-6)
        for kind, op, t in per_op.values():
            key = (kind, op.name, op.dims, op.types, op.concrete)
            if key not in kernel_groups:
                kernel_groups[key] = (op, [], kind, trace.device or "")
            kernel_groups[key][1].append(t)
    kernels = []
    skipped = 0
    source = ", ".join(sorted({t.path for t in traces}))
    for op, times, kind, device in kernel_groups.values():
        row = _kernel_row(kind, op, times, device, source)
        if row is None:
            skipped += 1
        else:
            kernels.append(row)
    if skipped:
        notes.append(f"{skipped} operator shapes simdist cannot price were left out of the kernel fit (convolutions, "
                     "and operators without their input dims or dtypes: profile with record_shapes=True)")
    if unknown_comm:
        notes.append(f"{unknown_comm} collective calls without their size or group were left out")
    if len(traces) == 1 and calls:
        notes.append("one rank's trace: its collective times include waiting for the other ranks (give every "
                     "rank's trace: the shortest time over ranks is the collective's own)")
    measurements = []
    device = next((t.device for t in traces if t.device), None)
    for (op, nbytes, n), per_call in sorted(calls.items()):
        times = [min(ranks) for ranks in per_call if ranks and min(ranks) > 0]
        if not times or nbytes <= 0 or op == "barrier":
            continue
        t = statistics.median(times)
        measurements.append(Measurement(op, int(nbytes), n, t, algbw_Bps(nbytes, t),
                                        busbw_Bps(op, n, nbytes, t), source, device=device,
                                        label=f"{len(times)} calls"))
    return measurements, kernels, notes
