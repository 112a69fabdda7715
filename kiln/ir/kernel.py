"""Kernel IR: what one generated kernel computes, independent of the target language.

A kernel iterates an outer domain (``outer``: loop extents, run in parallel) and, for reduction kernels, a
flat inner reduction range of ``rsize`` elements per outer point ("row").  Its body is a list of phases run
in order for each row:

- ``ReduceLoop``: one pass over the row updating accumulators (sum/prod/max/min/argmax/argmin);
- ``RowAssign``: a per-row scalar computed from accumulators (mean, rstd, ...);
- ``FullLoop``: one pass over the row storing elementwise results (the epilogue);
- ``RowStore``: one value per row stored.

Pointwise kernels have ``rsize == 0`` and a single ``FullLoop`` over ``outer``.  Values are ``KExpr`` trees
(hash-consed by structure so code generators can share subexpressions); indices are ``kiln.ir.index.Lin``.

Text form (``kiln.explain``)::

    kernel_2_softmax  outer=[512] rsize=256  covers %52 %54 %55 %56 %58
      reduce acc0 = amax(load(buf3, 256*o0 + r))
      reduce acc1 = sum(exp(load(buf3, 256*o0 + r) - acc0))
      loop   buf7[256*o0 + r] = exp(load(buf3, 256*o0 + r) - acc0) / acc1
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator, Union

import torch

from kiln.ir.graph import Node, dtype_name
from kiln.ir.index import Dyn, FloorDiv, Lin, Mod, Var, render
from kiln.ir.ops import Op
from kiln.ir.sym import Size, is_symbolic, size_hint, symbols_of


@dataclasses.dataclass(frozen=True)
class KConst:
    value: Any
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class KLoad:
    buf: str
    index: Lin
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class KIndex:
    """An index expression used as a value (iota, pad/cat bounds)."""
    index: Lin
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class KVar:
    """A per-row scalar: an accumulator or a RowAssign result."""
    name: str
    dtype: torch.dtype


@dataclasses.dataclass(frozen=True)
class KOp:
    """``op`` over ``args``.  Expressions are DAGs (a value read twice is one object, reached twice): the hash is
    computed once per node and kept, equality tries identity and the hashes first, and ``subexprs`` visits each
    node once - a tree walk is exponential in the depth of such sharing (a running maximum over a 5 x 5 window
    never finished building)."""
    op: Op
    args: tuple["KExpr", ...]
    dtype: torch.dtype

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((self.op, self.args, self.dtype))
            object.__setattr__(self, "_hash", h)
        return h

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, KOp) or hash(self) != hash(other):
            return False
        return _dag_equal(self, other)

    def __getstate__(self) -> dict:
        # (the kept hash is this process's: string hashing differs between processes)
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


KExpr = Union[KConst, KLoad, KIndex, KVar, KOp]


def _dag_equal(a: KOp, b: KOp) -> bool:
    """Structural equality of two expression DAGs, each pair of nodes compared once (two separately built copies
    of a DAG with shared nodes would otherwise be compared path by path)."""
    stack, seen = [(a, b)], set()
    while stack:
        x, y = stack.pop()
        if x is y or (id(x), id(y)) in seen:
            continue
        seen.add((id(x), id(y)))
        if isinstance(x, KOp) and isinstance(y, KOp):
            if x.op != y.op or x.dtype != y.dtype or len(x.args) != len(y.args) or hash(x) != hash(y):
                return False
            stack.extend(zip(x.args, y.args))
        elif x != y:  # (leaves; a gather index inside a load compares its own expressions the same way)
            return False
    return True


@dataclasses.dataclass
class Acc:
    name: str
    kind: Op            # SUM, PROD, AMAX, AMIN, ARGMAX, ARGMIN
    value: KExpr        # element value over the row (uses the reduction variable)
    dtype: torch.dtype  # accumulator/result dtype


@dataclasses.dataclass
class Store:
    buf: str
    index: Lin
    value: KExpr


@dataclasses.dataclass
class ReduceLoop:
    accs: list[Acc]
    stores: list[Store] = dataclasses.field(default_factory=list)  # row-scratch writes (see Kernel.scratch)


@dataclasses.dataclass
class RowAssign:
    name: str
    value: KExpr


@dataclasses.dataclass
class FullLoop:
    """An elementwise pass.  [Note: old values loaded first] ``old_values``: buffers this pass stores that its
    values read as they were before the pass (inputs updated in place, schedule/write_back.py): every code
    generator loads them for an element before it stores any of that element's values, so the stores may come in
    any order - SGD's parameter update reads the old momentum while the momentum's reads the old parameter.  Any
    other buffer a pass stores and loads is read after its store (a value stored, then read back)."""
    stores: list[Store]
    old_values: frozenset[str] = frozenset()

    def old_value_loads(self) -> list[KLoad]:
        """The loads of ``old_values`` in the stores' values, each once, to be emitted before any store."""
        found: dict[KLoad, None] = {}
        if self.old_values:
            for st in self.stores:
                for x in subexprs(st.value):
                    if isinstance(x, KLoad) and x.buf in self.old_values:
                        found[x] = None
        return list(found)


@dataclasses.dataclass
class RowStore:
    store: Store


Phase = Union[ReduceLoop, RowAssign, FullLoop, RowStore]


@dataclasses.dataclass
class Kernel:
    name: str
    outer: tuple[Size, ...]     # extents of the outer loop variables o0, o1, ... (pointwise: the store shape)
    rsize: Size                 # reduction extent per row (0 for pointwise kernels; may be a size expression)
    phases: list[Phase]
    nodes: list[Node]           # graph nodes this kernel computes (stored or inlined)
    reason: str = ""            # why these nodes were fused
    schedule: Any = None        # codegen schedule (kiln.schedule), filled in by heuristics
    # per-row scratch arrays (name -> dtype): an expensive value computed in one pass over the row and
    # read back by later passes instead of being recomputed
    scratch: dict[str, torch.dtype] = dataclasses.field(default_factory=dict)

    @property
    def is_reduction(self) -> bool:
        return type(self.rsize) is not int or self.rsize > 0  # (a symbolic extent: built as a reduction)

    def indices(self) -> Iterator[Lin]:
        """Every index expression the kernel evaluates: of loads, index values and stores."""
        for p in self.phases:
            yield from phase_indices(p)

    def freeze_buffers(self) -> None:
        """Remember ``buffers()`` from now on: for a kernel that no longer changes (a symbolic graph's kernels,
        planned again for every size: ``schedule/specialize.py``)."""
        found = self.buffers()
        self.__dict__["_frozen_buffers"] = found

    def buffers(self) -> tuple[set[str], set[str]]:
        """(buffers read, buffers written); row scratch arrays are not buffers."""
        frozen = self.__dict__.get("_frozen_buffers")
        if frozen is not None:
            return set(frozen[0]), set(frozen[1])
        reads = {x.buf for p in self.phases for e in phase_exprs(p) for x in subexprs(e) if isinstance(x, KLoad)}
        for p in self.phases:
            for st in phase_stores(p):
                reads |= {y.buf for x in index_exprs(st.index) for y in subexprs(x) if isinstance(y, KLoad)}
        writes = {st.buf for p in self.phases for st in phase_stores(p)}
        return reads - set(self.scratch), writes - set(self.scratch)

    def arithmetic_ops(self) -> float:
        """Arithmetic operations the kernel performs in all (an estimate for kiln.profile's FLOPs): each op node
        once per element of its phase - per row and reduction step in row loops, per row in row phases."""
        rows = float(math.prod(size_hint(n) for n in self.outer))  # (symbolic extents at their traced sizes)
        total = 0.0
        for p in self.phases:
            ops = sum(1 for e in phase_exprs(p) for x in subexprs(e) if isinstance(x, KOp))
            total += ops * rows * (max(size_hint(self.rsize), 1) if isinstance(p, (ReduceLoop, FullLoop)) else 1)
        return total

    def symbols(self) -> set[Any]:
        """The size symbols the kernel reads (``sym.Symbol``): in its extents, indices and constants.  Empty for a
        kernel of a static graph; a symbolic kernel reads them from the call's size table at run time."""
        found = set(symbols_of(self.rsize))
        for n in self.outer:
            found |= symbols_of(n)
        for index in self.indices():
            if index.is_symbolic():
                found |= _index_symbols(index)
        for p in self.phases:
            for e in phase_exprs(p):
                for x in subexprs(e):
                    if isinstance(x, KConst) and is_symbolic(x.value):
                        found |= symbols_of(x.value)
        return found

    def is_symbolic(self) -> bool:
        return bool(self.symbols())

    def has_divmod(self) -> bool:
        """Does any index (load, store or index value) still contain a floor division or modulo?"""
        return any(isinstance(atom, (FloorDiv, Mod)) for index in self.indices() for atom in index_atoms(index))

    def format(self) -> str:
        head = f"{self.name}  outer={list(self.outer)}" + (f" rsize={self.rsize}" if self.rsize else "")
        lines = [head]
        for p in self.phases:
            if isinstance(p, ReduceLoop):
                for a in p.accs:
                    lines.append(f"  reduce {a.name} = {a.kind.value}({format_expr(a.value)})")
                for s in p.stores:
                    lines.append(f"  keep   {s.buf}[{s.index}] = {format_expr(s.value)}")
            elif isinstance(p, RowAssign):
                lines.append(f"  row    {p.name} = {format_expr(p.value)}")
            elif isinstance(p, FullLoop):
                for s in p.stores:
                    lines.append(f"  loop   {s.buf}[{s.index}] = {format_expr(s.value)}")
            else:
                s = p.store
                lines.append(f"  rowout {s.buf}[{s.index}] = {format_expr(s.value)}")
        return "\n".join(lines)


def phase_exprs(p: Phase) -> list[KExpr]:
    if isinstance(p, ReduceLoop):
        return [a.value for a in p.accs] + [s.value for s in p.stores]
    if isinstance(p, RowAssign):
        return [p.value]
    if isinstance(p, FullLoop):
        return [s.value for s in p.stores]
    return [p.store.value]


def phase_indices(p: Phase) -> Iterator[Lin]:
    """Every index expression one phase evaluates: of loads, index values and stores (with their gathers')."""
    for e in phase_exprs(p):
        for x in subexprs(e):
            if isinstance(x, (KLoad, KIndex)):
                yield x.index
    for st in phase_stores(p):
        yield st.index
        for x in index_exprs(st.index):
            for y in subexprs(x):
                if isinstance(y, (KLoad, KIndex)):
                    yield y.index


def phase_stores(p: Phase) -> list[Store]:
    if isinstance(p, (FullLoop, ReduceLoop)):
        return p.stores
    if isinstance(p, RowStore):
        return [p.store]
    return []


def _index_symbols(index: Lin) -> set[Any]:
    found = set(symbols_of(index.const))
    for a, c in index.terms:
        found |= symbols_of(c)
        if isinstance(a, (FloorDiv, Mod)):
            found |= symbols_of(a.k) | _index_symbols(a.arg)
        elif isinstance(a, (Var, Dyn)):
            found |= symbols_of(a.size)
    return found


def index_atoms(index: Lin) -> Iterator[Any]:
    """All atoms of an index expression, including those nested in floor-div/mod arguments."""
    for atom in index.atoms():
        yield atom
        if isinstance(atom, (FloorDiv, Mod)):
            yield from index_atoms(atom.arg)


def index_exprs(index: Lin) -> list[KExpr]:
    """The run-time values an index reads (the index operands of gathers)."""
    return [atom.expr for atom in index_atoms(index) if isinstance(atom, Dyn)]


def subexprs(e: KExpr) -> Iterator[KExpr]:
    """``e`` and every expression inside it, including those inside gather indices - each node once (a node
    reached along several paths of the DAG is not visited again)."""
    stack = [e]
    seen: set[int] = set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        if isinstance(x, KOp):
            stack.extend(x.args)
        elif isinstance(x, (KLoad, KIndex)):
            stack.extend(index_exprs(x.index))


def format_expr(e: KExpr) -> str:
    if isinstance(e, KConst):
        return repr(e.value)
    if isinstance(e, KLoad):
        return f"{e.buf}[{render(e.index, lambda d: format_expr(d.expr))}]"
    if isinstance(e, KIndex):
        return f"index({render(e.index, lambda d: format_expr(d.expr))})"
    if isinstance(e, KVar):
        return e.name
    if e.op is Op.CAST:
        return f"{dtype_name(e.dtype)}({format_expr(e.args[0])})"
    return f"{e.op.value}({', '.join(format_expr(a) for a in e.args)})"


def map_expr_indices(e: KExpr, fn: Callable[[Lin], Lin], memo: dict[KExpr, KExpr]) -> KExpr:
    """``e`` with ``fn`` applied to every index inside it (loads, index values, gather indices)."""
    if e in memo:
        return memo[e]
    if isinstance(e, KOp):
        out: KExpr = KOp(e.op, tuple(map_expr_indices(a, fn, memo) for a in e.args), e.dtype)
    elif isinstance(e, KLoad):
        out = KLoad(e.buf, _map_index(e.index, fn, memo), e.dtype)
    elif isinstance(e, KIndex):
        out = KIndex(_map_index(e.index, fn, memo), e.dtype)
    else:
        out = e
    memo[e] = out
    return out


def _map_index(index: Lin, fn: Callable[[Lin], Lin], memo: dict[KExpr, KExpr]) -> Lin:
    """Apply ``fn`` to ``index`` after mapping the expressions of its gather atoms."""
    if any(isinstance(a, Dyn) for a in index_atoms(index)):
        mapping = {a: Dyn(map_expr_indices(a.expr, fn, memo), a.size) for a in index_atoms(index)
                   if isinstance(a, Dyn)}
        index = _replace_dyn(index, mapping)
    return fn(index)


def _replace_dyn(index: Lin, mapping: dict[Dyn, Dyn]) -> Lin:
    out = Lin(index.const)
    for a, c in index.terms:
        if isinstance(a, Dyn):
            out = out + Lin.of(mapping[a]) * c
        elif isinstance(a, (FloorDiv, Mod)):
            inner = _replace_dyn(a.arg, mapping)
            out = out + (inner.floordiv(a.k) if isinstance(a, FloorDiv) else inner.mod(a.k)) * c
        else:
            out = out + Lin.of(a) * c
    return out


def map_phases(kernel: Kernel, value: Callable[[KExpr], KExpr],
               store_index: Callable[[Lin], Lin] = lambda i: i) -> list[Phase]:
    """``kernel``'s phases rebuilt with ``value`` applied to every expression (accumulators, row values, stored
    values) and ``store_index`` to every store's index."""
    def store(s: Store) -> Store:
        return Store(s.buf, store_index(s.index), value(s.value))

    phases: list[Phase] = []
    for p in kernel.phases:
        if isinstance(p, ReduceLoop):
            accs = [Acc(a.name, a.kind, value(a.value), a.dtype) for a in p.accs]
            phases.append(ReduceLoop(accs, [store(s) for s in p.stores]))
        elif isinstance(p, RowAssign):
            phases.append(RowAssign(p.name, value(p.value)))
        elif isinstance(p, FullLoop):
            phases.append(FullLoop([store(s) for s in p.stores], p.old_values))
        else:
            phases.append(RowStore(store(p.store)))
    return phases


def map_indices(kernel: Kernel, fn: Callable[[Lin], Lin]) -> Kernel:
    """A copy of ``kernel`` with ``fn`` applied to every index expression (loads, stores, index values)."""
    memo: dict[KExpr, KExpr] = {}
    phases = map_phases(kernel, lambda e: map_expr_indices(e, fn, memo), lambda i: _map_index(i, fn, memo))
    return dataclasses.replace(kernel, phases=phases)
