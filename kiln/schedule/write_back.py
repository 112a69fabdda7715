"""Write-backs made in place: a kernel stores an updated input where the input lies.

[Note: write-backs in place] A graph that updates its inputs - an optimizer step (``p.add_(...)``,
``exp_avg.lerp_(grad, ...)``), a counter, BatchNorm's running statistics - reaches kiln functionalized: each
new value is computed out of place and copied back at the end (``copy_(x, y)``, a library call).  An AdamW step
then writes every parameter and moment twice (the kernel's result, then the copy) and pays a Python call per
tensor: a compiled step over 8 layers was slower than eager's.  Where the kernel that computes ``y`` can store it
into ``x`` directly, the copy goes::

    before:                                             after:
      kernel_1: m' = lerp(m, g); v' = ...; p' = f(p, m', v')    kernel_1: p <- f(p, m', v'); m <- lerp(m, g); v <- ...
      extern copy_(m, m'); copy_(v, v'); copy_(p, p')           (no copies: the kernel wrote the inputs)

Conditions, each for a reason:

- ``x`` is a graph input with its contiguous layout, ``y`` of its shape, dtype and layout, computed by a
  pointwise kernel (one loop; an epilogue of a library call or a reduction keeps its copy);
- every load of ``x`` in that kernel is at the store's index, and ``y``'s value loads it (or nothing in the
  kernel loads ``x``): element ``e`` of ``x`` is then read only where element ``e`` of ``y`` is computed;
- the stores may come in any order: the kernel's loop names the inputs it writes as ``old_values``, which every
  code generator loads for an element before storing any of its values ([Note: old values loaded first],
  ir/kernel.py) - ``p' = f(p, m', v')`` recomputes ``m'`` from the old ``m`` whichever of ``p`` and ``m`` is stored
  first, and SGD's update (the parameter's new value reads the old momentum, the momentum's the old parameter)
  needs no buffer of its own (it once kept one, copied into the parameter last: two more passes over the
  parameters, 0.58x Inductor's step);
- nothing after the kernel reads ``x`` (it would see the new value), and nothing else writes ``x``; kernels after
  it that read ``y`` load ``x``'s buffer instead (a library call reading ``y`` keeps the copy: ``y`` has no
  buffer of its own now); ``y`` is not a result of the graph, and nothing reads the copy's result.

A write-back these conditions keep (a library call reading ``x`` after the kernel, ``y`` an epilogue of a
reduction) becomes a copy kernel of kiln's where the copy was, so no write-back is a
library call (a Python call per tensor on the CPU): adjacent ones of one shape - an optimizer's write-backs at the
end of its step - are one kernel::

      kernel_0: y = f(x, ...)    extern: mm(x, w)    kernel_1_copy: x <- y

The runtime treats ``x`` as it did for the copy: an input the graph updates (a strided caller's tensor is
updated in a contiguous copy and copied back, [Note: write-back of a strided input]).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from kiln.ir.graph import Graph, Node, mutates, view_root
from kiln.ir.kernel import FullLoop, KExpr, KLoad, KOp, Kernel, Store, index_exprs, map_phases, subexprs
from kiln.ir.ops import Op
from kiln.ir.program import ExternStep, Plan
from kiln.runtime import native
from kiln.schedule.program import written_inputs

aten = torch.ops.aten


def _loads(e, buf: str) -> list[KLoad]:
    return [x for x in subexprs(e) if isinstance(x, KLoad) and x.buf == buf]


def _reads(step: object, plan: Plan) -> tuple[set[str], set[Node]]:
    """(buffers a step loads, graph values it takes as operands - through views, their realized bases)."""
    if isinstance(step, Kernel):
        return step.buffers()[0], set()
    if isinstance(step, ExternStep):
        return set(), {view_root(i) for i in step.node.inputs}
    return step.buffers()[0], {view_root(i) for i in step.node_inputs}


def _candidate(copy: Node, plan: Plan, users: dict[Node, list[Node]], outputs: set[Node]) -> tuple[Node, Node] | None:
    """(x, y) of a ``copy_(x, y)`` the conditions allow before looking at the steps; None otherwise."""
    if copy.op is not Op.EXTERN or copy.attr("target") is not aten.copy_.default or len(copy.inputs) != 2:
        return None
    named = native.named_args(copy)
    x, y = named.get("self"), named.get("src")
    if not isinstance(x, Node) or not isinstance(y, Node) or x.op is not Op.INPUT or y.op is Op.EXTERN:
        return None
    if x is y or x.shape != y.shape or x.dtype != y.dtype or named.get("non_blocking"):
        return None
    if x in plan.strides_of or y in plan.strides_of or x not in plan.buffer_of or y not in plan.buffer_of:
        return None
    if users[copy] or copy in outputs or y in outputs:
        return None
    return x, y


def _loads_in_indices(kernel: Kernel, buf: str) -> bool:
    """Does ``kernel`` load ``buf`` inside an index (a gather's position)?"""
    return any(isinstance(y, KLoad) and y.buf == buf for index in kernel.indices() for x in index_exprs(index)
               for y in subexprs(x))


def _renamed(e: KExpr, old: str, new: str) -> KExpr:
    if isinstance(e, KOp):
        return KOp(e.op, tuple(_renamed(a, old, new) for a in e.args), e.dtype)
    if isinstance(e, KLoad) and e.buf == old:
        return KLoad(new, e.index, e.dtype)
    return e


def _rename_loads(kernel: Kernel, old: str, new: str) -> None:
    """``kernel`` loading ``new`` where it loaded ``old`` (loads in values; ``_loads_in_indices`` was checked)."""
    kernel.phases = map_phases(kernel, lambda e: _renamed(e, old, new))
    kernel.__dict__.pop("_frozen_buffers", None)


def write_backs_in_place(plan: Plan, graph: Graph) -> Plan:
    """``plan`` with each write-back the conditions allow made by its kernel, the others that copy a kernel's
    result made by copy kernels (module docstring)."""
    users = graph.users()
    plan = _stored_in_place(plan, graph, users)
    return _copy_kernels(plan, graph, users)


def _stored_in_place(plan: Plan, graph: Graph, users: dict[Node, list[Node]]) -> Plan:
    outputs = set(graph.outputs)
    node_of = {b: n for n, b in plan.buffer_of.items()}
    writer: dict[str, int] = {}  # buffer -> the step that stores it
    for k, s in enumerate(plan.steps):
        if isinstance(s, Kernel):
            for b in s.buffers()[1]:
                writer.setdefault(b, k)
    writes_of = Counter(x for s in plan.steps if isinstance(s, ExternStep) and mutates(s.node)
                        for x in written_inputs(s.node))
    reads = [_reads(s, plan) for s in plan.steps]  # (buffers, operand values) of each step
    chosen: dict[int, dict[str, str]] = {}  # kernel step -> {y's buffer: x's buffer}
    dropped: dict[int, tuple[int, str, list[Kernel]]] = {}  # copy step -> (kernel step, y's buffer, renamed)
    for c, s in enumerate(plan.steps):
        if not isinstance(s, ExternStep):
            continue
        found = _candidate(s.node, plan, users, outputs)
        if found is None:
            continue
        x, y = found
        bx, by = plan.buffer_of[x], plan.buffer_of[y]
        k = writer.get(by)
        kernel = plan.steps[k] if k is not None else None
        if kernel is None or kernel.is_reduction or len(kernel.phases) != 1 or \
                not isinstance(kernel.phases[0], FullLoop):
            continue
        if writes_of[x] != 1:  # (this copy is the one write of x)
            continue
        store = next(st for p in kernel.phases for st in p.stores if st.buf == by)
        if sum(st.buf == by for p in kernel.phases for st in p.stores) != 1:
            continue
        loads = [ld for p in kernel.phases for st in p.stores for e in (st.value, *index_exprs(st.index))
                 for ld in _loads(e, bx)]
        if any(ld.index != store.index for ld in loads) or (loads and not _loads(store.value, bx)):
            continue
        if any(ld for p in kernel.phases for st in p.stores for ld in _loads(st.value, by)):
            continue
        later = [t for t in range(k + 1, len(plan.steps)) if t != c]
        if any(bx in reads[t][0] or x in reads[t][1] or y in reads[t][1] for t in later):
            continue
        # kernels reading y: they read x's buffer now
        renamed = [plan.steps[t] for t in later if by in reads[t][0]]
        if any(not isinstance(t, Kernel) or _loads_in_indices(t, by) for t in renamed):
            continue
        chosen.setdefault(k, {})[by] = bx
        dropped[c] = (k, by, renamed)
    if not chosen:
        return plan
    for k, moved in chosen.items():
        kernel = plan.steps[k]
        for by, bx in moved.items():
            plan.stored_into[bx] = node_of[by]
        stores = [Store(moved.get(st.buf, st.buf), st.index, st.value) for p in kernel.phases for st in p.stores]
        kernel.phases = [FullLoop(stores, frozenset(moved.values()))]
        kernel.__dict__.pop("_frozen_buffers", None)
        kernel.reason += "; " + ", ".join(f"{b} stored into input {moved[b]} (write-back in place)" for b in moved)
    for k, by, renamed in dropped.values():
        for t in renamed:
            _rename_loads(t, by, chosen[k][by])
    gone = {c for c in dropped}
    gone_y = {by for _, by, _ in dropped.values()}
    plan.steps = [s for c, s in enumerate(plan.steps) if c not in gone]
    for n in [n for n, b in plan.buffer_of.items() if b in gone_y]:
        del plan.buffer_of[n]
    return plan


def _copy_kernels(plan: Plan, graph: Graph, users: dict[Node, list[Node]]) -> Plan:
    """The write-backs left (``copy_(x, y)`` with ``y`` a kernel's result) as kernels of kiln's in their place:
    the same copy, without a library call (a Python call per tensor on the CPU).  Adjacent copies of one shape -
    an optimizer's write-backs at the end of its step - are one kernel."""
    from kiln.schedule.fuse import Group
    from kiln.schedule.kernel_build import build_kernel
    outputs = set(graph.outputs)
    written = {b for s in plan.steps if isinstance(s, Kernel) for b in s.buffers()[1]}
    steps: list[Any] = []
    run: list[tuple[Node, Node, Node]] = []  # adjacent copies: (copy node, x, y)

    def flush() -> None:
        by_shape: dict[tuple, list[tuple[Node, Node, Node]]] = {}
        for c, x, y in run:
            by_shape.setdefault(tuple(x.shape), []).append((c, x, y))
        for shape, copies in by_shape.items():
            members, buffer_of = [], dict(plan.buffer_of)
            for c, x, y in copies:
                # (a stand-in node: ``y`` unchanged, stored into ``x``'s buffer)
                member = Node(Op.CAST, (y,), {}, y.shape, y.dtype)
                buffer_of[member] = plan.buffer_of[x]
                plan.stored_into[plan.buffer_of[x]] = member
                members.append(member)
            group = Group(shape, None, members, ["copy_: a write-back"] * len(members))
            name = f"kernel_{len(plan.kernels)}_copy"
            kernel = build_kernel(group, name, buffer_of, set(members), plan.strides_of)
            plan.kernels.append(kernel)
            steps.append(kernel)
        run.clear()

    for s in plan.steps:
        found = _candidate(s.node, plan, users, outputs) if isinstance(s, ExternStep) else None
        if found is not None and plan.buffer_of[found[1]] in written and \
                all(found[0] is not x for _, x, _ in run):
            run.append((s.node, *found))
            continue
        flush()
        steps.append(s)
    flush()
    plan.steps = steps
    return plan
