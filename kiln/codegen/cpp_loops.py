"""C++ loops from a scheduled ``LoopNest`` (``kiln/ir/loops.py``): pragmas, bounds, and the kernel's axes.

Example: ``split(i0, 4096); parallel(i0.o, 32768); vectorize(i0.i)`` on a 10000-element pointwise kernel::

    #pragma omp parallel for schedule(static) if(10000 > 32768)
    for (int64_t i0_o = 0; i0_o < 3; ++i0_o) {
      #pragma omp simd
      for (int64_t i0_i = 0; i0_i < ((i0_o * 4096 + 4096 <= 10000) ? 4096 : 10000 - i0_o * 4096); ++i0_i) {
        const int64_t i0 = i0_o * 4096 + i0_i;
        ... body over i0 ...
"""
from __future__ import annotations

from kiln.codegen.cpp_expr import size_text
from kiln.ir.loops import Loop, LoopNest, ScheduleError, Trace
from kiln.ir.sym import Size, provably_le


def _bound(loop: Loop) -> str:
    if loop.stop is None:
        return size_text(loop.extent)
    outer, factor, n = loop.stop
    o = outer.replace(".", "_").replace("+", "_")
    n = size_text(n)
    return f"(({o} * {factor} + {factor} <= {n}) ? {factor} : {n} - {o} * {factor})"


def open_nest(nest: LoopNest, lines: list[str], work: Size, indent: str = "  ") -> str:
    """Append the loops' headers and the axis definitions; returns the body's indentation (the caller closes
    ``len(nest.loops)`` braces)."""
    par = [lp for lp in nest.loops if lp.kind == "parallel"]
    for k, loop in enumerate(nest.loops):
        if k == 0 and par:
            collapse = f" collapse({len(par)})" if len(par) > 1 else ""
            cond = f" if({size_text(work)} > {par[0].min_work})" if par[0].min_work else ""  # (at run time)
            lines.append(f"{indent}#pragma omp parallel for{collapse} schedule(static){cond}")
        if loop.kind == "vector":
            lines.append(f"{indent}#pragma omp simd")
        if loop.unroll:
            lines.append(f"{indent}#pragma GCC unroll {loop.unroll}")
        lines.append(f"{indent}for (int64_t {loop.var} = 0; {loop.var} < {_bound(loop)}; ++{loop.var}) {{")
        indent += "  "
    for var, expr in nest.defs:
        lines.append(f"{indent}const int64_t {var} = {expr};")
    return indent


def _parallel(names: list[str], min_work: int) -> Trace:
    """Threads over the loops ``names`` (outermost first; OpenMP collapses them)."""
    t = Trace()
    for name in names:
        t = t.then("parallel", name, min_work)
    return t


def default_trace(extents: tuple[int, ...], chunk: int, min_work: int) -> Trace:
    """The heuristic schedule of a pointwise kernel: threads over all but the innermost axis and SIMD over it;
    a single axis longer than ``chunk`` is split into chunks shared by the threads."""
    t = Trace()
    n = len(extents)
    if n == 0:
        return t
    if n == 1:
        if not provably_le(extents[0], chunk):  # (a symbolic extent: split into chunks, for large sizes)
            return t.then("split", "i0", chunk).then("parallel", "i0.o", min_work).then("vectorize", "i0.i")
        return t.then("vectorize", "i0")
    return _parallel([f"i{d}" for d in range(n - 1)], min_work).then("vectorize", f"i{n - 1}")


def candidate_traces(extents: tuple[int, ...], min_work: int) -> list[Trace]:
    """The rule-generated space for a pointwise kernel: chunked flat loops for one axis; for several, the
    heuristic nest, the whole space flattened into chunks (short inner axes leave SIMD loops too short), and
    the innermost axis split into unrolled vector blocks."""
    n = len(extents)
    if n == 0:
        return [Trace()]
    total = 1
    for e in extents:
        total *= e
    out: list[Trace] = []
    if n == 1:
        out = [default_trace(extents, c, min_work) for c in (1024, 4096, 16384, 65536) if c < extents[0]]
        return out or [default_trace(extents, extents[0], min_work)]
    out.append(default_trace(extents, total, min_work))
    flat = Trace()
    name = "i0"
    for d in range(1, n):
        flat = flat.then("fuse", name, f"i{d}")
        name = f"{name}+i{d}"
    for c in (4096, 16384):
        if c < total:
            out.append(flat.then("split", name, c).then("parallel", f"{name}.o", min_work)
                       .then("vectorize", f"{name}.i"))
    inner = f"i{n - 1}"
    if extents[-1] >= 64:
        rows = _parallel([f"i{d}" for d in range(n - 1)], min_work)
        out.append(rows.then("split", inner, 16).then("unroll", f"{inner}.o", 4).then("vectorize", f"{inner}.i"))
    return out


# ------------------------------------------------------------------ reductions
# A reduction kernel's nest is its rows ``o0 .. o{n-1}`` (parallel, fused, ... like a pointwise nest) around
# the reduced axis ``r``, which the writer runs itself in its phases (accumulate, then per-row epilogues):
# of ``r`` a trace may only say ``split(r, L); vectorize(r.i)``, i.e. accumulate in L vector lanes.


def reduction_trace(n_outer: int, lanes: int, min_work: int) -> Trace:
    """Threads over all rows; ``lanes`` accumulators over ``r`` (0: one vector register's worth)."""
    t = _parallel([f"o{d}" for d in range(n_outer)], min_work)
    return t.then("split", "r", lanes).then("vectorize", "r.i") if lanes else t


def split_reduction_trace(trace: Trace) -> tuple[Trace, int]:
    """(the rows' trace, accumulator lanes; 0 = the writer's default) of a reduction's trace."""
    rows = tuple(s for s in trace.steps if not str(s[1]).startswith("r"))
    on_r = [s for s in trace.steps if str(s[1]).startswith("r")]
    if not on_r:
        return Trace(rows), 0
    if len(on_r) != 2 or on_r[0][:2] != ("split", "r") or on_r[1] != ("vectorize", "r.i"):
        raise ScheduleError(f"a reduction's axis r takes only split(r, lanes); vectorize(r.i), "
                            f"not {Trace(tuple(on_r))}")
    return Trace(rows), int(on_r[0][2])
