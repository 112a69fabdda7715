"""Which pointwise kernels read an operand transposed, and along which loops (target-independent).

A pointwise kernel's stores are contiguous along its innermost loop ``b``.  A load whose unit stride is along
another loop ``a`` (a channels-last operand of a kernel writing NCHW, or the reverse) is *transposed*; code
generators then tile ``a`` x ``b`` so both sides stay contiguous: 16x16 register transposes in C++
(``codegen/cpp_tile.py``), 2-D blocks in Triton (``codegen/triton.py``).
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Iterator

from kiln.ir.index import Var
from kiln.ir.kernel import FullLoop, Kernel, KExpr, KLoad, KOp
from kiln.ir.ops import Op

MIN_EXTENT = 16  # both loops at least one tile long, or tiling is not worth it


@dataclasses.dataclass
class TilePlan:
    a: Var                    # the loop along which the transposed loads are contiguous
    b: Var                    # the innermost loop (contiguous for stores)
    loads: list[KLoad]        # operands read through tiles
    strides: list[int]        # each load's stride along ``b``


def _unguarded_loads(e: KExpr) -> Iterator[KLoad]:
    """The loads ``e`` makes whatever its values: not those in a branch of a ``where``, whose index may leave the
    buffer where the condition is false (a pad's or a concatenation's input past its edge).  A tile reads all of
    its 16 x 16 elements, so such a load is left to the element loop, which reads under the condition: tiling it
    read past the end of a MobileNet-V2 pad's input and crashed one run in two."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, KLoad):
            yield x
        elif isinstance(x, KOp):
            stack.extend(x.args[:1] if x.op is Op.WHERE else x.args)


def plan_tiles(k: Kernel) -> TilePlan | None:
    """A tiling for pointwise kernel ``k``, or None when its accesses are already contiguous (or too small)."""
    if k.is_reduction or len(k.outer) < 2 or not all(isinstance(p, FullLoop) for p in k.phases):
        return None
    b = Var(f"i{len(k.outer) - 1}", k.outer[-1])
    stores = [s for p in k.phases for s in p.stores]
    if any(s.index.coefficient(b) != 1 for s in stores):
        return None
    loads = {x for s in stores for x in _unguarded_loads(s.value)}
    candidates: dict[KLoad, Var] = {}
    for ld in loads:
        if not all(isinstance(a, Var) for a in ld.index.atoms()) or ld.index.coefficient(b) in (0, 1):
            continue
        unit = [a for a in ld.index.atoms() if ld.index.coefficient(a) == 1 and a != b]
        if unit:
            candidates[ld] = unit[0]
    if not candidates:
        return None
    a = Counter(candidates.values()).most_common(1)[0][0]
    if a.size < MIN_EXTENT or b.size < MIN_EXTENT:
        return None
    chosen = sorted((ld for ld, v in candidates.items() if v == a), key=repr)
    return TilePlan(a, b, chosen, [ld.index.coefficient(b) for ld in chosen])


