"""Build kernel IR for one fused group: inline producers as index functions, place reductions in passes.

Views compose into index expressions (``kiln.ir.index``); realized producers become loads; reductions and
per-row values become named scalars.  A member whose per-row inputs are not read at its own row raises
``NotFusable`` and the partitioner starts a new kernel at that member.
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.ir.graph import Node
from kiln.ir.index import Dyn, Lin, Var, linearize, unflatten
from kiln.ir.kernel import (Acc, FullLoop, KConst, KExpr, Kernel, KIndex, KLoad, KOp, KVar, ReduceLoop,
                            RowAssign, RowStore, Store, map_expr_indices, subexprs)
from kiln.ir.sym import Size, provably_le
from kiln.ir.ops import ELEMENTWISE, REDUCTION, Op, contiguous_strides, numel
from kiln.schedule.fuse import Group
from kiln.schedule.layout import NHWC_ORDER
from kiln.ir.loop_collapse import collapse_loops


SCRATCH_MAX = 16384  # elements per row scratch array (64 KiB of fp32 on the stack)


def within(value: KExpr, position: Lin, lo: Size, size: Size) -> KExpr:
    """``value`` (a ``cat`` part, or what a ``pad`` surrounds) with its indices simplified for the positions its
    branch selects: ``position`` in ``[lo, lo + size)``.

    [Note: branch ranges] The part is read at ``position - lo``, which the loop variable's own range ``[0, n)``
    lets go negative, so views of it keep their ``//`` and ``%`` (a negative index made non-negative by adding
    multiples).  Within the branch the variable is ``lo + v'`` with ``v'`` in ``[0, size)``: substituted, the
    simplifier proves the views' divisions away; then ``v' = v - lo`` again.  ViT's embeddings, ``cat([cls,
    conv(x).flatten(2).transpose(1, 2)], 1)``, read the convolution at::

        10752*((((o1 + 13) / 14) + 13) % 14) + 768*((o1 + 13) % 14) + ((((o1 + 195) / 196) + r + 767) % 768)

    before, and at ``768*o1 + r - 768`` after.  Only the selected branch reads memory (a C++ conditional, a
    masked Triton load), so the index may leave the buffer where the branch is not taken.  Applies where
    ``position`` is one loop variable."""
    if position.const or len(position.terms) != 1 or position.terms[0][1] != 1 \
            or not isinstance(position.terms[0][0], Var):
        return value
    var = position.terms[0][0]
    if lo == 0 and provably_le(var.size, size):
        return value
    local = Var(f"{var.name}@{lo}", size)
    there, back = {var: Lin.of(local) + lo}, {local: Lin.of(var) - lo}
    return map_expr_indices(value, lambda i: i.substitute(there).substitute(back), {})


class NotFusable(Exception):
    def __init__(self, node: Node, why: str):
        super().__init__(why)
        self.node = node


def _kvars(e: KExpr) -> set[str]:
    return {x.name for x in subexprs(e) if isinstance(x, KVar)}


def _loads(e: KExpr) -> set[str]:
    return {x.buf for x in subexprs(e) if isinstance(x, KLoad)}


def _store_kvars(stores: list[Store]) -> set[str]:
    return {v for st in stores for v in _kvars(st.value)}


def _claim_scratch(expr: KExpr, unplaced: list[Store]) -> list[Store]:
    """Remove from ``unplaced`` (and return, in their order) the scratch stores that ``expr`` reads, directly or
    through another such store's value."""
    wanted = _loads(expr)
    for st in reversed(unplaced):  # a store's value reads only scratches stored before it
        if st.buf in wanted:
            wanted |= _loads(st.value)
    claimed = [st for st in unplaced if st.buf in wanted]
    unplaced[:] = [st for st in unplaced if st.buf not in wanted]
    return claimed


def _without_unit_vars(lin: Lin) -> Lin:
    """``lin`` without its terms in variables of size 1 (always 0: a loop of one iteration)."""
    return Lin(lin.const, tuple((a, c) for a, c in lin.terms if not (isinstance(a, Var) and a.size == 1)))


def _read_by_other_members(group: Group, buffer_of: dict[Node, str]) -> set[Node]:
    """The members another member of ``group`` reads, directly or through the nodes inlined into it."""
    members = set(group.members)
    found: set[Node] = set()
    for m in group.members:
        stack, seen = list(m.inputs), set()
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            if n in members:
                found.add(n)
            elif n not in buffer_of:  # (a realized buffer is a load: its producers are not inlined here)
                stack.extend(n.inputs)
    return found


class KernelBuilder:
    def __init__(self, group: Group, name: str, buffer_of: dict[Node, str], stored: set[Node],
                 flat: bool = False, strides_of: dict[Node, tuple[int, ...]] | None = None,
                 loop_order: tuple[int, ...] | None = None):
        self.strides_of = strides_of or {}
        self.group = group
        self.name = name
        self.buffer_of = buffer_of
        self.stored = stored
        self.members = set(group.members)
        self.rowvars: dict[Node, KVar] = {}
        self.current: Node | None = None
        shape, axes = group.shape, group.axes
        order = loop_order or tuple(range(len(shape)))
        if axes is None and flat:
            # one flat loop: every access must simplify to an affine function of it (checked by the caller)
            self.outer_vars = [Var("i0", numel(shape))]
            walk = unflatten(Lin.of(self.outer_vars[0]), tuple(shape[d] for d in order))
            self.full_index = _reorder(walk, order)
            self.rsize = 0
            self.o_flat = linearize(self.full_index, contiguous_strides(shape))
        elif axes is None:
            self.outer_vars = [Var(f"i{k}", shape[d]) for k, d in enumerate(order)]
            self.full_index = _reorder([Lin.of(v) for v in self.outer_vars], order)
            self.rsize = 0
            self.o_flat = linearize(self.full_index, contiguous_strides(shape))
        else:
            kept = [d for d in range(len(shape)) if d not in axes]
            reduced = [shape[d] for d in axes]
            self.rsize = 1
            for s in reduced:
                self.rsize *= s
            self.outer_vars = [Var(f"o{k}", shape[d]) for k, d in enumerate(kept)]
            r_parts = unflatten(Lin.of(Var("r", self.rsize)), tuple(reduced))
            index: list[Lin] = [Lin(0)] * len(shape)
            for k, d in enumerate(kept):
                index[d] = Lin.of(self.outer_vars[k])
            for k, d in enumerate(axes):
                index[d] = r_parts[k]
            self.full_index = index
            self.o_flat = linearize([Lin.of(v) for v in self.outer_vars],
                                    contiguous_strides(tuple(shape[d] for d in kept)))
        self.memo: dict[tuple[int, tuple[Lin, ...]], KExpr] = {}
        # [Note: row scratch] A realized full-row member (realized because it is expensive and shared) that
        # several passes over the row read is computed once per row into a stack array and re-read later.
        # A stored member qualifies too when another member reads it: a residual add whose sum feeds the next
        # LayerNorm is written in the final loop but read by both statistics passes before it, and was recomputed
        # in each (Swin's window-reverse + residual + LayerNorm kernel: the previous LayerNorm's expression four
        # times per element, 14% of its memory limit).
        # An inlined concatenation read at the row's own position is kept too, whatever its shape (Swin's patch
        # merging: the cat of four strided slices is [1, 28, 28, 384], its LayerNorm runs over the rows of the
        # reshape [1, 784, 384]): its where-chain of gathers was computed in each of the LayerNorm's three passes
        # (12% of the kernel's memory limit).
        read_inside = _read_by_other_members(group, buffer_of)
        # (a symbolic row gets no stack scratch: [Note: symbolic kernels] in codegen/cpp.py)
        self.scratch_fits = type(self.rsize) is int and 1 < self.rsize <= SCRATCH_MAX
        self.cacheable = {m for m in group.members if self.scratch_fits and m.op not in REDUCTION
                          and (m not in stored or m in read_inside) and m.shape == group.shape}
        self.row_position = _without_unit_vars(linearize(self.full_index, contiguous_strides(group.shape))) \
            if self.rsize else None
        self.scratch: dict[Node, str] = {}
        self.pending: list[Store] = []

    def strides(self, n: Node) -> tuple[int, ...]:
        """Memory strides of a buffer (channels-last ones come from the layout pass)."""
        return self.strides_of.get(n) or contiguous_strides(n.shape)

    # ------------------------------------------------------------------ values
    def _caches(self, n: Node) -> bool:
        """Is ``n`` kept in a row scratch where it is read at the row's position (see [Note: row scratch])?"""
        return n in self.cacheable or (n.op is Op.CAT and self.scratch_fits and n not in self.buffer_of
                                       and numel(n.shape) == numel(self.group.shape))

    def value(self, n: Node, idx: list[Lin]) -> KExpr:
        if self._caches(n):
            return self._value(n, idx)
        key = (n.uid, tuple(idx))
        if key not in self.memo:
            self.memo[key] = self._value(n, idx)
        return self.memo[key]

    def _value(self, n: Node, idx: list[Lin]) -> KExpr:
        if n in self.rowvars:
            # (loops of one iteration compare equal at 0: a view may drop a size-1 dimension's variable)
            if _without_unit_vars(linearize(idx, contiguous_strides(n.shape))) != _without_unit_vars(self.o_flat):
                raise NotFusable(self.current, f"{n} is read outside its own row")
            return self.rowvars[n]
        if self._caches(n) and (list(idx) == list(self.full_index) or self._at_row_position(n, idx)):
            if n in self.scratch:
                return KLoad(self.scratch[n], Lin.of(Var("r", self.rsize)), n.dtype)
            expr = self.define(n, idx)
            name = f"scr{len(self.scratch)}"
            self.scratch[n] = name
            self.pending.append(Store(name, Lin.of(Var("r", self.rsize)), expr))
            return expr
        if n in self.members:
            if n.op in REDUCTION:
                raise NotFusable(self.current, f"{n} used before it is computed")
            return self.define(n, idx)
        if n in self.buffer_of:
            return KLoad(self.buffer_of[n], linearize(idx, self.strides(n)), n.dtype)
        return self.define(n, idx)

    def _at_row_position(self, n: Node, idx: list[Lin]) -> bool:
        """Is element ``idx`` of ``n`` (in its own contiguous order) the element the row loop is at?"""
        return _without_unit_vars(linearize(idx, contiguous_strides(n.shape))) == self.row_position

    def define(self, n: Node, idx: list[Lin]) -> KExpr:
        """The value of ``n`` at ``idx`` computed from its inputs (inlining)."""
        op = n.op
        if op is Op.FULL:
            return KConst(n.attr("value"), n.dtype)
        if op is Op.IOTA:
            i = KOp(Op.CAST, (KIndex(idx[0], torch.int64),), n.dtype)
            start, step = n.attr("start"), n.attr("step")
            if step != 1:
                i = KOp(Op.MUL, (i, KConst(step, n.dtype)), n.dtype)
            return KOp(Op.ADD, (i, KConst(start, n.dtype)), n.dtype) if start else i
        if op in ELEMENTWISE:
            return KOp(op, tuple(self.value(i, idx) for i in n.inputs), n.dtype)
        if op is Op.RESHAPE:
            x = n.inputs[0]
            flat = linearize(idx, contiguous_strides(n.shape))
            return self.value(x, unflatten(flat, x.shape))
        if op is Op.PERMUTE:
            src: list[Lin] = [Lin(0)] * len(idx)
            for d, p in enumerate(n.attr("dims")):
                src[p] = idx[d]
            return self.value(n.inputs[0], src)
        if op is Op.EXPAND:
            x = n.inputs[0]
            off = len(n.shape) - len(x.shape)
            src = [Lin(0) if x.shape[j] == 1 and n.shape[j + off] != 1 else idx[j + off] for j in range(len(x.shape))]
            return self.value(x, src)
        if op is Op.SLICE:
            d = n.attr("dim")
            src = list(idx)
            src[d] = idx[d] * n.attr("step") + n.attr("start")
            return self.value(n.inputs[0], src)
        if op is Op.PAD:
            return self._pad(n, idx)
        if op is Op.CAT:
            return self._cat(n, idx)
        if op in (Op.TAKE, Op.GATHER):
            return self._indirect(n, idx)
        raise NotFusable(self.current, f"cannot inline {n}")

    def _in_range(self, i: Lin, lo: int, hi: int) -> KExpr:
        iv = KIndex(i, torch.int64)
        return KOp(Op.LOGICAL_AND, (KOp(Op.GE, (iv, KConst(lo, torch.int64)), torch.bool),
                                    KOp(Op.LT, (iv, KConst(hi, torch.int64)), torch.bool)), torch.bool)

    def _pad(self, n: Node, idx: list[Lin]) -> KExpr:
        x = n.inputs[0]
        cond: KExpr | None = None
        src = []
        ranges = []
        for d, (before, _after) in enumerate(n.attr("pads")):
            src.append(idx[d] - before)
            if n.shape[d] != x.shape[d]:
                c = self._in_range(idx[d], before, before + x.shape[d])
                cond = c if cond is None else KOp(Op.LOGICAL_AND, (cond, c), torch.bool)
                ranges.append((idx[d], before, x.shape[d]))
        inner = self.value(x, src)
        if cond is None:
            return inner
        for position, lo, size in ranges:
            inner = within(inner, position, lo, size)
        return KOp(Op.WHERE, (cond, inner, KConst(n.attr("value"), n.dtype)), n.dtype)

    def _cat(self, n: Node, idx: list[Lin]) -> KExpr:
        d = n.attr("dim")
        offsets = []
        start = 0
        for part in n.inputs:
            offsets.append(start)
            start += part.shape[d]
        result: KExpr | None = None
        for part, off in reversed(list(zip(n.inputs, offsets))):
            src = list(idx)
            src[d] = idx[d] - off
            v = within(self.value(part, src), idx[d], off, part.shape[d])
            if result is None:
                result = v
            else:
                cond = KOp(Op.LT, (KIndex(idx[d], torch.int64), KConst(off + part.shape[d], torch.int64)), torch.bool)
                result = KOp(Op.WHERE, (cond, v, result), n.dtype)
        assert result is not None
        return result

    def _indirect(self, n: Node, idx: list[Lin]) -> KExpr:
        x, index = n.inputs
        d = n.attr("dim")
        if n.op is Op.TAKE:
            k = len(index.shape)
            raw = self.value(index, idx[d:d + k])
            rest_before, rest_after = idx[:d], idx[d + k:]
        else:
            raw = self.value(index, idx)
            rest_before, rest_after = idx[:d], idx[d + 1:]
        size = x.shape[d]
        wrapped = KOp(Op.WHERE, (KOp(Op.LT, (raw, KConst(0, torch.int64)), torch.bool),
                                 KOp(Op.ADD, (raw, KConst(size, torch.int64)), torch.int64), raw), torch.int64)
        return self.value(x, list(rest_before) + [Lin.of(Dyn(wrapped, size))] + list(rest_after))

    # ------------------------------------------------------------------ kernel
    def _reads_scratch_of_later(self, expr: KExpr, stores: list[Store], phases: list[Any], target: int) -> bool:
        """Would ``expr``, with the scratch ``stores`` it brings along, read in pass ``target`` a row scratch that
        a later pass writes?  The stores count: a claimed scratch (``_claim_scratch``) may be made of one that an
        earlier member's pass writes (LayerNorm's output in its argmin's pass, ``v1 - x`` of it stored for an amin
        after: tests/fuzz/found/scratch_read_before_its_pass.py), and its definition carries no accumulator."""
        later = {s.buf for p in phases[target + 1:] if isinstance(p, ReduceLoop) for s in p.stores}
        return bool(later & (_loads(expr) | {b for st in stores for b in _loads(st.value)}))

    def build(self) -> Kernel:
        phases: list[Any] = []
        defined_at: dict[str, int] = {}
        full_stores: list[Store] = []
        scratch_stores: list[Store] = []
        row_stores: list[RowStore] = []
        stored_members: list[Node] = []  # (the member of each full store, in order)
        counter = 0
        for m in self.group.members:
            self.current = m
            self.memo.clear()  # values are shared within one pass over the row, not across passes
            if m.op in REDUCTION:
                self.pending = []
                expr = self.value(m.inputs[0], self.full_index)
                name = f"acc{counter}"
                counter += 1
                # a row scratch first defined for the final loop (by a stored member built earlier) is written
                # in this pass instead: the final loop runs after every pass, so reading it here would read
                # the previous row's values (or garbage)
                self.pending[:0] = _claim_scratch(expr, scratch_stores)
                need = max((defined_at[v] for v in _kvars(expr) | _store_kvars(self.pending)), default=-1)
                # join the first pass over the row that runs after everything this reduction reads
                target = next((k for k in range(need + 1, len(phases)) if isinstance(phases[k], ReduceLoop)), None)
                if target is not None and not self._reads_scratch_of_later(expr, self.pending, phases, target):
                    phases[target].accs.append(Acc(name, m.op, expr, m.dtype))
                    phases[target].stores.extend(self.pending)
                else:
                    phases.append(ReduceLoop([Acc(name, m.op, expr, m.dtype)], list(self.pending)))
                    target = len(phases) - 1
                defined_at[name] = target
                self.rowvars[m] = KVar(name, m.dtype)
                if m in self.stored:
                    row_stores.append(RowStore(Store(self.buffer_of[m], self.o_flat, self.rowvars[m])))
            elif self.rsize and m.numel == self.group.rows and m.shape != self.group.shape:
                expr = self.define(m, unflatten(self.o_flat, m.shape))
                name = f"row{counter}"
                counter += 1
                phases.append(RowAssign(name, expr))
                defined_at[name] = len(phases) - 1
                self.rowvars[m] = KVar(name, m.dtype)
                if m in self.stored:
                    row_stores.append(RowStore(Store(self.buffer_of[m], self.o_flat, self.rowvars[m])))
            elif m in self.stored:
                if m.shape != self.group.shape:
                    raise NotFusable(m, "shape differs from the kernel's iteration space")
                self.pending = []
                value = self.value(m, self.full_index)
                full_stores.append(Store(self.buffer_of[m], linearize(self.full_index, self.strides(m)), value))
                scratch_stores.extend(self.pending)
                stored_members.append(m)
        # a stored member that went to a row scratch (another member reads it) is stored from there: the scratch
        # is written by an earlier pass or first thing in the final loop
        full_stores = [Store(st.buf, st.index, KLoad(self.scratch[m], Lin.of(Var("r", self.rsize)), m.dtype))
                       if m in self.scratch else st for m, st in zip(stored_members, full_stores)]
        phases.extend(row_stores)
        if full_stores:
            # scratch writes go first in the loop body: a later read in the same iteration sees them
            phases.append(FullLoop(scratch_stores + full_stores))
        outer = tuple(v.size for v in self.outer_vars)
        scratch = {name: n.dtype for n, name in self.scratch.items()}
        return Kernel(self.name, outer, self.rsize, phases, list(self.group.members), "; ".join(self.group.reason),
                      scratch=scratch)


def _reorder(walk: list[Lin], order: tuple[int, ...]) -> list[Lin]:
    """Logical index from loop indices that walk the dims in ``order``."""
    index: list[Lin] = [Lin(0)] * len(order)
    for k, d in enumerate(order):
        index[d] = walk[k]
    return index


def build_kernel(group: Group, name: str, buffer_of: dict[Node, str], stored: set[Node],
                 strides_of: dict[Node, tuple[int, ...]] | None = None) -> Kernel:
    """Kernel IR for ``group``.  A pointwise kernel runs as one flat loop when every index it computes is an
    affine function of the flat position (contiguous and broadcast-free access), which vectorizes best even
    when the innermost dimension is short (7x7 feature maps); otherwise it keeps one loop per dimension."""
    strides_of = strides_of or {}
    order = None
    if group.axes is None and any(m in strides_of for m in group.members):
        order = NHWC_ORDER  # walk the channels-last outputs in memory order
    if group.axes is None and len(group.shape) > 1:
        kernel = KernelBuilder(group, name, buffer_of, stored, True, strides_of, order).build()
        if not kernel.has_divmod():
            return kernel
    kernel = KernelBuilder(group, name, buffer_of, stored, False, strides_of, order).build()
    return collapse_loops(kernel) if group.axes is None else kernel
