"""CPU 1-D convolutions become 2-D ones of height 1, so that kiln's convolution choices take them.

``aten.convolution`` on a ``[N, C, L]`` input goes to ATen, which hands oneDNN a plain weight to reorder on every
call and never meets kiln's own kernels.  As a 2-D convolution of a ``[N, C, 1, L]`` view with a ``[K, C/g, 1, k]``
weight (stride, padding and dilation ``[1, s]``, ``[0, p]``, ``[1, d]``), the passes after this one choose it like
any other: kiln's implicit GEMM or depthwise kernel where measured faster, else oneDNN with its weight reordered
once.  Whisper's two-layer convolutional stem (80 -> 384 -> 384 channels over 3000 frames) and wav2vec2's feature
encoder are such convolutions.  GPU convolutions stay with ATen (cuDNN takes 1-D convolutions as they are).

Before::                                                    After::

    %2 = extern(%x, %w, %b, [2], [1], [1], False, [0], 1,      %3 = reshape(%x, shape=(N, C, 1, L))
                target=aten.convolution) : f32[N, K, Lo]        %4 = constant(w as [K, C, 1, 3])
                                                                %5 = extern(%3, %4, %b, [1, 2], [0, 1], [1, 1], False,
                                                                            [0, 0], 1, target=aten.convolution)
                                                                                                  : f32[N, K, 1, Lo]
                                                                %6 = reshape(%5, shape=(N, K, Lo))
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.ir.extern import build_extern, extern_args
from kiln.ir.graph import ConstRef, Graph, GraphBuilder, Node
from kiln.ir.ops import Op
from kiln.passes.rewrite import RewriteLog, rewrite

aten = torch.ops.aten


def candidate(node: Node) -> list[Any] | None:
    """The arguments of a 1-D fp32 CPU convolution with a constant weight (not transposed), else None."""
    if node.op is not Op.EXTERN or node.dtype != torch.float32 or node.attr("out_index") is not None \
            or getattr(node.attr("target"), "overloadpacket", None) is not aten.convolution or len(node.shape) != 3:
        return None
    args, kwargs = extern_args(node)
    if kwargs or len(args) != 9:
        return None
    x, w, bias, stride, padding, dilation, transposed, _, groups = args
    if transposed or not isinstance(x, Node) or len(x.shape) != 3 or not isinstance(w, Node) \
            or w.op is not Op.CONSTANT or len(w.shape) != 3 or w.dtype != torch.float32 \
            or w.attr("value").tensor.device.type != "cpu" \
            or (bias is not None and (not isinstance(bias, Node) or bias.dtype != torch.float32)) \
            or any(not isinstance(v, (list, tuple)) or len(v) != 1 for v in (stride, padding, dilation)):
        return None
    return args


def conv1d_as_2d(graph: Graph, log: RewriteLog | None = None) -> Graph:
    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        args = candidate(Node(node.op, inputs, node.attrs, node.shape, node.dtype))
        if args is None:
            return None
        x, w, bias, stride, padding, dilation, _, _, groups = args
        (n, c, length), (k, per_group, width) = x.shape, w.shape
        weight = w.attr("value").tensor.reshape(k, per_group, 1, width).contiguous()
        if log:
            log.hit("1-D convolution -> 2-D of height 1")
        conv = build_extern(b, aten.convolution.default,
                            [b.add(Op.RESHAPE, (x,), shape=(n, c, 1, length)),
                             b.add(Op.CONSTANT, (), value=ConstRef(weight)), bias, [1, stride[0]], [0, padding[0]],
                             [1, dilation[0]], False, [0, 0], groups], {},
                            (node.shape[0], node.shape[1], 1, node.shape[2]), node.dtype)
        return b.add(Op.RESHAPE, (conv,), shape=node.shape)

    return rewrite(graph, rule)
