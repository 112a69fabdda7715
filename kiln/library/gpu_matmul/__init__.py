"""The GPU matmul template: ``aten.mm``/``aten.addmm`` and the pointwise kernel that consumes the product as one
Triton kernel (the product stays in registers), where it measures faster than cuBLAS plus the kernel.

- ``template.py``: the Triton template and its tile configurations;
- ``fusion.py``: which matmuls of a GPU plan take their epilogue in (measured in max-autotune, stored);
- ``tune.py``: compiling and timing the candidate configurations on the device;
- ``step.py``: the ``MatmulStep`` a Program holds: how the runtime loads and launches it;
- ``aligned.py``: products whose result rows break cuBLAS's 16-byte alignment written into padded rows;
- ``unfuse_bias.py``: fp32 ``addmm`` read only by kiln's kernels as ``mm``, its bias added by the reader.

Nothing here imports Triton until a GPU plan is built (the package is listed on machines without it).
"""
from __future__ import annotations

from typing import Any

from kiln.library.gpu_matmul import aligned, unfuse_bias
from kiln.library.spec import GraphPass, Operator


def _plan_gpu(plan: Any, graph: Any, report: Any, device: Any, choices: Any) -> None:
    from kiln.library.gpu_matmul import fusion
    fusion.fuse_into_plan(plan, graph, report, device, choices)


def _records() -> tuple[str, ...]:
    return ("gpu-matmul",)  # fusion.KIND (not imported here: it needs Triton)


OPERATOR = Operator(
    name="gpu_matmul",
    what="GPU matmuls with their epilogue kernel as one Triton template, chosen against cuBLAS per problem",
    passes=(GraphPass("unfuse_bias", unfuse_bias.unfuse_bias,
                      "after folding (biases are final constants) and attention fusion (its calls read the "
                      "Q/K/V products, which keep their bias); fp32 GPU only"),
            GraphPass("align_matmul_rows", aligned.align_matmul_rows,
                      "after folding: the product's final shape; GPU weights only"),),
    fixed_strides=aligned.row_strides,
    plan_gpu=_plan_gpu,
    records=_records,
)
