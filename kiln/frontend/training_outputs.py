"""Training graphs' outputs in eager's layout ([Note: a training graph's outputs in eager's layout])."""
from __future__ import annotations

from typing import Any

import torch
import torch.fx


def dense_outputs(fx_gm: torch.fx.GraphModule, graph: Any, skip: set[int] = frozenset()) -> Any:
    """[Note: a training graph's outputs in eager's layout] kiln drops ``clone`` and ``contiguous`` (its kernels
    read views through their strides), so a forward may return a saved activation as a strided view where eager's
    value - and the backward AOTAutograd traced against it - was dense: attention's ``q``, ``k`` and ``v``,
    ``clone(expand(transpose(...)))`` of a fused projection's slices.  The backward then copied each such input
    on the host at every step (12 in a 4-layer GPT's backward on the H100: 28 ATen copy launches a step, outside
    the CUDA graphs of reduce-overhead), and AccumulateGrad copies a gradient whose strides are not its
    parameter's.  An output of a training graph that eager has dense but kiln would hand out as a strided view
    of a value it computed becomes a copy in the graph, which the plan writes as a kernel (fused where it can)::

        before:  %9 = permute(%8) -> output                   (strided: a view of %8's buffer)
        after:   %9 = permute(%8); %10 = cast(%9) -> output   (a dense buffer; the view a kernel's loads)

    ``skip``: FX output positions that are sizes, not graph outputs.  Outputs of symbolic size are left."""
    from kiln.ir.graph import GraphBuilder
    from kiln.ir.interp import view_chain, view_layout
    from kiln.ir.ops import VIEW, Op, contiguous_strides
    from kiln.passes.rewrite import copy_with_inputs
    from kiln.schedule.layout import VIEW_COPY

    fx_out = next(n for n in fx_gm.graph.nodes if n.op == "output").args[0]
    fx_out = [o for k, o in enumerate(fx_out if isinstance(fx_out, (list, tuple)) else [fx_out]) if k not in skip]
    strided: set[int] = set()
    for k, (fx_node, out) in enumerate(zip(fx_out, graph.outputs)):
        value = fx_node.meta.get("val") if isinstance(fx_node, torch.fx.Node) else None
        if out.op not in VIEW or not isinstance(value, torch.Tensor) or not value.is_contiguous():
            continue
        base, chain = view_chain(out)
        if base.op in (Op.INPUT, Op.CONSTANT):  # (aliases of inputs: AOTAutograd's to rebuild)
            continue
        layout = view_layout(base.shape, contiguous_strides(base.shape), base.dtype, chain)
        if layout is None:
            continue
        dense = torch.empty_strided(tuple(out.shape), layout[0], device="meta").is_contiguous()
        if not dense or layout[1] != 0:
            strided.add(k)
    if not strided:
        return graph
    b, new = GraphBuilder(), {}
    for n in graph.nodes:
        new[n] = copy_with_inputs(n, tuple(new[i] for i in n.inputs), b)
    outputs = [b.add(Op.CAST, [new[o]], dtype=o.dtype, **{VIEW_COPY: True}) if k in strided else new[o]
               for k, o in enumerate(graph.outputs)]
    return b.finish(outputs)
