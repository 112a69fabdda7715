"""``KILN_CHECK`` at run time: every step of a compiled graph compared with the reference as it runs.

The pass checker (passes/check.py) proves that the passes keep the graph's meaning; what runs is generated code
and library calls, which it never sees.  With check on, a compiled graph runs step by step - each kernel and
each native call of a C++ segment on its own (``kiln_segment_<i>_entry``), each Python extern, each fused GPU
step - and before each step the values it will write are computed by the reference from the step's *own*
inputs, as the compiled code holds them:

* a generated kernel: its graph nodes run by the interpreter (``ir/interp.py``) on the buffers it reads;
* a library call: the ATen computation it stands for (``runtime/references.py``; kiln's GEMM against
  ``F.linear`` on the unpacked weight), else the ATen op itself on contiguous copies of its inputs.

So a step is judged alone, and rounding from earlier steps does not add up.  The first step whose result is
not close raises ``StepCheckError`` naming the step, the graph nodes it computes, its schedule, and its inputs'
shapes and strides.  (The reference is computed before the step runs: a step may write over a dying input.)
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import torch

from kiln.ir.graph import Graph, GraphBuilder, Node, format_node, type_str
from kiln.ir.interp import eval_node
from kiln.ir.ops import Op
from kiln.runtime import references


@dataclasses.dataclass
class StepInfo:
    """One executed step of a compiled graph, as the checker reports it."""
    graph: str
    index: int                 # position among the executed steps (kernels and calls of segments counted apart)
    kind: str                  # "kernel", "native" (a library call from C++), "extern" (from Python), "fused"
    name: str
    nodes: list[str]           # the graph IR lines it computes
    schedule: str
    inputs: list[str]          # each input: dtype, shape, strides, storage offset
    output: str = ""           # the graph node whose value differs
    detail: str = ""
    # the step alone as a graph (what it reads as inputs) and the values it read: a reproducer (kiln bisect)
    subgraph: Any = None
    subgraph_inputs: list[torch.Tensor] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        lines = [f"KILN_CHECK: step {self.index} of graph {self.graph!r} ({self.kind} {self.name}) differs from the "
                 f"reference at {self.output}: {self.detail}",
                 "  computes:"] + [f"    {line}" for line in self.nodes]
        if self.schedule:
            lines.append(f"  schedule: {self.schedule}")
        lines.append("  inputs:")
        lines += [f"    {line}" for line in self.inputs] or ["    (none)"]
        return "\n".join(lines)


class StepCheckError(AssertionError):
    """The first step of a compiled graph whose result is not close to the reference's."""

    def __init__(self, info: StepInfo):
        self.info = info
        super().__init__(info.describe())


# per-element tolerance: relative, and absolute as a fraction of the reference's largest magnitude (a step's
# rounding differs from eager's by reassociation: lanes of a reduction, a GEMM's k blocking)
TOLERANCES = {torch.float32: 1e-4, torch.float64: 1e-7, torch.float16: 1e-2, torch.bfloat16: 3e-2}


def mismatch(got: torch.Tensor, want: torch.Tensor) -> str:
    """'' when ``got`` is close to ``want``, else what differs."""
    if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
        return f"got {type_name(got)}, expected {type_name(want)}"
    if got.numel() == 0:
        return ""
    if not got.dtype.is_floating_point:
        bad = got.cpu() != want.cpu()
        return f"{int(bad.sum())} of {got.numel()} elements differ" if bad.any() else ""
    g, w = got.double().cpu(), want.double().cpu()
    tol = TOLERANCES.get(got.dtype, 1e-4)
    scale = _magnitude(w)
    close = torch.isclose(g, w, rtol=tol, atol=tol * scale, equal_nan=True)
    if bool(close.all()):
        return ""
    diff = (g - w).abs().nan_to_num(float("inf"))
    return (f"{int((~close).sum())} of {got.numel()} elements differ (max abs diff {float(diff.max()):.3g}, "
            f"reference max magnitude {scale:.3g}, tolerance {tol:g})")


def _magnitude(w: torch.Tensor) -> float:
    """The largest finite magnitude of the reference ``w``, at least 1: what absolute tolerances scale with."""
    finite = w[torch.isfinite(w)]
    return max(1.0, float(finite.abs().max())) if finite.numel() else 1.0


def type_name(t: torch.Tensor) -> str:
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def layout_text(name: str, t: torch.Tensor) -> str:
    return f"{name}: {type_name(t)} strides {list(t.stride())} offset {t.storage_offset()}"


class _Step:
    """What one step writes (graph nodes) and what it needs to say about itself."""

    def __init__(self, kind: str, name: str, written: list[Node], nodes: list[Node], schedule: Any = None,
                 held_by: dict[Node, Node] | None = None):
        """``held_by``: a written value -> the node whose buffer holds it, where not its own (an updated input:
        [Note: write-backs in place])."""
        self.kind, self.name, self.written, self.nodes = kind, name, written, nodes
        self.schedule = "" if schedule is None else str(schedule)
        self.held_by = held_by or {}


def run_checked(graph: Any, inputs: Any) -> list[torch.Tensor]:
    """One call of ``graph`` (a ``CompiledGraph``), each step checked against the reference before the next."""
    env, write_back = graph.start(inputs)
    node_of = {name: n for n, name in graph.plan.buffer_of.items()}
    kernels = {k.name: k for k in graph.plan.kernels}
    held = _held(graph.plan)
    index = 0
    for step, (kind, item) in enumerate(graph.program):
        if not graph.arena_mode:
            graph.allocate_step(step, env)
        if kind == "segment":
            for k, entry in enumerate(graph.segments[item]):
                what = _kernel_step(kernels[entry], node_of, graph.plan.stored_into) if isinstance(entry, str) else \
                    _Step("native", entry.label, [entry.node], [entry.node])
                _checked(graph, what, env, index, lambda item=item, k=k: graph.run_entry(item, k, env), held)
                index += 1
        elif kind == "fused":
            written = [node_of[b] for b in sorted(item.buffers()[1])]
            what = _Step("fused", getattr(item, "name", "matmul"), written, [item.node] + written)
            _checked(graph, what, env, index, lambda item=item: graph.run_fused(item, env), held)
            index += 1
        else:
            what = _Step("extern", str(item.attr("target")), [item], [item])
            _checked(graph, what, env, index, lambda item=item: graph.run_extern(item, env), held)
            index += 1
        for n in graph.drop_after[step]:
            env.pop(n, None)
    return graph.finish(env, write_back)


def _kernel_step(kernel: Any, node_of: dict[str, Node], stored_into: dict[str, Node]) -> _Step:
    written, held_by = [], {}
    for b in sorted(kernel.buffers()[1]):
        if b in stored_into:  # (an input the kernel updates: its new value is the stored node's)
            written.append(stored_into[b])
            held_by[stored_into[b]] = node_of[b]
        elif b in node_of:
            written.append(node_of[b])
    return _Step("kernel", kernel.name, written, list(kernel.nodes), kernel.schedule, held_by)


def _held(plan: Any) -> dict[Node, Node]:
    """Values a kernel stores into an input's buffer ([Note: write-backs in place]) -> that input: later steps
    read them there, and so does the reference, rather than computing them again from the updated input."""
    return {v: n for n, b in plan.buffer_of.items() for v in [plan.stored_into.get(b)] if v is not None}


def _checked(graph: Any, step: _Step, env: dict, index: int, run: Callable[[], None],
             held: dict[Node, Node]) -> None:
    realized = set(graph.plan.buffer_of) | set(held)
    actual: dict[Node, torch.Tensor] = {}
    expected, order, read = _reference(step.written, realized,
                                       lambda n: actual.setdefault(n, graph.value(held.get(n, n), env)))
    run()
    runs: list[dict[Node, Any]] | None = None  # ([Note: a float64 second opinion]: made once, where needed)
    for n in step.written:
        holder = step.held_by.get(n, n)
        got = graph.value(holder, env) if holder in env or holder in realized else None
        if got is None or n not in expected:
            continue
        problem = mismatch(got, expected[n])
        if problem and runs is None:
            runs = _rounding_runs(order, read)
        if problem and not _within_reference_error(got, expected[n], [r.get(n) for r in runs]):
            names = graph_names(graph.graph)
            lines = [f"{_name(names, m)} = {format_node(m, names)} : {type_str(m)}" for m in step.nodes]
            inputs = [layout_text(_name(names, m), t) for m, t in actual.items()]
            sub, sub_inputs = _subgraph(order, step.written, read)
            raise StepCheckError(StepInfo(graph.name, index, step.kind, step.name, lines, step.schedule, inputs,
                                          f"{_name(names, n)} ({type_str(n)})", problem, sub, sub_inputs))


def _name(names: dict[Node, str], n: Node) -> str:
    """``n``'s name in the graph ``kiln.explain`` shows; a node the schedule made (a symbolic graph's kernels
    are built per size, from a copy of the graph) by its op and id."""
    return names.get(n) or f"%{n.op.value}#{n.uid}"


# [Note: a float64 second opinion]
# A step is judged against the reference's float32 result with a tolerance relative to its magnitude.  Where the
# computation is ill-conditioned a correct step can still be far from it: LayerNorm over a row of equal values
# divides rounding noise (x - mean, one ulp of x or exactly 0 depending on the order of the additions) by
# sqrt(eps) and returns noise x 1000.  Such a step is not wrong; it rounds differently.  So before a mismatch is
# reported, the step's reference is evaluated again in float64 from the same inputs (the exact value), and a few
# more times with every computed intermediate value perturbed by a few units of its own type's rounding (Monte
# Carlo arithmetic: how far rounding alone can move this computation).  The step passes where its distance from
# the exact value is within twice the larger of those distances and the float32 reference's own (the largest
# along the row, as a reduction's rounding is shared by its row), plus the usual tolerance.  A well-conditioned
# step's perturbed runs stay within a few ulps, so a real error still shows; only failing steps pay for this.
ROUNDING_RUNS = 4
ROUNDING_ULPS = 4.0
_UNIT_ROUNDOFF = {torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8,
                  torch.float64: 2.0 ** -53}
_EXACT_OPS = {Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE, Op.PAD, Op.CAT, Op.TAKE, Op.GATHER, Op.CONSTANT,
              Op.FULL, Op.IOTA, Op.AMAX, Op.AMIN, Op.MAXIMUM, Op.MINIMUM, Op.NEG, Op.ABS, Op.RELU, Op.WHERE}


def _rounding_runs(order: list[Node], read: dict[Node, Any]) -> list[dict[Node, Any]]:
    """The step's reference values in float64 from what it read: exact first, then ``ROUNDING_RUNS`` times with
    rounding-sized perturbations; empty where some op has no float64 kernel (a packed-weight library call: no
    second opinion)."""
    wide = {m: _widen(v) for m, v in read.items()}
    try:
        return [_reference_values(order, wide, functools.partial(
            _evaluate_wide, noise=torch.Generator().manual_seed(k) if k else None)) for k in range(ROUNDING_RUNS + 1)]
    except Exception:
        return []


def _within_reference_error(got: torch.Tensor, want: torch.Tensor, runs: list[Any]) -> bool:
    """Is ``got`` as close to the exact value (``runs[0]``) as rounding alone moves this computation (the float32
    reference ``want`` and the perturbed ``runs[1:]``)?"""
    if not runs or any(r is None for r in runs) or not (got.dtype.is_floating_point and got.shape == want.shape
                                                         and got.numel()):
        return False
    exact, *perturbed = [r.double().cpu() for r in runs]
    if tuple(exact.shape) != tuple(got.shape):
        return False
    g = got.detach().double().cpu()
    spread = (want.double().cpu() - exact).abs()
    for r in perturbed:
        spread = torch.maximum(spread, (r - exact).abs())
    spread = spread.nan_to_num(0.0)
    if spread.dim():
        spread = spread.amax(-1, keepdim=True)
    tol = TOLERANCES.get(got.dtype, 1e-4)
    allowed = tol * exact.abs() + tol * _magnitude(exact) + 2 * spread
    ok = ((g - exact).abs() <= allowed) | (g == exact) | (g.isnan() & exact.isnan())
    return bool(ok.all())


def _widen(t: Any) -> Any:
    return t.double() if isinstance(t, torch.Tensor) and t.dtype.is_floating_point else t


def _evaluate_wide(n: Node, args: list[Any], noise: torch.Generator | None = None) -> Any:
    """``n`` evaluated in float64 where it computes in a float type (the node's own dtype is where the
    interpreter rounds); with ``noise``, its result perturbed by up to ``ROUNDING_ULPS`` units of the rounding
    of its own type, per element ([Note: a float64 second opinion])."""
    dtype = n.dtype
    if dtype.is_floating_point:
        n = Node(n.op, n.inputs, n.attrs, n.shape, torch.float64)
    out = _widen(_evaluate(n, args))
    if noise is None or n.op in _EXACT_OPS or not isinstance(out, torch.Tensor) or out.dtype != torch.float64:
        return out
    u = ROUNDING_ULPS * _UNIT_ROUNDOFF.get(dtype, 2.0 ** -24)
    delta = (torch.rand(out.shape, generator=noise, dtype=torch.float64) * 2 - 1) * u
    return out * (1 + delta.to(out.device))


def _subgraph(order: list[Node], written: list[Node], actual: dict[Node, torch.Tensor]) -> tuple[Graph, list]:
    """The step as a graph of its own: what it reads becomes the inputs, with the values it read."""
    b = GraphBuilder()
    new: dict[Node, Node] = {}
    inputs: list[torch.Tensor] = []
    for n in order:
        if n in actual:
            new[n] = b.add(Op.INPUT, (), shape=n.shape, dtype=n.dtype, index=len(inputs))
            inputs.append(actual[n].clone())
        else:
            new[n] = b.add_node(Node(n.op, tuple(new[i] for i in n.inputs), n.attrs, n.shape, n.dtype))
    return b.finish([new[n] for n in written]), inputs


def graph_names(graph: Any) -> dict[Node, str]:
    """Each node's name as ``format_graph`` prints it (``%in0``, ``%7``): the names ``kiln.explain`` shows."""
    names = {n: f"%in{i}" for i, n in enumerate(graph.inputs)}
    for n in graph.nodes:
        if n not in names:
            names[n] = f"%{len(names) - len(graph.inputs)}"
    return names


def _reference(written: list[Node], realized: set[Node] | dict[Node, str],
               actual: Callable[[Node], torch.Tensor]) -> tuple[dict[Node, torch.Tensor], list[Node], dict]:
    """The reference values of ``written`` from the values the step reads (``actual`` of realized nodes it does
    not write; everything in between evaluated, in graph order); also the evaluation order, and private copies
    of what it read (taken before the step runs: it may write over a dying input)."""
    targets = set(written)
    order: list[Node] = []
    seen: set[Node] = set()
    stack: list[tuple[Node, bool]] = [(n, False) for n in written]
    while stack:  # post-order: a node after its inputs
        n, expanded = stack.pop()
        if expanded:
            order.append(n)
            continue
        if n in seen:
            continue
        seen.add(n)
        stack.append((n, True))
        if n in targets or n not in realized:
            stack.extend((i, False) for i in n.inputs if i not in seen)
    read = {n: _copy(actual(n)) for n in order if (n not in targets and n in realized) or n.op is Op.INPUT}
    values = _reference_values(order, read, _evaluate)
    return {n: values[n] for n in written if n in values}, order, read


def _reference_values(order: list[Node], read: dict[Node, Any],
                      evaluate: Callable[[Node, list[Any]], Any]) -> dict[Node, Any]:
    """Each node of ``order``: a copy of what the step read, else evaluated from its inputs."""
    values: dict[Node, Any] = {}
    for n in order:
        values[n] = _copy(read[n]) if n in read else evaluate(n, [values[i] for i in n.inputs])
    return values


def _copy(t: torch.Tensor) -> torch.Tensor:
    """A private copy (the reference must neither see the step's writes nor make its own into the inputs)."""
    return t.clone() if isinstance(t, torch.Tensor) else t


def _evaluate(n: Node, args: list[torch.Tensor]) -> torch.Tensor:
    if n.op is Op.EXTERN:
        ref = references.reference(n, args)
        if ref is not None:
            return ref
    return eval_node(n, args)
