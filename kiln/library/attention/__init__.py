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
from kiln.ir.interp import view_chain, view_layout
from kiln.ir.ops import Op, contiguous_strides
from kiln.library.attention import fuse, op
from kiln.library.spec import GraphPass, Operator


def _writes_heads_merged(target: Any) -> bool:
    return target is op.attention._opoverload or \
        getattr(target, "overloadpacket", None) is torch.ops.aten.scaled_dot_product_attention


def _heads_merged(shape: tuple[int, ...]) -> tuple[int, ...]:
    b, h, t, d = shape
    return (t * h * d, d, h * d, 1)


def _fixed_strides(n: Node) -> tuple[int, ...] | None:
    if n.op is not Op.EXTERN or len(n.shape) != 4:
        return None
    target = n.attr("target")
    if _writes_heads_merged(target):
        return _heads_merged(n.shape)
    if n.shape[1] == 1 or n.shape[2] == 1:  # (strides of size-1 dims are arbitrary)
        return None
    if target in _GRADIENTS_LIKE_OPERANDS:
        return _gradient_strides(n)
    if n.attr("out_index") != 0:
        return None
    if target in _ALWAYS_HEADS_MERGED:
        return _heads_merged(n.shape)
    if target in _LIKE_QUERY:
        # ATen's flash (CPU and CUDA) and cuDNN attention write their output dense in the query's stride order:
        # [B, T, H, D] memory when the query is heads split from a projection (then merging the heads after it
        # is a view, and the projection that reads it can be a native call), contiguous for a contiguous query.
        # Left unknown, the generated call made the result contiguous and a kernel of ours copied it back to
        # [B, T, H, D] for the output projection: two copies per layer (BERT, bf16 on the H200: 25-29 us each).
        # The generated call checks the strides of every library result and re-lays out one that differs, so a
        # wrong guess costs a copy, not a result.
        q = _query_strides(n.inputs[0])
        if q is not None and q[3] == 1 and q[1] < q[2]:
            return _heads_merged(n.shape)
    return None


aten = torch.ops.aten
_SDPA_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default
# the memory-efficient kernel allocates [B, T, H, D] whatever the query's layout (its meta function agrees)
_ALWAYS_HEADS_MERGED = frozenset({aten._scaled_dot_product_efficient_attention.default})
_LIKE_QUERY = frozenset({_SDPA_CPU, aten._scaled_dot_product_flash_attention.default,
                         aten._scaled_dot_product_cudnn_attention.default})
_GRADIENTS_LIKE_OPERANDS = frozenset({aten._scaled_dot_product_cudnn_attention_backward.default})


def _gradient_strides(n: Node) -> tuple[int, ...] | None:
    """[Note: attention results in ATen's layout] ATen's cuDNN attention backward writes the gradients of the
    query, key and value (outputs 0, 1, 2) each in its operand's stride order, as the forward writes its output
    in the query's (its meta function agrees): heads split from a projection give gradients laid out
    [B, T, H, D], whose merge for the projection's weight gradient is then a view.  Left unknown, each was made
    contiguous by the generated call (three ATen copies a layer: with the forward's output, the 48
    ``aten::contiguous`` of BERT-base's training step on the H100) and copied back by a kernel of ours.  With
    ``Config.attention_result_layouts`` (off until measured on a GPU; it also hands a training forward's output
    to its backward in its own layout: frontend/training.py)."""
    from kiln import config
    k = n.attr("out_index")
    if not config.get().attention_result_layouts or k not in (0, 1, 2) or len(n.inputs) < 4:
        return None
    operand = _query_strides(n.inputs[k + 1])  # (grad_out, then query, key, value)
    if operand is not None and operand[3] == 1 and operand[1] < operand[2]:
        return _heads_merged(n.shape)
    return None


def _query_strides(q: Node) -> tuple[int, ...] | None:
    """The query's strides as the plan will lay it out: its view chain over a contiguous base (or one whose
    layout a library fixes, or an input that comes laid out), or None where the chain copies."""
    root, chain = view_chain(q)
    base = (_fixed_strides(root) if root.op is Op.EXTERN else root.attr("strides") if root.op is Op.INPUT
            else None) or contiguous_strides(root.shape)
    found = view_layout(root.shape, base, root.dtype, chain)
    return tuple(found[0]) if found is not None else None


OPERATOR = Operator(
    name="attention",
    what="fused attention: kiln's CPU kernel or ATen's SDPA, chosen per shape",
    passes=(GraphPass("fuse_attention", fuse.fuse_attention,
                      "after simplify/CSE made the softmax pattern canonical"),),
    libraries=fuse.libraries,
    fixed_strides=_fixed_strides,
    records=lambda: (fuse.ATTENTION.record_kind,),
)
