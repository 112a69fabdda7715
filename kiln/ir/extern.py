"""EXTERN nodes: an ATen call kept as it is, with its tensor arguments replaced by references to inputs.

The template is the original ``(args, kwargs)`` with every tensor argument replaced by ``InputRef(k)``,
``k`` indexing ``node.inputs``.  At run time ``call_extern`` substitutes the tensors and calls the op.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import torch

from kiln.ir.sym import concrete


@dataclasses.dataclass(frozen=True)
class InputRef:
    index: int


class Baked:
    """A value baked into an extern call that is not a graph value (a weight prepacked for the library).

    Identity-hashed and printed by its label, so graphs holding it stay hashable and readable.  ``source``: the
    value it was made from in the op's ATen form (a linear layer's ``[N, K]`` weight for packed panels), kept
    under ``KILN_CHECK`` so the step checker can compute the call's reference with ATen (runtime/references.py)."""

    __slots__ = ("value", "label", "source")

    def __init__(self, value: Any, label: str, source: Any = None):
        self.value = value
        self.label = label
        self.source = source

    def __repr__(self) -> str:
        return self.label


def checked_source(weight: Any) -> Any:
    """A weight (a constant node's tensor, or a tensor) to keep as a ``Baked``'s source while ``KILN_CHECK`` is on
    (else None: a folded weight's source would be held beside its packed form for nothing)."""
    from kiln import config
    if not config.get().check:
        return None
    return weight if isinstance(weight, torch.Tensor) else weight.attr("value").tensor


# Library ops called through the torch function of the same name: that C binding parses its arguments and calls
# the op unboxed, where calling the OpOverload takes the boxed path through Python - host time per call on the
# H200 machine's host (benchmarks/host_time.py --externs): convolution 20.2 us as an OpOverload, 13.8 us bound;
# addmm into an out tensor 14.0 and 12.1 us.  Only overloads that the binding picks from these arguments alone
# (the others of the same name take an argument these calls never pass: out_dtype, out=).
_BOUND = ("convolution.default", "addmm.default", "mm.default", "bmm.default", "baddbmm.default")


def fast_callable(target: Any, out: bool = False, mode: str = "default", first_output_only: bool = False) -> Any:
    """What a generated call calls for ``target`` (an OpOverload): its torch C binding where ``_BOUND`` lists it,
    else the op itself.  ``out``: the call writes into ``out=`` (the op's ``.out`` overload, which the binding
    picks when given ``out=``).  ``aten.scaled_dot_product_attention``: see [Note: attention's entry] (``mode``:
    the compile's, which decides how much device time a call's host time is worth).  ``first_output_only``: the
    call's first output is the only one read (``aten._scaled_dot_product_cudnn_attention``: see [Note: cuDNN
    attention's first call])."""
    if target is torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default and not out:
        return cudnn_attention_backward
    cudnn = target is torch.ops.aten._scaled_dot_product_cudnn_attention.default and first_output_only
    if (target is torch.ops.aten.scaled_dot_product_attention.default or cudnn) and not out:
        from kiln import config
        entry = config.get().gpu_attention_entry
        if entry != "composite":
            limit = None if entry == "efficient" else EFFICIENT_UP_TO[mode != "default"]
            return functools.partial(cudnn_efficient_first if cudnn else attention_efficient_first,
                                     efficient_up_to=limit)
    overload = f"{getattr(target, '_opname', '')}.{getattr(target, '_overloadname', '')}"
    if getattr(target, "namespace", None) == "aten" and overload in _BOUND:
        return getattr(torch._C._VariableFunctions, target._opname)
    return target.overloadpacket.out if out else target


def attention_efficient_first(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0, is_causal: bool = False,
                              scale: float | None = None, enable_gqa: bool = False,
                              efficient_up_to: int | None = None) -> torch.Tensor:
    """``aten.scaled_dot_product_attention`` for a generated call: on CUDA tensors without mask, dropout or
    grouped heads and with at most ``efficient_up_to`` scores (batch x heads x queries x keys; None: any), the
    memory-efficient backend's op itself, else (or where that op refuses the tensors) the composite.

    [Note: attention's entry] The composite op chooses a backend at every call - its checks of every backend's
    constraints, then the chosen op through the dispatcher: 23.6 us of host time per call on the H100 machine
    (``benchmarks/host_time.py --externs``, one run; 41 us in another), against 13.8 us for
    ``_scaled_dot_product_efficient_attention`` through its C binding (flash's 19 us: more outputs to allocate).
    A small model's call in default mode is bound by the host (the suite's GPT: 4 attention calls in ~700 us).
    But on Hopper the composite picks cuDNN, whose kernel is faster at length: device us at batch 1, 12 heads,
    head size 64, causal (same run) - efficient 5.7 / 13.2 / 49.0 and cuDNN 6.8 / 7.6 / 14.6 at 37 / 256 /
    1024 queries.  So the efficient op is taken while its device time costs less than the host time it saves:
    in default mode up to 12 x 256 x 256 scores (``EFFICIENT_UP_TO``), under CUDA graphs (reduce-overhead,
    max-autotune: no host time per call) only where its kernel is the faster one, up to 12 x 128 x 128.  The op
    validates its inputs before it launches anything, so a refusal (head size, alignment) costs nothing but the
    fallback.  Both compute softmax in fp32 with the same causal convention (top-left), so results differ by
    rounding only."""
    if attn_mask is None and not dropout_p and not enable_gqa:
        out = _efficient_within(query, key, value, None, is_causal, scale, efficient_up_to)
        if out is not None:
            return out
    return _COMPOSITE(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def cudnn_efficient_first(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_bias: torch.Tensor | None,
                          compute_log_sumexp: bool, dropout_p: float = 0.0, is_causal: bool = False,
                          return_debug_mask: bool = False, *, scale: float | None = None,
                          efficient_up_to: int | None = None) -> tuple[torch.Tensor, ...]:
    """``aten._scaled_dot_product_cudnn_attention`` for a generated call that reads only its first output: up to
    ``efficient_up_to`` scores (None: any) the memory-efficient op with the same additive bias, broadcast to
    ``[B, H, T, S]`` as a view, else (or where that op refuses the tensors) the cuDNN op.

    [Note: cuDNN attention's first call] Where TorchDynamo traced ``F.scaled_dot_product_attention`` with a mask
    on Hopper, the graph holds the cuDNN op itself (torch chose it while tracing), and cuDNN builds an execution
    plan the first time it sees a shape: 39 ms per new shape on the H100 (62 ms for the process's first), against
    0.1 ms for the memory-efficient kernel's first call (``python -m benchmarks.attention_first_call``, session
    38; encoder_fast's first run 57 -> 7 ms).  That is a compile-time cost per attention shape - per sequence
    length under dynamic shapes - that eager's own choice (the composite picks the efficient kernel for a masked
    call) never pays, and at the sizes where the efficient kernel is the faster one anyway ([Note: attention's
    entry]: the same bounds) it buys nothing.
    Both add the bias to the scaled scores and take softmax in fp32: results differ by rounding only."""
    if not dropout_p and not return_debug_mask:
        bias = attn_bias
        if attn_bias is not None:
            try:
                bias = attn_bias.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
            except RuntimeError:
                pass  # (passed as it is: the op refuses what it cannot read)
        out = _efficient_within(query, key, value, bias, is_causal, scale, efficient_up_to)
        if out is not None:
            return (out,)
    return _CUDNN(query, key, value, attn_bias, compute_log_sumexp, dropout_p, is_causal, return_debug_mask,
                  scale=scale)


def cudnn_attention_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             out: torch.Tensor, logsumexp: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """``aten._scaled_dot_product_cudnn_attention_backward`` with ``out`` and ``grad_out`` in the layout of
    ``query`` and ``logsumexp`` contiguous.

    [Note: cuDNN attention's backward reads its operands in the forward's layouts] ATen's cuDNN attention writes
    its output in the layout of its query (``alloc_with_matching_layout``: a ``[B, H, T, D]`` view of a
    ``[B, T, H, D]`` projection gives an output laid out ``[B, T, H, D]`` too) and its statistics contiguous, and
    its backward builds the cuDNN graph from the query's, key's and value's strides alone: the output's and the
    incoming gradient's layout is *inferred* as the query's (ATen re-lays out the gradient only where its last
    stride is not 1).  Eager always hands the backward such tensors.  kiln does not: its graph has no layouts, an
    extern's strided result is made contiguous (``CompiledGraph.extern_call``), an operand traced contiguous is
    made so ([Note: externs get the layouts they were traced with]) - and cuDNN then reads the output or the
    gradient through the wrong strides, silently: BERT-base's first-step gradients under bf16 autocast on the
    H100, 0.21 relative error against eager's where Inductor's is 0.008 (session 44).  So the call re-lays out
    what does not match (a copy, only then) before cuDNN sees it."""
    out = matching_layout(out, query)
    grad_out = matching_layout(grad_out, out)
    return _CUDNN_BACKWARD(grad_out, query, key, value, out, logsumexp.contiguous(), *args, **kwargs)


def matching_layout(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` laid out in ``like``'s order of dimensions (dense, innermost where ``like``'s stride is smallest; ties
    and size-1 dimensions by position) - ``t`` itself where it already is, else a copy."""
    order = sorted(range(like.dim()), key=lambda d: (like.stride(d) if like.shape[d] > 1 else 0, -d))
    strides = [0] * t.dim()
    step = 1
    for d in order:
        strides[d] = step
        step *= t.shape[d]
    if all(t.stride(d) == strides[d] for d in range(t.dim()) if t.shape[d] > 1):
        return t
    return restrided(t, tuple(strides))


def restrided(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    """A copy of ``t`` laid out with ``strides`` (a library's result or a caller's input re-laid out for the
    kernels that read it so)."""
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def _efficient_within(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor | None,
                      is_causal: bool, scale: float | None, efficient_up_to: int | None) -> torch.Tensor | None:
    """The memory-efficient op's output for CUDA tensors with at most ``efficient_up_to`` scores (None: any), or
    None where the problem is larger, the tensors are not on a GPU or the op refuses them (it checks its inputs
    before it launches anything)."""
    if not query.is_cuda or (efficient_up_to is not None
                             and query.numel() // query.shape[-1] * key.shape[-2] > efficient_up_to):
        return None
    try:
        return _EFFICIENT(query, key, value, bias, False, 0.0, is_causal, scale=scale)[0]
    except RuntimeError:
        return None


# the most scores (batch x heads x queries x keys) for which the efficient op is taken: default mode, CUDA graphs
EFFICIENT_UP_TO = (12 * 256 * 256, 12 * 128 * 128)
_EFFICIENT = torch._C._VariableFunctions._scaled_dot_product_efficient_attention
_COMPOSITE = torch._C._nn.scaled_dot_product_attention
_CUDNN = torch._C._VariableFunctions._scaled_dot_product_cudnn_attention
_CUDNN_BACKWARD = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default


def substitute(template: Any, values: Sequence[Any], sizes: dict[str, int] | None = None) -> Any:
    """``template`` with its input references replaced by ``values`` (and its size expressions evaluated under
    ``sizes``, the call's binding of the size symbols, where given)."""
    if isinstance(template, InputRef):
        return values[template.index]
    if isinstance(template, Baked):
        return template.value
    if isinstance(template, (list, tuple)):
        items = [substitute(t, values, sizes) for t in template]
        return type(template)(items) if isinstance(template, tuple) else items
    if isinstance(template, dict):
        return {k: substitute(v, values, sizes) for k, v in template.items()}
    return concrete(template, sizes)


def call_extern(node: Any, inputs: Sequence[torch.Tensor], sizes: dict[str, int] | None = None) -> torch.Tensor:
    """Run an EXTERN node's op on concrete tensors; returns output ``out_index`` when the op returns several.
    ``sizes``: the values of the size symbols in its arguments (a graph traced with dynamic shapes)."""
    dense = node.attr("dense_inputs")  # ([Note: externs get the layouts they were traced with])
    if dense is not None and len(dense) == len(inputs):
        inputs = [t.contiguous() if d and isinstance(t, torch.Tensor) else t for t, d in zip(inputs, dense)]
    args, kwargs = substitute(node.attr("template"), inputs, sizes)
    out = node.attr("target")(*args, **kwargs)
    index = node.attr("out_index")
    if index is not None:
        out = out[index]
    return out


def short_name(target: Any) -> str:
    """``aten.convolution.default`` -> ``convolution``, for kernel names and reports."""
    name = (getattr(target, "__name__", None) or str(target)).split(".")[0]
    return _FRIENDLY.get(name, name)


_FRIENDLY = {"_linear_pointwise": "onednn_linear", "_convolution_pointwise": "onednn_convolution"}


def build_extern(b: Any, target: Any, args: Sequence[Any], kwargs: dict[str, Any], shape: Sequence[int],
                 dtype: torch.dtype, out_index: int | None = None) -> Any:
    """Add an EXTERN node calling ``target(*args, **kwargs)``; graph nodes inside args become its inputs."""
    from kiln.ir.graph import Node
    from kiln.ir.ops import Op
    inputs: list[Any] = []

    def to_template(v: Any) -> Any:
        if isinstance(v, Node):
            inputs.append(v)
            return InputRef(len(inputs) - 1)
        if isinstance(v, (list, tuple)):
            items = [to_template(x) for x in v]
            return tuple(items) if isinstance(v, tuple) else items
        if isinstance(v, dict):
            return {k: to_template(x) for k, x in v.items()}
        return v

    template = (to_template(list(args)), to_template(dict(kwargs)))
    return b.add(Op.EXTERN, inputs, shape=tuple(shape), dtype=dtype, target=target, template=template,
                 out_index=out_index)


def extern_args(node: Any) -> tuple[list[Any], dict[str, Any]]:
    """An EXTERN node's (args, kwargs) with its input nodes substituted back in."""
    args, kwargs = substitute(node.attr("template"), node.inputs)
    return list(args), dict(kwargs)


def _has_ref(v: Any) -> bool:
    if isinstance(v, (InputRef, Baked)):
        return True
    if isinstance(v, (list, tuple)):
        return any(_has_ref(x) for x in v)
    if isinstance(v, dict):
        return any(_has_ref(x) for x in v.values())
    return False


def is_flat(template: Any) -> bool:
    """Do the template's tensors (and baked values) all sit at its top level (no tensor inside a list argument or a
    keyword argument)?  Such a call can be written out with each argument in its place."""
    args, kwargs = template
    return not (any(_has_ref(a) for a in args if not isinstance(a, (InputRef, Baked))) or _has_ref(kwargs))


def argument_builder(template: Any) -> Any:
    """A function ``values -> (args, kwargs)`` for an EXTERN template, built once per node.

    [Note: extern call overhead] ``substitute`` walks the whole template on every call (tens of microseconds
    for a convolution's nested parameter lists).  Here the template is resolved once: constants and baked
    values are placed in a prototype argument list, and each call only drops the input tensors into their
    top-level slots.  Templates with tensors nested inside lists (``cat``'s operand list) use ``substitute``.
    """
    args, kwargs = template
    if not is_flat(template):
        return lambda values: substitute(template, values)
    proto = [a.value if isinstance(a, Baked) else a for a in args]
    slots = [(i, a.index) for i, a in enumerate(args) if isinstance(a, InputRef)]

    def build(values: Sequence[Any]) -> tuple[list[Any], dict[str, Any]]:
        out = list(proto)
        for i, k in slots:
            out[i] = values[k]
        return out, kwargs
    return build


def sibling_outputs(nodes: Any) -> dict[Any, Any]:
    """Extern nodes that are outputs of one call: ``follower -> leader`` among ``nodes`` (in the order they run).

    [Note: one call for a multi-output extern] A multi-output ATen op (``native_dropout``'s output and mask,
    ``max_pool2d_with_indices``) reaches the graph as one EXTERN per output used, alike but for ``out_index``.
    Run one call each, a random op would draw two different masks (dropout's output and the mask its backward
    reads would disagree) and a deterministic one would be computed twice.  The first of them to run (the
    leader) makes the call and keeps the whole result for this call; each other takes its output from it."""
    from kiln.ir.graph import Node
    from kiln.ir.ops import Op
    leaders: dict[tuple, Any] = {}
    out: dict[Any, Any] = {}
    for n in nodes:
        if not isinstance(n, Node) or n.op is not Op.EXTERN or n.attr("out_index") is None:
            continue
        key = (n.attr("target"), tuple(id(i) for i in n.inputs), _identity(n.attr("template")))
        leader = leaders.setdefault(key, n)
        if leader is not n:
            out[n] = leader
    return out


def _identity(template: Any) -> Any:
    """A hashable key equal for equal templates (baked values by identity)."""
    if isinstance(template, Baked):
        return ("baked", id(template))
    if isinstance(template, (list, tuple)):
        return (type(template).__name__, *(_identity(t) for t in template))
    if isinstance(template, dict):
        return ("dict", *((k, _identity(v)) for k, v in sorted(template.items())))
    return repr(template)
