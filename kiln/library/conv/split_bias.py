"""GPU convolutions leave their bias to kiln's next kernel.

cuDNN has no bias epilogue in ATen's convolution: with a bias, ATen launches a separate elementwise add after
the convolution, one more pass over the output (ResNet-18 batch 1 on the H200: 20 such adds, 47 of 219 us of
device time).  Without the bias in the call, the add joins the pointwise kernel that already follows the
convolution (ReLU, residual add), at no extra memory traffic.  On the CPU oneDNN adds the bias inside the
convolution, so the rewrite is for CUDA weights only.

Before::                                              After::

    %3 = extern(%x, %w, %b, target=aten.convolution)      %3 = extern(%x, %w, target=aten.convolution)
    %4 = relu(%3)                                         %5 = add(%3, expand(reshape(%b, [1, C, 1, 1])))
                                                          %4 = relu(%5)
"""
from __future__ import annotations

import torch

from kiln.ir.extern import build_extern, extern_args
from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.ops import Op
from kiln.passes.rewrite import RewriteLog, rewrite

aten = torch.ops.aten


def split_conv_bias(graph: Graph, log: RewriteLog | None = None, devices: tuple[str, ...] = ("cuda",)) -> Graph:
    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        if node.op is not Op.EXTERN or node.attr("out_index") is not None or len(node.shape) < 3:
            return None
        if getattr(node.attr("target"), "overloadpacket", None) is not aten.convolution:
            return None
        args, kwargs = extern_args(Node(node.op, inputs, node.attrs, node.shape, node.dtype))
        if kwargs or len(args) != 9 or not isinstance(args[2], Node) or not isinstance(args[1], Node):
            return None
        w, bias = args[1], args[2]
        if w.op is not Op.CONSTANT or w.attr("value").tensor.device.type not in devices or bias.dtype != node.dtype:
            return None
        args[2] = None
        conv = build_extern(b, node.attr("target"), args, {}, node.shape, node.dtype)
        c = node.shape[1]
        view = b.add(Op.RESHAPE, (bias,), shape=(1, c) + (1,) * (len(node.shape) - 2))
        if log:
            log.hit("convolution bias moved to the next kernel")
        return b.add(Op.ADD, (conv, b.add(Op.EXPAND, (view,), shape=node.shape)))

    return rewrite(graph, rule)
