"""Which decoder layers each pipeline model part holds: the split of a model over pp stages x vpp chunks.

A *model part* is one chunk of one stage, numbered in model order as Megatron-LM numbers its virtual stages:
part ``c * pp + s`` is chunk ``c`` of stage ``s`` (megatron/core/transformer/transformer_config.py,
``pipeline_model_parallel_layout``: "layout[i] with i = a * pp_size + b gives the a-th vpp stage of the b-th pp
stage"). The embedding is always on part 0 and the output layer with the loss on the last part (Megatron's layout
requires the embedding first and the loss last; DeepSpeed's PipelineModule cuts one list of layers that starts
with the embedding and ends with the head), so a split is the decoder-layer count of every part; a part may hold
no decoder layer (only the embedding, only the loss, or nothing: Megatron's "(empty stage)").

Where the split comes from (`choose_split`, one source per scenario):
- ``parallel.pipeline_layout`` (alias ``pipeline_model_parallel_layout``): Megatron-LM's layout string, e.g.
  ``"E|(t|)*126,L"``: parts separated by ``|``, ``E`` embedding, ``L`` loss, ``t`` a decoder layer, ``m`` a
  multi-token prediction layer (Megatron-LM's rules, and all of them in the last part with the loss, where simdist
  prices them: `_check_mtp`), ``(...)*n`` and ``x*n`` repeat, commas are cosmetic (megatron/training/arguments.py
  ``--pipeline-model-parallel-layout``).
- ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split`` (Megatron-LM's flags):
  the embedding / the loss takes a decoder layer's place: (layers + e + l) split evenly over pp x vpp parts, one
  layer fewer on the first / last part (megatron/core/transformer/transformer_block.py
  ``get_num_layers_to_build``; TransformerConfig asserts (layers + e + l) % pp == 0 and the per-stage count % vpp).
- ``partition_method`` (DeepSpeed PipelineModule's, as Megatron-DeepSpeed uses it): ``uniform``, ``parameters``
  or ``type:REGEX`` over the layer list of Megatron-DeepSpeed's GPTModelPipe (`deepspeed_layers`).
- ``layers_per_stage``: counts per stage, or per stage a list of its vpp chunk counts.
- ``pipeline_split``: ``even``, ``lighter_ends`` (Llama 3), or ``auto`` (the default): what Megatron-LM runs
  (`auto_split`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from simdist.errors import LayoutError
from simdist.plan.deepspeed_split import deepspeed_layers, deepspeed_parts, partition_balanced, partition_uniform
from simdist.plan.model import Model
from simdist.plan.schedule import V_SCHEDULES, model_part, part_table

__all__ = ["LayerSplit", "auto_split", "choose_split", "chunk_layers", "deepspeed_layers", "layout_string",
           "parse_layout", "partition_balanced", "partition_uniform"]


@dataclass(frozen=True, slots=True)
class LayerSplit:
    """Decoder layers of every model part in model order, and how the split was chosen. Part c * pp + s is chunk c
    of stage s, but under ``schedule`` zb_v and dualpipev (the V: chunk 1 of stage s is part 2 pp - 1 - s) and
    dualpipe (pp parts, stage s holding parts s and pp - 1 - s: two copies; simdist.plan.schedule.model_part)."""

    parts: tuple[int, ...]
    num_stages: int
    method: str
    """How the split was decided, for reports ("auto: ...", "pipeline_layout", "partition_method: uniform")."""
    schedule: str = "1f1b"
    """The pipeline schedule, which places the parts on the stages."""

    @property
    def vpp(self) -> int:
        return len(self.parts) // self.num_stages

    def chunk_layers(self, stage: int) -> tuple[int, ...]:
        """Decoder layers of each chunk of ``stage`` (dualpipe: its two copies' parts)."""
        return tuple(self.parts[p] for p in part_table(self.num_stages, self.vpp, self.schedule)[stage])

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        parts = self.parts
        return tuple(sum(parts[p] for p in row) for row in part_table(self.num_stages, self.vpp, self.schedule))

    @property
    def layers_per_chunk(self) -> tuple[tuple[int, ...], ...]:
        return tuple(self.chunk_layers(s) for s in range(self.num_stages))

    @property
    def layout(self) -> str:
        """The split in Megatron-LM's layout syntax (`layout_string`)."""
        return layout_string(self.parts)


def _fail(problem: str, field: str, fix: str) -> LayoutError:
    return LayoutError(problem, field=field, fix=fix)


# ----------------------------------------------------------------------------- Megatron-LM layout strings
_REPEAT_GROUP = re.compile(r"\(([^()]*)\)\*(\d+)")
_REPEAT_ONE = re.compile(r"([^()|*,])\*(\d+)")
_LAYOUT_MAX_CHARS = 1_000_000


def parse_layout(text: str) -> list[str]:
    """Megatron-LM's layout string as one string of layer letters per model part: ``"E|(tt|)*2,mL"`` ->
    ``["E", "tt", "ttmL"]`` (commas are cosmetic, ``(...)*n`` and ``x*n`` repeat)."""
    field = "parallel.pipeline_layout"
    s = text.replace(",", "").replace(" ", "")
    for pattern in (_REPEAT_GROUP, _REPEAT_ONE):
        while True:
            m = pattern.search(s)
            if m is None:
                break
            grown = len(s) + len(m.group(1)) * (int(m.group(2)) - 1)
            if grown > _LAYOUT_MAX_CHARS:
                raise _fail(f"the layout expands to more than {_LAYOUT_MAX_CHARS:,} characters", field,
                            "write one letter per layer: at most a few thousand")
            s = s[:m.start()] + m.group(1) * int(m.group(2)) + s[m.end():]
    bad = sorted(set(s) - set("ELtm|"))
    if bad:
        raise _fail(f"layout {text!r}: unknown character(s) {', '.join(repr(c) for c in bad)}", field,
                    "write E (embedding), t (decoder layer), m (multi-token prediction layer), L (loss), | between "
                    "parts, (...)*n or x*n to repeat")
    return s.split("|")


def _layout_parts(text: str, model: Model, pp: int, vpp: int) -> tuple[int, ...]:
    field = "parallel.pipeline_layout"
    parts = parse_layout(text)
    if len(parts) % pp:
        raise _fail(f"the layout has {len(parts)} parts, not a multiple of pp = {pp}", field,
                    f"give pp x vpp = {pp * vpp} parts separated by '|'")
    if len(parts) != pp * vpp:
        raise _fail(f"the layout has {len(parts)} parts = pp {pp} x {len(parts) // pp} chunks, but vpp = {vpp}",
                    "parallel.vpp", f"set parallel.vpp: {len(parts) // pp}, or give {pp * vpp} parts")
    flat = "".join(parts)
    if flat.count("E") != 1 or not flat.startswith("E"):
        raise _fail("the layout must start with the embedding E, once", field, "begin the layout with 'E'")
    if flat.count("L") != 1 or not flat.endswith("L"):
        raise _fail("the layout must end with the loss L, once", field, "end the layout with 'L'")
    counts = tuple(p.count("t") for p in parts)
    if sum(counts) != model.num_layers:
        raise _fail(f"the layout holds {sum(counts)} decoder layers (t) but the model has {model.num_layers}", field,
                    f"write {model.num_layers} t's in all")
    _check_mtp(parts, model, field)
    return counts


def _check_mtp(parts: list[str], model: Model, field: str) -> None:
    """The multi-token prediction layers ``m`` of a layout, as Megatron-LM checks them
    (megatron/core/transformer/pipeline_parallel_layer_layout.py validate_layer_layout: as many as mtp_num_layers,
    after every decoder layer, all in one virtual stage), placed where simdist prices them: with the loss on the last
    part (simdist.plan.chunk_cost). A layout without m's keeps that placement (Megatron-LM would ask for them)."""
    flat = "".join(parts)
    count = flat.count("m")
    if not count:
        return
    mtp = model.mtp_layers
    if count != mtp:
        raise _fail(f"the layout holds {count} multi-token prediction layers (m) but the model has "
                    f"mtp_num_layers = {mtp}", field,
                    f"write {mtp} m's before the L" if mtp else "remove the m's, or set model.mtp_num_layers")
    if "t" in flat[flat.index("m"):]:
        raise _fail("the layout puts a decoder layer (t) after a multi-token prediction layer (m)", field,
                    "put every m after the last t (Megatron-LM builds the MTP layers after the decoder)")
    where = [i for i, p in enumerate(parts) if "m" in p]
    if where != [len(parts) - 1]:
        raise _fail(f"the layout puts its multi-token prediction layers (m) on part {where[0]}, not on the last "
                    f"part with the loss: Megatron-LM's standalone MTP stage is not modelled", field,
                    "put the m's in the last part, before the L")


def layout_string(parts: tuple[int, ...], mtp_layers: int = 0) -> str:
    """Decoder-layer counts per part in Megatron-LM's layout syntax, runs of equal parts folded:
    (0, 1, 1, 1, 0) -> ``"E|(t|)*3,L"``; (4, 4) -> ``"Et*4|t*4L"``; ``mtp_layers`` multi-token prediction layers
    before the loss, where simdist places them: (4, 4) with 1 -> ``"Et*4|t*4mL"`` (Megatron-LM refuses a layout whose
    m's do not match the model's mtp_num_layers)."""
    def part(n: int) -> str:
        return "t" if n == 1 else (f"t*{n}" if n > 1 else "")

    last = len(parts) - 1
    out: list[str] = []
    i = 0
    while i <= last:
        if 0 < i < last:  # fold a run of equal middle parts
            j = i
            while j + 1 < last and parts[j + 1] == parts[i]:
                j += 1
            if j > i:
                out.append(f"({part(parts[i])}|)*{j - i + 1}")
                i = j + 1
                continue
        text = ("E" if i == 0 else "") + part(parts[i]) + ("m" * mtp_layers + "L" if i == last else "")
        out.append(text + ("" if i == last else "|"))
        i += 1
    # a cosmetic comma after each folded run, where the next part follows it
    return "".join(p + ("," if p.startswith("(") and i < len(out) - 1 else "") for i, p in enumerate(out))


# ----------------------------------------------------------------------------- per-stage counts
def chunk_layers(n: int, vpp: int) -> list[int]:
    """A stage's n layers over its vpp chunks: equal, or the first chunks one layer heavier.

    # Assumption: a stage whose layers do not divide by vpp (an explicit per-stage count, or pipeline_split: even
    # with a stage count that vpp does not divide) splits them as evenly as possible, the earlier chunks taking the
    # extra layer (Megatron-LM itself would need a pipeline_model_parallel_layout for it).
    """
    base, extra = divmod(n, vpp)
    return [base + (1 if c < extra else 0) for c in range(vpp)]


def _from_stages(stages: list[list[int]], pp: int, vpp: int, schedule: str = "1f1b") -> tuple[int, ...]:
    """Per-stage chunk counts as parts in model order, placed as ``schedule`` places them (`LayerSplit`)."""
    if schedule in V_SCHEDULES:
        parts = [0] * (pp * vpp)
        for s, chunks in enumerate(stages):
            for c, n in enumerate(chunks):
                parts[model_part(s, c, pp, schedule)] = n
        return tuple(parts)
    return tuple(stages[p % pp][p // pp] for p in range(pp * vpp))


def _explicit(value: list, model: Model, pp: int, vpp: int, schedule: str = "1f1b") -> tuple[int, ...]:
    field = "parallel.layers_per_stage"
    if len(value) != pp:
        raise _fail(f"layers_per_stage lists {len(value)} stages, but pp = {pp}", field, f"give {pp} entries")
    stages: list[list[int]] = []
    for s, entry in enumerate(value):
        if isinstance(entry, list | tuple):
            if len(entry) != vpp:
                raise _fail(f"layers_per_stage[{s}] lists {len(entry)} chunks, but vpp = {vpp}", field,
                            f"give {vpp} chunk counts per stage, or one count per stage")
            stages.append([int(x) for x in entry])
        else:
            if vpp > 1 and int(entry) < vpp:
                raise _fail(f"a stage of {entry} layers cannot hold vpp = {vpp} model chunks", "parallel.vpp",
                            "list the stage's chunk counts ([0, 1, ...]), use pipeline_split: auto, or a smaller vpp")
            stages.append(chunk_layers(int(entry), vpp))
    total = sum(map(sum, stages))
    if total != model.num_layers:
        raise _fail(f"layers_per_stage {value} holds {total} layers, but the model has {model.num_layers}", field,
                    f"give counts that add up to {model.num_layers}")
    return _from_stages(stages, pp, vpp, schedule)


def _accounting(model: Model, pp: int, vpp: int, embedding: bool, loss: bool) -> tuple[int, ...] | None:
    """Megatron-LM's --account-for-embedding/loss-in-pipeline-split: None where its divisibility asserts fail."""
    units = model.num_layers + int(embedding) + int(loss)
    if units % pp or (units // pp) % vpp:
        return None
    per = units // (pp * vpp)
    parts = [per] * (pp * vpp)
    parts[0] -= int(embedding)
    parts[-1] -= int(loss)
    if min(parts) < 0:
        return None
    return tuple(parts)


def _spread(units: int, num_parts: int) -> list[int]:
    """``units`` over ``num_parts`` parts as evenly as possible, the larger parts spaced evenly along the model
    (part i gets floor((i+1) U / P) - floor(i U / P))."""
    return [(i + 1) * units // num_parts - i * units // num_parts for i in range(num_parts)]


def auto_split(model: Model, pp: int, vpp: int) -> tuple[tuple[int, ...], str]:
    """What Megatron-LM runs when the scenario names no split: (parts, how).

    1. layers divisible by pp x vpp: Megatron's default, every part alike.
    2. else (layers + 2) divisible: --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-
       split (126 Llama 3 layers on pp 16 x vpp 8: the embedding and the loss alone in the first and last part,
       7 + 14 x 8 + 7 layers per stage, as Dubey et al. 2024 sec 3.3.2 ran them).
    3. else (layers + 1) divisible: --account-for-loss-in-pipeline-split alone (the output layer, an h x vocab
       GEMM, is the heavier of the two ends; the embedding is a lookup).
    4. else a --pipeline-model-parallel-layout: layers + embedding + loss spread as evenly as possible over the
       parts (`_spread`), the embedding and the loss each in a layer's place.
    """
    n, parts = model.num_layers, pp * vpp
    if n % parts == 0:
        return (n // parts,) * parts, "even (Megatron-LM's default)"
    both = _accounting(model, pp, vpp, True, True)
    if both is not None:
        return both, ("account_for_embedding_in_pipeline_split + account_for_loss_in_pipeline_split "
                      f"(Megatron-LM): {n} layers + embedding + loss = {n + 2} = {pp} x {vpp} x {(n + 2) // parts}")
    loss = _accounting(model, pp, vpp, False, True)
    if loss is not None:
        return loss, (f"account_for_loss_in_pipeline_split (Megatron-LM): {n} layers + loss = {n + 1} = "
                      f"{pp} x {vpp} x {(n + 1) // parts}")
    if n + 2 >= parts:  # every part gets a unit at least: the embedding and the loss take theirs
        units = _spread(n + 2, parts)
        units[0] -= 1
        units[-1] -= 1
    else:  # more parts than units: the embedding and the loss alone at the ends, the layers over the middle
        units = [0, *_spread(n, parts - 2), 0]
    return tuple(units), ("pipeline_model_parallel_layout (Megatron-LM), chosen: the layers, the embedding and the "
                          "loss spread as evenly as possible")


def _lighter_ends(model: Model, pp: int, vpp: int) -> tuple[int, ...]:
    n = model.num_layers
    per = -(-n // pp)
    missing = per * pp - n
    if pp == 1 or missing > 2 or per - 1 < 1:
        raise _fail(f"{n} layers on {pp} stages cannot be split with only the first and last stage lighter",
                    "parallel.pipeline_split", "use pipeline_split: auto, or list parallel.layers_per_stage")
    counts = [per] * pp
    counts[0] -= 1 if missing >= 1 else 0
    counts[-1] -= 1 if missing == 2 else 0
    stages = [chunk_layers(c, vpp) for c in counts]
    # The lighter ends lose their layer where the embedding and the loss sit (Megatron-LM's accounting): the first
    # chunk of the first stage, the last chunk of the last stage.
    if missing >= 1:
        stages[0] = chunk_layers(per, vpp)
        stages[0][0] -= 1
    if missing == 2:
        stages[-1] = chunk_layers(per, vpp)
        stages[-1][-1] -= 1
    return _from_stages(stages, pp, vpp)


def choose_split(model: Model, *, pp: int, vpp: int, pipeline_split: str = "auto",
                 layers_per_stage: list | None = None, pipeline_layout: str | None = None,
                 account_for_embedding: bool = False, account_for_loss: bool = False,
                 partition_method: str | None = None, precision: str = "bf16", schedule: str = "1f1b") -> LayerSplit:
    """The split of ``model`` over ``pp`` stages x ``vpp`` chunks from a scenario's ``parallel`` fields (one
    source at most: see the module docstring), its parts placed as ``schedule`` places them; raises a LayoutError
    naming the field."""
    split = _choose(model, pp, vpp, pipeline_split, layers_per_stage, pipeline_layout, account_for_embedding,
                    account_for_loss, partition_method, precision, schedule)
    return LayerSplit(split.parts, pp, split.method, schedule)


def _choose(model: Model, pp: int, vpp: int, pipeline_split: str, layers_per_stage: list | None,
            pipeline_layout: str | None, account_for_embedding: bool, account_for_loss: bool,
            partition_method: str | None, precision: str, schedule: str) -> LayerSplit:
    sources = [name for name, on in (("layers_per_stage", layers_per_stage is not None),
                                     ("pipeline_layout", pipeline_layout is not None),
                                     ("partition_method", partition_method is not None),
                                     ("account_for_*_in_pipeline_split", account_for_embedding or account_for_loss),
                                     ("pipeline_split", pipeline_split != "auto")) if on]
    if len(sources) > 1:
        raise _fail(f"the layer split is given twice: {' and '.join(sources)}", f"parallel.{sources[1]}",
                    f"keep one of {', '.join(sources)}")
    if layers_per_stage is not None:
        return LayerSplit(_explicit(layers_per_stage, model, pp, vpp, schedule), pp, "layers_per_stage")
    if pipeline_layout is not None:
        return LayerSplit(_layout_parts(pipeline_layout, model, pp, vpp), pp, "pipeline_layout (Megatron-LM)")
    if partition_method is not None:
        return LayerSplit(deepspeed_parts(partition_method, model, pp, vpp, precision), pp,
                          f"partition_method: {partition_method} (DeepSpeed)")
    if account_for_embedding or account_for_loss:
        parts = _accounting(model, pp, vpp, account_for_embedding, account_for_loss)
        if parts is None:
            units = model.num_layers + int(account_for_embedding) + int(account_for_loss)
            raise _fail(f"{units} layers (with the embedding / loss) do not split evenly over pp = {pp} stages of "
                        f"vpp = {vpp} chunks", "parallel.pp",
                        f"choose pp x vpp dividing {units}, or use pipeline_split: auto")
        flags = " + ".join(f for f, on in (("account_for_embedding_in_pipeline_split", account_for_embedding),
                                           ("account_for_loss_in_pipeline_split", account_for_loss)) if on)
        return LayerSplit(parts, pp, f"{flags} (Megatron-LM)")
    if pipeline_split == "even":
        n = model.num_layers
        if n % pp:
            raise _fail(f"{n} layers do not split evenly over pp = {pp} stages", "parallel.pp",
                        "choose pp dividing the layer count, or set parallel.pipeline_split: auto")
        return LayerSplit(_explicit([n // pp] * pp, model, pp, vpp, schedule), pp, "even")
    if pipeline_split == "lighter_ends" and schedule in V_SCHEDULES:
        # the V puts the first and the last model part both on stage 0: Llama 3's rule (the first and the last
        # stage one layer lighter, for the embedding and the loss) has no one reading there
        raise _fail(f"pipeline_split: lighter_ends lightens the first and the last stage, but schedule {schedule} "
                    "puts the embedding and the loss both on stage 0", "parallel.pipeline_split",
                    "use pipeline_split: auto or even, or list parallel.layers_per_stage")
    if pipeline_split == "lighter_ends":
        return LayerSplit(_lighter_ends(model, pp, vpp), pp, "lighter_ends (Llama 3)")
    if pipeline_split != "auto":
        raise _fail(f"unknown pipeline_split '{pipeline_split}'", "parallel.pipeline_split",
                    "use auto, even or lighter_ends, or list parallel.layers_per_stage")
    parts, how = auto_split(model, pp, vpp)
    return LayerSplit(parts, pp, f"auto: {how}")
