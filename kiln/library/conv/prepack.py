"""Convolutions with frozen weights call oneDNN with the weight reordered once, at compile time.

``aten.convolution`` hands oneDNN a plain weight, which it reorders into its blocked layout on every call:
for ResNet-18's 512-channel 3x3 layers that is a 9.4 MB copy per call, and the layer takes 2.7 ms instead of
1.8 ms on one thread here.  oneDNN's own entry point (``mkldnn._convolution_pointwise``) accepts a weight
reordered ahead of time (``mkldnn._reorder_convolution_weight``).  The seed model's 64->128 3x3 layer on NCHW
input: 93 ms with the plain weight, 67 ms prepacked.

The library writes the output channels-last whatever the input layout, so the layout pass records these
outputs as channels-last buffers (kernels read them through their strides, transposed tiles where needed).
Fused unary post-ops are *not* used: oneDNN's ReLU maps NaN to 0 where torch keeps NaN, so the activation
stays in kiln's next kernel.

Before::                                              After::

    %5 = extern(%x, %w, %b,                               %5 = extern(%x, %b, target=mkldnn._convolution_
           target=aten.convolution.default)                        pointwise.default)  # weight baked in
"""
from __future__ import annotations

import torch

from kiln.ir.extern import Baked, build_extern, checked_source, extern_args
from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.ops import Op
from kiln.ir.sym import size_hint
from kiln.passes.rewrite import RewriteLog, rewrite
from kiln.runtime import references

aten = torch.ops.aten


def available() -> bool:
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_convolution_weight"))


def is_prepacked_conv(n: Node) -> bool:
    return n.op is Op.EXTERN and n.attr("target") is getattr(torch.ops.mkldnn, "_convolution_pointwise",
                                                                None).default


def prepack_conv(graph: Graph, log: RewriteLog | None = None) -> Graph:
    if not available():
        return graph

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        if node.op is not Op.EXTERN or node.dtype != torch.float32 or node.attr("out_index") is not None:
            return None
        if getattr(node.attr("target"), "overloadpacket", None) is not aten.convolution or len(node.shape) != 4:
            return None
        args, kwargs = extern_args(Node(node.op, inputs, node.attrs, node.shape, node.dtype))
        if kwargs or len(args) != 9:
            return None
        x, w, bias, stride, padding, dilation, transposed, output_padding, groups = args
        if transposed or not isinstance(w, Node) or w.op is not Op.CONSTANT or len(w.shape) != 4 \
                or not isinstance(x, Node) or len(x.shape) != 4 or w.dtype != torch.float32 \
                or (bias is not None and (not isinstance(bias, Node) or bias.dtype != torch.float32)):
            return None
        weight = w.attr("value").tensor.contiguous()
        if weight.device.type != "cpu":  # oneDNN is kiln's CPU library; GPU convolutions stay with ATen
            return None
        try:
            # (a symbolic batch or image size: packed for the traced size; a call of another size whose oneDNN
            # primitive wants another weight format reorders it, as Inductor's unpacked weights always are)
            packed = torch.ops.mkldnn._reorder_convolution_weight(weight, list(padding), list(stride),
                                                                  list(dilation), int(groups),
                                                                  [size_hint(d) for d in x.shape])
        except RuntimeError:
            return None  # a configuration oneDNN does not prepack: keep the ATen call
        if log:
            log.hit("convolution -> oneDNN with prepacked weight")
        return build_extern(b, torch.ops.mkldnn._convolution_pointwise.default,
                            [x, Baked(packed, f"prepacked{list(w.shape)}", checked_source(w)), bias, list(padding),
                             list(stride), list(dilation), int(groups), "none", [], ""], {}, node.shape, node.dtype)

    return rewrite(graph, rule)


@references.register("mkldnn::_convolution_pointwise")
def _reference(args: dict) -> torch.Tensor | None:
    """What oneDNN's prepacked convolution computes, in ATen, on the weight it was reordered from (the step
    checker's reference; None for a post-op other than relu, or without the source weight)."""
    w = references.baked_source(args["W"]) if "W" in args else None
    if w is None:
        return None
    y = torch.nn.functional.conv2d(args["X"], w.float(), args.get("B"), args["stride"], args["padding"],
                                   args["dilation"], args["groups"])
    attr = args.get("attr", "none")
    return torch.relu(y) if attr == "relu" else y if attr == "none" else None
