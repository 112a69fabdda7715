"""Fixes to Triton's interpreter (Triton 3.6) for kiln's tests and fuzzing on the CPU.

[Note: the interpreter's scalar comparisons] The interpreter labels a comparison of two scalars (``t = x == 0.0``
with ``x = tl.load(p + 0)``, a 0-d buffer's value) with its operands' type instead of ``int1``; broadcast to a
block it then holds float32 data, and ``t & mask`` fails (``ufunc 'bitwise_and' not supported``), where the GPU
compiles the same text.  ``patch()`` makes a splat to a block of ``int1`` hold bools.  Only where
``TRITON_INTERPRET`` is set (tests/gpu/conftest.py, the fuzzer's workers); kiln itself never patches Triton.

[Note: the interpreter's bf16 rounding] The interpreter converts float32 to bfloat16 by dropping the low 16 bits
(``.to(tl.bfloat16)`` truncates); a GPU, and ATen, round to nearest even.  kiln's bf16 results under the
interpreter were then 1 ulp off eager's wherever a value rounds up, and a training step's recomputed values
differed from eager's saved ones: ``amin``'s backward found no element equal to the minimum - NaN gradients the
GPU never gives (gradient fuzz seed 9842, Triton target).  ``patch()`` makes the conversion round to nearest
even (NaN stays NaN), and bfloat16 -> float32 keep subnormals (the interpreter's flushed them to 0).
"""
from __future__ import annotations

_PATCHED: list[bool] = []


def patch() -> None:
    """Splats to ``int1`` blocks hold bools in Triton's interpreter (once per process; nothing without Triton)."""
    if _PATCHED:
        return
    _PATCHED.append(True)
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    builder = getattr(interpreter, "InterpreterBuilder", None)
    original = getattr(builder, "create_splat", None)
    if original is None:
        return

    def create_splat(self, ret_ty, arg):
        out = original(self, ret_ty, arg)
        if getattr(ret_ty, "scalar", None) == tl.int1 and out.data.dtype != np.bool_:
            out = interpreter.TensorHandle(out.data.astype(np.bool_), tl.int1)
        return out
    builder.create_splat = create_splat
    _round_bf16(builder, interpreter, np, tl)


def _round_bf16(builder, interpreter, np, tl) -> None:
    """[Note: the interpreter's bf16 rounding]: float32 -> bfloat16 rounded to nearest even."""
    cast = getattr(builder, "cast_impl", None)
    if cast is None:
        return

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
            rounded = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))
            nan = np.isnan(src.data)
            rounded = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)
            return interpreter.TensorHandle(rounded.reshape(np.shape(src.data)), dst_type.scalar)
        if src.dtype.scalar == tl.bfloat16 and dst_type.scalar == tl.float32:  # (exact: the high half of fp32)
            bits = np.ascontiguousarray(src.data).view(np.uint16).astype(np.uint32) << np.uint32(16)
            return interpreter.TensorHandle(bits.view(np.float32).reshape(np.shape(src.data)), dst_type.scalar)
        return cast(self, src, dst_type)
    builder.cast_impl = cast_impl
