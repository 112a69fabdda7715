"""kiln's CPU GEMM: ``kiln::linear_packed`` (``x @ W^T + bias [gelu]`` on a weight packed at compile time).

- ``source.py``: the C++ (AVX2/AVX-512 micro-kernel, cache blocking, the gelu epilogue) and its schedule rule;
- ``op.py``: the built library, weight packing, the torch op, its native-call binder and checking reference;
- ``select.py``: the pass that chooses kiln's GEMM, oneDNN's or MKL's per linear layer (measured choice ``gemm``);
- ``epilogue.py``: the pass that moves a linear layer's gelu into kiln's or oneDNN's call;
- ``tune.py``: the GEMM's blocking schedule per shape, ranked by a cost model and measured in max-autotune.
"""
from __future__ import annotations

from kiln.library.gemm import epilogue, op, select, tune
from kiln.library.spec import GraphPass, Operator, when_selecting


def _select(graph, log):
    return select.select_gemm(graph, log, tuning=log.mode == "max-autotune")


OPERATOR = Operator(
    name="gemm",
    what="kiln's CPU GEMM for linear layers, chosen against oneDNN and MKL per shape",
    passes=(GraphPass("select_gemm", when_selecting(_select),
                      "after folding: weights are final; time kiln's GEMM vs oneDNN vs MKL per shape"),
            GraphPass("gemm_epilogue", epilogue.fuse_gemm_gelu,
                      "after select_gemm: a linear's gelu into kiln's or oneDNN's call")),
    libraries=select.libraries,
    out_variants=lambda: (op.linear_packed._opoverload.overloadpacket,),
    records=lambda: tune.KINDS + (select.GEMM.record_kind,),
)
