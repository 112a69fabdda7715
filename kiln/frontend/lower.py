"""FX (ATen) graph -> kiln graph IR.

Placeholders whose values are frozen (module parameters and buffers in inference) become CONSTANT nodes;
the rest become INPUT nodes.  Each call_function goes through the lowering table; ops without a lowering,
or whose lowering declines, become EXTERN nodes.
"""
from __future__ import annotations

import operator
from typing import Any, Sequence

import torch
import torch.fx

from kiln.frontend import aten_movement  # noqa: F401  (registers the movement lowerings)
from kiln.frontend import aten_pool  # noqa: F401  (registers the pooling lowerings)
from kiln.frontend.aten import LOWERINGS
from kiln.frontend.effects import is_effect_token, lower_with_effects
from kiln.frontend.lowering_base import KERNEL_DTYPES, Lowerer, Unsupported, meta_shape, sym_size
from kiln.ir.graph import ConstRef, Graph, GraphBuilder, Node
from kiln.ir.ops import ELEMENTWISE, HALF, REDUCTION, Op

# placeholder meta key: a training backward's input in the layout its forward chose ([Note: saved activations
# channels-last], frontend/training.py)
LAID_OUT = "kiln_laid_out"


class LoweringError(RuntimeError):
    pass


def _tensors_in(v: Any) -> list[Any]:
    if isinstance(v, (torch.Tensor, Node)):
        return [v]
    if isinstance(v, (list, tuple)):
        return [t for x in v for t in _tensors_in(x)]
    return []


def _kernel_dtypes_only(fx_node: torch.fx.Node, args: Sequence[Any], kwargs: dict[str, Any],
                        dtypes: frozenset[torch.dtype]) -> bool:
    vals = _tensors_in(fx_node.meta.get("val"))
    vals += _tensors_in(list(args)) + _tensors_in(list(kwargs.values()))
    return all(v.dtype in dtypes for v in vals)


def _rounds_inside(nodes: list[Node]) -> bool:
    """Does a lowering compute in half precision in more than one step?

    [Note: composite ops in half precision] ATen computes a composite op on bf16/fp16 (gelu, layer_norm, softmax,
    a variance) in fp32 and rounds its result once; lowered to primitives in the input's type, every primitive
    would round (kiln's kernels hold half-precision values rounded, like ATen between ops), a few ulps off
    eager.  Such a lowering's nodes are rebuilt in fp32 (``_in_fp32``), its results cast back."""
    return sum(n.dtype in HALF and (n.op in ELEMENTWISE or n.op in REDUCTION) for n in nodes) > 1


def _in_fp32(L: Lowerer, mark: int, result: Any) -> Any:
    """The nodes a lowering added (from ``mark`` on) rebuilt to compute in fp32: half-precision values become
    fp32 ones, half-precision inputs from outside are cast up once, and the results are cast back down."""
    added = L.b.nodes[mark:]
    del L.b.nodes[mark:]
    new: dict[Node, Node] = {}
    outside: dict[Node, Node] = {}

    def source(i: Node) -> Node:
        if i in new:
            return new[i]
        if i.dtype in HALF:
            if i not in outside:
                outside[i] = L.b.add(Op.CAST, [i], dtype=torch.float32)
            return outside[i]
        return i
    for n in added:
        dtype = torch.float32 if n.dtype in HALF else n.dtype
        attrs = n.attrs
        if n.op is Op.CONSTANT and n.dtype in HALF:  # a constant's type is its tensor's (avg_pool2d's divisors)
            attrs = {**attrs, "value": ConstRef(attrs["value"].tensor.float())}
        new[n] = L.b.add_node(Node(n.op, tuple(source(i) for i in n.inputs), attrs, n.shape, dtype))

    def down(v: Any) -> Any:
        if isinstance(v, Node) and v in new:
            return L.b.add(Op.CAST, [new[v]], dtype=v.dtype) if v.dtype in HALF else new[v]
        if isinstance(v, (list, tuple)):
            return type(v)(down(x) for x in v)
        return v
    return down(result)


def _has_symbols(v: Any) -> bool:
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return True
    if isinstance(v, torch.Tensor):
        return any(isinstance(s, torch.SymInt) for s in v.shape)
    if isinstance(v, (list, tuple)):
        return any(_has_symbols(x) for x in v)
    return False


def symbol_inputs(gm: torch.fx.GraphModule) -> list[tuple[str, int]]:
    """(symbol name, placeholder position) of each int input that is one size symbol alone: the values Dynamo
    passes for the graph's symbols (a symbolic graph's call binds them from there)."""
    found = []
    position = 0
    for fx_node in gm.graph.nodes:
        if fx_node.op != "placeholder":
            continue
        val = fx_node.meta.get("val")
        if isinstance(val, torch.SymInt):
            expr = val.node.expr
            if getattr(expr, "is_Symbol", False):
                found.append((expr.name, position))
        position += 1
    return found


def has_symbolic_sizes(gm: torch.fx.GraphModule) -> bool:
    """Was ``gm`` traced with dynamic shapes (does any value have a symbolic size)?"""
    return _shape_env(gm) is not None


def _shape_env(gm: torch.fx.GraphModule) -> Any:
    """The ShapeEnv of a graph traced with dynamic shapes (None if no value has a symbolic size)."""
    for fx_node in gm.graph.nodes:
        val = fx_node.meta.get("val")
        sizes = list(val.shape) if isinstance(val, torch.Tensor) else [val]
        for s in sizes:
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


def lower_fx(gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor],
             kernel_dtypes: frozenset[torch.dtype] = KERNEL_DTYPES, triton: bool = False,
             symbolic: bool = False, size_outputs: dict[int, Any] | None = None) -> tuple[Graph, list[str]]:
    """Lower ``gm``; ``frozen`` maps placeholder positions to the tensors they are frozen to.  Ops on dtypes
    outside ``kernel_dtypes`` (what the code generator handles) stay EXTERN; ``triton``: for the Triton target
    (the few lowerings whose best form differs by target ask ``Lowerer.triton``).

    ``symbolic``: a graph traced with dynamic shapes is lowered with size expressions (docs/dynamic_shapes.md:
    the graph IR and its reference interpreter take them; the code generators do not yet, so the compiler still
    refuses such graphs and runs them eagerly).  Its int placeholders (the size symbols' values) become no
    INPUT; a lowering that cannot take a symbolic size leaves its op an EXTERN; a lowering that made Dynamo add a
    guard (specialized a size) fails the whole graph.

    ``size_outputs``: where the outputs that are no tensors go - by output position, a symbolic graph's sizes
    (``x.shape[0] + n``: each a size expression for the caller to evaluate per call) and constants (``None``, a
    number); they are not graph outputs.

    Returns the graph (whose INPUTs are the non-frozen tensor placeholders, in order) and the list of ATen ops
    that stayed EXTERN.
    """
    b = GraphBuilder()
    L = Lowerer(b)
    L.kernel_dtypes = kernel_dtypes
    L.triton = triton
    shape_env = _shape_env(gm) if symbolic else None
    guards = 0
    if shape_env is not None:
        L.symbolic = True
        guards = len(shape_env.guards)
    env: dict[torch.fx.Node, Any] = {}
    outputs: list[Node] = []
    position = 0
    for fx_node in gm.graph.nodes:
        try:
            _lower_node(L, fx_node, gm, frozen, env, outputs, position, shape_env, size_outputs)
        except Unsupported as exc:  # (a size kiln has no form for, outside any op's lowering)
            raise LoweringError(f"{fx_node.format_node()}: {exc}") from exc
        position += fx_node.op == "placeholder"
    if shape_env is not None and len(shape_env.guards) != guards:
        raise LoweringError(f"lowering specialized a symbolic size (Dynamo guard {shape_env.guards[-1].expr})")
    return b.finish(outputs), L.externs


def _lower_node(L: Lowerer, fx_node: torch.fx.Node, gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor],
                env: dict[torch.fx.Node, Any], outputs: list[Node], position: int, shape_env: Any,
                size_outputs: dict[int, Any] | None = None) -> None:
    """One FX node into ``env`` (a placeholder is graph input ``position``; the graph's outputs go to
    ``outputs``)."""
    b = L.b
    val = fx_node.meta.get("val")
    if shape_env is None and _has_symbols(val):
        raise LoweringError(f"kiln compiles static shapes only, and this graph has symbolic sizes (traced with "
                            f"dynamic shapes: torch.compile(dynamic=True), or a call at a new size or new int "
                            f"argument under dynamic=None; kiln.compile uses dynamic=False): "
                            f"{fx_node.format_node()}")
    if shape_env is not None and isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        if isinstance(val, torch.SymBool):
            raise LoweringError(f"symbolic {type(val).__name__} value: {fx_node.format_node()}")
        try:  # a size symbol's value (an int placeholder), arithmetic on sizes, or a float made of them
            env[fx_node] = sym_size(val)
        except Unsupported as exc:
            raise LoweringError(f"symbolic {type(val).__name__} value {fx_node.format_node()}: {exc}") from exc
    elif fx_node.op == "placeholder":
        if is_effect_token(fx_node):  # (AOTAutograd passes None for it at run time: a constant here)
            env[fx_node] = b.add(Op.CONSTANT, (), value=ConstRef(torch.empty(0)))
        elif position in frozen:
            env[fx_node] = b.add(Op.CONSTANT, (), value=ConstRef(frozen[position].detach()))
        elif isinstance(val, torch.Tensor):
            # (a training backward's input that its forward hands over in a layout of kiln's choosing: read in
            # that layout, [Note: saved activations channels-last])
            laid_out = {"strides": tuple(val.stride())} if fx_node.meta.get(LAID_OUT) and L.triton else {}
            env[fx_node] = b.add(Op.INPUT, (), shape=meta_shape(val), dtype=val.dtype, index=position,
                                 name=fx_node.name, **laid_out)
        else:
            raise LoweringError(f"non-tensor input {fx_node.name}")
    elif fx_node.op == "get_attr":
        value = getattr(gm, fx_node.target)
        if not isinstance(value, torch.Tensor):
            raise LoweringError(f"get_attr of {type(value).__name__}")
        env[fx_node] = b.add(Op.CONSTANT, (), value=ConstRef(value.detach()))
    elif fx_node.op == "call_function":
        env[fx_node] = _lower_call(L, fx_node, env)
    elif fx_node.op == "output":
        outs = fx_node.args[0]
        for k, o in enumerate(outs if isinstance(outs, (list, tuple)) else [outs]):
            value = env[o] if isinstance(o, torch.fx.Node) else o
            if size_outputs is not None and shape_env is not None and isinstance(o, torch.fx.Node) \
                    and isinstance(o.meta.get("val"), torch.SymInt):
                size_outputs[k] = value  # (a size the caller evaluates per call)
                continue
            if size_outputs is not None and (o is None or type(o) in (int, float, bool)):
                size_outputs[k] = o  # (a constant the caller puts back: a backward graph's None gradient)
                continue
            if not isinstance(value, Node):
                raise LoweringError(f"graph output {o} is not a tensor")
            outputs.append(value)
    else:
        raise LoweringError(f"unsupported FX node kind {fx_node.op}")


def _lower_call(L: Lowerer, fx_node: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> Any:
    args = torch.fx.node.map_arg(fx_node.args, lambda a: env[a])
    kwargs = torch.fx.node.map_arg(fx_node.kwargs, lambda a: env[a])
    target = fx_node.target
    if target is operator.getitem:
        return args[0][args[1]]
    if target is torch.ops.higher_order.with_effects:
        lowered = lower_with_effects(L, args, kwargs)  # (see kiln/frontend/effects.py)
        if lowered is None:
            raise LoweringError(f"cannot lower call to with_effects of {args[1]}")
        return lowered
    packet = getattr(target, "overloadpacket", None)
    lowering = LOWERINGS.get(packet) or LOWERINGS.get(getattr(packet, "_qualified_op_name", None))
    if lowering is not None and _kernel_dtypes_only(fx_node, args, kwargs, L.kernel_dtypes):
        mark = len(L.b.nodes)
        # a lowering written for static sizes meets a size expression where it needs an int (a comparison, a
        # range): with symbolic sizes that is a TypeError, and the op stays the ATen call
        # (and two sizes Dynamo proved equal under its guards may differ as expressions - (s + 1) // 2 and
        # s - (s + 1) // 2 for an even s - which broadcasting reports as a ValueError)
        declined = (Unsupported, TypeError, ValueError) if L.symbolic else Unsupported
        try:
            result = lowering(L, fx_node, *args, **kwargs)
            if _rounds_inside(L.b.nodes[mark:]):
                result = _in_fp32(L, mark, result)
            return result
        except declined:
            del L.b.nodes[mark:]  # drop half-built nodes; they are unreferenced
    if not isinstance(target, torch._ops.OpOverload):
        raise LoweringError(f"cannot lower call to {target}")
    return L.extern(fx_node, args, kwargs)
