"""kiln's CPU convolutions: Winograd F(m x m, 3x3), the implicit GEMM and the direct depthwise kernel, each with
the bias, residual add and ReLU folded in; and oneDNN's convolution with a weight reordered once (prepacked).

- ``source_winograd.py``, ``source_gemm.py``, ``source_dw.py``: the C++ of each algorithm;
- ``op.py``, ``op_dw.py``: the built libraries, weight transforms, the torch ops (``kiln::conv_winograd``,
  ``kiln::conv_gemm``, ``kiln::conv_dw``), their native-call binders and checking references;
- ``select.py``: the pass that chooses the algorithm per convolution (measured choice ``conv``);
- ``prepack.py``: the pass that gives oneDNN the convolutions kiln's kernels did not take, weights reordered;
- ``split_bias.py``: GPU convolutions' bias as a kernel of its own, so it fuses with what follows.

Layout facts (the layout stage relies on them for correctness): oneDNN's prepacked convolution and kiln's
convolutions with ``channels_last`` set write NHWC whatever their input's layout; all of them read any layout.
"""
from __future__ import annotations

from kiln.ir.graph import Node
from kiln.ir.ops import channels_last_strides
from kiln.library.conv import prepack, select, split_bias
from kiln.library.spec import GraphPass, Operator, when_selecting


def _conv2d(n: Node) -> bool:
    return prepack.is_prepacked_conv(n) or select.is_kiln_conv(n)


def _fixed_strides(n: Node) -> tuple[int, ...] | None:
    if prepack.is_prepacked_conv(n) or select.writes_channels_last(n):
        return channels_last_strides(n.shape)
    return None


OPERATOR = Operator(
    name="conv",
    what="kiln's CPU convolutions (Winograd, implicit GEMM, depthwise) chosen against oneDNN per shape",
    passes=(GraphPass("winograd", when_selecting(select.winograd_conv),
                      "after folding (final weights, BN bias); before oneDNN takes the rest"),
            GraphPass("prepack_conv", when_selecting(prepack.prepack_conv),
                      "after folding: reorder final conv weights once for oneDNN"),
            GraphPass("split_conv_bias", split_bias.split_conv_bias,
                      "after folding (BN made the bias final); GPU convolutions only")),
    libraries=select.libraries,
    conv2d=_conv2d,
    fixed_strides=_fixed_strides,
    records=lambda: (select.CONV.record_kind,),
)
