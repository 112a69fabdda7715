"""C++ for a pointwise kernel whose innermost loop is split by index-range conditions (``ir/index_split.py``).

    for outer loops (parallel):
      if (<every condition on outer variables holds>) {
        for v in segment 1 (simd):  body specialized to segment 1's known conditions
        for v in segment 2 (simd):  ...
      } else {
        for v in [0, n) (simd):     the general body
      }
"""
from __future__ import annotations

from kiln.codegen.cpp_expr import ExprPrinter, to_memory
from kiln.ir.index import Var
from kiln.ir.index_split import Segment, conditions, inner_segments, is_static, specialize
from kiln.ir.kernel import FullLoop, KExpr, KOp, Kernel


def split_plan(k: Kernel) -> tuple[list[Segment], list[KOp]] | None:
    """(segments of the innermost loop, conditions on outer loops only), or None when splitting gains nothing."""
    if k.is_reduction or not k.outer or not all(isinstance(p, FullLoop) for p in k.phases):
        return None
    conds = conditions([s.value for p in k.phases for s in p.stores])
    if not conds:
        return None
    # (with symbolic sizes: the innermost loop and the conditions on it must be static - their segments' bounds
    # are integers; conditions on outer loops alone may hold sizes: pooling windows over a symbolic height)
    if not isinstance(k.outer[-1], int):
        return None
    v = Var(f"i{len(k.outer) - 1}", k.outer[-1])
    outer_only = [c for c in conds if c.args[0].index.coefficient(v) == 0]
    if any(not is_static(c) for c in conds if c not in outer_only):
        return None
    segs = inner_segments(conds, v)
    if not outer_only and all(not s.facts for s in segs):
        return None
    return segs, outer_only


def write_split(k: Kernel, segs: list[Segment], outer_only: list[KOp], lines: list[str], indent: str) -> None:
    """Emit the innermost loop(s) at ``indent`` (inside the already opened outer loops)."""
    v = f"i{len(k.outer) - 1}"
    if outer_only:
        guard = ExprPrinter(lines, indent)
        test = " && ".join(guard.expr(c) for c in outer_only)
        lines.append(f"{indent}if ({test}) {{")
        fixed = {c: True for c in outer_only}
        for seg in segs:
            _loop(k, {**seg.facts, **fixed}, seg.lo, seg.hi, v, lines, indent + "  ", guard)
        lines.append(f"{indent}}} else {{")
        _loop(k, {}, 0, k.outer[-1], v, lines, indent + "  ", guard)
        lines.append(f"{indent}}}")
        return
    for seg in segs:
        _loop(k, seg.facts, seg.lo, seg.hi, v, lines, indent, ExprPrinter(lines, indent))


def _loop(k: Kernel, facts: dict[KOp, bool], lo: int, hi: int, v: str, lines: list[str], indent: str,
          outer: ExprPrinter) -> None:
    lines.append(f"{indent}#pragma omp simd")
    lines.append(f"{indent}for (int64_t {v} = {lo}; {v} < {hi}; ++{v}) {{")
    body = outer.child(lines, indent + "  ")
    memo: dict[KExpr, KExpr] = {}
    for p in k.phases:
        for load in p.old_value_loads():  # ([Note: old values loaded first])
            body.expr(specialize(load, facts, memo))
        for s in p.stores:
            value = body.expr(specialize(s.value, facts, memo))
            lines.append(f"{indent}  {s.buf}[{body.index(s.index)}] = {to_memory(value, s.value.dtype)};")
    lines.append(f"{indent}}}")
