"""The graph IR: immutable nodes over whole tensors, a builder that infers shapes and dtypes, a printer.

A ``Graph`` is a topologically ordered list of ``Node``s with its inputs and outputs.  Nodes never change;
passes build a new graph with ``GraphBuilder`` (usually through ``passes.rewrite.rewrite``).  Elementwise
nodes take operands of identical shape: the lowering inserts explicit ``EXPAND`` (broadcast) and ``CAST``
(type promotion) nodes, so code generators never guess.

Text form (stable, used by tests and ``kiln.explain``)::

    graph(%x: f32[4, 8]):
      %0 = amax(%x, axes=(1,), keepdim=True) : f32[4, 1]
      %1 = expand(%0, shape=(4, 8)) : f32[4, 8]
      %2 = sub(%x, %1) : f32[4, 8]
      return (%2)
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import itertools
from typing import Any, Iterable, Iterator, Sequence

import torch

from kiln.ir.sym import Size, is_symbolic
from kiln.ir.ops import (BOOL_RESULT, ELEMENTWISE, REDUCTION, VIEW, Op, broadcast_shapes, dim, numel,
                         reduced_shape)


class ConstRef:
    """A tensor held by a CONSTANT node; hashed by identity so attrs stay hashable."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __repr__(self) -> str:
        t = self.tensor
        if t.numel() <= 4:
            return f"const({t.flatten().tolist()})"
        return f"const<{tuple(t.shape)}>"


_ids = itertools.count()


@dataclasses.dataclass(frozen=True, eq=False)
class Node:
    """One whole-tensor operation. Identity is object identity; ``key()`` is the structural key for CSE."""

    op: Op
    inputs: tuple["Node", ...]
    attrs: dict[str, Any]
    shape: tuple[Size, ...]  # ints; a size expression (ir/sym.py) where the graph was traced with dynamic shapes
    dtype: torch.dtype
    uid: int = dataclasses.field(default_factory=lambda: next(_ids))

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    @property
    def numel(self) -> Size:
        return numel(self.shape)

    def key(self) -> tuple:
        """Structural identity: equal keys compute equal values (CONSTANT by tensor identity)."""
        attrs = tuple(sorted((k, _hashable(v)) for k, v in self.attrs.items()))
        return (self.op, tuple(i.uid for i in self.inputs), attrs, self.shape, self.dtype)

    def __repr__(self) -> str:
        return f"Node({self.op.value}#{self.uid}, {list(self.shape)}, {dtype_name(self.dtype)})"


def mutates(n: Node) -> bool:
    """An EXTERN whose ATen schema writes one of its arguments (an in-place update of a graph input)."""
    schema = getattr(n.attr("target"), "_schema", None) if n.op is Op.EXTERN else None
    return schema is not None and schema.is_mutable


def view_root(n: Node) -> Node:
    """The node a chain of view ops (``VIEW``: reshape, permute, expand, slice) starts from; ``n`` if no view."""
    while n.op in VIEW:
        n = n.inputs[0]
    return n


def readers_through_views(graph: "Graph", users: dict[Node, list[Node]] | None = None) -> dict[Node, set[Node]]:
    """Each node's computing readers, looking through views: a view is an index map, so whoever reads the view
    reads the node (OPT's residual ``(x + branch).view(shape)`` has one user, the view, and two readers).
    ``users``: ``graph.users()`` when the caller has it already."""
    users = graph.users() if users is None else users
    out: dict[Node, set[Node]] = {}
    for n in reversed(graph.nodes):
        readers: set[Node] = set()
        for u in users[n]:
            if u.op in VIEW:
                readers |= out[u]
            else:
                readers.add(u)
        out[n] = readers
    return out


_COMPILE_DEVICE: contextvars.ContextVar[str | None] = contextvars.ContextVar("kiln_compile_device", default=None)


@contextlib.contextmanager
def compiling_for(device_type: str) -> Iterator[None]:
    """Within it, ``data_device`` answers ``device_type`` for nodes that reach no constant (the compiler sets it
    for the graph it compiles: its inputs' device)."""
    token = _COMPILE_DEVICE.set(device_type)
    try:
        yield
    finally:
        _COMPILE_DEVICE.reset(token)


def data_device(n: Node) -> str | None:
    """The device type (``"cpu"``, ``"cuda"``) of the graph data ``n`` computes on, judged from the first constant
    (weight) it reaches, else the device of the graph being compiled (``compiling_for``): a user's function of its
    inputs has no weights, and its attention's products still run on its inputs' device.  None outside a compile
    for a node that reaches no constant."""
    stack, seen = [n], set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if x.op is Op.CONSTANT:
            return x.attr("value").tensor.device.type
        stack.extend(x.inputs)
    return _COMPILE_DEVICE.get()


def _hashable(v: Any) -> Any:
    if isinstance(v, (list, tuple)):
        return tuple(_hashable(x) for x in v)
    if isinstance(v, dict):
        return tuple(sorted((k, _hashable(x)) for k, x in v.items()))
    if isinstance(v, float) and (v != v or v == 0):
        return repr(v)  # "nan" equals itself; 0.0 and -0.0 are different values
    try:
        hash(v)
        return v
    except TypeError:
        return ("id", id(v))


_DTYPE_NAMES = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
    torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128",
}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).replace("torch.", ""))


@dataclasses.dataclass
class Graph:
    """A topologically ordered list of nodes; ``inputs`` are INPUT nodes in call order."""

    nodes: list[Node]
    inputs: list[Node]
    outputs: list[Node]

    def users(self) -> dict[Node, list[Node]]:
        users: dict[Node, list[Node]] = {n: [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                users[i].append(n)
        return users

    def __str__(self) -> str:
        return format_graph(self)


class GraphBuilder:
    """Creates nodes with inferred shape/dtype and appends them in order."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.inputs: list[Node] = []

    def add(self, op: Op, inputs: Sequence[Node] = (), shape: Sequence[int] | None = None,
            dtype: torch.dtype | None = None, **attrs: Any) -> Node:
        inputs = tuple(inputs)
        if op in (Op.RESHAPE, Op.EXPAND) and shape is not None:
            attrs["shape"] = tuple(dim(s) for s in shape)  # the target shape is the op's attribute
        inf_shape, inf_dtype = infer(op, inputs, attrs, shape, dtype)
        node = Node(op, inputs, attrs, tuple(dim(s) for s in inf_shape), inf_dtype)
        self.nodes.append(node)
        if op is Op.INPUT:
            self.inputs.append(node)
        return node

    def add_node(self, node: Node) -> Node:
        """Append an existing node (e.g. when copying an unchanged node whose inputs are unchanged)."""
        self.nodes.append(node)
        if node.op is Op.INPUT:
            self.inputs.append(node)
        return node

    def finish(self, outputs: Iterable[Node]) -> Graph:
        return Graph(list(self.nodes), list(self.inputs), list(outputs))


def infer(op: Op, inputs: tuple[Node, ...], attrs: dict[str, Any], shape: Sequence[int] | None,
          dtype: torch.dtype | None) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of a new node: the single place where the graph IR's typing rules live."""
    if op in ELEMENTWISE:
        shapes = {i.shape for i in inputs}
        if len(shapes) != 1:
            raise ValueError(f"{op.value}: operands must have one shape (insert expand), got {shapes}")
        out_shape = inputs[0].shape
        if op is Op.CAST:
            assert dtype is not None, "cast needs a dtype"
            return out_shape, dtype
        if op in BOOL_RESULT:
            return out_shape, torch.bool
        operands = inputs[1:] if op is Op.WHERE else inputs
        dtypes = {i.dtype for i in operands}
        if len(dtypes) != 1:
            raise ValueError(f"{op.value}: operands must have one dtype (insert cast), got {dtypes}")
        return out_shape, operands[0].dtype
    if op in REDUCTION:
        x = inputs[0]
        out_shape = reduced_shape(x.shape, attrs["axes"], attrs["keepdim"])
        out_dtype = torch.int64 if op in (Op.ARGMAX, Op.ARGMIN) else x.dtype
        return out_shape, (dtype or out_dtype)
    x = inputs[0] if inputs else None
    if op is Op.RESHAPE:
        # (symbolic sizes: equal as polynomials, or not comparable here - a view to [s // 8, 8] is exact only with
        # the divisibility Dynamo checked when it traced the view - but never two different integers)
        before, after = x.numel, numel(attrs["shape"])
        assert before == after or is_symbolic(before) or is_symbolic(after), f"reshape {x.shape} -> {attrs['shape']}"
        return tuple(attrs["shape"]), x.dtype
    if op is Op.PERMUTE:
        return tuple(x.shape[d] for d in attrs["dims"]), x.dtype
    if op is Op.EXPAND:
        target = tuple(attrs["shape"])
        if broadcast_shapes(x.shape, target) != target:
            raise ValueError(f"expand: {x.shape} does not broadcast to {target}")
        return target, x.dtype
    if op in (Op.SLICE, Op.PAD):
        assert shape is not None, f"{op.value} needs its output shape"
        return tuple(shape), x.dtype
    if op is Op.CAT:
        d = attrs["dim"]
        total = sum(i.shape[d] for i in inputs)
        return tuple(total if k == d else s for k, s in enumerate(inputs[0].shape)), inputs[0].dtype
    if op is Op.TAKE:
        d, idx = attrs["dim"], inputs[1]
        return x.shape[:d] + idx.shape + x.shape[d + 1:], x.dtype
    if op is Op.GATHER:
        return inputs[1].shape, x.dtype
    if op is Op.CONSTANT:
        t = attrs["value"].tensor
        return tuple(t.shape), t.dtype
    assert shape is not None and dtype is not None, f"{op.value} needs explicit shape and dtype"
    return tuple(shape), dtype


# ----------------------------------------------------------------------------------------------- printing

def format_graph(graph: Graph, names: dict[Node, str] | None = None) -> str:
    names = dict(names or {})
    for i, n in enumerate(graph.inputs):
        names.setdefault(n, f"%in{i}")
    counter = 0
    for n in graph.nodes:
        if n not in names:
            names[n] = f"%{counter}"
            counter += 1
    params = ", ".join(f"{names[n]}: {type_str(n)}" for n in graph.inputs)
    lines = [f"graph({params}):"]
    for n in graph.nodes:
        if n.op is Op.INPUT:
            continue
        lines.append(f"  {names[n]} = {format_node(n, names)} : {type_str(n)}")
    lines.append(f"  return ({', '.join(names[n] for n in graph.outputs)})")
    return "\n".join(lines)


def type_str(n: Node) -> str:
    return f"{dtype_name(n.dtype)}[{', '.join(str(s) for s in n.shape)}]"


def format_node(n: Node, names: dict[Node, str]) -> str:
    args = [names.get(i, "?") for i in n.inputs]
    for k, v in n.attrs.items():
        if n.op is Op.EXTERN and k == "template":
            continue
        if k == "target":
            v = str(v)
        elif isinstance(v, float):
            v = repr(v)
        elif isinstance(v, torch.dtype):
            v = dtype_name(v)
        args.append(f"{k}={v}")
    return f"{n.op.value}({', '.join(args)})"


# ------------------------------------------------------------------------------------------- verification

def verify(graph: Graph) -> None:
    """Check topological order, input membership and re-inferred types; raises AssertionError naming the node."""
    seen: set[int] = set()
    for n in graph.nodes:
        for i in n.inputs:
            assert i.uid in seen, f"verify: {n} uses {i} before it is defined"
        if n.op not in (Op.EXTERN, Op.INPUT, Op.FULL, Op.IOTA, Op.SLICE, Op.PAD):
            shape, dtype = infer(n.op, n.inputs, n.attrs, n.shape, n.dtype)
            assert (tuple(shape), dtype) == (n.shape, n.dtype), \
                f"verify: {n} has type {n.shape}/{n.dtype}, rules give {shape}/{dtype}"
        seen.add(n.uid)
    for o in graph.outputs:
        assert o.uid in seen, f"verify: output {o} is not in the graph"
    for i in graph.inputs:
        assert i.op is Op.INPUT
