"""The straight-line call of a compiled GPU graph: its program written out once as Python source (a code
generator: the runtime, ``runtime/triton_module.py``, builds it once and calls it).

[Note: generated wrapper] ``CompiledGraph.__call__`` interprets the program on every call: per step it looks
values up in a dict by node, walks view chains, and asks each allocation and library call how to run.  A
small model on a GPU is host-bound in default mode (the GPU waits for the host), so that interpretation is
much of the call's time.  Here the same program becomes one Python function, as Inductor's wrapper does:
one local variable per value, allocations with literal shapes and strides, kernels and library calls through
callables prepared at build time, views of weights computed once, and ``del`` where a value dies (so peak
memory follows the same live set as the interpreted program).  The source is in the compile report.

A graph that writes to a caller's input (a static KV cache's update, ``index_put_`` into the caller's buffer)
updates it where it lies; a strided such input is updated in a contiguous copy that the call copies back at its
end ([Note: write-back of a strided input]).  Before session 35 such graphs kept the interpreted call: HF GPT-2's
static-cache decode step on the H100 took 3.07 ms a token against Inductor's 2.21.

Example (a convolution, its BatchNorm/ReLU kernel over the convolution's result in place, a flatten)::

    def call(inputs):
        v0 = inputs[0]
        if v0.dtype is not float32 or v0.shape != (2, 4, 6, 6) or v0.device.type != 'cuda':
            bad_input(0, v0, NODE_1, cuda_0)
        if not v0.is_contiguous():
            v0 = v0.contiguous()
        v3 = EXTERN_2(v0.contiguous(memory_format=torch.channels_last), CONST_3, None, [1, 1], [1, 1], [1, 1],
                      False, [0, 0], 1)  # aten.convolution.default
        if v3.stride() != (288, 1, 48, 8):
            v3 = RESTRIDE_4(v3)
        stream = STREAM_6()
        failed = LAUNCH_5(stream, v3, CONST_7, CONST_8)  # kernel_0_relu (over the convolution's result, in place)
        if failed:  # a buffer not 16-byte aligned (-> Triton's JIT entry), or a launch error
            RETRY_9(failed, (v3, CONST_7, CONST_8))
        v10 = v3.as_strided((2, 288), (288, 1))  # reshape
        ...
        return [v12]
"""
from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch

from kiln.ir.extern import Baked, InputRef, fast_callable, is_flat, restrided
from kiln.ir.graph import Node
from kiln.ir.interp import view_layout
from kiln.ir.ops import VIEW, Op, channels_last_strides, contiguous_strides

if TYPE_CHECKING:
    from kiln.ir.program import Allocation


def _is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None) -> bool:
    """Whether a value of ``shape`` laid out with ``strides`` (None: not known here) is contiguous as torch
    counts it (the stride of a dimension of size 1 does not matter)."""
    if strides is None:
        return False
    return all(s == c for d, s, c in zip(shape, strides, contiguous_strides(shape)) if d != 1)


def _literal(a: Any) -> bool:
    """Is ``repr(a)`` Python that evaluates to ``a`` (numbers, bools, None, strings and lists/tuples of them)?"""
    if a is None or isinstance(a, (bool, int, str)):
        return True
    if isinstance(a, float):
        return math.isfinite(a)
    if isinstance(a, (list, tuple)):
        return all(_literal(x) for x in a)
    return False


Launchers = Callable[[int], list[tuple[Callable, list[Node], bool, Any]]]


class _Writer:
    def __init__(self, module: Any, launchers: Launchers, fused: Callable[[Any], tuple[Callable, list[Node]]],
                 bad_input: Callable[..., None]):
        self.m = module
        self.launchers = launchers
        self.fused = fused
        self.ns: dict[str, Any] = {"bad_input": bad_input, "torch": torch}
        self.position = {n: k for k, n in enumerate(module.graph.nodes)}
        self.bound: dict[Node, str] = {}  # node -> the local or global name holding its value
        self.locals: set[str] = set()
        self.write_backs: list[str] = []  # per strided input the graph updates: (caller's tensor, copy) or None
        self.strides: dict[str, tuple[int, ...]] = {}  # local -> its strides (known when it is made)
        self.aligned: set[str] = set()  # names whose data is 16-byte aligned on every call (kernels launch direct)
        self.offsets: dict[str, int] = {}  # names whose storage offset is known when the call is written
        # [Note: loose views] name -> (shape, strides) its tensor object has; differs from the node's layout for a
        # loose name (``loose``: its own layout, given to the tensor only where something reads more than the
        # data pointer)
        self.layout: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.loose: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        self.alias_line: dict[str, tuple[int, str]] = {}  # loose name -> (index of its alias line, its source)
        self.lines: list[str] = []
        self.has_stream = False  # ``stream`` (the current CUDA stream) set in the call's code so far

    # ------------------------------------------------------------------ names
    def glob(self, value: Any, hint: str) -> str:
        if isinstance(value, (torch.dtype, torch.device)):  # shared, readable names: bfloat16, cuda_0
            name = str(value).removeprefix("torch.").replace(":", "_")
            self.ns[name] = value
            return name
        name = f"{hint}_{len(self.ns)}"
        self.ns[name] = value
        return name

    def bind(self, n: Node, strides: tuple[int, ...] | None = None) -> str:
        name = f"v{self.position[n]}"
        self.offsets.pop(name, None)
        self.bound[n] = name
        self.locals.add(name)
        self.strides[name] = tuple(strides) if strides is not None else contiguous_strides(n.shape)
        self.layout[name] = (tuple(n.shape), self.strides[name])
        self.loose.pop(name, None)
        self.alias_line.pop(name, None)
        return name

    def alias(self, target: str, src: str, shape: tuple[int, ...], strides: tuple[int, ...]) -> None:
        """``target`` (already bound, layout ``shape``/``strides``, at ``src``'s storage offset) as ``src``'s tensor
        object itself: ``target = src``, where an ``as_strided`` would cost ~1 us of host time.

        [Note: loose views] Kiln's kernels read a buffer through its data pointer alone, so a buffer that takes
        a dead buffer's memory, or a view of a value at its first element, needs no tensor of its own layout
        until something reads more than the pointer (a library call, an output, a view that copies).  Until
        then the name is *loose*: bound to the source's tensor object, its own layout remembered, and given to
        it by ``materialize`` at the first such use; a view of it is the usual one ``as_strided`` (absolute:
        shape, strides and offset), and no line at all where that layout is the tensor's own::

            before                                            after
              v137 = v123.as_strided((1, 16, 3072), ...)        v137 = v123
              LAUNCH_31(stream, v123, v137)  # GELU             LAUNCH_31(stream, v123, v137)
              v138 = v137.as_strided((16, 3072), ...)           v138 = v137
              EXTERN_OUT_36(CONST_33, v138, ...)                EXTERN_OUT_36(CONST_33, v138, ...)
        """
        self.emit(f"{target} = {src}")
        self.layout[target] = self.layout[src]
        if self.layout[target] != (shape, strides):
            self.loose[target] = (shape, strides)
            self.alias_line[target] = (len(self.lines) - 1, src)

    def materialize(self, name: str) -> str:
        """A loose name given its own layout (see ``alias``); other names as they are."""
        own = self.loose.pop(name, None)
        if own is None:
            return name
        line, src = self.alias_line.pop(name)
        if line == len(self.lines) - 1:  # used at once: its alias line becomes the as_strided itself
            code, _, comment = self.lines[line].partition("  #")
            self.lines[line] = f"{code}.as_strided({own[0]!r}, {own[1]!r})" + (f"  #{comment}" if comment else "")
        else:
            self.emit(f"{name} = {name}.as_strided({own[0]!r}, {own[1]!r})")
        self.layout[name] = own
        return name

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def value(self, n: Node, loose: bool = False) -> str:
        """The name of ``n``'s value, emitting the view lines that compute it on first use.  ``loose``: the
        caller reads only its data pointer (a kernel's argument), so a loose name stays loose ([Note: loose
        views])."""
        name = self.bound.get(n)
        if name is None:
            if n in self.m.static:
                return self.constant(n, self.m.static[n])
            if n.op not in VIEW:
                raise KeyError(f"kiln wrapper: no value for {n}")
            name = self.view(n)
        return name if loose else self.materialize(name)

    def view(self, n: Node) -> str:
        """A view chain down to a value already held, as one ``as_strided`` call: the strides and offset come
        from running the chain on a meta tensor laid out as the held value.  Where a step is not a view there
        (a reshape of a permuted tensor copies), the views before it are one ``as_strided``, the step runs as
        itself, and the views after it are one ``as_strided`` of its result::

            v89 = v88.as_strided((8, 512, 2304), (1179648, 2304, 1))  # reshape
            v94 = v89.as_strided((8, 12, 512, 64), (1179648, 64, 2304, 1), ...)  # slice reshape permute
            v99 = VIEW_19(v94)  # reshape (copies)
        """
        chain, base = [], n
        while base.op in VIEW and base not in self.bound and base not in self.m.static:
            chain.append(base)
            base = base.inputs[0]
        chain.reverse()
        src = self.value(base, loose=True)
        fns = [self.m.view_fn(v) for v in chain]
        if src not in self.locals:  # a view of a weight: the same tensor every call
            value = self.ns[src]
            for fn in fns:
                value = fn(value)
            return self.constant(n, value)
        # the longest prefix of the chain that is a view of the held value becomes one as_strided; a step that
        # copies (a reshape of a permuted value) runs as itself, and the rest is again a view of its result
        k, found = len(chain), None
        while k > 0 and (found := view_layout(base.shape, self.strides[src], base.dtype, chain[:k])) is None:
            k -= 1
        if k > 0:
            strides, offset = found
            last = chain[k - 1]
            target = self.bind(last, strides)
            if src in self.aligned and offset * last.dtype.itemsize % 16 == 0:
                self.aligned.add(target)
            if offset == 0:  # at src's first element: src's tensor object, loose ([Note: loose views])
                self.offset(src, target, 0)
                self.alias(target, src, tuple(last.shape), tuple(strides))
                self.lines[-1] += f"  # {' '.join(v.op.value for v in chain[:k])}"
            else:
                self.emit(f"{target} = {src}.as_strided({tuple(last.shape)!r}, {strides!r}"
                          f"{self.offset(src, target, offset)})  # {' '.join(v.op.value for v in chain[:k])}")
            if k == len(chain):
                return target
            src = target
        self.materialize(src)
        copy = chain[k]  # not a view of what it reads: a fresh tensor, whose strides a meta run tells
        meta = fns[k](torch.empty_strided(copy.inputs[0].shape, self.strides[src], dtype=copy.inputs[0].dtype,
                                          device="meta"))
        target = self.bind(copy, tuple(meta.stride()))
        self.emit(f"{target} = {self.glob(fns[k], 'VIEW')}({src})  # {copy.op.value} (copies)")
        return target if copy is n else self.view(n)

    def offset(self, src: str, target: str, shift: int) -> str:
        """The storage-offset argument of ``target = src.as_strided(...)``, ``shift`` elements past ``src``'s
        start: none where it is ``src``'s own (as_strided keeps it), a number where ``src``'s is known when the
        call is written (a buffer of ours starts its storage), else read per call."""
        known = self.offsets.get(src)
        if known is not None:
            self.offsets[target] = known + shift
        if not shift:
            return ""
        return f", {known + shift}" if known is not None else f", {src}.storage_offset() + {shift}"

    def constant(self, n: Node, value: torch.Tensor) -> str:
        name = self.bound[n] = self.glob(value, "CONST")
        if isinstance(value, torch.Tensor) and value.data_ptr() % 16 == 0:
            self.aligned.add(name)
        return name

    def drop(self, n: Node) -> None:
        name = self.bound.get(n)
        if name in self.locals:
            self.emit(f"del {name}")
            del self.bound[n]
            self.locals.discard(name)

    # ------------------------------------------------------------------ parts
    def inputs(self) -> None:
        m = self.m
        for k, _, n in m.input_slots:
            strides = m.input_strides.get(n)  # ([Note: saved activations channels-last])
            v = self.bind(n, strides)
            self.emit(f"{v} = inputs[{k}]")
            self.emit(f"if {v}.dtype is not {self.glob(n.dtype, 'DTYPE')} or {v}.shape != {tuple(n.shape)!r} "
                      f"or {v}.device.type != {m.device.type!r}:")
            self.emit(f"    bad_input({k}, {v}, {self.glob(n, 'NODE')}, {self.glob(m.device, 'DEVICE')})")
            if strides is not None:  # (its kernels read it in these strides: a caller's other layout is copied)
                restride = self.glob(functools.partial(restrided, strides=tuple(strides)), "RESTRIDE")
                differs, copy = f"{v}.stride() != {tuple(strides)!r}", f"{restride}({v})"
            else:
                differs, copy = f"not {v}.is_contiguous()", f"{v}.contiguous()"
            if n in m.mutated_inputs:
                # [Note: write-back of a strided input] the graph updates this input in place: one in another
                # layout is updated in a copy, copied back into the caller's tensor at the end of the call (the
                # pair is held under a name no ``del`` takes: the copy may die inside the program)
                back = f"back{k}"
                self.write_backs.append(back)
                self.emit(f"{back} = None")
                self.emit(f"if {differs}:")
                self.emit(f"    {back} = ({v}, {copy})")
                self.emit(f"    {v} = {back}[1]")
                continue
            self.emit(f"if {differs}:")
            self.emit(f"    {v} = {copy}")

    def allocation(self, a: "Allocation") -> None:
        shape, strides = tuple(a.shape), tuple(a.strides)
        if a.reuse is None:  # (the caching allocator's blocks are 512-byte aligned)
            target = self.bind(a.node, strides)
            self.aligned.add(target)
            self.offsets[target] = 0
            self.emit(f"{target} = torch.empty_strided({shape!r}, {strides!r}, "
                      f"dtype={self.glob(a.dtype, 'DTYPE')}, device={self.glob(self.m.device, 'DEVICE')})")
            return
        src = self.value(a.reuse, loose=True)
        if a.reuse_planned:  # our own buffer, dying here: its memory, under this buffer's shape and strides
            target = self.bind(a.node, strides)
            if src in self.aligned:
                self.aligned.add(target)
            if a.reuse.dtype == a.dtype:  # (the same storage offset: loose, [Note: loose views])
                self.alias(target, src, shape, strides)
            else:
                self.emit(f"{target} = {src}.view({self.glob(a.dtype, 'DTYPE')}).as_strided({shape!r}, {strides!r})")
            if self.offsets.get(src) == 0:
                self.offsets[target] = 0
        elif a.reuse.dtype == a.dtype:  # a library result: taken if this call holds its storage alone, and
            # the storage holds the new layout (checked per call, as CompiledGraph.allocate does)
            end = (sum((n - 1) * st for n, st in zip(shape, strides)) + 1 if all(shape) else 0) * a.dtype.itemsize
            target = self.bind(a.node, strides)
            uses = self.glob(torch._C._storage_Use_Count, "STORAGE_USES")
            self.emit(f"storage = {src}.untyped_storage()")
            self.emit(f"if {uses}(storage._cdata) == 2 and {src}.storage_offset() * {a.dtype.itemsize} + {end} "
                      f"<= storage.nbytes():")
            self.emit(f"    {target} = {src}.as_strided({shape!r}, {strides!r})")
            self.emit("else:")
            self.emit(f"    {target} = torch.empty_strided({shape!r}, {strides!r}, "
                      f"dtype={self.glob(a.dtype, 'DTYPE')}, device={self.glob(self.m.device, 'DEVICE')})")
            self.emit("del storage")
        else:
            m, reuse = self.m, a.reuse
            self.materialize(src)
            alloc = self.glob(lambda t: m.allocate(a, {reuse: t}), "ALLOC")
            self.emit(f"{self.bind(a.node, a.strides)} = {alloc}({src})")

    def extern(self, n: Node) -> None:
        m = self.m
        what = f"  # {n.attr('target')}"
        if self.extern_inline(n, what):
            return
        args = ", ".join(self.value(i) for i in n.inputs)
        call = self.glob(m.extern_call(n), "EXTERN")
        if n in m.planned:  # the library writes into the buffer allocated for it
            self.emit(f"{call}({self.value(n)}, {args}){what}")
        else:
            self.emit(f"{self.bind(n, m.plan.strides_of.get(n))} = {call}(None, {args}){what}")

    def extern_inline(self, n: Node, what: str) -> bool:
        """The library call written out in the wrapper - the op with each argument in its place, a channels-last
        convolution's input converted only where its layout is not known to be channels-last, the result's
        layout checked as ``CompiledGraph.extern_call`` does - instead of a call of that generic closure (its
        argument builder, checks and frames cost ~2 us per call).  False where the closure must stay (tensors
        nested in list arguments, a re-laid-out bmm)::

            v148 = CONV_13(v147, CONST_12, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)  # aten.convolution
            if v148.stride() != (200704, 1, 3584, 64):
                v148 = RESTRIDE_14(v148)
        """
        m = self.m
        template = n.attr("template")
        if not is_flat(template) or n in m.plan.bmm_relayout:
            return False
        if n in m.sibling_of or n in m.last_sibling:  # (one call for its outputs: the closure keeps it,
            return False                                # [Note: one call for a multi-output extern])
        args_t, kwargs_t = template
        dense = n.attr("dense_inputs")  # ([Note: externs get the layouts they were traced with])
        dense = frozenset(k for k, d in enumerate(dense) if d) if dense is not None else frozenset()
        parts = [self.argument(a, n, dense) for a in args_t]
        parts += [f"{k}={self.argument(v, n, dense)}" for k, v in kwargs_t.items()]
        if n in m.plan.cl_convs and args_t and isinstance(args_t[0], InputRef):
            x = n.inputs[args_t[0].index]
            known = self.strides.get(self.value(x))
            if len(x.shape) != 4 or known != channels_last_strides(x.shape):
                parts[0] = f"{parts[0]}.contiguous(memory_format=torch.channels_last)"
        target = n.attr("target")
        if n in m.planned:  # the library writes into the buffer allocated for it (its .out overload)
            call = self.glob(fast_callable(target, out=True), "EXTERN_OUT")
            self.emit(f"{call}({', '.join(parts + [f'out={self.value(n)}'])}){what}")
            return True
        strides = m.plan.strides_of.get(n)
        index = n.attr("out_index")
        v = self.bind(n, strides)
        call = fast_callable(target, mode=self.m.mode, first_output_only=index == 0)  # (no sibling: see above)
        self.emit(f"{v} = {self.glob(call, 'EXTERN')}({', '.join(parts)})"
                  + (f"[{index}]" if index is not None else "") + what)
        if strides is None:
            self.emit(f"if not {v}.is_contiguous():")
            self.emit(f"    {v} = {v}.contiguous()")
        else:  # the kernels read it through these strides
            self.emit(f"if {v}.stride() != {tuple(strides)!r}:")
            self.emit(f"    {v} = {self.glob(functools.partial(restrided, strides=tuple(strides)), 'RESTRIDE')}({v})")
        return True

    def argument(self, a: Any, n: Node, dense: frozenset[int] = frozenset()) -> str:
        """An extern argument as text: its tensor's name, a literal, or a global holding the value.  An input
        in ``dense`` (the extern's traced operands that were contiguous) whose layout here is not is made
        contiguous at the call, as ``CompiledGraph.extern_call`` does."""
        if isinstance(a, InputRef):
            name = self.value(n.inputs[a.index])
            if a.index in dense:
                held = self.ns.get(name)  # (a constant: the tensor itself)
                dense_here = held.is_contiguous() if isinstance(held, torch.Tensor) else \
                    _is_contiguous(n.inputs[a.index].shape, self.strides.get(name))
                if not dense_here:
                    return f"{name}.contiguous()"
            return name
        if isinstance(a, Baked):
            return self.glob(a.value, "BAKED")
        if _literal(a):
            return repr(a)
        return self.glob(a, "ARG")

    def segment(self, index: int) -> None:
        for kernel, (fn, args, takes_tuple, direct) in zip(self.m.segments[index], self.launchers(index)):
            values = [self.value(n, loose=True) for n in args]  # (kernels read data pointers alone)
            names = ", ".join(values)
            if direct is not None and direct.static is not None:  # kiln's launcher (runtime/gpu_launch.py)
                launch = self.glob(direct.static.call, "LAUNCH")
                if not self.has_stream:  # (straight-line code: the first launch's line dominates the rest)
                    self.emit(f"stream = {self.glob(direct.stream, 'STREAM')}()")
                    self.has_stream = True
                self.emit(f"failed = {launch}(stream, {names})  # {kernel}")
                self.emit("if failed:  # a buffer not 16-byte aligned (-> Triton's JIT entry), or a launch error")
                self.emit(f"    {self.glob(direct.static.retry, 'RETRY')}(failed, ({names},))")
                continue
            if direct is not None and all(v in self.aligned for v in values):
                # every buffer is aligned on every call: straight to the kernel compiled for aligned buffers
                runner = self.glob(direct.runner, "RUN")
                self.emit(f"{runner}({names}, {', '.join(map(str, direct.constants))})  # {kernel}")
                continue
            call = self.glob(fn, "KERNEL")  # (a launcher of Triton's or the runtime's: it gets tensors as laid out)
            names = ", ".join(self.materialize(v) for v in values)
            self.emit((f"{call}(({names},))" if takes_tuple else f"{call}({names})") + f"  # {kernel}")

    def fused_step(self, step: Any) -> None:
        fn, nodes = self.fused(step)
        self.emit(f"{self.glob(fn, 'FUSED')}({', '.join(self.value(n) for n in nodes)})")

    def output(self, o: Node) -> str:
        m = self.m
        base = o
        while base.op in VIEW and base not in self.bound and base not in m.static:
            base = base.inputs[0]
        if o in m.laid_out_outputs:  # ([Note: saved activations channels-last])
            return self.value(o)
        if o.op is Op.CONSTANT or base in m.plan.strides_of:
            # a copy the caller owns (a weight), or a library's channels-last result (or a view of one) in eager's
            # layout: CompiledGraph.output_value decides, from the value the view chain starts at
            fn = self.glob(lambda t: m.output_value(o, {base: t}), "OUTPUT")
            return f"{fn}({self.value(base)})"
        return self.value(o)

    def write(self) -> str:
        m = self.m
        self.lines = ["def call(inputs):"]
        self.inputs()
        for step, (kind, item) in enumerate(m.program):
            for a in m.alloc_before[step]:
                self.allocation(a)
            if kind == "segment":
                self.segment(item)
            elif kind == "fused":
                self.fused_step(item)
            else:
                self.extern(item)
            for n in m.drop_after[step]:
                self.drop(n)
        for back in self.write_backs:  # (before the outputs, as the interpreted call: an output may view it)
            self.emit(f"if {back} is not None:")
            self.emit(f"    {back}[0].copy_({back}[1])")
        outputs = [self.output(o) for o in m.graph.outputs]
        self.emit(f"return [{', '.join(outputs)}]")
        return "\n".join(self.lines) + "\n"


def build_wrapper(module: Any, launchers: Launchers, fused: Callable[[Any], tuple[Callable, list[Node]]],
                  bad_input: Callable[..., None]
                  ) -> tuple[Callable[[Sequence[torch.Tensor]], list[torch.Tensor]], str] | None:
    """(call, source) for ``module``'s program, or None where the interpreted call must stay.

    ``launchers(segment)`` gives the segment's kernels as (callable, argument nodes, takes one tuple, direct),
    where ``direct`` is the launcher of a kernel compiled for 16-byte aligned buffers (its ``static`` launch and
    ``stream``, or its Triton ``runner`` and trailing ``constants``), or None;
    ``fused(step)`` a fused step's (callable, argument nodes); ``bad_input(k, tensor, node, device)`` raises the
    runtime's error for a caller's input that does not match.  ``module`` is the runtime's ``CompiledGraph``
    (its prepared calls: ``extern_call``, ``allocate``, ``output_value``, ``view_fn``)."""
    if module.arena_mode:
        return None
    writer = _Writer(module, launchers, fused, bad_input)
    source = writer.write()
    code = compile(source, "<kiln call wrapper>", "exec")
    exec(code, writer.ns)
    return writer.ns["call"], source
