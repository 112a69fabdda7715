"""Pick the GEMM implementation per linear layer, by measurement.

On CPUs the GEMM, not the rest of the compiler, decides GEMM-heavy models (see shared/ANCHORS.md: on the AMD
CPUs we run on, oneDNN's fp32 GEMM is well ahead of MKL's, which is what ``aten.addmm`` calls).  For each
``addmm(b, x, W.t())`` / ``mm(x, W.t())`` with a frozen weight, the candidates - MKL, oneDNN, and kiln's own
GEMM (``library/gemm/source.py``, on a weight packed at compile time) - run a few times on random inputs of the
real shape, and kiln's is kept unless another is clearly (3%) faster; the choice is kept in the tuning
database per shape and thread count (``tune/choices.py``).

Before::                                                     After (when oneDNN measured faster)::

    %3 = permute(%w, dims=(1, 0)) : f32[1024, 4096]              %4 = extern(%x, %w, %b,
    %4 = extern(%b, %x, %3, target=aten.addmm.default)                 target=mkldnn._linear_pointwise.default)
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from kiln.ir.extern import Baked, build_extern, checked_source, extern_args
from kiln.ir.graph import Graph, GraphBuilder, Node
from kiln.ir.interp import constant_value
from kiln.ir.ops import Op
from kiln.ir.sym import bucket_hint, is_symbolic
from kiln.passes.rewrite import RewriteLog, rewrite
from kiln.runtime import native
from kiln.library.gemm import op as cpu_gemm
from kiln.library.gemm import tune as tune_gemm
from kiln.tune import timing
from kiln.tune.choices import Choices, Kind, measuring_s

aten = torch.ops.aten
GEMM = Kind("gemm", 10, ("kiln", "onednn", "aten"))  # (a new version when the candidates or their timing change)
# below this the call overhead decides, not the library.  (Was 1 << 22; ResNet's 1x512x1000 classifier then ran
# in MKL through Python at 0.42-0.51 ms, where kiln's GEMM called from C++ measured 0.26-0.34 ms on Zen 3.)
MIN_FLOPS = 1 << 19


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def choose(choices: Choices, m: int, k: int, n: int, gelu: bool = False) -> str:
    """'kiln', 'onednn' or 'aten' for an [m, k] x [k, n] fp32 product with bias, measured once per shape and
    machine (kept in the tuning database, so a new process measures nothing).  ``gelu``: the product
    feeds an exact gelu, which kiln's GEMM and oneDNN then apply in their epilogue (``library/gemm/epilogue.py``) and
    ATen leaves to a kernel of its own: each candidate is timed with it (oneDNN's erf post-op cost GPT's
    256x768x3072 linear 4.6 ms on Zen 3, where kiln's epilogue and ORT's separate gelu cost ~1.3 ms or less)."""
    kiln = cpu_gemm.available()

    def calls() -> dict:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(m, k, generator=gen)
        b = torch.randn(n, generator=gen)
        # each call on another copy of the weight, so it comes from memory as in a model
        ws = timing.copies(torch.randn(n, k, generator=gen), timing.cold_copies(4 * n * k))
        after = torch.empty(m, n)
        out = {"aten": timing.cycling([lambda w=w: torch.addmm(b, x, w.t()) for w in ws])}
        if gelu:
            out["aten"] = timing.cycling([lambda w=w: aten.gelu.out(torch.addmm(b, x, w.t()), out=after)
                                             for w in ws])
        if onednn_available():
            post = ("gelu", [], "none") if gelu else ("none", [], "")
            out["onednn"] = timing.cycling([lambda w=w: torch.ops.mkldnn._linear_pointwise(x, w, b, *post)
                                               for w in ws])
        if kiln:
            # as a compiled graph runs it: called from C++ into its buffer (runtime/native.py)
            op, y = torch.ops.kiln.linear_packed.default, torch.empty(m, n)
            out["kiln"] = timing.cycling([native.direct_call(op, native.op_args(op, x, p, b, n, gelu=gelu), y)
                                          for p in timing.copies(cpu_gemm.pack_weight(ws[0]), len(ws))])
        return out

    # kiln's GEMM unless another is clearly faster: in a compiled graph it is called from C++, while a library
    # call goes through Python, whose code runs cache-cold after a GEMM (runtime/native.py) - a cost an isolated
    # measurement does not see.  (Without it: ATen, the default path users know.)
    key = (m, k, n, torch.get_num_threads()) + ((1,) if gelu else ())
    return choices.decide(GEMM, key, calls, baseline="kiln" if kiln else "aten",
                          what=f"linear {m}x{k}x{n}" + (" + gelu" if gelu else ""),
                          estimate_s=measuring_s(3, 2 * m * k * n))


def libraries(graph: Graph) -> dict[str, Callable[[], Any]]:
    """kiln's libraries this pass may use on ``graph`` (the pipeline starts their builds in the background at the
    compile's start): the GEMM, where a product has a constant CPU weight."""
    for n in graph.nodes:
        if n.op is Op.EXTERN and getattr(n.attr("target"), "overloadpacket", None) in (aten.addmm, aten.mm) \
                and any((w := _weight(i)) is not None and w.device.type == "cpu" for i in n.inputs):
            return {"kiln_gemm": cpu_gemm.library}
    return {}


def _gelu_fed(graph: Graph) -> set[Node]:
    """Nodes whose value (or whose reshape's) feeds the exact-gelu pattern ``gemm_epilogue`` fuses."""
    from kiln.library.gemm.epilogue import gelu_input
    out = set()
    for n in graph.nodes:
        x = gelu_input(n)
        if x is not None:
            out.add(x)
            if x.op is Op.RESHAPE:
                out.add(x.inputs[0])
    return out


def _weight(n: Node) -> torch.Tensor | None:
    """The [N, K] weight whose transpose the product's operand ``n`` ([K, N]) is, when ``n`` is a constant or a view
    of one: ``W.t()`` of a linear layer, a slice of a fused QKV weight (``nn.MultiheadAttention``'s cross-attention
    projects the query and the key/value with two slices of its ``in_proj_weight``, which were ATen's addmm at
    half the GEMM's speed before), or a [K, N] weight used as it is (GPT-2's ``Conv1D``: ``addmm(b, x, W)``, 48
    ATen calls per GPT-2 forward before)."""
    value = constant_value(n)
    return value.t() if value is not None and value.dim() == 2 else None


def select_gemm(graph: Graph, log: RewriteLog | None = None, tuning: bool = False) -> Graph:
    """``tuning`` (max-autotune): kiln's GEMM gets a measured schedule where the database has none."""
    choices = log.choices if log is not None else Choices()
    if not onednn_available() and not cpu_gemm.available():
        return graph

    gelu_fed = _gelu_fed(graph)
    per_bucket: dict[tuple, tune_gemm.BucketSchedules] = {}  # (rows, k, n) -> one per problem (every layer's)

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node | None:
        if node.op is not Op.EXTERN or node.dtype != torch.float32 or node.attr("out_index") is not None:
            return None
        packet = getattr(node.attr("target"), "overloadpacket", None)
        if packet not in (aten.addmm, aten.mm):
            return None
        new = Node(node.op, inputs, node.attrs, node.shape, node.dtype)  # args with rewritten inputs
        args, kwargs = extern_args(new)
        if kwargs:
            return None
        bias, x, wt = (args if packet is aten.addmm else [None, *args])
        w = _weight(wt)
        if w is None or w.device.type != "cpu" or w.dim() != 2 or len(x.shape) != 2 \
                or (bias is not None and bias.shape != (node.shape[1],)):
            return None
        m, k = x.shape
        n = node.shape[1]
        if is_symbolic(k) or is_symbolic(n):
            return None
        # a number of rows known per call only (dynamic shapes): the library chosen at the bucket of the traced
        # size, the schedule per size bucket of each call's rows ([Note: schedules per size bucket], gemm/tune.py)
        rows, symbolic_m, m = m, is_symbolic(m), bucket_hint(m)
        forced = choices.forced_value(GEMM)
        big = 2 * m * k * n >= MIN_FLOPS
        choice = choose(choices, m, k, n, node in gelu_fed) if big or forced else "aten"  # (forced: any size)
        if choice == "kiln" and not cpu_gemm.available() or choice == "onednn" and not onednn_available():
            return None  # (forced to a library this machine lacks)
        if choice == "kiln":
            if log:
                log.hit(f"{packet.__name__} -> kiln GEMM")
            packed = cpu_gemm.pack_weight(w.float())
            if symbolic_m:
                if (rows, k, n) not in per_bucket:
                    per_bucket[rows, k, n] = tune_gemm.BucketSchedules(rows, k, n, tuning, choices)
                extra: list[Any] = per_bucket[rows, k, n].args()
                if log:
                    log.hit("kiln GEMM schedule per size bucket")
            else:
                tuned = tune_gemm.schedule(m, k, n, tune=tuning, choices=choices)
                if tuned is not None and log:
                    log.hit("kiln GEMM schedule from tuning")
                extra = [tuned.mr, tuned.kc, tuned.mc] if tuned is not None else []
            return build_extern(b, torch.ops.kiln.linear_packed.default,
                                [x, Baked(packed, f"packed{list(w.shape)}", checked_source(w)), bias, n, *extra],
                                {}, node.shape,
                                node.dtype)
        if choice != "onednn":
            return None
        if log:
            log.hit(f"{packet.__name__} -> oneDNN linear")
        transposed = wt.op is Op.PERMUTE and wt.attr("dims") == (1, 0)  # (oneDNN takes the [N, K] weight)
        weight = wt.inputs[0] if transposed else Baked(w.contiguous(), f"weight{list(w.shape)}")
        return build_extern(b, torch.ops.mkldnn._linear_pointwise.default,
                            [x, weight, bias, "none", [], ""], {}, node.shape, node.dtype)

    return rewrite(graph, rule)
