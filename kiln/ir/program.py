"""The plan of a compiled graph: what the schedule stage decides and the runtime runs.

``schedule/plan.py`` builds a ``Plan`` from an optimized graph - its steps in order (generated kernels, and
extern calls to libraries), the buffer each realized value lives in, the layouts that are not contiguous,
the convolutions run channels-last - and the runtime (``runtime/module.py``) runs it.  Nothing in the runtime
decides any of these; it binds buffers and calls the steps.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kiln.ir.graph import Node
from kiln.ir.ops import Op
from kiln.ir.kernel import Kernel


@dataclasses.dataclass
class ExternStep:
    """A library or ATen call, one graph node (``Op.EXTERN``)."""
    node: Node


class OwnStep:
    """A step an operator provides itself (``kiln/library``: the GPU matmul template with its epilogue kernel).

    The program builder asks it what it reads and writes; the runtime loads and runs it through ``load`` and
    ``run`` and knows nothing else about it (so the runtime imports no operator)."""
    node: Node                 # its extern node: the runtime evaluates its arguments for ``run``
    epilogue: Kernel | None    # a kernel the step took in (None: the step writes ``node``'s own buffer)
    args: list[Node]           # the buffer nodes ``run`` gets after the operands, in order (set by ``load``)

    @property
    def name(self) -> str:
        raise NotImplementedError

    @property
    def node_inputs(self) -> list[Node]:
        return list(self.node.inputs)

    def buffers(self) -> tuple[set[str], set[str]]:
        """Buffers read and written besides ``node``'s operands (graph nodes, read through views)."""
        raise NotImplementedError

    def describe(self) -> str:
        return self.name

    def load(self, import_source: Any, dtype_of: dict[str, torch.dtype], node_of: dict[str, Node]) -> None:
        """Bind the step's code (``import_source(text) -> (module, from_cache)``) and its ``args``."""
        raise NotImplementedError

    def run(self, operands: list[Any], values: list[torch.Tensor]) -> None:
        """Run once: ``operands`` are ``node``'s arguments as its extern takes them, ``values`` the ``args``."""
        raise NotImplementedError


@dataclasses.dataclass
class Plan:
    steps: list[Any]                 # Kernel | ExternStep | OwnStep (an operator's own, e.g. the GPU matmul)
    buffer_of: dict[Node, str]       # realized node -> buffer name
    aliases: set[Node]
    kernels: list[Kernel]
    strides_of: dict[Node, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # non-contiguous buffers
    cl_convs: set[Node] = dataclasses.field(default_factory=set)  # convolutions run channels-last
    bmm_relayout: set[Node] = dataclasses.field(default_factory=set)  # bmm externs whose operands are re-laid out
    # an input's buffer -> the value a kernel stores into it (schedule/write_back.py, [Note: write-backs in place])
    stored_into: dict[str, Node] = dataclasses.field(default_factory=dict)
    # outputs handed out in the layout the plan stores them in (not eager's): a training forward's saved values
    # ([Note: saved activations channels-last]), by their strides
    laid_out: dict[Node, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    def _name(self, n: Node) -> str:
        """A value's buffer, or ``view(buffer)`` for a view the step takes of one."""
        if n in self.buffer_of:
            return self.buffer_of[n]
        return f"view({self._name(n.inputs[0])})" if n.inputs else n.op.value

    def format(self) -> str:
        """One line per step: what it computes and the buffers it reads and writes."""
        lines = []
        for k, s in enumerate(self.steps):
            if isinstance(s, Kernel):
                reads, writes = s.buffers()
                lines.append(f"{k:3d} kernel {s.name}: reads {', '.join(sorted(reads)) or '-'}; "
                             f"writes {', '.join(sorted(writes))}")
            elif isinstance(s, ExternStep):
                n = s.node
                target = str(n.attr("target")).split("::")[-1]
                ins = ", ".join(self._name(i) for i in n.inputs)
                lines.append(f"{k:3d} extern {target}({ins}) -> {self.buffer_of.get(n, '-')}")
            else:  # an operator's own step
                reads, writes = s.buffers()
                ins = ", ".join(self._name(i) for i in s.node_inputs)
                lines.append(f"{k:3d} {type(s).__name__} {s.describe()}: operands {ins}; reads "
                             f"{', '.join(sorted(reads)) or '-'}; writes {', '.join(sorted(writes))}")
        return "\n".join(lines)


@dataclasses.dataclass
class Allocation:
    """A per-call buffer made right before its first writer (without an arena, see [Note: arena or allocator])."""
    node: Node
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    reuse: Node | None = None   # an input of the writing kernel that dies there: take its memory
    reuse_planned: bool = False  # ... and it is one of our own buffers (no need to check its storage)


@dataclasses.dataclass
class Program:
    plan: Plan
    arena: bool                                   # planned buffers in one arena (CPU) or allocated per step
    escaping: set[Node]                           # outputs and the bases of output views: per-call buffers
    slot_of: dict[str, int]                       # buffer name -> pointer-table slot
    baked: list[torch.Tensor]                     # tensors baked into native calls: the slots after the buffers
    native: dict[Node, Any]                       # extern node -> runtime.native.NativeCall
    segments: list[list[Any]]                     # per segment: kernel names and NativeCalls, in order
    steps: list[tuple[str, Any]]                  # ("segment", i) | ("extern", node) | ("fused", step)
    drop_after: list[list[Node]]                  # per step: per-call values no later step reads
    offsets: dict[Node, int]                      # arena: each planned buffer's byte offset
    arena_bytes: int
    planned: set[Node]                            # buffers whose memory is planned (arena or allocations)
    alloc_before: list[list[Allocation]]          # no arena: per step, the buffers it writes first
    mutated_inputs: set[Node]                     # graph inputs an in-place extern updates
    input_slots: list[tuple[int, int, Node]]      # (input position, slot, node)
    output_slots: list[tuple[Node, int]]          # values the caller gets, filled per call: (node, slot)
    memory: dict[str, Any]                        # for the report

    def node_of(self) -> dict[str, Node]:
        return {name: n for n, name in self.plan.buffer_of.items()}

    def format(self) -> str:
        """The plan's steps (``Plan.format``), each followed by the memory of the buffers it writes first: its
        place in the arena, a per-call tensor (outputs, and the buffers of views the caller gets), or a per-call
        allocation (without an arena, maybe taking a dead input's memory).

            0 extern kiln.linear_packed.default(buf1, buf0) -> buf4        buf4: arena @0, 64 KiB
            2 kernel kernel_0_relu: reads buf4; writes buf6                buf6: per call (graph output), 8 KiB
        """
        allocated = {a.node: a for step in self.alloc_before for a in step}
        node_of = self.node_of()
        seen: set[str] = set()
        lines = []
        for line, step in zip(self.plan.format().split("\n"), self.plan.steps):
            notes = []
            for name in _written(step, self.plan):
                n = node_of.get(name)
                if n is None or name in seen:
                    continue
                seen.add(name)
                notes.append(f"{name}: {self._memory(n, allocated)}, {_size(n)}")
            lines.append(f"{line:<72} {'; '.join(notes)}" if notes else line)
        return "\n".join(lines)

    def _memory(self, n: Node, allocated: dict[Node, Allocation]) -> str:
        if n.op is Op.INPUT:
            return "the caller's input, updated in place"
        if n in self.escaping:
            return "per call (graph output)"
        if self.arena and n in self.offsets:
            return f"arena @{self.offsets[n]}"
        if n in allocated:
            reuse = allocated[n].reuse
            return "allocated" + (f" in {self.plan.buffer_of.get(reuse, 'a dead input')}'s memory" if reuse else "")
        return "per call (the library's result)"


def _written(step: Any, plan: Plan) -> list[str]:
    """Buffers a step writes, in name order."""
    if isinstance(step, Kernel):
        return sorted(step.buffers()[1])
    node = getattr(step, "node", None)
    return [plan.buffer_of[node]] if node is not None and node in plan.buffer_of else []


def _size(n: Node) -> str:
    numel = 1
    for d in n.shape:
        numel *= d
    nbytes = numel * n.dtype.itemsize
    return f"{nbytes / 1024:.0f} KiB" if nbytes >= 1024 else f"{nbytes} B"
