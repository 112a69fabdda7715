"""Native steps: kiln's own library ops called from the generated C++ instead of from Python.

kiln's GEMM, convolution and attention ops (``kiln::linear_packed``, ``kiln::conv_winograd``,
``kiln::conv_gemm``, ``kiln::conv_dw``, ``kiln::attention``) are each one C function over pointers and sizes.
Through the dispatcher a call costs 15-25 us, but in a model the Python between two of them runs with cold
caches: a GEMM that streams its weight from memory evicts the interpreter's code and data, and one
``kiln::linear_packed`` call right after such a GEMM took 150-340 us on the Zen 3 dev box (``torch.empty(1)``
alone: 88 us).  In the MLP benchmark that was 4% of the run.

So, on the CPU (with an arena), such an extern becomes a *native call*: its library function's address, its
constant arguments, and its tensors as entries of the graph's pointer table (a graph with symbolic sizes reads the
arguments of each size from a table instead: [Note: native calls at any size]).  The graph's
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
import struct
from typing import Any, Callable

import torch

from kiln.ir.extern import Baked, extern_args, short_name
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


@dataclasses.dataclass(frozen=True)
class Pointer:
    """A tensor argument's place for the generated code: entry ``slot`` of the graph's pointer table, ``offset``
    elements of ``ctype`` in (a view at an offset: q, k and v of one product)."""
    slot: int
    offset: int = 0
    ctype: str = "float"


NULL = None  # a ``Ref(None)`` argument: nullptr


@dataclasses.dataclass
class NativeCall:
    """One library call made from the generated code.  ``args``: (C type, value) pairs, each value an int, a
    float, a ``Pointer``, ``NULL`` or ``THREADS``."""
    node: Node
    function: int                      # the C function's address (set in the library at load time)
    args: list[tuple[str, Any]]
    label: str

    def _types(self) -> str:
        return ", ".join(t for t, _ in self.args)

    def statement(self, index: int) -> str:
        """The call with its values in the source (a static graph): the function from ``kiln_native_fn[index]``."""
        values = ", ".join(f"({t}){_literal(t, v)}" for t, v in self.args)
        return f"  /* {self.label} */ ((void (*)({self._types()}))kiln_native_fn[{index}])({values});"

    # [Note: native calls at any size] A symbolic graph's translation unit serves every size, so a call's sizes,
    # strides, schedule, offsets and even its function (a GEMM variant per row count) cannot be in its source:
    # they are read from the graph's table (``kiln_sizes``: the size symbols first, then each native call's
    # entries), which every size's module fills for its sizes (runtime/dynamic.py).  What stays in the source -
    # which arguments are pointers into which slots, which are null, their C types - is the call's ``signature``;
    # sizes whose calls have another signature (a binder that decides otherwise at some size) get a build of
    # their own.
    def signature(self) -> tuple:
        """What the table form of the call writes into the source (values left out)."""
        return tuple((t, ("p", v.slot, v.ctype) if isinstance(v, Pointer) else "null" if v is NULL
                      else "threads" if v is THREADS else "v") for t, v in self.args)

    def table_values(self) -> list[int]:
        """The call's entries of the table: its function's address, then per value argument its int (a float's
        bits) and per pointer its offset."""
        out = [self.function]
        for t, v in self.args:
            if isinstance(v, Pointer):
                out.append(v.offset)
            elif v is not NULL and v is not THREADS:
                out.append(struct.unpack("<i", struct.pack("<f", float(v)))[0] if t == F32 else int(v))
        return out

    def table_statement(self, base: int) -> str:
        """The call reading its function and values from ``kiln_sizes[base:]`` (``table_values``' order)."""
        values, k = [], base + 1
        for t, v in self.args:
            if isinstance(v, Pointer):
                values.append(f"(void*)(({v.ctype}*)b[{v.slot}] + kiln_sizes[{k}])")
                k += 1
            elif v is NULL or v is THREADS:
                values.append(f"({t}){_literal(t, v)}")
            else:
                values.append(f"kiln_rt::kdetail::u2f((uint32_t)kiln_sizes[{k}])" if t == F32
                              else f"({t})kiln_sizes[{k}]")
                k += 1
        name = short_name(self.node.attr("target"))
        return (f"  /* {name} */ ((void (*)({self._types()}))kiln_sizes[{base}])({', '.join(values)});")


def _literal(ctype: str, v: Any) -> str:
    """A value argument as C source."""
    if v is THREADS:
        return "omp_get_max_threads()"
    if v is NULL:
        return "nullptr"
    if isinstance(v, Pointer):
        return f"b[{v.slot}]" if v.offset == 0 else f"(({v.ctype}*)b[{v.slot}] + {v.offset})"
    if ctype == F32:  # exact: a hexadecimal literal of the double, rounded to float as ctypes does
        return _float_literal(float(v))
    return str(int(v))


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
         pointer: Callable[[Any], Pointer | None]) -> NativeCall | None:
    """The native call for extern ``node`` (whose result lives at a fixed place with ``out_strides``), or None.

    ``pointer(v)``: where an input node's, a baked tensor's, or ``OUT``'s data is (None: not addressable)."""
    binder = BINDERS.get(node.attr("target"))
    if binder is None:
        return None
    bound = binder(named_args(node), strides_of, out_strides)
    if bound is None:
        return None
    function, label, params = bound
    args: list[tuple[str, Any]] = []
    for ctype, v in params:
        if isinstance(v, Ref):
            if v.value is None:
                args.append((PTR, NULL))
                continue
            place = pointer(v.value)
            if place is None:
                return None
            args.append((PTR, place))
        else:
            args.append((ctype, v))
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

