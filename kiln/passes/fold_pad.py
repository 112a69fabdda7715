"""Fold a zero pad of a convolution's input into the convolution's own padding.

Models that pad "same" the TensorFlow way (transformers' MobileNet-V2, EfficientNet ports) call ``F.pad`` before
a convolution with ``padding=0``; as a separate kernel the pad reads and writes the whole activation once more
(MobileNet-V2 at 224x224: 1.5 ms of 17 on one thread).  A convolution's padding is that same zero border, read
without being stored, so a pad that adds the same amount before and after each spatial dimension (and nothing
to the batch and channel dimensions) becomes padding.  A pad with more after than before (TensorFlow's
stride-2 "same": one extra row at the bottom) cannot be said in ``aten.convolution``'s symmetric padding and
stays; kiln's own convolutions take four-sided padding and fold it later (``library/conv/select.py``).

The padded zeros are skipped instead of multiplied, so results differ from the unfolded graph only where a
weight is infinite or NaN (``0 * inf``).

Before::                                                   After::

    %1 = pad(%x, pads=((0, 0), (0, 0), (1, 1), (2, 2)),      %2 = extern(%x, %w, %b, [1, 1], [1, 2], ...,
             value=0.0)                                                target=aten.convolution.default)
    %2 = extern(%1, %w, %b, [1, 1], [0, 0], ...,
                target=aten.convolution.default)
"""
from __future__ import annotations

import torch

from kiln.ir.extern import build_extern, extern_args
from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.ops import Op
from kiln.passes.rewrite import RewriteLog, rewrite

aten = torch.ops.aten


def sides(pad: Node, spatial: int) -> list[tuple[int, int]] | None:
    """The (before, after) zero border ``pad`` adds to each of its last ``spatial`` dimensions, if it pads only
    those, with zeros, and crops none; else None."""
    if pad.op is not Op.PAD:
        return None
    pads, value = [tuple(p) for p in pad.attr("pads")], pad.attr("value")
    if isinstance(value, bool) or value != 0 or len(pads) != len(pad.shape) or len(pads) < spatial:
        return None
    outer, inner = pads[:len(pads) - spatial], pads[len(pads) - spatial:]
    if any(p != (0, 0) for p in outer) or any(before < 0 or after < 0 for before, after in inner):
        return None
    return [(int(before), int(after)) for before, after in inner]


def border(pad: Node, spatial: int) -> list[int] | None:
    """The per-side zero border ``pad`` adds to its last ``spatial`` dimensions, if it pads only those, the same
    amount on both sides, with zeros; else None."""
    found = sides(pad, spatial)
    if found is None or any(before != after for before, after in found):
        return None
    return [before for before, _ in found]


def _fold(node: Node, inputs: tuple[Node, ...], b: GraphBuilder, log: RewriteLog) -> Node | None:
    if node.op is not Op.EXTERN or node.attr("out_index") is not None \
            or getattr(node.attr("target"), "overloadpacket", None) is not aten.convolution:
        return None
    args, kwargs = extern_args(Node(node.op, inputs, node.attrs, node.shape, node.dtype))
    if kwargs or len(args) != 9:
        return None
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = args
    if transposed or not isinstance(x, Node) or x.op is not Op.PAD or not isinstance(padding, (list, tuple)):
        return None
    extra = border(x, len(padding))
    if extra is None:
        return None
    log.hit("zero pad -> convolution padding")
    padding = [int(p) + e for p, e in zip(padding, extra)]
    return build_extern(b, node.attr("target"), [x.inputs[0], w, bias, stride, padding, dilation, transposed,
                                                 output_padding, groups], {}, node.shape, node.dtype)


def fold_pad(graph: Graph, log: RewriteLog) -> Graph:
    """Every convolution whose input is a symmetric zero pad of its spatial dimensions reads the unpadded input
    with that much more padding (the pad node is left to dead-code elimination when nothing else reads it)."""
    if not any(n.op is Op.PAD for n in graph.nodes):
        return graph
    return rewrite(graph, lambda node, inputs, b: _fold(node, inputs, b, log))
