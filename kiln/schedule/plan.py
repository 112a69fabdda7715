"""The schedule stage: an optimized graph becomes a ``Plan`` (``ir/program.py``), and the runtime runs it.

    graph --partition (fuse.py)--> groups and extern steps
          --layouts (layout.py)--> the buffers' strides, the convolutions run channels-last
          --kernel IR (kernel_build.py, ir/loop_collapse.py)--> one Kernel per group
          --schedules (tune/cpu.py on the CPU; codegen/triton.schedule_for and the matmul templates on a GPU)
          --> Plan --> runtime/module.CompiledGraph (CPU) or runtime/triton_module.TritonGraph (GPU)

A kernel the builder cannot fuse (``NotFusable``) breaks its group at the node named, and the partition runs
again.  The runtime decides nothing of this: it binds buffers, loads the generated code and calls the steps.
"""
from __future__ import annotations

import time

from typing import Any, Callable

import torch

from kiln import config
from kiln.ir.graph import Graph, Node
from kiln.ir.ops import Op
from kiln.ir.program import Plan
from kiln.report import CompileReport
from kiln.schedule.fuse import Group, partition
from kiln.schedule.kernel_build import NotFusable, build_kernel
from kiln.schedule.layout import (VIEW_COPY, WEIGHT_COPY, choose_layouts, input_layouts, library_layouts,
                                  relayout_copies)
from kiln.schedule.program import build_program
from kiln.schedule.streams import split_streams
from kiln.schedule.write_back import write_backs_in_place


def _kernel_name(index: int, group: Group) -> str:
    ops = []
    for m in group.members:
        what = "weight_nhwc" if m.attr(WEIGHT_COPY) else "copy" if m.attr(VIEW_COPY) else m.op.value
        if what not in ops:
            ops.append(what)
    return f"kernel_{index}_" + "_".join(ops[:4])


def _readers(steps: list[Any], graph: Graph) -> tuple[dict[Node, int], dict[Node, set[Any]]]:
    """(group index of each member, the steps that read each node directly or through inlined nodes)."""
    group_of: dict[Node, int] = {}
    for k, s in enumerate(steps):
        if isinstance(s, Group):
            for m in s.members:
                group_of[m] = k
    users = graph.users()
    outputs = set(graph.outputs)
    readers: dict[Node, set[Any]] = {}
    for n in reversed(graph.nodes):
        found: set[Any] = {"caller"} if n in outputs else set()
        for u in set(users[n]):
            if u in group_of:
                found.add(group_of[u])
            elif u.op is Op.EXTERN:
                found.add("extern")
            else:
                found |= readers.get(u, set())
        readers[n] = found
    return group_of, readers


def _stored(group_of: dict[Node, int], readers: dict[Node, set[Any]]) -> set[Node]:
    """Group members that some other step (or the caller) reads."""
    return {m for m, k in group_of.items() if readers[m] - {k}}


def make_plan(graph: Graph, saved: frozenset[int] = frozenset()) -> Plan:
    """``saved``: positions of ``graph.outputs`` whose layout is kiln's to choose (a training forward's saved
    values, [Note: saved activations channels-last]); the others are handed out in eager's layout."""
    breaks: set[Node] = set()
    free = {o for p, o in enumerate(graph.outputs) if p in saved} \
        - {o for p, o in enumerate(graph.outputs) if p not in saved}
    while True:
        steps, realized, aliases = partition(graph, frozenset(breaks))
        group_of, readers = _readers(steps, graph)
        stored = _stored(group_of, readers)
        strides_of, cl_convs = library_layouts(graph), set()
        if config.get().layout_optimization:
            # (saved values channels-last only with training_channels_last; the library's layouts are kept anyway)
            strides_of, cl_convs = choose_layouts(graph, steps, group_of, readers, stored,
                                                  free if config.get().training_channels_last else set())
        strides_of.update(input_layouts(graph))
        buffer_of: dict[Node, str] = {}
        for n in graph.nodes:
            if n in realized and (n.op in (Op.INPUT, Op.CONSTANT, Op.EXTERN) or n in stored):
                buffer_of[n] = f"buf{len(buffer_of)}"
        try:
            kernels = []
            out_steps: list[Any] = []
            for s in steps:
                if isinstance(s, Group):
                    k = build_kernel(s, _kernel_name(len(kernels), s), buffer_of, stored, strides_of)
                    kernels.append(k)
                    out_steps.append(k)
                else:
                    out_steps.append(s)
            plan = Plan(out_steps, buffer_of, aliases, kernels, strides_of, cl_convs,
                        laid_out={o: strides_of[o] for o in free if o in strides_of and o.op is not Op.INPUT})
            return write_backs_in_place(plan, graph) if config.get().write_backs_in_place else plan
        except NotFusable as e:
            if e.node is None or e.node in breaks:
                raise
            breaks.add(e.node)


def build_cpu(graph: Graph, report: CompileReport, arena: bool = True,
              choices: Any = None) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """The CPU module of ``graph``: its plan, each kernel's schedule (stored, or tuned in max-autotune, through
    ``choices``: the compile's measured-choice service), then the runtime.  ``arena=False``: buffers allocated
    per step, as on a GPU (tests run that path on the CPU)."""
    from kiln.runtime.module import CompiledGraph
    from kiln.schedule.operand_layout import choose_bmm_layouts
    from kiln.tune.choices import Choices
    from kiln.tune.cpu import apply_schedules
    plan = make_plan(graph)
    # a library operand no view can give (heads merged after attention) becomes a copy kernel of kiln's, so the
    # call stays native (from the generated C++) instead of going through Python to copy with ATen's reshape
    copied = relayout_copies(graph, plan, weights=False)
    if copied is not graph:
        graph, plan = copied, make_plan(copied)
    plan = split_streams(plan)  # ([Note: loops over few streams])
    own = choices is None
    choices = Choices.for_compile(report.mode) if own else choices
    try:
        choose_bmm_layouts(graph, plan, choices)
        dtype_of = {name: n.dtype for n, name in plan.buffer_of.items()}
        node_of = {name: n for n, name in plan.buffer_of.items()}
        report.tuning = apply_schedules(plan.kernels, dtype_of, node_of, tune=report.mode == "max-autotune",
                                        choices=choices)
    finally:
        if own:
            choices.close()
    report.tune_skipped = list(report.tuning.skipped)
    return CompiledGraph(graph, build_program(graph, plan, arena=arena), report)


def build_cpu_symbolic(graph: Graph, report: CompileReport, choices: Any = None,
                       int_sizes: Any = ()) -> Callable:
    """The CPU module of a graph with size expressions: its plan and kernels made once (heuristic schedules:
    nothing is measured at a size that the next call may not have), and a Program per size at run time
    (``runtime/dynamic.SymbolicGraph``, [Note: a Program per size] in schedule/specialize.py).  ``int_sizes``:
    the symbols the caller passes as ints after the tensors."""
    from kiln.ir.sym import symbols_of
    from kiln.runtime.dynamic import SymbolicGraph
    from kiln.schedule.specialize import Specializer
    from kiln.schedule.layout import is_conv2d
    from kiln.tune.cpu import apply_schedules
    cfg = config.get()
    # (layouts: a static graph with convolutions measures both plans, schedule/choose.py; a symbolic one takes
    # that module's rule - channels-last - as its measurement would run at one size only)
    channels_last = cfg.layout_optimization or (cfg.layout_autotune and any(is_conv2d(n) for n in graph.nodes))
    with config.scope(layout_optimization=channels_last):
        plan = make_plan(graph)
    if channels_last and not cfg.layout_optimization:
        report.memory["layout"] = "channels-last (predicted: a graph with symbolic sizes is not measured)"
    dtype_of = {name: n.dtype for n, name in plan.buffer_of.items()}
    node_of = {name: n for n, name in plan.buffer_of.items()}
    report.tuning = apply_schedules(plan.kernels, dtype_of, node_of, tune=False, choices=choices)
    symbols = {s for n in graph.nodes for d in n.shape for s in symbols_of(d)}
    for k in plan.kernels:
        symbols |= k.symbols()
    report.kernels = plan.kernels
    module = SymbolicGraph(graph, report, Specializer(graph, plan),
                           sorted(s.name for s in symbols), int_sizes=int_sizes)
    report.dynamic["ranges"] = ", ".join(
        f"{s.name} in [{s.lo}, {'inf' if s.hi is None else s.hi}]" for s in sorted(symbols, key=lambda s: s.name))
    return module


def triton_plan(graph: Graph, report: CompileReport, device: torch.device, choices: Any = None,
                plan: Plan | None = None) -> Plan:
    """The GPU plan of ``graph``: each operator may replace steps with its own (``Operator.plan_gpu``: matmuls
    whose measured or recorded best is kiln's Triton template take their epilogue kernel in); every kernel gets its
    launch schedule.  ``choices``: the compile's measured-choice service (else one for this plan); ``plan``:
    ``make_plan(graph)`` when the caller has made it already."""
    from kiln.codegen.triton import schedule_for
    from kiln.library import OPERATORS
    from kiln.tune.choices import Choices
    plan = plan if plan is not None else make_plan(graph)
    own = choices is None
    choices = Choices.for_compile(report.mode) if own else choices
    try:
        for op in OPERATORS:  # operators with steps of their own (the matmul template with its epilogue)
            if op.plan_gpu is not None:
                op.plan_gpu(plan, graph, report, device, choices)
    finally:
        if own:
            choices.close()
    for k in plan.kernels:
        k.schedule = schedule_for(k)
    return plan


def build_triton(graph: Graph, report: CompileReport, device: torch.device, mode: str = "default",
                 choices: Any = None, saved: frozenset[int] = frozenset()) -> Any:
    """The GPU module of ``graph`` (Triton kernels; convolutions and the kernels between them channels-last),
    replayed as a CUDA graph in reduce-overhead and max-autotune; ``saved``: see ``make_plan``."""
    from kiln.runtime.cuda_graphs import with_cuda_graph
    return with_cuda_graph(triton_graph(graph, report, device, choices, saved), report, mode)


def triton_graph(graph: Graph, report: CompileReport, device: torch.device, choices: Any = None,
                 saved: frozenset[int] = frozenset()) -> Any:
    """The ``TritonGraph`` of ``graph``, called as is (no CUDA graph)."""
    from kiln.runtime import gpu_launch
    from kiln.runtime.build import start_builds
    from kiln.runtime.triton_module import TritonGraph
    if device.type == "cuda" and config.get().gpu_static_launch:  # (g++ in the background while kernels compile)
        start_builds({"kiln_gpu_launch": gpu_launch.build_extension})
    # cuDNN's tensor-core convolutions want channels-last: convolutions and the kernels between them run NHWC
    # (on NCHW data cuDNN transposes around every call: 35 + 19 layout kernels in ResNet-18, 40% of its time)
    start = time.perf_counter()
    with config.scope(layout_optimization=True, recompute_limit=config.get().gpu_recompute_limit):
        first = make_plan(graph, saved)
        copied = relayout_copies(graph, first, weights=not config.get().holds_weight_copies(report.mode))
        plan = triton_plan(copied, report, device, choices,
                           plan=first if copied is graph else make_plan(copied, saved))
        graph = copied
        program = build_program(graph, plan, arena=False)
        report.phases["gpu_plan"] = time.perf_counter() - start - report.phases.get("matmul_tuning", 0.0)
        return TritonGraph(graph, program, report, device)

