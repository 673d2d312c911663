"""Which ATen ops of a torch.profiler trace launch a kernel of their own on a GPU: the harness's op counts
(validation.rope_ops, validation.glu_clamp_ops) compare them with the kernels simdist prices."""

from __future__ import annotations

import argparse
from collections.abc import Callable

__all__ = ["outer_kernels", "print_kernels"]


def outer_kernels(prof, kernel_ops: frozenset[str]) -> list[str]:
    """The kernels of a profile, in order: an op of ``kernel_ops`` (ATen names, ``aten::mul``) outside another such
    op (the ops it calls are its own kernel's work) that touches at least one element (with shapes recorded, an
    input with a 0 dimension launches nothing on a GPU); names without the ``aten::`` prefix."""
    out = []
    for e in prof.events():
        if e.name not in kernel_ops:
            continue
        parent, nested = e.cpu_parent, False
        while parent is not None:
            nested = nested or parent.name in kernel_ops
            parent = parent.cpu_parent
        shapes = [s for s in (e.input_shapes or []) if s]
        if nested or any(0 in s for s in shapes):
            continue
        out.append(e.name.removeprefix("aten::"))
    return out


def print_kernels(prog: str, description: str, argv: list[str] | None,
                  count: Callable[[], tuple[list[str], list[str]]]) -> int:
    """An op count's command line: no options; prints ``count()``'s forward and backward kernels, in order."""
    argparse.ArgumentParser(prog=prog, description=description).parse_args(argv)
    forward, backward = count()
    print(f"forward  {len(forward)} kernels: {' '.join(forward)}")
    print(f"backward {len(backward)} kernels: {' '.join(backward)}")
    return 0
