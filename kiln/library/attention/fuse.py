"""Attention written out by hand becomes one fused attention call.

``softmax(Q K^T * scale + causal mask) V`` as a model writes it lowers to two batched matmuls around a
softmax that materializes the ``[B, H, T, T]`` scores (GPT 8 x 512 on the H200: 12.6 MB per layer written and
read twice, plus copies of Q, K and V into batch-major layout for the matmuls).  This pass recognizes the
pattern in the graph IR and replaces it by ``aten.scaled_dot_product_attention``, which dispatches to a
flash-attention kernel: scores stay on chip, and Q, K, V are read through their strides (no copies).

Recognized, from the second matmul up::

    O   = bmm(reshape(P, [BH, T, T]), reshape(V4, [BH, T, D]))
    P   = div(E, expand(sum(E, -1)))            E = exp(sub(L, expand(amax(L, -1))))
    L   = [where(mask, -inf, )] [mul(, scale) | div(, c)] reshape(bmm(reshape(Q4), reshape(K4t)), [B, H, T, T])

``mask`` must evaluate (from constants alone) to exactly the causal pattern (above the diagonal), and the
matmul operands must be reshapes of ``[B, H, T, D]`` (Q, V) and ``[B, H, D, T]`` (K transposed) views.
Anything else is left alone.

Before (per head group)::                          After::

    %20 = extern(%18, %19, target=aten.bmm)            %20 = extern(%13, %17', %16,
    ... mul, where, amax, sub, exp, sum, div ...               target=aten.scaled_dot_product_attention,
    %43 = extern(%41, %42, target=aten.bmm)                    is_causal=True, scale=0.25)
                                                       %43 = reshape(%20, [BH, T, D])

Applied on CUDA and on the CPU: ATen has flash-attention kernels for both (CPU, one thread, GPT's 12 heads x
256 x 64 causal: 2.5 ms against 3.6 ms for the matmul-softmax-matmul it replaces; the GPT model went from
192 to 187 ms, even with ONNX Runtime).
"""
from __future__ import annotations

import math
from typing import Any

import torch

from kiln.ir.extern import build_extern, substitute
from kiln.ir.graph import Graph, GraphBuilder, Node, data_device
from kiln.ir.interp import eval_node
from kiln.ir.ops import HALF, Op
from kiln.ir.sym import bucket_hint, is_symbolic
from kiln.passes.rewrite import RewriteLog, rewrite
from kiln.runtime import native
from kiln.library.attention import op as cpu_attention
from kiln.tune.choices import Choices, Kind, measuring_s

aten = torch.ops.aten


def _is_bmm(n: Node) -> bool:
    return n.op is Op.EXTERN and getattr(n.attr("target"), "overloadpacket", None) is aten.bmm \
        and n.attr("out_index") is None


def libraries(graph: Graph) -> dict[str, Any]:
    """kiln's libraries this pass may use on ``graph`` (built in the background from the compile's start): the
    CPU attention kernel, where fp32 batched products on the CPU may be an attention's, or ATen's CPU flash
    attention is called."""
    if any(n.op is Op.EXTERN and n.dtype == torch.float32 and n.attr("target") is _SDPA_CPU for n in graph.nodes) \
            or any(_is_bmm(n) and n.dtype == torch.float32 and _on(n, ("cpu",)) for n in graph.nodes):
        return {"kiln_attention": cpu_attention.library}
    return {}


_SDPA_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default


def _strip(n: Node, op: Op) -> Node | None:
    return n.inputs[0] if n.op is op else None


def _scalar(n: Node) -> float | None:
    """The value of a broadcast scalar constant (``expand(full(v))``)."""
    while n.op is Op.EXPAND:
        n = n.inputs[0]
    if n.op is Op.FULL and not n.shape and not is_symbolic(n.attr("value")):
        return float(n.attr("value"))
    return None


def _const_eval(n: Node, memo: dict[Node, torch.Tensor | None]) -> torch.Tensor | None:
    """``n``'s value when it depends on constants only, else None."""
    if n in memo:
        return memo[n]
    if n.op in (Op.INPUT, Op.EXTERN) or any(is_symbolic(s) for s in n.shape):  # (a size of the call: not known)
        value = None
    elif n.op in (Op.CONSTANT, Op.FULL, Op.IOTA):
        value = eval_node(n, [])
    else:
        args = [_const_eval(i, memo) for i in n.inputs]
        value = None if any(a is None for a in args) else eval_node(n, args)
    memo[n] = value
    return value


def _softmax_input(p: Node) -> Node | None:
    """L for P = softmax(L) over the last axis (as lowered: amax, sub, exp, sum, div); in half precision also
    P = cast(softmax(cast(L to fp32)) back to L's dtype), how models and ATen's half softmax compute it (SDPA's
    kernels too keep the softmax in fp32)."""
    if p.op is Op.CAST and p.inputs[0].op is Op.DIV and p.dtype in HALF:
        up = _softmax_input(p.inputs[0])
        if up is None or up.op is not Op.CAST or up.inputs[0].dtype != p.dtype \
                or p.inputs[0].dtype != torch.float32:
            return None
        return up.inputs[0]
    if p.op is not Op.DIV:
        return None
    e, denom = p.inputs
    s = _strip(denom, Op.EXPAND)
    if e.op is not Op.EXP or s is None or s.op is not Op.SUM or s.inputs[0] is not e:
        return None
    last = len(p.shape) - 1
    if s.attr("axes") != (last,):
        return None
    sub = e.inputs[0]
    if sub.op is not Op.SUB:
        return None
    logits, mx = sub.inputs
    m = _strip(mx, Op.EXPAND)
    if m is None or m.op is not Op.AMAX or m.inputs[0] is not logits or m.attr("axes") != (last,):
        return None
    return logits


def _causal(cond: Node, t: Any) -> bool:
    if is_symbolic(t):
        return _causal_for_every_length(cond, t)
    value = _const_eval(cond, {})
    if value is None or value.dtype != torch.bool or tuple(value.shape[-2:]) != (t, t):
        return False
    upper = torch.ones(t, t, dtype=torch.bool, device=value.device).triu(1)
    return bool((value == upper).all())


# ops whose element (i, j) does not depend on the symbolic length it is computed at (a leading block of a longer
# computation): what a causal mask sliced from a constant is made of
_PREFIX_STABLE = {Op.CONSTANT, Op.FULL, Op.EXPAND, Op.PERMUTE, Op.SLICE, Op.RESHAPE}


def _causal_for_every_length(cond: Node, t: Any) -> bool:
    """Is ``cond`` ([..., T, T] over a symbolic ``T``) the causal pattern for every ``T``?

    [Note: a causal mask at every length] The mask a model slices from a constant, ``tril(ones(N, N))[:T, :T] ==
    0``, is causal for each ``T <= N`` when it is causal for ``T = N``: its element (i, j) is the constant's, read
    through leading slices (start 0, step 1) and elementwise ops, whatever ``T`` is - and a ``T`` beyond ``N``
    cannot occur (the slice would stop at ``N``, not ``T``).  So the subgraph is checked to be made of such ops
    with ``T`` as its only symbol, then evaluated once at ``T = N``.  Anything else (an iota-based mask, another
    symbol) is not proven causal, and the attention stays unfused."""
    from kiln.ir.ops import ELEMENTWISE
    from kiln.ir.sym import as_symbol, symbols_of
    symbol = as_symbol(t)
    if symbol is None:
        return False
    extents: list[int] = []
    nodes: list[Node] = []
    stack, seen = [cond], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        nodes.append(n)
        if n.op is Op.EXPAND:  # another symbol only where a size-1 dimension is broadcast (batch, heads)
            x = n.inputs[0]
            off = len(n.shape) - len(x.shape)
            if any(is_symbolic(d) and d != t and (k < off or x.shape[k - off] != 1) for k, d in enumerate(n.shape)):
                return False
        elif any(is_symbolic(d) and d != t for d in n.shape) or any(
                is_symbolic(v) for v in n.attrs.values() if n.op not in (Op.SLICE, Op.RESHAPE)):
            return False
        if n.op is Op.SLICE:
            x = n.inputs[0]
            d = n.attr("dim")
            if n.attr("start") != 0 or n.attr("step") != 1 or is_symbolic(x.shape[d]):
                return False
            if is_symbolic(n.shape[d]):
                extents.append(x.shape[d])
        elif n.op is Op.RESHAPE and [d for d in n.shape if d != 1] != [d for d in n.inputs[0].shape if d != 1]:
            return False  # (only size-1 dimensions added or removed)
        elif n.op not in _PREFIX_STABLE and n.op not in ELEMENTWISE:
            return False
        stack.extend(n.inputs)
    if not extents:
        return False
    length = min(extents)
    others = {x for n in nodes for d in n.shape for x in symbols_of(d)} - {symbol}
    env = {symbol.name: length, **{x.name: 1 for x in others}}  # (broadcast dimensions: any size shows the same)
    values: dict[Node, torch.Tensor] = {}
    for n in sorted(nodes, key=lambda n: n.uid):  # (uids grow in graph order)
        values[n] = eval_node(n, [values[i] for i in n.inputs], env)
    value = values[cond]
    if value.dtype != torch.bool or tuple(value.shape[-2:]) != (length, length):
        return False
    upper = torch.ones(length, length, dtype=torch.bool, device=value.device).triu(1)  # (a GPU model's constant)
    return bool((value == upper).all())


def _heads(flat: Node, b: int, h: int) -> Node | None:
    """The 4-D [B, H, X, Y] node that ``flat`` ([B*H, X, Y]) reshapes."""
    src = _strip(flat, Op.RESHAPE)
    if src is None or len(src.shape) != 4 or tuple(src.shape[:2]) != (b, h):
        return None
    return src


def fuse_attention(graph: Graph, log: RewriteLog | None = None, devices: tuple[str, ...] = ("cuda", "cpu")) -> Graph:
    choices = log.choices if log is not None else Choices()

    def rule(node: Node, inputs: tuple[Node, ...], bld: GraphBuilder) -> Node | None:
        if node.op is Op.EXTERN and node.attr("target") is _SDPA_CPU:
            return _flash_cpu(node, inputs, bld, choices, log)
        if not _is_bmm(node) or len(inputs) != 2:
            return None
        p3, v3 = inputs
        p4 = _strip(p3, Op.RESHAPE)
        if p4 is None or len(p4.shape) != 4:
            return None
        logits = _softmax_input(p4)
        if logits is None:
            return None
        found = _scores(logits)
        if found is None:
            return None
        s4, scale, causal = found
        s3 = _strip(s4, Op.RESHAPE)
        if s3 is None or not _is_bmm(s3):
            return None
        b, h, t, s = p4.shape  # (t queries, s keys: cross attention has s != t, and no causal mask then)
        q4, kt4, v4 = _heads(s3.inputs[0], b, h), _heads(s3.inputs[1], b, h), _heads(v3, b, h)
        if q4 is None or kt4 is None or v4 is None or (causal and t != s) or q4.shape[2] != t \
                or v4.shape[2] != s or kt4.shape[3] != s or q4.shape[3] != kt4.shape[2] or not _on(q4, devices):
            return None
        k4 = bld.add(Op.PERMUTE, (kt4,), dims=(0, 1, 3, 2))
        shape = (b, h, t, v4.shape[3])
        # (symbolic sizes: chosen at their traced sizes' buckets; kiln's op takes its sizes from each call's tensors)
        hb, hh, ht, hs, hd = (bucket_hint(x) for x in (b, h, t, s, q4.shape[3]))
        if node.dtype == torch.float32 and _on(q4, ("cpu",)) and v4.shape[3] == q4.shape[3] \
                and choose(choices, hb, hh, ht, hs, hd, causal):  # (kiln's kernel: one head size for Q, K and V)
            out4 = build_extern(bld, torch.ops.kiln.attention.default, [q4, k4, v4, None, scale, causal, False], {},
                                shape, node.dtype)
            what = "kiln attention"
        else:
            out4 = build_extern(bld, aten.scaled_dot_product_attention.default, [q4, k4, v4],
                                {"is_causal": causal, "scale": scale}, shape, node.dtype)
            what = "scaled_dot_product_attention"
        if log:
            log.hit(f"attention -> {what}" + (" (causal)" if causal else ""))
        return bld.add(Op.RESHAPE, (out4,), shape=node.shape)

    return rewrite(graph, rule)


def _flash_cpu(node: Node, inputs: tuple[Node, ...], bld: GraphBuilder, choices: Choices,
               log: RewriteLog | None) -> Node | None:
    """ATen's CPU flash attention (what ``scaled_dot_product_attention`` becomes on fp32 CPU tensors) -> kiln's
    kernel, where measured faster for the shape: no dropout, an additive fp32 mask or none, causal only with as
    many keys as queries (ATen aligns a causal mask top-left; kiln's kernel only the square case).  Its output
    ``logsumexp`` (``out_index`` 1, used by training) stays ATen's.

    Before::                                                      After::

        %5 = extern(%1, %2, %3, attn_mask=%4, scale=0.125,            %5 = extern(%1, %2, %3, %4, 0.125, False,
                    target=aten._scaled_dot_product_flash_              True, target=kiln.attention.default)
                    attention_for_cpu.default, out_index=0)
    """
    if node.attr("out_index") != 0 or node.dtype != torch.float32 or len(node.shape) != 4:
        return None
    args, kwargs = substitute(node.attr("template"), inputs)  # (the rebuilt graph's nodes)
    named = native.op_args(_SDPA_CPU, *args, **kwargs)
    q, k, v, mask = named["query"], named["key"], named["value"], named.get("attn_mask")
    if named.get("dropout_p", 0.0) != 0.0 or not all(isinstance(x, Node) and x.dtype == torch.float32
                                                     and len(x.shape) == 4 for x in (q, k, v)):
        return None
    b, h, t, d = q.shape
    s = k.shape[2]
    causal = bool(named.get("is_causal", False))
    if not _may_match(k.shape, (b, h, s, d)) or not _may_match(v.shape, (b, h, s, d)) or (causal and s != t) \
            or s == 0:
        return None
    if mask is not None and not (isinstance(mask, Node) and mask.dtype == torch.float32 and len(mask.shape) <= 4
                                 and _broadcasts(mask.shape, (b, h, t, s))):
        return None
    scale = named.get("scale")
    if scale is None and is_symbolic(d):
        return None  # (the default scale 1/sqrt(D) of a symbolic head size is no constant)
    scale = float(scale) if scale is not None else d ** -0.5
    # (symbolic sizes: chosen at their traced sizes' buckets; kiln's op takes its sizes from each call's tensors)
    if not choose(choices, *(bucket_hint(x) for x in (b, h, t, s, d)), causal, mask is not None):
        return None
    if log:
        log.hit("flash attention -> kiln attention" + (" (masked)" if mask is not None else ""))
    return build_extern(bld, torch.ops.kiln.attention.default, [q, k, v, mask, scale, causal, True], {},
                        node.shape, node.dtype)


def _may_match(shape: tuple[Any, ...], want: tuple[Any, ...]) -> bool:
    """Equal sizes, dimension by dimension - or two different symbols, which only a call can compare: Dynamo gives
    a decoding step's key and value caches symbols of their own (``s87 + 1``, ``s94 + 1``); kiln's op checks the
    shapes of every call and raises as ATen's does where they differ."""
    return len(shape) == len(want) and all(a == b or (is_symbolic(a) and is_symbolic(b)) for a, b in zip(shape, want))


def _broadcasts(shape: tuple[int, ...], to: tuple[int, ...]) -> bool:
    pad = len(to) - len(shape)
    return all(x in (1, to[i + pad]) for i, x in enumerate(shape))


def _scores(logits: Node) -> tuple[Node, float, bool] | None:
    """(S4 = the reshaped Q K^T, scale, causal) for logits = [where(mask, -inf, )] [mul(, scale) | div(, c)] S4."""
    causal = False
    t = logits.shape[-1]
    if logits.op is Op.WHERE:
        cond, fill, rest = logits.inputs
        if _scalar(fill) != -math.inf or not _causal(cond, t):
            return None
        causal, logits = True, rest
    scale = 1.0
    if logits.op is Op.MUL:
        a, b = logits.inputs
        if _scalar(b) is not None:
            scale, logits = _scalar(b), a
        elif _scalar(a) is not None:
            scale, logits = _scalar(a), b
        else:
            return None
    elif logits.op is Op.DIV and _scalar(logits.inputs[1]) not in (None, 0.0):
        scale, logits = 1.0 / _scalar(logits.inputs[1]), logits.inputs[0]
    return logits, scale, causal


def _on(n: Node, devices: tuple[str, ...]) -> bool:
    """Is the graph's data on one of ``devices``?  Judged from the constants it reaches (weights), else the
    compile's device (``ir/graph.data_device``)."""
    return data_device(n) in devices


ATTENTION = Kind("attention", 6, ("kiln", "aten"))  # CPU fp32: kiln's kernel or ATen's SDPA


def choose(choices: Choices, b: int, h: int, t: int, s: int, d: int, causal: bool, masked: bool = False) -> bool:
    """Is kiln's kernel clearly faster than ATen's for this shape (``s`` keys; ``masked``: with an additive
    ``[B, 1, T, S]`` mask) - measured once per shape and machine?"""
    kiln = cpu_attention.available()

    def calls() -> dict:
        gen = torch.Generator().manual_seed(0)
        q = torch.randn(b, h, t, d, generator=gen)
        k, v = (torch.randn(b, h, s, d, generator=gen) for _ in range(2))
        mask = torch.randn(b, 1, t, s, generator=gen) if masked else None
        scale = d ** -0.5
        out = {"aten": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                                 is_causal=causal, scale=scale)}
        if kiln:  # as a compiled graph runs it: called from C++ into its buffer (runtime/native.py)
            op = torch.ops.kiln.attention.default
            call = native.direct_call(op, native.op_args(op, q, k, v, mask, scale, causal, True),
                                      torch.empty(b, t, h, d).permute(0, 2, 1, 3))
            if call is not None:  # (None: an empty problem)
                out["kiln"] = call
        return out

    what = f"attention {b}x{h}x{t}x{s}x{d}{' causal' if causal else ''}{' masked' if masked else ''}"
    # past the measuring budget: kiln's kernel where it builds (one thread, AVX-512: 1.35x ATen's on Whisper's
    # 8 x 1500 x 64 heads, 1.4x on ViT's 12 x 197 x 64, 1.5x on Swin's 49-token windows, 1.8x causal 12 x 64 x 64)
    return choices.decide(ATTENTION, (b, h, t, s, d, int(causal), int(masked), torch.get_num_threads()), calls,
                          baseline="aten", what=what, predict=lambda: "kiln" if kiln else "aten",
                          estimate_s=measuring_s(2, 4 * b * h * t * s * d)) == "kiln"
