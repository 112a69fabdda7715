"""Decompositions of ATen's ``_foreach_*`` ops into one op per list entry.

[Note: foreach ops] An optimizer's step on a GPU (``foreach=True``, torch's default there) and
``clip_grad_norm_`` are written with ``_foreach_*`` ops: ``torch._foreach_mul_(exp_avgs, beta1)`` updates every
parameter's state in one call.  Torch ships no decomposition for them, so kiln saw each as a library call: a
compiled AdamW step over 8 layers was 368 Python calls of ATen (19 ms on one CPU thread, eager's step 5 ms).
Decomposed per entry, each parameter's update is a chain of elementwise ops that the fusion pass makes into
one kernel (and the write-back of the parameter and its state can be made in place)::

    before:  %m = _foreach_mul.Scalar([%m0, %m1], 0.9)           after:  %a = mul(%m0, 0.9)
             %u = _foreach_add.List(%m, [%g0, %g1], alpha=0.1)           %b = mul(%m1, 0.9)
                                                                          %c = add(%a, %g0, alpha=0.1)
                                                                          %d = add(%b, %g1, alpha=0.1)

The decomposition is read from each overload's schema: arguments typed as lists (``Tensor[]``, ``Scalar[]``) are
taken entry by entry, the others passed to every entry's op; keyword-only arguments (``alpha``) stay keywords.
The entry's op is the ATen op of the same name (overload resolved per call) except where the names or
signatures differ (``_PER_ENTRY``).  ``_foreach_mm`` and ``_foreach_powsum`` are left whole (library calls).
Values match eager's: each entry's op is the one eager's foreach kernel applies per element, with the same scalar
rounding (a ``Tensor scalars`` argument is read per entry as a 0-d tensor: as eager's ``.item()``, its value is
cast to the entry's dtype in the op).
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

aten = torch.ops.aten

_LEFT_WHOLE = {"mm", "powsum"}


def _addc(op: str) -> Callable[..., torch.Tensor]:
    """addcmul / addcdiv with a value per entry given as a tensor of values (the ``.Tensor`` overloads)."""
    combine = aten.mul if op == "addcmul" else aten.div

    def per_entry(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, value: Any = 1) -> torch.Tensor:
        if isinstance(value, torch.Tensor):  # (a 0-d entry of the ``scalars`` tensor)
            return aten.add(x, aten.mul(combine(a, b), value.to(x.dtype)))
        return getattr(aten, op)(x, a, b, value=value)
    return per_entry


def _extremum(tensor_op: Any, scalar_op: Any) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """maximum / minimum: ATen's take a tensor; against a scalar they are clamp_min / clamp_max."""
    def per_entry(x: torch.Tensor, other: Any) -> torch.Tensor:
        return tensor_op(x, other) if isinstance(other, torch.Tensor) else scalar_op(x, other)
    return per_entry


def _norm(x: torch.Tensor, ord: Any = 2, dtype: Any = None) -> torch.Tensor:
    return aten.linalg_vector_norm(x, ord, dtype=dtype)


# the entry's op where it is not ``aten.<name>`` called with the entry's arguments in schema order
_PER_ENTRY: dict[str, Callable[..., torch.Tensor]] = {
    "addcmul": _addc("addcmul"),
    "addcdiv": _addc("addcdiv"),
    "maximum": _extremum(aten.maximum, aten.clamp_min),
    "minimum": _extremum(aten.minimum, aten.clamp_max),
    "norm": _norm,
    "max": lambda x: aten.max(x),
    "zero": lambda x: aten.zeros_like(x),
    "copy": lambda x, src, non_blocking=False: aten.copy(x, src, non_blocking),
    "clone": lambda x, memory_format=None: aten.clone(x, memory_format=memory_format),
}


def _is_list(arg: Any) -> bool:
    return isinstance(arg.type, torch.ListType)


def _decomposition(overload: Any, name: str) -> Callable[..., list[torch.Tensor]]:
    schema = overload._schema
    per_entry = _PER_ENTRY.get(name) or getattr(aten, name)
    positional = [a for a in schema.arguments if not a.kwarg_only]
    # per entry: list arguments, and addcmul/addcdiv's ``Tensor scalars`` (one value per entry)
    listed = [_is_list(a) or (a.name == "scalars" and isinstance(a.type, torch.TensorType)) for a in positional]
    keyword = [a.name for a in schema.arguments if a.kwarg_only]

    def decomposed(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
        args = list(args) + [kwargs.pop(a.name) if a.name in kwargs else a.default_value
                             for a in positional[len(args):]]
        kw = {k: v for k, v in kwargs.items() if k in keyword}
        length = next(len(v) for v, is_list in zip(args, listed) if is_list)
        return [per_entry(*[v[k] if is_list else v for v, is_list in zip(args, listed)], **kw)
                for k in range(length)]
    decomposed.__name__ = f"foreach_{name}_{schema.overload_name or 'default'}"
    return decomposed


@functools.lru_cache(maxsize=1)
def foreach_decompositions() -> dict[Any, Callable[..., list[torch.Tensor]]]:
    """Overload -> its per-entry decomposition, for every functional ``aten._foreach_*`` op (module docstring)."""
    table: dict[Any, Callable[..., list[torch.Tensor]]] = {}
    for schema in torch._C._jit_get_all_schemas():
        full = schema.name.removeprefix("aten::")
        if not full.startswith("_foreach_") or full.endswith("_") or schema.overload_name.endswith("out"):
            continue
        name = full.removeprefix("_foreach_")
        if name in _LEFT_WHOLE or (name not in _PER_ENTRY and not hasattr(aten, name)):
            continue
        if any(r.alias_info is not None for r in schema.returns) and name not in _PER_ENTRY:
            continue
        overload = getattr(getattr(aten, full), schema.overload_name or "default")
        table[overload] = _decomposition(overload, name)
    return table
