"""Triton code generation from the kernel IR: one ``@triton.jit`` function per kernel, one module per graph.

The same kernels the C++ writer gets (``kiln/ir/kernel.py``) become Triton programs:

- pointwise (``rsize == 0``): a 1-D block of ``XBLOCK`` flat output positions per program; the loop
  variables ``i0, i1, ...`` are recovered from the flat position by division (shapes are compile-time
  constants, so these are cheap multiply-shifts);
- reductions: a 2-D block of ``XBLOCK`` rows x ``RBLOCK`` row elements.  *Persistent* when a whole row fits in
  one block (``rsize <= PERSISTENT_MAX``): every phase (reductions, per-row values, the elementwise epilogue)
  runs on values already in registers, so a softmax or layer norm reads its input once.  Otherwise *looped*:
  each phase walks the row in ``RBLOCK`` chunks, accumulating into block-shaped partials reduced at the end.
  A persistent schedule of one row per program (``XBLOCK == 1``) is written with 1-D blocks instead
  (``TritonKernelWriter.one_row``).

Row scratch arrays of the C++ kernels are not stored here: in a persistent kernel the value is still in
registers, in a looped one it is recomputed.

Schedules (``TritonSchedule``: block sizes, warps) are data chosen by ``schedule_for``; the autotuner can
replace them.  Example (softmax over rows of 256, persistent)::

    @triton.jit
    def kernel_0_amax_sub_exp_sum(buf0, buf1, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
        xr = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
        xmask = xr < 512
        o0 = xr
        r = tl.arange(0, RBLOCK)[None, :]
        xrmask = xmask & (r < 256)
        t0 = tl.load(buf0 + (256 * o0 + r), mask=xrmask, other=0)
        acc0 = tl.reduce(tl.where(xrmask, t0, float("-inf")), 1, km.max_nan, keep_dims=True)
        ...
"""
from __future__ import annotations

import dataclasses
import re

import torch

from kiln import config
from kiln.codegen.triton_expr import HALF, TritonPrinter, compute_dtype, converted, literal, stored_half_values, \
    tl_type
from kiln.ir.tiling import plan_tiles
from kiln.ir.index import Var
from kiln.ir.kernel import Acc, FullLoop, KConst, KExpr, KLoad, KVar, Kernel, ReduceLoop, RowAssign, RowStore, Store, \
    phase_exprs, subexprs
from kiln.ir.ops import Op, contiguous_strides, numel, reduction_identity
from kiln.ir.sym import FloatSize, evaluate, is_symbolic, render, render_factor

PERSISTENT_MAX = 4096   # row elements kept in registers by one program
LOOP_RBLOCK = 1024      # chunk of a looped reduction
BLOCK_ELEMENTS = 2048   # target elements per program for reductions over short rows
POINTWISE_BLOCK = 1024
COLUMN_XBLOCK = 64      # columns a program of a column reduction ([Note: column reductions on the GPU])
COLUMN_RBLOCK = 32      # rows per step of its loop
COLUMN_PROGRAMS = 128   # programs a column reduction keeps at least (before its columns a program grow)
# Persistent rows of at least this many (padded) elements run one row per program in 1-D blocks, 2-8 warps -
# Inductor's default for such reductions (XBLOCK=1, RBLOCK=rnumel, rnumel/128 warps).  Before: two rows of 768 or
# 1024 per program in [2, RBLOCK] blocks, 4 warps, and kiln's LayerNorms took ~2.3 us where Inductor's took ~1.5
# (bloom, H200, benchmarks/results/2026-12-03-h200-kernels-fp32-bloom-session21.txt); session 20's sweep of
# [XBLOCK, RBLOCK] schedules found no schedule that closed it, the 1-D form (pytorch#102444) is the difference
# left.  Shorter rows (softmax over a few hundred keys) keep several rows a program.
ONE_ROW_MIN = 512
INT32_LIMIT = 1 << 31

HEADER = '''"""kiln-generated Triton kernels."""
import triton
import triton.language as tl

from kiln.runtime import triton_math as km
'''


@dataclasses.dataclass(frozen=True)
class TritonSchedule:
    xblock: int
    rblock: int        # reductions: row chunk; 2-D tiled pointwise kernels: the tile's other edge; else 0
    persistent: bool
    num_warps: int
    grid: int
    grid_y: int = 1    # 2-D tiled pointwise kernels: tiles along the transposed axis
    grid_z: int = 1    #   ... and the remaining (outer) loop positions
    wide: bool = False  # a symbolic kernel at sizes whose positions pass int32: 64-bit program ids

    @property
    def grid3(self) -> tuple[int, int, int]:
        return (self.grid, self.grid_y, self.grid_z)


# 2-D tiles for pointwise kernels with transposed operands.  H200, bf16 [16, 128, 220, 220] channels-last ->
# NCHW + bias + ReLU, interleaved rounds (benchmarks/transpose_tiles.py, 2026-12-03): every tile shape, tile
# order and cache hint tried is within 96-104 us (Inductor's kernel 96.3, this one 102.2, the load side's tiles
# first on a flat axis 98-99), so the shape is not what separates kiln's 125 us from Inductor's 109 inside the
# seed_b16 model (benchmarks/results/*-session18*).
TILE_X, TILE_Y, TILE_WARPS = 64, 32, 4

def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _warps(elements: int) -> int:
    return 1 if elements <= 128 else 2 if elements <= 512 else 4 if elements <= 2048 else 8


def text_key(k: Kernel, symbolic: bool) -> tuple:
    """What kernel ``k``'s text depends on besides its IR and its buffers' dtypes: for a symbolic kernel the kind of
    its schedule (64-bit positions, persistent or looped, one row a program: what ``TritonKernelWriter`` reads
    of it), for a static one the whole schedule.  Kept beside the writer: a read of ``self.s`` added there must
    be added here (tests/gpu/test_symbolic_kernels.py checks texts against these keys over many sizes)."""
    s = k.schedule if isinstance(k.schedule, TritonSchedule) else None
    if s is None:
        return (None,)
    if symbolic:
        return (s.wide, s.persistent, s.xblock == 1)
    return (s,)


def schedule_for(k: Kernel, env: dict[str, int] | None = None, symbolic: bool | None = None) -> TritonSchedule:
    """Heuristic block sizes (the autotuner's starting point).  A symbolic kernel's at the sizes ``env``: its
    text depends on the schedule's kind alone (pointwise, one row or several a program, persistent or looped,
    64-bit positions: ``wide``), so sizes with the same kind share one compile, and the block sizes are
    chosen per size (a bucket: the next power of two of the row).  ``symbolic``: whether ``k`` is (where the
    caller knows: finding out walks its indices)."""
    if k.is_symbolic() if symbolic is None else symbolic:
        assert env is not None, "a symbolic kernel's schedule needs the sizes"
        sized = Kernel(k.name, tuple(evaluate(d, env) for d in k.outer), evaluate(k.rsize, env), [], [])
        wide = numel(sized.outer) * max(sized.rsize, 1) >= INT32_LIMIT
        return dataclasses.replace(schedule_for(sized), wide=wide)
    rows = max(numel(k.outer), 1)
    tiles = plan_tiles(k)
    if tiles is not None:
        others = rows // (tiles.a.size * tiles.b.size)
        tile_x, tile_y, warps = TILE_X, TILE_Y, TILE_WARPS
        if config.get().triton_tile_schedule.strip():  # (experiments: benchmarks/gpu_sched_sweep.py --tiles)
            tile_x, tile_y, warps = (int(v) for v in config.get().triton_tile_schedule.split(","))
        return TritonSchedule(tile_x, tile_y, True, warps, -(-tiles.b.size // tile_x), -(-tiles.a.size // tile_y),
                              others)
    forced = config.get().triton_persistent_schedule.strip()  # (experiments: benchmarks/gpu_sched_sweep.py)
    if k.is_reduction and k.rsize <= PERSISTENT_MAX and forced:
        xblock, warps = (int(v) for v in forced.split(","))
        return TritonSchedule(xblock, max(2, _pow2(k.rsize)), True, warps, -(-rows // xblock))
    if not k.is_reduction:
        xblock = max(16, min(POINTWISE_BLOCK, _pow2(rows)))
        return TritonSchedule(xblock, 0, True, _warps(xblock), -(-rows // xblock))
    # (as many columns a program as keeps ``COLUMN_PROGRAMS`` programs: C=768 gets 4 a program, C=3072 16 - 64
    # for every width left a 768-wide gradient on 12 programs, 2.6x slower than a column each on the H100; a
    # reduction too narrow for 2 a program keeps one row a program)
    xblock = min(COLUMN_XBLOCK, _pow2(rows), _pow2_floor(rows // COLUMN_PROGRAMS))
    if xblock >= 2 and config.get().gpu_column_reductions and column_reduction(k):
        if k.rsize <= COLUMN_RBLOCK:
            return TritonSchedule(xblock, max(2, _pow2(k.rsize)), True, _warps(xblock * _pow2(k.rsize)),
                                  -(-rows // xblock))
        return TritonSchedule(xblock, COLUMN_RBLOCK, False, _warps(xblock * COLUMN_RBLOCK), -(-rows // xblock))
    if k.rsize <= PERSISTENT_MAX:
        rblock = max(2, _pow2(k.rsize))
        if rblock >= ONE_ROW_MIN:  # one row a program, 1-D (``one_row``), 128 row elements a warp
            return TritonSchedule(1, rblock, True, min(8, max(2, rblock // 128)), rows)
        xblock = max(1, min(_pow2(rows), BLOCK_ELEMENTS // rblock, 512))
        return TritonSchedule(xblock, rblock, True, _warps(xblock * rblock), -(-rows // xblock))
    return TritonSchedule(1, LOOP_RBLOCK, False, _warps(LOOP_RBLOCK), rows)


def column_reduction(k: Kernel) -> bool:
    """[Note: column reductions on the GPU] Is ``k`` a reduction over columns - its loads contiguous along the
    innermost kept dimension, strided along the reduced one (a bias or LayerNorm-weight gradient: ``[B*T, C]``
    summed over ``B*T``)?  One row a program would read each column alone, a 2-byte element per 32-byte sector
    (a GPT training step's bias gradients: 87 us a kernel on the H100 for 12 MB); ``COLUMN_XBLOCK`` columns a
    program, looped over ``COLUMN_RBLOCK`` rows at a time, read whole sectors (``Config.gpu_column_reductions``;
    H100, session 43: GPT training step 6.92 -> 6.56 ms, BERT 19.34 -> 18.71).  Elementwise passes over the same
    rows come along (a LayerNorm backward's input gradient fused with its weight gradient: their loads and stores
    follow the same columns); long ones are split in two first ([Note: column reductions split for the GPU] in
    passes/split_reductions.py).  No argmax: the looped writer has none."""
    if not k.is_reduction or not k.outer or type(k.rsize) is not int or \
            not all(isinstance(p, (ReduceLoop, RowAssign, RowStore, FullLoop)) for p in k.phases):
        return False
    if any(a.kind in (Op.ARGMAX, Op.ARGMIN) for p in k.phases if isinstance(p, ReduceLoop) for a in p.accs):
        return False
    x, r = Var(f"o{len(k.outer) - 1}", k.outer[-1]), Var("r", k.rsize)
    # (every load of the row counts: a sum of an elementwise prologue held in row scratch - a GELU backward
    # before the bias gradient - reads its operands in the passes that write the scratch)
    values = [a.value for p in k.phases if isinstance(p, ReduceLoop) for a in p.accs] + \
        [st.value for p in k.phases if isinstance(p, (ReduceLoop, FullLoop)) for st in p.stores]
    columns = rows = 0
    for value in values:
        for ld in subexprs(value):
            if isinstance(ld, KLoad) and ld.index.coefficient(x) != 0:  # (a per-row vector decides nothing)
                step = ld.index.coefficient(r)
                columns += ld.index.coefficient(x) == 1 and step not in (0, 1)
                rows += step == 1
    return columns > rows


def _pow2_floor(n: int) -> int:
    """The largest power of two at most ``n`` (1 for ``n`` below 2)."""
    return 1 << max(n, 1).bit_length() - 1


def _size(x: object) -> str:
    """An extent or count as kernel text: an int, or a size expression over the kernel's size parameters."""
    return str(x) if type(x) is int else render(x, "py")


def _factor(x: object) -> str:
    """``_size`` as one operand of ``//`` or ``%`` (a product parenthesized)."""
    return str(x) if type(x) is int else render_factor(x, "py")


def _init(kind: Op, dtype: torch.dtype) -> str:
    return literal(reduction_identity(kind, dtype), dtype)


_REDUCE = {Op.SUM: "tl.sum({v}, {axis}, keep_dims=True)",
           Op.PROD: "tl.reduce({v}, {axis}, km.mul_combine, keep_dims=True)",
           Op.AMAX: "tl.reduce({v}, {axis}, km.max_nan, keep_dims=True)",
           Op.AMIN: "tl.reduce({v}, {axis}, km.min_nan, keep_dims=True)"}
_COMBINE = {Op.SUM: "{a} + {v}", Op.PROD: "{a} * {v}",
            Op.AMAX: "tl.maximum({a}, {v}, propagate_nan=tl.PropagateNan.ALL)",
            Op.AMIN: "tl.minimum({a}, {v}, propagate_nan=tl.PropagateNan.ALL)"}


class TritonKernelWriter:
    def __init__(self, kernel: Kernel, dtype_of: dict[str, torch.dtype]):
        self.k = kernel
        self.dtype_of = dtype_of
        self.s = kernel.schedule if isinstance(kernel.schedule, TritonSchedule) else schedule_for(kernel)
        self.lines: list[str] = []
        self._text: str | None = None
        self._args: list[str] = []
        # (found once: walking the kernel's indices for its symbols is not free, and every size's module asks)
        self._size_params = sorted(s.name for s in kernel.symbols())
        self.symbolic = bool(self._size_params)
        # floats computed from sizes (``x.shape[-1] ** -0.5``): fp32 parameters after the sizes, each size's value
        # computed on the host in double precision (``float_params``)
        self._floats: dict[KConst, str] = {}
        stores = [st for ph in kernel.phases for st in (ph.stores if hasattr(ph, "stores") else
                                                         [ph.store] if isinstance(ph, RowStore) else [])]
        self._stored = stored_half_values(stores, {b: d for b, d in dtype_of.items() if b not in kernel.scratch})
        if self.symbolic:
            for phase in kernel.phases:
                for e in phase_exprs(phase):
                    for x in subexprs(e):
                        if isinstance(x, KConst) and isinstance(x.value, FloatSize) and x not in self._floats:
                            if x.dtype == torch.float64:  # (Triton passes a Python float as fp32)
                                raise NotImplementedError("Triton codegen: a float64 computed from sizes")
                            self._floats[x] = f"f{len(self._floats)}"

    def size_params(self) -> list[str]:
        """A symbolic kernel's size parameters (the symbols it reads), after its buffers: the launch passes each
        size's value (Triton specializes them as it does any int: 1, and divisibility by 16)."""
        return self._size_params

    def float_params(self) -> list[tuple[str, FloatSize]]:
        """A symbolic kernel's float parameters (after its size parameters): (name, the float's expression over
        the sizes).  The launch passes each size's value, computed on the host in double precision and rounded
        to fp32 by the launch, as a static kernel's literal is by Triton."""
        return [(name, c.value) for c, name in self._floats.items()]

    def float_values(self, env: dict[str, int]) -> dict[str, float]:
        """The float parameters' values at the sizes ``env``."""
        return {name: float(evaluate(expr, env)) for name, expr in self.float_params()}

    def _names(self) -> dict:
        """The printer's names for the float parameters (a fresh dict: a printer adds its temporaries to it)."""
        return {(c, None): name for c, name in self._floats.items()}

    def args(self) -> list[str]:
        """The kernel's buffer parameters, in the order the body first uses them: kernels that differ only in
        which buffer comes first by number (a layer whose residual was allocated before its matmul's output, the
        next the other way round) then have the same text and compile once (``module_source``)."""
        self.write()
        return self._args

    def write(self) -> str:
        if self._text is not None:
            return self._text
        k = self.k
        big = self.s.wide if self.symbolic else numel(k.outer) * max(k.rsize, 1) >= INT32_LIMIT
        pid = "tl.program_id(0).to(tl.int64)" if big else "tl.program_id(0)"
        if k.is_reduction:
            self._reduction(pid)
        else:
            self._pointwise(pid)
        reads, writes = k.buffers()
        body = "\n".join(self.lines)

        def first_use(b: str) -> tuple[int, int, str]:
            m = re.search(rf"\b{re.escape(b)}\b", body)
            return (m.start() if m else len(body), int(b[3:]) if b[3:].isdigit() else -1, b)
        self._args = sorted(reads | writes, key=first_use)
        params = self._args + self.size_params() + [name for name, _ in self.float_params()]
        head = ["@triton.jit", f"def {k.name}({', '.join(params)}, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):"]
        self._text = "\n".join(head + self.lines) + "\n"
        return self._text

    # ------------------------------------------------------------------ helpers
    def _emit(self, indent: str, text: str) -> None:
        self.lines.append(indent + text)

    def _unflatten(self, flat: str, prefix: str, indent: str) -> None:
        """Loop variables ``<prefix>d`` from a flat position over ``k.outer`` (row-major)."""
        sizes = self.k.outer
        for d, (size, st) in enumerate(zip(sizes, contiguous_strides(sizes))):
            v = flat if st == 1 else f"({flat} // {_factor(st)})"
            if d > 0:
                v = f"({v} % {_factor(size)})"
            self._emit(indent, f"{prefix}{d} = {v}")

    def _store(self, p: TritonPrinter, st: Store, mask: str, indent: str) -> None:
        value = p.expr(st.value)
        dtype = self.dtype_of[st.buf]
        if dtype in HALF or compute_dtype(st.value.dtype) != dtype:
            # a constant stored (a FULL the graph returns) is ``tl.cast``: its text may be a Python number (a bf16
            # zeros(1) output failed to compile on the GPU: HF GPT-2's decode with a static cache), or a size or
            # float parameter Triton passes as a Python scalar (one specialized to 1; any under the interpreter)
            value = f"tl.cast({value}, {tl_type(dtype)})" if isinstance(st.value, KConst) \
                else converted(value, tl_type(dtype))
        offset = p.index(st.index)
        if st.index.is_const():  # a 0-d result: the pointer is made a block of the mask's shape
            offset += f" + 0 * ({mask}).to(tl.int32)"
        elif mask == "xrmask" and not re.search(r"\br\b", offset):
            # a row's element stored in the reduction's loop without the reduction position in its index (a
            # reduction of extent 1, whose position simplified away): the pointer is made a block of the value's
            # [rows, RBLOCK] shape (tl.store broadcasts the value to the pointer, not the pointer to the value);
            # the mask keeps the one position r < 1 (fuzz seed 149 of fuzz_symbolic --target triton)
            offset += " + 0 * r"
        self._emit(indent, f"tl.store({st.buf} + ({offset}), {value}, mask={mask})")

    # ------------------------------------------------------------------ pointwise
    def _pointwise(self, pid: str) -> None:
        if not self.symbolic and (self.s.grid_y > 1 or plan_tiles(self.k) is not None):
            self._tiled_pointwise()
            return
        ind = "    "
        rows = numel(self.k.outer)
        self._emit(ind, f"x = {pid} * XBLOCK + tl.arange(0, XBLOCK)")
        self._emit(ind, f"xmask = x < {_size(rows)}")
        self._unflatten("x", "i", ind)
        p = TritonPrinter(self.lines, ind, "xmask", names=self._names(), stored=self._stored)
        for phase in self.k.phases:
            assert isinstance(phase, FullLoop)
            for load in phase.old_value_loads():  # ([Note: old values loaded first])
                p.expr(load)
            for st in phase.stores:
                self._store(p, st, "xmask", ind)

    def _tiled_pointwise(self) -> None:
        """2-D tiles [RBLOCK along the transposed loads' unit-stride loop, XBLOCK along the stores'] so both
        sides are coalesced (Triton moves the tile through shared memory between the two orders)."""
        ind = "    "
        tiles = plan_tiles(self.k)
        a, b = tiles.a, tiles.b
        self._emit(ind, f"{b.name} = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[None, :]")
        self._emit(ind, f"{a.name} = tl.program_id(1) * RBLOCK + tl.arange(0, RBLOCK)[:, None]")
        # [Note: masks a tile cannot need] A bound the tile edge divides is never crossed: its test is left out,
        # so the mask is constant along that edge and Triton keeps the loads there vectorized (a test of the
        # loaded unit-stride index varies along it and splits them into scalar loads).  The static asserts
        # make a launch with another block size a compile error instead of a read past the bound.
        terms = []
        for var, block, edge in ((b, "XBLOCK", self.s.xblock), (a, "RBLOCK", self.s.rblock)):
            if var.size % max(edge, 1):
                terms.append(f"({var.name} < {var.size})")
            else:
                self._emit(ind, f"tl.static_assert({var.size} % {block} == 0)")
        self._emit(ind, "xmask = " + (f"tl.broadcast_to({' & '.join(terms)}, [RBLOCK, XBLOCK])" if terms
                                      else "tl.full([RBLOCK, XBLOCK], True, tl.int1)"))
        others = [(f"i{d}", size) for d, size in enumerate(self.k.outer) if f"i{d}" not in (a.name, b.name)]
        self._emit(ind, "z = tl.program_id(2)")
        stride = 1
        for name, size in reversed(others):
            self._emit(ind, f"{name} = (z // {stride}) % {size}")
            stride *= size
        p = TritonPrinter(self.lines, ind, "xmask", names=self._names(), stored=self._stored)
        for phase in self.k.phases:
            for load in phase.old_value_loads():  # ([Note: old values loaded first])
                p.expr(load)
            for st in phase.stores:
                self._store(p, st, "xmask", ind)

    # ------------------------------------------------------------------ reductions
    @property
    def one_row(self) -> bool:
        """A persistent reduction of one row per program is written with 1-D blocks: row values ``[1]``, the
        row ``[RBLOCK]`` (Triton's code for ``[1, RBLOCK]`` blocks is slower; Inductor squashes its XBLOCK=1
        persistent reductions to 1-D for that reason, pytorch#102444)."""
        return self.k.is_reduction and self.s.persistent and self.s.xblock == 1

    def _reduction(self, pid: str) -> None:
        ind = "    "
        k = self.k
        if self.one_row:
            self._emit(ind, f"xr = {pid} + tl.zeros([1], tl.int32)")
        else:
            self._emit(ind, f"xr = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        rows = numel(k.outer)
        self._emit(ind, f"xmask = xr < {_size(rows if is_symbolic(rows) else max(rows, 1))}")
        self._unflatten("xr", "o", ind)
        self._emit(ind, "rb = tl.arange(0, RBLOCK)" + ("" if self.one_row else "[None, :]"))
        # row scratch is written by a reduction pass or first thing in the final loop (a stored member that the
        # final loop reads, kernel_build's [Note: row scratch]); either way recomputed where read, never stored
        scratch = {st.buf: st.value for ph in k.phases if isinstance(ph, (ReduceLoop, FullLoop)) for st in ph.stores
                   if st.buf in k.scratch}
        row = TritonPrinter(self.lines, ind, "xmask", scratch, names=self._names(), stored=self._stored)
        if self.s.persistent:
            self._emit(ind, "r = rb")
            self._emit(ind, f"xrmask = xmask & (r < {_size(k.rsize)})")
            body = row.child(self.lines, ind, "xrmask")
        early = [] if self.s.persistent else _stores_in_the_first_pass(k, scratch)
        written = {id(st) for st in early}
        for phase in k.phases:
            if isinstance(phase, ReduceLoop):
                if self.s.persistent:
                    for a in phase.accs:
                        self._emit(ind, f"{a.name} = {self._reduce_block(body, a, 'xrmask', ind)}")
                else:
                    self._looped_reduce(phase, row, ind, early)
                    early = []  # (written once: in the first pass)
            elif isinstance(phase, RowAssign):
                self._emit(ind, f"{phase.name} = {row.expr(phase.value)}")
            elif isinstance(phase, RowStore):
                self._store(row, phase.store, "xmask", ind)
            elif self.s.persistent:
                for st in phase.stores:
                    if st.buf not in k.scratch:
                        self._store(body, st, "xrmask", ind)
            elif any(st.buf not in k.scratch and id(st) not in written for st in phase.stores):
                self._open_chunk_loop(ind)
                chunk = row.child(self.lines, ind + "    ", "xrmask")
                for st in phase.stores:
                    if st.buf not in k.scratch and id(st) not in written:
                        self._store(chunk, st, "xrmask", ind + "    ")
                self._close_chunk_loop(ind)

    def _value(self, p: TritonPrinter, a: Acc) -> str:
        v = p.expr(a.value)
        cd = compute_dtype(a.dtype)
        # (an int64 value may be printed as int32 - a ``full`` or literals alone - where beside it the identity of
        # amin/amax, 2**63 - 1, does not fit: converted; Triton-target fuzz seed 12470)
        if compute_dtype(a.value.dtype) != cd or cd == torch.int64:
            v = converted(v, tl_type(cd))
        return v

    def _reduce_block(self, p: TritonPrinter, a: Acc, mask: str, ind: str) -> str:
        if a.kind in (Op.ARGMAX, Op.ARGMIN):
            return self._arg_reduce(p, a, mask, ind)
        v = self._value(p, a)
        masked = f"tl.where({mask}, {v}, {_init(a.kind, compute_dtype(a.dtype))})"
        return _REDUCE[a.kind].format(v=masked, axis=self.axis)

    @property
    def axis(self) -> int:
        """The row axis: 1 of ``[XBLOCK, RBLOCK]`` blocks, 0 of one-row blocks."""
        return 0 if self.one_row else 1

    def _arg_reduce(self, p: TritonPrinter, a: Acc, mask: str, ind: str) -> str:
        """First index of the max (min); NaN counts as the largest (smallest), as in torch."""
        v = p.expr(a.value)
        vd = compute_dtype(a.value.dtype)
        if vd == torch.int64:  # (see ``_value``)
            v = converted(v, "tl.int64")
        fn = "tl.argmax" if a.kind is Op.ARGMAX else "tl.argmin"
        masked = f"tl.where({mask}, {v}, {_init(a.kind, vd)})"
        ax = self.axis
        if not vd.is_floating_point:
            return f"{fn}({masked}, {ax}, keep_dims=True).to(tl.int64)"
        nan = f"tl.where({mask}, {v} != {v}, 0).to(tl.int32)"
        self._emit(ind, f"{a.name}_nan = {nan}")
        return (f"tl.where(tl.max({a.name}_nan, {ax}, keep_dims=True) > 0, tl.argmax({a.name}_nan, {ax}, "
                f"keep_dims=True), {fn}({masked}, {ax}, keep_dims=True)).to(tl.int64)")

    def _open_chunk_loop(self, ind: str) -> None:
        """The loop over a row's chunks (closed by ``_close_chunk_loop``).  Over a symbolic row a ``while``: the
        same loop for Triton's compiler, and Triton's interpreter (CI) cannot take a size parameter as a
        ``range`` bound (it holds ints as one-element arrays, which NumPy 2 no longer converts with ``int``)."""
        rsize = _size(self.k.rsize)
        if type(self.k.rsize) is int:
            self._emit(ind, f"for r0 in range(0, {rsize}, RBLOCK):")
        else:
            self._emit(ind, "r0 = 0")
            self._emit(ind, f"while r0 < {rsize}:")
        self._emit(ind + "    ", "r = r0 + rb")
        self._emit(ind + "    ", f"xrmask = xmask & (r < {rsize})")

    def _close_chunk_loop(self, ind: str) -> None:
        if type(self.k.rsize) is not int:
            self._emit(ind + "    ", "r0 += RBLOCK")

    def _looped_reduce(self, phase: ReduceLoop, row: TritonPrinter, ind: str, early: list[Store] = ()) -> None:
        """One pass over the row's chunks, accumulating ``phase``'s reductions; ``early``: elementwise stores
        written in this pass ([Note: elementwise stores in the first pass])."""
        if any(a.kind in (Op.ARGMAX, Op.ARGMIN) for a in phase.accs):
            raise NotImplementedError("Triton codegen: argmax/argmin over rows longer than one block")
        for a in phase.accs:
            cd = compute_dtype(a.dtype)
            self._emit(ind, f"{a.name}_b = tl.full([XBLOCK, RBLOCK], {_init(a.kind, cd)}, {tl_type(cd)})")
        self._open_chunk_loop(ind)
        inner = ind + "    "
        chunk = row.child(self.lines, inner, "xrmask")
        for a in phase.accs:
            v = f"tl.where(xrmask, {self._value(chunk, a)}, {_init(a.kind, compute_dtype(a.dtype))})"
            self._emit(inner, f"{a.name}_b = " + _COMBINE[a.kind].format(a=f"{a.name}_b", v=v))
        for st in early:
            self._store(chunk, st, "xrmask", inner)
        self._close_chunk_loop(ind)
        for a in phase.accs:
            self._emit(ind, f"{a.name} = " + _REDUCE[a.kind].format(v=f"{a.name}_b", axis=1))


# [Note: elementwise stores in the first pass]
# A looped reduction (a row longer than one block, or a column reduction, which steps through its rows) that also
# stores elementwise values - a bias gradient with the activation's gradient it sums, a BatchNorm backward's
# partial sums with the ReLU-masked gradient - wrote them in a last pass over the row, loading every operand a
# second time (ResNet-18's backward on the H100: 0.35 ms for one such kernel, its five inputs read twice).  A
# stored value that reads no row value of the kernel (no accumulator, no row assignment) is written in the first
# pass instead, where the reduction loads the same operands; unless the kernel reads the buffer it writes (an
# update in place: a later chunk could read what an earlier one wrote).
def _stores_in_the_first_pass(k: Kernel, scratch: dict[str, KExpr]) -> list[Store]:
    """The final loop's stores a looped reduction writes in its first pass instead."""
    if not any(isinstance(p, ReduceLoop) for p in k.phases):
        return []
    loaded = {x.buf for p in k.phases for e in phase_exprs(p) for x in subexprs(e) if isinstance(x, KLoad)}
    loaded |= {x.buf for e in scratch.values() for x in subexprs(e) if isinstance(x, KLoad)}
    early = []
    for p in k.phases:
        if not isinstance(p, FullLoop):
            continue
        for st in p.stores:
            if st.buf in k.scratch or st.buf in loaded or _reads_row_values(st.value, scratch):
                continue
            early.append(st)
    return early


def _reads_row_values(e: KExpr, scratch: dict[str, KExpr]) -> bool:
    """Does ``e`` read a row value (an accumulator or row assignment: a ``KVar``), directly or through a row
    scratch's definition?"""
    seen: set[str] = set()
    todo = [e]
    while todo:
        for x in subexprs(todo.pop()):
            if isinstance(x, KVar):
                return True
            if isinstance(x, KLoad) and x.buf in scratch and x.buf not in seen:
                seen.add(x.buf)
                todo.append(scratch[x.buf])
    return False


def module_source(kernels: list[Kernel], dtype_of: dict[str, torch.dtype]) -> str:
    """The module's source.  Parameters are named by position (``p0, p1, ...``), so kernels that compute the
    same thing on different buffers (each layer of a transformer) have the same text; each distinct text is
    defined once and the others are aliases of it, so Triton compiles it once (GPT: 17 kernels -> 5)."""
    parts = [HEADER]
    seen: dict[str, str] = {}
    for k in kernels:
        writer = TritonKernelWriter(k, dtype_of)
        text = writer.write()
        for i, name in enumerate(writer.args()):
            text = re.sub(rf"\b{name}\b", f"p{i}", text)
        body = text.replace(f"def {k.name}(", "def KERNEL(", 1)
        if body in seen:
            parts.append(f"{k.name} = {seen[body]}  # the same kernel as {seen[body]}")
        else:
            seen[body] = k.name
            parts.append(text)
    return "\n\n".join(parts)
