"""Column reductions: rows side by side in memory, reduced elements far apart, so the vector runs across rows.

[Note: column reduction] A reduction over a dimension that is not the innermost one - the mean over the heads
of attention weights ``[B, H, L, S] -> [B, L, S]``, a norm over the channels of an NCHW tensor, a sum over the
tokens of ``[T, C]`` - has rows (output elements) that are consecutive in memory and, within a row, elements a
whole stride apart.  The row-by-row writer accumulates each row on its own: the loads along ``r`` are strided
(gathers or scalar), and a row of 8 heads is one scalar chain.  Here the innermost row axis ``oK`` is split
into blocks of ``VW`` rows (up to four vectors: independent accumulation chains) that run as vector lanes, and
``r`` is the loop around them::

    kernel_3_sum_div  outer=[1, 64, 69] rsize=8          for o0, o1 (threads), for c0 in 0, 64 (< 69):
      reduce acc0 = sum(buf16[69*o1 + o2 + 4416*r])         c = c0 + 64 <= 69 ? c0 : 69 - 64
      row    row1 = div(acc0, 8.0)                          for r < 8:  simd for l < 64 (o2 = c + l):
      rowout buf19[69*o1 + o2] = row1                           acc0_c[l] += buf16[69*o1 + o2 + 4416*r]
                                                            simd for l < 64: buf19[69*o1 + o2] = acc0_c[l] / 8

Adjacent row loops that every access walks as one run are merged first (``ir/loop_collapse.collapse_rows``:
an NCHW tensor's channel statistics have rows ``[N, H * W]``, not ``[N, H, W]`` with 7-wide runs).
A last block shorter than ``VW`` overlaps the one before it (starts at ``N - VW``): its rows are computed and
stored twice with the same values, which costs less than a scalar remainder.  Per-row values (accumulators,
``RowAssign`` results) live in arrays of ``VW`` lanes; each lane loop reads those it needs as scalars.  Each
row is summed in order along ``r`` (the row-wise writer's lanes reassociate it instead): a difference in
rounding only.

Used when every load of the accumulated values walks the rows contiguously (coefficient 1 on ``oK``, or 0: a
broadcast) and at least one walks ``r`` with a stride other than 1, with nothing but accumulations, per-row
values, per-row stores and elementwise passes over the row that store along the rows (a LayerNorm over NCHW
channels) in the kernel: no row scratch, no arg-reductions.

[Note: a column reduction's elementwise output] A row scratch holds a value the reduction loop computes and a
later pass over the row stores (GELU's backward and the bias gradient summed from it: ``scr0[r] = g * gelu'(x)``,
``acc += scr0[r]``, then ``out[r] = scr0[r]``).  Where that pass is the kernel's last and stores nothing that
depends on the row's results, its stores move into the reduction loop and the scratch goes
(``_stores_in_reduce_loop``): the column writer then computes the value once per element, stores it and
accumulates it in the same lanes.  (A bias gradient of ``[32, 1024]``: 0.18 -> ~0.01 ms on one core; it was a
gather along ``r`` per element.)  In-place writes stay valid: the moved store was the last, and nothing after it
reads along ``r``.
"""
from __future__ import annotations

import dataclasses

from kiln.codegen.cpp_expr import (ExprPrinter, combine_text, identity_literal, rounded, to_memory, value_type,
                                   vector_lanes)
from kiln.ir.loop_collapse import collapse_rows
from kiln.ir.index import Lin, Var
from kiln.ir.kernel import (Acc, FullLoop, Kernel, KExpr, KLoad, KOp, KVar, ReduceLoop, RowAssign, RowStore, Store,
                            index_exprs, subexprs)
from kiln.ir.ops import HALF, Op, compute_dtype, numel

_COLUMN_KINDS = (Op.SUM, Op.PROD, Op.AMAX, Op.AMIN)
# [Note: column sums folded in blocks] Each column is one chain of additions along ``r``: a bias gradient summed
# over 400,000 tokens came out 2.3e-5 from the float64 sum where ATen's is 4.5e-7.  Over more than COLUMN_FOLD
# rows the lanes fold into a second set every COLUMN_FOLD rows (as the row writer's [Note: sums folded in
# blocks]), so no chain is longer than COLUMN_FOLD + rsize / COLUMN_FOLD adds.
COLUMN_FOLD = 512


def _row_var(kernel: Kernel) -> Var:
    return Var(f"o{len(kernel.outer) - 1}", kernel.outer[-1])


def _loads(e: KExpr) -> list[KLoad]:
    return [x for x in subexprs(e) if isinstance(x, KLoad)]


def _has_gather(index: Lin) -> bool:
    return bool(index_exprs(index))


BLOCK_VECTORS = 4  # vectors of rows per block: independent accumulation chains (1024 x 768 -> 768 sums:
#                   one vector 93 us, two 81, four 74 on one AVX-512 core; eager 55 of them)


def column_lanes(kernel: Kernel, vector_width: int) -> int:
    """The rows per block (up to ``BLOCK_VECTORS`` vectors of ``vector_width``) if ``kernel`` is a column
    reduction ([Note: column reduction]) with at least a vector's worth of rows side by side, else 0 (the
    row-by-row writer)."""
    if not kernel.is_reduction or kernel.rsize < 2 or not kernel.outer or kernel.outer[-1] < vector_width:
        return 0
    if kernel.scratch or vector_width < 2:
        return 0
    row, red = _row_var(kernel), Var("r", kernel.rsize)
    strided = False
    for phase in kernel.phases:
        if isinstance(phase, ReduceLoop):
            if any(a.kind not in _COLUMN_KINDS for a in phase.accs) or not _column_stores(phase.stores, row):
                return 0
            for a in phase.accs:
                for load in _loads(a.value):
                    if _has_gather(load.index) or load.index.coefficient(row) not in (0, 1):
                        return 0
                    if load.index.coefficient(red) == 1 and load.index.coefficient(row) != 0:
                        return 0  # contiguous along the row: the row-wise writer's vectors are better
                    # (a value per ``r`` that every row reads - a LayerNorm backward's per-token mean and rstd in
                    # its weight gradient's column sums - is one broadcast per ``r`` here)
                    strided |= load.index.coefficient(row) == 1 and load.index.coefficient(red) != 0
        elif isinstance(phase, RowStore):
            if phase.store.index.coefficient(row) != 1 or _has_gather(phase.store.index):
                return 0
        elif isinstance(phase, FullLoop):
            if not _column_stores(phase.stores, row):
                return 0
        elif not isinstance(phase, RowAssign):
            return 0
    return vector_width * min(BLOCK_VECTORS, kernel.outer[-1] // vector_width) if strided else 0


def _column_stores(stores: list[Store], row: Var) -> bool:
    """Do these elementwise stores walk the rows contiguously, from loads that do too (or broadcast)?"""
    for st in stores:
        if st.index.coefficient(row) != 1 or _has_gather(st.index):
            return False
        if any(_has_gather(ld.index) or ld.index.coefficient(row) not in (0, 1) for ld in _loads(st.value)):
            return False
    return True


def _stores_in_reduce_loop(kernel: Kernel) -> Kernel | None:
    """``kernel`` without its row scratch, the last pass's stores moved into the reduction loop ([Note: a column
    reduction's elementwise output]); ``kernel`` itself if it has no scratch; None where the move does not apply
    (several reduction loops or passes, a scratch value the last pass does not take, a stored value that depends
    on the row's results)."""
    if not kernel.scratch:
        return kernel
    phases = kernel.phases
    reduce_at = [i for i, p in enumerate(phases) if isinstance(p, ReduceLoop)]
    passes = [i for i, p in enumerate(phases) if isinstance(p, FullLoop)]
    if len(reduce_at) != 1 or passes != [len(phases) - 1]:
        return None
    loop, last = phases[reduce_at[0]], phases[-1]
    assert isinstance(loop, ReduceLoop) and isinstance(last, FullLoop)
    values = {st.buf: st.value for st in loop.stores}
    if set(values) != set(kernel.scratch) or any(st.buf in kernel.scratch for st in last.stores):
        return None
    memo: dict[KExpr, KExpr] = {}

    def inlined(e: KExpr) -> KExpr:
        if e not in memo:
            if isinstance(e, KLoad) and e.buf in values:
                memo[e] = inlined(values[e.buf])
            elif isinstance(e, KOp):
                memo[e] = KOp(e.op, tuple(inlined(a) for a in e.args), e.dtype)
            else:
                memo[e] = e
        return memo[e]
    stores = [Store(st.buf, st.index, inlined(st.value)) for st in last.stores]
    accs = [Acc(a.name, a.kind, inlined(a.value), a.dtype) for a in loop.accs]
    exprs = [st.value for st in stores] + [a.value for a in accs]
    for x in (y for e in exprs for y in subexprs(e)):
        if isinstance(x, KVar) or (isinstance(x, KLoad) and x.buf in values):
            return None  # a row result (computed after the loop) or a scratch read inside an index
    moved = phases[:reduce_at[0]] + [ReduceLoop(accs, stores)] + phases[reduce_at[0] + 1:-1]
    return dataclasses.replace(kernel, phases=moved, scratch={})


def column_plan(kernel: Kernel) -> tuple[Kernel, int] | None:
    """(the kernel with its row loops merged, rows per block) where the column writer takes ``kernel``, else None:
    what the C++ writer and the schedule tuner both ask."""
    accs = [a for p in kernel.phases if isinstance(p, ReduceLoop) for a in p.accs]
    if not accs:
        return None
    without_scratch = _stores_in_reduce_loop(kernel)
    if without_scratch is None:
        return None
    merged = collapse_rows(without_scratch)
    vw = column_lanes(merged, min(vector_lanes(compute_dtype(a.value.dtype)) for a in accs))
    return (merged, vw) if vw else None


def write_columns(kernel: Kernel, vw: int, lines: list[str], parallel_min_work: int) -> None:
    """The C++ loops of a column reduction (``column_plan``'s kernel and block), appended to ``lines``."""
    n = kernel.outer[-1]
    row = _row_var(kernel).name
    par = len(kernel.outer)  # the rows but the last, and the blocks of the last
    collapse = f" collapse({par})" if par > 1 else ""
    lines.append(f"  #pragma omp parallel for{collapse} schedule(static) "
                 f"if({numel(kernel.outer) * kernel.rsize} > {parallel_min_work})")
    indent = "  "
    for d, size in enumerate(kernel.outer[:-1]):
        lines.append(f"{indent}for (int64_t o{d} = 0; o{d} < {size}; ++o{d}) {{")
        indent += "  "
    lines.append(f"{indent}for (int64_t c0 = 0; c0 < {n}; c0 += {vw}) {{")
    indent += "  "
    # [Note: no overlap where the kernel may write in place] A pass over the row that stores elementwise may
    # store over its own input (runtime/inplace.py): a block overlapping the previous one would then re-read
    # rows already overwritten.  Such a kernel's last block masks its lanes past the end instead.
    guarded = n % vw != 0 and any(isinstance(p, FullLoop) or (isinstance(p, ReduceLoop) and p.stores)
                                  for p in kernel.phases)
    if guarded:
        lines.append(f"{indent}const int64_t c = c0, live = {n} - c0 < {vw} ? {n} - c0 : {vw};  // lanes in rows")
    else:
        lines.append(f"{indent}const int64_t c = c0 + {vw} <= {n} ? c0 : {n - vw};  // the last block overlaps")
    defined: list[tuple[str, str]] = []  # (per-row value, its C++ type), in order

    def lanes(at: str, body, over_r: bool, r_range: tuple[str, str] = ("0", str(kernel.rsize))) -> None:
        """A loop over the block's lanes (row ``c + l``; inside one over ``r`` in ``r_range`` if ``over_r``), the
        per-row values so far read as scalars, then ``body(printer, indentation)``."""
        if over_r:
            lines.append(f"{at}for (int64_t r = {r_range[0]}; r < {r_range[1]}; ++r) {{")
        inner = at + "  " if over_r else at
        lines.append(f"{inner}#pragma omp simd")
        lines.append(f"{inner}for (int64_t l = 0; l < {vw}; ++l) {{")
        ind = inner + "  "
        if guarded:
            lines.append(f"{ind}if (l < live) {{")
            ind += "  "
        lines.append(f"{ind}const int64_t {row} = c + l;")
        for name, t in defined:
            lines.append(f"{ind}const {t} {name} = {name}_c[l];")
        body(ExprPrinter(lines, ind), ind)
        if guarded:
            lines.append(f"{inner}  }}")
        lines.append(f"{inner}}}")
        if over_r:
            lines.append(f"{at}}}")

    def stores(items):
        def body(p: ExprPrinter, ind: str) -> None:
            for st in items:
                lines.append(f"{ind}{st.buf}[{p.index(st.index)}] = {to_memory(p.expr(st.value), st.value.dtype)};")
        return body

    for phase in kernel.phases:
        if isinstance(phase, ReduceLoop):
            for a in phase.accs:
                t = value_type(compute_dtype(a.dtype))
                lines.append(f"{indent}{t} {a.name}_c[{vw}];")
                lines.append(f"{indent}for (int l = 0; l < {vw}; ++l) {a.name}_c[l] = "
                             f"{identity_literal(a.kind, a.dtype)};")

            def accumulate(p: ExprPrinter, ind: str, accs=phase.accs, loop_stores=phase.stores) -> None:
                stores(loop_stores)(p, ind)  # (elementwise outputs computed in the loop: the note above)
                for a in accs:
                    v = p.expr(a.value)
                    if compute_dtype(a.dtype) != compute_dtype(a.value.dtype):
                        v = f"static_cast<{value_type(compute_dtype(a.dtype))}>({v})"
                    lines.append(f"{ind}{a.name}_c[l] = {combine_text(a.kind, f'{a.name}_c[l]', v, a.dtype)};")
            folded = [a for a in phase.accs if a.kind is Op.SUM and compute_dtype(a.dtype).is_floating_point] \
                if kernel.rsize > COLUMN_FOLD else []
            if folded:  # ([Note: column sums folded in blocks])
                for a in folded:
                    lines.append(f"{indent}{value_type(compute_dtype(a.dtype))} {a.name}_h[{vw}] = {{}};")
                lines.append(f"{indent}for (int64_t rb = 0; rb < {kernel.rsize}; rb += {COLUMN_FOLD}) {{")
                lanes(indent + "  ", accumulate, over_r=True,
                      r_range=("rb", f"(rb + {COLUMN_FOLD} < {kernel.rsize} ? rb + {COLUMN_FOLD} : {kernel.rsize})"))
                for a in folded:
                    lines.append(f"{indent}  for (int l = 0; l < {vw}; ++l) {{ {a.name}_h[l] += {a.name}_c[l]; "
                                 f"{a.name}_c[l] = 0; }}")
                lines.append(f"{indent}}}")
                for a in folded:
                    lines.append(f"{indent}for (int l = 0; l < {vw}; ++l) {a.name}_c[l] = {a.name}_h[l];")
            else:
                lanes(indent, accumulate, over_r=True)
            for a in phase.accs:
                if a.dtype in HALF:  # the accumulator rounded once, as ATen's result is
                    lines.append(f"{indent}for (int l = 0; l < {vw}; ++l) "
                                 f"{a.name}_c[l] = {rounded(a.name + '_c[l]', a.dtype)};")
                defined.append((a.name, value_type(compute_dtype(a.dtype))))
        elif isinstance(phase, RowAssign):
            t = value_type(phase.value.dtype)
            lines.append(f"{indent}{t} {phase.name}_c[{vw}];")
            lanes(indent, lambda p, ind, ph=phase: lines.append(f"{ind}{ph.name}_c[l] = {p.expr(ph.value)};"),
                  over_r=False)
            defined.append((phase.name, t))
        elif isinstance(phase, FullLoop):
            lanes(indent, stores(phase.stores), over_r=True)
        else:
            assert isinstance(phase, RowStore)
            lanes(indent, stores([phase.store]), over_r=False)
    for depth in range(len(kernel.outer), 0, -1):
        lines.append("  " * depth + "}")

