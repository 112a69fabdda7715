"""Attention: the softmax(Q K^T * scale [+ causal mask]) V pattern found in a graph and run as one call - kiln's
CPU kernel (``kiln::attention``, fp32, measured against ATen's SDPA per shape) or ATen's SDPA (GPU, half).

- ``source.py``: the C++ kernel (blocked, online softmax, built on the GEMM's micro-kernel);
- ``op.py``: the built library, the torch op, its native-call binder and checking reference;
- ``fuse.py``: the pass that finds the pattern and chooses the implementation (measured choice ``attention``).

Layout fact: both write ``[B, H, T, D]`` as a transposed view of ``[B, T, H, D]``, so merging the heads after
them is a view, not a copy; kernels reading the result must index it with those strides.
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.ir.graph import Node
from kiln.ir.ops import Op
from kiln.library.attention import fuse, op
from kiln.library.spec import GraphPass, Operator


def _writes_heads_merged(target: Any) -> bool:
    return target is op.attention._opoverload or \
        getattr(target, "overloadpacket", None) is torch.ops.aten.scaled_dot_product_attention


def _fixed_strides(n: Node) -> tuple[int, ...] | None:
    if n.op is Op.EXTERN and len(n.shape) == 4 and _writes_heads_merged(n.attr("target")):
        b, h, t, d = n.shape
        return (t * h * d, d, h * d, 1)
    return None


OPERATOR = Operator(
    name="attention",
    what="fused attention: kiln's CPU kernel or ATen's SDPA, chosen per shape",
    passes=(GraphPass("fuse_attention", fuse.fuse_attention,
                      "after simplify/CSE made the softmax pattern canonical"),),
    libraries=fuse.libraries,
    fixed_strides=_fixed_strides,
    records=lambda: (fuse.ATTENTION.record_kind,),
)
