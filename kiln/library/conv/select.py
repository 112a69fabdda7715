"""CPU convolutions run as one of kiln's own kernels where it measures faster than oneDNN - Winograd for 3x3
stride 1, the implicit GEMM (``library/conv/source_gemm.py``) for any filter and stride - and the bias, residual
add and ReLU after them fold into that call.

oneDNN's direct convolutions already run near this core's FMA peak (seed model: 114 GFLOP/s of 117), so only a
cheaper algorithm makes them faster: Winograd's F(2x2, 3x3) does 16 multiplications where direct convolution
does 36 (``library/conv/source_winograd.py``).  Measured per shape against oneDNN with a prepacked weight (one thread,
op level): 1.2x (7x7x512) to 1.65x (the seed's 220x220x128).  The choice is measured once per shape and
machine and kept in the tuning database (``tune/choices.py``).

The implicit GEMM has no arithmetic advantage; it is the generated convolution for the shapes Winograd cannot
take (1x1, strided, other filter sizes), chosen only where it measures faster.  Depthwise convolutions (one
filter per channel) have no channel reduction to make a GEMM of; kiln's direct depthwise kernel
(``library/conv/source_dw.py``) is measured against oneDNN for them.  On the AVX2 dev box (Zen 3)
``benchmarks/cpu_conv.py`` had it at 0.72-0.92x oneDNN on ResNet-18's layers and 0.46-0.58x on the 3-channel
first layers (the packing dominates), so there oneDNN keeps them.

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

import functools
import math
from typing import Any, Callable

import torch

from kiln import config
from kiln.library.conv.source_gemm import DIRECT_MAX_CHANNELS
from kiln.ir.extern import Baked, build_extern, checked_source, extern_args
from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.sym import bucket_hint, size_hint
from kiln.ir.ops import Op
from kiln.library.conv import prepack as prepack_conv
from kiln.passes.dce import dce
from kiln.passes.fold_pad import sides
from kiln.passes.rewrite import RewriteLog, rewrite
from kiln.passes.simplify import scalar_value
from kiln.runtime import native
from kiln.library.conv import op as cpu_conv
from kiln.library.conv import op_dw as cpu_conv_dw
from kiln.tune import timing
from kiln.tune.choices import Choices, Kind, measuring_s

aten = torch.ops.aten
CONV = Kind("conv", 13, ("onednn", "gemm", "direct", "dw", *(f"winograd{m}" for m in cpu_conv.TILE_SIZES)))
EPILOGUES = ("", "relu", "add", "add_relu")  # what follows a convolution that kiln's kernels can take in
MIN_FLOPS = 1 << 22  # below this the call overhead decides, not the algorithm
# A depthwise convolution does k*k FMAs per output, so even a small one is a pass over memory, and oneDNN's
# depthwise call costs more than kiln's below MIN_FLOPS too: ConvNeXt's last stage (768 channels of 7x7, a 7x7
# filter, 3.7 MFLOP) 229 against 179 us per compiled call with its epilogue, one thread, AVX-512 (session 25).
MIN_FLOPS_DEPTHWISE = 1 << 18
ONEDNN, GEMM, DIRECT, DEPTHWISE = "onednn", "gemm", "direct", "dw"  # choices besides "winograd<m>"


def _big_enough(node: Node, w_shape: tuple[int, ...], groups: int, min_flops: int) -> bool:
    """Does the convolution ``node`` (weight ``w_shape``) do enough work for the algorithm to decide?"""
    floor = min(min_flops, MIN_FLOPS_DEPTHWISE) if groups > 1 else min_flops
    # (a symbolic batch or image size: judged at the traced size, as the choice itself is)
    return 2 * size_hint(node.numel) * w_shape[1] * w_shape[2] * w_shape[3] >= floor


def tiles() -> tuple[int, ...]:
    """Winograd tile sizes allowed by ``Config.winograd_tiles``."""
    text = config.get().winograd_tiles.strip()
    sizes = tuple(int(v) for v in text.split(",") if v.strip()) if text else ()
    bad = [m for m in sizes if m not in cpu_conv.TILE_SIZES]
    if bad:
        raise ValueError(f"kiln: winograd_tiles {text!r}: tile sizes must be among {cpu_conv.TILE_SIZES}")
    return sizes


def _arg_names(op: object) -> tuple[str, ...]:
    """A kiln convolution op's arguments, in order, from its schema (library/conv/op.py)."""
    return tuple(a.name for a in op._schema.arguments)  # type: ignore[attr-defined]


_LABELS = {"conv_winograd": "Winograd", "conv_gemm": "implicit-GEMM", "conv_dw": "depthwise"}


def _op_name(n: Node) -> str | None:
    target = n.attr("target") if n.op is Op.EXTERN else None
    if target is torch.ops.kiln.conv_winograd.default:
        return "conv_winograd"
    if target is torch.ops.kiln.conv_gemm.default:
        return "conv_gemm"
    if target is torch.ops.kiln.conv_dw.default:
        return "conv_dw"
    return None


def _label(conv: Node) -> str:
    return _LABELS[_op_name(conv)]


def is_kiln_conv(n: Node) -> bool:
    """One of kiln's CPU convolutions (they read any input layout and take epilogues)."""
    return _op_name(n) is not None


def _args(conv: Node) -> dict[str, object]:
    """A kiln convolution's arguments by name (its input nodes substituted back in)."""
    return native.named_args(conv)


def writes_channels_last(n: Node) -> bool:
    """A kiln convolution whose result is channels-last (all but those that write a graph output)."""
    return is_kiln_conv(n) and bool(_args(n)["channels_last"])


def choose(choices: Choices, x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: list[int],
           padding: list[int], epilogue: str = "", groups: int = 1, use_forced: bool = True) -> str:
    """``"onednn"``, ``"winograd<m>"``, ``"gemm"`` or (depthwise, ``groups`` = channels) ``"dw"`` for this
    convolution; measured once per shape, epilogue, thread count and allowed tile sizes on random data
    (channels-last, as kiln's graphs feed it).

    ``epilogue`` (one of ``EPILOGUES``) is what follows the convolution in the graph: kiln's kernels compute it
    in their output transform, while after oneDNN's call it is one more pass over the result (a generated
    kernel), so each candidate is timed with the epilogue it would run (ResNet's 64-channel layers: Winograd and
    oneDNN within 2% alone, apart by the ReLU pass with it)."""
    allowed = tiles() if cpu_conv.supports(w_shape, stride, [1, 1], groups) else ()
    n, c, h, w = x_shape
    k, cg, kh, kw = w_shape
    key = (n, c, h, w, k, kh, kw, *stride, *padding, torch.get_num_threads(), EPILOGUES.index(epilogue), *allowed) \
        + ((groups,) if groups > 1 else ())
    add, relu = epilogue.startswith("add"), epilogue.endswith("relu")
    candidates = 2 if groups > 1 else len(allowed) + 3  # (oneDNN, the implicit GEMM and maybe the direct kernel)

    def calls() -> dict:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(x_shape, generator=gen).contiguous(memory_format=torch.channels_last)
        bias = torch.randn(k, generator=gen)
        out_shape = (n, k, *cpu_conv.output_hw(h, w, [kh, kw], stride, padding))
        r = torch.randn(out_shape, generator=gen).contiguous(memory_format=torch.channels_last) if add else None
        after = torch.empty(out_shape).contiguous(memory_format=torch.channels_last)

        def separate(y: torch.Tensor) -> torch.Tensor:
            """The epilogue as the one pass over a library's result that kiln's kernel makes: read it (and r),
            write a buffer.  After an add the ReLU rides in that same pass, so the add stands for both."""
            if add:
                return torch.add(y, r, out=after)
            return torch.clamp_min(y, 0.0, out=after) if relu else y
        # each call on another copy of the weight, so it comes from memory as in a model
        ws = timing.copies(torch.randn(w_shape, generator=gen) / (kh * kw * cg) ** 0.5,
                           timing.cold_copies(4 * k * cg * kh * kw))
        if prepack_conv.available():
            packs = timing.copies(torch.ops.mkldnn._reorder_convolution_weight(ws[0], padding, stride, [1, 1], groups,
                                                                               list(x_shape)), len(ws))
            out = {ONEDNN: timing.cycling([lambda p=p: separate(torch.ops.mkldnn._convolution_pointwise(
                x, p, bias, padding, stride, [1, 1], groups, "none", [], "")) for p in packs])}
        else:
            out = {ONEDNN: timing.cycling([lambda w=w: separate(torch.ops.aten.convolution(
                x, w, bias, stride, padding, [1, 1], False, [0, 0], groups)) for w in ws])}
        # kiln's convolutions as a compiled graph runs them: called from C++ into its buffer (runtime/native.py)
        y = torch.empty(out_shape).contiguous(memory_format=torch.channels_last)

        def kiln_calls(op: Any, packed: list[torch.Tensor], **extra: Any) -> Any:
            return timing.cycling([native.direct_call(op, native.op_args(
                op, x, p, bias, r, k, padding=padding, relu=relu, stride=stride, kernel=[kh, kw], **extra), y)
                for p in packed])
        if groups > 1:  # depthwise: kiln's direct kernel is the only other candidate
            if cpu_conv_dw.available():
                out[DEPTHWISE] = kiln_calls(torch.ops.kiln.conv_dw.default,
                                            timing.copies(cpu_conv_dw.pack_weight(ws[0]), len(ws)))
            return out
        for m in (m for m in allowed if cpu_conv.available(m)):
            out[f"winograd{m}"] = kiln_calls(torch.ops.kiln.conv_winograd.default,
                                             timing.copies(cpu_conv.transform_weight(ws[0], m), len(ws)), tile=m)
        if cpu_conv.gemm_available():
            gs = timing.copies(cpu_conv.pack_conv_weight(ws[0]), len(ws))
            out[GEMM] = kiln_calls(torch.ops.kiln.conv_gemm.default, gs)
            if c <= DIRECT_MAX_CHANNELS:  # (packing im2col rows of few channels costs more than it saves)
                out[DIRECT] = kiln_calls(torch.ops.kiln.conv_gemm.default, gs, direct=True)
        return out

    out_hw = cpu_conv.output_hw(h, w, [kh, kw], stride, padding)
    return str(choices.decide(CONV, key, calls, baseline=ONEDNN, what=_what(x_shape, w_shape, stride, groups, epilogue),
                              use_forced=use_forced,
                              predict=lambda: predict(allowed, out_hw, groups, (kh, kw), list(stride), c),
                              estimate_s=measuring_s(candidates, 2 * n * k * cg * kh * kw * math.prod(out_hw))))


WINOGRAD_MIN_OUTPUT = 14 * 14  # output positions from which the rule predicts Winograd F(2x2) for a 3x3 stride 1


def predict(allowed: tuple[int, ...], out_hw: tuple[int, int], groups: int = 1,
            kernel: tuple[int, int] = (3, 3), stride: list[int] | None = None, channels: int = 0) -> str:
    """The rule where a convolution is not measured (past the compile's measuring budget): Winograd F(2x2, 3x3)
    for a 3x3 stride-1 convolution with an output of at least ``WINOGRAD_MIN_OUTPUT`` positions; kiln's
    depthwise kernel for a depthwise convolution its sliding window covers (3, 5 or 7 wide, stride 1 or 2, at
    least 16 channels); else oneDNN.
    Measured on the AVX2 Zen 3 box (time against oneDNN's, each with its epilogue): the seed model's 220x220 x 128
    channels 0.6x, ResNet-18's 56x56 x 64 0.94-0.95x, 28x28 x 128 0.98-0.99x, 14x14 x 256 0.96-0.98x - and its
    7x7 x 512 1.11x.  Depthwise, in the model (AVX-512 box, one thread, ``kiln.profile`` with the choice forced,
    twice): ConvNeXt's 18 7x7 layers and 4 others 9.1-9.9 ms with kiln's kernel against 11.6-15.8 with oneDNN's,
    although op by op oneDNN's measured 0.8x kiln's time - its calls allocate their result, kiln's write into the
    arena.  (max-autotune measures every convolution.)"""
    if 2 in allowed and out_hw[0] * out_hw[1] >= WINOGRAD_MIN_OUTPUT and cpu_conv.available(2):
        return "winograd2"
    if groups > 1 and groups == channels >= 16 and kernel[1] in (3, 5, 7) and stride is not None \
            and stride[1] in (1, 2) and cpu_conv_dw.available():
        return DEPTHWISE
    return ONEDNN


def _what(x_shape: Any, w_shape: Any, stride: Any, groups: int, epilogue: str) -> str:
    return f"conv {list(x_shape)} x {list(w_shape)} stride {list(stride)}" + (
        f" groups {groups}" if groups > 1 else "") + (f" + {epilogue}" if epilogue else "")


def possible(choice: str, x_shape: tuple[int, ...], w_shape: tuple[int, ...], stride: list[int],
             groups: int) -> bool:
    """Can ``choice`` (a forced one: ``Config.choices``) compute this convolution on this machine?"""
    if choice == ONEDNN:
        return True
    if choice.startswith("winograd"):
        return groups == 1 and cpu_conv.available() and cpu_conv.supports(w_shape, stride, [1, 1], groups)
    if choice == DEPTHWISE:
        return cpu_conv_dw.available() and cpu_conv_dw.supports(x_shape[1], w_shape, stride, [1, 1], groups)
    return groups == 1 and cpu_conv.gemm_available() and (choice == GEMM or x_shape[1] <= DIRECT_MAX_CHANNELS)


def _candidate(node: Node, min_flops: int = MIN_FLOPS) -> list | None:
    """The convolution's arguments when a kiln kernel can compute it: fp32 2-D on the CPU, no groups or dilation,
    a constant weight, big enough that the algorithm, not the call, decides."""
    if node.op is not Op.EXTERN or node.dtype != torch.float32 or node.attr("out_index") is not None \
            or getattr(node.attr("target"), "overloadpacket", None) is not aten.convolution or len(node.shape) != 4:
        return None
    args, kwargs = extern_args(node)
    if kwargs or len(args) != 9:
        return None
    x, w, bias, stride, padding, dilation, transposed, _, groups = args
    if transposed or not isinstance(w, Node) or w.op is not Op.CONSTANT or w.dtype != torch.float32 \
            or not isinstance(x, Node) or len(x.shape) != 4 or len(w.shape) != 4 or len(padding) != 2 \
            or not (cpu_conv.gemm_supports(stride, dilation, groups)
                    or cpu_conv_dw.supports(x.shape[1], tuple(w.shape), stride, dilation, groups)) \
            or (bias is not None and (not isinstance(bias, Node) or bias.dtype != torch.float32)) \
            or w.attr("value").tensor.device.type != "cpu" \
            or not _big_enough(node, tuple(w.shape), groups, min_flops):
        return None
    return args


def libraries(graph: Graph) -> dict[str, Callable[[], Any]]:
    """kiln's convolution libraries this pass may use on ``graph`` (the pipeline starts their builds in the
    background at the compile's start, so that they build in parallel)."""
    convs = [args for n in graph.nodes if (args := _candidate(n)) is not None]
    out: dict[str, Callable[[], Any]] = {}
    if any(args[8] == 1 for args in convs):
        out["kiln_conv_gemm"] = cpu_conv.gemm_library
    # Winograd's libraries only for a graph with a 3x3 stride-1 convolution (each is seconds of g++: a ViT's
    # 16x16 stride-16 patch embedding first in a process waited 4.2 s on builds it could not use)
    if any(cpu_conv.supports(tuple(args[1].shape), args[3], args[5], args[8]) for args in convs):
        out.update({f"kiln_winograd{m}": functools.partial(cpu_conv.library, m) for m in tiles()})
    if any(args[8] > 1 for args in convs):
        out["kiln_conv_dw"] = cpu_conv_dw.library
    return out


def epilogue_of(conv: Node, users: dict[Node, list[Node]], outputs: set[Node]) -> str:
    """Which of ``EPILOGUES`` follows ``conv`` in the graph and would fold into a kiln convolution (the rules of
    ``_absorb_epilogue``): its only user a ReLU, or an add of a same-shaped fp32 value, maybe then a ReLU."""
    if conv in outputs or len(users.get(conv, ())) != 1:
        return ""
    (user,) = users[conv]
    if _relu_operand(user) is not None:
        return "relu"
    if user.op is Op.ADD and len(user.inputs) == 2 and user.dtype == torch.float32 \
            and all(i.shape == user.shape and i.dtype == torch.float32 for i in user.inputs) \
            and user.inputs[0] is not user.inputs[1]:
        after = users.get(user, ())
        return "add_relu" if user not in outputs and len(after) == 1 and _relu_operand(after[0]) is not None else "add"
    return ""


def _to_kiln_conv(node: Node, inputs: tuple[Node, ...], b: GraphBuilder, log: RewriteLog | None,
                  choices: Choices, epilogue: str = "") -> Node | None:
    forced = choices.forced_value(CONV)
    args = _candidate(Node(node.op, inputs, node.attrs, node.shape, node.dtype), 0 if forced else MIN_FLOPS)
    if args is None:
        return None
    x, w, bias, stride, padding = args[:5]
    groups = args[8]
    weight = w.attr("value").tensor.float()
    if forced and possible(forced, tuple(x.shape), tuple(w.shape), list(stride), groups):
        choice = choices.known(CONV, (), _what(x.shape, w.shape, stride, groups, epilogue))  # (reported as forced)
    elif not _big_enough(node, tuple(w.shape), groups, MIN_FLOPS):
        return None  # (forced to what this convolution cannot run, and too small to measure)
    else:  # (measured as usual where the forced answer cannot run this convolution)
        # (a symbolic batch or image size: measured at the traced size's bucket; the kernels take any size per call)
        choice = choose(choices, tuple(bucket_hint(d) for d in x.shape), tuple(w.shape), list(stride), list(padding),
                        epilogue, groups, use_forced=False)
    common = dict(x=x, bias=bias, residual=None, out_channels=node.shape[1], padding=list(padding), relu=False,
                  channels_last=True, relu_input=False, relu_max=None, relu_input_max=None)
    if choice.startswith("winograd"):
        tile = int(choice[len("winograd"):])
        if log:
            log.hit(f"convolution -> kiln Winograd F({tile}x{tile}, 3x3)")
        values = dict(common, tile=tile, packed=Baked(cpu_conv.transform_weight(weight, tile),
                                                      f"winograd{tile}{list(w.shape)}", checked_source(w)))
        op = torch.ops.kiln.conv_winograd.default
    elif choice in (GEMM, DIRECT, DEPTHWISE):  # any filter and stride, a weight packed their own way
        name, pack, what = {GEMM: ("conv_gemm", cpu_conv.pack_conv_weight, "implicit GEMM"),
                            DIRECT: ("conv_gemm", cpu_conv.pack_conv_weight, "direct (few channels)"),
                            DEPTHWISE: ("conv_dw", cpu_conv_dw.pack_weight, "depthwise")}[choice]
        if log:
            log.hit(f"convolution -> kiln {what}")
        values = dict(common, kernel=list(w.shape[2:]), stride=list(stride), direct=choice == DIRECT,
                      packed=Baked(pack(weight), f"{name}{list(w.shape)}", checked_source(w)))
        op = getattr(torch.ops.kiln, name).default
    else:
        return None
    return build_extern(b, op, [values[name] for name in _arg_names(op)], {}, node.shape, node.dtype)


def _rebuilt(conv: Node, b: GraphBuilder, **changes: object) -> Node:
    """``conv`` (a kiln convolution) with some of its arguments replaced."""
    values = {**_args(conv), **changes}
    return build_extern(b, conv.attr("target"), [values[name] for name in _arg_names(conv.attr("target"))], {},
                        conv.shape, conv.dtype)


def _scalar_operand(n: Node, op: Op) -> tuple[int, float] | None:
    """(position of x, c) for ``n = op(x, c)`` or ``op(c, x)`` with c a scalar and x of ``n``'s shape, else None."""
    if n.op is op and len(n.inputs) == 2:
        for i in (0, 1):
            c = scalar_value(n.inputs[1 - i])
            if isinstance(c, (int, float)) and n.inputs[i].shape == n.shape:
                return i, float(c)
    return None


def _relu_operand(n: Node) -> int | None:
    """The position of the operand ``n`` takes the ReLU of: ``relu(x)``, or ``maximum(x, 0)`` (how ``hardtanh``,
    i.e. ReLU6, lowers: then ``minimum(, 6)``; maximum propagates NaN as relu does); None for anything else."""
    if n.op is Op.RELU:
        return 0
    found = _scalar_operand(n, Op.MAXIMUM)
    return found[0] if found is not None and found[1] == 0 else None


def _upper_clamp(n: Node) -> tuple[int, float] | None:
    """(position of x, c) for ReLU6's second half ``minimum(x, c)`` with ``c >= 0``, else None."""
    found = _scalar_operand(n, Op.MINIMUM)
    return found if found is not None and found[1] >= 0 else None


def _relu_input(original: Node, rewritten: Node, uses: dict[Node, int], outputs: set[Node]
                ) -> tuple[Node, float | None] | None:
    """(y, upper clamp or None) when a convolution's input is ``relu(y)`` or ReLU6's ``minimum(maximum(y, 0), c)``
    read by it alone, which it can apply as it reads y; else None.  ``original``: the input before this rewrite
    (whose uses are counted), ``rewritten``: after."""
    def alone(n: Node) -> bool:
        return uses.get(n, 0) == 1 and n not in outputs

    hi = None
    clamp = _upper_clamp(rewritten)
    if clamp is not None:
        i, hi = clamp
        if not alone(original):
            return None
        original, rewritten = original.inputs[i], rewritten.inputs[i]
    at = _relu_operand(rewritten)
    if at is None or not alone(original) or rewritten.inputs[at].shape != rewritten.shape:
        return None
    return rewritten.inputs[at], hi


def _absorb_epilogue(node: Node, inputs: tuple[Node, ...], b: GraphBuilder, uses: dict[Node, int],
                     outputs: set[Node], log: RewriteLog | None) -> Node | None:
    """``relu(conv)`` and ``conv + r`` (r of the same shape) become the convolution's epilogue, when the
    convolution's result has no other use; an add only before the ReLU (the kernel adds, then clamps); ReLU6
    (``minimum(maximum(conv, 0), 6)``) as a ReLU with an upper clamp.  A ReLU (or ReLU6) whose only reader is a
    kiln convolution and which no epilogue took (it follows oneDNN's convolution, whose fused activations map NaN
    to 0) is applied by that convolution as it reads its input."""
    def fusable(original: Node, rewritten: Node) -> bool:
        return is_kiln_conv(rewritten) and uses.get(original, 0) == 1 and original not in outputs

    if is_kiln_conv(node) and not _args(node)["relu_input"]:
        found = _relu_input(node.inputs[0], inputs[0], uses, outputs)
        if found is not None:  # a producer the epilogue rule could not take (a library's)
            x, hi = found
            if log:
                log.hit(f"relu{'6' if hi is not None else ''} -> {_label(node)} input")
            return _rebuilt(Node(node.op, inputs, node.attrs, node.shape, node.dtype), b, x=x, relu_input=True,
                            relu_input_max=hi)
    at = _relu_operand(node)
    if at is not None and fusable(node.inputs[at], inputs[at]) and not _args(inputs[at])["relu"]:
        if log:
            log.hit(f"relu -> {_label(inputs[at])} epilogue")
        return _rebuilt(inputs[at], b, relu=True)
    clamp = _upper_clamp(Node(node.op, inputs, node.attrs, node.shape, node.dtype))
    if clamp is not None:  # ReLU6's upper clamp: min(relu(conv), 6)
        i, hi = clamp
        conv = inputs[i]
        if fusable(node.inputs[i], conv) and _args(conv)["relu"] and _args(conv)["relu_max"] is None:
            if log:
                log.hit(f"relu6 clamp -> {_label(conv)} epilogue")
            return _rebuilt(conv, b, relu_max=hi)
    if node.op is Op.ADD and node.dtype == torch.float32 and len(inputs) == 2:
        for i in (0, 1):
            conv, other = inputs[i], inputs[1 - i]
            if fusable(node.inputs[i], conv) and other.shape == conv.shape == node.shape \
                    and other.dtype == torch.float32 and _args(conv)["residual"] is None \
                    and not _args(conv)["relu"]:
                if log:
                    log.hit(f"residual add -> {_label(conv)} epilogue")
                return _rebuilt(conv, b, residual=other)
    return None


def _fold_pad(node: Node, inputs: tuple[Node, ...], b: GraphBuilder, uses: dict[Node, int], outputs: set[Node],
              log: RewriteLog | None) -> Node | None:
    """A zero pad read only by a kiln implicit-GEMM or depthwise convolution becomes its padding, four-sided
    where the pad is (TensorFlow's "same" padding of a stride-2 layer: one more row and column after than before,
    which ``aten.convolution`` cannot say, so ``passes/fold_pad.py`` left it).  Those kernels skip every tap
    outside the input, so the pad is never stored (MobileNet-V2's five such pads: 0.5 ms of ~13 on one thread).

    Before::                                              After::

        %p = pad(%y, pads=((0,0), (0,0), (0,1), (0,1)))       %c = extern(%y, ..., padding=[0, 0, 1, 1],
        %c = extern(%p, ..., padding=[0, 0],                              target=kiln.conv_dw)
                    target=kiln.conv_dw)
    """
    if _op_name(node) not in ("conv_gemm", "conv_dw") or uses.get(node.inputs[0], 0) != 1 \
            or node.inputs[0] in outputs:
        return None
    found = sides(inputs[0], 2)
    if found is None:
        return None
    (top, bottom), (left, right) = found
    p_top, p_left, p_bottom, p_right = cpu_conv.four_sides(list(_args(node)["padding"]))
    padding = [p_top + top, p_left + left, p_bottom + bottom, p_right + right]
    if padding[0] == padding[2] and padding[1] == padding[3]:
        padding = padding[:2]
    if log:
        log.hit(f"zero pad -> {_label(node)} padding")
    return _rebuilt(Node(node.op, inputs, node.attrs, node.shape, node.dtype), b, x=inputs[0].inputs[0],
                    padding=padding)


def winograd_conv(graph: Graph, log: RewriteLog | None = None) -> Graph:
    choices = log.choices if log is not None else Choices()
    min_flops = 0 if choices.forced_value(CONV) else MIN_FLOPS
    if not any(_candidate(n, min_flops) for n in graph.nodes):
        return graph  # (before asking for the libraries, which builds them: only for graphs that could use them)
    # dead nodes first (folding leaves the unfolded convolutions behind): not converted, and not counted as uses
    graph = dce(graph)
    users, outputs = graph.users(), set(graph.outputs)
    graph = dce(rewrite(graph, lambda node, inputs, b: _to_kiln_conv(node, inputs, b, log, choices,
                                                                     epilogue_of(node, users, outputs))))
    if not any(is_kiln_conv(n) for n in graph.nodes):
        return graph
    uses = {n: len(users) for n, users in graph.users().items()}
    outputs = set(graph.outputs)
    graph = dce(rewrite(graph, lambda node, inputs, b: _fold_pad(node, inputs, b, uses, outputs, log)))
    uses = {n: len(users) for n, users in graph.users().items()}
    graph = dce(rewrite(graph, lambda node, inputs, b: _absorb_epilogue(node, inputs, b, uses, outputs, log)))
    # a graph output is written in eager's layout (NCHW) by the kernel itself: cheaper than a copy afterwards
    outputs = set(graph.outputs)
    return rewrite(graph, lambda node, inputs, b: _rebuilt(node, b, channels_last=False)
                   if is_kiln_conv(node) and node in outputs else None)
