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
        for fn, args, s in self._launches[index]:
            fn[(s.grid,)](*[env[n] for n in args], XBLOCK=s.xblock, RBLOCK=max(s.rblock, 1),
                          num_warps=s.num_warps)


def build_triton_module(graph: Graph, report: CompileReport, device: torch.device) -> Callable:
    return TritonGraph(graph, report, device)
