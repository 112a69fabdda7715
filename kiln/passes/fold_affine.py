"""Fold a per-channel affine map that follows a convolution or linear layer into its weights.

This is how BatchNorm disappears in inference: the lowering turns it into ``x * scale + shift`` with
per-channel constants, and here ``conv(x, W, b) * s + t`` becomes ``conv(x, W * s, b * s + t)``; likewise
``addmm(b, x, Wt) * s + t`` -> ``addmm(b * s + t, x, Wt * s)`` and ``mm(x, Wt) + t`` -> ``addmm(t, x, Wt)``.
On a GPU with ``Config.gpu_weight_copies`` off nothing is folded (``copy_weights``): ``W * s`` would be a second
copy of the weight beside the model's own (and ``b * s + t`` a new bias), while scale and shift cost nothing
in the pointwise kernel that follows the convolution anyway.

Before::                                                   After::

    %2 = extern(%in0, %w, %b, target=aten.convolution...)     %2 = extern(%in0, %w', %b', target=...)
    %3 = mul(%2, expand(%scale)) ...                           (mul and add gone; %w', %b' constants)
    %5 = add(%3, expand(%shift)) ...
"""
from __future__ import annotations

import torch

from kiln.ir.extern import build_extern, extern_args
from kiln.ir.graph import ConstRef, Graph, GraphBuilder, Node
from kiln.ir.interp import constant_value
from kiln.ir.ops import VIEW, Op
from kiln.ir.sym import is_symbolic
from kiln.passes.dce import dce
from kiln.passes.rewrite import RewriteLog, rewrite

aten = torch.ops.aten


def _channel_constant(n: Node, out: Node, channel_dim: int) -> torch.Tensor | None:
    """If ``n`` is a constant broadcast that varies only along ``channel_dim`` of ``out``, its [C] values."""
    if n.shape != out.shape:
        return None
    src = n.inputs[0] if n.op is Op.EXPAND else n
    if src.op is Op.FULL:
        value = torch.full(src.shape, src.attr("value"), dtype=out.dtype)
    elif _is_const(src):   # a constant or a view of one (BatchNorm's reshape(scale, [C, 1, 1]))
        value = _const_value(src)
    else:
        return None
    aligned = [1] * (len(out.shape) - len(src.shape)) + list(src.shape)
    if any(s != 1 for d, s in enumerate(aligned) if d != channel_dim):
        return None
    return value.reshape(-1).expand(out.shape[channel_dim]).to(out.dtype).contiguous()


def _scalar(n: Node) -> float | None:
    """The value of a scalar broadcast (``expand(full(v))``, or a one-element constant), else None."""
    src = n.inputs[0] if n.op is Op.EXPAND else n
    if src.op is Op.FULL and src.numel == 1:
        return None if is_symbolic(src.attr("value")) else float(src.attr("value"))  # (a size: no constant)
    if _is_const(src) and src.numel == 1:
        return float(_const_value(src).reshape(()).item())
    return None


def _is_const(n: Node | None) -> bool:
    """A constant, or a view of one (a transposed weight)."""
    while n is not None and n.op in VIEW:
        n = n.inputs[0]
    return n is None or n.op is Op.CONSTANT


def _const_value(n: Node) -> torch.Tensor:
    value = constant_value(n)  # (callers checked ``_is_const`` first)
    assert value is not None, n
    return value


def _foldable(e: Node) -> tuple[int, list, dict] | None:
    """Channel dim and args of a conv/addmm/mm EXTERN whose weights are constants."""
    if e.op is not Op.EXTERN or e.attr("out_index") is not None:
        return None
    packet = getattr(e.attr("target"), "overloadpacket", None)
    args, kwargs = extern_args(e)
    if packet is aten.convolution and not args[6] and _is_const(args[1]) and _is_const(args[2]):
        return 1, args, kwargs
    if packet is aten.addmm and not kwargs and len(args) == 3 and _is_const(args[0]) and _is_const(args[2]) \
            and all(s == 1 for s in args[0].shape[:-1]):  # the bias must be the same for every row
        return 1, args, kwargs
    if packet is aten.mm and _is_const(args[1]):
        return 1, args, kwargs
    return None


def _weight(e: Node, args: list) -> Node:
    """The weight among a foldable extern's arguments (``_foldable``)."""
    return args[1] if e.attr("target").overloadpacket is aten.convolution else args[-1]


def _rebuild(b: GraphBuilder, e: Node, args: list, kwargs: dict, scale: torch.Tensor | None,
             shift: torch.Tensor | None) -> Node:
    packet = e.attr("target").overloadpacket
    const = lambda t: b.add(Op.CONSTANT, (), value=ConstRef(t.contiguous()))  # noqa: E731
    c = e.shape[1]
    # the per-channel values may come from scalars folded on the CPU: bring them to the weight's device
    device = _const_value(args[1] if packet is aten.convolution else args[-1]).device
    scale = None if scale is None else scale.to(device)
    shift = None if shift is None else shift.to(device)
    if packet is aten.convolution:
        w, bias = _const_value(args[1]), _const_value(args[2]) if args[2] is not None else None
        bias = torch.zeros(c, dtype=e.dtype, device=device) if bias is None else bias
        if scale is not None:
            w = w * scale.reshape(-1, *([1] * (w.dim() - 1)))
            bias = bias * scale
        if shift is not None:
            bias = bias + shift
        args = list(args)
        args[1], args[2] = const(w), const(bias)
        return build_extern(b, e.attr("target"), args, kwargs, e.shape, e.dtype)
    if packet is aten.mm:
        x, wt = args
        bias = torch.zeros(c, dtype=e.dtype, device=device)
    else:
        bias_node, x, wt = args
        bias = _const_value(bias_node).reshape(-1).expand(c)
    wt = _const_value(wt)
    if scale is not None:
        wt = wt * scale.reshape(1, -1)
        bias = bias * scale
    if shift is not None:
        bias = bias + shift
    return build_extern(b, aten.addmm.default, [const(bias), x, const(wt)], {}, e.shape, e.dtype)


def copy_weights(weight: torch.Tensor, log: RewriteLog | None) -> bool:
    """May a pass replace this weight by a modified copy?  Always on the CPU; on a GPU only in the modes that
    trade memory for speed (``log.mode`` not default), when ``Config.gpu_weight_copies`` is set (the model keeps
    its own weight, so the copy doubles its memory)."""
    from kiln import config
    mode = log.mode if log is not None else "default"
    return weight.device.type == "cpu" or config.get().holds_weight_copies(mode)


def fold_affine(graph: Graph, log: RewriteLog | None = None) -> Graph:
    graph = dce(graph)  # users counted among live nodes: a reshape that simplify merged away is not a reader
    users = graph.users()
    for o in graph.outputs:
        users[o].append(o)  # a graph output is a use: folding into it would compute the extern twice

    def single_use_views(old: Node, new: Node) -> tuple[Node, Node, list[Node]] | None:
        """(old extern, new extern, the new reshapes/permutes over it, innermost first) where ``old`` is such a
        chain of an extern, each link read by the next alone."""
        chain = []
        while old.op in (Op.RESHAPE, Op.PERMUTE) and new.op is old.op:
            if len(users.get(old, ())) != 1:
                return None
            chain.append(new)
            old, new = old.inputs[0], new.inputs[0]
        return (old, new, chain[::-1]) if chain and new.op is Op.EXTERN else None

    def scale_through_views(n: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        """``view(extern) * s`` for a scalar constant ``s`` (attention's query scaling after the projection's
        reshape and permute): ``view(extern')``, the scale folded into the weights as for a per-channel one."""
        for k in (0, 1):
            s = _scalar(inputs[1 - k])
            found = single_use_views(n.inputs[k], inputs[k]) if s is not None else None
            if found is None:
                continue
            old_e, e, chain = found
            parts = _foldable(e)
            if parts is None or len(users.get(old_e, ())) != 1:
                return None
            channel_dim, args, kwargs = parts
            if not copy_weights(_const_value(_weight(e, args)), log):
                return None
            if log:
                log.hit(f"scalar scale folded into {e.attr('target').overloadpacket.__name__} through views")
            scale = torch.full((e.shape[channel_dim],), s, dtype=e.dtype)
            out = _rebuild(b, e, args, kwargs, scale, None)
            for v in chain:
                out = b.add(v.op, (out,), shape=v.shape if v.op is Op.RESHAPE else None,
                            **{a: x for a, x in v.attrs.items() if a != "shape"})
            users[n] = users.get(n, [])
            return out
        return None

    def rule(n: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        if n.op not in (Op.MUL, Op.ADD) or not n.dtype.is_floating_point:
            return None
        if n.op is Op.MUL:
            folded = scale_through_views(n, inputs, b)
            if folded is not None:
                return folded
        e, other = inputs
        old_e = n.inputs[0]
        if e.op is not Op.EXTERN:
            e, other, old_e = other, e, n.inputs[1]
        found = _foldable(e)
        if found is None or len(users.get(old_e, ())) != 1 or e.shape != n.shape:
            return None
        channel_dim, args, kwargs = found
        value = _channel_constant(other, e, channel_dim)
        if value is None:
            return None
        if not copy_weights(_const_value(_weight(e, args)), log):
            return None  # a scaled weight (or a new bias) would be held beside the model's own; the next kernel
            #             applies scale and shift at no cost
        if log:
            log.hit(f"{'scale' if n.op is Op.MUL else 'shift'} folded into {e.attr('target').overloadpacket.__name__}")
        new = _rebuild(b, e, args, kwargs, value if n.op is Op.MUL else None, value if n.op is Op.ADD else None)
        users[n] = users.get(n, [])
        return new

    return rewrite(graph, rule)
