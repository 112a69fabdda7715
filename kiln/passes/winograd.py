"""CPU 3x3 stride-1 convolutions run as kiln's Winograd kernel where it measures faster than oneDNN, and the
bias, residual add and ReLU after them fold into that call.

oneDNN's direct convolutions already run near this core's FMA peak (seed model: 114 GFLOP/s of 117), so only a
cheaper algorithm makes them faster: Winograd's F(2x2, 3x3) does 16 multiplications where direct convolution
does 36 (``codegen/cpp_winograd.py``).  Measured per shape against oneDNN with a prepacked weight (one thread,
op level): 1.2x (7x7x512) to 1.65x (the seed's 220x220x128).  The choice is measured once per shape and
machine and kept on disk (``runtime/decisions.py``).

The epilogue is free in the output transform, while as separate kernels the add and the ReLU each cost a pass
over the output (ResNet-18's residual blocks: conv-BN-add-ReLU).  The ReLU is ``max(0, x)`` with NaN kept, as
``torch.relu`` (oneDNN's fused ReLU maps NaN to 0, so kiln never fuses it into oneDNN's calls).

A ReLU between a library's convolution and a Winograd one is applied in the Winograd input transform instead
(the seed model: oneDNN's conv1, ReLU, conv2).

Before (BN already folded into ``%w``, ``%b``)::        After::

    %5 = extern(%x, %w, %b,                              %7 = extern(%x, %b, %r, target=kiln.conv_winograd,
           target=aten.convolution.default)                     out_channels=64, tile=2, padding=[1, 1],
    %6 = add(%5, %r)                                              relu=True)   # transformed weight baked in
    %7 = relu(%6)
"""
from __future__ import annotations

import torch

from kiln import config
from kiln.frontend.extern import Baked, build_extern, extern_args
from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.ops import Op
from kiln.passes import prepack_conv
from kiln.passes.dce import dce
from kiln.passes.rewrite import RewriteLog, rewrite
from kiln.runtime import cpu_conv, decisions

aten = torch.ops.aten
_choices = decisions.ShapeChoices("conv_choices-v1")
MIN_FLOPS = 1 << 22  # below this the call overhead decides, not the algorithm


def tiles() -> tuple[int, ...]:
    """Winograd tile sizes allowed by ``Config.winograd_tiles``."""
    text = config.get().winograd_tiles.strip()
    sizes = tuple(int(v) for v in text.split(",") if v.strip()) if text else ()
    bad = [m for m in sizes if m not in cpu_conv.TILE_SIZES]
    if bad:
        raise ValueError(f"kiln: winograd_tiles {text!r}: tile sizes must be among {cpu_conv.TILE_SIZES}")
    return sizes


def is_winograd_conv(n: Node) -> bool:
    return n.op is Op.EXTERN and n.attr("target") is torch.ops.kiln.conv_winograd.default


# kiln::conv_winograd's arguments, in order (runtime/cpu_conv.py)
ARG_NAMES = ("x", "packed", "bias", "residual", "out_channels", "tile", "padding", "relu", "channels_last",
             "relu_input")


def _args(conv: Node) -> dict[str, object]:
    """A Winograd extern's arguments by name (its input nodes substituted back in)."""
    return dict(zip(ARG_NAMES, extern_args(conv)[0]))


def writes_channels_last(n: Node) -> bool:
    """A Winograd extern whose result is channels-last (all but those that write a graph output)."""
    return is_winograd_conv(n) and bool(_args(n)["channels_last"])


def choose(x_shape: tuple[int, ...], w_shape: tuple[int, ...], padding: list[int]) -> int:
    """The Winograd tile size to use for this convolution, or 0 for oneDNN; measured once per shape, thread
    count and allowed tile sizes on random data (channels-last, as kiln's graphs feed it)."""
    allowed = tiles()
    n, c, h, w = x_shape
    k = w_shape[0]
    key = (n, c, h, w, k, *padding, torch.get_num_threads(), *allowed)

    def calls() -> dict:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(x_shape, generator=gen).contiguous(memory_format=torch.channels_last)
        weight = torch.randn(w_shape, generator=gen) / (3 * c ** 0.5)
        bias = torch.randn(k, generator=gen)
        if prepack_conv.available():
            packed = torch.ops.mkldnn._reorder_convolution_weight(weight, padding, [1, 1], [1, 1], 1, list(x_shape))
            out = {"0": lambda: torch.ops.mkldnn._convolution_pointwise(x, packed, bias, padding, [1, 1], [1, 1], 1,
                                                                        "none", [], "")}
        else:
            out = {"0": lambda: torch.ops.aten.convolution(x, weight, bias, [1, 1], padding, [1, 1], False, [0, 0],
                                                           1)}
        for m in allowed:
            u = cpu_conv.transform_weight(weight, m)
            out[str(m)] = lambda u=u, m=m: torch.ops.kiln.conv_winograd(x, u, bias, None, k, m, padding, False)
        return out

    return int(_choices.decide(key, calls, baseline="0",
                               what=f"conv {list(x_shape)} x {list(w_shape)} (0: oneDNN, m: Winograd F(m))"))


def _candidate(node: Node) -> list | None:
    """The convolution's arguments when Winograd can compute it: fp32 3x3 stride 1 on the CPU, a constant weight,
    big enough that the algorithm, not the call, decides."""
    if node.op is not Op.EXTERN or node.dtype != torch.float32 or node.attr("out_index") is not None \
            or getattr(node.attr("target"), "overloadpacket", None) is not aten.convolution or len(node.shape) != 4:
        return None
    args, kwargs = extern_args(node)
    if kwargs or len(args) != 9:
        return None
    x, w, bias, stride, padding, dilation, transposed, _, groups = args
    if transposed or not isinstance(w, Node) or w.op is not Op.CONSTANT or w.dtype != torch.float32 \
            or not isinstance(x, Node) or len(x.shape) != 4 \
            or not cpu_conv.supports(w.shape, stride, dilation, groups) \
            or (bias is not None and (not isinstance(bias, Node) or bias.dtype != torch.float32)) \
            or w.attr("value").tensor.device.type != "cpu" or 2 * node.numel * x.shape[1] * 9 < MIN_FLOPS:
        return None
    return args


def _to_winograd(node: Node, inputs: tuple[Node, ...], b: GraphBuilder, log: RewriteLog | None) -> Node | None:
    args = _candidate(Node(node.op, inputs, node.attrs, node.shape, node.dtype))
    if args is None:
        return None
    x, w, bias, _, padding = args[:5]
    weight = w.attr("value").tensor
    tile = choose(tuple(x.shape), tuple(w.shape), list(padding))
    if not tile:
        return None
    if log:
        log.hit(f"convolution -> kiln Winograd F({tile}x{tile}, 3x3)")
    packed = cpu_conv.transform_weight(weight.float(), tile)
    args = dict(x=x, packed=Baked(packed, f"winograd{tile}{list(w.shape)}"), bias=bias, residual=None,
                out_channels=node.shape[1], tile=tile, padding=list(padding), relu=False, channels_last=True,
                relu_input=False)
    return build_extern(b, torch.ops.kiln.conv_winograd.default, [args[name] for name in ARG_NAMES], {}, node.shape,
                        node.dtype)


def _rebuilt(conv: Node, b: GraphBuilder, **changes: object) -> Node:
    """``conv`` (a Winograd extern) with some of its arguments replaced."""
    values = {**_args(conv), **changes}
    return build_extern(b, conv.attr("target"), [values[name] for name in ARG_NAMES], {}, conv.shape, conv.dtype)


def _absorb_epilogue(node: Node, inputs: tuple[Node, ...], b: GraphBuilder, uses: dict[Node, int],
                     outputs: set[Node], log: RewriteLog | None) -> Node | None:
    """``relu(conv)`` and ``conv + r`` (r of the same shape) become the convolution's epilogue, when the
    convolution's result has no other use; an add only before the ReLU (the kernel adds, then clamps).  A ReLU
    whose only reader is a Winograd convolution and which no epilogue took (it follows oneDNN's convolution,
    whose own ReLU maps NaN to 0) is applied by that convolution as it reads its input."""
    def fusable(original: Node, rewritten: Node) -> bool:
        return is_winograd_conv(rewritten) and uses.get(original, 0) == 1 and original not in outputs

    if is_winograd_conv(node) and inputs[0].op is Op.RELU and uses.get(node.inputs[0], 0) == 1 \
            and node.inputs[0] not in outputs and not _args(node)["relu_input"]:
        if log:
            log.hit("relu -> Winograd input")  # a producer the epilogue rule could not take (a library's)
        return _rebuilt(Node(node.op, inputs, node.attrs, node.shape, node.dtype), b, x=inputs[0].inputs[0],
                        relu_input=True)
    if node.op is Op.RELU and fusable(node.inputs[0], inputs[0]) and not _args(inputs[0])["relu"]:
        if log:
            log.hit("relu -> Winograd epilogue")
        return _rebuilt(inputs[0], b, relu=True)
    if node.op is Op.ADD and node.dtype == torch.float32 and len(inputs) == 2:
        for i in (0, 1):
            conv, other = inputs[i], inputs[1 - i]
            if fusable(node.inputs[i], conv) and other.shape == conv.shape == node.shape \
                    and other.dtype == torch.float32 and _args(conv)["residual"] is None \
                    and not _args(conv)["relu"]:
                if log:
                    log.hit("residual add -> Winograd epilogue")
                return _rebuilt(conv, b, residual=other)
    return None


def winograd_conv(graph: Graph, log: RewriteLog | None = None) -> Graph:
    if not tiles() or not any(_candidate(n) for n in graph.nodes) or not cpu_conv.available():
        return graph  # (available() builds the library: only for graphs with a CPU convolution to give it)
    # dead nodes first (folding leaves the unfolded convolutions behind): not converted, and not counted as uses
    graph = dce(rewrite(dce(graph), lambda node, inputs, b: _to_winograd(node, inputs, b, log)))
    if not any(is_winograd_conv(n) for n in graph.nodes):
        return graph
    uses = {n: len(users) for n, users in graph.users().items()}
    outputs = set(graph.outputs)
    graph = dce(rewrite(graph, lambda node, inputs, b: _absorb_epilogue(node, inputs, b, uses, outputs, log)))
    # a graph output is written in eager's layout (NCHW) by the kernel itself: cheaper than a copy afterwards
    outputs = set(graph.outputs)
    return rewrite(graph, lambda node, inputs, b: _rebuilt(node, b, channels_last=False)
                   if is_winograd_conv(node) and node in outputs else None)
