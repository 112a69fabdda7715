"""Operand layouts of half-precision CPU ``bmm`` externs: as the plan lays them out, or re-laid out before each
call (A column-major, B row-major, copies included), by measurement through the choice service.

Why (the measurements and the re-layout itself): ``runtime/operand_layout.py``.  The choice is made per problem -
the operands' shapes and strides as the plan gives them, the dtype, the thread count - on random tensors with
those strides, with the one timing method, and stored (kind ``bmm_layout``); past the measuring budget the plan's
layout is kept (predicted).  The plan records the chosen externs in ``Plan.bmm_relayout``, which the runtime
applies (it was measured at the first call, at run time, before).

    plan: extern aten.bmm.default(view(buf7), view(buf9)) -> buf12       Plan.bmm_relayout = {%31}
"""
from __future__ import annotations

import torch

from kiln.ir.graph import Graph, Node
from kiln.ir.interp import view_layout
from kiln.ir.ops import VIEW, Op, contiguous_strides
from kiln.ir.program import Plan
from kiln.runtime.operand_layout import applies, relayout
from kiln.tune.choices import Choices, Kind, measuring_s

BMM_LAYOUT = Kind("bmm_layout", 1, ("as-given", "a-column-major"))


def _layout(n: Node, plan: Plan) -> tuple[tuple[int, ...], int]:
    """(strides, storage offset) the value of ``n`` has at run time: a buffer's, or a view's of one (a view that
    copies gives a contiguous tensor)."""
    chain, base = [], n
    while base.op in VIEW and base not in plan.buffer_of:
        chain.append(base)
        base = base.inputs[0]
    strides = plan.strides_of.get(base, contiguous_strides(base.shape))
    if not chain:
        return strides, 0
    found = view_layout(base.shape, strides, base.dtype, list(reversed(chain)))
    return found if found is not None else (contiguous_strides(n.shape), 0)


def _random(shape: tuple[int, ...], strides: tuple[int, ...], offset: int, dtype: torch.dtype,
            gen: torch.Generator) -> torch.Tensor:
    span = offset + sum((s - 1) * st for s, st in zip(shape, strides)) + 1
    storage = torch.randn(span, generator=gen).to(dtype)
    return storage.as_strided(shape, strides, offset)


def choose_bmm_layouts(graph: Graph, plan: Plan, choices: Choices) -> None:
    """Set ``plan.bmm_relayout``: the half-precision CPU bmm externs that run faster re-laid out."""
    plan.bmm_relayout = set()
    if not _on_cpu(graph):
        return
    for n in graph.nodes:
        if n.op is not Op.EXTERN or not applies(n.attr("target"), n.dtype, torch.device("cpu")) \
                or len(n.inputs) != 2:
            continue
        (sa, oa), (sb, ob) = (_layout(i, plan) for i in n.inputs)
        a, b = n.inputs
        key = (a.shape, sa, b.shape, sb, str(n.dtype).removeprefix("torch."), torch.get_num_threads())
        batch, m, k = a.shape
        flops = 2 * batch * m * k * b.shape[-1]

        def calls(a=a, b=b, sa=sa, sb=sb, oa=oa, ob=ob) -> dict:
            gen = torch.Generator().manual_seed(0)
            x, y = _random(a.shape, sa, oa, a.dtype, gen), _random(b.shape, sb, ob, b.dtype, gen)
            return {"as-given": lambda: torch.bmm(x, y), "a-column-major": lambda: torch.bmm(*relayout([x, y]))}

        what = f"bmm {list(a.shape)}x{list(b.shape)} {key[4]} strides {list(sa)}, {list(sb)}"
        choice = choices.decide(BMM_LAYOUT, key, calls, baseline="as-given", what=what,
                                estimate_s=measuring_s(2, flops))
        if choice == "a-column-major":
            plan.bmm_relayout.add(n)


def _on_cpu(graph: Graph) -> bool:
    return all(c.attr("value").tensor.device.type == "cpu" for c in graph.nodes if c.op is Op.CONSTANT)
