"""A symbolic graph on the GPU: one plan, Triton kernels with size parameters, a launch plan per size.

[Note: GPU kernels with size parameters] (docs/dynamic_shapes.md, layer 8.)  A graph traced with dynamic shapes
is partitioned into kernels once, with size expressions, as on the CPU ([Note: a Program per size]); each
kernel's Triton text takes the size symbols it reads as int parameters after its buffers (``s27``, ``s77``:
extents, masks, index strides and sizes used as values are expressions over them).  What a size decides is
made per size tuple: the concrete graph and plan (``Specializer``: buffers, views' strides, the extern calls'
sizes), and each kernel's launch schedule (``codegen.triton.schedule_for(kernel, env)``: block sizes from the
evaluated extents - the size bucket - and a grid).  The text depends on the schedule's *kind* alone (pointwise;
a reduction of one row or several a program, persistent or looped; 64-bit positions), so sizes of one kind share
one module and one compile per Triton specialization (an int of 1, a multiple of 16), and a new size costs a
plan (~ms) and a cache lookup, not a compile::

    symbolic graph --make_plan--> kernels over s0 (text with size parameters)
        size s0=37 --Specializer--> graph, buffers, launches (XBLOCK=64, grid 37, s0=37) -- TritonGraph
        size s0=90 --Specializer--> graph, buffers, launches (XBLOCK=128, grid 90, s0=90) -- TritonGraph
                                    (one kernel text, compiled once per specialization)

Left static-only for now, so not used here: the matmul template with its epilogue (``Operator.plan_gpu``: a
symbolic graph's matmuls are ATen's cuBLAS calls, the epilogue a kernel of ours), the copy kernels for library
operands no view can give (``relayout_copies``: such an operand is copied by ATen's ``reshape`` in the call),
transposed 2-D tiles.  Each size's launches go through kiln's static launcher, the size values fixed in its
records ([Note: static launch]).  A float computed from sizes (``n / 3``, ``n ** 0.5``) is an fp32 parameter
after the sizes, its value per size computed on the host in double precision (``TritonKernelWriter.float_params``).
A graph these kernels cannot express (a float64 computed from sizes, a size that is the least or greatest of two
sizes - ``Min(s0, s1)``, ``sym.SymExtreme``) raises ``NotImplementedError`` at compile time, and the caller builds a
static module per size instead ([Note: a GPU module per size]).
"""
from __future__ import annotations

import copy
import time
from typing import Any, Callable

import torch

from kiln import config
from kiln.ir.graph import Graph
from kiln.ir.kernel import Kernel
from kiln.ir.sym import has_extreme, size_hint, symbols_of
from kiln.report import CompileReport
from kiln.schedule.plan import make_plan
from kiln.schedule.specialize import Specializer


# the most recently used sizes whose modules are kept: default mode, CUDA graphs (reduce-overhead, max-autotune)
SIZES_KEPT = (256, 64)


def kernel_at(kernel: Kernel, env: dict[str, int], symbolic: bool | None = None) -> Kernel:
    """The kernel as a size's plan takes it: a copy with the launch schedule of the sizes ``env`` (the shared
    kernel keeps none: each size's launches have their own block sizes and grid).  ``symbolic``: whether the
    kernel has size parameters, where the caller knows."""
    from kiln.codegen.triton import schedule_for
    symbolic = kernel.is_symbolic() if symbolic is None else symbolic
    out = copy.copy(kernel)
    out.schedule = schedule_for(kernel, env, symbolic=True) if symbolic else schedule_for(kernel, symbolic=False)
    return out


def build_triton_symbolic(graph: Graph, report: CompileReport, device: torch.device,
                          int_sizes: list[str]) -> Any:
    """The GPU module of symbolic ``graph`` ([Note: GPU kernels with size parameters]): a
    ``runtime.dynamic.SizedTritonGraph`` whose per-size builds share the plan and the kernels' code."""
    from kiln.codegen.triton import TritonKernelWriter
    from kiln.runtime.dynamic import SizedTritonGraph
    from kiln.runtime.cuda_graphs import GraphPool, with_cuda_graph
    from kiln.runtime.triton_module import TritonGraph
    start = time.perf_counter()
    if any(has_extreme(n.shape) or has_extreme(list(n.attrs.values())) for n in graph.nodes):
        raise NotImplementedError("a size that is the least or greatest of two sizes (Min/Max): no Triton kernel "
                                  "with size parameters takes it")
    # (GPU layouts: convolutions and the kernels between them channels-last, as ``plan.triton_graph``)
    with config.scope(layout_optimization=True, recompute_limit=config.get().gpu_recompute_limit):
        plan = make_plan(graph)
    symbols = {s for n in graph.nodes for d in n.shape for s in symbols_of(d)}
    for k in plan.kernels:
        symbols |= k.symbols()
    hints = {s.name: size_hint(s) for s in symbols}
    dtype_of = {name: n.dtype for n, name in plan.buffer_of.items()}
    for k in plan.kernels:  # every kernel written once now: what the generator cannot express fails the compile
        TritonKernelWriter(kernel_at(k, hints), dtype_of).write()
    # what every size's module shares ([Note: a size's build]): whether each kernel has size parameters (walking
    # its indices to find out is not free), and what TritonGraph fills in - sources, writers, compiled kernels
    shared: dict[Any, Any] = {"symbolic": {k.name: k.is_symbolic() for k in plan.kernels}}
    symbolic_of = shared["symbolic"]
    specializer = Specializer(graph, plan, arena=False,
                              kernel_at=lambda k, env: kernel_at(k, env, symbolic_of[k.name]))
    report.phases["gpu_plan"] = time.perf_counter() - start
    options = {k: getattr(config.get(), k) for k in config.Config.option_names()}
    sources: set[str] = set()  # the kernel modules the sizes took (one per combination of schedule kinds)
    # reduce-overhead: the sizes' CUDA graphs in one memory pool (unless switched off: a pool per recording)
    pool = GraphPool() if config.get().cuda_graph_shared_pool else None

    def build(env: dict[str, int], size_report: CompileReport) -> Callable:
        begin = time.perf_counter()
        with config.scope(**options):
            size_graph, program = specializer(env)
            module = TritonGraph(size_graph, program, size_report, device, sizes=env, shared_code=shared)
        sources.add(size_report.source)
        report.dynamic["kernel_sources"] = len(sources)
        size_report.target = "triton"
        size_report.phases["size_build"] = time.perf_counter() - begin
        return with_cuda_graph(module, size_report, size_report.mode, on_record=recorded, pool=pool)

    def recorded() -> None:  # (reduce-overhead: each size records its CUDA graph at its second call)
        report.dynamic["recordings"] = report.dynamic.get("recordings", 0) + 1

    ordered = sorted(symbols, key=lambda s: s.name)
    # sizes kept: a size's module is a plan and launch records (~ms to make again, [Note: a size's build]), so many
    # - a decoding loop cycles through every length up to its longest; under CUDA graphs each also holds its
    # recording's memory, so fewer
    capacity = SIZES_KEPT[report.mode != "default"]
    module = SizedTritonGraph(graph, report, build, [s.name for s in ordered], device, int_sizes=int_sizes,
                              capacity=capacity)
    report.dynamic["ranges"] = ", ".join(f"{s.name} in [{s.lo}, {'inf' if s.hi is None else s.hi}]"
                                         for s in ordered)
    report.dynamic["per_size"] = "one plan, Triton kernels with size parameters, launches per size"
    report.dynamic["kernel_sources"] = 0
    if report.mode in ("reduce-overhead", "max-autotune") and device.type == "cuda":
        report.dynamic["recordings"] = 0  # (counted by ``recorded``: issue 19 asks the report to show them)
    return module
