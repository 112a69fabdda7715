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
import torch.nn.functional as F

from kiln.ir.extern import Baked, substitute

Reference = Callable[[dict[str, Any]], torch.Tensor | None]
_REFERENCES: dict[Any, Reference] = {}


def _register(name: str) -> Callable[[Reference], Reference]:
    def wrap(fn: Reference) -> Reference:
        _REFERENCES[name] = fn
        return fn
    return wrap


def _source(packed: Any) -> torch.Tensor | None:
    return packed.source if isinstance(packed, Baked) else None


def _epilogue(y: torch.Tensor, args: dict[str, Any]) -> torch.Tensor:
    if args.get("residual") is not None:
        y = y + args["residual"]
    return torch.relu(y) if args.get("relu") else y


def _conv_input(args: dict[str, Any]) -> torch.Tensor:
    return torch.relu(args["x"]) if args.get("relu_input") else args["x"]


@_register("kiln::linear_packed")
def _linear(args: dict[str, Any]) -> torch.Tensor | None:
    w = _source(args["packed"])
    if w is None:
        return None
    y = F.linear(args["x"], w.float(), args["bias"])
    return F.gelu(y) if args.get("gelu") else y


@_register("kiln::conv_winograd")
def _winograd(args: dict[str, Any]) -> torch.Tensor | None:
    w = _source(args["packed"])
    if w is None:
        return None
    return _epilogue(F.conv2d(_conv_input(args), w.float(), args["bias"], 1, args["padding"]), args)


@_register("kiln::conv_gemm")
def _conv_gemm(args: dict[str, Any]) -> torch.Tensor | None:
    w = _source(args["packed"])
    if w is None:
        return None
    return _epilogue(F.conv2d(_conv_input(args), w.float(), args["bias"], args["stride"], args["padding"]), args)


@_register("kiln::conv_dw")
def _conv_dw(args: dict[str, Any]) -> torch.Tensor | None:
    w = _source(args["packed"])
    if w is None:
        return None
    x = _conv_input(args)
    return _epilogue(F.conv2d(x, w.float(), args["bias"], args["stride"], args["padding"], groups=x.shape[1]), args)


@_register("kiln::attention")
def _attention(args: dict[str, Any]) -> torch.Tensor:
    q, k, v = (args[a].double() for a in "qkv")
    scores = q @ k.transpose(-1, -2) * args["scale"]
    if args["causal"]:
        t, s = scores.shape[-2:]
        scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool).triu(1 + s - t), float("-inf"))
    return (torch.softmax(scores, -1) @ v).to(args["q"].dtype)


@_register("mkldnn::_convolution_pointwise")
def _onednn_conv(args: dict[str, Any]) -> torch.Tensor | None:
    w = _source(args["W"]) if "W" in args else None
    if w is None:
        return None
    y = F.conv2d(args["X"], w.float(), args.get("B"), args["stride"], args["padding"], args["dilation"],
                 args["groups"])
    attr = args.get("attr", "none")
    return torch.relu(y) if attr == "relu" else y if attr == "none" else None


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
