"""The pass that puts kiln's batched GEMM (``kiln::bmm``, ``op.py``) in place of ATen's ``bmm``/``baddbmm`` on fp32
CPU tensors where it measures faster.

Attention written out by hand (``nn.MultiheadAttention``'s slow path, BLOOM's ALiBi scores, GPT-Neo, Falcon, T5's
position bias) runs its scores and weighted values as ATen batched products.  From a compiled graph each such call
goes through Python into MKL and returns a fresh tensor, and a ``baddbmm`` first copies its broadcast mask into
that tensor: MultiheadAttention's cross-attention scores (8 x 64x64 @ 64x69, transposed keys) took 135 us in the
graph where the same product alone took 67 us.  ``kiln_bmm`` (``library/gemm/source.py``) reads both operands
through their strides (a transposed key needs no copy), adds a broadcast mask or bias in its last step, writes into
the graph's arena and is called from the generated C++ (``runtime/native.py``).

Before::                                                    After (where kiln's measured faster)::

    %26 = mul(%20, %25) : f32[8, 64, 64]                        %26 = mul(%20, %25) : f32[8, 64, 64]
    %27 = permute(%21, dims=(1, 2, 0)) : f32[8, 64, 69]         %27 = permute(%21, dims=(1, 2, 0)) : f32[8, 64, 69]
    %28 = extern(%18, %26, %27, target=aten.baddbmm.default)    %28 = extern(%26, %27, %18, target=kiln.bmm.default)

The choice is measured per shape, layout class (keys transposed or not) and bias (``Kind`` ``bmm``), each
candidate as a compiled graph calls it: kiln's from C, ATen's through Python; kiln's is kept unless ATen's is
clearly faster, as for the GEMM (``library/gemm/select.py``: in a graph the Python of a library call runs
cache-cold).  Where N leaves a narrow last column panel ATen can stay faster: the scores above (N = 69 keys: 96
columns computed) measured 86 us against ATen's 68 alone, so they stay ATen's, while the weighted values (N = 64)
went from 80 us in the graph to 48.

[Note: products of run-time operands]  A training graph's products have no constant operand: the forward's
``addmm(bias, x, W^T)`` reads the weight as an input (it changes every step), the backward's ``dY @ W`` and
``dY^T @ X`` read activations and gradients.  Nothing is packed at compile time there, so kiln's packed GEMM
(``library/gemm``) does not apply, and ATen's ``mm`` went to MKL through Python.  ``kiln_bmm`` packs each B slice
as it goes and reads A through its strides, so an ``mm``/``addmm`` is its one-batch case (the operands and result
viewed with a leading unit dim, a bias row broadcast by zero strides).  One thread on Zen 4, a small GPT's
training shapes: 1.01-1.36x MKL's ``mm`` (the weight gradients, ``dY^T @ X``, gain most).  Measured per shape
and layout like the batched products; a product whose ``b`` is a constant is left to the GEMM selection.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from kiln.ir.extern import build_extern
from kiln.ir.graph import Graph, GraphBuilder, Node, data_device, view_root
from kiln.ir.interp import view_layout
from kiln.ir.ops import VIEW, Op, contiguous_strides
from kiln.ir.sym import bucket_hint
from kiln.library.bmm.op import interleaved_strides
from kiln.library.gemm import op as cpu_gemm
from kiln.passes.rewrite import RewriteLog, rewrite
from kiln.runtime import native
from kiln.tune.choices import Choices, Kind, measuring_s

aten = torch.ops.aten
BMM = Kind("bmm", 1, ("kiln", "aten"))
MIN_FLOPS = 1 << 16  # below this a product is a few microseconds either way: ATen's, no measurement


def _keys_transposed(b: Node) -> bool:
    """Is the product's right operand a permuted view whose rows (K) are contiguous: keys ``[B, S, D]`` read as
    ``[B, D, S]`` (what ``kiln_bmm`` packs along K rather than along N)?"""
    while b.op in (Op.RESHAPE, Op.EXPAND):
        b = b.inputs[0]
    return b.op is Op.PERMUTE and b.attr("dims")[-1] != len(b.shape) - 1


def choose(choices: Choices, batch: int, m: int, n: int, k: int, transposed: bool, bias: bool,
           flat: bool = False, a_transposed: bool = False) -> str:
    """'kiln' or 'aten' for one batched product, measured once per problem and machine (the tuning database).
    ``flat``: an ``mm``/``addmm`` (ATen's candidate is that op, its bias a row); ``a_transposed``: its left
    operand is a transposed view (a weight gradient's ``dY^T @ X``)."""

    def calls() -> dict:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(batch, k, m, generator=gen).transpose(1, 2) if a_transposed else \
            torch.randn(batch, m, k, generator=gen)
        b = torch.randn(batch, n, k, generator=gen).transpose(1, 2) if transposed else \
            torch.randn(batch, k, n, generator=gen)
        d = (torch.randn(n, generator=gen) if flat else torch.randn(m, n, generator=gen)) if bias else None
        if flat:
            a2, b2 = a[0], b[0]
            out = {"aten": (lambda: torch.addmm(d, a2, b2)) if bias else (lambda: torch.mm(a2, b2))}
        else:
            out = {"aten": (lambda: torch.baddbmm(d, a, b)) if bias else (lambda: torch.bmm(a, b))}
        kiln = native.direct_call(torch.ops.kiln.bmm.default, dict(a=a, b=b, d=d), torch.empty(batch, m, n))
        if kiln is not None:
            out["kiln"] = kiln
        return out

    key = (batch, m, n, k, int(transposed), int(bias), torch.get_num_threads()) + \
        (("mm", int(a_transposed)) if flat else ())
    return choices.decide(BMM, key, calls, baseline="kiln",
                          what=(f"mm {m}x{k}x{n}" if flat else f"bmm {batch}x{m}x{k}x{n}")
                          + (" a transposed" if a_transposed else "")
                          + (" b transposed" if flat and transposed else " keys transposed" if transposed else "")
                          + (" + bias" if bias else ""),
                          estimate_s=measuring_s(2, 2 * batch * m * n * k))


def _product(node: Node) -> tuple[Any, Any, Any] | None:
    """(a, b, d or None) of an fp32 ``bmm(a, b)`` or ``baddbmm(d, a, b)`` extern, or of an ``mm(a, b)`` /
    ``addmm(d, a, b)`` whose ``b`` is computed at run time (beta = alpha = 1), else None.  [Note: products of
    run-time operands]"""
    if node.op is not Op.EXTERN or node.dtype != torch.float32 or node.attr("out_index") is not None:
        return None
    packet = getattr(node.attr("target"), "overloadpacket", None)
    if packet not in (aten.bmm, aten.baddbmm, aten.mm, aten.addmm):
        return None
    args = native.named_args(node)
    if packet in (aten.bmm, aten.mm):
        a, b, d = args["self"], args["mat2"], None
    elif args.get("beta", 1) != 1 or args.get("alpha", 1) != 1:
        return None
    else:
        a, b, d = (args["batch1"], args["batch2"], args["self"]) if packet is aten.baddbmm else \
            (args["mat1"], args["mat2"], args["self"])
    if packet in (aten.mm, aten.addmm) and (not isinstance(b, Node) or view_root(b).op is Op.CONSTANT):
        return None  # a weight: packed once by kiln's GEMM (library/gemm/select.py), not at every call
    return a, b, d


def _heads_merged_by_a_view(node: Node, users: dict[Node, list[Node]]) -> bool:
    """Does the product's one reader chain of views (``permute(1, 0, 2)`` + ``reshape``: nn.MultiheadAttention
    merging its heads, ``[B*H, T, D] -> [T, B*H, D] -> [T*B, H*D]``) end contiguous from an ``[M, B, N]`` layout
    and not from the contiguous one?  Then ``kiln_bmm`` writes that layout and the merge is a view instead of a
    copy kernel (13-21 us per MultiheadAttention call of the zoo's mha_cross)."""
    chain, n = [], node
    while len(users[n]) == 1 and users[n][0].op in VIEW:
        n = users[n][0]
        chain.append(n)
    if not chain or chain[-1].op is not Op.RESHAPE:
        return False

    def ends_contiguous(strides: tuple[int, ...]) -> bool:
        found = view_layout(node.shape, strides, node.dtype, chain)
        return found is not None and found[1] == 0 and all(
            size == 1 or st == want for size, st, want in zip(chain[-1].shape, found[0],
                                                               contiguous_strides(chain[-1].shape)))
    return not ends_contiguous(contiguous_strides(node.shape)) and ends_contiguous(interleaved_strides(*node.shape))


def fixed_strides(n: Node) -> tuple[int, ...] | None:
    """The strides ``kiln::bmm`` writes its result with when told to interleave (the layout stage's question)."""
    if n.op is Op.EXTERN and n.attr("target") is torch.ops.kiln.bmm.default and native.named_args(n)["interleave"]:
        return interleaved_strides(*n.shape)
    return None


def _has_cpu_product(graph: Graph) -> bool:
    """Has ``graph`` an fp32 batched product on the CPU (a candidate of the pass)?"""
    return any(_product(n) is not None and data_device(n) == "cpu" for n in graph.nodes)


def libraries(graph: Graph) -> dict[str, Callable[[], Any]]:
    """The GEMM library, where the graph has an fp32 batched product on the CPU."""
    return {"kiln_gemm": cpu_gemm.library} if _has_cpu_product(graph) else {}


def select_bmm(graph: Graph, log: RewriteLog | None = None) -> Graph:
    """ATen's fp32 CPU ``bmm``/``baddbmm`` -> ``kiln::bmm`` where measured faster (module docstring)."""
    choices = log.choices if log is not None else Choices()
    # a candidate first, then the library: asking for it builds it (g++, seconds with a cold cache), and on a GPU
    # compile (or a CPU graph without a batched product) nothing here needs it - the H200's encoder_fast had spent
    # 4.4 s of its first compile building kiln's CPU GEMM
    if not _has_cpu_product(graph) or not cpu_gemm.available():
        return graph
    users = graph.users()

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        if _product(node) is None or data_device(node) != "cpu":  # (a cheap test first: most nodes are not)
            return None
        x, y, d = _product(Node(node.op, inputs, node.attrs, node.shape, node.dtype))  # with rewritten inputs
        if not all(isinstance(t, Node) for t in (x, y)) or not (d is None or isinstance(d, Node)):
            return None
        flat = len(x.shape) == 2  # mm / addmm: one batch
        # (symbolic sizes: chosen at their traced sizes' buckets; the call binds each size's from the size table,
        # [Note: native calls at any size])
        batch, m, k = (bucket_hint(v) for v in ((1, *x.shape) if flat else x.shape))
        n = bucket_hint(y.shape[-1])
        forced = choices.forced_value(BMM)
        if 2 * batch * m * n * k < MIN_FLOPS and not forced:
            return None
        if choose(choices, batch, m, n, k, _keys_transposed(y), d is not None, flat,
                  flat and _keys_transposed(x)) != "kiln":
            return None
        if log:
            log.hit(f"{node.attr('target').overloadpacket.__name__} -> kiln bmm")
        if flat:  # (views: the library reads through strides, a leading unit dim costs nothing)
            x = b.add(Op.RESHAPE, [x], shape=(1, *x.shape))
            y = b.add(Op.RESHAPE, [y], shape=(1, *y.shape))
            out = build_extern(b, torch.ops.kiln.bmm.default, [x, y, d, False], {}, (1, *node.shape), node.dtype)
            return b.add(Op.RESHAPE, [out], shape=node.shape)
        interleave = _heads_merged_by_a_view(node, users)
        if interleave and log:
            log.hit("kiln bmm writes heads merged")
        return build_extern(b, torch.ops.kiln.bmm.default, [x, y, d, interleave], {}, node.shape, node.dtype)

    return rewrite(graph, rule)
