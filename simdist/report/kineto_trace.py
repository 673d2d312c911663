"""A simulated step as PyTorch profiler (Kineto) traces, one per simulated rank (`kineto_traces`): the files
``simdist run --out DIR`` writes as ``DIR/rank<r>.pt.trace.json``, which the tools that open measured traces
(HolisticTraceAnalysis, TensorBoard's trace viewer, Perfetto) and ``simdist validate --trace`` open alike.

What makes a Chrome trace a Kineto trace for those tools (PyTorch torch/csrc/profiler/kineto_shim.cpp and
torch/profiler/profiler.py write it; HTA's parser reads it): a top-level ``schemaVersion``, ``deviceProperties``
(one entry per GPU with its ``name``) and ``distributedInfo`` (``backend``, ``rank``, ``world_size``); GPU work as
complete events of category ``kernel`` with ``args.device`` and ``args.stream``; a ``ProfilerStep#N`` user
annotation around the step on the host thread. Mapping of a simdist op:

- one ``kernel`` event per op of the rank, ``ts``/``dur`` in microseconds, on a stream per simdist stream
  (compute 7, then one per communication stream, numbered as simdist.report.step_trace numbers threads);
- a collective is named ``ncclDevKernel_<Op>`` (AllReduce, AllGather, ReduceScatter, AllToAll, Broadcast, SendRecv)
  followed by simdist's name, so tools that tell communication by the ``nccl`` in a kernel's name (HTA's
  get_kernel_type) do, with record_param_comms' arguments on it: "Collective name", "In msg nelems" and "Out msg
  nelems" (bytes: ``dtype`` Byte), "Group size";
- the simdist op's kind, micro-batch, chunk and stage stay in ``args`` (simdist.report.step_trace.op_args).

These are simulated times: every event's ``args.simulated`` is true, and ``traceName`` says simdist.
"""

from __future__ import annotations

import math
from typing import Any

from simdist.plan.opgraph import OpGraph
from simdist.report.step_trace import US_PER_S, StepTrace, op_args, stream_tid

__all__ = ["NCCL_NAMES", "kineto_traces"]

NCCL_NAMES = {"all_reduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter",
              "all_to_all": "AllToAll", "broadcast": "Broadcast", "send_recv": "SendRecv", "reduce": "Reduce",
              "gather": "Gather", "scatter": "Scatter", "barrier": "AllReduce"}
"""simdist op -> the word NCCL's device kernels use for it (ncclDevKernel_AllReduce_Sum_bf16_RING_LL, ...)."""
_PARAM_COMMS = {"all_reduce": "allreduce", "all_gather": "_allgather_base", "reduce_scatter": "_reduce_scatter_base",
                "all_to_all": "all_to_allv", "broadcast": "broadcast", "send_recv": "send", "reduce": "reduce",
                "gather": "gather", "scatter": "scatter", "barrier": "barrier"}
"""simdist op -> record_param_comms' "Collective name" (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp)."""
COMPUTE_STREAM = 7
"""The stream id of the compute stream: PyTorch's default CUDA stream shows as 7 in Kineto traces."""
HOST_TID = 1
"""The host thread of the ProfilerStep annotation."""


def kineto_traces(graph: OpGraph, trace: StepTrace, *, device_name: str, world_size: int) -> dict[int, dict[str, Any]]:
    """Per simulated rank, its Kineto trace document (module doc)."""
    extra: dict[str, int] = {}
    out: dict[int, dict[str, Any]] = {}
    events: dict[int, list[dict[str, Any]]] = {r: [] for r in graph.ranks()}
    ends: dict[int, float] = {}
    for i, op in enumerate(graph.ops):
        start, end = float(trace.start_s[i]), float(trace.end_s[i])
        if math.isnan(start) or math.isnan(end):
            continue
        tid = stream_tid(op.stream, extra)
        stream = COMPUTE_STREAM if tid == 0 else COMPUTE_STREAM + 13 + tid
        args = {**op_args(op), "device": 0, "stream": stream, "correlation": i + 1, "External id": i + 1,
                "simulated": True}
        name = op.name
        if op.comm is not None:
            nbytes = int(op.comm.nbytes)
            name = f"ncclDevKernel_{NCCL_NAMES.get(op.comm.op, 'AllReduce')} ({op.name})"
            n = len(op.comm.ranks)
            # record_param_comms' convention: all_gather's output and reduce_scatter's input are n x the other side
            in_bytes = nbytes // n if op.comm.op == "all_gather" else nbytes
            out_bytes = nbytes // n if op.comm.op == "reduce_scatter" else nbytes
            args.update({"Collective name": _PARAM_COMMS.get(op.comm.op, op.comm.op), "In msg nelems": in_bytes,
                         "Out msg nelems": out_bytes, "Group size": n, "dtype": "Byte",
                         "Process Group Ranks": list(op.comm.ranks)})
        events[op.rank].append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream,
                                "ts": start * US_PER_S, "dur": max(end - start, 0.0) * US_PER_S, "args": args})
        ends[op.rank] = max(ends.get(op.rank, 0.0), end)
    for rank, evs in events.items():
        evs.sort(key=lambda e: e["ts"])
        step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 0, "tid": HOST_TID,
                "ts": 0.0, "dur": ends.get(rank, 0.0) * US_PER_S, "args": {"simulated": True}}
        out[rank] = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": device_name}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
            "traceEvents": [step, *evs],
            "displayTimeUnit": "ms",
            "traceName": f"simdist simulated step, rank {rank}",
        }
    return out
