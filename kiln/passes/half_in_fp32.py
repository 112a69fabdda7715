"""Half-precision (bf16/fp16) matrix products and convolutions on the CPU computed in fp32, where that measures
faster.

On a CPU without half-precision arithmetic (AVX2; AVX-512 without BF16/FP16) ATen's bf16/fp16 ``addmm``, ``bmm``
and convolution convert inside the call and run at a fraction of the fp32 rate: a 64x1024x4096 linear took 48-61 ms
in bf16/fp16 on the AVX2 dev box, where the same product in fp32 takes 10-14 ms in ATen and 7.4 ms in kiln's
GEMM.  Both ways accumulate in fp32 and round the result to the half type once (ATen's reduced-precision GEMM
and oneDNN's keep an fp32 accumulator and add the bias in it), so computing the layer in fp32 on the converted
operands and rounding its output once gives eager's result up to the order of the sum.

Constant operands (weights, biases) are converted once, here, at compile time: kiln then holds an fp32 copy, twice
the half weight's bytes (for a linear layer on kiln's GEMM the packed panels are that copy).  Other operands are
converted by a ``cast`` that fuses into the kernel producing them; the output's rounding fuses into the kernel
reading it.  The library passes that follow (``select_gemm``, ``winograd``, ``prepack_conv``) then choose the
fp32 implementation as for an fp32 model.

Where the machine has fast half arithmetic (oneDNN's bf16 kernels on AVX-512 BF16 or AMX), ATen's half call
stays: the choice is measured per op, shape, dtype and thread count - the half call against the fp32 call with
its conversions, both ATen's - and kept in the tuning database (``tune/choices.py``).  Past the compile's
measuring budget the rule predicts it: fp32 unless the CPU has native half-precision dot products.

Before::                                                  After (fp32 measured faster)::

    %0 = constant(...) : bf16[128, 64]                        %6 = constant(...) : f32[128, 64]
    %1 = constant(...) : bf16[128]                            %7 = constant(...) : f32[128]
    %4 = permute(%0, dims=(1, 0)) : bf16[64, 128]             %8 = permute(%6, dims=(1, 0)) : f32[64, 128]
    %5 = extern(%1, %in0, %4,                                 %9 = cast(%in0) : f32[16, 64]
           target=aten.addmm.default) : bf16[16, 128]         %10 = extern(%7, %9, %8, target=aten.addmm.default)
                                                                     : f32[16, 128]
                                                              %5 = cast(%10) : bf16[16, 128]
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from kiln.ir.extern import build_extern, extern_args
from kiln.ir.graph import ConstRef, Graph, GraphBuilder, Node
from kiln.ir.ops import HALF, Op
from kiln.ir.sym import size_hint
from kiln.passes.rewrite import RewriteLog, rewrite
from kiln.tune import timing
from kiln.tune.choices import Choices, Kind, measuring_s
from kiln.tune.db import cpu_model_and_flags

aten = torch.ops.aten
HALF_IN_FP32 = Kind("half_in_fp32", 2, ("half", "fp32"))
# the ops whose half-precision ATen kernels accumulate in fp32 and round once (so fp32 compute matches them)
TARGETS = (aten.addmm, aten.mm, aten.bmm, aten.baddbmm, aten.convolution)
MIN_FLOPS = 1 << 18  # below this a call's overhead, not its arithmetic, decides: the half call stays


def _flops(packet: Any, args: list[Any], out_shape: tuple[int, ...]) -> int:
    """Multiply-adds x 2 of one call (the product's output elements times its reduction length); a symbolic size
    counts at its traced value (the choice is made once for every size, as kiln's other choices are)."""
    out = 1
    for s in out_shape:
        out *= size_hint(s)
    if packet is aten.convolution:
        w = args[1]
        red = 1
        for s in w.shape[1:]:
            red *= size_hint(s)
        return 2 * out * red
    a = args[-2]  # the first factor of the product: [.., m, k]
    return 2 * out * size_hint(a.shape[-1])


def _is_weight(n: Node) -> bool:
    """A constant, or a permutation of one (a linear layer's transposed weight): converted at compile time.
    Other operands - other views of weights included - are converted per call."""
    return n.op is Op.CONSTANT or (n.op is Op.PERMUTE and _is_weight(n.inputs[0]))


def _root(n: Node) -> Node:
    while n.op is not Op.CONSTANT:
        n = n.inputs[0]
    return n


def _sample(n: Node, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """A random tensor shaped like ``n``; a view of a constant keeps the view (a transposed weight's layout is
    what the library sees)."""
    if n.op is Op.PERMUTE:
        return _sample(n.inputs[0], dtype, gen).permute(n.attr("dims"))
    return torch.randn([size_hint(d) for d in n.shape], generator=gen).to(dtype)  # (symbolic: at its traced size)


def _key(packet: Any, args: list[Any], dtype: torch.dtype) -> tuple[int, ...]:
    """Ints naming the problem: op, dtype, threads, every tensor operand's shape and layout kind, int arguments."""
    key = [TARGETS.index(packet), HALF.index(dtype), torch.get_num_threads()]
    for a in args:
        if isinstance(a, Node):
            key += [len(a.shape), *map(size_hint, a.shape), int(a.op is Op.PERMUTE), int(_is_weight(a))]
        elif isinstance(a, (list, tuple)):
            key += [len(a), *(int(v) for v in a)]
        elif isinstance(a, (bool, int)):
            key.append(int(a))
        else:
            key.append(-1)
    return tuple(key)


def native_half(dtype: torch.dtype) -> bool:
    """Does the CPU have dot-product instructions for ``dtype`` (AVX-512 BF16 / AMX for bf16, AVX-512 FP16 / AMX
    for fp16), which oneDNN's half kernels use?  Without them ATen's half products convert inside the call."""
    flags = cpu_model_and_flags()[1]
    wanted = {"avx512_bf16", "amx_bf16"} if dtype == torch.bfloat16 else {"avx512_fp16", "amx_fp16"}
    return bool(flags & wanted)


def choose(choices: Choices, target: Any, args: list[Any], dtype: torch.dtype, out_shape: tuple[int, ...]) -> str:
    """'fp32' or 'half' for one call of ``target`` on ``args`` (graph nodes and plain arguments), measured once
    per problem and machine."""
    packet = target.overloadpacket

    def calls() -> dict[str, Callable[[], Any]]:
        gen = torch.Generator().manual_seed(0)
        nbytes = sum(2 * a.numel for a in args if isinstance(a, Node) and _is_weight(a))
        half_sets, f32_sets = [], []
        # weights come from memory, as in a model: enough copies for the fp32 weights (twice the half bytes)
        for _ in range(timing.cold_copies(2 * max(nbytes, 1))):
            half = [_sample(a, dtype, gen) if isinstance(a, Node) else a for a in args]
            half_sets.append(half)
            f32_sets.append([a.float() if isinstance(a, torch.Tensor) and _is_weight(n) else a
                             for a, n in zip(half, args)])

        def in_fp32(half: list[Any], f32: list[Any]) -> Callable[[], Any]:
            def call() -> Any:  # per call: the non-constant operands' conversions and the output's rounding
                real = [h.float() if isinstance(h, torch.Tensor) and not _is_weight(n) else f
                        for h, f, n in zip(half, f32, args)]
                return target(*real).to(dtype)
            return call

        return {"half": timing.cycling([lambda h=h: target(*h) for h in half_sets]),
                "fp32": timing.cycling([in_fp32(h, f) for h, f in zip(half_sets, f32_sets)])}

    return choices.decide(HALF_IN_FP32, _key(packet, args, dtype), calls, baseline="half",
                          predict=lambda: "half" if native_half(dtype) else "fp32",
                          # (ATen's half call runs at a fraction of the fp32 rate where it is slow, which two
                          # rounds settle: about three times two candidates' estimate)
                          estimate_s=3 * measuring_s(2, _flops(packet, args, out_shape)),
                          what=f"{packet.__name__} {str(dtype).replace('torch.', '')} "
                               f"{'x'.join(map(str, out_shape))} half vs fp32")


def _to_fp32(n: Node, b: GraphBuilder) -> Node:
    """``n`` in fp32: a constant (or a view chain of one) converted now, anything else by a cast node."""
    if n.op is Op.CONSTANT:
        return b.add(Op.CONSTANT, (), value=ConstRef(n.attr("value").tensor.float().contiguous()))
    if n.op is Op.PERMUTE and _is_weight(n):
        return b.add(Op.PERMUTE, (_to_fp32(n.inputs[0], b),), dims=n.attr("dims"))
    return b.add(Op.CAST, (n,), dtype=torch.float32)


def half_in_fp32(graph: Graph, log: RewriteLog | None = None) -> Graph:
    choices = log.choices if log is not None else Choices()
    forced = choices.forced_value(HALF_IN_FP32)

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        if node.op is not Op.EXTERN or node.dtype not in HALF or node.attr("out_index") is not None:
            return None
        target = node.attr("target")
        packet = getattr(target, "overloadpacket", None)
        if packet not in TARGETS:
            return None
        args, kwargs = extern_args(Node(node.op, inputs, node.attrs, node.shape, node.dtype))
        tensors = [a for a in args if isinstance(a, Node)]
        if kwargs or any(a.dtype != node.dtype for a in tensors) or any(isinstance(a, torch.Tensor) for a in args):
            return None
        weights = [_root(a).attr("value").tensor for a in tensors if _is_weight(a)]
        if not weights or any(w.device.type != "cpu" for w in weights):
            return None  # (only products with a weight: a weight-free bmm keeps its run-time layout choice)
        if forced is None and _flops(packet, args, node.shape) < MIN_FLOPS:
            return None
        if choose(choices, target, args, node.dtype, node.shape) != "fp32":  # (forced, stored or measured)
            return None
        if log:
            log.hit(f"{packet.__name__} {str(node.dtype).replace('torch.', '')} -> fp32")
        f32 = [_to_fp32(a, b) if isinstance(a, Node) else a for a in args]
        y = build_extern(b, target, f32, {}, node.shape, torch.float32)
        return b.add(Op.CAST, (y,), dtype=node.dtype)

    return rewrite(graph, rule)

