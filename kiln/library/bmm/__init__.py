"""kiln's CPU batched GEMM over run-time operands (``kiln::bmm``: attention's products written out by hand).

- ``op.py``: the torch op over ``kiln_bmm`` (in kiln's GEMM library, ``library/gemm/source.py``), its native-call
  binder and checking reference;
- ``select.py``: the pass that chooses it over ATen's ``bmm``/``baddbmm`` per shape (measured choice ``bmm``).

Listed after ``attention`` in the registry: ``fuse_attention`` looks for ATen's ``bmm`` first.
"""
from __future__ import annotations

from kiln.library.bmm import op, select
from kiln.library.spec import GraphPass, Operator, when_selecting

OPERATOR = Operator(
    name="bmm",
    what="kiln's CPU batched GEMM for products of two run-time operands, chosen against ATen per shape",
    passes=(GraphPass("select_bmm", when_selecting(select.select_bmm),
                      "after fuse_attention (which matches ATen's bmm): the remaining fp32 CPU bmm/baddbmm"),),
    libraries=select.libraries,
    fixed_strides=select.fixed_strides,
    out_variants=lambda: (op.bmm._opoverload.overloadpacket,),
    records=lambda: (select.BMM.record_kind,),
)
