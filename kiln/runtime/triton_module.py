"""The GPU runtime: the same plan, arena and extern handling as the CPU module, with Triton kernels.

``TritonGraph`` reuses ``CompiledGraph`` (planning, liveness arena, output recycling, extern calls) and
replaces its code path: the kernels become one generated Python module of ``@triton.jit`` functions,
written to the disk cache (keyed by its source) and imported; each kernel step launches with the schedule's
grid.  Under ``TRITON_INTERPRET=1`` the same module runs on CPU tensors (how CI tests the generator).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import os
import queue
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator

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
from kiln.runtime.module import CompiledGraph, _storage_uses

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


class GraphPool:
    """[Note: one memory pool for a symbolic graph's sizes] Under reduce-overhead each size of a symbolic graph
    records CUDA graphs of its own (up to ``SIZES_KEPT``).  In private pools each recording would hold its
    intermediates' memory for good - a pool per size; the sizes' recordings share this one pool instead, so a
    capture may place its intermediates where an earlier capture's intermediates were (free once that capture
    ended).  Replays run one after another on one stream, so recordings that overlap in intermediates do not
    disturb each other.  What must not be overwritten is an output the caller still holds: a recording's output
    buffers stay allocated, but they may lie where a recording captured *before* them keeps intermediates (that
    memory was free then), and that recording's replay writes there.  So before any replay in the pool, every
    recording's outputs the caller still holds are moved onto copies (``release``), not only the replaying
    recording's ([Note: outputs of a replay]): a decoding loop that drops each step's logits pays nothing."""

    def __init__(self) -> None:
        self.handle: Any = None  # torch.cuda.graph_pool_handle(), made at the first recording
        self.handed: dict[int, "_Recording"] = {}  # recordings whose outputs the caller may hold, by id

    def release(self) -> bool:
        """Make every output handed out by the pool's recordings free to overwrite; False if the caller holds a
        view that cannot be moved (the call then runs without a graph)."""
        for key, recording in list(self.handed.items()):
            if not recording.release_outputs():
                return False
            if not recording.holds_aliases():
                del self.handed[key]
        return True

    def note_handed(self, recording: "_Recording") -> None:
        if recording.holds_aliases():
            self.handed[id(recording)] = recording


class GraphReplay:
    """``reduce-overhead``: the compiled graph recorded once as a CUDA graph and replayed.

    Inputs are copied into static buffers before each replay (skipped when the caller passes those very
    buffers).  Outputs are handed out without a copy, and stay the caller's: see [Note: outputs of a replay].
    The first call runs normally (it also compiles every kernel); the second records the graph (on the caller's
    buffers if it passes those of an earlier call, else - at the next call with new addresses - on copies)."""

    WARMUP_CALLS = 1
    MAX_GRAPHS = 2  # graphs recorded on callers' own input buffers, before falling back to copies
    SETTLE_CALLS = 2  # calls in a row at one address before a copied input is read in place
    MAX_COPY_RECORDINGS = 4  # recordings of the graph on copies reading some inputs in place

    def __init__(self, module: TritonGraph, on_record: Callable[[], None] | None = None,
                 report: CompileReport | None = None, pool: GraphPool | None = None):
        """``on_record``: called after each recording (a symbolic graph's report counts them over its sizes);
        ``report``: where a recording that fails says so; ``pool``: the memory pool shared with the other sizes
        of a symbolic graph ([Note: one memory pool for a symbolic graph's sizes]); None: a private one."""
        self.module = module
        self.on_record = on_record
        self.report = report
        self.pool = pool
        self.capture_error: str | None = None  # a recording failed: every call runs the plain module
        self.calls = 0
        # [Note: a training step replays one recording per graph] A training step's graphs form a chain: the
        # backward reads the forward's saved activations, which lie where the forward's recording writes its
        # outputs.  If the forward replayed one recording in one step and another in the next (a graph keyed by
        # the batch's address, whenever the allocator hands the batch a block seen before; the graph on copies
        # otherwise), the backward's inputs would change address from step to step and it could read none of
        # them in place - it would copy every saved activation, or record again.  So training graphs are never
        # keyed by address: each replays its graph on copies, which reads the inputs that keep their address
        # (parameters; once the forward replays, the saved activations) in place and copies the others (the
        # batch, the incoming gradient).  Inference graphs keep both kinds.
        self.keyed = not (report is not None and report.training)
        # [Note: graphs keyed by input addresses] A graph reads its inputs at the addresses it was recorded
        # with.  A caller that passes the same buffers again (same addresses, shapes and strides) gets a
        # replay with no input copy; other inputs are copied into the buffers of a graph recorded on copies.
        # A graph is recorded on the caller's own buffers only for addresses already seen in an earlier call:
        # a loop that passes fresh tensors each call (a decoding loop's growing cache) would otherwise record
        # ``MAX_GRAPHS`` graphs no later call replays, each recording costing milliseconds, before the copies.
        # The graph on copies is recorded at the second call whose addresses were new (the first runs plainly:
        # a caller that alternates two sets of buffers gets a graph on each, with no copies).
        self.graphs: dict[tuple, _Recording] = {}
        self.seen: list[tuple] = []  # input addresses of the latest calls that had no graph of their own
        self.seen_calls = 0  # (how many calls those were: one key seen in two calls is settled)
        self.misses = 0  # calls after the warm-up whose addresses had not been seen
        self.copy_graph: _Recording | None = None
        # [Note: a graph on copies reads settled inputs in place] The graph on copies copies only the inputs
        # whose address moves: one that came at the same address in every call seen (a parameter; a training
        # backward's saved activations, the forward replay's outputs) is read where the caller keeps it,
        # like the inputs of a graph keyed by addresses - a training step's forward would otherwise copy every
        # parameter into a second set of buffers before each replay.  ``in_place``: input -> the address the
        # graph reads; a call passing another tensor there drops the graph (the next miss records again).  An
        # input that is another recording's output (a training forward's saved activations, for the backward)
        # is read in place from the start; one copied so far that becomes such an output and keeps its address
        # for ``SETTLE_CALLS`` calls (the backward's activations, once the forward replays) has the graph
        # recorded again with it in place - no other input settles after a recording (a fresh batch the
        # allocator happens to place where the last one was would move again).  An input other than a
        # recording's output that moved after being read in place is copied from then on; after
        # ``MAX_COPY_RECORDINGS`` recordings a graph
        # that no longer fits is recorded once more with every input copied.  Only addresses are kept, never
        # the caller's tensors: a reference would keep a forward's output alias alive and make its next replay
        # copy it.
        self.static_inputs: list[torch.Tensor | None] = []  # the copies (None: read in place)
        self.in_place: dict[int, tuple] = {}  # input -> (address, strides) the graph reads
        self.streak: list[int] = []  # per copied input: calls in a row at the previous call's address
        self.last_addresses: tuple = ()
        self.moved: set[int] = set()  # inputs once read in place that came elsewhere later: copied for good
        # (off: every input of the graph on copies copied; a training graph always reads its parameters and saved
        # activations in place)
        self.settle = config.get().cuda_graph_inputs_in_place or not self.keyed
        self.copy_recordings = 0
        self.expected = [(n.shape, n.dtype) for n in module.graph.inputs]
        self.device_type = module.device.type  # (cuda; cpu where CUDA graphs are emulated)
        self.unprotected_runs = 0  # calls run without the graph: the caller held views of earlier outputs
        # [Note: replaying a graph that updates its inputs] (a static KV cache's decode step) A graph recorded on
        # the caller's buffers updates them where they lie at each replay, as the plain call does.  Two things
        # differ from a pure graph: the warm-up run before a capture works on copies of the inputs it updates
        # (else the update would happen twice in the call that records: wrong for ``count += 1``), and a replay
        # of the graph recorded on copies copies the updated inputs back into the caller's tensors.
        self.updated = [k for k, _, n in module.input_slots if n in module.mutated_inputs]

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        for k, (x, (shape, dtype)) in enumerate(zip(inputs, self.expected)):
            if tuple(x.shape) != shape or x.dtype != dtype or x.device.type != self.device_type:
                raise InputMismatch(k, dtype, shape, self.device_type, x)
            if not self.settle and not x.is_contiguous():
                return self.module(inputs)  # (strided inputs replay only with cuda_graph_inputs_in_place, for now)
        self.calls += 1
        # (an input's strides are part of its key: a graph recorded on a strided input - a slice of a batch, a
        # channels-last activation a backward saved - reads that layout; the graph on copies copies any layout
        # into its own buffers, which keep the layout of the input they were cloned from where it is dense)
        key = tuple((x.data_ptr(), x.stride()) for x in inputs)
        if self.calls <= self.WARMUP_CALLS or profiling.current() is not None or self.capture_error:
            self._saw(key)
            return self.module(inputs)  # (kiln.profile: step by step)
        entry = self.graphs.get(key)
        try:
            if entry is None and self.keyed and len(self.graphs) < self.MAX_GRAPHS and key in self.seen:
                entry = self.graphs[key] = self._record(list(inputs))
            elif entry is None:
                self._saw(key)
                moved = {k for k, a in self.in_place.items() if key[k] != a}
                if self.copy_graph is not None and moved:
                    self.moved |= moved  # (copied from now on)
                    self.copy_graph, self.misses = None, 0
                if self.copy_graph is None:
                    self.misses += 1
                    if self.misses < 2:  # one more plain call: these addresses may come again
                        return self.module(inputs)
                    settled = self._settled_in_every_call_seen(key, inputs)
                    self._record_copy_graph(inputs, key, settled if self.copy_recordings < self.MAX_COPY_RECORDINGS
                                            else set())
                else:
                    settled = self._settled_since_recording(key, inputs)
                    if settled and self.copy_recordings < self.MAX_COPY_RECORDINGS:
                        self._record_copy_graph(inputs, key, set(self.in_place) | settled)
        except Exception as exc:  # noqa: BLE001 - never break the user's model: run it without CUDA graphs
            # (an op that cannot be captured - one that waits for the device - fails only when recorded)
            self.capture_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            if self.report is not None:
                self.report.memory["cuda_graph"] = f"not used: recording failed ({self.capture_error})"
            warnings.warn(f"kiln: a CUDA graph recording failed, the graph runs without CUDA graphs: "
                          f"{self.capture_error}", stacklevel=2)
            return self.module(inputs)
        if entry is None:
            for static, x in zip(self.static_inputs, inputs):
                if static is not None:
                    static.copy_(x)
            entry = self.copy_graph
        if not (entry.release_outputs() if self.pool is None else self.pool.release()):
            self.unprotected_runs += 1
            return self.module(inputs)
        entry.replay(inputs)
        if entry is self.copy_graph:
            for k in self.updated:
                if self.static_inputs[k] is not None:
                    inputs[k].copy_(self.static_inputs[k])
        outputs = entry.hand_out(inputs)
        if self.pool is not None:
            self.pool.note_handed(entry)
        return outputs

    def _settled_in_every_call_seen(self, key: tuple, inputs: list[torch.Tensor]) -> set[int]:
        """Inputs at the same address in every call seen without a graph of its own (this one included) that
        never moved after being read in place, and inputs that are another recording's outputs (they stay where
        that recording writes them, for as long as it lives)."""
        if not self.settle:
            return set()
        recorded = {k for k, x in enumerate(inputs) if _recorded_output(x)}
        if self.seen_calls < 2:
            return recorded
        return recorded | ({k for k, a in enumerate(key) if all(s[k] == a for s in self.seen)} - self.moved)

    def _settled_since_recording(self, key: tuple, inputs: list[torch.Tensor]) -> set[int]:
        """Copied inputs that are another recording's outputs and came at the previous call's address
        ``SETTLE_CALLS`` calls in a row (a backward's saved activations, once the forward replays).  Nothing
        else settles after the recording: a fresh tensor the allocator happens to place where the previous one
        was (a batch, an incoming gradient) would move again, and each move records the graph once more."""
        if not self.settle:
            return set()
        for k, a in enumerate(key):
            if k not in self.in_place:
                self.streak[k] = self.streak[k] + 1 if a == self.last_addresses[k] else 0
        self.last_addresses = key
        return {k for k, n in enumerate(self.streak)
                if n >= self.SETTLE_CALLS and k not in self.in_place and _recorded_output(inputs[k])}

    def _record_copy_graph(self, inputs: list[torch.Tensor], key: tuple, in_place: set[int]) -> None:
        """([Note: a graph on copies reads settled inputs in place]) Record the graph on copies of the inputs
        outside ``in_place``, the others read at the caller's addresses (``key``: this call's)."""
        self.copy_graph = None  # (the previous recording's copies and pool go first)
        self.static_inputs = [x if k in in_place else x.clone() for k, x in enumerate(inputs)]
        self.copy_graph = self._record(list(self.static_inputs))
        self.copy_recordings += 1
        self.in_place = {k: key[k] for k in in_place}
        self.static_inputs = [None if k in in_place else x for k, x in enumerate(self.static_inputs)]
        self.streak = [0] * len(inputs)
        self.last_addresses = key

    def _saw(self, key: tuple) -> None:
        """Remember the input addresses of a call without a graph of its own (the last ``MAX_GRAPHS + 2``)."""
        self.seen_calls += 1
        if key not in self.seen:
            self.seen = [*self.seen[-(self.MAX_GRAPHS + 1):], key]

    def _record(self, inputs: list[torch.Tensor]) -> "_Recording":
        if self.device_type != "cuda":
            recording = _EmulatedGraph.record(self.module, inputs, self.updated)
            if self.on_record is not None:
                self.on_record()
            return recording
        stream = _capture_stream(inputs[0].device if inputs else torch.device("cuda"))
        stream.wait_stream(torch.cuda.current_stream())
        # [Note: cuBLAS workspace of a recording] cuBLAS keeps a workspace (32 MiB on Hopper) per stream,
        # allocated at its first call there and held for good.  Cleared around the warm-up and the capture,
        # the workspace the recording uses is allocated during the capture, from the graph's private pool,
        # and handed back to that pool after it: the graph owns it and no stream holds another one for us.
        with _cublas_workspaces_cleared(), torch.cuda.stream(stream):  # warm-up: library handles, plans
            self.module([x.clone() if k in self.updated else x for k, x in enumerate(inputs)])
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        pool = None
        if self.pool is not None:
            if self.pool.handle is None:
                self.pool.handle = torch.cuda.graph_pool_handle()
            pool = self.pool.handle
        with _cublas_workspaces_cleared(), torch.cuda.graph(graph, pool=pool, stream=stream):
            outputs = self.module(inputs)
        if self.on_record is not None:
            self.on_record()
        return _Recording(graph, outputs, inputs)


def _without_base(o: torch.Tensor) -> torch.Tensor:
    """``o``'s memory, shape and strides in a tensor that is no view of another."""
    if o._base is None:
        return o
    with torch.no_grad():
        own = torch.empty(0, dtype=o.dtype, device=o.device)
        own.set_(o.untyped_storage(), o.storage_offset(), o.shape, o.stride())
    return own


def _view_of_input(o: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[int, tuple, int] | None:
    """([Note: outputs that are inputs]) (input index, that input's strides, ``o``'s offset from it) where
    output ``o`` is a view lying within input ``j``'s elements (same dtype), else None."""
    if min(o.stride(), default=0) < 0:
        return None
    p = o.untyped_storage().data_ptr()
    o_lo, o_hi = _extent(o)
    for j, x in enumerate(inputs):
        if x.untyped_storage().data_ptr() != p or x.dtype != o.dtype or min(x.stride(), default=0) < 0:
            continue
        lo, hi = _extent(x)
        if lo <= o_lo and o_hi <= hi:
            return j, x.stride(), o.storage_offset() - x.storage_offset()
    return None


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The first and last storage elements ``t`` reaches (non-negative strides)."""
    if t.numel() == 0:
        return t.storage_offset(), t.storage_offset() - 1
    return t.storage_offset(), t.storage_offset() + sum((n - 1) * st for n, st in zip(t.shape, t.stride()))


# [Note: a graph on copies reads settled inputs in place]: the outputs of every live recording, by storage (each
# recording's static outputs live as long as it does; an alias of one moved onto a copy has another storage)
_recorded_outputs: "weakref.WeakValueDictionary[int, torch.Tensor]" = weakref.WeakValueDictionary()


def _recorded_output(x: torch.Tensor) -> bool:
    """Is ``x`` on the storage of a live recording's output (written at the same address at every replay)?"""
    return _recorded_outputs.get(x.untyped_storage().data_ptr()) is not None


class _Recording:
    """One CUDA graph and the static outputs it writes.

    [Note: outputs of a replay] Each replay writes the same output buffers.  The caller gets an alias of each
    (a second tensor on the same storage, no copy), and may keep it: before the next replay overwrites the
    buffer, an alias still alive is moved onto a copy of its values (``set_``: the caller's tensor object
    keeps its values, only its storage changes), and one that was dropped costs nothing.  The usual
    ``out = model(x)`` loop holds the previous output during the call, so it pays one copy; a caller that
    drops outputs first pays none.  If the caller holds views of an output (which cannot be moved), the call
    runs without the graph, on fresh buffers.  Outputs that share storage with an input or with each other
    are handed out as copies."""

    def __init__(self, graph: torch.cuda.CUDAGraph, outputs: list[torch.Tensor], inputs: list[torch.Tensor]):
        self.graph = graph
        storages = [o.untyped_storage().data_ptr() for o in outputs]
        taken = {x.untyped_storage().data_ptr() for x in inputs}
        self.aliased = [storages.count(p) == 1 and p not in taken for p in storages]
        # An output that is a view of a buffer of the module's (a reshape of a matrix product's result) keeps
        # that buffer's tensor alive as its base, which would count as a view the caller holds: before each
        # replay the call would run without the graph (a GPT forward's every call).  The recording keeps the
        # output's memory through a tensor of its own instead, and the base goes.
        self.outputs = [_without_base(o) if alias else o for o, alias in zip(outputs, self.aliased)]
        self.handed: list[weakref.ref | None] = [None] * len(outputs)
        self.of_input = [_view_of_input(o, inputs) for o in outputs]
        for o, alias in zip(self.outputs, self.aliased):
            if alias:  # (outputs handed out as copies are never read where they lie)
                _recorded_outputs[o.untyped_storage().data_ptr()] = o

    def release_outputs(self) -> bool:
        """Make the static outputs free to overwrite; False if the caller holds a view we cannot move."""
        for k, ref in enumerate(self.handed):
            if ref is None:
                continue
            static, alias = self.outputs[k], ref()
            holders = _storage_uses(static) - 2  # minus the static tensor itself and the count's own reference
            if alias is None:
                if holders:
                    return False
                self.handed[k] = None
                continue
            if holders != 1:
                return False
            copy = alias.clone()
            version = alias._version
            # (without grad mode: recorded by autograd, ``set_`` would replace the output's grad_fn, and a
            # gradient taken through the moved output later would find no backward)
            with torch.inference_mode(alias.is_inference()), torch.no_grad():
                alias.set_(copy.untyped_storage(), copy.storage_offset(), copy.shape, copy.stride())
            _keep_version(alias, version)
            self.handed[k] = None
        return True

    def replay(self, inputs: list[torch.Tensor]) -> None:
        """Replay the graph (``inputs``: the call's, which an emulated graph reads where a CUDA graph would)."""
        if isinstance(self.graph, _EmulatedGraph):
            self.graph.replay(inputs)
        else:
            self.graph.replay()

    def holds_aliases(self) -> bool:
        """Has an output been handed out as an alias that may still be alive (not yet released)?"""
        return any(ref is not None for ref in self.handed)

    def hand_out(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The call's outputs (``inputs``: the call's).  [Note: outputs that are inputs] An output that views
        one of the graph's inputs (a training forward returns the parameters and the batch its backward needs) is
        that view of the caller's input, as a plain call returns it - not a copy of the graph's buffer: a copy
        would cost each parameter's bytes at every step, and the backward, seeing a new address each step, would
        copy it once more instead of reading it in place."""
        result = []
        for k, (o, alias_ok) in enumerate(zip(self.outputs, self.aliased)):
            source = self.of_input[k]
            if source is not None:
                j, stride, delta = source
                x = inputs[j]
                if x.stride() == stride:
                    result.append(x.detach().as_strided(o.shape, o.stride(), x.storage_offset() + delta))
                    continue
            if alias_ok:
                alias = o.detach()
                self.handed[k] = weakref.ref(alias)
                result.append(alias)
            else:
                result.append(o.clone())
        return result


class _EmulatedGraph:
    """[Note: CUDA graphs emulated on the CPU] ``Config.emulate_cuda_graphs`` runs GraphReplay's logic - graphs
    keyed by input addresses, graphs on copies reading settled inputs in place, outputs handed out as aliases and
    moved before the next replay - over CPU modules, so that tests and ``benchmarks/cuda_graph_replays.py`` can
    see, without a GPU, which calls of a real workload (a training loop, a decoding loop) replay and which run
    plainly or record again.  A CUDA graph's replay reruns the recorded kernels at the recorded addresses: it
    reads the input buffers as they are at the replay and writes the same output buffers every time.  This
    stands in for one: ``replay`` reruns the module on what lies at the recorded input addresses and copies its
    results into the recorded outputs.  Not emulated: intermediates in a private memory pool (the module allocates as it
    always does), and an output that views an input the graph updates views a copy of it here (the recording
    run works on copies of updated inputs, as the real warm-up does, so that the update happens once, at the
    replay).  Slower than a plain call (a copy per output): for diagnosis and tests, never for speed."""

    def __init__(self, module: Callable, inputs: list[torch.Tensor], outputs: list[torch.Tensor]):
        self.module = module
        # what a CUDA graph keeps of its inputs is their addresses: a reference would keep a caller's tensor
        # alive, and follow it where ``set_`` moves it (a held output moved onto a copy), where the graph does not
        self.addresses = [(x.data_ptr(), x.stride()) for x in inputs]
        self.inputs = [weakref.ref(x) for x in inputs]  # (alive and in place: GraphReplay's copies)
        self.outputs = outputs

    @classmethod
    def record(cls, module: Callable, inputs: list[torch.Tensor], updated: list[int]) -> "_Recording":
        outputs = list(module([x.clone() if k in updated else x for k, x in enumerate(inputs)]))
        # A CPU module keeps its latest output buffers for reuse ([Note: output recycling]): one kept there would
        # count as a view the caller holds, and a later call could write over it.  A CUDA graph's outputs belong
        # to the graph alone: so do these (only the recycling is dropped - anything else of the module's that
        # holds an output's memory stays visible, as it would on the GPU).
        storages = {o.untyped_storage().data_ptr() for o in outputs}
        for pool in getattr(module, "_pools", ()):
            pool[:] = [t for t in pool if t.untyped_storage().data_ptr() not in storages]
        recording = _Recording(cls(module, inputs, []), outputs, inputs)
        recording.graph.outputs = recording.outputs
        return recording

    def replay(self, inputs: list[torch.Tensor]) -> None:
        """Rerun the module on what lies at the recorded addresses: the call's input where it is there (a graph
        on the caller's buffers, an input read in place), else the tensor recorded there (a copy of GraphReplay's).
        An address holding neither is one a CUDA graph would read stale or freed memory at: an error here."""
        read = []
        for k, (address, ref) in enumerate(zip(self.addresses, self.inputs)):
            x = inputs[k] if (inputs[k].data_ptr(), inputs[k].stride()) == address else ref()
            if x is None or (x.data_ptr(), x.stride()) != address:
                raise RuntimeError(f"kiln: an emulated CUDA graph's input {k} is no longer at the address it was "
                                   f"recorded with: a CUDA graph would read stale memory there")
            read.append(x)
        for static, value in zip(self.outputs, self.module(read)):
            if static.data_ptr() != value.data_ptr() or static.stride() != value.stride():
                # written through a tensor of its own: a CUDA graph's replay bumps no version counter, and the
                # outputs' aliases share the static tensor's (autograd saved them: a bump would fail the backward)
                writer = torch.empty(0, dtype=static.dtype)
                writer.set_(static.untyped_storage(), static.storage_offset(), static.shape, static.stride())
                for d, step in enumerate(static.stride()):  # (an expanded output: its buffer's elements once)
                    if step == 0:
                        writer, value = writer.narrow(d, 0, min(1, writer.shape[d])), \
                            value.narrow(d, 0, min(1, value.shape[d]))
                writer.copy_(value)
                del writer


def _keep_version(t: torch.Tensor, version: int) -> None:
    """Put ``t``'s version counter back after ``set_`` moved it onto a copy of its own values: autograd saved it
    for a backward (a training forward's output, read by the loss's backward; gradient accumulation's first
    forward, whose activations the second forward's replay moves) and would refuse the tensor as modified in
    place, though no value changed."""
    if t.is_inference() or t._version == version:
        return
    setter = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)
    if setter is None:
        return
    try:
        setter((t,), (version,))
    except TypeError:  # (an older signature: one tensor, one version)
        setter(t, version)


@contextlib.contextmanager
def _cublas_workspaces_cleared() -> Iterator[None]:
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    try:
        yield
    finally:
        if clear is not None:
            clear()


_capture_streams: dict[torch.device, torch.cuda.Stream] = {}


def _capture_stream(device: torch.device) -> torch.cuda.Stream:
    """One side stream per device for every recording: cuBLAS keeps a workspace (32 MiB on Hopper) per
    stream it has run on, so a fresh stream per graph would hold one more workspace each time."""
    if device not in _capture_streams:
        _capture_streams[device] = torch.cuda.Stream(device)
    return _capture_streams[device]


def with_cuda_graph(module: TritonGraph, report: CompileReport, mode: str,
                    on_record: Callable[[], None] | None = None, pool: GraphPool | None = None) -> Callable:
    """``module`` replayed as a CUDA graph in the modes that record one (reduce-overhead, max-autotune);
    ``on_record`` is called after each recording; ``pool``: a memory pool shared with other modules (the sizes
    of one symbolic graph)."""
    if mode in ("reduce-overhead", "max-autotune") and (module.device.type == "cuda"
                                                        or config.get().emulate_cuda_graphs):
        report.memory["cuda_graph"] = "recorded at the second call, replayed after" + (
            " (updating the caller's inputs in place)" if module.mutated_inputs else "")
        return GraphReplay(module, on_record, report, pool)
    return module
