"""C++17 + OpenMP code generation: one translation unit per graph.

Layout of the unit: the vector-math prelude, small helpers, one ``static void kernel_N_name(void** b)`` per
kernel (named after the ops it fuses, with a comment listing the graph nodes it covers), and one
``extern "C" void kiln_segment_K(void** b)`` per run of kernels between two extern calls that go through Python
(kiln's own library ops are called from the segments: ``runtime/native.py``), each with a twin
``kiln_segment_K_timed(void** b, double* t)`` that notes the time after every entry (``kiln.profile``).  ``b`` is
the runtime's table of buffer pointers.

Loops: outer (row) loops run in parallel with OpenMP; the innermost loop of a pointwise kernel and every
per-row elementwise loop carry ``#pragma omp simd``; reductions accumulate into ``VW`` independent lanes so
GCC emits vector code without ``-ffast-math`` (the order of the sum differs from a sequential loop only by
rounding).
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.codegen.cpp_schedule import CppSchedule, default_schedule
from kiln.codegen.cpp_loops import open_nest, split_reduction_trace
from kiln.codegen.cpp_split import split_plan, write_split
from kiln.codegen.cpp_tile import write_tiled
from kiln.ir.tiling import plan_tiles
from kiln.codegen.cpp_expr import (HELPERS, ExprPrinter, combine_text as _combine, ctype, identity_literal as _init,
                                   rounded, size_text, to_memory, value_type, vector_lanes as lanes)
from kiln.codegen.cpp_columns import column_plan, write_columns
from kiln.ir.index import Dyn, FloorDiv, Lin, Mod, Var
from kiln.ir.kernel import (Acc, FullLoop, Kernel, ReduceLoop, RowAssign, RowStore, Store, index_atoms,
                             map_expr_indices, phase_indices)
from kiln.ir.loops import LoopNest
from kiln.ir.ops import HALF, Op, compute_dtype, numel

MAX_THREADS = 256  # slots for per-thread partial results of a split reduction
OVERLAP_MIN_REMAINDER = 4  # a row remainder this long runs as one overlapped vector ([Note: overlapped remainder])


# [Note: sums folded in blocks] A lane accumulates every VW-th element of its row: over a BatchNorm's N*H*W of a
# million elements each of 16 lanes added 65536 values in one float chain, and the result lost ~20x the accuracy
# of ATen's (cascade sums: BatchNorm's weight gradient 2.7e-3 from the float64 result where eager's is 1.1e-4).
# Rows that may be longer than FOLD elements fold their lanes into a second set every FOLD elements, so no float
# chain is longer than FOLD / VW + rsize / FOLD adds (256 + 256 for a million).  Only sums (products, maxima
# and arg-reductions do not grow an error this way); rows known to be short keep the one set of lanes.
FOLD = 4096


def acc_type(dtype: torch.dtype) -> str:
    """The C++ type a reduction accumulates a ``dtype`` result in (float for half precision, as ATen does)."""
    return value_type(dtype)


def _round_half_accs(phase: ReduceLoop, lines: list[str], indent: str) -> None:
    """A half-precision reduction's value is its float accumulator rounded once, as ATen's result is."""
    for a in phase.accs:
        if a.dtype in HALF:
            lines.append(f"{indent}{a.name} = {rounded(a.name, a.dtype)};")


def blocked_r(phase: ReduceLoop | FullLoop, rsize: Any, vw: int) -> ReduceLoop | FullLoop | None:
    """[Note: reduction index blocked by the vector] ``phase`` with ``r`` written as ``vw*rb + l`` (block ``rb``,
    lane ``l``), for a vector loop whose blocks start at multiples of ``vw`` - or None where that changes nothing.

    A reduction over several dims of a view reaches the loop as one ``r`` unflattened by division: BatchNorm's
    training statistics over an NCHW tensor ``[4, 64, 48, 48]`` read ``147456*(r / 2304) + 48*((r / 48) % 48) +
    r % 48 + 2304*o0``, a division and a remainder per element and per lane (a gather: 4 % of the memory bound,
    4.1 ms where the data takes 0.17).  Where every divisor is a multiple of ``vw``, a block never crosses a
    boundary, and the simplifier proves it: the index becomes ``147456*(rb / 144) + 48*((rb / 3) % 48) +
    16*(rb % 3) + l + 2304*o0`` - the block's part once, then contiguous lanes.  Only where no division is left
    on ``l`` (and no gather: its index stays as it is)."""
    if type(rsize) is not int or rsize < vw or vw < 2:
        return None
    r = Var("r", rsize)
    indices = list(phase_indices(phase))
    atoms = [a for i in indices for a in index_atoms(i)]
    if any(isinstance(a, Dyn) for a in atoms) or not any(
            isinstance(a, (FloorDiv, Mod)) and r in set(index_atoms(a.arg)) for a in atoms):
        return None
    lane = Var("l", vw)
    into = {r: Lin.of(Var("rb", rsize // vw)) * vw + Lin.of(lane)}
    if any(_divides(lane, i.substitute(into)) for i in indices):
        return None
    return _substituted(phase, into)


def runs_r(phase: ReduceLoop | FullLoop, rsize: Any, vw: int) -> tuple[int, ReduceLoop | FullLoop] | None:
    """[Note: reduction rows in runs] ``(K, phase)`` with ``r`` written as ``K*ro + ri`` - runs of ``K``
    contiguous elements - where blocks of the vector width cannot be used, or None.

    BatchNorm's statistics over an NCHW tensor whose planes are not a multiple of the vector ([4, 256, 6, 6],
    ResNet's last stages) read ``147456*(r / 36) + r % 36 + 36*o0``: blocks of 16 would cross plane boundaries
    (``blocked_r`` gives up) and every lane computed a division, a remainder and a gather (6 % of the memory
    bound).  Split at the plane, the index is ``147456*ro + ri + 36*o0``: per plane, whole vectors over ``ri``
    and one partial (masked) vector for the last ``K % vw`` - lanes are independent partial sums, so a short
    last vector only leaves some lanes out.  ``K`` is the largest divisor of ``r`` in the indices that divides
    the row and leaves no division on ``ri``; taken only where some access walks ``ri`` contiguously."""
    if type(rsize) is not int or vw < 2:
        return None
    r = Var("r", rsize)
    indices = list(phase_indices(phase))
    atoms = [a for i in indices for a in index_atoms(i)]
    if any(isinstance(a, Dyn) for a in atoms):
        return None
    divisors = {a.k for a in atoms if isinstance(a, (FloorDiv, Mod)) and type(a.k) is int
                and r in set(index_atoms(a.arg))}
    for k in sorted(divisors, reverse=True):
        if k < 2 or k >= rsize or rsize % k:
            continue
        inner = Var("ri", k)
        into = {r: Lin.of(Var("ro", rsize // k)) * k + Lin.of(inner)}
        mapped = [i.substitute(into) for i in indices]
        if any(_divides(inner, i) for i in mapped) or not any(i.coefficient(inner) == 1 for i in mapped):
            continue
        return k, _substituted(phase, into)
    return None


def _divides(v: Var, index: Lin) -> bool:
    """Does ``index`` divide ``v`` (or take its remainder) anywhere?"""
    return any(isinstance(a, (FloorDiv, Mod)) and v in set(index_atoms(a.arg)) for a in index_atoms(index))


def _substituted(phase: ReduceLoop | FullLoop, into: dict[Var, Lin]) -> ReduceLoop | FullLoop:
    """``phase`` with its loop variables replaced by ``into`` in every index."""
    memo: dict = {}

    def fn(index: Lin) -> Lin:
        return index.substitute(into)

    def value(e: Any) -> Any:
        return map_expr_indices(e, fn, memo)

    def store(st: Store) -> Store:
        return Store(st.buf, fn(st.index), value(st.value))
    if isinstance(phase, ReduceLoop):
        return ReduceLoop([Acc(a.name, a.kind, value(a.value), a.dtype) for a in phase.accs],
                          [store(st) for st in phase.stores])
    return FullLoop([store(st) for st in phase.stores], phase.old_values)


class KernelWriter:
    def __init__(self, kernel: Kernel, slot_of: dict[str, int], dtype_of: dict[str, torch.dtype],
                 outputs: set[str], position: dict | None = None, size_slot: dict[str, int] | None = None):
        self.position = position or {}
        self.k = kernel
        self.size_slot = size_slot or {}
        # [Note: symbolic kernels] A kernel of a graph traced with dynamic shapes reads its sizes from the call's
        # size table (``kiln_sizes``, set by the runtime before each call) and runs the plain schedules: a row or
        # flat loop nest, vector loops with remainders, threads decided at run time.  The layouts chosen by
        # integer analysis (transposing tiles, inner-loop splits by a view's period, column reductions, stack
        # row scratch) need static extents and are left out.
        self.symbolic = bool(self.size_slot) and kernel.is_symbolic()
        self.s = kernel.schedule if isinstance(kernel.schedule, CppSchedule) else default_schedule(kernel)
        self.slot_of = slot_of
        self.dtype_of = dtype_of
        self.outputs = outputs
        self.lines: list[str] = []

    def write(self) -> str:
        k = self.k
        reads, writes = k.buffers()
        # graph positions, not uids: the source (and so the cache key) must not depend on process history
        covered = " ".join(f"%{self.position.get(n, '?')}={n.op.value}" for n in k.nodes)
        out = [f"// {k.name}: {covered}", f"static void {k.name}(void** b) {{"]
        for buf in sorted(reads | writes, key=lambda s: self.slot_of[s]):
            t = ctype(self.dtype_of[buf])
            const = "" if buf in writes else "const "
            out.append(f"  {const}{t}* __restrict__ {buf} = ({const}{t}*)b[{self.slot_of[buf]}];")
        if self.symbolic:
            for name, slot in sorted(self.size_slot.items(), key=lambda t: t[1]):
                out.append(f"  const int64_t {name} = kiln_sizes[{slot}]; (void){name};")
        if numel(k.outer) == 0 or (k.rsize == 0 and not k.phases):
            out.append("}")
            return "\n".join(out)
        if k.is_reduction:
            self._reduction_kernel()
        else:
            self._pointwise_kernel()
        out.extend(self.lines)
        out.append("}")
        return "\n".join(out)

    def _outer_loops_but_last(self) -> str:
        """Open a split pointwise kernel's outer loops but the innermost (threads over all of them); returns the
        indentation inside.  Other kernels get their loops from their schedule's trace (``cpp_loops``)."""
        k = self.k
        n_par = max(len(k.outer) - 1, 0)
        if n_par:
            collapse = f" collapse({n_par})" if n_par > 1 else ""
            self.lines.append(f"  #pragma omp parallel for{collapse} schedule(static) "
                              f"if({size_text(numel(k.outer))} > {self.s.parallel_min_work})")
        indent = "  "
        for d, size in enumerate(k.outer[:-1]):
            self.lines.append(f"{indent}for (int64_t i{d} = 0; i{d} < {size_text(size)}; ++i{d}) {{")
            indent += "  "
        return indent

    def _close(self, count: int) -> None:
        for d in range(count, 0, -1):
            self.lines.append("  " * d + "}")

    def _pointwise_kernel(self) -> None:
        tiles = None if self.symbolic else plan_tiles(self.k)
        if tiles is not None:
            write_tiled(self.k, tiles, self.lines, self.s.parallel_min_work)
            return
        split = split_plan(self.k)
        if split is not None and not (len(self.k.outer) == 1 and self.k.outer[0] > self.s.chunk):
            indent = self._outer_loops_but_last()
            write_split(self.k, *split, self.lines, indent)
            self._close(len(self.k.outer) - 1)
            return
        extents = tuple(self.k.outer)
        nest = self.s.loop_trace(extents).apply(LoopNest.plain(extents))
        indent = open_nest(nest, self.lines, numel(extents))
        p = ExprPrinter(self.lines, indent)
        for phase in self.k.phases:
            assert isinstance(phase, FullLoop)
            for s in phase.stores:
                value = p.expr(s.value)
                self.lines.append(f"{indent}{s.buf}[{p.index(s.index)}] = {to_memory(value, s.value.dtype)};")
        self._close(len(nest.loops))

    def _reduction_kernel(self) -> None:
        columns = None if self.symbolic else column_plan(self.k)
        if columns is not None:
            write_columns(*columns, self.lines, self.s.parallel_min_work)
            return
        rows, self._lanes = split_reduction_trace(self.s.reduction_trace(len(self.k.outer)))
        nest = rows.apply(LoopNest.plain(self.k.outer, prefix="o"))
        rsize = self.k.rsize
        indent = open_nest(nest, self.lines, numel(self.k.outer) * (max(rsize, 1) if type(rsize) is int else rsize))
        row = ExprPrinter(self.lines, indent)
        for name, dtype in self.k.scratch.items():
            self.lines.append(f"{indent}{ctype(dtype)} {name}[{rsize}];  // row scratch")
        for phase in self.k.phases:
            if isinstance(phase, ReduceLoop):
                self._reduce_loop(phase, row, indent)
            elif isinstance(phase, RowAssign):
                value = row.expr(phase.value)
                self.lines.append(f"{indent}const {value_type(phase.value.dtype)} {phase.name} = {value};")
            elif isinstance(phase, RowStore):
                s = phase.store
                self.lines.append(f"{indent}{s.buf}[{row.index(s.index)}] = "
                                  f"{to_memory(row.expr(s.value), s.value.dtype)};")
            else:
                self._full_loop(phase, row, indent)
        self._close(len(nest.loops))

    def _full_loop(self, phase: FullLoop, row: ExprPrinter, indent: str) -> None:
        vw = self._lanes or min((lanes(compute_dtype(st.value.dtype)) for st in phase.stores), default=0)
        blocked = blocked_r(phase, self.k.rsize, vw)
        runs = runs_r(phase, self.k.rsize, vw) if blocked is None else None
        if runs is not None:  # ([Note: reduction rows in runs]) per run, its elements
            k, split = runs
            self._nested_stores(split, row, indent, ("ro", self.k.rsize // k), ("ri", k))
            return
        if blocked is None:
            self.lines.append(f"{indent}#pragma omp simd")
            self.lines.append(f"{indent}for (int64_t r = 0; r < {size_text(self.k.rsize)}; ++r) {{")
            self._stores(phase, row, indent + "  ")
            self.lines.append(f"{indent}}}")
            return
        # ([Note: reduction index blocked by the vector]) whole blocks, then the remainder
        rs = self.k.rsize
        self._nested_stores(blocked, row, indent, ("rb", rs // vw), ("l", vw))
        if rs % vw:
            self.lines.append(f"{indent}for (int64_t r = {rs - rs % vw}; r < {rs}; ++r) {{")
            self._stores(phase, row, indent + "  ")
            self.lines.append(f"{indent}}}")

    def _nested_stores(self, phase: FullLoop, row: ExprPrinter, indent: str, outer: tuple[str, int],
                       inner: tuple[str, int]) -> None:
        """A row pass as two loops: ``outer`` (variable, count) around the vector loop ``inner``."""
        self.lines.append(f"{indent}for (int64_t {outer[0]} = 0; {outer[0]} < {outer[1]}; ++{outer[0]}) {{")
        self.lines.append(f"{indent}  #pragma omp simd")
        self.lines.append(f"{indent}  for (int64_t {inner[0]} = 0; {inner[0]} < {inner[1]}; ++{inner[0]}) {{")
        self._stores(phase, row, indent + "    ")
        self.lines.append(f"{indent}  }}")
        self.lines.append(f"{indent}}}")

    def _stores(self, phase: FullLoop, row: ExprPrinter, indent: str) -> None:
        """A pass over the row's element stores, as the body of a loop opened at ``indent`` minus one level."""
        body = row.child(self.lines, indent)
        for load in phase.old_value_loads():  # ([Note: old values loaded first])
            body.expr(load)
        for st in phase.stores:
            value = body.expr(st.value)
            self.lines.append(f"{indent}{st.buf}[{body.index(st.index)}] = {to_memory(value, st.value.dtype)};")

    def _reduce_loop(self, phase: ReduceLoop, row: ExprPrinter, indent: str) -> None:
        if any(a.kind in (Op.ARGMAX, Op.ARGMIN) for a in phase.accs):
            self._scalar_reduce(phase, row, indent)
            return
        for a in phase.accs:
            self.lines.append(f"{indent}{acc_type(a.dtype)} {a.name};")
        if self._split_reduction(phase):
            self._parallel_reduce(phase, row, indent)
        else:
            self.lines.append(f"{indent}{{")
            self._lane_reduce(phase, row, indent + "  ", "0", size_text(self.k.rsize), "")
            self.lines.append(f"{indent}}}")
        _round_half_accs(phase, self.lines, indent)

    def _split_reduction(self, phase: ReduceLoop) -> bool:
        """One row only (a full reduction), long enough to share among threads, nothing else in the kernel.

        [Note: split reduction] Each thread reduces a contiguous chunk into its own slot; the slots are then
        combined in thread order, so the result does not depend on scheduling (deterministic for a fixed
        thread count)."""
        return (not self.k.outer and type(self.k.rsize) is int and self.k.rsize >= self.s.parallel_min_work
                and not phase.stores
                and all(isinstance(p, (ReduceLoop, RowAssign, RowStore)) for p in self.k.phases)
                and sum(isinstance(p, ReduceLoop) for p in self.k.phases) == 1)

    def _parallel_reduce(self, phase: ReduceLoop, row: ExprPrinter, indent: str) -> None:
        rs = self.k.rsize
        for a in phase.accs:
            self.lines.append(f"{indent}{acc_type(a.dtype)} {a.name}_part[{MAX_THREADS}];")
        self.lines.append(f"{indent}int kiln_nt = omp_get_max_threads() < {MAX_THREADS} ? omp_get_max_threads() : "
                          f"{MAX_THREADS};")
        self.lines.append(f"{indent}#pragma omp parallel num_threads(kiln_nt)")
        self.lines.append(f"{indent}{{")
        inner = indent + "  "
        self.lines.append(f"{inner}const int tid = omp_get_thread_num(), nt = omp_get_num_threads();")
        self.lines.append(f"{inner}const int64_t lo = {rs}LL * tid / nt, hi = {rs}LL * (tid + 1) / nt;")
        self._lane_reduce(phase, row, inner, "lo", "hi", "_t")
        for a in phase.accs:
            self.lines.append(f"{inner}{a.name}_part[tid] = {a.name}_t;")
        self.lines.append(f"{inner}if (tid == 0) kiln_nt = nt;")
        self.lines.append(f"{indent}}}")
        for a in phase.accs:
            self.lines.append(f"{indent}{a.name} = {a.name}_part[0];")
            self.lines.append(f"{indent}for (int t = 1; t < kiln_nt; ++t) "
                              f"{a.name} = {_combine(a.kind, a.name, a.name + '_part[t]', a.dtype)};")

    def _lane_reduce(self, phase: ReduceLoop, row: ExprPrinter, inner: str, lo: str, hi: str, suffix: str) -> None:
        """Reduce r in [lo, hi) into ``VW`` lanes, then into ``<acc><suffix>``."""
        vw = self._lanes or min(lanes(compute_dtype(a.value.dtype)) for a in phase.accs)  # 0: one vector register
        if lo == "0" and hi.isdigit() and int(hi) < vw:
            vw = 1  # a row shorter than a vector (a sum over 8 heads): one scalar chain, no lanes to combine
        for a in phase.accs:
            self.lines.append(f"{inner}{acc_type(a.dtype)} {a.name}_l[{vw}];")
            self.lines.append(f"{inner}for (int l = 0; l < {vw}; ++l) {a.name}_l[l] = {_init(a.kind, a.dtype)};")
        if vw == 1:
            self.lines.append(f"{inner}int64_t r0 = {lo};")
            self.lines.append(f"{inner}for (; r0 < {hi}; ++r0) {{")
            self.lines.append(f"{inner}  const int64_t r = r0;")
            self._acc_body(phase, row, inner + "  ", "[0]")
            self.lines.append(f"{inner}}}")
            for a in phase.accs:
                decl = f"{acc_type(a.dtype)} " if suffix else ""
                self.lines.append(f"{inner}{decl}{a.name}{suffix} = {a.name}_l[0];")
            return
        blocked = blocked_r(phase, self.k.rsize, vw) if lo == "0" else None
        runs = runs_r(phase, self.k.rsize, vw) if lo == "0" and blocked is None else None
        folded = self._folded_sums(phase, hi, vw, inner)
        if runs is not None:
            self._run_reduce(*runs, row, inner, vw, folded)
            self._combine_lanes(phase, inner, vw, suffix, True)
            return
        self.lines.append(f"{inner}int64_t r0 = {lo};")
        body = inner
        if folded:  # ([Note: sums folded in blocks]) blocks of FOLD elements, the lanes folded after each
            self.lines.append(f"{inner}while (r0 + {vw} <= {hi}) {{")
            self.lines.append(f"{inner}  const int64_t r0_end = {hi} - r0 > {FOLD} ? r0 + {FOLD} : {hi};")
            body = inner + "  "
        self.lines.append(f"{body}for (; r0 + {vw} <= {'r0_end' if folded else hi}; r0 += {vw}) {{")
        if blocked is not None:  # ([Note: reduction index blocked by the vector])
            self.lines.append(f"{body}  const int64_t rb = r0 / {vw};")
        self.lines.append(f"{body}  #pragma omp simd")
        self.lines.append(f"{body}  for (int64_t l = 0; l < {vw}; ++l) {{")
        self.lines.append(f"{body}    const int64_t r = r0 + l;")
        self._acc_body(blocked or phase, row, body + "    ", "[l]")
        self.lines.append(f"{body}  }}")
        self.lines.append(f"{body}}}")
        if folded:
            self._fold(folded, body, vw)
            self.lines.append(f"{inner}}}")
            self._unfold(folded, inner, vw)
        whole = hi.isdigit() and int(hi) % vw == 0  # no remainder after the vector loop
        overlapped = lo == "0" and hi.isdigit() and int(hi) >= vw and int(hi) % vw >= OVERLAP_MIN_REMAINDER
        lanes_in_registers = lo == "0" and (whole or overlapped)  # no scalar store into a lane before the tree
        if overlapped:
            # [Note: overlapped remainder] The last vector ends at the row's end and overlaps the previous one: its
            # lanes before r0 were already reduced and are masked out of the accumulation (their scratch writes
            # store the same values again).  Scalar iterations cost a whole vector's transcendental each (rows of
            # 69: 42 -> 36 us per 512-row softmax); for a remainder below OVERLAP_MIN_REMAINDER they stay cheaper.
            self.lines.append(f"{inner}#pragma omp simd")
            self.lines.append(f"{inner}for (int64_t l = 0; l < {vw}; ++l) {{")
            self.lines.append(f"{inner}  const int64_t r = {int(hi) - vw} + l;")
            self._acc_body(phase, row, inner + "  ", "[l]", guard="r >= r0")
            self.lines.append(f"{inner}}}")
        elif not whole:
            self.lines.append(f"{inner}for (int64_t r = r0; r < {hi}; ++r) {{")
            self._acc_body(phase, row, inner + "  ", "[0]")
            self.lines.append(f"{inner}}}")
        self._combine_lanes(phase, inner, vw, suffix, lanes_in_registers)

    def _run_reduce(self, k: int, split: ReduceLoop, row: ExprPrinter, inner: str, vw: int,
                    folded: list[Any] = ()) -> None:
        """([Note: reduction rows in runs]) per run of ``k``: whole vectors, then one partial vector; ``folded``
        sums fold their lanes every FOLD elements' worth of runs ([Note: sums folded in blocks])."""
        self.lines.append(f"{inner}for (int64_t ro = 0; ro < {self.k.rsize // k}; ++ro) {{")
        if k >= vw:
            self.lines.append(f"{inner}  for (int64_t ri0 = 0; ri0 + {vw} <= {k}; ri0 += {vw}) {{")
            self._lane_loop(split, row, inner + "    ", vw, "ri0")
            self.lines.append(f"{inner}  }}")
        if k % vw:
            self._lane_loop(split, row, inner + "  ", k % vw, str(k - k % vw))
        if folded:
            every = max(1, FOLD // k)
            self.lines.append(f"{inner}  if ((ro + 1) % {every} == 0) {{")
            self._fold(folded, inner + "    ", vw)
            self.lines.append(f"{inner}  }}")
        self.lines.append(f"{inner}}}")
        if folded:
            self._unfold(folded, inner, vw)

    def _folded_sums(self, phase: ReduceLoop, hi: str, vw: int, indent: str) -> list[Any]:
        """The sums of ``phase`` whose rows may be longer than FOLD ([Note: sums folded in blocks]); their second
        set of lanes (``<acc>_h``) declared."""
        if hi.isdigit() and int(hi) <= FOLD:
            return []
        sums = [a for a in phase.accs if a.kind is Op.SUM and compute_dtype(a.dtype).is_floating_point]
        for a in sums:
            self.lines.append(f"{indent}{acc_type(a.dtype)} {a.name}_h[{vw}] = {{}};")
        return sums

    def _fold(self, sums: list[Any], indent: str, vw: int) -> None:
        for a in sums:
            self.lines.append(f"{indent}for (int l = 0; l < {vw}; ++l) {{ {a.name}_h[l] += {a.name}_l[l]; "
                              f"{a.name}_l[l] = 0; }}")

    def _unfold(self, sums: list[Any], indent: str, vw: int) -> None:
        for a in sums:
            self.lines.append(f"{indent}for (int l = 0; l < {vw}; ++l) {a.name}_l[l] += {a.name}_h[l];")

    def _lane_loop(self, split: ReduceLoop, row: ExprPrinter, indent: str, count: int, start: str) -> None:
        """One vector (``count`` lanes) of a run, from element ``start``."""
        self.lines.append(f"{indent}#pragma omp simd")
        self.lines.append(f"{indent}for (int64_t l = 0; l < {count}; ++l) {{")
        self.lines.append(f"{indent}  const int64_t ri = {start} + l;")
        self._acc_body(split, row, indent + "  ", "[l]")
        self.lines.append(f"{indent}}}")

    def _combine_lanes(self, phase: ReduceLoop, inner: str, vw: int, suffix: str, lanes_in_registers: bool) -> None:
        """The lanes into ``<acc><suffix>``."""
        for a in phase.accs:
            name = a.name + suffix
            decl = f"{acc_type(a.dtype)} " if suffix else ""
            if vw & (vw - 1) == 0:
                # [Note: lanes combined as a tree] lane l with lane l + w, w halving: log2(VW) dependent steps of
                # vector operations instead of VW - 1 scalar ones in a chain (a float sum is not reassociated
                # by the compiler; 15 dependent adds and 15 maxima cost a 69-wide softmax row ~90 cycles).  Each
                # step is one vector operation only when asked (omp simd): GCC otherwise wrote the NaN-propagating
                # maxima as scalar compares and moves (69-wide softmax, 512 rows: 33 -> 30 us; without its
                # exponentials 19 -> 12).  Lane l reads l + w only, so the steps are safe to vectorize.  Not
                # where a scalar remainder has just stored into lane 0: a vector load of a lane stored as a scalar
                # waits for the store (a 16-lane tree over rows of 8 took 7 times as long as a scalar chain).
                w = vw // 2
                while w:
                    if w > 1 and lanes_in_registers:
                        self.lines.append(f"{inner}#pragma omp simd")
                    self.lines.append(f"{inner}for (int l = 0; l < {w}; ++l) {a.name}_l[l] = "
                                      f"{_combine(a.kind, a.name + '_l[l]', a.name + f'_l[l + {w}]', a.dtype)};")
                    w //= 2
                self.lines.append(f"{inner}{decl}{name} = {a.name}_l[0];")
            else:
                self.lines.append(f"{inner}{decl}{name} = {a.name}_l[0];")
                self.lines.append(f"{inner}for (int l = 1; l < {vw}; ++l) "
                                  f"{name} = {_combine(a.kind, name, a.name + '_l[l]', a.dtype)};")

    def _acc_body(self, phase: ReduceLoop, row: ExprPrinter, indent: str, lane: str, guard: str = "") -> None:
        """One element's row-scratch writes and accumulations; ``guard``: accumulate only where it holds."""
        body = row.child(self.lines, indent)
        for s in phase.stores:  # row-scratch writes first: reads later in this iteration see them
            value = to_memory(body.expr(s.value), s.value.dtype)
            self.lines.append(f"{indent}{s.buf}[{body.index(s.index)}] = {value};")
        for a in phase.accs:
            v = body.expr(a.value)
            if compute_dtype(a.dtype) != compute_dtype(a.value.dtype):
                v = f"static_cast<{acc_type(a.dtype)}>({v})"
            acc = a.name + "_l" + lane
            combined = _combine(a.kind, acc, v, a.dtype)
            self.lines.append(f"{indent}{acc} = {f'({guard}) ? {combined} : {acc}' if guard else combined};")

    def _scalar_reduce(self, phase: ReduceLoop, row: ExprPrinter, indent: str) -> None:
        for a in phase.accs:
            self._scalar_acc_init(a, indent)
        self.lines.append(f"{indent}for (int64_t r = 0; r < {size_text(self.k.rsize)}; ++r) {{")
        body = row.child(self.lines, indent + "  ")
        for s in phase.stores:  # row-scratch writes first, as in _acc_body
            self.lines.append(f"{indent}  {s.buf}[{body.index(s.index)}] = "
                              f"{to_memory(body.expr(s.value), s.value.dtype)};")
        for a in phase.accs:
            v = body.expr(a.value)
            if a.kind in (Op.ARGMAX, Op.ARGMIN):
                cmp = ">" if a.kind is Op.ARGMAX else "<"
                self.lines.append(f"{indent}  if (({v} {cmp} {a.name}_v) || ({v} != {v} && {a.name}_v == {a.name}_v))"
                                  f" {{ {a.name}_v = {v}; {a.name} = r; }}")
            else:
                self.lines.append(f"{indent}  {a.name} = {_combine(a.kind, a.name, v, a.dtype)};")
        self.lines.append(f"{indent}}}")
        _round_half_accs(phase, self.lines, indent)

    def _scalar_acc_init(self, a: Acc, indent: str) -> None:
        if a.kind in (Op.ARGMAX, Op.ARGMIN):
            vt = a.value.dtype
            self.lines.append(f"{indent}{acc_type(vt)} {a.name}_v = {_init(a.kind, vt)};")
            self.lines.append(f"{indent}int64_t {a.name} = 0;")
        else:
            self.lines.append(f"{indent}{acc_type(a.dtype)} {a.name} = {_init(a.kind, a.dtype)};")


def native_calls(segments: list[list[Any]]) -> list[Any]:
    """The library calls among the segments' entries (the entries that are not kernel names), in order: the order
    of the unit's function table ``kiln_native_fn``, both where the source is written and where the runtime sets
    the addresses."""
    return [e for entries in segments for e in entries if not isinstance(e, str)]


def translation_unit(kernels: list[Kernel], segments: list[list[Any]], slot_of: dict[str, int],
                     dtype_of: dict[str, torch.dtype], outputs: set[str], position: dict | None = None,
                     size_slot: dict[str, int] | None = None) -> str:
    """The whole C++ source for one graph.  ``segments``: per segment, kernel names and native calls
    (``runtime.native.NativeCall``), in order.  ``size_slot``: a symbolic graph's size symbols by name, each
    with its slot in the size table the runtime sets before a call (``kiln_set_sizes``; [Note: symbolic
    kernels])."""
    from kiln.codegen.cpp_prelude import PRELUDE
    parts = [PRELUDE, HELPERS]
    natives = native_calls(segments)
    if size_slot is not None:
        # a symbolic graph: the sizes, then the native calls' arguments ([Note: native calls at any size]), from
        # the table of the call's size, which the runtime points to before each call
        parts.append("static const int64_t* kiln_sizes;\n"
                     'extern "C" void kiln_set_sizes(const int64_t* s) { kiln_sizes = s; }')
        base, table_base = len(size_slot), {}
        for e in natives:
            table_base[id(e)] = base
            base += len(e.table_values())
    for k in kernels:
        parts.append(KernelWriter(k, slot_of, dtype_of, outputs, position, size_slot).write())
    # library calls made between the kernels (runtime/native.py): their addresses are set at load time
    parts.append(f"static void* kiln_native_fn[{max(len(natives), 1)}];\n"
                 'extern "C" void kiln_set_native(int i, void* f) { kiln_native_fn[i] = f; }')
    index = {id(e): i for i, e in enumerate(natives)}

    def native(e: Any) -> str:
        return e.statement(index[id(e)]) if size_slot is None else e.table_statement(table_base[id(e)])
    for i, entries in enumerate(segments):
        calls = [f"  {e}(b);" if isinstance(e, str) else native(e) for e in entries]
        parts.append(f'extern "C" void kiln_segment_{i}(void** b) {{\n' + "\n".join(calls) + "\n}")
        # its twin for kiln.profile (runtime/profiling.py): the time after each entry, t[0] the start
        timed = [f"{c}\n  t[{k + 1}] = omp_get_wtime();" for k, c in enumerate(calls)]
        parts.append(f'extern "C" void kiln_segment_{i}_timed(void** b, double* t) {{\n  t[0] = omp_get_wtime();\n'
                     + "\n".join(timed) + "\n}")
        # one entry at a time, for KILN_CHECK's step checker (runtime/checking.py)
        cases = [f"  case {k}:{c[1:]} break;" for k, c in enumerate(calls)]
        parts.append(f'extern "C" void kiln_segment_{i}_entry(void** b, int k) {{\n  switch (k) {{\n'
                     + "\n".join(cases) + "\n  }\n}")
    parts.append('extern "C" void kiln_set_threads(int n) { omp_set_num_threads(n); }')
    return "\n\n".join(parts) + "\n"

