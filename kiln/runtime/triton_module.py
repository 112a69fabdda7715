"""The GPU runtime: the same plan, arena and extern handling as the CPU module, with Triton kernels.

``TritonGraph`` reuses ``CompiledGraph`` (planning, liveness arena, output recycling, extern calls) and
replaces its code path: the kernels become one generated Python module of ``@triton.jit`` functions,
written to the disk cache (keyed by its source) and imported; each kernel step launches with the schedule's
grid.  Under ``TRITON_INTERPRET=1`` the same module runs on CPU tensors (how CI tests the generator).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any, Callable

import torch

from kiln import config
from kiln.codegen.triton import TritonKernelWriter, module_source, schedule_for
from kiln.ir.graph import Graph, Node
from kiln.report import CompileReport
from kiln.runtime.module import CompiledGraph, Plan

_loaded: dict[str, Any] = {}


def _import_source(source: str) -> tuple[Any, bool]:
    """Import generated source through a file in the cache (Triton reads a kernel's source from its file)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    if digest in _loaded:
        return _loaded[digest], True
    folder = Path(config.get().cache_dir) / "triton"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"kiln_{digest}.py"
    cached = path.exists() and path.read_text() == source
    if not cached:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)  # atomic: a concurrent process never imports half a file
    spec = importlib.util.spec_from_file_location(f"kiln_triton_{digest}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    _loaded[digest] = module
    return module, cached


class TritonGraph(CompiledGraph):
    def __init__(self, graph: Graph, report: CompileReport, device: torch.device):
        self.device = device
        super().__init__(graph, report)

    def _load_code(self, plan: Plan, segments: list[list[str]], dtype_of: dict[str, torch.dtype],
                   outputs: set[str], report: CompileReport) -> None:
        for k in plan.kernels:
            k.schedule = schedule_for(k)
        source = module_source(plan.kernels, dtype_of)
        report.source = source
        module, report.from_cache = _import_source(source)
        by_name = {k.name: k for k in plan.kernels}
        node_of = {name: n for n, name in plan.buffer_of.items()}
        self._launches: list[list[tuple[Callable, list[Node], Any]]] = []
        for names in segments:
            steps = []
            for name in names:
                k = by_name[name]
                args = [node_of[b] for b in TritonKernelWriter(k, dtype_of).args()]
                steps.append((getattr(module, name), args, k.schedule))
            self._launches.append(steps)

    def _before_run(self) -> None:
        pass

    def _run_segment(self, index: int, env: dict[Node, torch.Tensor]) -> None:
        steps = self._launches[index]
        for i, (fn, args, s) in enumerate(steps):
            tensors = [env[n] for n in args]
            if isinstance(fn, _Launcher):
                fn(tensors)
                continue
            compiled = fn[(s.grid,)](*tensors, XBLOCK=s.xblock, RBLOCK=max(s.rblock, 1), num_warps=s.num_warps)
            if hasattr(compiled, "run") and hasattr(compiled, "function"):  # not under the interpreter
                steps[i] = (_Launcher(compiled, s), args, s)


class _Launcher:
    """Launch an already compiled kernel directly: Triton's JIT entry re-derives the specialization key from
    every argument on every call (tens of microseconds); after the first call the key cannot change here,
    since buffers keep their dtypes and the arena keeps its alignment."""

    def __init__(self, compiled: Any, s: Any):
        self.runner = compiled[(s.grid, 1, 1)]
        self.constants = (s.xblock, max(s.rblock, 1))

    def __call__(self, tensors: list[torch.Tensor]) -> None:
        self.runner(*tensors, *self.constants)


class GraphReplay:
    """``reduce-overhead``: the compiled graph recorded once as a CUDA graph and replayed.

    Inputs are copied into static buffers before each replay (skipped when the caller passes those very
    buffers), and outputs are returned as copies, so later replays never overwrite a result the caller kept.
    The first call runs normally (it also compiles every kernel); the second records the graph."""

    WARMUP_CALLS = 1

    def __init__(self, module: TritonGraph):
        self.module = module
        self.calls = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: list[torch.Tensor] = []
        self.static_outputs: list[torch.Tensor] = []

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.graph is None:
            self.calls += 1
            if self.calls <= self.WARMUP_CALLS:
                return self.module(inputs)
            self._record(inputs)
        for k, (static, x) in enumerate(zip(self.static_inputs, inputs)):
            if x.shape != static.shape or x.dtype != static.dtype or x.device != static.device:
                raise ValueError(f"kiln: input {k} expected {static.dtype} of shape {list(static.shape)} on "
                                 f"{static.device}, got {x.dtype} of shape {list(x.shape)} on {x.device}")
            if x.data_ptr() != static.data_ptr():
                static.copy_(x)
        self.graph.replay()
        return [o.clone() for o in self.static_outputs]

    def _record(self, inputs: list[torch.Tensor]) -> None:
        self.static_inputs = [x.clone() for x in inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # a warm-up on the capture stream (library handles, workspaces)
            self.module(self.static_inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.static_outputs = self.module(self.static_inputs)
        self.graph = graph


def build_triton_module(graph: Graph, report: CompileReport, device: torch.device, mode: str = "default") -> Callable:
    module = TritonGraph(graph, report, device)
    if mode in ("reduce-overhead", "max-autotune") and device.type == "cuda":
        if module.mutated_inputs:
            report.memory["cuda_graph"] = "not used: the graph updates its inputs in place"
            return module
        report.memory["cuda_graph"] = "recorded at the second call, replayed after"
        return GraphReplay(module)
    return module
