"""Fusion: partition the optimized graph into kernels and extern calls.

[Note: how kiln fuses]
1. *Realization.*  Every node is either realized (written to a buffer) or inlined into its consumers as an
   index function.  Realized: inputs, constants, extern results and their arguments, reductions, graph
   outputs, and shared producers whose recomputation would cost more than a store and a load (the cost model
   below).  Views are never realized for a kernel: they are index maps.
2. *Grouping.*  Realized nodes are visited in order; each joins the kernel being built when their iteration
   spaces agree, else opens a new kernel:
   - pointwise kernel over shape T  <- pointwise node of shape T        (elementwise chains, horizontal)
   - pointwise kernel over shape S  <- reduction of an S-shaped input    (the chain becomes its prologue)
   - reduction kernel (S, axes)     <- reduction with the same S and axes (softmax's max and sum, mean & var)
   - reduction kernel (S, axes)     <- pointwise node of shape S         (epilogue: normalise, scale)
   - reduction kernel (S, axes)     <- pointwise node with one value per row (mean = sum / n, rstd)
   The kernel builder then checks that every per-row value is read at its own row; if not, the node opens
   a kernel of its own.
3. An extern's elementwise epilogue (bias, activation, residual) is simply the next kernel: the extern writes
   its buffer, one kernel reads it once.

Cost model: a shared producer is recomputed in each consumer kernel unless its inlined cost (1 per cheap op,
8 per transcendental) exceeds ``Config.recompute_limit``, i.e. unless recomputing it costs more than the 8 bytes
a store plus load of one fp32 element moves (on the CPU; a GPU's limit is higher: [Note: recomputing on a GPU]) -
or unless recomputing it reads more memory than storing it once.
A producer reading ``L`` full-size buffers, recomputed by ``u`` consumers, loads ``u * L`` elements per output
element; stored, ``L`` loads, one store and ``u`` loads: so it is stored when ``(u - 1)(L - 1) > 2``.  A
transformer's residual stream is the case: ``x_k = x_(k-1) + branch_k`` feeds layer k's LayerNorm and the
next add, and recomputing it inline made each LayerNorm re-read every earlier branch's output (GPT's layer 3:
seven buffers instead of one).  Readers are counted through views (a view is an index map): OPT writes its
residual as ``(x + branch).view(shape)``, whose one user is the view, and each of its LayerNorms re-read every
earlier branch (layer 12's kernel took 32 arguments; 28 distinct kernels to compile, 15 since).  Values computed
from weights alone (BatchNorm's scale
``w * rsqrt(var + eps)`` when it is not folded: GPU default mode holds no tensor of its own) cost nothing
here: their inputs are a few per-channel values that stay in cache, and their arithmetic hides under the
kernel's memory traffic.  Counting them made the stem's max-pool padding a materialized kernel.
"""
from __future__ import annotations

import dataclasses
from typing import Union

from kiln import config
from kiln.ir.graph import Graph, Node, mutates, readers_through_views, view_root
from kiln.ir.program import ExternStep
from kiln.ir.sym import size_hint
from kiln.ir.ops import INLINABLE, REDUCTION, TRANSCENDENTAL, VIEW, Op, numel

# [Note: recomputing on a GPU]
# The cost model's limit is ``Config.recompute_limit`` - 8 on the CPU, where one transcendental per element is
# about what the store and load of an fp32 element cost - and ``Config.gpu_recompute_limit`` (24) for the GPU's
# plans: an H100 does ~18 fp32 operations in the time it moves a byte, so an ``erf`` costs far less there than
# the 8 bytes it would save.  What the CPU's limit did on the GPU (BERT's training step, from the plan): GELU's
# ``1 + erf(x / sqrt(2))``, read by the backward's recomputed GELU and by GELU's derivative, was stored in fp32
# for every layer - 11 buffers of 24 MiB, computed from bf16 inputs of 12 MiB by one horizontally joined kernel
# at the backward's start (0.42 ms on an H100, the step's largest Triton kernel) and held until each layer's turn.


@dataclasses.dataclass
class Group:
    """Nodes computed by one kernel. ``axes`` is None for pointwise kernels."""
    shape: tuple[int, ...]
    axes: tuple[int, ...] | None
    members: list[Node]
    reason: list[str] = dataclasses.field(default_factory=list)

    @property
    def rows(self) -> int:
        return numel(tuple(s for d, s in enumerate(self.shape) if d not in (self.axes or ())))

    def accepts(self, n: Node) -> str | None:
        """Why ``n`` can join this group (None if it cannot)."""
        if n.op in REDUCTION:
            src = n.inputs[0]
            if self.axes is None and src.shape == self.shape:
                return f"{n.op.value} over the pointwise kernel's iteration space (prologue fused)"
            if self.axes is not None and src.shape == self.shape and n.attr("axes") == self.axes:
                return f"{n.op.value} over the same rows"
            return None
        if n.shape == self.shape:
            return "same iteration space" if self.axes is None else "elementwise epilogue over the rows"
        if self.axes is not None and n.numel == self.rows:
            return "one value per row"
        return None


Step = Union[Group, ExternStep]


def distinct_users(graph: Graph) -> dict[Node, list[Node]]:
    users: dict[Node, list[Node]] = {n: [] for n in graph.nodes}
    for n in graph.nodes:
        for i in set(n.inputs):
            users[i].append(n)
    return users


def _rereads(n: Node, reads: frozenset[Node], consumers: int) -> bool:
    """Whether ``consumers`` recomputations of ``n`` load more than storing it once: ``(u - 1)(L - 1) > 2`` for
    ``L`` loaded values at least half ``n``'s size (small ones - biases, per-row statistics, indices - stay in
    cache and do not count)."""
    loads = sum(1 for r in reads if 2 * size_hint(r.numel) >= size_hint(n.numel))  # (a heuristic: typical sizes)
    return (consumers - 1) * (loads - 1) > 2


def _loop_invariant(n: Node, cost: int, users: dict[Node, list[Node]]) -> bool:
    """[Note: scalars computed once] A one-element value of more than one op read by a larger iteration space - an
    optimizer's bias correction ``1 - 0.999 ** step``, per parameter - is stored once (a scalar kernel) rather
    than computed again for every element (two ``pow`` and a ``sqrt`` per element of a foreach AdamW step: 0.73x
    Inductor's time on the CPU).  Only where the users are larger: a scalar chain ending in a scalar stays one
    kernel."""
    return cost >= 2 and size_hint(n.numel) == 1 and any(size_hint(u.numel) > 1 for u in users[n])


def decide_realized(graph: Graph) -> tuple[set[Node], set[Node]]:
    """(realized nodes, alias nodes).  Alias nodes are view chains passed to externs without a copy."""
    users = distinct_users(graph)
    readers = readers_through_views(graph, users)
    realized: set[Node] = {o for o in graph.outputs if o.op not in VIEW}
    aliases: set[Node] = set()
    for n in graph.nodes:
        if n.op in (Op.INPUT, Op.CONSTANT, Op.EXTERN) or n.op in REDUCTION:
            realized.add(n)
        if n.op is Op.EXTERN:
            for i in n.inputs:
                # an extern reads a view of a computed tensor without a copy: realize the computed tensor
                # (so it can fuse with its producers) and hand the view to the library at run time
                base = i
                while base.op in VIEW and base not in realized:
                    base = base.inputs[0]
                if base is not i:
                    aliases.add(i)
                realized.add(base)
    limit = config.get().recompute_limit  # ([Note: recomputing on a GPU])
    cost: dict[Node, int] = {}
    reads: dict[Node, frozenset[Node]] = {}  # the stored values an inlined node's expression loads
    from_weights: set[Node] = set()  # computed from constants alone
    updated = _updates_in_place(graph)
    for n in graph.nodes:
        for i in _inlined_across_an_update(n, reads, realized, updated):  # ([Note: reads before an in-place update])
            realized.add(i)
            cost[i] = 0
            reads[i] = frozenset((i,))
        if n.op in (Op.CONSTANT, Op.FULL) or (n.op in INLINABLE and n.inputs and set(n.inputs) <= from_weights):
            from_weights.add(n)
        if n in realized or n.op not in INLINABLE or n in from_weights:
            cost[n] = 0
            reads[n] = frozenset() if n in from_weights else frozenset((n,))
            continue
        own = 8 if n.op in TRANSCENDENTAL else (0 if n.op in VIEW else 1)
        cost[n] = own + sum(cost[i] for i in set(n.inputs) if i not in realized)
        reads[n] = frozenset().union(*(reads[i] for i in n.inputs))
        if n.op not in (Op.FULL, Op.IOTA) and n.op not in VIEW and (
                (len(readers[n]) > 1 and (cost[n] > limit or _rereads(n, reads[n], len(readers[n]))))
                or _loop_invariant(n, cost[n], users)):
            realized.add(n)
            cost[n] = 0
            reads[n] = frozenset((n,))
    for o in graph.outputs:
        # an output that is a view of an extern's fresh result is returned as that view, not copied
        base = view_root(o)
        if o in aliases or (base is not o and base.op is Op.EXTERN):
            aliases.add(o)
            realized.add(base)
        else:
            realized.add(o)
    return realized - aliases, aliases


# [Note: reads before an in-place update]
# ``y = torch.where(m, 0.25, x); x.index_put_(i, v); return y[:4]``: ``y`` reads ``x`` before the update, and the
# kernel that computes the output comes after it.  Inlined there, ``y`` read the updated ``x`` - a wrong result
# on both targets (Triton-target fuzz seed 11444; ``y`` reached the output through three inlined nodes).  A value
# whose expression loads a graph input that a library call updates in place between the value's definition and a
# node that reads it is realized: computed where it is defined, before the update.
def _updates_in_place(graph: Graph) -> tuple[dict[Node, int], dict[Node, list[int]]]:
    """(each node's position in ``graph.nodes``, each graph input an extern writes in place -> the positions of
    those writes); both empty where nothing is written in place."""
    from kiln.schedule.program import written_inputs  # (program.py builds on this module)
    position = {n: k for k, n in enumerate(graph.nodes)}
    writes: dict[Node, list[int]] = {}
    for n in graph.nodes:
        if mutates(n):
            for x in written_inputs(n):
                writes.setdefault(x, []).append(position[n])
    return (position, writes) if writes else ({}, {})


def _inlined_across_an_update(n: Node, reads: dict[Node, frozenset[Node]], realized: set[Node],
                              updated: tuple[dict[Node, int], dict[Node, list[int]]]) -> list[Node]:
    """``n``'s inlined inputs that load an input updated in place after them and before ``n``."""
    position, writes = updated
    if not writes:
        return []
    return [i for i in set(n.inputs) if i not in realized and i in reads
            and any(position[i] < k < position[n] for x in reads[i] & writes.keys() for k in writes[x])]


def partition(graph: Graph, breaks: frozenset[Node] = frozenset()) -> tuple[list[Step], set[Node], set[Node]]:
    """Kernel groups and extern calls in execution order, plus the realized and alias node sets.

    Nodes in ``breaks`` always open a new kernel (the kernel builder asks for that when a node's per-row
    values do not line up with the kernel's rows).
    """
    realized, aliases = decide_realized(graph)
    horizontal = config.get().horizontal_fusion
    loads = _Loads(realized)
    steps: list[Step] = []
    ready: dict[Node, int] = {}  # the step after which a node's value can be read (-1: the call's start)
    for n in graph.nodes:
        if n.op in (Op.INPUT, Op.CONSTANT) or n in aliases or n not in realized and n.op is not Op.EXTERN:
            ready[n] = max((ready[i] for i in n.inputs), default=-1)
            continue
        if n.op is Op.EXTERN:
            steps.append(ExternStep(n))
            ready[n] = len(steps) - 1
            continue
        at = _earlier_group(steps, n, ready, loads) if n not in breaks and horizontal else None
        if at is None:
            at = len(steps) - 1
        last = steps[at] if steps and isinstance(steps[at], Group) else None
        why = last.accepts(n) if last is not None and n not in breaks else None
        if last is not None and why is not None:
            ready[n] = at
            if n.op in REDUCTION and last.axes is None:
                last.axes = n.attr("axes")
            last.members.append(n)
            last.reason.append(f"{n.op.value}: {why}")
            continue
        if n.op in REDUCTION:
            steps.append(Group(n.inputs[0].shape, n.attr("axes"), [n], [f"{n.op.value}: starts a reduction kernel"]))
        else:
            steps.append(Group(n.shape, None, [n], [f"{n.op.value}: starts a pointwise kernel"]))
        ready[n] = len(steps) - 1
    return steps, realized, aliases


def _earlier_group(steps: list[Step], n: Node, ready: dict[Node, int],
                   loads: "_Loads") -> int | None:
    """[Note: horizontal fusion] The step of a kernel over ``n``'s iteration space, opened before the last step,
    that ``n`` may join: one after every step ``n`` reads from.  Captured graphs interleave independent elementwise
    chains of different shapes - a foreach optimizer step updates every parameter's first moment, then every
    second moment, ... (``[512, 512]``, ``[512]``, ``[512, 512]``, ...) - and joining only the last kernel made a
    kernel per parameter and op (64 for an 8-layer AdamW step); joined back, one kernel per shape and stage.
    Members read each other inline (``kernel_build``), so a join needs no order between elements.

    Any join ``Group.accepts`` (a reduction over a pointwise kernel's space makes it a prologue, as when they are
    adjacent).  Across a library call only where the call writes none of its arguments (an in-place update could
    write what ``n`` reads) and ``n`` loads a value the kernel loads or computes (what the join saves is that
    load, and a kernel; ``n``'s result, now computed before the call, lives longer - without a shared load that
    is no trade): a padding mask's conversion to an additive mask for the attention call and the test for
    queries with every key masked, read after the call, were two kernels over the same mask
    (``nn.TransformerEncoderLayer``'s fused op), one since.  An epilogue of a call reads the call's result, so it
    stays after it.  None where the last step is the one to try."""
    if not steps or isinstance(steps[-1], Group) and steps[-1].accepts(n) is not None:
        return None
    if not isinstance(steps[-1], Group) and mutates(steps[-1].node):
        return None
    crossed = not isinstance(steps[-1], Group)
    after = max((ready[i] for i in n.inputs), default=-1)
    for k in range(len(steps) - 2, after - 1, -1):
        s = steps[k]
        if not isinstance(s, Group):
            if mutates(s.node):
                return None
            crossed = True
            continue
        if s.accepts(n) is not None and (not crossed or loads.of_node(n) & loads.of_group(s)):
            return k
    return None


class _Loads:
    """The realized values a node's inlined expression loads (through views and inlined producers), and those of
    a kernel's members: what a join across a library call must share (``_earlier_group``)."""

    def __init__(self, realized: set[Node]) -> None:
        self.realized = realized
        self.memo: dict[Node, frozenset[Node]] = {}

    def of_node(self, n: Node) -> frozenset[Node]:
        """Loads of ``n``'s own expression (its inputs, through views and inlined producers)."""
        out: set[Node] = set()
        for i in n.inputs:
            out |= self._value(i)
        return frozenset(out)

    def _value(self, n: Node) -> frozenset[Node]:
        if n not in self.memo:
            root = view_root(n)
            self.memo[n] = frozenset((root,)) if root in self.realized or not root.inputs else self.of_node(root)
        return self.memo[n]

    def of_group(self, g: Group) -> frozenset[Node]:
        """What the kernel loads or computes (a member's value is read inline, with no load)."""
        return frozenset(g.members).union(*(self.of_node(m) for m in g.members))
