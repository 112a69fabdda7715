"""Reference interpreter: runs a graph IR with eager torch ops.

It defines what every op means.  ``KILN_CHECK=1`` compares it before and after every pass, constant folding
uses it to evaluate constant subgraphs, and tests compare generated kernels against it.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from kiln.ir.extern import call_extern
from kiln.ir.graph import Graph, Node
from kiln.ir.ops import VIEW, Op
from kiln.ir.sym import as_symbol, concrete, evaluate, is_symbolic


def _python_floordiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.div(a, b, rounding_mode="floor")


def _round_half_even(a: torch.Tensor) -> torch.Tensor:
    return torch.round(a)


def _relu(a: torch.Tensor) -> torch.Tensor:
    if a.dtype == torch.bool:
        return a
    return torch.relu(a)


_ELEMENTWISE: dict[Op, Callable[..., torch.Tensor]] = {
    Op.NEG: torch.neg, Op.ABS: torch.abs, Op.EXP: torch.exp, Op.EXPM1: torch.expm1, Op.LOG: torch.log,
    Op.LOG1P: torch.log1p, Op.SQRT: torch.sqrt, Op.RSQRT: torch.rsqrt, Op.RECIPROCAL: torch.reciprocal,
    Op.ERF: torch.erf, Op.ERFC: torch.erfc, Op.NDTR: torch.special.ndtr, Op.GELU: torch.nn.functional.gelu,
    Op.TANH: torch.tanh, Op.SIGMOID: torch.sigmoid, Op.RELU: _relu,
    Op.SIN: torch.sin, Op.COS: torch.cos, Op.FLOOR: torch.floor, Op.CEIL: torch.ceil, Op.ROUND: _round_half_even,
    Op.TRUNC: torch.trunc, Op.SIGN: torch.sign, Op.ISNAN: torch.isnan, Op.LOGICAL_NOT: torch.logical_not,
    Op.BITWISE_NOT: torch.bitwise_not,
    Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.DIV: torch.div, Op.FLOORDIV: _python_floordiv,
    Op.REM: torch.remainder, Op.FMOD: torch.fmod, Op.POW: torch.pow, Op.MAXIMUM: torch.maximum,
    Op.MINIMUM: torch.minimum, Op.EQ: torch.eq, Op.NE: torch.ne, Op.LT: torch.lt, Op.LE: torch.le,
    Op.GT: torch.gt, Op.GE: torch.ge, Op.LOGICAL_AND: torch.logical_and, Op.LOGICAL_OR: torch.logical_or,
    Op.LOGICAL_XOR: torch.logical_xor, Op.BITWISE_AND: torch.bitwise_and, Op.BITWISE_OR: torch.bitwise_or,
    Op.BITWISE_XOR: torch.bitwise_xor, Op.WHERE: torch.where,
}


def _reduce(n: Node, x: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    axes, keepdim = n.attr("axes"), n.attr("keepdim")
    if n.op in (Op.ARGMAX, Op.ARGMIN):
        fn = torch.argmax if n.op is Op.ARGMAX else torch.argmin
        return fn(x, dim=axes[0], keepdim=keepdim) if x.dim() else fn(x)
    if not axes:
        return x.clone()
    if n.op is Op.SUM:
        return torch.sum(x, dim=axes, keepdim=keepdim, dtype=n.dtype)
    if n.op is Op.AMAX:
        return torch.amax(x, dim=axes, keepdim=keepdim)
    if n.op is Op.AMIN:
        return torch.amin(x, dim=axes, keepdim=keepdim)
    out = x
    for a in sorted(axes, reverse=True):
        out = torch.prod(out, dim=a, keepdim=True, dtype=n.dtype)
    return out if keepdim else out.reshape(shape)


def _slice(n: Node, x: torch.Tensor, shape: Sequence[int], sizes: dict[str, int] | None) -> torch.Tensor:
    d, start, step = n.attr("dim"), concrete(n.attr("start"), sizes), concrete(n.attr("step"), sizes)
    return torch.ops.aten.slice.Tensor(x, d, start, start + step * shape[d], step)


def _pad(n: Node, x: torch.Tensor, sizes: dict[str, int] | None) -> torch.Tensor:
    flat: list[int] = []
    for before, after in reversed(concrete(n.attr("pads"), sizes)):
        flat += [before, after]
    return torch.nn.functional.pad(x, flat, value=n.attr("value"))


def _same_device(args: Sequence[Any]) -> Sequence[Any]:
    """Scalars and index ranges (FULL, IOTA) evaluate on the CPU; next to GPU weights they move there."""
    devices = {a.device for a in args if isinstance(a, torch.Tensor)}
    if len(devices) < 2:
        return args
    target = next(d for d in devices if d.type != "cpu")
    return [a.to(target) if isinstance(a, torch.Tensor) else a for a in args]


def eval_node(n: Node, args: Sequence[Any], sizes: dict[str, int] | None = None) -> torch.Tensor:
    """Evaluate one node on concrete input tensors (``args`` in ``n.inputs`` order); ``sizes`` binds the size
    symbols of a graph traced with dynamic shapes (``bind_sizes``)."""
    op = n.op
    args = _same_device(args)
    shape = concrete(n.shape, sizes)
    if op in _ELEMENTWISE:
        out = _ELEMENTWISE[op](*args)
        if op is Op.DIV and not n.dtype.is_floating_point and not n.dtype.is_complex:
            out = torch.div(*args, rounding_mode="trunc")
        return out.to(n.dtype)
    if op is Op.CAST:
        return args[0].to(n.dtype)
    if op is Op.CONSTANT:
        return n.attr("value").tensor
    if op is Op.FULL:
        return torch.full(shape, concrete(n.attr("value"), sizes), dtype=n.dtype)
    if op is Op.IOTA:
        start, step = concrete(n.attr("start"), sizes), concrete(n.attr("step"), sizes)
        return start + step * torch.arange(shape[0], dtype=torch.int64).to(n.dtype)
    if op in (Op.SUM, Op.PROD, Op.AMAX, Op.AMIN, Op.ARGMAX, Op.ARGMIN):
        return _reduce(n, args[0], shape)
    if op is Op.RESHAPE:
        return args[0].reshape(shape)
    if op is Op.PERMUTE:
        return args[0].permute(n.attr("dims"))
    if op is Op.EXPAND:
        return args[0].expand(shape)
    if op is Op.SLICE:
        return _slice(n, args[0], shape, sizes)
    if op is Op.PAD:
        return _pad(n, args[0], sizes)
    if op is Op.CAT:
        return torch.cat(list(args), dim=n.attr("dim"))
    if op is Op.TAKE:
        x, idx = args
        d = n.attr("dim")
        return x.index_select(d, idx.reshape(-1)).reshape(shape)
    if op is Op.GATHER:
        return torch.gather(args[0], n.attr("dim"), args[1])
    if op is Op.EXTERN:
        return call_extern(n, args, sizes)
    raise NotImplementedError(f"interp: no rule for {op.value}")


def bind_sizes(graph: Graph, inputs: Sequence[torch.Tensor]) -> dict[str, int] | None:
    """The values of a symbolic graph's size symbols in a call with ``inputs`` (None for a static graph): each
    symbol read from an input dimension that is that symbol alone, then every input dimension checked against
    its expression.  Raises ValueError naming the input, dimension and expression that disagree."""
    if not any(is_symbolic(s) for node in graph.inputs for s in node.shape):
        return None
    env: dict[str, int] = {}
    for node, value in zip(graph.inputs, inputs):
        for s, actual in zip(node.shape, value.shape):
            symbol = as_symbol(s)
            if symbol is not None:
                env.setdefault(symbol.name, int(actual))
    for k, (node, value) in enumerate(zip(graph.inputs, inputs)):
        if len(node.shape) != value.dim():
            raise ValueError(f"input {k}: expected {len(node.shape)} dimensions, got shape {list(value.shape)}")
        for d, (s, actual) in enumerate(zip(node.shape, value.shape)):
            try:
                want = evaluate(s, env)
            except KeyError as missing:
                raise ValueError(f"input {k}: size symbol {missing} is no input's dimension") from None
            if want != actual:
                raise ValueError(f"input {k}: dimension {d} is {s} = {want} for this call's sizes {env}, got "
                                 f"{actual}")
    return env


def interpret(graph: Graph, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Run ``graph`` on ``inputs`` with eager torch; returns the outputs in order."""
    if len(inputs) != len(graph.inputs):
        raise ValueError(f"interpret: graph takes {len(graph.inputs)} inputs, got {len(inputs)}")
    sizes = bind_sizes(graph, inputs)
    env: dict[Node, torch.Tensor] = {}
    for node, value in zip(graph.inputs, inputs):
        env[node] = value
    for n in graph.nodes:
        if n.op is Op.INPUT:
            continue
        env[n] = eval_node(n, [env[i] for i in n.inputs], sizes)
    return [env[o] for o in graph.outputs]


def view_function(n: Node) -> Callable[[torch.Tensor], torch.Tensor]:
    """A fast closure applying view node ``n`` to its input (the runtime's per-call view chains)."""
    if n.op is Op.RESHAPE:
        shape = n.shape
        return lambda t: t.reshape(shape)
    if n.op is Op.PERMUTE:
        dims = n.attr("dims")
        return lambda t: t.permute(dims)
    if n.op is Op.EXPAND:
        shape = n.shape
        return lambda t: t.expand(shape)
    return lambda t: eval_node(n, [t])


def view_chain(n: Node, is_base: Callable[[Node], bool] | None = None) -> tuple[Node, list[Node]]:
    """(base, the view ops from it up to ``n``, innermost first): ``n``'s view chain down to the first node
    ``is_base`` accepts (default: the first that is not a view) - what ``view_layout`` takes."""
    chain = []
    while not (is_base(n) if is_base is not None else n.op not in VIEW):
        chain.append(n)
        n = n.inputs[0]
    return n, chain[::-1]


def constant_value(n: Node) -> torch.Tensor | None:
    """The value of a constant, or of a view chain of one (a transposed or sliced weight); None for anything else."""
    base, chain = view_chain(n)
    if base.op is not Op.CONSTANT:
        return None
    value = base.attr("value").tensor
    for v in chain:
        value = view_function(v)(value)
    return value


def view_layout(shape: Sequence[int], strides: Sequence[int], dtype: torch.dtype,
                chain: Sequence[Node]) -> tuple[tuple[int, ...], int] | None:
    """(strides, storage offset in elements) of the view chain ``chain`` (outermost last) applied to a value of
    ``shape`` laid out with ``strides``, or None where some step of it is not a view of that layout.

    [Note: reshape is not always a view] ``reshape`` of a permuted or expanded value copies (a transposed
    ``[17, 2, 256]`` input merged to ``[34, 256]`` for a linear layer), so its strides describe the copy, not
    the held buffer: code that addresses the buffer through them reads the wrong elements.  The chain runs on a
    meta tensor, and a step whose result leaves the base's storage ends the view."""
    if any(is_symbolic(x) for x in (*shape, *strides)) or any(is_symbolic(x) for n in chain for x in n.shape):
        return None  # (symbolic sizes: not decided here - callers take it as a copy, which is always right)
    meta = torch.empty_strided(tuple(shape), tuple(strides), dtype=dtype, device="meta")
    storage = meta.untyped_storage()._cdata
    t = meta
    for n in chain:
        t = view_function(n)(t)
        if t.untyped_storage()._cdata != storage:
            return None
    return tuple(t.stride()), t.storage_offset()
