"""Generate the teaching notebooks from the cells below (``python notebooks/build.py``).

The cells live here as Python source so they can be reviewed as text; the committed ``.ipynb`` files are
what this script writes, with no outputs (tests/test_notebooks.py checks both and executes them).
``python notebooks/build.py --check`` exits with status 1 when a committed notebook differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
MD, CODE = "markdown", "code"

NB01 = [
    (MD, """# 1. Collectives: what moves, and what it costs

Stanford CS336's parallelism lectures start from the primitives every distributed training job is made of:
*collectives*, operations that every rank of a group calls together. This notebook runs them twice with
**simdist**: once on real numbers (to see *what* each primitive computes) and once on simulated hardware
(to see *what it costs*). Change any number and re-run.

Vocabulary: a *rank* is one process on one GPU; the *world size* P is how many ranks take part."""),
    (CODE, """from simdist import api
from simdist import notebooks as nb"""),
    (MD, """## The lecture's four-rank example

Four ranks each hold a four-element tensor: `v0 = [0,1,2,3]`, `v1 = [1,2,3,4]`, `v2 = [2,3,4,5]`,
`v3 = [3,4,5,6]`. Their sum is `[6, 10, 14, 18]`.

* **reduce-scatter** sums the tensors and leaves one shard of the sum on each rank: rank r gets element r.
* **all-gather** gives every rank every shard.

`nb.run_collective_on_data` runs the very plan the simulator times (here NCCL's ring) on these numbers:
every transfer of the plan moves (or adds) the values."""),
    (CODE, """v = [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]]
shards = nb.run_collective_on_data("reduce_scatter", v)
gathered = nb.run_collective_on_data("all_gather", shards)
for rank, (shard, full) in enumerate(zip(shards, gathered, strict=True)):
    print(f"rank {rank}: reduce_scatter -> {shard}   all_gather -> {full}")"""),
    (CODE, """nb.rank_values_chart({"inputs v0..v3": v, "after reduce_scatter": shards, "after all_gather": gathered},
                      title="reduce-scatter, then all-gather, on four ranks")"""),
    (MD, """## all-reduce = all-gather after reduce-scatter

all-reduce leaves the full sum on every rank. It is exactly the two steps above: first combine the
contributions (reduce-scatter), then replicate the result (all-gather). ZeRO and FSDP cut along this seam:
they keep only the shard after the reduce-scatter and gather parameters when they need them.

Every algorithm simdist knows computes the same answer; they differ only in *how* the bytes travel."""),
    (CODE, """print("all_reduce directly:     ", nb.run_collective_on_data("all_reduce", v)[0])
print("reduce_scatter+all_gather:", gathered[0])
for algorithm in ["ring", "tree", "direct", "halving_doubling", "nvls"]:
    print(f"{algorithm:>17}: every rank holds", nb.run_collective_on_data("all_reduce", v, algorithm)[0])"""),
    (MD, """### The other primitives on the same data

Rooted operations have a *root* (rank 0 here); a rank that receives nothing shows `[]`.
all-to-all sends block j of every rank to rank j: with equal blocks it is a transpose."""),
    (CODE, """for op in ["broadcast", "reduce", "scatter", "gather", "all_to_all"]:
    print(f"{op:>10}:", nb.run_collective_on_data(op, v, "direct"))"""),
    (MD, """## Timing: algbw versus busbw

nccl-tests reports two bandwidths. The *algorithm bandwidth* is `algbw = S / t` for the collective's size S.
The *bus bandwidth* multiplies it by a factor that makes the figure comparable to a link's speed whatever P is:
`2(P-1)/P` for all-reduce, `(P-1)/P` for reduce-scatter and all-gather.

Why `2(P-1)/P`? A ring all-reduce is a reduce-scatter then an all-gather: **two phases**, each of P-1 steps in
which every rank sends S/P bytes. So every rank sends `2(P-1)/P x S` bytes in all. The factor counts those two
phases; it is not "send plus receive". The simulator counts the bytes each rank sends, and the ratio to S is the
factor:"""),
    (CODE, """size = 400 * 2**20  # the lecture's 100 x 1024^2 float32 = 400 MiB
for op in ["all_reduce", "reduce_scatter", "all_gather"]:
    row = api.collective("dgx-h100", op, 4, [size], algorithm="ring")[0]
    print(f"{op:>14} on 4 H100s: {row.time_s * 1e3:6.2f} ms  algbw {row.algbw_GBps:6.1f} GB/s  "
          f"busbw {row.busbw_GBps:6.1f} GB/s  busbw/algbw {row.busbw_GBps / row.algbw_GBps:.2f}  "
          f"bytes sent per rank / S {row.max_bytes_sent_per_rank / size:.2f}")"""),
    (MD, """The lecture measured about 2.1 ms for this all-reduce on 4 H100s. Careful with units: nccl-tests uses
GB/s = 10^9 bytes/s, the lecture's own formula printed GiB/s. And a reduce-scatter of a 4x larger input cannot
be compared to the all-reduce by its bandwidth figure: the two count different bytes. Wall-clock time is the
convention-free comparison.

## Small messages are latency-bound: the busbw curve

Sweep the size from 1 KiB to 1 GiB on one DGX H100 (8 GPUs on NVSwitch). Small messages pay a fixed latency
per step, so busbw is tiny; past the *knee* (where busbw reaches half its peak) bandwidth takes over, and the
curve flattens into a *plateau*. The chart shades the three regions of the ring curve. Where the knee sits
decides whether bucketing small gradients into larger messages pays."""),
    (CODE, """sizes = [2.0**k for k in range(10, 31, 2)]  # 1 KiB .. 1 GiB in powers of four
curves = api.collective_curves("dgx-h100", "all_reduce", 8, sizes, skip={"direct", "halving_doubling"})
nb.collective_chart(curves, title="all_reduce on one DGX H100 (8 GPUs)")"""),
    (CODE, """ring = curves["ring"]
print("   size      time     busbw")
for row in ring:
    print(f"{row.nbytes / 2**20:9.3f} MiB {row.time_s * 1e6:9.1f} us {row.busbw_GBps:7.1f} GB/s")"""),
    (MD, """## PCIe, NVLink, NVLS and InfiniBand side by side

The same all-reduce on four kinds of path:

* **PCIe**: an 8-GPU PCIe Gen5 box, no NVLink; rings cross PCIe switches and the CPU sockets.
* **NVLink**: the DGX H100 ring over NVSwitch (450 GB/s per GPU per direction).
* **NVLS**: the same node, but the NVSwitch itself adds and multicasts (NVLink SHARP).
* **InfiniBand**: two DGX H100 nodes (16 GPUs); the ring crosses the 400 Gb/s NICs between nodes."""),
    (CODE, """paths = {
    "PCIe Gen5 (8 GPUs)": api.collective("pcie-gen5-8gpu", "all_reduce", 8, sizes, algorithm="ring"),
    "NVLink ring (8 GPUs)": api.collective("dgx-h100", "all_reduce", 8, sizes, algorithm="ring"),
    "NVLS (8 GPUs)": api.collective("dgx-h100", "all_reduce", 8, sizes, algorithm="nvls"),
    "InfiniBand (2 nodes, 16 GPUs)": api.collective("dgx-h100", "all_reduce", 16, sizes, algorithm="ring",
                                                    num_nodes=2),
}
for name, rows in paths.items():
    print(f"{name:>30}: 1 GiB in {rows[-1].time_s * 1e3:7.2f} ms, busbw {rows[-1].busbw_GBps:6.1f} GB/s")
nb.collective_chart(paths, title="all_reduce: PCIe vs NVLink vs NVLS vs InfiniBand")"""),
    (MD, """## Try it

* Change the world size (2, 4, 8) in the curve above: where does the knee move?
* Replace `"all_reduce"` with `"all_gather"` and check the busbw factor `(P-1)/P`.
* Put your own tensors in `v`: every algorithm must still give numpy's answer."""),
]

NB02 = [
    (MD, """# 2. Three cuts of one MLP: data, tensor and pipeline parallel

The lecture's toy model: an MLP of **4 layers**, hidden size **1024**, GELU between layers, a batch of
**128** rows, fp32, on **4 ranks**. There are three ways to cut it:

* by **batch** (data parallel): every rank holds the whole model and a quarter of the rows;
* by **width** (tensor parallel): every rank holds a quarter of every layer's columns;
* by **depth** (pipeline parallel): every rank holds a run of consecutive layers.

Each cut decides what a rank owns and what has to cross the boundary between ranks. simdist simulates one
training step of each on a DGX H100 cut down to the number of ranks (`nb.lecture_mlp_spec` builds the
scenario; `nb.run_spec` predicts it)."""),
    (CODE, """from simdist import api
from simdist import notebooks as nb

cuts = {
    "one GPU": nb.lecture_mlp_spec(),
    "data parallel (dp=4)": nb.lecture_mlp_spec(dp=4),
    "tensor parallel (tp=4)": nb.lecture_mlp_spec(tp=4),
    "pipeline parallel (pp=4, 4 micro-batches)": nb.lecture_mlp_spec(pp=4, microbatches=4, schedule="gpipe"),
}
results = {name: nb.run_spec(spec).result for name, spec in cuts.items()}
print(cuts["tensor parallel (tp=4)"])"""),
    (MD, """## What each rank owns

The model has 4 x (1024 x 1024 + 1024) parameters, 16 MiB in fp32. Data parallelism keeps a full copy on
every rank (memory does not fall with P, and every rank keeps its own optimizer state; ZeRO removes that
redundancy). Tensor parallelism gives each rank a 1024 x 256 slab of every layer; pipeline parallelism one
layer per rank. Activations follow the cut: data parallel ranks hold 32 rows, tensor parallel ranks a
128 x 256 slab."""),
    (CODE, """print(f"{'cut':>42} {'params/rank':>12} {'activations/rank':>17}")
for name, r in results.items():
    m = r["memory"][0]
    print(f"{name:>42} {m['params_bytes'] / 2**20:9.2f} MiB {m['activations_bytes'] / 2**20:14.2f} MiB")"""),
    (MD, """## What crosses the boundary, and how many bytes

* **Data parallel**: after the backward pass every gradient is all-reduced (summed, then divided by P), so
  the replicas stay in lockstep: one all-reduce of the whole 16 MiB of gradients.
* **Tensor parallel** (column-parallel, as in the lecture): each rank computes a 128 x 256 activation slab;
  an all-gather rebuilds the 128 x 1024 input of the next layer, once per layer in the forward pass. Backward,
  the adjoint of the all-gather is a reduce-scatter.
* **Pipeline parallel**: a stage sends its micro-batch's activations to the next stage (send/recv), and the
  gradients come back."""),
    (CODE, """for name, r in results.items():
    for c in r["collectives"]:
        print(f"{name:>42}: {c['count']:3d} x {c['op']:<14} of {c['nbytes'] / 2**10:8.0f} KiB "
              f"over {c['num_ranks']} ranks, {c['time_s'] * 1e6:6.1f} us each ({c['algorithm']})")"""),
    (MD, """### The 384 KiB all-gather

In fp32 a rank's activation slab is 128 x 256 x 4 B = 128 KiB, the assembled input 128 x 1024 x 4 B = 512 KiB.
A ring all-gather passes P-1 = 3 slabs around, so each rank sends (and receives) **384 KiB** per layer:"""),
    (CODE, """row = api.collective("dgx-h100", "all_gather", 4, [512 * 2**10], algorithm="ring")[0]
print(f"all_gather of 512 KiB on 4 H100s: each rank sends {row.max_bytes_sent_per_rank / 2**10:.0f} KiB "
      f"and receives {row.max_bytes_received_per_rank / 2**10:.0f} KiB in {row.time_s * 1e6:.1f} us")"""),
    (MD, """## Where the step time goes

The breakdown adds up to the step time: compute, communication that is not hidden behind compute
(*exposed*), the pipeline bubble, and the optimizer step. At this tiny size every cut is dominated by
latencies: the model is far too small for 4 H100s."""),
    (CODE, """names = list(results)
parts = {
    "compute": [r["breakdown"]["compute_s"] * 1e6 for r in results.values()],
    "exposed communication": [sum(r["breakdown"]["exposed_comm_s"].values()) * 1e6 for r in results.values()],
    "bubble": [r["breakdown"]["bubble_s"] * 1e6 for r in results.values()],
    "optimizer": [r["breakdown"]["optimizer_s"] * 1e6 for r in results.values()],
}
for name, r in results.items():
    print(f"{name:>42}: step {r['step_time_s'] * 1e6:7.1f} us, bubble {r['bubble_fraction']:.0%}")
nb.bar_chart(names, parts, title="one training step of the lecture's MLP", y_title="time (us)", stacked=True)"""),
    (MD, """## As the width grows

Compute grows with the square of the width, the tensor-parallel all-gathers only linearly, the data-parallel
gradient all-reduce with the square too. Watch which cut wins as the layers get wider."""),
    (CODE, """widths = [512, 1024, 2048, 4096, 8192]
layouts = {"data parallel": {"dp": 4}, "tensor parallel": {"tp": 4},
           "pipeline parallel": {"pp": 4, "microbatches": 4, "schedule": "gpipe"}}
by_width = {name: [nb.run_spec(nb.lecture_mlp_spec(hidden=h, **kw)).result["step_time_s"] * 1e3 for h in widths]
            for name, kw in layouts.items()}
by_width["one GPU"] = [nb.run_spec(nb.lecture_mlp_spec(hidden=h)).result["step_time_s"] * 1e3 for h in widths]
nb.line_chart(widths, by_width, title="step time vs hidden size (4 ranks, batch 128)", x_title="hidden size",
               y_title="step time (ms)", log_x=True, log_y=True)"""),
    (MD, """## As the batch grows

Data parallelism splits the batch; the gradient all-reduce does not depend on it, so a larger batch hides it
behind more compute. Tensor parallel all-gathers grow with the batch (they move activations)."""),
    (CODE, """batches = [32, 128, 512, 2048]
by_batch = {name: [nb.run_spec(nb.lecture_mlp_spec(batch=b, **kw)).result["step_time_s"] * 1e3 for b in batches]
            for name, kw in layouts.items()}
nb.line_chart(batches, by_batch, title="step time vs global batch (4 ranks, hidden 1024)", x_title="batch (rows)",
               y_title="step time (ms)", log_x=True, log_y=True)"""),
    (MD, """## As the number of ranks grows

More ranks split the work further, but each cut pays for it differently: bigger all-reduce groups, smaller
tensor slabs with the same gathered size, more pipeline stages and a larger bubble (here 8 micro-batches).
The width is 4096 so that there is work to split."""),
    (CODE, """ranks = [1, 2, 4, 8]
scaling = {
    "data parallel": [nb.run_spec(nb.lecture_mlp_spec(dp=p, hidden=4096)).result["step_time_s"] * 1e3
                      for p in ranks],
    "tensor parallel": [nb.run_spec(nb.lecture_mlp_spec(tp=p, hidden=4096)).result["step_time_s"] * 1e3
                        for p in ranks],
    "pipeline parallel": [nb.run_spec(nb.lecture_mlp_spec(pp=p, hidden=4096, layers=8, microbatches=8,
                                                            schedule="gpipe")).result["step_time_s"] * 1e3
                          for p in ranks],
}
nb.line_chart(ranks, scaling, title="step time vs ranks (hidden 4096, batch 128)", x_title="ranks",
               y_title="step time (ms)")"""),
    (MD, """## Try it

* Give the tensor-parallel cut `precision="bf16"`: the all-gathers halve.
* Combine cuts: `nb.lecture_mlp_spec(tp=2, dp=2)`.
* Choosing the cut, the lecture's rule of thumb: data parallel when a replica fits, tensor parallel inside the
  fastest links when a layer must be split, pipeline parallel across slower links, paying for the bubble
  (next notebook)."""),
]

NB03 = [
    (MD, """# 3. Pipeline bubbles

Cut a model into K consecutive stages and the batch into M micro-batches. In the ideal forward-only pipeline
with equal stages of time tau, a step takes (M + K - 1) tau, so the stages are busy a fraction
U = M / (M + K - 1) of the time and idle the rest, the **bubble**:

$$\\text{bubble} = 1 - U = \\frac{K-1}{M+K-1}$$

With K = 4 and M = 4: U = 4/7 = 57.1 % (16 of 28 stage-slots busy); with M = 16: 16/19 = 84.2 %.
simdist simulates the schedule on a timeline and measures the bubble there, so we can put the formula next to
what really happens, including where the formula's assumptions break."""),
    (CODE, """from simdist import api
from simdist import notebooks as nb

for m in (4, 16):
    r = api.bubble("gpipe", num_stages=4, num_microbatches=m)
    print(f"GPipe K=4 M={m:2d}: simulated bubble {r['bubble_fraction']:.1%}  "
          f"formula {r['formula_text']} = {r['formula']:.1%}  utilization {r['utilization']:.1%}")"""),
    (MD, """## The grid of each schedule

Rows are stages, columns time slots (a forward takes 1 slot, a backward 2). `F3` is the forward of
micro-batch 3, `B3` its backward, `.` is idle: the bubble.

* **GPipe** runs all forwards, then all backwards: every stage holds all M micro-batches' activations.
* **1F1B** starts backwards as early as possible and then alternates one forward, one backward: the same
  bubble, but at most K micro-batches in flight.
* **Interleaved 1F1B** gives each rank V smaller chunks of layers (here V = 2, chunk labels `a`/`b`): the
  bubble shrinks by V, to (K-1)/(V M + K - 1), at the cost of V times more point-to-point traffic."""),
    (CODE, """for schedule, vpp in [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)]:
    print(f"--- {schedule} (V={vpp})")
    print(api.schedule_grid(schedule, num_stages=4, num_microbatches=8, vpp=vpp))
    r = api.bubble(schedule, num_stages=4, num_microbatches=8, vpp=vpp)
    print(f"bubble: simulated {r['bubble_fraction']:.1%}, formula {r['formula_text']} = {r['formula']:.1%}\\n")"""),
    (CODE, """nb.pipeline_timeline("1f1b", num_stages=4, num_microbatches=8,
                      title="1F1B, 4 stages, 8 micro-batches")"""),
    (MD, """## Micro-batch sweeps

More micro-batches amortise the fill and drain. The simulated bubble (solid) sits on the formula (dashed) for
all three schedules when stages are equal and communication is free."""),
    (CODE, """counts = list(range(4, 33, 4))
sweep = {}
for schedule, vpp in [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2)]:
    rows = api.bubble_sweep(schedule, num_stages=4, microbatches=counts, vpp=vpp)
    sweep[f"{schedule} simulated"] = [r["bubble_fraction"] for r in rows]
    sweep[f"{schedule} formula"] = [r["formula"] for r in rows]
nb.line_chart(counts, sweep, title="bubble vs micro-batches (K = 4)", x_title="micro-batches M",
               y_title="bubble fraction", y_format=".0%", dashed=[k for k in sweep if k.endswith("formula")])"""),
    (CODE, """nb.bubble_chart(api.bubble_sweep("1f1b", num_stages=8, microbatches=list(range(1, 33))),
                 title="1F1B with K = 8 stages: simulated bubble and (K-1)/(M+K-1)")"""),
    (MD, """## When the formula breaks: unequal stages

The formula assumes equal stages. Make one stage 1.5x slower and every other stage waits for it: the pipeline
runs at the pace of its slowest stage, and the others idle. The formula (evaluated at the mean stage time)
no longer describes the timeline."""),
    (CODE, """slow = [1.0, 1.25, 1.5, 2.0]
imbalance = {"simulated": [], "formula (mean stage)": []}
for s in slow:
    r = api.bubble("1f1b", num_stages=4, num_microbatches=8, stage_times=[1.0, 1.0, s, 1.0])
    imbalance["simulated"].append(r["bubble_fraction"])
    imbalance["formula (mean stage)"].append(r["formula"])
    print(f"stage 2 at {s:.2f}x: simulated {r['bubble_fraction']:.1%}, formula {r['formula']:.1%}")
print(api.schedule_grid("1f1b", num_stages=4, num_microbatches=8, stage_times=[1.0, 1.0, 1.5, 1.0]))
nb.line_chart(slow, imbalance, title="1F1B, K=4, M=8: one slow stage", x_title="slow stage time / others",
               y_title="bubble fraction", y_format=".0%", dashed=["formula (mean stage)"])"""),
    (MD, """## When the formula breaks: communication

Sending activations to the next stage takes time too. Every send sits on the critical path of the fill and
drain, so the bubble grows with the point-to-point time (in units of a forward)."""),
    (CODE, """p2p = [0.0, 0.05, 0.1, 0.2, 0.4]
comm = {"simulated": [], "formula": []}
for t in p2p:
    r = api.bubble("1f1b", num_stages=4, num_microbatches=8, p2p_s=t)
    comm["simulated"].append(r["bubble_fraction"])
    comm["formula"].append(r["formula"])
nb.line_chart(p2p, comm, title="1F1B, K=4, M=8: send time between stages", x_title="p2p time / forward time",
               y_title="bubble fraction", y_format=".0%", dashed=["formula"])"""),
    (MD, """## A real step: the bubble is not the whole story

At a fixed global batch, more micro-batches are also smaller ones, and a small micro-batch uses the GPU less
well. Here is the lecture's MLP (8 layers, hidden 4096) on 4 pipeline stages with a global batch of 512 rows,
simulated end to end: the bubble falls steadily as M grows, but the step time falls only at first, then
rises again as the micro-batches get too small to keep an H100 busy."""),
    (CODE, """ms = [1, 2, 4, 8, 16, 32]
steps = [nb.run_spec(nb.lecture_mlp_spec(pp=4, layers=8, hidden=4096, batch=512, microbatches=m)).result
         for m in ms]
for m, r in zip(ms, steps, strict=True):
    print(f"M={m:2d}: micro-batch {512 // m:3d} rows, step {r['step_time_s'] * 1e3:6.2f} ms, "
          f"bubble {r['bubble_fraction']:.1%}")
nb.line_chart(ms, {"step time (ms)": [r["step_time_s"] * 1e3 for r in steps]},
               title="1F1B, 4 stages, global batch 512: step time vs micro-batches", x_title="micro-batches M",
               y_title="step time (ms)", log_x=True)"""),
    (MD, """## Try it

* Set `num_stages=8` in the sweeps: how many micro-batches keep the bubble under 10 %?
* Try `schedule="zb_h1"` (zero-bubble H1): it splits the backward into input and weight gradients.
* Compare GPipe and 1F1B memory in a real scenario with `nb.run_spec(...).result["memory"]`."""),
]

NB04 = [
    (MD, """# 4. Explore before buying: a layout search and a hardware comparison

Before renting a thousand GPUs for months, two questions deserve an answer on a laptop:

1. **How should the model be cut?** Tensor (tp), pipeline (pp, with vpp virtual stages), data (dp) and context
   (cp) parallelism, the micro-batch size, the ZeRO stage, activation recomputation and sequence parallelism
   multiply into thousands of layouts. Most do not fit in memory, and among those that do the step time
   still varies a lot.
2. **Which hardware, at what cost?** A faster GPU at a higher hourly price can still be the cheaper way to
   train a fixed number of tokens.

The running example is **Llama 3 70B** (80 layers, hidden 8192, 64 heads with 8 KV groups, sequence 8192,
Dubey et al. 2024) on **1024 H100s** (128 DGX H100 nodes), with a global batch of 1024 sequences, i.e.
1024 x 8192 = 8.4 M tokens per step."""),
    (CODE, """from simdist import api
from simdist import notebooks as nb

MODEL, CLUSTER, GPUS, BATCH = "llama3-70b", "dgx-h100", 1024, 1024
print(f"{BATCH} sequences x 8192 tokens = {BATCH * 8192 / 1e6:.1f} M tokens per step on {GPUS} GPUs")"""),
    (MD, """## The layout search

`api.search` enumerates every layout with tp x pp x dp x cp = number of GPUs, then prunes what cannot work
(the batch does not split, interleaving needs enough micro-batches, ZeRO-2/3 together with pipelining, and
above all: **memory per GPU** beyond the GPU's capacity). The closed form (a formula per op of the same op
graph the simulator runs) ranks the survivors in well under a second; the discrete-event engine then
re-simulates the best `top_k` with overlap and contention.

To keep this notebook fast the space is restricted: tp at most 8 (one NVLink domain), pp at most 16, no context
parallelism, vpp at most 4, micro-batches of 1 or 2 sequences."""),
    (CODE, """search = api.search(MODEL, CLUSTER, GPUS, BATCH, max_tp=8, max_pp=16, max_cp=1, max_vpp=4,
                    max_micro_batch=2, top_k=3)
print(search.text)"""),
    (MD, """How to read the table: `step s` and `tokens/s` are the closed form's, `engine step s` the discrete-event
engine's for the re-simulated top three. **MFU** (model FLOPs utilisation) is the model's matrix-multiply
FLOPs (forward and backward, attention included, recomputation not counted; Korthikanti et al. 2022 eq. 3)
per second, over the GPUs' peak bf16 FLOP/s.
`GiB/GPU` is the peak stage's memory: weights, gradients, optimizer state (sharded by ZeRO), activations.

The top layouts are within about 1 % of each other, and the engine (which sees overlap and the real
interleaved schedule) can reorder them: a near-tie means "any of these", not "exactly this one".

Where did the layouts go?"""),
    (CODE, """doc = search.doc
print(f"{doc['candidates']} layouts enumerated, {doc['feasible']} feasible")
for reason, count in doc["pruned_counts"].items():
    print(f"  pruned by {reason:>14}: {count}")"""),
    (MD, """## The tp x pp map

Each cell is the best throughput over everything else (dp follows from tp and pp; vpp, micro-batch, ZeRO,
recompute, sequence parallelism vary inside the cell); an empty cell has no layout that fits. Small tp x pp
leaves each GPU holding too large a share of the 70 B parameters and their optimizer state; large tp pays for
activation all-reduces on every layer, large pp for a bigger pipeline bubble."""),
    (CODE, """nb.search_heatmap(search)"""),
    (MD, """## Memory against speed: the Pareto front

Every feasible layout is a point. The *Pareto front* holds the layouts no other layout beats on both memory
(less) and throughput (more). A layout right at the memory limit is fragile (a longer sequence or a framework's
extra buffers and it no longer fits); a point on the front a little to the left may be worth the few percent."""),
    (CODE, """nb.search_pareto(search)"""),
    (MD, """## What the winner's layout means

Take the closed form's first row apart. The step time is the sum of compute, the communication of each
parallel dimension that is *not* hidden behind compute, and the pipeline bubble:

* **tp** splits every matrix multiply across tp GPUs and adds activation all-reduces (or reduce-scatter +
  all-gather with sequence parallelism) in every layer, forward and backward: 4 per layer per micro-batch.
  They sit on the critical path, so tp stays inside a node's NVLink (450 GB/s per GPU) and no larger than
  needed: tp is what memory forces, not what speed asks for.
* **pp** cuts the 80 layers into pp stages. Its traffic is small (one activation per micro-batch boundary),
  but it costs the bubble (pp - 1) / (vpp x M + pp - 1) for M micro-batches per step.
* **vpp** (interleaving) gives each GPU vpp non-adjacent chunks of layers: the bubble shrinks by vpp, for vpp
  times more point-to-point messages.
* **dp** replicates what is left; its gradient reduce-scatter/all-reduce runs across nodes over InfiniBand but
  overlaps with the backward pass, and ZeRO-1 shards the optimizer state over the dp replicas: the 16 bytes per
  parameter of mixed-precision Adam (bf16 weights and gradients, fp32 master weights and two moments) would be
  1.1 TB for 70 B parameters, far beyond any GPU."""),
    (CODE, """best = doc["ranked"][0]
lay = best["layout"]
m = best["num_microbatches"]
formula = (lay["pp"] - 1) / (lay["vpp"] * m + lay["pp"] - 1)
print(f"winner (closed form): {best['key']}")
print(f"  tp {lay['tp']} x pp {lay['pp']} x dp {lay['dp']} = {lay['tp'] * lay['pp'] * lay['dp']} GPUs; "
      f"{80 // (lay['pp'] * lay['vpp'])} layers per chunk, {lay['vpp']} chunks per GPU")
print(f"  {m} micro-batches of {lay['micro_batch_size']} per step: bubble formula "
      f"(pp-1)/(vpp*M+pp-1) = {formula:.1%}, step's bubble {best['bubble_s'] / best['step_time_s']:.1%}")
print(f"  memory {best['memory_per_gpu_bytes'] / 2**30:.1f} GiB per GPU of the H100's 80 GiB")
print(f"  step {best['step_time_s']:.2f} s = compute {best['compute_s']:.2f} + tp comm {best['tp_comm_s']:.2f} "
      f"+ pp comm {best['pp_comm_s']:.2f} + exposed dp comm {best['dp_exposed_s']:.2f} + bubble {best['bubble_s']:.2f}"
      f" + ... ; MFU {best['mfu']:.1%}")
for e in doc["engine"]:
    print(f"engine: {e['key']}: {e['engine_step_time_s']:.2f} s "
          f"(closed form {e['closed_form_step_time_s']:.2f} s)")"""),
    (MD, """Reading these numbers: compute is about four fifths of the step, and the largest overhead is the pipeline
bubble, larger than the formula because the stages are not equal: the first and the last also hold the
embedding and the output layer over a 128 K vocabulary, and the slowest stage sets the pace (notebook 3).
The data-parallel gradient traffic is almost entirely hidden behind the backward pass.

The winner uses nearly all of the H100's memory; the runner-up with tp 8 uses about half, at a cost of well
under 1 % in throughput, and the engine even ranks it ahead: it is the layout to start from. This is the
Pareto front's argument in numbers."""),
    (MD, """Side by side, the top five and where their time goes (closed form; the bubble and the tensor-parallel
communication are what separates them):"""),
    (CODE, """top = doc["ranked"][:5]
keys = [f"tp{r['layout']['tp']} pp{r['layout']['pp']} v{r['layout']['vpp']} mbs{r['layout']['micro_batch_size']} "
        f"z{r['layout']['zero_stage']}" for r in top]
parts = {name: [r[key] for r in top] for name, key in [("compute", "compute_s"), ("recompute", "recompute_s"),
                                                        ("tp communication", "tp_comm_s"),
                                                        ("pp communication", "pp_comm_s"),
                                                        ("exposed dp communication", "dp_exposed_s"),
                                                        ("bubble", "bubble_s")]}
nb.bar_chart(keys, parts, title=f"{MODEL} on {GPUS} H100s: where the step goes", y_title="seconds per step",
              stacked=True)"""),
    (MD, """## Which hardware, and what it costs

`api.compare` runs the same search on each cluster (its own GPU, NVLink generation and network), takes the best
layout, and turns tokens/s into **time**, **GPU-hours**, **cost** and **energy** to train a token budget, here
15 T tokens (about Llama 3's pre-training set). 576 GPUs is a whole number of nodes for every preset: 72 eight-GPU
nodes, or 8 GB200 NVL72 racks; the global batch is 1152 sequences so that it divides. Each of the five searches
is bounded as the one above (`max_tp=8` ... `max_micro_batch=2`); drop the bounds to search every layout (a few
minutes).

**The prices below are illustrative assumptions, not quotes**: round numbers in US dollars per GPU-hour made
up for this example. Real prices depend on the provider, the contract length and the year; put yours in.
Energy assumes every GPU draws its full TDP for the whole run (an upper bound of the GPUs' share; PUE 1.0, so
no cooling or hosts)."""),
    (CODE, """ILLUSTRATIVE_USD_PER_GPU_HOUR = {  # example numbers only, NOT quotes
    "dgx-a100": 1.50, "dgx-h100": 2.50, "hgx-h200": 3.00, "dgx-b200": 4.50, "gb200-nvl72": 6.00}
comparison = api.compare(MODEL, list(ILLUSTRATIVE_USD_PER_GPU_HOUR), 576, 15e12, global_batch_size=1152,
                         prices=[f"{c}={p}" for c, p in ILLUSTRATIVE_USD_PER_GPU_HOUR.items()],
                         max_tp=8, max_pp=16, max_cp=1, max_vpp=4, max_micro_batch=2)
print(f"{'cluster':>12} {'best layout':>58} {'tokens/s':>10} {'MFU':>6} {'days':>6} {'M USD':>6} {'GWh':>5}")
for r in comparison["rows"]:
    if "error" in r:
        print(f"{r['cluster']:>12}: {r['error']}")
        continue
    print(f"{r['cluster']:>12} {r['layout']:>58} {r['tokens_per_s']:10,.0f} {r['mfu']:6.1%} "
          f"{r['time_to_train_days']:6.0f} {r['cost_usd'] / 1e6:6.2f} {r['energy_kwh'] / 1e6:5.2f}")"""),
    (CODE, """nb.compare_chart(comparison)"""),
    (MD, """How to read it:

* **Time** follows peak FLOP/s times MFU; newer GPUs finish in a fraction of the days.
* **Cost** = GPUs x hours x price: a GPU twice as fast at less than twice the price is cheaper per token, and
  one a little faster at a noticeably higher price is dearer. Change one price and the ranking can flip; that is
  the point of computing it.
* **The best layout changes with the hardware**: more memory per GPU (H200, B200) allows smaller tp and pp, and
  an NVLink domain of 72 GPUs (GB200 NVL72) makes different cuts cheap.
* Months on 576 GPUs is not how Llama 3 was trained (up to 16 K H100s); more GPUs shorten the run nearly in
  proportion for as long as the global batch still splits into enough micro-batches per replica.

## Try it

* Search `llama3-8b` or `llama3-405b`, or another `CLUSTER` (`hgx-h200` has 141 GB per GPU: which cells of the
  heatmap open up?).
* Allow `max_cp=2` (context parallelism) or `max_tp=16` and see whether the winner changes.
* Put your own prices in `ILLUSTRATIVE_USD_PER_GPU_HOUR` and a `pue=1.3` in `api.compare` for the facility."""),
]

NB05 = [
    (MD, """# 5. Calibration: fit the simulator to measurements, then check it on data it has not seen

A preset is built from datasheet numbers and a few published measurements. A real cluster differs: NCCL's
protocol switches, launch latencies, a slower firmware, a busy switch. **Calibration** fits a few parameters
of the topology to measured collective times (nccl-tests output, or simdist's own torch.distributed harness)
and writes a *calibrated topology* file that every later prediction can use. **Validation** is the honest part:
fit on some measurements, predict the others, and report the error.

The measurements here are a published nccl-tests `all_reduce_perf` sweep on one 8 x A100 node (NVLink3,
NVSwitch), 32 KiB to 16 GiB, from Stas Bekman's *ml-engineering* (the same rows as
`validation/reference/nccl_collectives_ml_engineering.csv`, dataset `mle_a100_node_nccltests`), in the text
format nccl-tests prints. Its out-of-place columns are the published ones; the in-place columns of this test
sample are synthetic (within about 1 % of them, see the file header), and the fit takes the median of both."""),
    (CODE, """from simdist import api
from simdist import notebooks as nb

sweep = nb.measurement_file("all_reduce_perf_a100x8.txt")
measured, _ = api.read_measurement_files([sweep])
measured = [m for m in measured if not m.in_place]
print(f"{len(measured)} out-of-place points from {sweep.name}")
print(f"{'size':>12} {'time':>11} {'busbw':>11}")
for m in measured[::3]:
    print(f"{m.nbytes:12,d} {m.time_s * 1e6:8.1f} us {m.busbw_Bps / 1e9:6.1f} GB/s")"""),
    (MD, """## Before: the uncalibrated preset

`dgx-a100` models NVLink3 at 300 GB/s per GPU per direction with an efficiency of 0.77 (the busbw NVIDIA
reported at the plateau). Where does it miss? Compare its busbw with the measured one at every size:"""),
    (CODE, """sizes = [float(m.nbytes) for m in measured]
preset = api.collective("dgx-a100", "all_reduce", 8, sizes)
for m, p in list(zip(measured, preset, strict=True))[::3]:
    print(f"{m.nbytes:12,d} B: measured {m.time_s * 1e6:9.1f} us, preset {p.time_s * 1e6:9.1f} us "
          f"({100 * (p.time_s - m.time_s) / m.time_s:+5.1f} %)")
nb.line_chart(sizes, {"measured (nccl-tests, 8 x A100)": [m.busbw_Bps / 1e9 for m in measured],
                       "dgx-a100 preset, uncalibrated": [p.busbw_GBps for p in preset]},
               title="all_reduce busbw on one A100 node: measured vs the preset", x_title="size (bytes)",
               y_title="busbw (GB/s)", log_x=True, dashed=["dgx-a100 preset, uncalibrated"])"""),
    (MD, """The plateau is right (within 2 % from 1 GiB up), but small messages are about three times slower than the
preset says: the measured time never falls below about 44 us, while the model's per-step
latencies add up to much less. Those sizes matter: tensor-parallel activations and bucketed gradients of small
models live there.

## Fitting

`api.calibrate` fits, for each tier of the network it has data for (here NVLink inside one node), a robust
line t = alpha + S / busbw (Huber/biweight weights, so warm-up spikes do not drag it), sets the tier's
efficiency from busbw, and for each measured collective a latency, a bandwidth factor and a smooth efficiency
curve over size. The result is a YAML file naming the topology it belongs to; `simdist run --calibration` and
`api.collective(..., calibration=...)` apply it. (It is written to the working directory.)"""),
    (CODE, """fitted = api.calibrate([sweep], "dgx-a100", out="dgx-a100-calibrated.yaml")
cal = fitted["calibration"]
tier = cal["fit"]["tiers"][0]
ar = cal["collectives"]["all_reduce"]
print(f"NVLink tier: alpha {tier['alpha']}, busbw {tier['busbw']} "
      f"(95 % CI {tier['busbw_ci'][0]} .. {tier['busbw_ci'][1]})")
print(f"scale_up efficiency {tier['efficiency_before']} -> {cal['overrides']['scale_up']['efficiency']}")
print(f"all_reduce: latency {ar['latency']}, bandwidth factor {ar['bandwidth_factor']:.3f}, "
      f"efficiency knots at {len(ar['efficiency_sizes'])} sizes")
print(f"in-sample MAPE {cal['fit']['mape_pct']:.3f} % (uncalibrated {cal['fit']['mape_uncalibrated_pct']:.1f} %)")"""),
    (MD, """An in-sample error of a few thousandths of a percent proves nothing: the efficiency curve has a knot at
every measured size, so it can pass through every point. What counts is the error on sizes the fit did not see.

## Validation on held-out sizes

`api.validate(..., holdout="sizes")` fits on every other size of the sweep and predicts the rest. Each row is a
held-out size: measured, predicted by that fit, predicted by the uncalibrated preset, and the errors."""),
    (CODE, """check = api.validate([sweep], "dgx-a100-calibrated.yaml", holdout="sizes")
print(f"fitted on {check['fit_points']} sizes, predicting {check['predicted_points']}")
print(f"{'size':>14} {'measured':>11} {'calibrated':>11} {'error':>7} {'preset':>11} {'error':>7}")
for r in check["rows"]:
    print(f"{r['nbytes']:14,.0f} {r['measured_s'] * 1e6:8.1f} us {r['predicted_s'] * 1e6:8.1f} us "
          f"{r['error_pct']:+6.1f}% {r['uncalibrated_s'] * 1e6:8.1f} us {r['uncalibrated_error_pct']:+6.1f}%")
print(f"MAPE on held-out sizes: calibrated {check['mape_pct']['all']:.1f} %, "
      f"uncalibrated {check['uncalibrated_mape_pct']['all']:.1f} %")"""),
    (CODE, """nb.validation_chart(check)"""),
    (MD, """The remaining errors sit where the measured curve is bumpy (1 MiB and 16 MiB, where NCCL switches between
its LL, LL128 and Simple protocols and the number of channels): interpolating between neighbours cannot know
about a step that only the missing point shows.

### Extrapolation is a different question

Fit on the small sizes only and predict the largest third (`holdout="large"`): the fit has seen no plateau, and
its bandwidth is pinned by sizes where latency dominates. Here the calibrated prediction is *worse* than the
preset's datasheet bandwidth. Measure over the range you want to predict."""),
    (CODE, """far = api.validate([sweep], "dgx-a100-calibrated.yaml", holdout="large")
print(f"holdout=large: fitted on {far['fit_points']} smallest sizes, predicting the {far['predicted_points']} largest")
print(f"MAPE: calibrated {far['mape_pct']['all']:.1f} %, uncalibrated {far['uncalibrated_mape_pct']['all']:.1f} %")"""),
    (MD, """## Using the calibrated topology

Every prediction on `dgx-a100` can now take the file: the same all-reduce at 64 KiB and at 1 GiB, before and
after, against the measurement."""),
    (CODE, """probe = [65536.0, 2.0**30]
before = api.collective("dgx-a100", "all_reduce", 8, probe)
after = api.collective("dgx-a100", "all_reduce", 8, probe, calibration="dgx-a100-calibrated.yaml")
truth = {m.nbytes: m.time_s for m in measured}
for b, a in zip(before, after, strict=True):
    t = truth[int(b.nbytes)]
    print(f"{b.nbytes:13,.0f} B: measured {t * 1e6:8.1f} us, preset {b.time_s * 1e6:8.1f} us, "
          f"calibrated {a.time_s * 1e6:8.1f} us")"""),
    (MD, """## Measurements from a CPU box: the three cuts on 4 gloo ranks

simdist's own harness (`python -m validation.mlp`) trained the lecture's MLP (4 layers, width 1024, batch 128,
fp32) for real with torch.distributed on **4 gloo ranks on one 2-core CPU host**, single-process and under each
cut, checking the gradients against the single-process run. These are real step times, but of a CPU box: no
GPU preset describes it, so they are not for calibrating a DGX (fitting `dgx-h100` to loopback gloo would give
a topology that is neither). What they show is the lecture's point in miniature:"""),
    (CODE, """steps = nb.read_step_measurements(nb.measurement_file("gloo_cpu_mlp_steps.csv"))
single = next(s["time_s"] for s in steps if s["cut"] == "single")
for s in steps:
    print(f"{s['cut']:>23} on {s['world_size']} rank(s), {s['num_microbatches']} micro-batch(es): "
          f"{s['time_s'] * 1e3:6.1f} ms ({s['time_s'] / single:.2f} x single)")
nb.bar_chart([s["cut"] for s in steps], {"measured step (ms)": [s["time_s"] * 1e3 for s in steps]},
              title="the lecture's MLP, one training step, gloo on a 2-core CPU (measured)", y_title="ms")"""),
    (MD, """What they mean:

* With 2 cores for 4 ranks, splitting the arithmetic buys nothing: the cuts can only add communication and
  waiting to the single-process step.
* **Data parallel** adds one all-reduce of the 16 MiB of fp32 gradients. The same host measured that collective
  on its own (`gloo_cpu_collectives.csv`), and it accounts for most of the difference (below). Bucketing the
  gradients into one buffer was slower here: with only 8 tensors there are few calls to save, and copying into
  and out of the bucket is not free on a CPU.
* **Tensor parallel** moves activations (the 128 x 1024 layer inputs, 512 KiB each) instead of gradients.
* **Pipeline** cuts pay the bubble: 4 stages and 8 micro-batches give (K-1)/(M+K-1) = 3/11 = 27 % idle in
  GPipe, and 1F1B, with the same bubble, keeps fewer activations alive."""),
    (CODE, """gloo, _ = api.read_measurement_files([nb.measurement_file("gloo_cpu_collectives.csv")])
ar16 = next(m for m in gloo if m.op == "all_reduce" and m.nbytes == 16 * 2**20)
dp = next(s["time_s"] for s in steps if s["cut"] == "data_parallel")
print(f"data parallel - single = {(dp - single) * 1e3:.1f} ms; measured all_reduce of 16 MiB on the same host: "
      f"{ar16.time_s * 1e3:.1f} ms")"""),
    (MD, """## Try it

* Calibrate `hgx-h200` with the H200 all-gather sweep: `nb.measurement_file("all_gather_perf_h200x8.txt")`.
* Calibrate `dgx-h100` with the A100 sweep (as `tests/test_calibrate.py` does) and look at the NVLink efficiency
  it needs: about half, because an A100's NVLink is two thirds of an H100's and the preset uses NVLS.
* Point `api.calibrate` at your own `all_reduce_perf -b 8 -e 8G -f 2 -g 8` output, then pass the YAML to
  `simdist run --calibration`."""),
]

NB06 = [
    (MD, """# 6. Mixture of experts: expert parallelism and the all-to-all

A mixture-of-experts (MoE) layer replaces the one MLP of a transformer layer by many *experts* (MLPs) and a
*router*: each token goes to the `topk` experts its router scores highest, so the model holds many parameters
but a token only meets a few of them (DeepSeek-V3: 671 B parameters, 37 B *active* per token).

*Expert parallelism* (ep) puts different experts on different GPUs. A layer then moves every token twice:
**dispatch**, an all-to-all that sends each token to the ranks holding its experts, and **combine**, the
all-to-all that brings the results back (the lecture's all-to-all, with unequal pieces when routing is
unbalanced). This notebook prices both with **simdist**: first the collective alone, then a DeepSeek-V3-style
training step, and how routing imbalance and the placement of the ep groups (NVLink or fabric) move it."""),
    (CODE, """from simdist import api
from simdist import notebooks as nb"""),
    (MD, """## All-to-all with unequal pieces

Eight GPUs of one DGX H100 node, each sending 8 MB to each of the others: a balanced dispatch. Now let the
router prefer the experts on GPU 0: every GPU sends it `hot` times its share. On an NVSwitch each GPU has its own
ports, so the all-to-all ends when the busiest *receiver* has received everything: its time grows with the
hot rank's bytes, even though the other seven ranks are idle waiting."""),
    (CODE, """P, PIECE = 8, 8e6
times = {}
for hot in (1.0, 1.5, 2.0, 3.0):
    matrix = [[0.0 if i == j else PIECE * (hot if j == 0 else 1.0) for j in range(P)] for i in range(P)]
    row = api.collective("dgx-h100", "all_to_all", P, [1.0], matrix=matrix)[0]
    times[hot] = row.time_s
    print(f"hot x{hot}: {row.time_s * 1e6:7.1f} us; GPU 0 receives {row.max_bytes_received_per_rank / 1e6:.0f} MB")
assert times[2.0] > 1.8 * times[1.0]  # the busiest receiver sets the time"""),
    (CODE, """nb.bar_chart([f"x{h}" for h in times], {"all-to-all time (us)": [t * 1e6 for t in times.values()]},
             title="8-GPU all-to-all when GPU 0 receives hot x its share", y_title="microseconds")"""),
    (MD, """The same 8 MB pieces over **two** nodes (16 GPUs): each GPU now sends 15 pieces, 8 of them through its
node's InfiniBand NICs (50 GB/s each, against 450 GB/s of NVLink per GPU). Per byte sent, the all-to-all is
several times slower: where the ep group sits matters."""),
    (CODE, """one = api.collective("dgx-h100", "all_to_all", 8, [8 * PIECE])[0]
two = api.collective("dgx-h100", "all_to_all", 16, [16 * PIECE], num_nodes=2)[0]
rate = {}
for name, row in (("8 GPUs, one node  ", one), ("16 GPUs, two nodes", two)):
    rate[name] = row.max_bytes_sent_per_rank / row.time_s
    print(f"{name}: {row.time_s * 1e3:.2f} ms for {row.max_bytes_sent_per_rank / 1e6:.0f} MB sent per GPU, "
          f"{rate[name] / 1e9:.0f} GB/s per GPU")
assert rate["8 GPUs, one node  "] > 3 * rate["16 GPUs, two nodes"]"""),
    (MD, """## A DeepSeek-V3-style step

The `deepseek-v3` preset (61 layers, hidden 7168, multi-latent attention, 256 routed experts of width 2048 with
the top 8 of them per token plus one shared expert, the first 3 layers dense; DeepSeek-AI 2024) is cut here to
8 layers (2 dense, 6 MoE) so that the notebook runs in seconds; per layer everything is the real model's. It
trains on 32 H100s (4 DGX H100 nodes): 2 pipeline stages of 16 GPUs, and in each stage the 256 experts of a
layer are spread over ep = 8 GPUs (32 experts each), data parallel over the rest, as in DeepSeek's own
layout (no tensor parallelism)."""),
    (CODE, """spec = {
    "cluster": {"preset": "dgx-h100", "num_nodes": 4},
    "model": {"preset": "deepseek-v3", "num_layers": 8, "moe_layer_freq": [0, 0, 1, 1, 1, 1, 1, 1],
              "mtp_num_layers": 0, "seq_length": 4096},
    "parallel": {"pp": 2, "dp": 16, "ep": 8},
    "training": {"micro_batch_size": 1, "global_batch_size": 64},
}
base = nb.run_spec(spec).result
print(f"step {base['step_time_s']:.3f} s, MFU {base['mfu']:.1%} (model FLOPs from the active parameters)")
for axis, seconds in base["breakdown"]["exposed_comm_s"].items():
    if seconds:
        print(f"  exposed {axis} communication: {seconds * 1e3:.1f} ms")
assert base["breakdown"]["exposed_comm_s"]["ep"] > 0"""),
    (MD, """`ep` is the dispatch and combine all-to-alls of the MoE layers (forward and backward), on the critical path
of every micro-batch: the GPU waits for its tokens before its experts can run. Here each ep group is 8
consecutive GPUs, one node: the all-to-all stays on NVLink.

## Routing imbalance

`training.moe_imbalance` is the busiest ep rank's routed tokens over the mean. A real router is never perfectly
balanced (DeepSeek-V3 adds a bias term to keep it near 1); at 2.0 the busiest GPU gets twice its share: its
expert GEMMs take twice as long and its all-to-all pieces are twice as big, and every other GPU of the layer
waits for it."""),
    (CODE, """steps, ep_s = {}, {}
for imbalance in (1.0, 1.25, 1.5, 2.0):
    r = nb.run_spec(spec, [f"training.moe_imbalance={imbalance}"]).result
    steps[imbalance], ep_s[imbalance] = r["step_time_s"], r["breakdown"]["exposed_comm_s"]["ep"]
    print(f"imbalance {imbalance}: step {r['step_time_s']:.3f} s, exposed ep {ep_s[imbalance] * 1e3:.1f} ms, "
          f"MFU {r['mfu']:.1%}")
assert steps[2.0] > steps[1.0] and ep_s[2.0] > 1.5 * ep_s[1.0]"""),
    (CODE, """nb.line_chart(list(steps), {"step time (s)": list(steps.values())},
              title="Routing imbalance slows every GPU", x_title="busiest ep rank's tokens / mean",
              y_title="seconds")"""),
    (MD, """## Where the ep groups sit: NVLink or the fabric

`parallel.order` lists the mesh axes innermost first (Megatron-LM's order string). `tp-cp-ep-dp-pp` (the
default) makes an ep group 8 consecutive GPUs: one node. `tp-cp-dp-ep-pp` puts data parallelism inside: the
16 GPUs of a stage span 2 nodes, an ep group takes every other GPU of both, and every all-to-all crosses the
InfiniBand NICs. The expert gradients, reduced over the expert-data-parallel group (`edp`: the GPUs holding the
same experts), move the other way: onto NVLink."""),
    (CODE, """across = nb.run_spec(spec, ["parallel.order=tp-cp-dp-ep-pp"]).result
for name, r in (("ep inside a node", base), ("ep across nodes ", across)):
    c = r["breakdown"]["exposed_comm_s"]
    print(f"{name}: step {r['step_time_s']:.3f} s, exposed ep {c['ep'] * 1e3:6.1f} ms, "
          f"edp {c['edp'] * 1e3:6.1f} ms, dp {c['dp'] * 1e3:5.1f} ms")
inside_ep, across_ep = base["breakdown"]["exposed_comm_s"]["ep"], across["breakdown"]["exposed_comm_s"]["ep"]
assert across_ep > 2 * inside_ep
assert across["breakdown"]["exposed_comm_s"]["edp"] < base["breakdown"]["exposed_comm_s"]["edp"]"""),
    (MD, """The all-to-all on the fabric costs every micro-batch; the expert-gradient reduction it buys back on NVLink
is paid once a step. At 64 sequences per step (2 micro-batches per replica) the two nearly tie; with more
micro-batches per step the in-node ep groups pull ahead:"""),
    (CODE, """for order in ("tp-cp-ep-dp-pp", "tp-cp-dp-ep-pp"):
    r = nb.run_spec(spec, ["training.global_batch_size=256", f"parallel.order={order}"]).result
    print(f"{order}: step {r['step_time_s']:.3f} s for 256 sequences")
    steps[order] = r["step_time_s"]
assert steps["tp-cp-dp-ep-pp"] > 1.1 * steps["tp-cp-ep-dp-pp"]"""),
    (MD, """What would change the answer: a GB200 NVL72 rack keeps ep groups of up to 72 GPUs on NVLink (try
`cluster.preset=gb200-nvl72`), `training.overlap_moe_expert_parallel_comm: true` hides part of the all-to-all
behind another micro-batch's compute (Megatron-Core's 1F1B A2A overlap), and `training.moe_token_dispatcher_type`
switches to the all-gather dispatcher. `scenarios/deepseek-v3-gb200.yaml` is the full model on 256 GB200 GPUs."""),
]


NB07 = [
    (MD, """# 7. Buying a cluster: one purchase decision, step by step

Notebook 4 searched layouts and compared hardware at a fixed size. A real purchase asks other questions, in
this order:

1. **Which GPU, for the same money?** Two clusters that cost the same per hour, not the same number of GPUs.
2. **Which network?** NIC speed, and whether the leaf switches may be oversubscribed (fewer spine switches).
3. **What if one GPU is slow?** A straggler, and who waits for it.
4. **What do failures cost?** Goodput: the share of the wall-clock time that trains, from failure rates and
   checkpoints.
5. **How sure is each number?** The prediction band (p10-p90) of every step time.

The job: **Llama 3 8B**, sequences of 8192 tokens, a global batch of 128 sequences (1 M tokens per step), 100 B
tokens in all. The clusters are small (one to eight nodes) so that everything here runs in seconds; every step
is the same call at any size.

**The prices are illustrative assumptions, not quotes**: round numbers in US dollars per GPU-hour made up for this
example. Put yours in. To keep the searches fast the layout space is bounded (`SPACE`: no pipeline or context
parallelism, micro-batches of one sequence, the 1F1B schedule); an 8B model fits without them. Drop `SPACE` to
search everything."""),
    (CODE, """from simdist import api
from simdist import notebooks as nb

MODEL, BATCH, TOKENS = "llama3-8b", 128, 100e9
ILLUSTRATIVE_USD_PER_GPU_HOUR = {"dgx-a100": 1.50, "dgx-h100": 3.00}  # example numbers only, NOT quotes
BUDGET_USD_PER_HOUR = 24.0
SPACE = {"max_pp": 1, "max_cp": 1, "max_vpp": 1, "max_micro_batch": 1, "schedules": ("1f1b",)}
print(f"{BATCH} x 8192 = {BATCH * 8192 / 1e6:.2f} M tokens per step; {TOKENS / (BATCH * 8192):,.0f} steps for "
      f"{TOKENS / 1e9:.0f} B tokens")"""),
    (MD, """## 1. Two clusters at the same price per hour

`api.compare` with a budget sizes each cluster by what the budget buys: as many whole nodes as
`BUDGET_USD_PER_HOUR` pays for at each cluster's price, then searches each one's best layout (closed form) and
re-simulates the winner with the discrete-event engine. On the command line:

```
simdist compare --model llama3-8b --cluster dgx-a100 --cluster dgx-h100 --tokens 100e9 --global-batch 128 \\
    --price dgx-a100=1.5 --price dgx-h100=3 --budget-usd-per-hour 24 \\
    --max-pp 1 --max-cp 1 --max-vpp 1 --max-micro-batch 1 --schedules 1f1b
```

(`--cluster dgx-a100:16 --cluster dgx-h100:8` would fix the sizes instead; `--budget-kw` sizes by power and
`--days` by a deadline.)"""),
    (CODE, """budget = api.compare(MODEL, None, None, TOKENS, sized=list(ILLUSTRATIVE_USD_PER_GPU_HOUR),
                     global_batch_size=BATCH, prices=[f"{c}={p}" for c, p in ILLUSTRATIVE_USD_PER_GPU_HOUR.items()],
                     budget_usd_per_hour=BUDGET_USD_PER_HOUR, **SPACE)
rows = {r["cluster"]: r for r in budget["rows"]}
a100, h100 = rows["dgx-a100"], rows["dgx-h100"]
for r in (a100, h100):
    print(f"{r['label']}: {r['sized_by']}")
    print(f"    best layout {r['layout']}: step {r['step_time_s']:.2f} s ({r['fidelity']}), "
          f"{r['tokens_per_s']:,.0f} tokens/s, MFU {r['mfu']:.0%}")
    print(f"    {r['time_to_train_days']:.1f} days, {r['cost_usd']:,.0f} USD, {r['energy_kwh'] / 1e3:.1f} MWh at TDP")
print(f"answer ({budget['answer']['question']}): {budget['answer']['cluster']}")"""),
    (CODE, """nb.compare_chart(budget, title=f"{MODEL}, {TOKENS:.0e} tokens, {BUDGET_USD_PER_HOUR:.0f} USD per hour "
                                 "each")"""),
    (MD, """How to read it:

* Both clusters cost exactly the budget per hour: two A100 nodes (16 GPUs at 1.50) or one H100 node (8 GPUs at
  3.00). At equal spend per hour, **the one that trains sooner is also the one that costs less in total**.
* The H100 node wins: half as many GPUs, but each does the work of more than two A100s here. The layout is pure
  data parallelism in both (ZeRO-2 shards the gradients and optimizer state), so the GPUs' speed decides.
* The error bar on the days is the prediction band (section 5).

**What would change the decision** is the price ratio. With throughput per GPU fixed, the H100 stays the better
buy as long as its price per GPU-hour is below the A100's times the work one H100 does in A100s. The asserts
check what the text says."""),
    (CODE, """per_gpu = (h100["tokens_per_s"] / h100["num_gpus"]) / (a100["tokens_per_s"] / a100["num_gpus"])
break_even = ILLUSTRATIVE_USD_PER_GPU_HOUR["dgx-a100"] * per_gpu
print(f"one H100 does the work of {per_gpu:.2f} A100s: the H100 node is the better buy below "
      f"{break_even:.2f} USD per GPU-hour (against {ILLUSTRATIVE_USD_PER_GPU_HOUR['dgx-a100']:.2f} for an A100)")
assert a100["usd_per_hour"] == h100["usd_per_hour"] == BUDGET_USD_PER_HOUR  # equal spend, to the dollar
assert (a100["num_gpus"], h100["num_gpus"]) == (16, 8)
assert budget["answer"]["cluster"] == h100["label"] and h100["cost_usd"] < a100["cost_usd"]
assert per_gpu > 2 and ILLUSTRATIVE_USD_PER_GPU_HOUR["dgx-h100"] < break_even
assert a100["layout"].startswith("tp1-pp1-dp16") and h100["layout"].startswith("tp1-pp1-dp8")
assert "-z2-" in a100["layout"] and "-z2-" in h100["layout"]"""),
    (MD, """## 2. The network

The lab picks H100s and plans **four nodes (32 GPUs)** for the next run. The fabric is the next line item: the
NICs (one per GPU at 400, 200 or 100 Gb/s), the switches (here 32-port leaves), and whether the leaves may be
oversubscribed (more NIC ports than uplinks: fewer spine switches to buy). The job is written as a scenario file
(RoCE, a fat tree of 32-port leaves) so that any of its fields can be varied: `nb.write_scenario` checks it and
writes the YAML, and `api.search(scenario=..., grid=[...])` is `simdist search FILE --grid ...`: one layout search
per value, the best layout of each re-simulated by the engine (`top_k=1`)."""),
    (CODE, """spec = {"name": "Llama 3 8B on 4 DGX H100 over RoCE",
        "cluster": {"preset": "dgx-h100", "num_nodes": 4,
                    "inter_node": {"kind": "roce", "fabric": "fat_tree", "switch_radix": 32, "oversubscription": 1}},
        "model": {"preset": MODEL},
        "parallel": {"tp": 1, "pp": 1, "dp": 32, "zero_stage": 2},
        "training": {"micro_batch_size": 1, "global_batch_size": BATCH, "precision": "bf16"}}
scenario = nb.write_scenario(spec, "llama3-8b-4x-dgx-h100-roce.yaml")
NICS = ["100 Gb/s", "200 Gb/s", "400 Gb/s"]
fabric = api.search(scenario=scenario, grid=["cluster.inter_node.nic_bandwidth=" + ",".join(f'"{n}"' for n in NICS)],
                    top_k=1, **SPACE)
by_nic = {p["values"]["cluster.inter_node.nic_bandwidth"]: p for p in fabric.doc["summary"]}
best = by_nic["400 Gb/s"]["engine_step_time_s"]
for nic in NICS:
    p = by_nic[nic]
    print(f"{nic:>9} NICs: best layout {p['layout']}, engine step {p['engine_step_time_s']:.3f} s "
          f"({p['engine_step_time_s'] / best - 1:+.1%} against 400 Gb/s)")"""),
    (CODE, """nb.band_chart(NICS, [by_nic[n]["step_time_band_s"] for n in NICS],
              [by_nic[n]["engine_step_time_s"] for n in NICS],
              title="step time by NIC speed (4 x DGX H100, best layout of each), with its prediction band")"""),
    (MD, """The best layout is the same at every NIC speed: data parallelism over all 32 GPUs. Its traffic across the
nodes is ZeRO-2's gradient reduce-scatter and parameter all-gather; the part of it not hidden behind compute scales
with one over the bandwidth: going from 200 to 100 Gb/s adds twice what going from 400 to 200 does.
200 Gb/s NICs cost a few percent of the step; 100 Gb/s about a tenth. **What would change the decision**:
cheaper NICs pay off when they save a larger share of the cluster's price than the throughput they cost. A larger
model, a smaller batch per GPU, or tensor and pipeline groups across nodes would make the network matter more.

### Oversubscription: 1:1 or 2:1?

Four nodes have 32 NICs: they all fit on one 32-port switch, so there is no spine yet, and nothing to
oversubscribe. The question starts at eight nodes (64 GPUs: four leaves). The same job on eight nodes, with the
data-parallel group doubled, on a non-blocking (1:1) and a 2:1 fabric, is `simdist run FILE --set ...`:"""),
    (CODE, """FABRIC = [f"inter_node.{k}={v}" for k, v in spec["cluster"]["inter_node"].items()]  # as topo show --set
fabrics = {(nodes, ratio): api.topology_summary("dgx-h100", num_nodes=nodes, assignments=[
    *FABRIC, f"inter_node.oversubscription={ratio}"])[1]["fabric"] for nodes, ratio in [(4, 1), (8, 1), (8, 2)]}
for (nodes, ratio), f in fabrics.items():
    print(f"{nodes} nodes at {ratio}:1: {f['num_leaves']} leaf switch(es), {f['num_spines']} spines")
ib = api.topology_summary("dgx-h100", num_nodes=8, assignments=[*FABRIC, "inter_node.kind=infiniband"])[1]["fabric"]
print(f"per fabric link: RoCE {fabrics[8, 1]['latency_s'] * 1e6:.2f} us at efficiency {fabrics[8, 1]['efficiency']}, "
      f"InfiniBand {ib['latency_s'] * 1e6:.2f} us at {ib['efficiency']}")
EIGHT = ["cluster.num_nodes=8", "parallel.dp=64"]
one_to_one = api.run(scenario, EIGHT).result
two_to_one = api.run(scenario, [*EIGHT, "cluster.inter_node.oversubscription=2"]).result
infiniband = api.run(scenario, [*EIGHT, "cluster.inter_node.kind=infiniband"]).result
slower = two_to_one["step_time_s"] / one_to_one["step_time_s"] - 1
print(f"8 nodes, 1:1: step {one_to_one['step_time_s']:.3f} s; 2:1: {two_to_one['step_time_s']:.3f} s ({slower:+.1%}); "
      f"InfiniBand instead of RoCE (1:1): {infiniband['step_time_s']:.3f} s")
print(f"exposed data-parallel communication: {one_to_one['breakdown']['exposed_comm_s']['dp']:.3f} s at 1:1, "
      f"{two_to_one['breakdown']['exposed_comm_s']['dp']:.3f} s at 2:1")"""),
    (MD, """* At four nodes there is no spine: oversubscription is not a choice yet.
* At eight nodes the data-parallel ring crosses the leaves, and a 2:1 fabric (about two thirds of the spines)
  makes the exposed part of the gradient traffic larger and the step several percent slower. It pays if the
  spines it saves cost more than that share of the cluster.
* InfiniBand and RoCE differ here only by a fraction of a microsecond of latency per switch hop (the model gives
  both the same efficiency), which a step of seconds does not see. Where they do differ in practice, congestion
  control under load, this model has nothing to say: measure."""),
    (CODE, """assert all(p["layout"] == by_nic["400 Gb/s"]["layout"] for p in by_nic.values())
steps = [by_nic[n]["engine_step_time_s"] for n in NICS]
assert steps[0] > steps[1] > steps[2]
assert 0.01 < steps[1] / steps[2] - 1 < 0.06 and 0.06 < steps[0] / steps[2] - 1 < 0.15
assert 1.8 < (steps[0] - steps[1]) / (steps[1] - steps[2]) < 2.2  # exposed traffic ~ 1 / bandwidth
assert (fabrics[4, 1]["num_leaves"], fabrics[4, 1]["num_spines"]) == (1, 0)
assert 0.6 < fabrics[8, 2]["num_spines"] / fabrics[8, 1]["num_spines"] < 0.75
assert ib["efficiency"] == fabrics[8, 1]["efficiency"] and ib["latency_s"] < fabrics[8, 1]["latency_s"] < 1e-6
assert 0.03 < slower < 0.12
assert two_to_one["breakdown"]["exposed_comm_s"]["dp"] > one_to_one["breakdown"]["exposed_comm_s"]["dp"]
assert abs(infiniband["step_time_s"] / one_to_one["step_time_s"] - 1) < 1e-3"""),
    (MD, """## 3. A straggler

Synchronous training runs at the pace of its slowest GPU. A what-if in the scenario's `faults:` section makes
one GPU slower: `faults.stragglers=[{rank: 13, slower_by: 0.2}]` makes every kernel of rank 13 take 1.2 times as
long (thermal throttling, a weak HBM stack, a noisy host). The healthy step already waits for the slowest of its
GPUs' ordinary spread (`cluster.gpu_speed_cv`, default 0.02); the straggler's factor takes its place. The engine
simulates the step with the slow rank, and the report (`faults`) names the straggler and who waited for whom."""),
    (CODE, """healthy = api.run(scenario).result
slow = api.run(scenario, ["faults.stragglers=[{rank: 13, slower_by: 0.2}]"]).result
f = slow["faults"]
print(f"healthy step {healthy['step_time_s']:.3f} s; with rank 13 20 % slower: {slow['step_time_s']:.3f} s "
      f"({slow['step_time_s'] / healthy['step_time_s'] - 1:+.1%})")
print("straggler:", f["stragglers"])
waiting = {w["rank"] for w in f["waits"]}
print(f"{len(waiting)} ranks wait at the data-parallel collectives, each for rank(s) "
      f"{sorted({r for w in f['waits'] for r in w['waits_for']})}: {f['waits'][0]['wait_s']:.3f} s per step, "
      "summed over the collectives")
b = healthy["breakdown"]
# the healthy step already runs at its slowest GPU's pace (cluster.gpu_speed_cv, the README's GPU speed spread);
# the straggler's 1.2 replaces that factor
spread = healthy.get("gpu_variability_factor", 1.0)
by_hand = (1.2 / spread - 1) * (b["compute_s"] + b["optimizer_s"])
lost = healthy["layout"]["num_gpus"] * (1 - healthy["step_time_s"] / slow["step_time_s"])
print(f"by hand: (1.2 / {spread:.4f} - 1) x (compute {b['compute_s']:.3f} s + optimizer {b['optimizer_s']:.4f} s) "
      f"= {by_hand:.3f} s; "
      f"simulated: {slow['step_time_s'] - healthy['step_time_s']:.3f} s")
print(f"one slow GPU costs the cluster the throughput of {lost:.1f} of its {healthy['layout']['num_gpus']} GPUs")"""),
    (CODE, """assert [s["rank"] for s in f["stragglers"]] == [13]
assert waiting == set(range(32)) - {13} and all(w["waits_for"] == [13] for w in f["waits"])
assert abs((slow["step_time_s"] - healthy["step_time_s"]) / by_hand - 1) < 1e-3
assert 4 < lost < 6"""),
    (MD, """Every other rank reaches the gradient collectives and waits there for rank 13, so the whole step grows by
the straggler's extra time, 0.2 x (its compute + its optimizer step): the hand calculation and the simulation
agree. One GPU in 32 running at 83 % of its speed costs as much as switching off about five.
**What it means for a purchase**: ask for burn-in tests and per-GPU step-time monitoring (and the right to
replace a slow part); the larger the cluster, the likelier that some GPU is the slow one.

The same goes for the network: one NIC cable at half its bandwidth (`faults.degraded_links`, seen by the engine
only) slows every ring that crosses it."""),
    (CODE, """half = "faults.degraded_links=[{src: n0/nic0, dst: leaf0, bandwidth_fraction: 0.5}]"
cable = api.run(scenario, [half]).result
print(f"one NIC link at half bandwidth: step {cable['step_time_s']:.3f} s "
      f"({cable['step_time_s'] / healthy['step_time_s'] - 1:+.1%}); "
      f"every NIC at 200 Gb/s: {by_nic['200 Gb/s']['engine_step_time_s']:.3f} s")
print("degraded:", [(d["src"], d["dst"], d["bandwidth_fraction"]) for d in cable["faults"]["degraded_links"]])
assert abs(cable["step_time_s"] / by_nic["200 Gb/s"]["engine_step_time_s"] - 1) < 1e-3"""),
    (MD, """One slow cable costs as much as buying half-speed NICs for the whole cluster: the data-parallel collectives
run at the pace of their slowest link. Link monitoring (and spare cables) are cheap insurance.

## 4. Goodput: what failures cost

A synchronous job stops when any GPU, NIC or host fails; it restarts from its last checkpoint. Goodput is the
expected share of wall-clock time that trains: the failure rates per component come from the Llama 3 405B run's
interruptions (Dubey et al. 2024, Table 5: 419 unexpected interruptions in 54 days on 16,384 H100s), the
checkpoint interval is Young and Daly's optimum, and a restart costs 10 minutes unless the scenario says
otherwise (`faults.checkpoint`). Every run's JSON has it (`goodput`), and `compare` turns it into days."""),
    (CODE, """g = healthy["goodput"]
print(f"4 x DGX H100: {365 * g['failures_per_day']:.1f} failures per year (MTBF {g['mtbf_s'] / 86400:.0f} days), "
      f"goodput {g['fraction']:.4f}")
print(f"{h100['label']}: {h100['time_to_train_days']:.2f} days, {h100['time_to_train_with_failures_days']:.2f} days "
      f"with failures (goodput {h100['goodput']:.4f})")
llama3 = nb.goodput(16384, 405e9)
print(f"Llama 3's cluster (16,384 GPUs): {llama3['failures_per_day']:.2f} failures per day "
      f"(419 / 54 = {419 / 54:.2f}), MTBF {llama3['mtbf_s'] / 3600:.1f} h, checkpoint every "
      f"{llama3['checkpoint_interval_s'] / 60:.1f} min, goodput {llama3['fraction']:.3f}")"""),
    (MD, """At the lab's size failures are rare (a few a year), and goodput rounds to one. They become the decision at
scale: the same rates on thousands of GPUs give a failure every few hours, and then what a restart costs decides
how much of the cluster trains. The curve: goodput of the 8B job against the cluster size, with a restart of
2, 10 or 30 minutes."""),
    (CODE, """sizes = [8, 64, 512, 4096, 16384, 32768]
params = healthy["model"]["num_params"]
restarts = {"2 min": "2 min", "10 min (default)": "10 min", "30 min": "30 min"}
curves = {f"restart {name}": [nb.goodput(n, params, checkpoint={"restart": r})["fraction"] for n in sizes]
          for name, r in restarts.items()}
for name, ys in curves.items():
    print(f"{name:>26}: " + ", ".join(f"{n:,} GPUs {y:.3f}" for n, y in zip(sizes, ys, strict=True)))
nb.line_chart(sizes, curves, title="goodput against cluster size (failure rates of Llama 3's run)",
              x_title="GPUs", y_title="goodput", log_x=True, y_format=".0%")"""),
    (CODE, """assert abs(llama3["failures_per_day"] - 419 / 54) < 1e-9  # the rates reproduce the data they come from
assert g["fraction"] > 0.999 and h100["time_to_train_with_failures_days"] / h100["time_to_train_days"] < 1.001
for ys in curves.values():
    assert all(ys[i] > ys[i + 1] for i in range(len(ys) - 1))  # more GPUs, more failures, less goodput
big = {name: 1 - ys[sizes.index(16384)] for name, ys in curves.items()}  # the share lost at 16 K GPUs
print(", ".join(f"{name}: {lost:.1%} lost at 16,384 GPUs" for name, lost in big.items()))
assert 1 < 365 * g["failures_per_day"] < 10 and llama3["mtbf_s"] < 6 * 3600 and g["restart_s"] == 600
assert big["restart 30 min"] > 3 * big["restart 2 min"]"""),
    (MD, """**What would change the decision**: at 16 K GPUs a 30-minute restart loses several times what a 2-minute one
does; fast failure detection, spare nodes and quick checkpoint reloads are worth buying at that scale, not at
four nodes. (The rates are one run's, on one vendor's hardware, in 2024; set `faults.checkpoint` to your own
costs.)

## 5. How sure is each number? The prediction band

Every step time comes with `step_time_band_s`: its p10, p50 and p90. The assumed efficiencies of the model
(the share of peak the GPU's kernels reach, the collectives' bandwidth by message size, the spread of the GPUs'
speeds whose slowest sets the pace) carry stated ranges, each with its reason, in
`simdist/predict/data/uncertainty.yaml`; the band propagates them by sampling the closed
form. `search` and `compare` give the band of the rows the engine re-simulated, at no extra cost
(`docs/prediction-bands.md` checks the band against published runs)."""),
    (CODE, """print(healthy["step_time_band_how"])
band = healthy["step_time_band_s"]
print(f"4 x DGX H100 step: {healthy['step_time_s']:.3f} s, band p10 {band['p10']:.3f} / p50 {band['p50']:.3f} / "
      f"p90 {band['p90']:.3f} s (width {(band['p90'] - band['p10']) / band['p50']:.0%} of p50)")
for r in (a100, h100):
    d = r["time_to_train_days_band"]
    print(f"{r['label']}: {r['time_to_train_days']:.1f} days to train, p10-p90 {d['p10']:.1f}-{d['p90']:.1f}")
nb.band_chart([a100["label"], h100["label"], "4 x DGX H100", "4 x DGX H100, straggler"],
              [a100["time_to_train_days_band"], h100["time_to_train_days_band"],
               *({q: TOKENS / (BATCH * 8192) * r["step_time_band_s"][q] / 86400 for q in ("p10", "p50", "p90")}
                 for r in (healthy, slow))],
              [a100["time_to_train_days"], h100["time_to_train_days"],
               *(TOKENS / (BATCH * 8192) * r["step_time_s"] / 86400 for r in (healthy, slow))],
              title=f"days to train {TOKENS:.0e} tokens, with the prediction band", x_title="days")"""),
    (MD, """How to use the band:

* The band is skewed towards slower (p90 is farther from the prediction than p10): the stated ranges allow
  kernels to be slower than the model's efficiencies more than faster.
* **The GPU decision holds across the band**: the H100 node's slow end (p90) is still sooner than the A100
  nodes' fast end (p10). Had the bands overlapped, the model could not tell the two apart, and a day of renting
  each to measure would be worth more than more simulation.
* The straggler moves the step past the healthy band's median to its slow end, and its own band starts above the
  healthy prediction. The healthy band's slow end allows GPUs as uneven as the most uneven cluster measured (the
  spread's stated range), so a step time alone cannot tell one slow GPU from such a cluster: the faults report
  (who waits for whom, section 3) can.
* Closer calls, like 200 against 400 Gb/s NICs above, have overlapping bands: a gap of a few percent is
  narrower than the band of either number, so weigh it with that in mind."""),
    (CODE, """assert h100["time_to_train_days_band"]["p90"] < a100["time_to_train_days_band"]["p10"]
assert healthy["step_time_band_s"]["p50"] < slow["step_time_s"]
assert slow["step_time_band_s"]["p10"] > healthy["step_time_s"]
assert healthy["step_time_s"] - band["p10"] < band["p90"] - healthy["step_time_s"]
assert by_nic["200 Gb/s"]["step_time_band_s"]["p10"] < by_nic["400 Gb/s"]["step_time_band_s"]["p90"]"""),
    (MD, """## Try it

* Put your prices in `ILLUSTRATIVE_USD_PER_GPU_HOUR` and a budget that buys a dozen nodes; add `"hgx-h200"` or
  `"dgx-b200"` with a price.
* Size by power instead: `budget_kw=30` in place of the price budget, or by a deadline: `days=30`.
* Vary another fabric field in the grid: `cluster.inter_node.fabric=fat_tree,rail_optimized` on eight nodes.
* Two stragglers in different nodes, or a straggler together with a degraded link."""),
]

NOTEBOOKS = {
    "01_collectives.ipynb": NB01,
    "02_three_cuts.ipynb": NB02,
    "03_pipeline_bubbles.ipynb": NB03,
    "04_explore_before_buying.ipynb": NB04,
    "05_calibration.ipynb": NB05,
    "06_moe.ipynb": NB06,
    "07_buying.ipynb": NB07,
}


def notebook(cells: list[tuple[str, str]]) -> nbformat.NotebookNode:
    """A notebook without outputs; cell ids are stable (their index) so the file is reproducible."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for i, (kind, source) in enumerate(cells):
        make = nbformat.v4.new_markdown_cell if kind == MD else nbformat.v4.new_code_cell
        nb.cells.append(make(source, id=f"cell-{i:02d}"))
    return nb


def render(name: str) -> str:
    """The exact text of notebook ``name`` as committed."""
    return nbformat.writes(notebook(NOTEBOOKS[name]))


def main(argv: list[str]) -> int:
    stale = []
    for name in NOTEBOOKS:
        path = HERE / name
        text = render(name)
        if "--check" in argv:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            from simdist.files import write_text  # atomic: a notebook is never half written

            write_text(path, text)
    if stale:
        print(f"out of date: {', '.join(stale)} (run python notebooks/build.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
