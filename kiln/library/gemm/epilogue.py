"""A linear layer's gelu moves into the GEMM call on the CPU: kiln's GEMM applies it to each output tile as the
tile's last K block leaves the registers, oneDNN as its "gelu" post-op.  The gelu kernel that would otherwise
read and write the whole activation once more (MLP: 64 x 4096 floats after each up-projection) disappears.

The pattern is what ``aten.gelu`` (exact, erf form) lowers to on the CPU (``frontend/aten.py``): ``gelu(x)``, with
the linear's result used by nothing else.  ``x`` may also be a reshape of the linear's 2-D result (a linear on
3-D activations, as in a transformer: ``[B*T, N]`` viewed as ``[B, T, N]``); the gelu then moves into the GEMM and
the reshape stays, now of the fused result.  kiln's epilogue computes the same operations in the same order
as the generated kernel (with g++ 12 the results are bit-identical; the test allows 2 ulp); oneDNN's gelu is its
own (a few ulp apart).

Before::                                                  After::

    %2 = extern(%x, %w, %b, target=kiln.linear_packed)        %3 = extern(%x, %w, %b, ..., gelu=True,
    %3 = gelu(%2)                                                     target=kiln.linear_packed)
"""
from __future__ import annotations

import torch

from kiln.ir.extern import build_extern, extern_args
from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.ops import Op
from kiln.passes.dce import dce
from kiln.passes.rewrite import RewriteLog, rewrite


def gelu_input(n: Node) -> Node | None:
    """``x`` when ``n`` is ``gelu(x)``, else None."""
    return n.inputs[0] if n.op is Op.GELU else None


def _fusable(x: Node) -> str | None:
    """Which library computes linear ``x`` with an epilogue it can extend: "kiln", "onednn", or None."""
    if x.op is not Op.EXTERN or x.dtype != torch.float32 or x.attr("out_index") is not None:
        return None
    target = x.attr("target")
    args = extern_args(x)[0]
    if target is torch.ops.kiln.linear_packed.default and not (len(args) > 7 and args[7]):
        return "kiln"
    if getattr(torch.ops.mkldnn, "_linear_pointwise", None) is not None \
            and target is torch.ops.mkldnn._linear_pointwise.default and args[3] == "none":
        return "onednn"
    return None


def fuse_gemm_gelu(graph: Graph, log: RewriteLog | None = None) -> Graph:
    users = graph.users()
    outputs = set(graph.outputs)

    def linear_of(x: Node) -> Node:
        """The linear whose result ``x`` is: ``x`` itself, or the input of the reshape ``x``."""
        if x.op is Op.RESHAPE and x.inputs[0] not in outputs and len(users[x.inputs[0]]) == 1:
            return x.inputs[0]
        return x

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        x = gelu_input(node)
        if x is None or x in outputs or len(users[x]) != 1 or (kind := _fusable(linear_of(x))) is None:
            return None  # (one user: the gelu, nothing else)
        new_x = inputs[0]  # x with rewritten inputs
        reshaped = new_x.op is Op.RESHAPE
        linear = new_x.inputs[0] if reshaped else new_x
        args = list(extern_args(linear)[0])
        if kind == "kiln":  # (x, packed, bias, n[, mr, kc, mc]) + gelu
            args = args[:4] + (args[4:7] if len(args) > 4 else [0, 0, 0]) + [True]
        else:  # (x, w, bias, attr, scalars, algorithm): oneDNN's exact gelu post-op
            args[3:6] = ["gelu", [], "none"]
        if log:
            log.hit(f"gelu -> {kind} GEMM epilogue")
        fused = build_extern(b, linear.attr("target"), args, {}, linear.shape, node.dtype)
        return b.add(Op.RESHAPE, (fused,), shape=node.shape) if reshaped else fused

    return dce(rewrite(graph, rule))
