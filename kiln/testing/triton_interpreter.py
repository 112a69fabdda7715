"""A fix to Triton's interpreter (Triton 3.6) for kiln's tests and fuzzing on the CPU.

[Note: the interpreter's scalar comparisons] The interpreter labels a comparison of two scalars (``t = x == 0.0``
with ``x = tl.load(p + 0)``, a 0-d buffer's value) with its operands' type instead of ``int1``; broadcast to a
block it then holds float32 data, and ``t & mask`` fails (``ufunc 'bitwise_and' not supported``), where the GPU
compiles the same text.  ``patch()`` makes a splat to a block of ``int1`` hold bools.  Only where
``TRITON_INTERPRET`` is set (tests/gpu/conftest.py, the fuzzer's workers); kiln itself never patches Triton.
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
