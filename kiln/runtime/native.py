"""Native steps: kiln's own library ops called from the generated C++ instead of from Python.

kiln's GEMM, convolution and attention ops (``kiln::linear_packed``, ``kiln::conv_winograd``,
``kiln::conv_gemm``, ``kiln::conv_dw``, ``kiln::attention``) are each one C function over pointers and sizes.
Through the dispatcher a call costs 15-25 us, but in a model the Python between two of them runs with cold
caches: a GEMM that streams its weight from memory evicts the interpreter's code and data, and one
``kiln::linear_packed`` call right after such a GEMM took 150-340 us on the Zen 3 dev box (``torch.empty(1)``
alone: 88 us).  In the MLP benchmark that was 4% of the run.

So, on the CPU (with an arena, fixed shapes), such an extern becomes a *native call*: its library function's
address, its constant arguments, and its tensors as entries of the graph's pointer table.  The graph's
translation unit calls it inside a segment, between the kernels, like one of them::

    before (program)                         after (program)
      segment 0: k0(b)                          segment 0: k0(b)
      extern kiln.linear_packed(%3, ...)                   native 0: kiln_gemm(b[3], 1024, b[9], ...)
      segment 1: k1(b)                                     k1(b)

A native call writes into the arena like a ``.out`` variant.  Each op's binder (``BINDERS``) turns the node's
arguments into the C call, or returns None (an argument it cannot address statically, a layout the Python
implementation would have copied): then the step stays a Python extern, as before.  The ops' Python
implementations call their C function through the same binder (``call``, after their checks and copies), and the
measured choices through ``direct_call``: each function's parameter list is written once, in its binder.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
from typing import Any, Callable

import torch

from kiln.ir.extern import Baked, extern_args
from kiln.ir.graph import Node
from kiln.ir.ops import contiguous_strides

# a binder's argument: a C type and either an int, or a tensor reference resolved to a pointer-table entry
I64, I32, F32, PTR = "int64_t", "int", "float", "void*"
OUT = object()      # the call's own result
THREADS = object()  # the graph's thread count at run time (an int argument)


@dataclasses.dataclass(frozen=True)
class Ref:
    """The data pointer of ``value``: an input node, a baked tensor (or its ``Baked``), ``OUT`` (the result) or
    None (nullptr)."""
    value: Any


@dataclasses.dataclass
class NativeCall:
    """One library call made from the generated code.  ``args``: (C type, C expression) pairs."""
    node: Node
    function: int                      # the C function's address (set in the library at load time)
    args: list[tuple[str, str]]
    label: str

    def statement(self, index: int) -> str:
        types = ", ".join(t for t, _ in self.args)
        values = ", ".join(f"({t}){v}" for t, v in self.args)
        return f"  /* {self.label} */ ((void (*)({types}))kiln_native_fn[{index}])({values});"


Binder = Callable[[dict[str, Any], Callable[[Node], tuple[int, ...] | None], tuple[int, ...]],
                  tuple[int, str, list[tuple[str, Any]]] | None]


def address(fn: Any) -> int:
    """A ctypes function's address."""
    return ctypes.cast(fn, ctypes.c_void_p).value


def named_args(node: Node) -> dict[str, Any]:
    """The extern node's arguments by schema name, defaults filled in (input nodes in place of tensors)."""
    args, kwargs = extern_args(node)
    return op_args(node.attr("target"), *args, **kwargs)


def fp32_tensor(v: Any, dims: int | None = None) -> bool:
    """Is ``v`` (an input node or a baked tensor) an fp32 tensor (of ``dims`` dimensions)?"""
    if isinstance(v, Baked):
        v = v.value
    if isinstance(v, torch.Tensor):  # baked into the call (``extern_args`` gives a Baked's tensor), or measured
        return v.dtype == torch.float32 and v.device.type == "cpu" and (dims is None or v.dim() == dims)
    return isinstance(v, Node) and v.dtype == torch.float32 and (dims is None or len(v.shape) == dims)


def dense(v: Any, strides_of: Callable[[Node], tuple[int, ...] | None]) -> bool:
    """Is ``v`` (an input node, a baked tensor or None) None or a contiguous fp32 tensor the generated code can
    address?"""
    if v is None or isinstance(v, (Baked, torch.Tensor)):
        return v is None or (fp32_tensor(v) and (v.value if isinstance(v, Baked) else v).is_contiguous())
    strides = strides_of(v) if isinstance(v, Node) else None
    return strides is not None and fp32_tensor(v) and all(
        size == 1 or st == want for size, st, want in zip(v.shape, strides, contiguous_strides(v.shape)))


def broadcast_strides(mask: Any, strides_of: Callable, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The strides of ``mask`` (an input node or a tensor) broadcast to ``shape`` (zero along broadcast dims), or
    None when it is not an fp32 tensor of at most ``len(shape)`` dims that broadcasts (an additive attention mask,
    a batched product's bias)."""
    if not fp32_tensor(mask, len(mask.shape)) or len(mask.shape) > len(shape):
        return None
    own = strides_of(mask)
    if own is None:
        return None
    pad = len(shape) - len(mask.shape)
    out = []
    for i, size in enumerate(shape):
        j = i - pad
        if j < 0 or mask.shape[j] == 1:
            out.append(0)
        elif mask.shape[j] == size:
            out.append(own[j])
        else:
            return None
    return tuple(out)


BINDERS: dict[Any, Binder] = {}


def register(op: Any) -> Callable[[Binder], Binder]:
    """``@register(torch.ops.kiln.x.default)``: the binder of op ``x``.

    ``binder(args, strides_of, out_strides) -> (function address, label, [(C type, int | Ref | THREADS)])``
    or None;
    ``strides_of(node)`` gives an input's strides (None: its pointer is not known to the generated code)."""
    def wrap(fn: Binder) -> Binder:
        BINDERS[op] = fn
        return fn
    return wrap


def bindable(node: Node) -> bool:
    return node.attr("target") in BINDERS


def bind(node: Node, strides_of: Callable[[Node], tuple[int, ...] | None], out_strides: tuple[int, ...],
         pointer: Callable[[Any], str | None]) -> NativeCall | None:
    """The native call for extern ``node`` (whose result lives at a fixed place with ``out_strides``), or None.

    ``pointer(v)``: the C expression of an input node's, a baked tensor's, or ``OUT``'s data pointer."""
    binder = BINDERS.get(node.attr("target"))
    if binder is None:
        return None
    bound = binder(named_args(node), strides_of, out_strides)
    if bound is None:
        return None
    function, label, params = bound
    args: list[tuple[str, str]] = []
    for ctype, v in params:
        if v is THREADS:
            args.append((I32, "omp_get_max_threads()"))
        elif isinstance(v, Ref):
            expr = "nullptr" if v.value is None else pointer(v.value)
            if expr is None:
                return None
            args.append((PTR, expr))
        elif ctype == F32:  # exact: a hexadecimal literal of the double, rounded to float as ctypes does
            args.append((ctype, _float_literal(float(v))))
        else:
            args.append((ctype, str(int(v))))
    return NativeCall(node, function, args, label)


def _float_literal(x: float) -> str:
    """A C expression for ``x``: hexadecimal (exact) when finite; ``<cmath>``'s macros for inf and NaN."""
    if math.isfinite(x):
        return x.hex()
    return "NAN" if math.isnan(x) else ("INFINITY" if x > 0 else "-INFINITY")


def op_args(op: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``op``'s arguments by schema name, defaults filled in (the form binders take)."""
    out: dict[str, Any] = {}
    for i, a in enumerate(op._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def direct_call(op: Any, args: dict[str, Any], out: torch.Tensor) -> Callable[[], torch.Tensor] | None:
    """The op's native call on real tensors (``args`` as ``op_args`` gives them), writing and returning ``out``:
    what a compiled graph runs, without the Python in between.  The measured choices time kiln's candidates this
    way, so that a library called through Python is not compared with a kiln call that pays the same Python."""
    prepared = _prepare(op, args, out)
    if prepared is None:
        return None
    fn, values = prepared

    def call() -> torch.Tensor:
        fn(*values)
        return out
    call.args = args  # type: ignore[attr-defined]  # keeps alive what ``values`` points into
    return call


def call(op: Any, args: dict[str, Any], out: torch.Tensor) -> torch.Tensor:
    """Run the op's library function once on real tensors through its binder, writing and returning ``out``.

    Each op's Python implementation checks its inputs, copies what the library cannot read and allocates the
    result, then calls this: the C function's argument list is written in one place, the binder, for the
    generated code, the measured choices and the Python path alike."""
    prepared = _prepare(op, args, out)
    if prepared is None:
        shapes = {name: (str(v.dtype), list(v.shape), list(v.stride())) for name, v in args.items()
                  if isinstance(v, torch.Tensor)}
        raise ValueError(f"kiln: {op} cannot take these tensors (dtype, shape, strides): {shapes}; "
                         f"out {out.dtype} {list(out.shape)} {list(out.stride())}")
    fn, values = prepared
    fn(*values)
    return out


def contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    """``t`` (or None) as the libraries read a vector operand such as a bias: contiguous."""
    return t.contiguous() if t is not None else None


_CTYPES = {I64: ctypes.c_int64, I32: ctypes.c_int, F32: ctypes.c_float}


@functools.lru_cache(maxsize=None)
def _cfunc(function: int, types: tuple[Any, ...]) -> Any:
    return ctypes.CFUNCTYPE(None, *types)(function)


def _prepare(op: Any, args: dict[str, Any], out: torch.Tensor) -> tuple[Any, list[Any]] | None:
    """The op's C function and its argument values for real tensors, or None where its binder refuses."""
    bound = BINDERS[op](args, lambda t: tuple(t.stride()), tuple(out.stride()))
    if bound is None:
        return None
    function, _, params = bound
    types, values = [], []
    for ctype, v in params:
        if v is THREADS:
            types.append(ctypes.c_int)
            values.append(torch.get_num_threads())
        elif isinstance(v, Ref):
            t = out if v.value is OUT else v.value.value if isinstance(v.value, Baked) else v.value
            types.append(ctypes.c_void_p)
            values.append(None if t is None else t.data_ptr())
        else:
            types.append(_CTYPES[ctype])
            values.append(v)
    return _cfunc(function, tuple(types)), values

