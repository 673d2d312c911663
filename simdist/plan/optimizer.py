"""The optimizer step's kernels: AdamW as each implementation runs it, and the gradient-norm clipping before it.

Per parameter the update reads the fp32 master weight, the two moments and the fp32 gradient and writes the weight and
the moments (Kingma & Ba 2015 Algorithm 1; ZeRO, Rajbhandari et al. 2020 sec. 3.1 counts the same 4 + 4 + 4 B of
state), plus the 16-bit copy where the framework keeps one beside the master (Megatron-LM's distributed optimizer;
FSDP2 keeps the fp32 shard as the parameter and casts in its all-gather instead).

- ``fused``: one multi-tensor kernel does it all in one pass (Apex / Transformer Engine FusedAdam, DeepSpeed FusedAdam,
  torch.optim.AdamW(fused=True)): ``kernel_work.optimizer_kernels``.
- ``foreach``: torch.optim's default on GPU tensors (torch/optim/adamw.py, _multi_tensor_adamw): one multi-tensor
  kernel per arithmetic op, each a pass over its tensors: lerp of the first moment, mul and addcmul of the second,
  sqrt, div and add of the denominator, addcdiv into the weight, and the decoupled weight decay's mul (8 passes,
  80 bytes per parameter with fp32 state). A multi-tensor launch covers at most `TENSORS_PER_LAUNCH` tensors.
- ``for_loop``: the same ops launched per parameter tensor (torch.optim foreach=False; Composer's DecoupledAdamW, a
  per-parameter Python loop: composer/optim/decoupled_weight_decay.py).

Gradient clipping by the global norm (Megatron-LM --clip-grad 1.0, torchtitan max_norm 1.0, Composer's recipes:
on by default; DeepSpeed: off): a norm pass reading every gradient and a scaling pass, both multi-tensor.
"""

from __future__ import annotations

from simdist.plan.kernel_work import Kernel, elementwise, optimizer_kernels

__all__ = ["FOREACH_PASSES", "TENSORS_PER_LAUNCH", "optimizer_step_kernels"]

FOREACH_PASSES = (("exp_avg_lerp", 12.0), ("exp_avg_sq_mul", 8.0), ("exp_avg_sq_addcmul", 12.0), ("denom_sqrt", 8.0),
                  ("denom_div", 8.0), ("denom_add_eps", 8.0), ("param_addcdiv", 16.0), ("weight_decay_mul", 8.0))
"""(op, bytes per parameter) of torch.optim's multi-tensor AdamW with fp32 state: lerp reads the gradient and the
first moment and writes it (12 B), the second moment's mul and addcmul (8, 12), the denominator's sqrt, div and add
(8 each), addcdiv reads the weight, the moment and the denominator and writes the weight (16), weight decay (8)."""
TENSORS_PER_LAUNCH = 110
"""Assumption: one multi-tensor launch handles about 110 tensors (aten/src/ATen/native/cuda/MultiTensorApply.cuh:
depth_to_max_tensors {110, 64, 48, 36, 30} for 1-5 tensor lists; the lerp and addcdiv kernels take 2-4 lists)."""


def optimizer_step_kernels(num_params: float, *, precision: str = "bf16", implementation: str = "fused",
                           num_tensors: int = 1, master_copy: bool = True, clip: bool = True) -> tuple[Kernel, ...]:
    """The kernels of one optimizer step over ``num_params`` parameters in ``num_tensors`` tensors (one GPU's shard)."""
    kernels: list[Kernel] = []
    launches = max(1, -(-num_tensors // TENSORS_PER_LAUNCH))
    if clip:
        # torch.nn.utils.clip_grad_norm_(foreach=True) / Apex multi_tensor_l2norm: read every fp32 gradient, then
        # multiply them by the clipping coefficient (read + write); one launch per chunk of tensors each.
        for _ in range(launches):
            kernels.append(elementwise("grad_norm", num_params / launches, 4.0, 2.0))
            kernels.append(elementwise("grad_clip_scale", num_params / launches, 8.0, 1.0))
    if implementation == "fused":
        (adam,) = optimizer_kernels(num_params, precision=precision)
        if not master_copy and adam.hbm_bytes > 28.0 * num_params:
            adam = elementwise("adam", num_params, 28.0, 12.0)
        return (*kernels, adam)
    copies = 2.0 if master_copy and precision in ("bf16", "fp16", "fp8") else 0.0
    per = launches if implementation == "foreach" else max(1, num_tensors)
    for name, bytes_per in FOREACH_PASSES:
        kernels += [elementwise(f"adam_{name}", num_params / per, bytes_per, 1.5) for _ in range(per)]
    if copies:
        kernels += [elementwise("adam_param_copy", num_params / per, 4.0 + copies, 0.0) for _ in range(per)]
    return tuple(kernels)
