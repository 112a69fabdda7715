"""In-place updates of graph inputs: ``copy_(x, index_put(x, i, v))`` becomes ``index_put_(x, i, v)``.

A model that updates a buffer the caller owns - a static KV cache's ``self.keys.index_copy_(2, pos, k)`` in a
decode step - reaches kiln functionalized by AOTAutograd: the updated tensor is computed out of place (ATen's
``index_put`` clones the whole cache, then writes the new rows) and copied back into the input at the end
(``copy_``).  Two passes over the whole cache per update, for a few rows written.  Where nothing else reads the
input, the update can be made where the input lies, as eager does::

    before:                                           after:
      %u = extern index_put(%cache, %idx, %new)         %u = extern index_put_(%cache, %idx, %new)
      %a = ... reads %u ...                             %a = ... reads %u ...
      %c = extern copy_(%cache, %u)                     (%c's readers read %u: the input, updated)

Conditions, each for a reason:

- ``%cache`` is a graph input read by nothing but the update and the copy: no reader can see it before or after
  the update by mistake, whatever the order the program runs in (the out-of-place result and the input are now
  one tensor);
- the update's ``self`` is ``%cache`` itself, not a view, and no other operand of it is ``%cache``;
- same shape and dtype (``index_put`` keeps both);
- only out-of-place ops whose in-place twin has the same schema but ``self`` written (``_IN_PLACE``).

The runtime treats an input an extern writes as it treats the ``copy_``'s: a strided caller's tensor is updated
in a contiguous copy that the call copies back ([Note: write-back of a strided input], codegen/gpu_call.py).
"""
from __future__ import annotations

import torch

from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.ops import Op
from kiln.passes.rewrite import RewriteLog, rewrite
from kiln.runtime import native

aten = torch.ops.aten

# out-of-place op -> its in-place twin (same arguments; ``self`` written and returned)
_IN_PLACE = {
    aten.index_put.default: aten.index_put_.default,
}


def _matches(update: Node, copy: Node, users: dict[Node, list[Node]]) -> bool:
    x = copy.inputs[0] if copy.inputs else None
    if x is None or x.op is not Op.INPUT or update.op is not Op.EXTERN:
        return False
    if update.attr("target") not in _IN_PLACE or update.attr("out_index") is not None:
        return False
    if update.shape != x.shape or update.dtype != x.dtype or update.inputs.count(x) != 1:
        return False
    if native.named_args(update).get("self") is not x or native.named_args(copy).get("src") is not update:
        return False
    return set(users[x]) == {update, copy}


def inplace_updates(graph: Graph, log: RewriteLog) -> Graph:
    """The graph with each functionalized update of an input made in place (module docstring)."""
    users = graph.users()
    update_of: dict[Node, Node] = {}  # the copy_ -> the update it writes back
    for n in graph.nodes:
        if n.op is Op.EXTERN and n.attr("target") is aten.copy_.default and len(n.inputs) == 2 \
                and _matches(n.inputs[1], n, users):
            update_of[n] = n.inputs[1]
    if not update_of:
        return graph
    updates = set(update_of.values())

    def rule(n: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        if n in updates:
            attrs = {k: v for k, v in n.attrs.items() if k != "shape"}
            attrs["target"] = _IN_PLACE[n.attr("target")]
            log.hit("input updated in place")
            return b.add(Op.EXTERN, inputs, shape=n.shape, dtype=n.dtype, **attrs)
        if n in update_of:
            return inputs[1]  # (the update's node: the input, updated)
        return None
    return rewrite(graph, rule)
