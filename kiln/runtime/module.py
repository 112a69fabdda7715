"""Run a Program (``schedule/program.py``): generated kernels and extern calls over planned buffers.

Build: emit one C++ unit for the plan's kernels and segments (``codegen.cpp``), compile or load it from the
cache (``runtime.build``), make the arena and the constants real.  Run: fill the pointer table with this call's
inputs and fresh outputs, then run the steps in order - a C++ segment call for each run of kernels (and native
calls), the ATen op for each extern.  Nothing here decides a step, a layout or a buffer.
"""
from __future__ import annotations

import ctypes
import sys
from typing import Any, Callable, Sequence

import torch

from kiln.codegen.cpp import native_calls, translation_unit
from kiln import config
from kiln.ir.extern import argument_builder, fast_callable, restrided, short_name, sibling_outputs
from kiln.ir.graph import Graph, Node, view_root
from kiln.ir.interp import view_chain, view_function
from kiln.ir.ops import VIEW, Op, contiguous_strides
from kiln.ir.program import Allocation, ExternStep, Plan
from kiln.report import CompileReport
from kiln.runtime import checking, operand_layout, profiling
from kiln.runtime.errors import InputMismatch


RECYCLE_MIN_BYTES = 1 << 16  # below this, malloc serves outputs from its free lists without page faults


def _storage_uses(t: torch.Tensor) -> int:
    """Owners of ``t``'s storage, counting the temporary storage object this call creates."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _made_of_constants(n: Node) -> bool:
    """Does the view chain ``n`` start at a constant (a weight)?"""
    return view_root(n).op is Op.CONSTANT


class CompiledGraph:
    """The callable for one graph: ``module(inputs) -> outputs``."""

    device = torch.device("cpu")  # (a target's own subclass runs on its device)
    # (memory: with an arena or per-call allocations, see [Note: arena or allocator] in schedule/program.py)

    def __init__(self, graph: Graph, program: Any, report: CompileReport, size_slot: dict[str, int] | None = None,
                 position: dict[Node, int] | None = None, shared_code: dict[str, Any] | None = None,
                 size_table: Sequence[int] = ()):
        """``program``: a ``schedule.program.Program`` - every step, slot and buffer decided.  ``size_slot``: the
        size table's slots of a symbolic graph's kernels ([Note: symbolic kernels]), ``size_table`` the table
        of this module's sizes (the sizes in their slots, then the native calls' arguments: [Note: native calls at
        any size]; runtime/dynamic.py); ``position``: graph positions of the kernels' nodes (named in the source's
        comments), when they are not ``graph``'s own; ``shared_code``: the loaded code of another module with the
        same source (a symbolic graph's modules per size share it: written and loaded once)."""
        plan = program.plan
        self.size_slot = size_slot
        self._size_table = (ctypes.c_int64 * max(len(size_table), 1))(*size_table)
        self._size_table_addr = ctypes.addressof(self._size_table)
        self._position = position
        self._shared_code = shared_code
        self.graph = graph
        self.name = report.name
        self.mode = report.mode  # (what a library call's entry may weigh: host time in default mode)
        self.plan = plan
        self.laid_out_outputs = plan.laid_out  # ([Note: saved activations channels-last])
        # inputs that come in a layout of their own, and those strides ([Note: saved activations channels-last])
        self.input_strides = {n: plan.strides_of[n] for n in graph.inputs if n in plan.strides_of}
        self.arena_mode = program.arena
        report.kernels = plan.kernels
        report.plan = program.format() if shared_code is None or "module" not in shared_code else ""
        node_of = program.node_of()
        self.slot_of = program.slot_of
        self._baked = program.baked
        self.escaping = program.escaping
        self.check_steps = config.get().check  # KILN_CHECK: every step compared with the reference as it runs
        self.native = program.native
        report.externs = [short_name(s.node.attr("target")) for s in plan.steps if isinstance(s, ExternStep)]
        report.native_externs = [short_name(n.attr("target")) for n in self.native]
        dtype_of = {name: n.dtype for n, name in plan.buffer_of.items()}
        outputs = {plan.buffer_of[o] for o in graph.outputs if o in plan.buffer_of}
        self.segments, self.program = program.segments, program.steps
        self.drop_after = program.drop_after
        self._load_code(plan, self.segments, dtype_of, outputs, node_of, report)
        self.ptrs = (ctypes.c_void_p * max(len(self.slot_of) + len(self._baked), 1))()
        self.ptrs_addr = ctypes.addressof(self.ptrs)
        for k, t in enumerate(self._baked):
            self.ptrs[len(self.slot_of) + k] = t.data_ptr()
        self._bind_memory(program, report)

    # ------------------------------------------------------------------ build helpers
    def _load_code(self, plan: Plan, segments: list[list[Any]], dtype_of: dict[str, torch.dtype],
                   outputs: set[str], node_of: dict[str, Node], report: CompileReport) -> None:
        """Generate, compile (or load from the cache) and bind the kernels: here, one C++ translation unit."""
        from kiln.runtime.build import load_module
        shared = self._shared_code
        if shared is not None and "module" in shared:
            module = shared["module"]
            report.source = shared["source"]
        else:
            position = self._position or {n: i for i, n in enumerate(self.graph.nodes)}
            source = translation_unit(plan.kernels, segments, self.slot_of, dtype_of, outputs, position,
                                      self.size_slot)
            report.source = source
            module = load_module(source, name="kiln_graph")
            if shared is not None:
                shared.update(module=module, source=source)
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
        if self.size_slot is None:  # (a symbolic graph's calls read their functions from its size table)
            natives = native_calls(segments)
            self.lib.kiln_set_native.argtypes = [ctypes.c_int, ctypes.c_void_p]
            for i, call in enumerate(natives):
                self.lib.kiln_set_native(i, call.function)
        else:
            self.lib.kiln_set_sizes.argtypes = [ctypes.c_void_p]
        self.lib.kiln_set_threads.argtypes = [ctypes.c_int]
        self._threads = -1

    def _before_run(self) -> None:
        if self.size_slot is not None:  # (the modules of a symbolic graph's sizes share one library)
            self.lib.kiln_set_sizes(self._size_table_addr)
        threads = torch.get_num_threads()
        if threads != self._threads:
            self.lib.kiln_set_threads(threads)
            self._threads = threads

    def run_segment(self, index: int, env: dict[Node, torch.Tensor]) -> None:
        self._segment_fns[index](self.ptrs_addr)

    def run_fused(self, step: Any, env: dict[Node, torch.Tensor]) -> None:
        raise NotImplementedError(f"kiln: {type(self).__name__} has no fused steps ({step})")

    def _bind_memory(self, program: Any, report: CompileReport) -> None:
        """The program's memory made real: the arena and its views (CPU), the constants, the output pools."""
        plan = program.plan
        report.memory = dict(program.memory)
        self.static: dict[Node, torch.Tensor] = {}
        self.planned = program.planned
        self.alloc_before = program.alloc_before
        if program.arena:
            self.arena = torch.empty(program.arena_bytes, dtype=torch.uint8, device=self.device)
            for n, off in program.offsets.items():
                size = n.numel * torch.empty((), dtype=n.dtype).element_size()
                t = self.arena[off:off + size].view(n.dtype)
                t = t.as_strided(n.shape, plan.strides_of[n]) if n in plan.strides_of else t.view(n.shape)
                self.static[n] = t
                self.ptrs[self.slot_of[plan.buffer_of[n]]] = t.data_ptr()
        # NHWC copies of weights for the library (a GPU compile that may not hold copies had its kernels copy
        # them: schedule/layout.relayout_copies; those left are weights whose NHWC layout is their NCHW one)
        cl_weights = {c.inputs[1] for c in plan.cl_convs}
        for n, name in plan.buffer_of.items():
            if n.op is Op.CONSTANT:
                t = n.attr("value").tensor.to(self.device).contiguous()  # folded scalars may sit on the CPU
                if n in cl_weights and t.dim() == 4:  # read only by the library, which prefers NHWC here
                    t = t.contiguous(memory_format=torch.channels_last)
                self.static[n] = t
                self.ptrs[self.slot_of[name]] = t.data_ptr()
        self.mutated_inputs = program.mutated_inputs
        self.input_slots = program.input_slots
        self.output_slots = program.output_slots
        self._pools: list[list[torch.Tensor]] = [[] for _ in range(len(self.output_slots))]
        self._view_fns: dict[Node, Callable[[torch.Tensor], torch.Tensor]] = {}
        self._arg_builders: dict[Node, Callable[[list[torch.Tensor]], tuple[list, dict]]] = {}
        self._extern_calls: dict[Node, Callable[..., torch.Tensor | None]] = {}
        # [Note: one call for a multi-output extern]: follower -> leader; leader -> its last follower (which lets
        # the result go); each leader's result of this call
        self.sibling_of = sibling_outputs(s.node for s in plan.steps if isinstance(s, ExternStep))
        self.last_sibling = {lead: follower for follower, lead in self.sibling_of.items()}
        self._sibling_results: dict[Node, Any] = {}
        self._lean = self._lean_call()

    def allocate(self, a: Allocation, env: dict[Node, torch.Tensor]) -> torch.Tensor:
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
        profile = profiling.current()
        if profile is not None:  # kiln.profile: each step timed
            return profile.run(self, inputs)
        if self.check_steps:  # KILN_CHECK: each step compared with the reference as it runs
            return checking.run_checked(self, inputs)
        lean = self._lean
        if lean is not None:
            return lean(inputs)
        return self.interpret(inputs)

    def _lean_call(self) -> Callable[[Sequence[torch.Tensor]], list[torch.Tensor]] | None:
        """The call without the interpreter, for a program of C++ segments alone (every library call made from
        the generated code) over an arena, on the CPU: or None where that does not hold.

        [Note: lean call] ``interpret`` keeps an environment of every value (for Python extern calls and view
        chains), checks inputs through ``start`` and reads outputs through ``output_value``: 7-9 us of a call on
        a small graph, against Inductor's generated Python call.  When the C++ reads every buffer from the pointer
        table, a call only has to check and bind the inputs, take output buffers and run the segments.  Each
        graph output is then an output buffer or a reshape/permute/expand chain of one (outputs that are inputs,
        constants or re-laid-out library results keep the interpreter).  Anything unusual in a call - a dtype,
        shape or device other than compiled for, a non-contiguous input - goes to ``interpret``, which copies or
        raises as before.
        """
        if (self.device.type != "cpu" or not self.arena_mode or not self.program
                or any(kind != "segment" for kind, _ in self.program)):
            return None
        buffer_index = {n: k for k, (n, _) in enumerate(self.output_slots)}
        returns = []  # per graph output: (output buffer index, its view functions, innermost first)
        for o in self.graph.outputs:
            base, chain = view_chain(o, lambda n: n in buffer_index or n.op not in VIEW)
            if base not in buffer_index or any(v.op is Op.SLICE or v in self.plan.strides_of
                                               for v in [base, *chain]):
                return None
            returns.append((buffer_index[base], [view_function(v) for v in chain]))
        checks = [(k, slot, n.dtype, torch.Size(n.shape)) for k, slot, n in self.input_slots]
        outputs = [(k, slot, n) for k, (n, slot) in enumerate(self.output_slots)]
        segments = [self._segment_fns[i] for _, i in self.program]
        ptrs, addr, output_buffer, interpret = self.ptrs, self.ptrs_addr, self._output_buffer, self.interpret

        def lean(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            self._before_run()
            for k, slot, dtype, shape in checks:
                t = inputs[k]
                if t.dtype is not dtype or t.shape != shape or not t.is_cpu or not t.is_contiguous():
                    return interpret(inputs)  # (raises InputMismatch, or copies a strided input)
                ptrs[slot] = t.data_ptr()
            buffers = []
            for k, slot, n in outputs:
                t = output_buffer(k, n)
                buffers.append(t)
                ptrs[slot] = t.data_ptr()
            for segment in segments:
                segment(addr)
            result = []
            for k, views in returns:
                t = buffers[k]
                for view in views:
                    t = view(t)
                result.append(t)
            return result
        return lean

    def interpret(self, inputs: Sequence[torch.Tensor], around: Callable[..., None] | None = None
                  ) -> list[torch.Tensor]:
        """Run the program: segments, externs and fused steps in order, on this call's inputs.  ``around(kind,
        item, run)`` (kiln.profile's timer) is called for each step instead of ``run()``, which runs it."""
        env, write_back = self.start(inputs)
        alloc_before = None if self.arena_mode else self.alloc_before
        for step, (kind, item) in enumerate(self.program):
            if alloc_before is not None:
                self.allocate_step(step, env)
            if around is None:
                self.run_step(kind, item, env)
            else:
                around(kind, item, lambda kind=kind, item=item: self.run_step(kind, item, env))
            for n in self.drop_after[step]:
                env.pop(n, None)
        return self.finish(env, write_back)

    def run_step(self, kind: str, item: Any, env: dict[Node, torch.Tensor]) -> None:
        """One program step: a segment (by index), a fused step, or an extern call (its node)."""
        if kind == "segment":
            self.run_segment(item, env)
        elif kind == "fused":
            self.run_fused(item, env)
        else:
            self.run_extern(item, env)

    def run_entry(self, segment: int, k: int, env: dict[Node, torch.Tensor]) -> None:
        """Entry ``k`` of a segment alone (a kernel or a native call; KILN_CHECK's step checker)."""
        entries = getattr(self, "_entry_fns", None)
        if entries:
            entries[segment](self.ptrs_addr, k)
        else:  # (a target whose segments hold one entry each)
            self.run_segment(segment, env)

    def allocate_step(self, step: int, env: dict[Node, torch.Tensor]) -> None:
        """Without an arena: the buffers program step ``step`` writes first, allocated right before it."""
        for a in self.alloc_before[step]:
            t = env[a.node] = self.allocate(a, env)
            if a.node in self.plan.buffer_of:  # (the generated C++ reads its buffers from the table)
                self.ptrs[self.slot_of[self.plan.buffer_of[a.node]]] = t.data_ptr()

    def finish(self, env: dict[Node, torch.Tensor], write_back: list) -> list[torch.Tensor]:
        """The call's outputs, after copying results of in-place updates back into the caller's inputs."""
        for original, copy in write_back:
            original.copy_(copy)
        return [self.output_value(o, env) for o in self.graph.outputs]

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
            strides = self.input_strides.get(n)  # (its kernels read it in these strides, else contiguous)
            if t.stride() != strides if strides is not None else not t.is_contiguous():
                t = restrided(t, strides) if strides is not None else t.contiguous()
                if n in self.mutated_inputs:
                    write_back.append((inputs[k], t))
            env[n] = t
            ptrs[slot] = t.data_ptr()
        if self.arena_mode:  # (without one, outputs are allocated at their first writer, see _allocations)
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
        inference = torch.is_inference_mode_enabled()
        for i in range(len(pool)):
            # references: the pool list and getrefcount's argument.  A tensor made under inference_mode is not
            # handed to a call outside it (autograd refuses to save an inference tensor: a training step after
            # a compile that measured its plans under inference_mode), nor the other way round.
            if sys.getrefcount(pool[i]) == 2 and _storage_uses(pool[i]) == 2 and pool[i].is_inference() == inference:
                return pool[i]
        strides = self.plan.strides_of.get(n) or contiguous_strides(n.shape)
        t = torch.empty_strided(n.shape, strides, dtype=n.dtype, device=self.device)
        if t.numel() * t.element_size() >= RECYCLE_MIN_BYTES:
            pool.append(t)
            del pool[:-2]
        return t

    def value(self, n: Node, env: dict[Node, torch.Tensor]) -> torch.Tensor:
        if n in env:
            return env[n]
        if n.op in VIEW:  # a view chain handed to an extern without a copy (kept for this call's other users)
            source = self.value(n.inputs[0], env)
            value = env[n] = self.view_fn(n)(source)
            # the same every call: a view of a buffer held across calls (a weight, an arena buffer), or anything
            # made of a weight.  Not a reshape that copies an arena buffer: that copy is this call's snapshot.
            if n.inputs[0] in self.static and (_made_of_constants(n) or value.untyped_storage().data_ptr()
                                               == source.untyped_storage().data_ptr()):
                self.static[n] = value
            return value
        raise KeyError(f"kiln runtime: no value for {n}")

    def view_fn(self, n: Node) -> Callable[[torch.Tensor], torch.Tensor]:
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
        return build([self.value(i, env) for i in n.inputs])

    def run_extern(self, n: Node, env: dict[Node, torch.Tensor]) -> None:
        values = [self.value(i, env) for i in n.inputs]
        if n in self.planned:  # the library writes straight into the planned buffer
            self.extern_call(n)(env[n], *values)
            return
        out = env[n] = self.extern_call(n)(None, *values)
        self.ptrs[self.slot_of[self.plan.buffer_of[n]]] = out.data_ptr()

    def extern_call(self, n: Node) -> Callable[..., torch.Tensor | None]:
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

        # a half-precision CPU bmm the compile chose to re-lay out (schedule/operand_layout.py)
        bmm_relayout = n in self.plan.bmm_relayout

        op = fast_callable(target, mode=self.mode)
        write = fast_callable(target, out=True) if n in self.planned else None  # (only planned ones have .out)
        dense = n.attr("dense_inputs")  # [Note: externs get the layouts they were traced with]
        dense = frozenset(k for k, d in enumerate(dense) if d) if dense is not None else None

        leader = self.sibling_of.get(n)
        leads = n in self.last_sibling
        last = leader is not None and self.last_sibling[leader] is n
        results = self._sibling_results

        def call(out: torch.Tensor | None, *values: torch.Tensor) -> torch.Tensor | None:
            if leader is not None:  # another output of the call its leader made in this run
                full = results.pop(leader) if last else results[leader]  # (the last one lets the result go)
                return finish(full[out_index])
            if dense:
                values = tuple(v.contiguous() if k in dense else v for k, v in enumerate(values))
            args, kwargs = build(values)
            if channels_last:
                args[0] = args[0].contiguous(memory_format=torch.channels_last)
            if bmm_relayout:
                args = operand_layout.relayout(args)
            if out is not None:
                write(*args, **kwargs, out=out)
                return None
            result = op(*args, **kwargs)
            if leads:
                results[n] = result
            if out_index is not None:
                result = result[out_index]
            return finish(result)

        def finish(result: torch.Tensor) -> torch.Tensor:
            if strides is None:
                return result if result.is_contiguous() else result.contiguous()
            if result.stride() != strides:  # kernels read it through these strides
                result = restrided(result, strides)
            return result
        self._extern_calls[n] = call
        return call

    def output_value(self, n: Node, env: dict[Node, torch.Tensor]) -> torch.Tensor:
        if n.op is Op.CONSTANT:
            return env[n].clone()
        if n in self.laid_out_outputs:  # (handed out as laid out: [Note: saved activations channels-last])
            return env[n]
        if n in self.plan.strides_of:  # a library's channels-last result: the caller gets eager's layout
            return env[n].contiguous()
        base = n
        while base.op in VIEW and base not in env:
            base = base.inputs[0]
        if base is not n and base in self.plan.strides_of:
            # a view of such a result (flatten, permute, slice): eager's strides are the view's of a contiguous
            # base, so the view is taken of a contiguous copy
            return self._view_of_contiguous(n, base, env)
        return self.value(n, env)

    def _view_of_contiguous(self, n: Node, base: Node, env: dict[Node, torch.Tensor]) -> torch.Tensor:
        if n is base:
            return env[n].contiguous()
        return self.view_fn(n)(self._view_of_contiguous(n.inputs[0], base, env))
