"""Turn an optimized graph into a callable: generated kernels and extern calls over planned buffers.

Build: partition the graph (``schedule.fuse``), build kernel IR (``schedule.kernel_build``), plan the arena
(``runtime.memory``), emit one C++ unit (``codegen.cpp``), compile or load it from the cache
(``runtime.build``).  Run: fill the pointer table with this call's inputs and fresh outputs, then run the
steps in order - a C++ segment call for each run of kernels, the ATen op for each extern.
"""
from __future__ import annotations

import ctypes
import dataclasses
import sys
from typing import Any, Callable, Sequence

import torch

from kiln.codegen.cpp import native_calls, translation_unit
from kiln.frontend.extern import Baked, argument_builder, short_name
from kiln.ir.graph import Graph, Node, view_root
from kiln.ir.interp import view_function, view_layout
from kiln.ir.kernel import Kernel
from kiln.ir.ops import VIEW, Op, contiguous_strides
from kiln.ir.graph import mutates
from kiln.ir.program import ExternStep, Plan
from kiln import config
from kiln.report import CompileReport
from kiln.runtime.errors import InputMismatch
from kiln.runtime import checking, cpu_gemm, inplace, memory, native, operand_layout, profiling


_C_TYPES = {torch.float32: "float"}  # element types native calls take views of
RECYCLE_MIN_BYTES = 1 << 16  # below this, malloc serves outputs from its free lists without page faults


# library ops whose ``.out`` variant writes into a buffer we provide (so their results live in the arena)
# (not convolution: its ``.out`` is a generated wrapper that computes into a new tensor and copies)
_OUT_VARIANTS = frozenset({torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm,
                           cpu_gemm.linear_packed._opoverload.overloadpacket})  # (and its .out: cpu_gemm)


def _writes_into_arena(n: Node, escaping: set[Node]) -> bool:
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


def _storage_uses(t: torch.Tensor) -> int:
    """Owners of ``t``'s storage, counting the temporary storage object this call creates."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _made_of_constants(n: Node) -> bool:
    """Does the view chain ``n`` start at a constant (a weight)?"""
    return view_root(n).op is Op.CONSTANT


def _base(n: Node, buffer_of: dict[Node, str]) -> Node:
    """The realized node a view chain starts from."""
    while n not in buffer_of:
        n = n.inputs[0]
    return n


@dataclasses.dataclass
class Allocation:
    """A per-call buffer made right before its first writer (GPU path, see CompiledGraph.ARENA)."""
    node: Node
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    reuse: Node | None = None   # an input of the writing kernel that dies there: take its memory
    reuse_planned: bool = False  # ... and it is one of our own buffers (no need to check its storage)


class CompiledGraph:
    """The callable for one graph: ``module(inputs) -> outputs``."""

    device = torch.device("cpu")
    # [Note: arena or allocator] On the CPU the planned intermediates live in one arena kept across calls
    # (fresh pages cost a fault each with glibc's malloc).  On a GPU each planned buffer is taken from
    # PyTorch's caching allocator when it is first written and handed back after its last reader, in plan
    # order: between calls the compiled graph then holds no memory, inside a call the allocator reuses blocks
    # across kiln buffers and library results alike (an arena cannot hold cuDNN's results), and under CUDA
    # graph capture the same allocations come from the graph's private pool.
    ARENA = True

    def __init__(self, graph: Graph, plan: Plan, report: CompileReport):
        self.graph = graph
        self.name = report.name
        self.plan = plan
        report.kernels = plan.kernels
        report.plan = plan.format()
        node_of = {name: n for n, name in plan.buffer_of.items()}
        self.slot_of = {name: k for k, name in enumerate(plan.buffer_of.values())}
        self._baked: list[torch.Tensor] = []  # tensors baked into native calls: pointer-table slots after the buffers
        self.escaping = _escaping(graph)
        self.check_steps = config.get().check  # KILN_CHECK: every step compared with the reference as it runs
        self.native = self._native_calls(plan)
        report.externs = [short_name(s.node.attr("target")) for s in plan.steps if isinstance(s, ExternStep)]
        report.native_externs = [short_name(n.attr("target")) for n in self.native]
        dtype_of = {name: n.dtype for n, name in plan.buffer_of.items()}
        outputs = {plan.buffer_of[o] for o in graph.outputs if o in plan.buffer_of}
        segments, self.program = self._program(plan)
        self._segments = segments
        self._drop_after = self._releases(plan, segments, node_of)
        self._load_code(plan, segments, dtype_of, outputs, node_of, report)
        self.ptrs = (ctypes.c_void_p * max(len(self.slot_of) + len(self._baked), 1))()
        self.ptrs_addr = ctypes.addressof(self.ptrs)
        for k, t in enumerate(self._baked):
            self.ptrs[len(self.slot_of) + k] = t.data_ptr()
        self._plan_memory(plan, node_of, report)

    # ------------------------------------------------------------------ build helpers
    def _native_calls(self, plan: Plan) -> dict[Node, native.NativeCall]:
        """Externs of kiln's own libraries that the generated code calls directly (runtime/native.py), with an
        arena, fp32.  A result the caller gets (or a view of it) is written into the call's output tensor
        (``output_slots``), one with a layout of the library's into the arena."""
        if not self.ARENA or not config.get().native_calls:
            return {}
        escaping = self.escaping
        oneDNN_weights = {c.inputs[1] for c in plan.cl_convs}
        baked_slot: dict[int, int] = {}

        def layout(v: Node) -> tuple[tuple[int, ...], int] | None:
            """(strides, offset in elements) of ``v`` in its realized base's buffer."""
            base = _base(v, plan.buffer_of)
            if base in oneDNN_weights:  # held channels-last for oneDNN (_plan_memory)
                return None
            strides = plan.strides_of.get(base) or contiguous_strides(base.shape)
            chain = []
            while v is not base:
                chain.append(v)
                v = v.inputs[0]
            return view_layout(base.shape, strides, base.dtype, chain[::-1])  # None: a step copies

        def strides_of(v: Node) -> tuple[int, ...] | None:
            found = layout(v)
            return found[0] if found else None

        def pointer(v: Any, out: Node) -> str | None:
            if v is native.OUT:
                v = out
            if isinstance(v, (Baked, torch.Tensor)):  # a prepacked weight: a fixed pointer, in a slot of its own
                t = v.value if isinstance(v, Baked) else v
                if id(t) not in baked_slot:
                    baked_slot[id(t)] = len(self.slot_of) + len(self._baked)
                    self._baked.append(t)
                return f"b[{baked_slot[id(t)]}]"
            found = layout(v)
            if found is None:
                return None
            slot = self.slot_of[plan.buffer_of[_base(v, plan.buffer_of)]]
            if found[1] == 0:
                return f"b[{slot}]"
            return f"(({_C_TYPES[v.dtype]}*)b[{slot}] + {found[1]})"  # a view at an offset (q, k, v of one product)

        calls: dict[Node, native.NativeCall] = {}
        for s in plan.steps:
            n = s.node if isinstance(s, ExternStep) else None
            if n is None or not native.bindable(n) or n.dtype != torch.float32 \
                    or n not in plan.buffer_of:
                continue
            out_strides = plan.strides_of.get(n) or contiguous_strides(n.shape)
            if n in escaping and out_strides != contiguous_strides(n.shape):
                continue  # (the caller's result, written into a new or recycled contiguous tensor per call)
            call = native.bind(n, strides_of, out_strides, lambda v, n=n: pointer(v, n))
            if call is not None:
                calls[n] = call
        return calls

    def _load_code(self, plan: Plan, segments: list[list[Any]], dtype_of: dict[str, torch.dtype],
                   outputs: set[str], node_of: dict[str, Node], report: CompileReport) -> None:
        """Generate, compile (or load from the cache) and bind the kernels: here, one C++ translation unit."""
        from kiln.runtime.build import load_module
        position = {n: i for i, n in enumerate(self.graph.nodes)}
        source = translation_unit(plan.kernels, segments, self.slot_of, dtype_of, outputs, position)
        report.source = source
        module = load_module(source, name="kiln_graph")
        report.from_cache = module.from_cache
        self.lib = module.lib
        self._segment_fns = []
        self._timed_segment_fns = []  # their twins for kiln.profile (runtime/profiling.py)
        self._entry_fns = []  # one entry of a segment at a time, for KILN_CHECK (runtime/checking.py)
        for i in range(len(segments)):
            fn = getattr(self.lib, f"kiln_segment_{i}")
            fn.argtypes = [ctypes.c_void_p]
            fn.restype = None
            self._segment_fns.append(fn)
            timed = getattr(self.lib, f"kiln_segment_{i}_timed")
            timed.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
            timed.restype = None
            self._timed_segment_fns.append(timed)
            entry = getattr(self.lib, f"kiln_segment_{i}_entry")
            entry.argtypes = [ctypes.c_void_p, ctypes.c_int]
            entry.restype = None
            self._entry_fns.append(entry)
        natives = native_calls(segments)
        self.lib.kiln_set_native.argtypes = [ctypes.c_int, ctypes.c_void_p]
        for i, call in enumerate(natives):
            self.lib.kiln_set_native(i, call.function)
        self.lib.kiln_set_threads.argtypes = [ctypes.c_int]
        self._threads = -1

    def _releases(self, plan: Plan, segments: list[list[Any]], node_of: dict[str, Node]) -> list[list[Node]]:
        """Per program step, the per-call values (library results, cached views) no later step reads.

        [Note: releasing library results] Results of extern calls that are not planned into the arena are
        tensors the library allocated for this call; dropping each after its last reader lets the allocator
        reuse the memory within the call, so peak memory follows the live set rather than the sum of all
        results (ResNet-18 batch 16 on the GPU: 77 MiB -> below eager's 61 MiB of transient memory)."""
        keep = self.escaping  # (views of outputs keep their bases)
        by_name = {k.name: k for k in plan.kernels}
        last: dict[Node, int] = {}
        for step, (kind, item) in enumerate(self.program):
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
        drop: list[list[Node]] = [[] for _ in self.program]
        for n, step in last.items():
            if n in keep or n.op in (Op.INPUT, Op.CONSTANT):
                continue
            if n.op is Op.EXTERN or n.op in VIEW or not self.ARENA:
                drop[step].append(n)
        return drop

    def _before_run(self) -> None:
        threads = torch.get_num_threads()
        if threads != self._threads:
            self.lib.kiln_set_threads(threads)
            self._threads = threads

    def _run_segment(self, index: int, env: dict[Node, torch.Tensor]) -> None:
        self._segment_fns[index](self.ptrs_addr)

    def _run_fused(self, step: Any, env: dict[Node, torch.Tensor]) -> None:
        raise NotImplementedError(f"kiln: {type(self).__name__} has no fused steps ({step})")

    def _program(self, plan: Plan) -> tuple[list[list[Any]], list[tuple[str, Any]]]:
        segments: list[list[Any]] = []
        program: list[tuple[str, Any]] = []
        for s in plan.steps:
            if isinstance(s, Kernel) or (isinstance(s, ExternStep) and s.node in self.native):
                # with an arena, a run of kernels (and of native calls: only with an arena) is one call into the
                # library; without one, each kernel is its own step, so buffers are allocated right before their
                # first writer and freed right after their last reader
                entry = s.name if isinstance(s, Kernel) else self.native[s.node]
                if self.ARENA and program and program[-1][0] == "segment":
                    segments[-1].append(entry)
                else:
                    segments.append([entry])
                    program.append(("segment", len(segments) - 1))
            elif isinstance(s, ExternStep):
                program.append(("extern", s.node))
            else:  # a step of the target's own (a matmul template with its epilogue)
                program.append(("fused", s))
        return segments, program

    def _plan_memory(self, plan: Plan, node_of: dict[str, Node], report: CompileReport) -> None:
        escaping = self.escaping
        step_index: dict[str, int] = {}
        last_use: dict[str, int] = {}
        for k, s in enumerate(plan.steps):
            if isinstance(s, ExternStep):
                if _writes_into_arena(s.node, escaping) or (s.node in self.native and s.node not in escaping):
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
                last_use[plan.buffer_of[_base(i, plan.buffer_of)]] = k
        intervals = []
        for name, start in step_index.items():
            n = node_of[name]
            if n in escaping:  # the caller holds it (or a view of it) after the call: a per-call buffer
                continue
            nbytes = n.numel * torch.empty((), dtype=n.dtype).element_size()
            intervals.append(memory.Interval(name, nbytes, start, last_use.get(name, start)))
        mplan = memory.plan(intervals)
        report.memory = {"arena_bytes": mplan.arena_bytes, "naive_bytes": mplan.naive_bytes,
                         "buffers": len(intervals), "summary": mplan.describe()}
        self.static: dict[Node, torch.Tensor] = {}
        self.planned = {node_of[name] for name in mplan.offsets}
        if self.ARENA:
            self.arena = torch.empty(mplan.arena_bytes, dtype=torch.uint8, device=self.device)
            for name, off in mplan.offsets.items():
                n = node_of[name]
                size = n.numel * torch.empty((), dtype=n.dtype).element_size()
                t = self.arena[off:off + size].view(n.dtype)
                t = t.as_strided(n.shape, plan.strides_of[n]) if n in plan.strides_of else t.view(n.shape)
                self.static[n] = t
                self.ptrs[self.slot_of[name]] = t.data_ptr()
        else:
            self._alloc_before = self._allocations(plan, node_of)
            reused = sum(a.reuse is not None for step in self._alloc_before for a in step)
            report.memory["peak_bytes"] = self._planned_peak()
            report.memory["in_place"] = reused
            report.memory["summary"] += (f"; on this device taken from the caching allocator in plan order, "
                                         f"{reused} written in place, peak {report.memory['peak_bytes'] / 2**20:.2f}"
                                         f" MiB per call (kiln buffers and library results)")
        # NHWC copies of weights for the library; on a GPU only in the modes that hold copies: the copy is held
        # beside the model's own weights, while cuDNN converts a weight in the call, into memory it frees at once
        relayout = self.ARENA or (config.get().gpu_weight_copies and report.mode != "default")
        cl_weights = {c.inputs[1] for c in plan.cl_convs} if relayout else set()
        for n, name in plan.buffer_of.items():
            if n.op is Op.CONSTANT:
                t = n.attr("value").tensor.to(self.device).contiguous()  # folded scalars may sit on the CPU
                if n in cl_weights and t.dim() == 4:  # read only by the library, which prefers NHWC here
                    t = t.contiguous(memory_format=torch.channels_last)
                self.static[n] = t
                self.ptrs[self.slot_of[name]] = t.data_ptr()
        # inputs that an in-place extern updates: a contiguous copy made for the kernels is written back
        self.mutated_inputs = {i for m in self.graph.nodes if mutates(m) for i in m.inputs if i.op is Op.INPUT}
        self.input_slots = [(k, self.slot_of[plan.buffer_of[n]], n) for k, n in enumerate(self.graph.inputs)
                            if n in plan.buffer_of]
        # buffers the caller gets, filled per call: kiln's outputs, and native calls' results the caller gets or
        # views (an output that is an extern's result is the tensor the library returned)
        returned = [n for n in dict.fromkeys(self.graph.outputs) if n.op not in (Op.INPUT, Op.CONSTANT, Op.EXTERN)]
        returned += [n for n in self.graph.nodes  # bases of output views (in graph order: slots are numbered)
                     if n in escaping and n.op not in (Op.INPUT, Op.CONSTANT, Op.EXTERN) and n not in returned]
        returned += [n for n in self.native if n in escaping and n not in returned]
        self.output_slots = [(n, self.slot_of[plan.buffer_of[n]]) for n in returned if n in plan.buffer_of]
        self._pools: list[list[torch.Tensor]] = [[] for _ in range(len(self.output_slots))]
        self._view_fns: dict[Node, Callable[[torch.Tensor], torch.Tensor]] = {}
        self._arg_builders: dict[Node, Callable[[list[torch.Tensor]], tuple[list, dict]]] = {}
        self._extern_calls: dict[Node, Callable[..., torch.Tensor | None]] = {}

    def _allocations(self, plan: Plan, node_of: dict[str, Node]) -> list[list[Allocation]]:
        """Per program step, the buffers it writes first (planned intermediates and the graph's outputs), each
        allocated right before that step, or taking the memory of an input that dies there (``reuse``)."""
        by_name = {k.name: k for k in plan.kernels}
        buf_of = plan.buffer_of
        # outputs (and bases of output views) kiln writes (library results arrive allocated; a fused step writes
        # its matmul's own result)
        fused = {s.node for kind, s in self.program if kind == "fused" and s.epilogue is None}
        outputs = {n for n in self.escaping
                   if n in buf_of and (n.op not in (Op.INPUT, Op.CONSTANT, Op.EXTERN) or n in fused)}
        alloc: list[list[Allocation]] = [[] for _ in self.program]
        done: set[Node] = set()
        taken: set[Node] = set()
        for step, (kind, item) in enumerate(self.program):
            dying = set(self._drop_after[step])
            if kind == "segment":
                kernels = [by_name[name] for name in self._segments[item]]
                written = [node_of[b] for k in kernels for b in sorted(k.buffers()[1])]
            elif kind == "fused":
                # in place only over the epilogue's own inputs, never over the matmul's operands: other
                # programs read an operand's rows and columns until they finish
                kernels = [item.epilogue] if item.epilogue is not None else []
                written = [node_of[b] for b in sorted(item.buffers()[1])]
                dying -= {_base(i, buf_of) for i in item.node_inputs}
            else:
                kernels, written = [], [item]
            for n in written:
                if (n not in self.planned and n not in outputs) or n in done:
                    continue
                done.add(n)
                strides = plan.strides_of.get(n) or contiguous_strides(n.shape)
                reuse = None
                if len(kernels) == 1:
                    for b in inplace.overwritable_inputs(kernels[0], buf_of[n]):
                        m = node_of[b]
                        if (m in dying and m not in taken and m.op not in (Op.INPUT, Op.CONSTANT)
                                and m.numel == n.numel and m.dtype.itemsize == n.dtype.itemsize):
                            reuse = m
                            taken.add(m)
                            break
                alloc[step].append(Allocation(n, n.shape, strides, n.dtype, reuse, reuse in self.planned))
        return alloc

    def _planned_peak(self) -> int:
        """Bytes of per-call buffers live at once, walking the program: kiln's buffers and library results
        (not the libraries' own workspaces)."""
        live: dict[Node, int] = {}
        peak = 0
        for step, (kind, item) in enumerate(self.program):
            for a in self._alloc_before[step]:
                live[a.node] = live.pop(a.reuse) if a.reuse is not None else a.node.numel * a.dtype.itemsize
            if kind == "extern" and item not in self.planned and item.op is Op.EXTERN:
                live[item] = item.numel * item.dtype.itemsize
            peak = max(peak, sum(live.values()))
            for n in self._drop_after[step]:
                live.pop(n, None)
        return peak

    def _allocate(self, a: "Allocation", env: dict[Node, torch.Tensor]) -> torch.Tensor:
        if a.reuse is not None:
            src = env[a.reuse]
            # a library result may share its storage (a view of another tensor): take it only when this call
            # holds the sole reference and the storage is large enough; our own buffers always qualify
            if a.reuse_planned or (_storage_uses(src) == 2 and (src.storage_offset() + src.numel())
                                   * src.element_size() <= src.untyped_storage().nbytes()):
                if src.dtype != a.dtype:
                    src = src.view(a.dtype)
                return src.as_strided(a.shape, a.strides, src.storage_offset())
        return torch.empty_strided(a.shape, a.strides, dtype=a.dtype, device=self.device)

    # ------------------------------------------------------------------ run
    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if profiling.active is not None:  # kiln.profile: each step timed
            return profiling.active.run(self, inputs)
        if self.check_steps:  # KILN_CHECK: each step compared with the reference as it runs
            return checking.run_checked(self, inputs)
        return self.interpret(inputs)

    def interpret(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Run the program: segments, externs and fused steps in order, on this call's inputs."""
        env, write_back = self.start(inputs)
        alloc_before = None if self.ARENA else self._alloc_before
        for step, (kind, item) in enumerate(self.program):
            if alloc_before is not None:
                self.allocate_step(step, env)
            if kind == "segment":
                self._run_segment(item, env)
            elif kind == "fused":
                self._run_fused(item, env)
            else:
                self._run_extern(item, env)
            for n in self._drop_after[step]:
                env.pop(n, None)
        return self.finish(env, write_back)

    def run_entry(self, segment: int, k: int, env: dict[Node, torch.Tensor]) -> None:
        """Entry ``k`` of a segment alone (a kernel or a native call; KILN_CHECK's step checker)."""
        entries = getattr(self, "_entry_fns", None)
        if entries:
            entries[segment](self.ptrs_addr, k)
        else:  # (a target whose segments hold one entry each)
            self._run_segment(segment, env)

    def allocate_step(self, step: int, env: dict[Node, torch.Tensor]) -> None:
        """Without an arena: the buffers program step ``step`` writes first, allocated right before it."""
        for a in self._alloc_before[step]:
            t = env[a.node] = self._allocate(a, env)
            if a.node in self.plan.buffer_of:  # (the generated C++ reads its buffers from the table)
                self.ptrs[self.slot_of[self.plan.buffer_of[a.node]]] = t.data_ptr()

    def finish(self, env: dict[Node, torch.Tensor], write_back: list) -> list[torch.Tensor]:
        """The call's outputs, after copying results of in-place updates back into the caller's inputs."""
        for original, copy in write_back:
            original.copy_(copy)
        return [self._output(o, env) for o in self.graph.outputs]

    def start(self, inputs: Sequence[torch.Tensor]) -> tuple[dict[Node, torch.Tensor], list]:
        """The call's environment: checked inputs bound to their slots, output buffers chosen."""
        self._before_run()
        env: dict[Node, torch.Tensor] = dict(self.static)
        ptrs = self.ptrs
        write_back: list[tuple[torch.Tensor, torch.Tensor]] = []
        for k, slot, n in self.input_slots:
            t = inputs[k]
            if t.dtype != n.dtype or tuple(t.shape) != n.shape or t.device.type != self.device.type:
                raise InputMismatch(k, n.dtype, n.shape, self.device.type, t)
            if not t.is_contiguous():
                if n in self.mutated_inputs:
                    write_back.append((inputs[k], t.contiguous()))
                    t = write_back[-1][1]
                else:
                    t = t.contiguous()
            env[n] = t
            ptrs[slot] = t.data_ptr()
        if self.ARENA:  # (without one, outputs are allocated at their first writer, see _allocations)
            for k, (n, slot) in enumerate(self.output_slots):
                t = self._output_buffer(k, n)
                env[n] = t
                ptrs[slot] = t.data_ptr()
        return env, write_back

    # ------------------------------------------------------------------ profiling
    def peaks(self) -> Any:
        """The machine's limits this graph's steps are judged against (runtime/peaks.py)."""
        from kiln.runtime import peaks
        return peaks.cpu(torch.get_num_threads())

    def step_costs(self) -> dict[Any, list[tuple[int, str, str, float, float]]]:
        """Per program step (``("segment", i)``, ``("extern", node)``, ``("fused", id(step))``): its entries as
        (index, name, kind, FLOPs, bytes), numbered in program order (kiln.profile)."""
        if getattr(self, "_step_costs", None) is None:
            self._step_costs = profiling.step_costs(self)
        return self._step_costs

    def _output_buffer(self, k: int, n: Node) -> torch.Tensor:
        """A tensor for output ``k``: a previous output that the caller has dropped, else a new one.

        [Note: output recycling] With glibc's malloc a large new tensor faults in every page on each call
        (about 1.8 us per 4 KiB page here).  We keep the last two outputs of each slot; one that nobody but us
        references any more (Python refcount, and no views of its storage) is reused.  Nothing can observe the
        overwrite, since nothing else holds the tensor or its storage.
        """
        pool = self._pools[k]
        for i in range(len(pool)):
            # references: the pool list and getrefcount's argument
            if sys.getrefcount(pool[i]) == 2 and _storage_uses(pool[i]) == 2:
                return pool[i]
        strides = self.plan.strides_of.get(n) or contiguous_strides(n.shape)
        t = torch.empty_strided(n.shape, strides, dtype=n.dtype, device=self.device)
        if t.numel() * t.element_size() >= RECYCLE_MIN_BYTES:
            pool.append(t)
            del pool[:-2]
        return t

    def _value(self, n: Node, env: dict[Node, torch.Tensor]) -> torch.Tensor:
        if n in env:
            return env[n]
        if n.op in VIEW:  # a view chain handed to an extern without a copy (kept for this call's other users)
            source = self._value(n.inputs[0], env)
            value = env[n] = self._view_fn(n)(source)
            # the same every call: a view of a buffer held across calls (a weight, an arena buffer), or anything
            # made of a weight.  Not a reshape that copies an arena buffer: that copy is this call's snapshot.
            if n.inputs[0] in self.static and (_made_of_constants(n) or value.untyped_storage().data_ptr()
                                               == source.untyped_storage().data_ptr()):
                self.static[n] = value
            return value
        raise KeyError(f"kiln runtime: no value for {n}")

    def _view_fn(self, n: Node) -> Callable[[torch.Tensor], torch.Tensor]:
        """The view node ``n`` applies to its input (built once)."""
        fn = self._view_fns.get(n)
        if fn is None:
            fn = self._view_fns[n] = view_function(n)
        return fn

    def _extern_args(self, n: Node, env: dict[Node, torch.Tensor]) -> tuple[list, dict]:
        """(args, kwargs) of extern node ``n``'s call on this call's values (the builder made once)."""
        build = self._arg_builders.get(n)
        if build is None:
            build = self._arg_builders[n] = argument_builder(n.attr("template"))
        return build([self._value(i, env) for i in n.inputs])

    def _run_extern(self, n: Node, env: dict[Node, torch.Tensor]) -> None:
        values = [self._value(i, env) for i in n.inputs]
        if n in self.planned:  # the library writes straight into the planned buffer
            self._extern_call(n)(env[n], *values)
            return
        out = env[n] = self._extern_call(n)(None, *values)
        self.ptrs[self.slot_of[self.plan.buffer_of[n]]] = out.data_ptr()

    def _extern_call(self, n: Node) -> Callable[..., torch.Tensor | None]:
        """``call(out, *inputs)``: extern node ``n``'s library call (built once; the generated GPU wrapper calls
        it too).  ``out`` is the planned buffer the library writes into, or None: then the result is returned,
        in the strides the kernels read it with."""
        call = self._extern_calls.get(n)
        if call is not None:
            return call
        build = argument_builder(n.attr("template"))
        target = n.attr("target")
        # a channels-last input makes the library's result channels-last too (with an NCHW weight and input it
        # would be NCHW, and copied to the layout the kernels read: the graph's first convolution)
        channels_last = n in self.plan.cl_convs
        out_index = n.attr("out_index")
        strides = self.plan.strides_of.get(n)

        # a half-precision CPU bmm: operand layouts measured on the first call (runtime/operand_layout.py)
        layout = operand_layout.LayoutChoice() if operand_layout.applies(target, n.dtype, self.device) else None

        def call(out: torch.Tensor | None, *values: torch.Tensor) -> torch.Tensor | None:
            args, kwargs = build(values)
            if channels_last:
                args[0] = args[0].contiguous(memory_format=torch.channels_last)
            if layout is not None:
                args = layout(args, lambda a: target(*a, **kwargs))
            if out is not None:
                target.overloadpacket.out(*args, **kwargs, out=out)
                return None
            result = target(*args, **kwargs)
            if out_index is not None:
                result = result[out_index]
            if strides is None:
                return result if result.is_contiguous() else result.contiguous()
            if result.stride() != strides:  # kernels read it through these strides
                result = torch.empty_strided(result.shape, strides, dtype=result.dtype,
                                             device=result.device).copy_(result)
            return result
        self._extern_calls[n] = call
        return call

    def _output(self, n: Node, env: dict[Node, torch.Tensor]) -> torch.Tensor:
        if n.op is Op.CONSTANT:
            return env[n].clone()
        if n in self.plan.strides_of:  # a library's channels-last result: the caller gets eager's layout
            return env[n].contiguous()
        base = n
        while base.op in VIEW and base not in env:
            base = base.inputs[0]
        if base is not n and base in self.plan.strides_of:
            # a view of such a result (flatten, permute, slice): eager's strides are the view's of a contiguous
            # base, so the view is taken of a contiguous copy
            return self._view_of_contiguous(n, base, env)
        return self._value(n, env)

    def _view_of_contiguous(self, n: Node, base: Node, env: dict[Node, torch.Tensor]) -> torch.Tensor:
        if n is base:
            return env[n].contiguous()
        return self._view_fn(n)(self._view_of_contiguous(n.inputs[0], base, env))
