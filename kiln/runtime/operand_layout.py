"""Operand layouts for ATen's half-precision batched matmul on the CPU, chosen by measuring on the first call.

ATen's bf16/fp16 ``bmm`` on the CPU is fast for some operand layouts and an order of magnitude slower for others,
and which ones depends on the machine (its ISA, oneDNN's kernels).  Measured on the AVX2 dev box (Zen 3, one
thread), attention's two products in a 12-head, 256-token layer::

    att @ v   (att row-major, v a transposed view of the qkv linear):    76 ms
              att copied to column-major first (copy included):           6.5 ms
    q @ k^T   (q, k^T views of the qkv linear):                            29 ms
              q column-major, k^T row-major (copies included):             5.3 ms

while ``addmm`` goes the other way (a column-major activation is 8x slower), so nothing here touches other
ops.  On its first call a ``bmm`` extern on bf16/fp16 CPU tensors times the call as it is and with the operands
copied to (A column-major, B row-major), copies included, and keeps the faster for the rest of its life.  The
two compute the same products with other blockings: results may differ in the last bits, as between two ATen
builds.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch

from kiln.ir.ops import HALF

ROUNDS = 2  # timed calls per variant (after one untimed call each)


def column_major(x: torch.Tensor) -> torch.Tensor:
    """``x`` with its last two dims stored column-major (a copy unless it already is)."""
    if x.stride(-2) == 1 and x.stride(-1) == x.shape[-2]:
        return x
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def _fast_layout(args: list) -> list:
    a, b = args[0], args[1]
    return [column_major(a), b.contiguous(), *args[2:]]


def applies(target: Any, example_dtype: torch.dtype, device: torch.device) -> bool:
    """Is this extern a half-precision CPU ``bmm`` (the op whose operand layouts we choose)?"""
    return (device.type == "cpu" and example_dtype in HALF
            and getattr(target, "overloadpacket", None) is torch.ops.aten.bmm)


class LayoutChoice:
    """The operand layout of one ``bmm`` extern: undecided until its first call, then fixed."""

    def __init__(self) -> None:
        self.adapt: Callable[[list], list] | None = None
        self.label = "undecided"
        self.times_ms: dict[str, float] = {}

    def __call__(self, args: list, run: Callable[[list], Any]) -> list:
        """``args`` in the chosen layout; on the first call, measures both layouts with ``run(args)``."""
        if self.adapt is None:
            self._choose(args, run)
        return self.adapt(args)

    def _choose(self, args: list, run: Callable[[list], Any]) -> None:
        variants = {"as given": lambda a: a, "A column-major, B row-major": _fast_layout}
        for label, adapt in variants.items():
            run(adapt(args))  # untimed: first-touch, library set-up
            start = time.perf_counter()
            for _ in range(ROUNDS):
                run(adapt(args))
            self.times_ms[label] = (time.perf_counter() - start) / ROUNDS * 1e3
        self.label = min(self.times_ms, key=self.times_ms.__getitem__)
        self.adapt = variants[self.label]
