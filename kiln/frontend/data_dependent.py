"""Graphs with data-dependent sizes: the nodes that decide a size from values run eagerly, the rest compiled.

[Note: data-dependent sizes] With ``capture_dynamic_output_shape_ops`` (or ``capture_scalar_outputs``) Dynamo
keeps ``nonzero``, boolean-mask indexing, ``.item()`` and their kin in the graph: each binds a new *unbacked*
size symbol (``u0``) that no input gives, known only once the op has run (the node's ``unbacked_bindings``).
kiln's programs are planned from their inputs' sizes, so such a graph is cut at those nodes into pieces::

    before:  x -> relu -> mul -> add -> gt -> nonzero [binds u0] -> ... ; add -> exp -> add(y)
    after:   piece 0 (compiled): relu, mul, add, gt, exp, add(y)    <- everything that needs no u0
             piece 1 (eager):    nonzero, the size assertions on u0
             piece 2 (compiled): what consumes nonzero's [u0, 2] result: u0 is now an input dimension, so it is
                                 an ordinary symbolic graph (a Program per size, docs/dynamic_shapes.md)

Each node goes to the earliest piece its inputs allow (levels: even = compiled, odd = eager): a node after
``nonzero`` in the graph that does not read its result still joins piece 0, so the compiled pieces stay as
large as the data allows.  Size assertions (``_assert_scalar`` of a symbolic condition) run eagerly after what
they test, as they do in eager.  The report of the graph lists the nodes that ran eagerly and why; each compiled
piece has a report of its own (a piece kiln cannot compile runs eagerly by the usual fallback).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx

#: ops that test sizes: they take a symbolic condition (a SymBool) and run where eager runs them
_ASSERTS = {torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range.default,
            torch.ops.aten.sym_constrain_range_for_size.default}


def binding_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The nodes that bind unbacked symbols: their result's size (or value, for ``.item()``) depends on the data
    (a view's too - ``x[:k]`` of an unbacked ``k`` has a size of its own, ``min(k, n)``, that kiln's size
    expressions do not hold: run eagerly, a view costs nothing there)."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.meta.get("unbacked_bindings")]


def symbolic_checks(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Assertions on symbolic sizes (``torch._check(x.shape[0] >= 2)`` in a dynamic graph, Dynamo's range facts
    of an unbacked symbol): kiln's kernels do not evaluate conditions, so these run eagerly too."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _ASSERTS
            and any(isinstance(a.meta.get("val"), (torch.SymBool, torch.SymInt)) for a in n.all_input_nodes)]


def _on_unbacked(check: torch.fx.Node) -> bool:
    """Does ``check`` test an unbacked symbol (a fact Dynamo states about a binding node's result)?"""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    return any(free_unbacked_symbols(a.meta.get("val")) for a in check.all_input_nodes)


def needs_pieces(gm: torch.fx.GraphModule) -> bool:
    """Does ``gm`` hold nodes that must run eagerly for kiln to compile the rest (see the note above)?"""
    return bool(binding_nodes(gm) or symbolic_checks(gm))


def _is_condition(n: torch.fx.Node) -> bool:
    """A size test: an assertion, or a symbolic bool computed for one."""
    if n.target in _ASSERTS:
        return True
    return isinstance(n.meta.get("val"), torch.SymBool)


def levels(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, int]:
    """Each node's piece: the binding nodes and the size tests at odd levels (eager), the others at even levels
    (compiled), each as early as its inputs allow (see the note above)."""
    binds = set(binding_nodes(gm))
    level: dict[torch.fx.Node, int] = {}
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "get_attr"):
            level[n] = 0
            continue
        if n.op == "output":
            continue
        below = max((level[i] for i in n.all_input_nodes), default=0)
        if n in binds or _is_condition(n):
            level[n] = below if below % 2 else below + 1
        elif isinstance(n.meta.get("val"), (torch.SymInt, torch.SymFloat, int, float)):
            level[n] = below  # size arithmetic stays with what it reads (a compiled piece lowers it)
        else:
            level[n] = below + (below % 2)
    return level


class _Piece(torch.nn.Module):
    """A compiled piece in the split graph: kiln's boxed function, called as the submodule was."""

    def __init__(self, fn: Callable, many: bool):
        super().__init__()
        self.fn = fn
        self.many = many

    def forward(self, *args: Any) -> Any:
        outs = self.fn(list(args))
        return tuple(outs) if self.many else outs[0]


def _describe(n: torch.fx.Node) -> str:
    symbols = ", ".join(sorted(str(s) for s in n.meta["unbacked_bindings"]))
    what = getattr(n.target, "__name__", str(n.target))
    if not isinstance(n.meta.get("val"), torch.Tensor):
        return f"{n.name} ({what}): a number read from a tensor's data ({symbols}), used by what follows"
    return f"{n.name} ({what}): its result's size depends on the data ({symbols})"


def compile_split(fx_gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor],
                  compile_piece: Callable[..., Callable], name: str, arg_names: Sequence[str | None],
                  examples: Sequence[Any] | None, report: Any) -> Callable:
    """``fx_gm`` cut into pieces (``levels``), its compiled pieces compiled by ``compile_piece(piece_gm, frozen,
    name=, arg_names=, examples=)``, the others left to run eagerly; returns the boxed function of the whole."""
    from torch.fx.passes.split_module import split_module
    level = levels(fx_gm)
    split = split_module(fx_gm, None, lambda n: level[n])
    placeholders = [n.name for n in fx_gm.graph.nodes if n.op == "placeholder"]
    position = {p: k for k, p in enumerate(placeholders)}
    compiled = sorted({v for n, v in level.items() if v % 2 == 0 and n.op == "call_function"})
    report.eager_nodes = [_describe(n) for n in binding_nodes(fx_gm)]
    report.eager_nodes += [f"{n.name} (a size check, as eager runs it): {n.args[1]!r}" if len(n.args) > 1 else
                           f"{n.name} (a size check, as eager runs it)" for n in symbolic_checks(fx_gm)
                           if not _on_unbacked(n)]  # (Dynamo's range facts of a binding node go with it)
    for k, lv in enumerate(compiled):
        sub_name = f"submod_{lv}"
        sub = getattr(split, sub_name, None)
        if sub is None:
            continue
        inputs = [n.name for n in sub.graph.nodes if n.op == "placeholder"]
        at = [position.get(p) for p in inputs]
        sub_frozen = {j: frozen[i] for j, i in enumerate(at) if i is not None and i in frozen}
        sub_names = [arg_names[i] if i is not None and i < len(arg_names) else None for i in at]
        sub_examples = [examples[i] for i in at] if examples is not None and None not in at else None
        out = next(n for n in sub.graph.nodes if n.op == "output")
        many = isinstance(out.args[0], (list, tuple))
        if not many:  # (kiln's functions, a compiled one and the eager fallback alike, return a sequence)
            out.args = ((out.args[0],),)
            sub.recompile()
        fn = compile_piece(sub, sub_frozen, name=f"{name} [piece {k + 1} of {len(compiled)}]",
                           arg_names=sub_names, examples=sub_examples)
        delattr(split, sub_name)
        split.add_module(sub_name, _Piece(fn, many))
    split.recompile()

    def run(args: list[Any]) -> Any:
        outs = split(*args)
        args.clear()
        return list(outs) if isinstance(outs, (list, tuple)) else [outs]
    return run
