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
    (CODE, """from simdist import api"""),
    (MD, """## The lecture's four-rank example

Four ranks each hold a four-element tensor: `v0 = [0,1,2,3]`, `v1 = [1,2,3,4]`, `v2 = [2,3,4,5]`,
`v3 = [3,4,5,6]`. Their sum is `[6, 10, 14, 18]`.

* **reduce-scatter** sums the tensors and leaves one shard of the sum on each rank: rank r gets element r.
* **all-gather** gives every rank every shard.

`api.run_collective_on_data` runs the very plan the simulator times (here NCCL's ring) on these numbers:
every transfer of the plan moves (or adds) the values."""),
    (CODE, """v = [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]]
shards = api.run_collective_on_data("reduce_scatter", v)
gathered = api.run_collective_on_data("all_gather", shards)
for rank, (shard, full) in enumerate(zip(shards, gathered, strict=True)):
    print(f"rank {rank}: reduce_scatter -> {shard}   all_gather -> {full}")"""),
    (CODE, """api.rank_values_chart({"inputs v0..v3": v, "after reduce_scatter": shards, "after all_gather": gathered},
                      title="reduce-scatter, then all-gather, on four ranks")"""),
    (MD, """## all-reduce = all-gather after reduce-scatter

all-reduce leaves the full sum on every rank. It is exactly the two steps above: first combine the
contributions (reduce-scatter), then replicate the result (all-gather). ZeRO and FSDP cut along this seam:
they keep only the shard after the reduce-scatter and gather parameters when they need them.

Every algorithm simdist knows computes the same answer; they differ only in *how* the bytes travel."""),
    (CODE, """print("all_reduce directly:     ", api.run_collective_on_data("all_reduce", v)[0])
print("reduce_scatter+all_gather:", gathered[0])
for algorithm in ["ring", "tree", "direct", "halving_doubling", "nvls"]:
    print(f"{algorithm:>17}: every rank holds", api.run_collective_on_data("all_reduce", v, algorithm)[0])"""),
    (MD, """### The other primitives on the same data

Rooted operations have a *root* (rank 0 here); a rank that receives nothing shows `[]`.
all-to-all sends block j of every rank to rank j: with equal blocks it is a transpose."""),
    (CODE, """for op in ["broadcast", "reduce", "scatter", "gather", "all_to_all"]:
    print(f"{op:>10}:", api.run_collective_on_data(op, v, "direct"))"""),
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
api.collective_chart(curves, title="all_reduce on one DGX H100 (8 GPUs)")"""),
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
api.collective_chart(paths, title="all_reduce: PCIe vs NVLink vs NVLS vs InfiniBand")"""),
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
training step of each on a DGX H100 cut down to the number of ranks (`api.lecture_mlp_spec` builds the
scenario; `api.run_spec` predicts it)."""),
    (CODE, """from simdist import api

cuts = {
    "one GPU": api.lecture_mlp_spec(),
    "data parallel (dp=4)": api.lecture_mlp_spec(dp=4),
    "tensor parallel (tp=4)": api.lecture_mlp_spec(tp=4),
    "pipeline parallel (pp=4, 4 micro-batches)": api.lecture_mlp_spec(pp=4, microbatches=4, schedule="gpipe"),
}
results = {name: api.run_spec(spec).result for name, spec in cuts.items()}
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
api.bar_chart(names, parts, title="one training step of the lecture's MLP", y_title="time (us)", stacked=True)"""),
    (MD, """## As the width grows

Compute grows with the square of the width, the tensor-parallel all-gathers only linearly, the data-parallel
gradient all-reduce with the square too. Watch which cut wins as the layers get wider."""),
    (CODE, """widths = [512, 1024, 2048, 4096, 8192]
layouts = {"data parallel": {"dp": 4}, "tensor parallel": {"tp": 4},
           "pipeline parallel": {"pp": 4, "microbatches": 4, "schedule": "gpipe"}}
by_width = {name: [api.run_spec(api.lecture_mlp_spec(hidden=h, **kw)).result["step_time_s"] * 1e3 for h in widths]
            for name, kw in layouts.items()}
by_width["one GPU"] = [api.run_spec(api.lecture_mlp_spec(hidden=h)).result["step_time_s"] * 1e3 for h in widths]
api.line_chart(widths, by_width, title="step time vs hidden size (4 ranks, batch 128)", x_title="hidden size",
               y_title="step time (ms)", log_x=True, log_y=True)"""),
    (MD, """## As the batch grows

Data parallelism splits the batch; the gradient all-reduce does not depend on it, so a larger batch hides it
behind more compute. Tensor parallel all-gathers grow with the batch (they move activations)."""),
    (CODE, """batches = [32, 128, 512, 2048]
by_batch = {name: [api.run_spec(api.lecture_mlp_spec(batch=b, **kw)).result["step_time_s"] * 1e3 for b in batches]
            for name, kw in layouts.items()}
api.line_chart(batches, by_batch, title="step time vs global batch (4 ranks, hidden 1024)", x_title="batch (rows)",
               y_title="step time (ms)", log_x=True, log_y=True)"""),
    (MD, """## As the number of ranks grows

More ranks split the work further, but each cut pays for it differently: bigger all-reduce groups, smaller
tensor slabs with the same gathered size, more pipeline stages and a larger bubble (here 8 micro-batches).
The width is 4096 so that there is work to split."""),
    (CODE, """ranks = [1, 2, 4, 8]
scaling = {
    "data parallel": [api.run_spec(api.lecture_mlp_spec(dp=p, hidden=4096)).result["step_time_s"] * 1e3
                      for p in ranks],
    "tensor parallel": [api.run_spec(api.lecture_mlp_spec(tp=p, hidden=4096)).result["step_time_s"] * 1e3
                        for p in ranks],
    "pipeline parallel": [api.run_spec(api.lecture_mlp_spec(pp=p, hidden=4096, layers=8, microbatches=8,
                                                            schedule="gpipe")).result["step_time_s"] * 1e3
                          for p in ranks],
}
api.line_chart(ranks, scaling, title="step time vs ranks (hidden 4096, batch 128)", x_title="ranks",
               y_title="step time (ms)")"""),
    (MD, """## Try it

* Give the tensor-parallel cut `precision="bf16"`: the all-gathers halve.
* Combine cuts: `api.lecture_mlp_spec(tp=2, dp=2)`.
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
    (CODE, """api.pipeline_timeline("1f1b", num_stages=4, num_microbatches=8,
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
api.line_chart(counts, sweep, title="bubble vs micro-batches (K = 4)", x_title="micro-batches M",
               y_title="bubble fraction", y_format=".0%", dashed=[k for k in sweep if k.endswith("formula")])"""),
    (CODE, """api.bubble_chart(api.bubble_sweep("1f1b", num_stages=8, microbatches=list(range(1, 33))),
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
api.line_chart(slow, imbalance, title="1F1B, K=4, M=8: one slow stage", x_title="slow stage time / others",
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
api.line_chart(p2p, comm, title="1F1B, K=4, M=8: send time between stages", x_title="p2p time / forward time",
               y_title="bubble fraction", y_format=".0%", dashed=["formula"])"""),
    (MD, """## A real step: the bubble is not the whole story

At a fixed global batch, more micro-batches are also smaller ones, and a small micro-batch uses the GPU less
well. Here is the lecture's MLP (8 layers, hidden 4096) on 4 pipeline stages with a global batch of 512 rows,
simulated end to end: the bubble falls steadily as M grows, but the step time falls only at first, then
rises again as the micro-batches get too small to keep an H100 busy."""),
    (CODE, """ms = [1, 2, 4, 8, 16, 32]
steps = [api.run_spec(api.lecture_mlp_spec(pp=4, layers=8, hidden=4096, batch=512, microbatches=m)).result
         for m in ms]
for m, r in zip(ms, steps, strict=True):
    print(f"M={m:2d}: micro-batch {512 // m:3d} rows, step {r['step_time_s'] * 1e3:6.2f} ms, "
          f"bubble {r['bubble_fraction']:.1%}")
api.line_chart(ms, {"step time (ms)": [r["step_time_s"] * 1e3 for r in steps]},
               title="1F1B, 4 stages, global batch 512: step time vs micro-batches", x_title="micro-batches M",
               y_title="step time (ms)", log_x=True)"""),
    (MD, """## Try it

* Set `num_stages=8` in the sweeps: how many micro-batches keep the bubble under 10 %?
* Try `schedule="zb_h1"` (zero-bubble H1): it splits the backward into input and weight gradients.
* Compare GPipe and 1F1B memory in a real scenario with `api.run_spec(...).result["memory"]`."""),
]

NOTEBOOKS = {
    "01_collectives.ipynb": NB01,
    "02_three_cuts.ipynb": NB02,
    "03_pipeline_bubbles.ipynb": NB03,
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
            path.write_text(text, encoding="utf-8")
    if stale:
        print(f"out of date: {', '.join(stale)} (run python notebooks/build.py)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
