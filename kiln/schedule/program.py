"""Plan -> Program: the steps as the runtime calls them, with their memory.

What the runtime needs decided before the first call, decided here once:

- the pointer table: a slot per buffer (in ``Plan.buffer_of`` order), then one per tensor baked into a native
  call (a packed weight);
- native calls: kiln's library ops called from the generated C++ between kernels (``runtime/native.py``) - only
  with an arena, fp32;
- the program: ``("segment", i)`` for a run of generated kernels and native calls (one call into the C++
  library), ``("extern", node)`` for a library call through Python, ``("fused", step)`` for a target's own step
  (the GPU matmul template);
- releases: per program step, the per-call values no later step reads;
- memory: with an arena (CPU), each planned buffer's offset in it (``runtime/memory.py``); without one (GPU), the
  buffers each step allocates first, or the dying input whose memory it takes (``runtime/inplace.py``), and the
  peak this gives;
- the graph's inputs and outputs: which slots they fill, which values the caller gets.

[Note: arena or allocator] On the CPU the planned intermediates live in one arena kept across calls (fresh pages
cost a fault each with glibc's malloc).  On a GPU each planned buffer is taken from PyTorch's caching allocator
when it is first written and handed back after its last reader, in plan order: between calls the compiled graph
then holds no memory, inside a call the allocator reuses blocks across kiln buffers and library results alike
(an arena cannot hold cuDNN's results), and under CUDA graph capture the same allocations come from the graph's
private pool.
"""
from __future__ import annotations

from typing import Any

import torch

from kiln import config, library
from kiln.codegen.cpp import native_calls
from kiln.ir.extern import Baked
from kiln.ir.graph import Graph, Node, mutates, view_root
from kiln.ir.interp import view_chain, view_layout
from kiln.ir.kernel import Kernel
from kiln.ir.ops import VIEW, Op, contiguous_strides
from kiln.ir.program import Allocation, ExternStep, Plan, Program
from kiln.runtime import inplace, memory, native

_C_TYPES = {torch.float32: "float"}  # element types native calls take views of

# library ops whose ``.out`` variant writes into a buffer we provide (so their results live in the arena): ATen's
# products and the operators' (``Operator.out_variants``, e.g. kiln's GEMM)
# (not convolution: its ``.out`` is a generated wrapper that computes into a new tensor and copies)
_OUT_VARIANTS = frozenset({torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm}) | library.out_variants()


def writes_into_arena(n: Node, escaping: set[Node]) -> bool:
    """Does extern ``n`` write its result into the arena through a ``.out`` variant?  Not when the caller gets
    the result or a view of it (``escaping``)."""
    target = n.attr("target")
    return (getattr(target, "overloadpacket", None) in _OUT_VARIANTS and n.attr("out_index") is None
            and n not in escaping and n.dtype.is_floating_point)


def _escaping(graph: Graph) -> set[Node]:
    """The graph's outputs and the nodes they are views of: values the caller holds after the call, which must
    not live in the arena (the next call would overwrite them)."""
    out = set(graph.outputs)
    stack = list(out)
    while stack:
        n = stack.pop()
        if n.op in VIEW and n.inputs[0] not in out:
            out.add(n.inputs[0])
            stack.append(n.inputs[0])
    return out


def base_of(n: Node, buffer_of: dict[Node, str]) -> Node:
    """The realized node a view chain starts from."""
    while n not in buffer_of:
        n = n.inputs[0]
    return n


def written_inputs(n: Node) -> set[Node]:
    """The graph inputs an in-place EXTERN writes: the arguments its schema marks written (``Tensor(a!)``), seen
    through views.  Not its other operands: ``x.copy_(y)`` writes ``x`` only, and a non-contiguous ``y`` (an
    expanded one: a copy cannot be written back into it) must not be treated as updated."""
    named = native.named_args(n)
    written: set[Node] = set()
    for a in n.attr("target")._schema.arguments:
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        value = named.get(a.name)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, Node) and view_root(v).op is Op.INPUT:
                written.add(view_root(v))
    return written


def build_program(graph: Graph, plan: Plan, arena: bool) -> Program:
    escaping = _escaping(graph)
    slot_of = {name: k for k, name in enumerate(plan.buffer_of.values())}
    node_of = {name: n for n, name in plan.buffer_of.items()}
    baked: list[torch.Tensor] = []
    natives = _native_calls(plan, arena, escaping, slot_of, baked)
    segments, steps = _steps(plan, arena, natives)
    drop_after = _releases(plan, arena, escaping, segments, steps, node_of)
    offsets, arena_bytes, planned, mem = _arena_plan(plan, escaping, natives, node_of)
    program = Program(plan, arena, escaping, slot_of, baked, natives, segments, steps, drop_after, offsets,
                      arena_bytes, planned, [], set(), [], [], mem)
    if not arena:
        program.alloc_before = _allocations(program, node_of)
        reused = sum(a.reuse is not None for step in program.alloc_before for a in step)
        mem["peak_bytes"] = _planned_peak(program)
        mem["in_place"] = reused
        mem["summary"] += (f"; on this device taken from the caching allocator in plan order, {reused} written in "
                           f"place or into a dead buffer's memory, peak {mem['peak_bytes'] / 2**20:.2f} MiB per call "
                           f"(kiln buffers and library results)")
    program.mutated_inputs = {i for m in graph.nodes if mutates(m) for i in written_inputs(m)}
    program.input_slots = [(k, slot_of[plan.buffer_of[n]], n) for k, n in enumerate(graph.inputs)
                           if n in plan.buffer_of]
    # buffers the caller gets, filled per call: kiln's outputs, and native calls' results the caller gets or
    # views (an output that is an extern's result is the tensor the library returned)
    returned = [n for n in dict.fromkeys(graph.outputs) if n.op not in (Op.INPUT, Op.CONSTANT, Op.EXTERN)]
    returned += [n for n in graph.nodes  # bases of output views (in graph order: slots are numbered)
                 if n in escaping and n.op not in (Op.INPUT, Op.CONSTANT, Op.EXTERN) and n not in returned]
    returned += [n for n in natives if n in escaping and n not in returned]
    program.output_slots = [(n, slot_of[plan.buffer_of[n]]) for n in returned if n in plan.buffer_of]
    return program


def _native_calls(plan: Plan, arena: bool, escaping: set[Node], slot_of: dict[str, int],
                  baked: list[torch.Tensor]) -> dict[Node, Any]:
    """Externs of kiln's own libraries that the generated code calls directly (runtime/native.py), with an
    arena, fp32.  A result the caller gets (or a view of it) is written into the call's output tensor
    (``output_slots``), one with a layout of the library's into the arena."""
    if not arena or not config.get().native_calls:
        return {}
    oneDNN_weights = {c.inputs[1] for c in plan.cl_convs}
    baked_slot: dict[int, int] = {}

    def layout(v: Node) -> tuple[tuple[int, ...], int] | None:
        """(strides, offset in elements) of ``v`` in its realized base's buffer."""
        base, chain = view_chain(v, lambda m: m in plan.buffer_of)
        if base in oneDNN_weights:  # held channels-last for oneDNN (runtime: the constants)
            return None
        strides = plan.strides_of.get(base) or contiguous_strides(base.shape)
        return view_layout(base.shape, strides, base.dtype, chain)  # None: a step copies

    def strides_of(v: Node) -> tuple[int, ...] | None:
        found = layout(v)
        return found[0] if found else None

    def pointer(v: Any, out: Node) -> native.Pointer | None:
        if v is native.OUT:
            v = out
        if isinstance(v, (Baked, torch.Tensor)):  # a prepacked weight: a fixed pointer, in a slot of its own
            t = v.value if isinstance(v, Baked) else v
            if id(t) not in baked_slot:
                baked_slot[id(t)] = len(slot_of) + len(baked)
                baked.append(t)
            return native.Pointer(baked_slot[id(t)])
        found = layout(v)
        if found is None:
            return None
        # (an offset: a view into its base, as q, k and v of one product are)
        return native.Pointer(slot_of[plan.buffer_of[base_of(v, plan.buffer_of)]], found[1], _C_TYPES[v.dtype])

    calls: dict[Node, Any] = {}
    for s in plan.steps:
        n = s.node if isinstance(s, ExternStep) else None
        if n is None or not native.bindable(n) or n.dtype != torch.float32 or n not in plan.buffer_of:
            continue
        out_strides = plan.strides_of.get(n) or contiguous_strides(n.shape)
        if n in escaping and out_strides != contiguous_strides(n.shape):
            continue  # (the caller's result, written into a new or recycled contiguous tensor per call)
        call = native.bind(n, strides_of, out_strides, lambda v, n=n: pointer(v, n))
        if call is not None:
            calls[n] = call
    return calls


def _steps(plan: Plan, arena: bool, natives: dict[Node, Any]) -> tuple[list[list[Any]], list[tuple[str, Any]]]:
    segments: list[list[Any]] = []
    steps: list[tuple[str, Any]] = []
    for s in plan.steps:
        if isinstance(s, Kernel) or (isinstance(s, ExternStep) and s.node in natives):
            # with an arena, a run of kernels (and of native calls: only with an arena) is one call into the
            # library; without one, each kernel is its own step, so buffers are allocated right before their
            # first writer and freed right after their last reader
            entry = s.name if isinstance(s, Kernel) else natives[s.node]
            if arena and steps and steps[-1][0] == "segment":
                segments[-1].append(entry)
            else:
                segments.append([entry])
                steps.append(("segment", len(segments) - 1))
        elif isinstance(s, ExternStep):
            steps.append(("extern", s.node))
        else:  # a step of the target's own (a matmul template with its epilogue)
            steps.append(("fused", s))
    return segments, steps


def _releases(plan: Plan, arena: bool, escaping: set[Node], segments: list[list[Any]],
              steps: list[tuple[str, Any]], node_of: dict[str, Node]) -> list[list[Node]]:
    """Per program step, the per-call values (library results, cached views) no later step reads.

    [Note: releasing library results] Results of extern calls that are not planned into the arena are
    tensors the library allocated for this call; dropping each after its last reader lets the allocator
    reuse the memory within the call, so peak memory follows the live set rather than the sum of all
    results (ResNet-18 batch 16 on the GPU: 77 MiB -> below eager's 61 MiB of transient memory)."""
    by_name = {k.name: k for k in plan.kernels}
    last: dict[Node, int] = {}
    for step, (kind, item) in enumerate(steps):
        if kind in ("segment", "fused"):
            for k in ([by_name[e] for e in segments[item] if isinstance(e, str)] if kind == "segment"
                      else [item]):
                reads, writes = k.buffers()
                for b in reads | writes:
                    last[node_of[b]] = step
        if kind in ("extern", "fused", "segment"):
            if kind == "segment":
                inputs = [i for e in native_calls(segments[item:item + 1]) for i in e.node.inputs]
            else:
                inputs = item.inputs if kind == "extern" else item.node_inputs
            for i in inputs:
                while True:  # the input and the view chain down to its realized base
                    last[i] = step
                    if i in plan.buffer_of or i.op not in VIEW:
                        break
                    i = i.inputs[0]
    drop: list[list[Node]] = [[] for _ in steps]
    for n, step in last.items():
        if n in escaping or n.op in (Op.INPUT, Op.CONSTANT):  # (views of outputs keep their bases)
            continue
        if n.op is Op.EXTERN or n.op in VIEW or not arena:
            drop[step].append(n)
    return drop


def _arena_plan(plan: Plan, escaping: set[Node], natives: dict[Node, Any],
                node_of: dict[str, Node]) -> tuple[dict[Node, int], int, set[Node], dict[str, Any]]:
    """(offsets, arena bytes, planned buffers, report lines): the liveness plan of the buffers kiln writes."""
    step_index: dict[str, int] = {}
    last_use: dict[str, int] = {}
    for k, s in enumerate(plan.steps):
        if isinstance(s, ExternStep):
            if writes_into_arena(s.node, escaping) or (s.node in natives and s.node not in escaping):
                step_index.setdefault(plan.buffer_of[s.node], k)
            inputs = s.node.inputs
        else:  # kernels, and fused steps (which also read graph nodes, through views)
            reads, writes = s.buffers()
            for w in writes:
                step_index.setdefault(w, k)
            for r in reads:
                last_use[r] = k
            inputs = [] if isinstance(s, Kernel) else s.node_inputs
        for i in inputs:
            last_use[plan.buffer_of[base_of(i, plan.buffer_of)]] = k
    intervals = []
    for name, start in step_index.items():
        n = node_of[name]
        if n in escaping or n.op is Op.INPUT:  # the caller holds it (or a view of it) after the call: a per-call
            continue  # buffer; an input a kernel updates ([Note: write-backs in place]) is the caller's tensor
        nbytes = n.numel * torch.empty((), dtype=n.dtype).element_size()
        intervals.append(memory.Interval(name, nbytes, start, last_use.get(name, start)))
    mplan = memory.plan(intervals)
    report = {"arena_bytes": mplan.arena_bytes, "naive_bytes": mplan.naive_bytes, "buffers": len(intervals),
              "summary": mplan.describe()}
    offsets = {node_of[name]: off for name, off in mplan.offsets.items()}
    return offsets, mplan.arena_bytes, set(offsets), report


def _allocations(p: Program, node_of: dict[str, Node]) -> list[list[Allocation]]:
    """Per program step, the buffers it writes first (planned intermediates and the graph's outputs), each
    allocated right before that step, taking the memory of an input that dies there (``reuse``, in place), or
    else that of a buffer of ours that died earlier with as many bytes (see [Note: buffers reused by size]).

    [Note: buffers reused by size] Each buffer taken from the caching allocator costs a ``torch.empty_strided``
    per call (~3-4 us of host time on the H100 machine: a GPT layer's 8 buffers are most of a small call's
    allocation time).  A dead buffer of the same byte size is kept instead and the new one is a view of its
    memory (``as_strided``, ~1 us), as Inductor's generated calls reuse buffers.  Its release moves to the step
    that takes it (``drop_after``); the memory is free once every reader of the buffer and its views has run
    (``_releases`` counts view readers against the base).  Holding a dead buffer until it is taken may not raise
    the call's peak: it is taken only where the bytes live at every step in between, plus its own, stay within
    the peak without reuse (the suite's GPT at 64 tokens: 14 buffers taken besides 7 in place, peak unchanged;
    unchecked, the peak grew 11%).
    Never taken: inputs, constants, outputs, library results the library allocated (those it writes into a
    buffer of ours are ours), a buffer handed on in place, and buffers a library call may return a view of (an
    ATen op whose schema says its result aliases an input)."""
    alloc, taken = _allocations_in_place(p, node_of)
    live = _live_bytes(p, alloc)
    peak = max(live, default=0)
    aliased = _aliased_by_library(p, p.plan.buffer_of)
    # (bytes, element size) -> (dead buffer of ours, the step after which it died); one element size, so that the
    # memory's view in the new dtype keeps its shape (``view(dtype)`` of another size needs a divisible last dim)
    free: dict[tuple[int, int], list[tuple[Node, int]]] = {}
    moved: list[tuple[Node, int, int]] = []  # (pooled buffer, the step after which it died, the step taking it)
    for step in range(len(p.steps)):
        for a in alloc[step]:
            size = _nbytes(a.node)
            dead = free.get((size, a.dtype.itemsize), []) if a.reuse is None else []
            for k in range(len(dead) - 1, -1, -1):  # (the most recently dead first)
                m, died = dead[k]
                if max(live[died + 1:step], default=0) + size <= peak:
                    del dead[k]
                    a.reuse, a.reuse_planned = m, True
                    for s in range(died + 1, step):
                        live[s] += size
                    moved.append((m, died, step))
                    break
        for m in p.drop_after[step]:
            if m in p.planned and m not in taken and m not in p.escaping and m not in aliased \
                    and m.op not in (Op.INPUT, Op.CONSTANT) and m.op not in VIEW:
                free.setdefault((_nbytes(m), m.dtype.itemsize), []).append((m, step))
    for m, died, step in moved:  # a pooled buffer is released by the step that takes its memory
        p.drop_after[died].remove(m)
        p.drop_after[step].append(m)
    return alloc


def _allocations_in_place(p: Program, node_of: dict[str, Node]) -> tuple[list[list[Allocation]], set[Node]]:
    """``_allocations`` before buffers are reused by size: each buffer allocated, or written over an input of its
    writer that dies there (in place); and the buffers so handed on."""
    plan = p.plan
    by_name = {k.name: k for k in plan.kernels}
    buf_of = plan.buffer_of
    # outputs (and bases of output views) kiln writes (library results arrive allocated; a fused step writes
    # its matmul's own result)
    fused = {s.node for kind, s in p.steps if kind == "fused" and s.epilogue is None}
    outputs = {n for n in p.escaping
               if n in buf_of and (n.op not in (Op.INPUT, Op.CONSTANT, Op.EXTERN) or n in fused)}
    alloc: list[list[Allocation]] = [[] for _ in p.steps]
    done: set[Node] = set()
    taken: set[Node] = set()
    for step, (kind, item) in enumerate(p.steps):
        dying = set(p.drop_after[step])
        if kind == "segment":
            kernels = [by_name[name] for name in p.segments[item]]
            written = [node_of[b] for k in kernels for b in sorted(k.buffers()[1])]
        elif kind == "fused":
            # in place only over the epilogue's own inputs, never over the matmul's operands: other
            # programs read an operand's rows and columns until they finish
            kernels = [item.epilogue] if item.epilogue is not None else []
            written = [node_of[b] for b in sorted(item.buffers()[1])]
            dying -= {base_of(i, buf_of) for i in item.node_inputs}
        else:
            kernels, written = [], [item]
        for n in written:
            if (n not in p.planned and n not in outputs) or n in done:
                continue
            done.add(n)
            strides = plan.strides_of.get(n) or contiguous_strides(n.shape)
            reuse = None
            if len(kernels) == 1:
                for b in inplace.overwritable_inputs(kernels[0], buf_of[n]):
                    m = node_of[b]
                    if (m in dying and m not in taken and m.op not in (Op.INPUT, Op.CONSTANT)
                            and not _returns_an_alias(m)
                            and m.numel == n.numel and m.dtype.itemsize == n.dtype.itemsize):
                        reuse = m
                        taken.add(m)
                        break
            alloc[step].append(Allocation(n, n.shape, strides, n.dtype, reuse, reuse in p.planned))
    return alloc, taken


def _nbytes(n: Node) -> int:
    return n.numel * n.dtype.itemsize


def _returns_an_alias(n: Node) -> bool:
    """Is ``n`` a library call whose result may be (a view of) one of its inputs - an ATen op whose schema's
    return aliases an argument (``index_put_`` made in place over the caller's input by
    passes/inplace_updates.py), or a callable without a schema?  Its memory is not the call's own to write over:
    the generated call's check that it holds a library result's storage alone counts tensors, and the caller's
    input updated in place is one tensor with the result (fuzz seed 168, Triton target: ``x[i] = v; x * x``
    wrote ``x * x`` into the caller's ``x``)."""
    if n.op is not Op.EXTERN:
        return False
    schema = getattr(n.attr("target"), "_schema", None)
    return schema is None or any(r.alias_info is not None for r in schema.returns)


def _aliased_by_library(p: Program, buf_of: dict[Node, str]) -> set[Node]:
    """Buffers a library call reads (directly or through views) whose result may be a view of its input (an ATen
    op whose schema's return aliases an argument, or a callable without a schema): the result may outlive the
    buffer's own last reader."""
    out: set[Node] = set()
    for kind, item in p.steps:
        if kind != "extern" or item in p.planned or not _returns_an_alias(item):
            continue
        for i in item.inputs:
            out.add(base_of(i, buf_of))
    return out


def _planned_peak(p: Program) -> int:
    """Bytes of per-call buffers live at once, walking the program: kiln's buffers and library results
    (not the libraries' own workspaces)."""
    return max(_live_bytes(p, p.alloc_before), default=0)


def _live_bytes(p: Program, alloc: list[list[Allocation]]) -> list[int]:
    """Per program step, the bytes of per-call buffers live while it runs (allocated before it, not yet released)
    with the allocations ``alloc``: kiln's buffers and library results."""
    live: dict[Node, int] = {}
    out = []
    for step, (kind, item) in enumerate(p.steps):
        for a in alloc[step]:
            live[a.node] = live.pop(a.reuse) if a.reuse is not None else _nbytes(a.node)
        if kind == "extern" and item not in p.planned and item.op is Op.EXTERN:
            live[item] = _nbytes(item)
        out.append(sum(live.values()))
        for n in p.drop_after[step]:
            live.pop(n, None)
    return out


