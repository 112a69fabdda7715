"""fp32 GPU linears whose product only kiln's kernels read: ``addmm`` becomes ``mm``, and the bias is added by the
kernel that reads the product anyway.

ATen's fp32 ``addmm`` with a 1-D bias takes cuBLASLt's fused-bias path, whose kernel choice differs from a
plain ``mm``'s: on the H200 (TF32 off) RoBERTa's linears ran as a split-K ``sgemm_largek`` kernel plus a separate
epilogue kernel, a memset and a scaling kernel - four launches - where Inductor, which makes this rewrite (its
post-grad ``unfuse_bias_add_to_pointwise``), got one xmma kernel for a third of them (device time per call 2178 vs
1564 us, `benchmarks/gpu_profile.py --zoo --models roberta --dtype fp32`).  Where a kernel reads the product -
the residual add before a LayerNorm, a GELU - the add costs nothing.  A product that a library call reads (the
Q/K/V projections feeding attention), or that the graph returns, keeps ``addmm``: there the bias would need a
kernel of its own.  Half precision keeps ``addmm`` too: its epilogue adds the bias before rounding to 16 bits
(one rounding, not two), and its cuBLAS kernels were the same as Inductor's.

Before::

    %y = extern(%b, %x, %wt, target=aten.addmm.default) : f32[512, 768]
    %z = add(%y, %r)

After::

    %m = extern(%x, %wt, target=aten.mm.default) : f32[512, 768]
    %e = expand(%b, shape=(512, 768))
    %y = add(%m, %e)
    %z = add(%y, %r)
"""
from __future__ import annotations

import torch

from kiln.ir.extern import build_extern, extern_args
from kiln.ir.graph import Graph, GraphBuilder, Node, readers_through_views, view_root
from kiln.ir.interp import constant_value
from kiln.ir.ops import Op
from kiln.passes.rewrite import RewriteLog, rewrite

aten = torch.ops.aten
DEVICES = ("cuda",)  # where the bias must be for the rewrite (tests widen it to run it on CPU tensors)


def _bias_on_gpu(node: Node, devices: tuple[str, ...]) -> bool:
    """Is ``node`` a plain fp32 ``addmm(bias, x, w)`` whose bias is a 1-D constant on one of ``devices``?"""
    if (node.op is not Op.EXTERN or node.attr("target") is not aten.addmm.default or node.dtype != torch.float32
            or node.attr("out_index") is not None or len(node.shape) != 2):
        return False
    args, kwargs = extern_args(node)
    if kwargs or len(args) != 3:
        return False
    bias = args[0]
    if not isinstance(bias, Node) or tuple(bias.shape) != (node.shape[1],):
        return False
    value = constant_value(bias)
    return value is not None and value.device.type in devices


def unfuse_bias(graph: Graph, log: RewriteLog | None = None) -> Graph:
    """fp32 GPU ``addmm`` read only by kiln's kernels as ``mm`` plus a bias add those kernels take in."""
    devices = DEVICES
    readers = readers_through_views(graph)
    returned = {view_root(o) for o in graph.outputs}  # a product the graph returns, or a view of it
    # only kiln's kernels read it (through views): no library call, not returned
    chosen = {n for n in graph.nodes if _bias_on_gpu(n, devices) and n not in returned and readers[n]
              and all(u.op is not Op.EXTERN for u in readers[n])}

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        if node not in chosen:
            return None
        renamed = Node(node.op, inputs, node.attrs, node.shape, node.dtype)
        (bias, x, w), _ = extern_args(renamed)
        if log:
            log.hit("fp32 bias added by the product's reader")
        product = build_extern(b, aten.mm.default, [x, w], {}, node.shape, node.dtype)
        return b.add(Op.ADD, (product, b.add(Op.EXPAND, (bias,), shape=node.shape)))

    return rewrite(graph, rule)
