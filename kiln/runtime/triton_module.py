"""The GPU runtime: the same plan, arena and extern handling as the CPU module, with Triton kernels.

``TritonGraph`` reuses ``CompiledGraph`` (planning, liveness arena, output recycling, extern calls) and
replaces its code path: the kernels become one generated Python module of ``@triton.jit`` functions,
written to the disk cache (keyed by its source) and imported; each kernel step launches with the schedule's
grid.  Under ``TRITON_INTERPRET=1`` the same module runs on CPU tensors (how CI tests the generator).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch

from kiln import config
from kiln.codegen.gpu_call import build_wrapper
from kiln.codegen.triton import TritonKernelWriter, module_source, text_key
from kiln.ir.graph import Graph, Node
from kiln.ir.ops import Op
from kiln.report import CompileReport
from kiln.runtime import checking, gpu_launch, profiling
from kiln.ir.program import OwnStep, Plan
from kiln.runtime.errors import InputMismatch
from kiln.runtime.module import CompiledGraph

_loaded: dict[str, Any] = {}


def import_source(source: str) -> tuple[Any, bool]:
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
    module = import_file(path)
    _loaded[digest] = module
    return module, cached


def import_file(path: Path | str) -> Any:
    """Import a generated ``kiln_<digest>.py`` as module ``kiln_triton_<digest>`` (the compile workers import
    the same file under the same name, so Triton sees the same kernels)."""
    path = Path(path)
    spec = importlib.util.spec_from_file_location("kiln_triton_" + path.stem.removeprefix("kiln_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TritonGraph(CompiledGraph):

    sizes: dict[str, int] | None = None  # the size symbols' values of a symbolic plan's module (``__init__``)

    def __init__(self, graph: Graph, program: Any, report: CompileReport, device: torch.device,
                 sizes: dict[str, int] | None = None, shared_code: dict[Any, Any] | None = None):
        """``program``: without an arena (buffers from the caching allocator, each kernel its own step);
        ``sizes``: the size symbols' values where the plan's kernels are symbolic (one size's module of a
        symbolic graph, [Note: GPU kernels with size parameters] in schedule/gpu_symbolic.py): each launch
        passes them after the buffers; ``shared_code``: what the modules of one symbolic graph's sizes share
        (``"symbolic"``: kernel name -> has size parameters; the rest filled here, [Note: a size's build])."""
        self.device = device
        self.sizes = sizes
        super().__init__(graph, program, report, shared_code=shared_code)
        # not in default mode: its memory stays at eager's, and measured algorithms may take workspace that the
        # heuristic's choice does not (ResNet-18 b1: +0.5 MiB of peak in the 512-channel layers)
        self._cudnn_benchmark = device.type == "cuda" and config.get().cudnn_benchmark and \
            report.mode != "default" and any(
            getattr(n.attr("target"), "overloadpacket", None) is torch.ops.aten.convolution
            for n in graph.nodes if n.op is Op.EXTERN)
        # calls run the generated straight-line wrapper (see [Note: generated wrapper]) unless the configuration
        # asks for the interpreted plan (Config.gpu_call_wrapper)
        built = build_wrapper(self, self._segment_calls, self._fused_call, _bad_input) \
            if config.get().gpu_call_wrapper else None
        self._wrapped, report.wrapper = built if built is not None else (None, "")

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if not self._cudnn_benchmark:
            return self._run(inputs)
        before = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True  # this graph's convolutions only (see Config.cudnn_benchmark)
        try:
            return self._run(inputs)
        finally:
            torch.backends.cudnn.benchmark = before

    def _run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        profile = profiling.current()
        if profile is not None:  # kiln.profile: the interpreted program, each step timed
            return profile.run(self, inputs)
        if self.check_steps:  # KILN_CHECK: the interpreted program, each step compared with the reference
            return checking.run_checked(self, inputs)
        if self._wrapped is not None:
            return self._wrapped(inputs)
        return self.interpret(inputs)

    def peaks(self) -> Any:
        """The device's matmul rate in the graph's floating dtype, and its copy bandwidth (runtime/peaks.py)."""
        from kiln.runtime import peaks
        if self.device.type != "cuda":  # (Triton's interpreter on CPU tensors)
            return super().peaks()
        floats = [n.dtype for n in self.graph.nodes if n.dtype.is_floating_point]
        dtype = max(set(floats), key=floats.count) if floats else torch.float32
        return peaks.gpu(self.device, dtype)

    def _segment_calls(self, index: int) -> list[tuple[Callable, list[Node], bool, Any]]:
        """The generated wrapper's kernels of segment ``index``: (callable, argument nodes, takes one tuple,
        the ``_Launcher`` to call directly for buffers known to be aligned, or None)."""
        calls = []
        for fn, args, s in self._launches[index]:
            if isinstance(fn, _Launcher):
                calls.append((fn, args, True, fn))
            else:
                calls.append((functools.partial(_launch_jit, fn, s), args, False, None))
        return calls

    def _fused_call(self, step: OwnStep) -> tuple[Callable, list[Node]]:
        """The generated wrapper's call of a matmul template step, on the values of its argument nodes."""
        nodes = list(dict.fromkeys([*step.node.inputs, *step.args]))
        return (lambda *values: self.run_fused(step, dict(zip(nodes, values)))), nodes

    def _load_code(self, plan: Plan, segments: list[list[str]], dtype_of: dict[str, torch.dtype],
                   outputs: set[str], node_of: dict[str, Node], report: CompileReport) -> None:
        for s in plan.steps:
            if isinstance(s, OwnStep):  # an operator's own step (the matmul template): it loads its own code
                s.load(import_source, dtype_of, node_of)
        shared = self._shared_code
        # [Note: a size's build] The modules of a symbolic graph's sizes share their kernels' text wherever the
        # kernels' schedules are of one kind (``text_key``): the source, its module and the kernel writers are
        # made once per combination of kinds, not per size (a decoding loop meets a new size every step); so are
        # the compiled kernels (``_precompile``: by their constants, not the grid) and the loaded binaries
        # (``gpu_launch.function_of``, once per process).  A new size of a 2-layer GPT-2's decode step: 40 ms ->
        # 4 ms on the CPU machine (under Triton's interpreter; what is left is the size's plan and call wrapper);
        # on the H100 the decode loop had run at 0.09x eager, every step a new size's build.
        key = ("source", tuple(text_key(k, shared["symbolic"][k.name]) for k in plan.kernels)) \
            if shared is not None else None
        hit = shared.get(key) if shared is not None else None
        if hit is None:
            source = module_source(plan.kernels, dtype_of)
            module, from_cache = import_source(source)
            writers: dict[str, TritonKernelWriter] = {}
            if shared is not None:
                shared[key] = (source, module, writers)
                shared.setdefault("module", module)  # (later sizes' reports leave the plan's text out)
        else:
            (source, module, writers), from_cache = hit, True
        report.source, report.from_cache = source, from_cache
        self._module_path = module.__file__
        by_name = {k.name: k for k in plan.kernels}
        self._launches: list[list[tuple[Callable, list[Node], Any]]] = []
        for names in segments:
            steps = []
            for name in names:
                k = by_name[name]
                writer = writers.get(name)
                if writer is None:
                    writer = writers[name] = TritonKernelWriter(k, dtype_of)
                args = [node_of[b] for b in writer.args()]
                fn = getattr(module, name)
                if writer.size_params():
                    if self.sizes is None:
                        raise ValueError(f"kernel {name} has size parameters and the module no sizes")
                    fn = SizedKernel(fn, {**{p: self.sizes[p] for p in writer.size_params()},
                                          **writer.float_values(self.sizes)})
                steps.append((fn, args, k.schedule))
            self._launches.append(steps)
        if self.device.type == "cuda":
            start = time.perf_counter()
            self._precompile(report.phases)
            report.phases["kernel_compile"] = time.perf_counter() - start

    def _precompile(self, phases: dict[str, float]) -> None:
        """Compile every kernel now, several at a time (ptxas runs outside the GIL), for 16-byte aligned
        buffers (the arena's are); launches then go straight to the compiled kernels."""
        jobs = [(i, j) for i, steps in enumerate(self._launches) for j in range(len(steps))]
        unique: dict[tuple, tuple[int, int]] = {}  # aliased kernels (same text) compile once
        # kernels another size of the graph compiled already ([Note: a size's build])
        done = self._shared_code.setdefault("compiled", {}) if self._shared_code is not None else {}
        for i, j in jobs:
            fn, args, s = self._launches[i][j]
            key = _compile_key(fn, args, s)
            if key not in done:
                unique.setdefault(key, (i, j))

        static = config.get().gpu_static_launch and gpu_launch.available()

        def compile_one(job: tuple[int, int]) -> Any:
            fn, args, s = self._launches[job[0]][job[1]]
            compiled = fn.warmup(*[n.dtype for n in args], grid=s.grid3, XBLOCK=s.xblock,
                                 RBLOCK=max(s.rblock, 1), num_warps=s.num_warps)
            if not (static and gpu_launch.describable(compiled)):  # see [Note: no Triton launcher]
                build_launcher(compiled)
            return compiled

        done.update(self._compile_shared(unique, compile_one, phases) if unique else {})
        compiled = done  # (this size's kernels and, where shared, every earlier size's)
        stream = gpu_launch.stream_getter(self.device)
        functions: dict[int, Any] = {}  # kernels loaded by kiln, by id of the compiled kernel
        for i, j in jobs:
            fn, args, s = self._launches[i][j]
            ck = compiled[_compile_key(fn, args, s)]
            if getattr(type(ck), "run", None) is None or not hasattr(ck, "metadata"):
                continue  # not a compiled CUDA kernel: launched through the JIT entry
            launcher = _Launcher(ck, s, fn, getattr(fn, "sizes", ()))
            if static:  # kiln's own launch of the same compiled kernel (see [Note: static launch])
                if id(ck) not in functions:
                    functions[id(ck)] = gpu_launch.function_of(ck, self.device)
                record = gpu_launch.record(ck, s.grid3, list(range(len(args))), functions[id(ck)],
                                           getattr(fn, "by_name", None))
                if record is not None:
                    jit = functools.partial(_launch_jit, fn, s)
                    launcher.static = gpu_launch.Launch([record], [self.segments[i][j]],
                                                        lambda tensors, jit=jit: jit(*tensors))
                    launcher.stream = stream
            self._launches[i][j] = (launcher, args, s)
        self.static_launches = sum(1 for steps in self._launches for fn, _, _ in steps
                                   if isinstance(fn, _Launcher) and fn.static is not None)

    def compile_jobs(self, jobs: list[tuple[int, int]] | None = None) -> list[dict[str, Any]]:
        """The compile worker's job for each launch ``(segment, position)`` (default: every launch), the way
        ``kiln.runtime.compile_worker`` takes them: module file, kernel, argument dtypes, grid and constants."""
        if jobs is None:
            jobs = [(i, j) for i, steps in enumerate(self._launches) for j in range(len(steps))]
        launches_itself = config.get().gpu_static_launch and gpu_launch.available()
        specs = []
        for k, (i, j) in enumerate(jobs):
            fn, args, s = self._launches[i][j]
            specs.append({"id": k, "path": self._module_path, "kernel": self.segments[i][j],
                          "dtypes": [str(n.dtype).removeprefix("torch.") for n in args], "grid": list(s.grid3),
                          "constants": {"XBLOCK": s.xblock, "RBLOCK": max(s.rblock, 1)}, "num_warps": s.num_warps,
                          "launcher": not launches_itself})
        return specs

    def _compile_shared(self, unique: dict[tuple, tuple[int, int]], compile_one: Callable[[tuple[int, int]], Any],
                        phases: dict[str, float]) -> dict[tuple, Any]:
        """Compile each unique launch once: the parent's threads and the started compile workers (compile_pool)
        take from one queue, so no kernel waits for a worker to start.  A kernel a worker built is then loaded
        by the parent from Triton's cache (``compile_one`` again, a cache hit); one it failed on, the parent
        compiles itself, so its error is the parent's as without workers.  Errors are raised after every
        thread has stopped."""
        from kiln.runtime import compile_pool
        keys = list(unique)
        todo: queue.Queue = queue.Queue()
        for key in keys:
            todo.put(key)
        compiled: dict[tuple, Any] = {}
        errors: list[BaseException] = []

        def finish(key: tuple) -> None:
            try:
                compiled[key] = compile_one(unique[key])
            except BaseException as exc:  # noqa: BLE001 - raised by the caller's thread below
                errors.append(exc)

        def in_process() -> None:
            while True:
                try:
                    key = todo.get_nowait()
                except queue.Empty:
                    return
                finish(key)

        pool = compile_pool.get() if len(keys) > 1 and not self.sizes else None  # (jobs name no sizes)
        feeders: list[threading.Thread] = []
        start = time.perf_counter()
        if pool is not None:
            jobs = dict(zip(keys, self.compile_jobs(list(unique.values()))))
            by_workers = pool.compiled
            feeders = pool.serve(todo, jobs.__getitem__, lambda key, answer: finish(key))
        # with workers started, one parent thread (its compiles hold the GIL the feeders' loads need); else as
        # many as ptxas can use
        threads = [threading.Thread(target=in_process, daemon=True)
                   for _ in range(1 if pool is not None and pool.ready() else min(8, max(len(keys), 1)))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if pool is not None:
            pool.join(feeders, deadline_s=300.0)
            in_process()  # (what a worker that died left in the queue)
            phases["compile_workers"] = time.perf_counter() - start
            phases["kernels_by_workers"] = pool.compiled - by_workers
        if errors:
            raise errors[0]
        return compiled

    def _before_run(self) -> None:
        pass

    def run_fused(self, step: OwnStep, env: dict[Node, torch.Tensor]) -> None:
        operands, _ = self._extern_args(step.node, env)
        step.run(operands, [env[n] for n in step.args])

    def run_segment(self, index: int, env: dict[Node, torch.Tensor]) -> None:
        steps = self._launches[index]
        for i, (fn, args, s) in enumerate(steps):
            tensors = [env[n] for n in args]
            if isinstance(fn, _Launcher):
                fn(tensors)
                continue
            _launch_jit(fn, s, *tensors)


def _bad_input(k: int, t: torch.Tensor, n: Node, device: torch.device) -> None:
    """The generated call's answer to a caller's input that does not match the graph's."""
    raise InputMismatch(k, n.dtype, n.shape, device.type, t)


def _launch_jit(fn: Any, s: Any, *tensors: torch.Tensor) -> None:
    """Launch through Triton's JIT entry (the interpreter's way, and for buffers not 16-byte aligned)."""
    fn[s.grid3](*tensors, XBLOCK=s.xblock, RBLOCK=max(s.rblock, 1), num_warps=s.num_warps)


def build_launcher(compiled: Any) -> None:
    """Build the kernel's C launcher now, in this thread, into Triton's cache.

    Triton builds it (a C file through the host compiler, once per argument signature) at the kernel's
    first launch, one kernel after the other on the calling thread: with empty caches that was most of a
    graph's kernel compile time (GPT: 10 launchers).  Built here, in parallel, the first launch only loads
    it.  Best effort: on another Triton version the launch builds it as before.  Once per compiled kernel: a
    symbolic graph's modules per size share their kernels ([Note: GPU kernels with size parameters])."""
    if id(compiled) in _launchers_built:
        return
    try:
        from triton.backends.nvidia.driver import CudaLauncher
        CudaLauncher(compiled.src, compiled.metadata)
        _launchers_built.add(id(compiled))  # (Triton's cache holds compiled kernels for the process's life)
    except Exception:  # noqa: BLE001 - only an optimisation
        pass


_launchers_built: set[int] = set()


def _compile_key(fn: Any, args: list[Node], s: Any) -> tuple:
    """What a launch's compiled kernel depends on: the kernel (aliases of one text are one function), the buffers'
    dtypes, the schedule's constants (not its grid: a launch's, not the compile's), and for a kernel with size
    parameters how Triton specializes their values."""
    constants = (s.xblock, max(s.rblock, 1), s.num_warps)
    if isinstance(fn, SizedKernel):
        return (id(fn.fn), tuple(n.dtype for n in args), constants, fn.specialization)
    return (id(fn), tuple(n.dtype for n in args), constants)


class SizedKernel:
    """A Triton kernel with size parameters bound to one size tuple's values: launched and compiled as the plain
    kernel is (``fn[grid](*buffers, ...)``, ``fn.warmup(*dtypes, ...)``), the sizes passed after the buffers."""

    def __init__(self, fn: Any, sizes: dict[str, int | float]):
        """``sizes``: the kernel's size parameters' values by name, in the kernel's parameter order (ints, then
        the floats computed from them)."""
        self.fn = fn
        self.by_name = sizes
        self.sizes = tuple(sizes.values())
        # Triton's own specialization of int arguments: 1 is a constant, a multiple of 16 is marked so (floats are
        # not specialized)
        self.specialization = tuple((v == 1, v % 16 == 0) if isinstance(v, int) else None for v in self.sizes)

    def __getitem__(self, grid: Any) -> Callable:
        launch, sizes = self.fn[grid], self.sizes
        return lambda *tensors, **constants: launch(*tensors, *sizes, **constants)

    def warmup(self, *dtypes: Any, **options: Any) -> Any:
        return self.fn.warmup(*dtypes, *self.sizes, **options)


class _Launcher:
    """Launch a kernel compiled ahead for 16-byte aligned buffers directly: Triton's JIT entry re-derives the
    specialization key from every argument on every call (tens of microseconds).  A buffer that is not so
    aligned (a caller's sliced input) goes through the JIT entry instead, which specializes for it.  ``sizes``:
    the values of a symbolic kernel's size parameters, passed after the buffers."""

    def __init__(self, compiled: Any, s: Any, jit: Any, sizes: tuple[int, ...] = ()):
        self.compiled = compiled
        self.constants = (*sizes, s.xblock, max(s.rblock, 1))
        self.jit = jit
        self.s = s
        self.static: gpu_launch.Launch | None = None  # kiln's launch of the same kernel, where it can describe it
        self.stream: Callable[[], int] | None = None

    @functools.cached_property
    def runner(self) -> Callable:
        """Triton's runner of the compiled kernel: built at first use (its C launcher goes through the host
        compiler), so a kernel kiln launches itself never builds one."""
        return self.compiled[self.s.grid3]

    def __call__(self, tensors: list[torch.Tensor]) -> None:
        if self.static is not None:  # (it checks the alignment itself)
            code = self.static.call(self.stream(), *tensors)
            if code:
                self.static.retry(code, tuple(tensors))
        elif all(t.data_ptr() % 16 == 0 for t in tensors):
            self.runner(*tensors, *self.constants)
        else:
            _launch_jit(self.jit, self.s, *tensors)
