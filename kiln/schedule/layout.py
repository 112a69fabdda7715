"""Layout choice: convolutions and the kernels between them work in channels-last (NHWC).

oneDNN's direct convolutions can run faster on NHWC data than on NCHW (the seed model's two
convolutions alone: about 12% less time in an op-level test).  End to end on one thread the gain did not
hold (seed within 3%, ResNet-18 9% slower, where residual kernels mix layouts), so
``Config.layout_optimization`` (force it on) is off; by default ``schedule/choose.py`` builds both plans
for a graph with convolutions and keeps the one that measures faster (seed: channels-last, 81 vs 89 ms;
ResNet-18: contiguous, 48 vs 53 ms).

The user's tensors stay NCHW; inside a graph, a buffer is stored channels-last when a convolution reads
it, and a convolution's output is produced channels-last when a kernel that feeds another convolution reads
it.  The last convolution of a chain writes NCHW directly (the library reorders on the fly), so no separate
transpose pass is needed.  Kernels index every buffer through its strides, and a pointwise kernel whose
outputs are channels-last iterates in NHWC order, so its loads and stores stay contiguous.

Example (seed model): conv1 -> NHWC buffer -> relu kernel (NHWC loop) -> NHWC buffer -> conv2 -> NCHW output
buffer -> relu kernel -> NCHW graph output.
"""
from __future__ import annotations

from typing import Any

import torch

from kiln import library
from kiln.ir.graph import Graph, GraphBuilder, Node, mutates
from kiln.ir.interp import view_chain, view_layout
from kiln.ir.ops import VIEW, Op, channels_last_strides, contiguous_strides
from kiln.ir.program import Plan
from kiln.passes.rewrite import copy_with_inputs
from kiln.runtime import native

aten = torch.ops.aten
NHWC_ORDER = (0, 2, 3, 1)  # loop/memory order of the logical dims (N, C, H, W)


def _is_aten_conv2d(n: Node) -> bool:
    """ATen's 2-D floating-point convolution (not transposed): oneDNN or cuDNN behind it reads channels-last."""
    if n.op is not Op.EXTERN or n.attr("out_index") is not None or not n.dtype.is_floating_point:
        return False
    if getattr(n.attr("target"), "overloadpacket", None) is not aten.convolution or len(n.shape) != 4:
        return False
    args, _ = n.attr("template")
    return not args[6]  # not transposed


def is_conv2d(n: Node) -> bool:
    """A 2-D convolution: ATen's, or one of kiln's operators' (oneDNN's prepacked, kiln's Winograd...)."""
    return library.is_conv2d(n) or _is_aten_conv2d(n)


def library_layouts(graph: Graph) -> dict[Node, tuple[int, ...]]:
    """Buffers whose layout their library fixes (``Operator.fixed_strides``): e.g. oneDNN's prepacked and kiln's
    Winograd convolutions write channels-last; fused attention writes [B, H, T, D] as a transposed view of
    [B, T, H, D] (the heads' merge is then a view)."""
    return {n: s for n in graph.nodes if (s := library.fixed_strides(n)) is not None}


def input_layouts(graph: Graph) -> dict[Node, tuple[int, ...]]:
    """Inputs that come in a layout of their own (``Op.INPUT``'s ``strides``: a training backward's saved values
    in the layout its forward chose, [Note: saved activations channels-last]): kernels read them through it."""
    return {n: n.attr("strides") for n in graph.inputs if n.attr("strides") is not None}


def _conv_backward(n: Node) -> bool:
    """An output of ATen's ``convolution_backward`` (grad_output, input, weight are its first three operands)."""
    return n.op is Op.EXTERN and getattr(n.attr("target"), "overloadpacket", None) is aten.convolution_backward \
        and len(n.inputs) >= 3 and len(n.inputs[1].shape) == 4


def choose_layouts(graph: Graph, steps: list[Any], group_of: dict[Node, int], readers: dict[Node, set[Any]],
                   stored: set[Node], free: set[Node] = frozenset()) -> tuple[dict[Node, tuple[int, ...]], set[Node]]:
    """(channels-last buffers -> strides, convolutions to run on channels-last inputs and weights).

    Only pointwise kernels' outputs are stored channels-last (their store index follows the buffer's
    strides); values stored once per row of a reduction keep the contiguous layout.  ``free``: graph outputs
    whose layout is kiln's to choose (a training forward's saved values: [Note: saved activations
    channels-last]); in a training backward, ``convolution_backward`` reads its input (a saved value) and the
    incoming gradient channels-last, and its results come channels-last."""
    convs = [n for n in graph.nodes if is_conv2d(n)]
    backward = [n for n in graph.nodes if _conv_backward(n)]
    outputs = set(graph.outputs) - set(free)
    nhwc: dict[Node, tuple[int, ...]] = library_layouts(graph)
    inputs = input_layouts(graph)

    def pointwise_output(x: Node) -> bool:
        return x in stored and x in group_of and len(x.shape) == 4 and x not in outputs \
            and getattr(steps[group_of[x]], "axes", 0) is None

    for conv in convs:
        x = conv.inputs[0]
        if pointwise_output(x):
            nhwc[x] = channels_last_strides(x.shape)
    cl_inputs = {x for x, st in inputs.items() if len(x.shape) == 4 and st == channels_last_strides(x.shape)}
    for n in backward:
        grad, x = n.inputs[0], n.inputs[1]
        if (x in nhwc or x in cl_inputs or pointwise_output(x)) and pointwise_output(grad):
            nhwc[grad] = channels_last_strides(grad.shape)
        if pointwise_output(x):
            nhwc[x] = channels_last_strides(x.shape)
    nhwc_groups = {group_of[m] for m in nhwc if m in group_of}
    for conv in convs:
        feeds_nhwc = bool(readers.get(conv, set()) & nhwc_groups)
        if conv not in outputs and (feeds_nhwc or conv.inputs[0] in nhwc):
            nhwc[conv] = channels_last_strides(conv.shape)
    for n in backward:  # (cuDNN's results are channels-last when its input or gradient is)
        operands_cl = any(v in nhwc or v in cl_inputs for v in n.inputs[:2])
        if operands_cl and n.attr("out_index") in (0, 1) and len(n.shape) == 4 and n not in outputs:
            nhwc[n] = channels_last_strides(n.shape)
    if free or inputs:  # a training step's graphs: a weight cast for the convolutions alone (autocast's bf16 copy)
        users = graph.users()

        def runs_cl(u: Node) -> bool:
            # (ATen runs a convolution channels-last when its input *or its weight* is: a channels-last weight
            # beside NCHW activations had ATen copy the input and the incoming gradient to channels-last, and its
            # results come back channels-last where the kernels read NCHW - ResNet-18's deeper layers, whose
            # BatchNorm outputs are a reduction's and stay NCHW: 68 ATen copies a step on the H100)
            if is_conv2d(u):
                return u in nhwc or u.inputs[0] in nhwc
            return any(v in nhwc or v in cl_inputs for v in u.inputs[:2])
        for n in convs + backward:
            w = n.inputs[1] if n in convs else n.inputs[2]
            if pointwise_output(w) and needs_relayout(w.shape) \
                    and all((is_conv2d(u) or _conv_backward(u)) and runs_cl(u) for u in users[w]):
                nhwc[w] = channels_last_strides(w.shape)
    # ATen's convolutions are told to run channels-last; the operators' read any layout
    cl_convs = {c for c in convs if (c in nhwc or c.inputs[0] in nhwc) and _is_aten_conv2d(c)}
    # weights go channels-last only when nothing but convolutions reads them
    cl_convs = {c for c in cl_convs if readers.get(c.inputs[1], set()) <= {"extern"}}
    for c in cl_convs:  # a weight's channels-last copy (relayout_copies), made by a kernel of ours
        if c.inputs[1].attr(WEIGHT_COPY):
            nhwc[c.inputs[1]] = channels_last_strides(c.inputs[1].shape)
    return nhwc, cl_convs


WEIGHT_COPY = "channels_last_weight"  # attributes of the copy nodes relayout_copies inserts
VIEW_COPY = "view_copy"


# ATen ops that refuse an operand whose last dim is not unit-stride ("(*bias): last dimension must be
# contiguous" from the memory-efficient attention kernel, which the CUDA SDPA's front end would have made
# contiguous before the call: Swin's relative-position bias is a permuted view, kept as one by kiln's plan), by
# the names of those operands in the op's schema.
_UNIT_LAST_STRIDE = {
    aten._scaled_dot_product_efficient_attention.default: ("query", "key", "value", "attn_bias"),
    aten._scaled_dot_product_flash_attention.default: ("query", "key", "value"),
    aten._scaled_dot_product_cudnn_attention.default: ("query", "key", "value", "attn_bias"),
    aten._efficient_attention_forward.default: ("query", "key", "value", "bias"),
    aten._flash_attention_forward.default: ("query", "key", "value"),
}


def _unit_last_operands(n: Node) -> set[int]:
    """The positions in ``n.inputs`` of the operands its op needs with a unit-stride last dim."""
    names = _UNIT_LAST_STRIDE.get(n.attr("target"))
    if not names:
        return set()
    named = [v for name, v in native.named_args(n).items() if name in names]
    return {k for k, x in enumerate(n.inputs) if any(v is x for v in named)}


def needs_relayout(shape: tuple[int, ...]) -> bool:
    """Does a 4-D tensor's channels-last layout order its memory differently from the contiguous one?  Not where
    the dims that move have size 1: a 1x1 convolution's weight [K, C, 1, 1], a depthwise one's [K, 1, kh, kw]."""
    moved = [d for d in (1, 2, 3) if shape[d] != 1]
    return moved != sorted(moved, key=(0, 2, 3, 1).index)


def relayout_copies(graph: Graph, plan: Plan, weights: bool) -> Graph:
    """``graph`` with the layout changes a GPU call would otherwise leave to ATen made by copy kernels of kiln's
    (pointwise kernels like any other, their buffers reused once read), rebuilt once from ``plan`` (its
    ``make_plan``):

    - **copying views**: a library call's operand that is a view chain its realized base cannot give in the
      layout the plan stores it in (``view_layout`` is None: a reshape of a permuted value, e.g. attention heads
      merged back for the output projection), or an operand of an op that needs a unit-stride last dim
      (``_UNIT_LAST_STRIDE``: ATen's attention kernels) laid out otherwise.  The generated call would run the
      chain with ``reshape``, which copies with ATen's generic strided copy (GPT at 8x512 on the H200: 16 such
      copies, 213 of its 1115 us); the copy node's kernel reads through the views by index and writes the
      operand contiguous;
    - **weights** (``weights``: where the model's weights may not be held twice, a GPU in default mode): each
      channels-last convolution's constant weight copied channels-last just before it.  Left as they are, cuDNN
      converts each weight inside the call with ATen's copy (3 us each in ResNet-18 on the H200, 54 of its 232
      us); ``choose_layouts`` stores the copy channels-last.

    Before/after::

        %w = constant [64, 64, 3, 3]            %w = constant [64, 64, 3, 3]
        %y = extern aten.convolution(%x, %w)    %w' = cast(%w) {channels_last_weight}
                                                %y = extern aten.convolution(%x, %w')
        %p = permute(%o, [0, 2, 1, 3])          %p = permute(%o, [0, 2, 1, 3])
        %r = reshape(%p, [4096, 768])           %r = reshape(%p, [4096, 768])
        %z = extern aten.addmm(%b, %r, %w)      %r' = cast(%r) {view_copy}
                                                %z = extern aten.addmm(%b, %r', %w)
    """
    chosen_weights = {c for c in plan.cl_convs if c.inputs[1].op is Op.CONSTANT
                      and needs_relayout(c.inputs[1].shape)} if weights else set()

    def copies(v: Node, unit_last: bool) -> list[Node] | None:
        """Where ``v`` is a view chain the generated call would have to run as a copy: the part of the chain the
        copy takes - up to its first step that is no view of the base (a reshape of a permuted value; the later
        steps, e.g. the transpose a weight gradient's product reads, are views of the copy: one copy serves
        both ``r`` and ``t(r)``, where a copy each wrote the transposed one with scattered stores, BERT-base's
        step on the H100: 36 copies, 0.46 ms); or the whole chain where ``unit_last`` finds a value whose layout
        has a non-unit stride along its last dim.  None: no copy."""
        base, chain = view_chain(v, lambda m: m in plan.buffer_of or m.op not in VIEW)
        if base not in plan.buffer_of or base.op is Op.CONSTANT:  # (a weight's view is made once)
            return None
        strides = plan.strides_of.get(base) or contiguous_strides(base.shape)
        found = view_layout(base.shape, strides, base.dtype, chain) if chain else (strides, 0)
        if found is None:  # (only a chain can fail to be a view)
            if unit_last:
                return []
            cut = next(i for i in range(1, len(chain) + 1)
                       if view_layout(base.shape, strides, base.dtype, chain[:i]) is None)
            value = chain[cut - 1]  # (what the copy makes: the rest must be views of it, dense)
            rest_is_view = view_layout(value.shape, contiguous_strides(value.shape), value.dtype, chain[cut:])
            return chain[cut:] if rest_is_view is not None else []
        return [] if unit_last and len(v.shape) > 0 and v.shape[-1] > 1 and found[0][-1] != 1 else None

    # library call -> {operand position: the views taken of the copy (none: the operand is the copy)}
    copied: dict[Node, dict[int, list[Node]]] = {}
    for n in graph.nodes:
        if n.op is not Op.EXTERN or mutates(n):
            continue
        unit_last = _unit_last_operands(n)
        if ks := {k: rest for k, x in enumerate(n.inputs) if (rest := copies(x, k in unit_last)) is not None}:
            copied[n] = ks
    if not chosen_weights and not copied:
        return graph
    b = GraphBuilder()
    new: dict[Node, Node] = {}
    made: dict[Node, Node] = {}  # one copy per view read by several calls (and the views taken of it)
    for n in graph.nodes:
        inputs = list(new[i] for i in n.inputs)
        for k, rest in copied.get(n, {}).items():
            v = rest[0].inputs[0] if rest else n.inputs[k]  # (the value the copy makes)
            if v not in made:
                made[v] = b.add(Op.CAST, [new[v]], dtype=v.dtype, **{VIEW_COPY: True})
            for view in rest:
                if view not in made:
                    made[view] = copy_with_inputs(view, (made[view.inputs[0]],), b)
            inputs[k] = made[rest[-1] if rest else v]
        if n in chosen_weights:
            w = inputs[1]
            inputs[1] = b.add(Op.CAST, [w], dtype=w.dtype, **{WEIGHT_COPY: True})
        new[n] = copy_with_inputs(n, tuple(inputs), b)
    return b.finish([new[o] for o in graph.outputs])
