"""Schedule primitives on a kernel's loop nest, recorded as a trace (printable, hashable, replayable).

A pointwise kernel iterates over its axes ``i0 .. i{n-1}`` (outermost first).  A schedule is the sequence of
primitives that turns that plain nest into the loops the C++ writer emits; each primitive checks that it is
legal and records itself, so the same ``Trace`` replayed on the same kernel gives the same loops, and its text
is what the tuning database stores.  The C++ writer (``codegen/cpp_loops.py``) emits a ``LoopNest``: the
loops with their pragmas, then each original axis computed from the loop variables (``defs``), then the body.

Primitives (``Trace`` steps; ``apply`` replays them):

    split(loop, factor)     loop -> loop.o (outer, ceil(n / factor)) and loop.i (inner, factor; the last
                            block stops at n)
    fuse(outer, inner)      two adjacent loops -> one loop over both (outer = f / n_inner, inner = f % n_inner)
    reorder(a, b, ...)      the named loops take each other's places, in the order given
    parallel(loop, work)    OpenMP threads over the loop (a prefix of the nest; with ``work`` elements or fewer
                            in the kernel it runs on one thread: forking costs more)
    vectorize(loop)         ``#pragma omp simd`` on the innermost loop
    unroll(loop, factor)    ``#pragma GCC unroll factor``

Operand packing is the GEMM writer's own (``library/gemm/source.py``); pointwise kernels read each element once.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Iterable

from kiln.ir import sym
from kiln.ir.sym import Size

KINDS = ("serial", "parallel", "vector", "unroll")


class ScheduleError(ValueError):
    """A primitive that does not apply to the nest (unknown loop, illegal order, ...)."""


@dataclasses.dataclass(frozen=True)
class Loop:
    name: str                 # i0, i0.o, i0.i, i0+i1 (fused)
    extent: Size              # trip count (the last block of a split may stop early: see ``stop``); may be a size
    #                           expression (a symbolic kernel: printed as C++ over the call's sizes)
    kind: str = "serial"
    stop: tuple[str, int, Size] | None = None  # (outer loop, factor, n): runs min(factor, n - outer * factor)
    unroll: int = 0
    min_work: int = 0         # parallel loops: run on one thread up to this many elements

    @property
    def var(self) -> str:
        """The C identifier of the loop variable."""
        return self.name.replace(".", "_").replace("+", "_")


@dataclasses.dataclass(frozen=True)
class LoopNest:
    """Loops outermost first; ``defs`` compute the kernel's original axes (and split/fused variables) from the
    loop variables, in order."""
    loops: tuple[Loop, ...]
    defs: tuple[tuple[str, str], ...] = ()   # (variable, C expression over earlier variables)

    @staticmethod
    def plain(extents: Iterable[int], prefix: str = "i") -> "LoopNest":
        """Loops ``i0, i1, ...`` (a reduction's rows: ``prefix="o"``) over ``extents``, outermost first."""
        return LoopNest(tuple(Loop(f"{prefix}{d}", n if sym.is_symbolic(n) else int(n))
                              for d, n in enumerate(extents)))

    def index(self, name: str) -> int:
        for k, loop in enumerate(self.loops):
            if loop.name == name:
                return k
        raise ScheduleError(f"no loop {name!r} in {[lp.name for lp in self.loops]}")

    def loop(self, name: str) -> Loop:
        return self.loops[self.index(name)]

    def __str__(self) -> str:
        lines, indent = [], ""
        for loop in self.loops:
            tags = [] if loop.kind == "serial" else [loop.kind]
            if loop.unroll:
                tags.append(f"unroll {loop.unroll}")
            bound = f"min({loop.stop[1]}, {loop.stop[2]} - {loop.stop[0]}*{loop.stop[1]})" if loop.stop else loop.extent
            lines.append(f"{indent}for {loop.name} in 0..{bound}" + (f"  # {', '.join(tags)}" if tags else ""))
            indent += "  "
        lines += [f"{indent}{v} = {e}" for v, e in self.defs]
        return "\n".join(lines)


def _var(name: str) -> str:
    return name.replace(".", "_").replace("+", "_")


def split(nest: LoopNest, name: str, factor: int) -> LoopNest:
    """Before::                         After (split(i0, 4))::

        for i0 in 0..10                   for i0.o in 0..3
          body(i0)                          for i0.i in 0..min(4, 10 - i0.o*4)
                                              i0 = i0.o*4 + i0.i; body(i0)
    """
    k = nest.index(name)
    loop = nest.loops[k]
    if factor < 1 or loop.kind != "serial" or loop.stop is not None:
        raise ScheduleError(f"split({name}, {factor}): needs a plain serial loop and a factor >= 1")
    if type(loop.extent) is int:
        outer = Loop(f"{name}.o", -(-loop.extent // factor))
        inner = Loop(f"{name}.i", min(factor, loop.extent),
                     stop=(f"{name}.o", factor, loop.extent) if loop.extent % factor else None)
    else:  # a size expression: ceil(n / factor) blocks, the last one stopping at n unless n divides provably
        outer = Loop(f"{name}.o", (loop.extent + factor - 1) // factor)
        inner = Loop(f"{name}.i", factor, stop=(f"{name}.o", factor, loop.extent) if loop.extent % factor != 0
                     else None)
    defs = ((_var(name), f"{outer.var} * {factor} + {inner.var}"),) + nest.defs
    return LoopNest(nest.loops[:k] + (outer, inner) + nest.loops[k + 1:], defs)


def fuse(nest: LoopNest, outer: str, inner: str) -> LoopNest:
    """Before::                         After (fuse(i0, i1))::

        for i0 in 0..4                    for i0+i1 in 0..32
          for i1 in 0..8                    i0 = i0+i1 / 8; i1 = i0+i1 % 8
            body(i0, i1)                    body(i0, i1)
    """
    k = nest.index(outer)
    if k + 1 >= len(nest.loops) or nest.loops[k + 1].name != inner:
        raise ScheduleError(f"fuse({outer}, {inner}): the loops must be adjacent, {outer} outside")
    a, b = nest.loops[k], nest.loops[k + 1]
    if a.stop or b.stop or a.kind != "serial" or b.kind != "serial":
        raise ScheduleError(f"fuse({outer}, {inner}): only plain serial loops of fixed extent fuse")
    fused = Loop(f"{outer}+{inner}", a.extent * b.extent)
    inner_extent = str(b.extent) if type(b.extent) is int else sym.render_factor(b.extent, "cpp")
    defs = ((a.var, f"{fused.var} / {inner_extent}"), (b.var, f"{fused.var} % {inner_extent}")) + nest.defs
    return LoopNest(nest.loops[:k] + (fused,) + nest.loops[k + 2:], defs)


def reorder(nest: LoopNest, *names: str) -> LoopNest:
    """Before::                         After (reorder(i1, i0))::

        for i0 in 0..4                    for i1 in 0..8
          for i1 in 0..8                    for i0 in 0..4
            body(i0, i1)                      body(i0, i1)
    """
    slots = sorted(nest.index(n) for n in names)
    if len(set(slots)) != len(names):
        raise ScheduleError(f"reorder{names}: a loop named twice")
    loops = list(nest.loops)
    for slot, name in zip(slots, names):
        loops[slot] = nest.loop(name)
    for k, loop in enumerate(loops):  # the bound of a split's inner loop reads its outer loop
        if loop.stop is not None and all(lp.name != loop.stop[0] for lp in loops[:k]):
            raise ScheduleError(f"reorder{names}: {loop.name} must stay inside {loop.stop[0]}")
        if loop.kind != "serial" and nest.loops[k].name != loop.name:
            raise ScheduleError(f"reorder{names}: annotate loops after reordering them")
    return LoopNest(tuple(loops), nest.defs)


def _annotate(nest: LoopNest, name: str, **changes) -> LoopNest:
    k = nest.index(name)
    return LoopNest(nest.loops[:k] + (dataclasses.replace(nest.loops[k], **changes),) + nest.loops[k + 1:],
                    nest.defs)


def parallel(nest: LoopNest, name: str, min_work: int = 0) -> LoopNest:
    """Before::                         After (parallel(i0, 32768))::

        for i0 in 0..64                   for i0 in 0..64  # parallel (threads when > 32768 elements)
          for i1 in 0..4096                 for i1 in 0..4096
    """
    k = nest.index(name)
    if any(lp.kind != "parallel" for lp in nest.loops[:k]) or nest.loops[k].kind != "serial":
        raise ScheduleError(f"parallel({name}): parallel loops must be the outermost ones")
    if any(lp.stop is not None for lp in nest.loops[:k + 1]):
        raise ScheduleError(f"parallel({name}): threads share only loops of fixed extent")
    return _annotate(nest, name, kind="parallel", min_work=min_work)


def vectorize(nest: LoopNest, name: str) -> LoopNest:
    """Before::                         After (vectorize(i1))::

        for i0 in 0..64                   for i0 in 0..64
          for i1 in 0..4096                 for i1 in 0..4096  # vector (omp simd)
    """
    if nest.index(name) != len(nest.loops) - 1 or nest.loop(name).kind != "serial":
        raise ScheduleError(f"vectorize({name}): only the innermost serial loop vectorizes")
    return _annotate(nest, name, kind="vector")


def unroll(nest: LoopNest, name: str, factor: int) -> LoopNest:
    """Before::                         After (unroll(i0.i, 4))::

        for i0.i in 0..4                  for i0.i in 0..4  # unroll 4
    """
    if factor < 2 or nest.loop(name).kind == "parallel":
        raise ScheduleError(f"unroll({name}, {factor}): needs a factor >= 2 and a loop run by one thread")
    return _annotate(nest, name, unroll=factor)


PRIMITIVES = {"split": split, "fuse": fuse, "reorder": reorder, "parallel": parallel, "vectorize": vectorize,
              "unroll": unroll}


@dataclasses.dataclass(frozen=True)
class Trace:
    """The primitives applied, in order: ``(("split", "i0", 4096), ("parallel", "i0.o", 32768), ...)``."""
    steps: tuple[tuple, ...] = ()

    def then(self, primitive: str, *args) -> "Trace":
        if primitive not in PRIMITIVES:
            raise ScheduleError(f"unknown primitive {primitive!r}")
        return Trace(self.steps + ((primitive, *args),))

    def apply(self, nest: LoopNest) -> LoopNest:
        for primitive, *args in self.steps:
            nest = PRIMITIVES[primitive](nest, *args)
        return nest

    def __str__(self) -> str:
        return "; ".join(f"{p}({', '.join(str(a) for a in args)})" for p, *args in self.steps)

    @staticmethod
    def parse(text: str) -> "Trace":
        """The inverse of ``str``: ``"split(i0, 4096); vectorize(i0.i)"`` -> Trace."""
        trace = Trace()
        for part in filter(None, (p.strip() for p in text.split(";"))):
            m = re.fullmatch(r"(\w+)\((.*)\)", part)
            if m is None:
                raise ScheduleError(f"cannot read schedule step {part!r}")
            args = [a.strip() for a in m.group(2).split(",") if a.strip()]
            trace = trace.then(m.group(1), *(int(a) if re.fullmatch(r"-?\d+", a) else a for a in args))
        return trace
