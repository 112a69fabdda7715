"""Operand layouts for ATen's half-precision batched matmul on the CPU: the re-layout the runtime applies to the
``bmm`` externs the compile chose it for (``Plan.bmm_relayout``; the choice: ``schedule/operand_layout.py``).

ATen's bf16/fp16 ``bmm`` on the CPU is fast for some operand layouts and an order of magnitude slower for others,
and which ones depends on the machine (its ISA, oneDNN's kernels).  Measured on the AVX2 dev box (Zen 3, one
thread), attention's two products in a 12-head, 256-token layer::

    att @ v   (att row-major, v a transposed view of the qkv linear):    76 ms
              att copied to column-major first (copy included):           6.5 ms
    q @ k^T   (q, k^T views of the qkv linear):                            29 ms
              q column-major, k^T row-major (copies included):             5.3 ms

while ``addmm`` goes the other way (a column-major activation is 8x slower), so nothing here touches other ops.
The two layouts compute the same products with other blockings: results may differ in the last bits, as between
two ATen builds.
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.ir.ops import HALF


def column_major(x: torch.Tensor) -> torch.Tensor:
    """``x`` with its last two dims stored column-major (a copy unless it already is)."""
    if x.stride(-2) == 1 and x.stride(-1) == x.shape[-2]:
        return x
    return x.transpose(-1, -2).contiguous().transpose(-1, -2)


def relayout(args: list) -> list:
    """The bmm's operands as (A column-major, B row-major), the other arguments as they are."""
    a, b = args[0], args[1]
    return [column_major(a), b.contiguous(), *args[2:]]


def applies(target: Any, example_dtype: torch.dtype, device: torch.device) -> bool:
    """Is this extern a half-precision CPU ``bmm`` (the op whose operand layouts are chosen)?"""
    return (device.type == "cpu" and example_dtype in HALF
            and getattr(target, "overloadpacket", None) is torch.ops.aten.bmm)
