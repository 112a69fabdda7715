"""What each library call of a compiled graph should compute, written with ATen: the step checker's reference.

``KILN_CHECK`` compares every step of a compiled graph with a reference computed on the step's own inputs
(runtime/checking.py).  For an ATen extern that is the ATen op itself, run on contiguous copies.  kiln's own
library ops (``kiln::linear_packed``, the convolutions, attention) take weights in their own packed forms, so the
reference is the ATen computation they stand for, on the weight they were packed from (``Baked.source``, kept
while ``KILN_CHECK`` is on).  Without a source (a graph compiled with check off) the op's Python path is the
reference: it still catches what the generated code's call gets wrong (strides, offsets, sizes).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from kiln.ir.extern import Baked, substitute

Reference = Callable[[dict[str, Any]], torch.Tensor | None]
_REFERENCES: dict[Any, Reference] = {}


def register(name: str) -> Callable[[Reference], Reference]:
    """``@register("kiln::conv_gemm")``: the reference of the op with that schema name.  Each op registers its
    own beside its definition (``kiln/library/<op>/op.py``), so the reference exists whenever the op does."""
    def wrap(fn: Reference) -> Reference:
        _REFERENCES[name] = fn
        return fn
    return wrap


def baked_source(packed: Any) -> torch.Tensor | None:
    """The weight a packed argument was made from (kept while ``KILN_CHECK`` is on), or None."""
    return packed.source if isinstance(packed, Baked) else None


def reference(node: Any, values: list[torch.Tensor]) -> torch.Tensor | None:
    """Extern ``node``'s result from ATen on ``values`` (its inputs), or None where no ATen form is known."""
    target = node.attr("target")
    name = getattr(getattr(target, "_schema", None), "name", "")
    fn = _REFERENCES.get(name)
    if fn is None:
        return None
    args, kwargs = substitute(node.attr("template"), values)
    named: dict[str, Any] = {}
    for i, a in enumerate(target._schema.arguments):
        if i < len(args):
            named[a.name] = _baked_kept(node.attr("template")[0][i], args[i])
        elif a.name in kwargs:
            named[a.name] = kwargs[a.name]
        elif a.has_default_value():
            named[a.name] = a.default_value
    result = fn(named)
    out_index = node.attr("out_index")
    return result[out_index] if result is not None and out_index is not None else result


def _baked_kept(template: Any, value: Any) -> Any:
    """A Baked argument is passed on as the Baked (its source is the reference's weight)."""
    return template if isinstance(template, Baked) else value
