"""Running a graph compiled with dynamic shapes on the CPU: one build, a Program per size tuple.

A call binds the size symbols from its inputs' dimensions (and checks every dimension against its expression),
takes the Program planned for those sizes - made on the first call at that size by the compile's
``specialize(env)`` ([Note: a Program per size], schedule/specialize.py), kept while among the ``capacity`` most
recently used - sets the C++ size table that the kernels read ([Note: symbolic kernels], codegen/cpp.py) and
runs it.  Every size's module loads the same compiled library (the source does not depend on the sizes, so the
build cache answers after the first), so a new size costs planning, not compiling.
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Sequence

import torch

from kiln.codegen.cpp import native_calls
from kiln.ir.graph import Graph
from kiln.ir.sym import as_symbol, evaluate
from kiln.report import CompileReport
from kiln.runtime.errors import InputMismatch
from kiln.runtime.module import CompiledGraph


class SymbolicGraph:
    """The callable for a symbolic graph: ``module(inputs) -> outputs`` at any sizes its symbols' ranges allow."""

    device = torch.device("cpu")

    def __init__(self, graph: Graph, report: CompileReport,
                 specialize: Callable[[dict[str, int]], tuple[Graph, Any]], size_names: list[str],
                 capacity: int = 64, int_sizes: Sequence[str] = ()):
        """``specialize(env) -> (concrete graph, Program)``; ``size_names``: the size table's symbols in slot order
        (every symbol the graph's shapes and kernels use); ``int_sizes``: symbols whose values the call passes as
        ints after the tensors (Dynamo's int inputs: a size no input dimension shows, ``x[:n]`` of an int ``n``)."""
        self.int_sizes = list(int_sizes)
        self.graph = graph
        self.report = report
        self.specialize = specialize
        self.size_names = size_names
        self.size_slot = {name: k for k, name in enumerate(size_names)}
        self.capacity = capacity
        self.position = {n: i for i, n in enumerate(graph.nodes)}
        self.modules: collections.OrderedDict[tuple[int, ...], CompiledGraph] = collections.OrderedDict()
        self.sizes_seen = 0
        # per input: (position, node, rank, static dims, dims that are one symbol, other dims' expressions)
        self._checks = []
        for k, n in enumerate(graph.inputs):
            static = [(d, s) for d, s in enumerate(n.shape) if isinstance(s, int)]
            symbols = [(d, as_symbol(s).name) for d, s in enumerate(n.shape)
                       if not isinstance(s, int) and as_symbol(s) is not None]
            exprs = [(d, s) for d, s in enumerate(n.shape) if not isinstance(s, int) and as_symbol(s) is None]
            self._checks.append((k, n, len(n.shape), static, symbols, exprs))
        # where each symbol is read: the first input dimension that is the symbol alone
        self._readers: list[tuple[str, int, int]] = []
        found: set[str] = set()
        for k, _, _, _, symbols, _ in self._checks:
            for d, name in symbols:
                if name not in found:
                    found.add(name)
                    self._readers.append((name, k, d))
        missing = set(size_names) - found - set(self.int_sizes)
        if missing:
            raise ValueError(f"size symbols {sorted(missing)} are no input's dimension (an int argument alone)")
        report.dynamic = {"symbols": list(size_names), "sizes": [], "planned": 0, "builds": 0}
        self._first = True
        self._env: dict[str, int] = {}
        # the translation unit of every size's module, once loaded, by what its source depends on
        self._code: dict[tuple, dict[str, Any]] = {}

    def _bind(self, inputs: Sequence[Any]) -> dict[str, int]:
        """The call's sizes: from the int inputs, then from the input dimensions that are one symbol; every
        dimension checked against its expression (plain symbols and numbers compared directly: a call's host time
        is the point of compiling a decode step)."""
        tensors = len(self.graph.inputs)
        env = {name: int(inputs[tensors + k]) for k, name in enumerate(self.int_sizes)}
        for name, k, d in self._readers:
            if name not in env and inputs[k].dim() > d:
                env[name] = int(inputs[k].shape[d])
        for k, n, ndim, static, symbols, exprs in self._checks:
            t = inputs[k]
            shape = t.shape
            ok = t.dtype == n.dtype and len(shape) == ndim and t.device.type == self.device.type \
                and all(shape[d] == v for d, v in static) and all(shape[d] == env.get(v) for d, v in symbols)
            if ok and exprs:
                try:
                    ok = all(shape[d] == evaluate(e, env) for d, e in exprs)
                except KeyError:
                    ok = False
            if not ok:
                raise InputMismatch(k, n.dtype, n.shape, self.device.type, t)
        return env

    def module_for(self, env: dict[str, int]) -> Any:
        """The compiled module of the sizes ``env`` (made now if not among the ``capacity`` most recent ones)."""
        key = tuple(env[name] for name in self.size_names)
        module = self.modules.get(key)
        if module is not None:
            self.modules.move_to_end(key)
            return module
        # the first size's module fills the compile's report; later ones a report of their own
        report = self.report if self._first else CompileReport(name=self.report.name, mode=self.report.mode)
        self._first = False
        module = self._new_module(env, report)
        self.sizes_seen += 1
        seen = self.report.dynamic
        seen["planned"] += 1
        seen["sizes"].append(dict(env))
        del seen["sizes"][:-self.capacity]  # (the most recent ones: a server sees new sizes for as long as it runs)
        self.modules[key] = module
        if len(self.modules) > self.capacity:
            self.modules.popitem(last=False)
        return module

    def _new_module(self, env: dict[str, int], report: CompileReport) -> CompiledGraph:
        """The sizes' Program over the one build's code."""
        graph, program = self.specialize(env)
        natives = native_calls(program.segments)
        # (the source depends on the segments' entries and the native calls' signatures alone: sizes with the
        # same share one build, [Note: native calls at any size])
        signature = tuple(tuple(e if isinstance(e, str) else e.signature() for e in entries)
                          for entries in program.segments)
        if signature not in self._code:
            self._code[signature] = {}
            self.report.dynamic["builds"] = len(self._code)
        table = [env[name] for name in self.size_names] + [v for call in natives for v in call.table_values()]
        return CompiledGraph(graph, program, report, size_slot=self.size_slot, position=self.position,
                             shared_code=self._code[signature], size_table=table)

    def call_sizes(self) -> dict[str, int]:
        """The size symbols' values in the last call (what the caller's own views of its outputs take)."""
        return self._env

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        env = self._bind(inputs)
        self._env = env
        module = self.module_for(env)
        if self.int_sizes:
            inputs = inputs[:len(self.graph.inputs)]
        return module(inputs)  # (which points the library to its size table)


class SizedTritonGraph(SymbolicGraph):
    """A symbolic graph on the GPU: a static Triton module built per size tuple seen, the ``capacity`` most recently
    used kept.

    [Note: a GPU module per size] The graph is lowered and optimized once, with size expressions; each new size
    tuple evaluates them (``concrete_graph``) and builds the static GPU module of that graph - plan, matmul
    choices, Triton kernels with the sizes as constants, and in reduce-overhead its own CUDA graph - so every
    call runs code specialized to its sizes, at the price of a compile per new size (Triton's cache answers a
    size seen in an earlier process).  So that a decoding loop (a new length every step, each seen once) does not
    compile at every token, a size's module is built at its ``build_after``-th call (``gpu_dynamic_build_after``,
    2 by default: a size that comes back) and the calls before run the captured graph eagerly; the report counts
    both.  The same class serves the default path, kernels with size parameters shared by all sizes
    ([Note: GPU kernels with size parameters], schedule/gpu_symbolic.py), where a size's build is a plan and
    launches, not compiles, and ``build_after`` is 1."""

    def __init__(self, graph: Graph, report: CompileReport, build: Callable[[dict[str, int], CompileReport], Any],
                 size_names: list[str], device: torch.device, capacity: int = 16, int_sizes: Sequence[str] = (),
                 build_after: int = 1):
        """``build(sizes, report) -> module``: the static GPU module of the graph at those sizes; ``build_after``:
        a size's module is built at its n-th call (``ready`` says whether this call's is, or would be)."""
        self.device = device
        super().__init__(graph, report, lambda env: (graph, None), size_names, capacity, int_sizes)
        self.build = build
        self.build_after = max(1, build_after)
        self.sightings: collections.OrderedDict[tuple[int, ...], int] = collections.OrderedDict()
        self._bound: tuple[tuple[int, ...], dict[str, int]] | None = None  # (the inputs' ids, their sizes)
        report.dynamic["builds"] = 0
        report.dynamic["eager_calls"] = 0

    def ready(self, inputs: Sequence[torch.Tensor]) -> bool:
        """Is this call's size compiled, or seen often enough to be built now?  If not, the caller runs the call
        eagerly (counted in the report).  Bad inputs raise here as in a compiled call.  Every call asks this
        first; the sizes it binds serve the compiled call that follows (``_bind``), not bound twice."""
        self._bound = None
        env = super()._bind(inputs)
        key = tuple(env[name] for name in self.size_names)
        seen = self.build_after
        if key not in self.modules:
            seen = self.sightings.pop(key, 0) + 1
            self.sightings[key] = seen
            if len(self.sightings) > 1024:  # (a server sees new sizes for as long as it runs)
                self.sightings.popitem(last=False)
        if seen >= self.build_after:
            self._bound = (tuple(map(id, inputs)), env)
            return True
        self.report.dynamic["eager_calls"] += 1
        return False

    def _bind(self, inputs: Sequence[Any]) -> dict[str, int]:
        bound, self._bound = self._bound, None
        if bound is not None and bound[0] == tuple(map(id, inputs)):
            return bound[1]
        return super()._bind(inputs)

    def _new_module(self, env: dict[str, int], report: CompileReport) -> Any:
        self.report.dynamic["builds"] += 1
        return self.build(env, report)
