"""kiln's part of the training partition: saved activations that the backward recomputes from what it has anyway.

[Note: recompute what the backward can rebuild] torch's min-cut partitioner (the baseline, run first) saves a
forward value whenever recomputing it in the backward would have to be *materialized* there - written to memory
as the input of a library call - on the rule that a recomputation is only free where it fuses into a consumer.
The typical casualties are the inputs of the weight gradients' matrix products: GELU's output (the second
Linear's weight gradient reads it) is saved next to GELU's input (GELU's own backward reads that), and a
LayerNorm's output (the next Linear's weight gradient) next to the LayerNorm's input and statistics.  Each pair
holds the same information twice, for the whole time between the forward and the backward: per transformer
layer that is one activation of the MLP's width and two of the model's.

kiln takes the min-cut's result and, for each saved value that is a short chain of elementwise ops and views
over values the backward holds anyway (other saved values, or the forward's inputs - parameters and the batch,
which cost no memory of their own), drops it from the saved set and rebuilds it in the backward.  The cost is
one elementwise pass in the backward - read the chain's inputs (often read there already: GELU's backward reads
its input), write the value - against the bytes the value would hold from its forward to its backward::

    min-cut:  forward  -> saved: addmm [M, 4H], gelu [M, 4H] (view), ...
              backward:  mm(grad^T, gelu) ; gelu_backward(grad, addmm)
    kiln:     forward  -> saved: addmm [M, 4H], ...                          (one [M, 4H] activation fewer)
              backward:  gelu = gelu(addmm) ; mm(grad^T, gelu) ; gelu_backward(grad, addmm)

What qualifies (``_chain``): ops tagged pointwise (not random, not in place), dtype conversions and views, at
most ``MAX_CHAIN_OPS`` of them, reading no more than ``MAX_READ_RATIO`` times the value's bytes, for a value of at
least ``MIN_BYTES``; a value another recomputation reads stays saved.  Sizes that are symbols reach the backward
only where it has them already (a saved size).  The rewrite keeps AOTAutograd's conventions: the forward's
outputs are its user outputs, then the saved tensors, then the saved sizes; the backward's inputs are the saved
sizes, the saved tensors, then the incoming gradients, in the same order as the forward returns them.

The report (``partition_summary`` in frontend/training.py) names what was saved and what recomputed, and this
pass adds what it moved and the bytes.  ``Config.training_recompute`` switches it off.

``Config.training_memory_budget`` (below 1) goes further, trading time for memory as activation checkpointing
does, but chosen value by value: products, convolutions, softmaxes and reductions may be repeated too, the
cheapest rebuild per byte freed first, until the saved bytes are at most that share of what the step above left
([Note: a memory budget], ``_Chooser.within``).  Small CPU sizes, budget 0.5: saved bytes halved on GPT, BERT,
LLaMA, ResNet-18 and the MLP for 0-20 % more step time.
"""
from __future__ import annotations

import contextlib
import dataclasses
import operator
from typing import Any

import torch
import torch.fx

MAX_CHAIN_OPS = 12     # non-view ops one recomputation may repeat (past this, the backward's pass is no longer cheap)
MAX_READ_RATIO = 3.0   # bytes the chain reads, at most this many times the value's bytes
MIN_BYTES = 64 * 1024  # smaller values are not worth a pass of their own

_VIEWS = {torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default,
          torch.ops.aten.permute.default, torch.ops.aten.transpose.int, torch.ops.aten.t.default,
          torch.ops.aten.expand.default, torch.ops.aten.unsqueeze.default, torch.ops.aten.squeeze.dim,
          torch.ops.aten.squeeze.dims, torch.ops.aten.squeeze.default, torch.ops.aten.alias.default,
          torch.ops.aten.slice.Tensor, torch.ops.aten.select.int}
# multi-output views: their items (``getitem``) are views of the input (the query, key and value of a fused product)
_SPLITS = {torch.ops.aten.split.Tensor, torch.ops.aten.split_with_sizes.default, torch.ops.aten.unbind.int,
           torch.ops.aten.chunk.default}
# tensors made from nothing but sizes (position indices): cheap to make again
_FACTORIES = {torch.ops.aten.arange.default, torch.ops.aten.arange.start, torch.ops.aten.arange.start_step,
              torch.ops.aten.full.default, torch.ops.aten.zeros.default, torch.ops.aten.ones.default,
              torch.ops.aten.scalar_tensor.default}
_CONVERSIONS = {torch.ops.aten._to_copy.default, torch.ops.prims.convert_element_type.default,
                torch.ops.aten.clone.default, torch.ops.aten.cat.default}  # (copies: a cat fuses as one)


@dataclasses.dataclass
class Recomputed:
    """What the pass moved from saved to recomputed: the values' names and bytes, and the forward inputs it had
    to hand to the backward (no memory: parameters and the batch are held anyway)."""
    names: list[str] = dataclasses.field(default_factory=list)
    nbytes: int = 0
    ops: int = 0
    products: int = 0  # of them matrix products and convolutions (only under a memory budget)
    inputs_added: int = 0
    budget: tuple[float, int, int] | None = None  # (the budget, saved bytes before it, after)
    largest: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # (bytes, "op [shape]") per value

    def describe(self) -> str:
        text = ""
        if self.names:
            text = (f"kiln recomputes {len(self.names)} more in the backward instead of saving them "
                    f"({self.nbytes / 2 ** 20:.2f} MiB fewer saved, {self.ops} ops repeated"
                    + (f", {self.products} of them products or convolutions" if self.products else "") + ")")
            if self.largest:
                counts: dict[tuple[int, str], int] = {}
                for item in self.largest:
                    counts[item] = counts.get(item, 0) + 1
                shown = sorted(counts.items(), reverse=True)[:3]
                text += " - largest: " + ", ".join(f"{what} {b / 2 ** 20:.2f} MiB" + (f" x{k}" if k > 1 else "")
                                                    for (b, what), k in shown)
        if self.budget is not None:
            budget, before, after = self.budget
            met = "met" if after <= budget * before else "not met: nothing more can be rebuilt"
            text += ("; " if text else "") + (f"memory budget {budget:g}: saved activations {before / 2 ** 20:.2f}"
                                              f" -> {after / 2 ** 20:.2f} MiB ({met})")
        return text


def tensor_bytes(node: torch.fx.Node) -> int:
    """Bytes of a node's tensor value at its traced sizes (0 for a value that is not a tensor)."""
    value = node.meta.get("val")
    if not isinstance(value, torch.Tensor):
        return 0
    numel = 1
    for d in value.shape:
        numel *= size_of(d)
    return numel * value.element_size()


def size_of(d: Any) -> int:
    """A size as a number: an int, or a SymInt's traced value (its hint; 1 where it has none)."""
    if isinstance(d, int):
        return d
    try:
        hint = d.node.hint
        return int(hint) if hint is not None else 1
    except Exception:  # noqa: BLE001 - an unusual size object: counted as 1
        return 1


def _split_item(node: torch.fx.Node) -> bool:
    """An item of a multi-output view (``getitem(split(x), i)``): a view of ``x``."""
    return (node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node)
            and node.args[0].target in _SPLITS)


def _recomputable(node: torch.fx.Node) -> bool:
    """An op the backward may repeat: pointwise (deterministic, not in place), a conversion, a view (an item of a
    split too), a tensor made from sizes alone."""
    if _split_item(node) or (node.op == "call_function" and node.target in _SPLITS):
        return True
    if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
        return False
    if not isinstance(node.meta.get("val"), torch.Tensor):
        return False
    target = node.target
    if target in _VIEWS or target in _CONVERSIONS or target in _FACTORIES:
        return True
    tags = target.tags
    if torch.Tag.pointwise not in tags or torch.Tag.nondeterministic_seeded in tags:
        return False
    return not target._schema.is_mutable


_PRODUCTS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
             torch.ops.aten.baddbmm.default}
_REPEATABLE = _PRODUCTS | {
    torch.ops.aten.convolution.default, torch.ops.aten._softmax.default, torch.ops.aten._log_softmax.default,
    torch.ops.aten.sum.dim_IntList, torch.ops.aten.mean.dim, torch.ops.aten.amax.default,
    torch.ops.aten.amin.default, torch.ops.aten.embedding.default}


def _repeatable(node: torch.fx.Node) -> bool:
    """A deterministic op of one tensor result that a memory budget may repeat in the backward: a product, a
    convolution, a softmax, a reduction, an embedding lookup."""
    return node.op == "call_function" and node.target in _REPEATABLE and isinstance(node.meta.get("val"),
                                                                                     torch.Tensor)


GPU_FLOPS_PER_BYTE = 300.0  # the machine balance the budget's cost model weighs bytes by (H100/H200 bf16 tensor
CPU_FLOPS_PER_BYTE = 20.0   # cores against HBM; an AVX-512 core against its share of DRAM): a rough ranking


def _is_view(node: torch.fx.Node) -> bool:
    return node.target in _VIEWS or node.target in _SPLITS or _split_item(node)


def _cost(node: torch.fx.Node, balance: float) -> float:
    """What repeating ``node`` costs, in FLOPs: a product's or convolution's multiply-adds, else the bytes it reads
    and writes times ``balance`` (views: nothing)."""
    if _is_view(node):
        return 0.0
    out = node.meta.get("val")
    if node.target in _PRODUCTS:
        a = node.args[1] if node.target in (torch.ops.aten.addmm.default, torch.ops.aten.baddbmm.default) \
            else node.args[0]
        k = size_of(a.meta["val"].shape[-1])
        return 2.0 * tensor_bytes(node) / out.element_size() * k
    if node.target is torch.ops.aten.convolution.default:
        weight = node.args[1].meta["val"]
        per_output = tensor_bytes(node.args[1]) / weight.element_size() / max(size_of(weight.shape[0]), 1)
        return 2.0 * tensor_bytes(node) / out.element_size() * per_output
    reads = sum(tensor_bytes(a) for a in node.all_input_nodes)
    return balance * (reads + tensor_bytes(node))


def _chain(value: torch.fx.Node, available: set[str], order: dict[torch.fx.Node, int],
           expensive: bool = False) -> tuple[list[torch.fx.Node], set[str]] | None:
    """The forward nodes that rebuild ``value`` from nodes named in ``available`` (what the backward has), in
    the forward's order (``order``: each forward node's position), and the names of those it reads; None where
    the value is not a short elementwise chain over them (a library call, a reduction, a random op, or too long /
    too wide a chain).  A
    normalization's output whose statistics the backward has counts as elementwise (``_normalized``).
    ``expensive``: products, convolutions and reductions may be repeated too, and the chain has no length limit
    ([Note: a memory budget])."""
    nodes: dict[torch.fx.Node, None] = {}
    leaves: set[str] = set()
    ops = 0  # non-view ops repeated (a normalization as four)
    stack = [value]
    while stack:
        node = stack.pop()
        if node in nodes:
            continue
        if node is not value and node.name in available:
            leaves.add(node.name)
            continue
        norm = _normalized(node, available)
        if norm is not None:
            nodes[node] = None
            ops += 4
            stack.extend(a for a in norm if isinstance(a, torch.fx.Node))
            continue
        if not (_recomputable(node) or (expensive and _repeatable(node))):
            return None
        nodes[node] = None
        ops += not _is_view(node)
        for arg in node.all_input_nodes:
            if not isinstance(arg.meta.get("val"), (torch.Tensor, list, tuple)) and arg.name not in available:
                return None  # a size the backward does not have
            stack.append(arg)
    if ops > MAX_CHAIN_OPS and not expensive:
        return None
    return sorted(nodes, key=order.__getitem__), leaves


# normalizations whose output (item 0) is elementwise given their statistics (items 1, 2: the mean and the
# reciprocal standard deviation): (input, weight, bias) argument positions, and whether the statistics are per
# channel (dimension 1: batch norm) or per row with the normalized dimensions kept as size 1 (layer norm)
_NORMALIZATIONS = {
    torch.ops.aten.native_layer_norm.default: ((0, 2, 3), False),
    torch.ops.aten._native_batch_norm_legit_functional.default: ((0, 1, 2), True),
    torch.ops.aten._native_batch_norm_legit.default: ((0, 1, 2), True),
    torch.ops.aten.native_batch_norm.default: ((0, 1, 2), True),
}


def _normalized(node: torch.fx.Node, available: set[str]) -> list[Any] | None:
    """For item 0 of a normalization whose mean and reciprocal standard deviation the backward has (and, for batch
    norm, in training mode: the statistics are the batch's): ``[input, weight, bias, mean, rstd]`` (weight and bias
    None where absent); else None."""
    if node.op != "call_function" or node.target is not operator.getitem or node.args[1] != 0:
        return None
    norm = node.args[0]
    if not isinstance(norm, torch.fx.Node) or norm.target not in _NORMALIZATIONS:
        return None
    (x, w, b), per_channel = _NORMALIZATIONS[norm.target]
    if per_channel and not _training_flag(norm):
        return None  # (evaluation mode: normalized by the running statistics, which the forward updates)
    val = node.meta.get("val")
    if per_channel and isinstance(val, torch.Tensor) and val.is_cuda:
        # (not on the GPU: ResNet-18's training step with batch norm's outputs rebuilt in the backward took
        # 15.7 ms against 9.5 without, H100, bf16 autocast - its NCHW channel reductions then read the rebuild's
        # inputs in kernels that parallelize over channels only; the CPU step is unchanged by it)
        return None
    stats = {u.args[1]: u for u in norm.users if u.target is operator.getitem}
    held = [_held_view(stats[i], available) if i in stats else None for i in (1, 2)]
    if held[0] is None or held[1] is None:
        return None
    args = list(norm.args) + [None] * 8
    return [args[x], args[w], args[b], held[0], held[1]]


def _held_view(stat: torch.fx.Node, available: set[str]) -> torch.fx.Node | None:
    """``stat`` where the backward has it, or a view of it the backward has (the partition often saves batch
    norm's mean as the ``[1, C, 1, 1]`` view its backward reads); None where it has neither, or only a view of a
    statistic whose sizes are symbols (viewing it back would need them)."""
    if stat.name in available:
        return stat
    if not all(isinstance(d, int) for d in stat.meta["val"].shape):
        return None
    stack = list(stat.users)
    while stack:
        user = stack.pop()
        if user.op != "call_function" or user.target not in _VIEWS:
            continue
        if user.name in available:
            return user
        stack.extend(user.users)
    return None


def _training_flag(norm: torch.fx.Node) -> bool:
    """A batch norm's ``training`` argument (position 5 in each overload of the table)."""
    value = norm.args[5] if len(norm.args) > 5 else norm.kwargs.get("training")
    return value is True


def _emit_normalized(graph: torch.fx.Graph, node: torch.fx.Node, parts: list[Any]) -> torch.fx.Node:
    """``(x - mean) * rstd [* weight] [+ bias]`` in ``graph`` (parts mapped to its nodes), in float32 and converted
    to the output's type; batch norm's per-channel vectors viewed as ``[1, C, 1, ...]``."""
    x, w, b, mean, rstd = parts
    out = node.meta["val"]
    per_channel = _NORMALIZATIONS[node.args[0].target][1]
    aten = torch.ops.aten
    fake = _fake_mode(out)

    def call(target: Any, *args: Any) -> torch.fx.Node:
        new = graph.call_function(target, tuple(args))
        with fake:
            new.meta["val"] = target(*[a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args])
        return new

    def channel(v: torch.fx.Node) -> torch.fx.Node:
        return call(aten.view.default, v, [1, -1] + [1] * (out.dim() - 2)) if per_channel else v

    def stat(v: torch.fx.Node, index: int) -> torch.fx.Node:
        if per_channel:
            return channel(v)
        shape = next(u for u in node.args[0].users if u.args[1] == index).meta["val"].shape
        return v if tuple(v.meta["val"].shape) == tuple(shape) else call(aten.view.default, v, list(shape))
    y = call(aten.mul.Tensor, call(aten.sub.Tensor, x, stat(mean, 1)), stat(rstd, 2))
    if w is not None:
        y = call(aten.mul.Tensor, y, channel(w))
    if b is not None:
        y = call(aten.add.Tensor, y, channel(b))
    if y.meta["val"].dtype != out.dtype:
        y = call(torch.ops.prims.convert_element_type.default, y, out.dtype)
    return y


def _fake_mode(value: torch.Tensor) -> Any:
    mode = getattr(value, "fake_mode", None)
    if mode is None:
        from torch._guards import detect_fake_mode
        mode = detect_fake_mode([value])
    return mode if mode is not None else contextlib.nullcontext()


class _Chooser:
    """Which saved values move to the backward: ``cheap()`` the note's short elementwise chains, ``within(budget)``
    more by cost per byte ([Note: a memory budget]).  ``chains`` maps each moved value's name to the forward nodes
    that rebuild it; ``kept`` names what stays saved; ``pinned`` what some rebuild reads (stays saved)."""

    def __init__(self, fw: torch.fx.GraphModule, saved: list, saved_tensors: list, user_outputs: list,
                 done: Recomputed):
        self.saved_tensors, self.done = saved_tensors, done
        self.kept = {s.name for s in saved}
        self.fw_inputs = {n.name for n in fw.graph.nodes if n.op == "placeholder"}
        self.fw_nodes = {n.name: n for n in fw.graph.nodes}
        self.order = _order_of(fw.graph)
        self.user_roots = {_storage_root(o) for o in user_outputs if isinstance(o, torch.fx.Node)}
        self.chains: dict[str, list[torch.fx.Node]] = {}
        self.leaves: dict[str, set[str]] = {}
        self.balance = GPU_FLOPS_PER_BYTE if any(s.meta["val"].is_cuda for s in saved_tensors) else \
            CPU_FLOPS_PER_BYTE

    @property
    def pinned(self) -> set[str]:
        """Saved values some rebuild reads."""
        return set().union(*self.leaves.values()) if self.leaves else set()

    def _movable(self, value: torch.fx.Node, pinned_too: bool = False) -> bool:
        """May ``value`` leave the saved set (``pinned_too``: even where a rebuild reads it, which then rebuilds
        it too), and would that free its memory?"""
        if value.name not in self.kept or value.op == "placeholder" or (value.name in self.pinned
                                                                      and not pinned_too):
            return False
        if value.meta.get("saved_tensor_with_no_vc_check", False):
            return False
        root = _storage_root(value)
        # its memory stays held anyway where it is an input's, a user output's, or another saved value's view's
        return not (root.op == "placeholder" or root in self.user_roots or any(
            _storage_root(self.fw_nodes[name]) is root for name in self.kept if name != value.name))
        # (several saved views of one memory - none of the benchmark's models has them after the min-cut - stay)

    def _chain(self, value: torch.fx.Node, expensive: bool) -> tuple[list[torch.fx.Node], set[str]] | None:
        return _chain(value, (self.kept - {value.name}) | self.fw_inputs, self.order, expensive)

    def _move(self, value: torch.fx.Node, nodes: list[torch.fx.Node], leaves: set[str]) -> None:
        self.kept.discard(value.name)
        for name, other in list(self.leaves.items()):  # rebuilds that read ``value`` now rebuild it first
            if value.name in other:
                self.chains[name] = sorted(set(self.chains[name]) | set(nodes), key=self.order.__getitem__)
                self.leaves[name] = (other - {value.name}) | leaves
        self.chains[value.name] = nodes
        self.leaves[value.name] = set(leaves)
        self.done.names.append(value.name)
        self.done.nbytes += tensor_bytes(value)
        self.done.largest.append((tensor_bytes(value), _label(nodes, value)))
        self.done.ops += sum(1 for n in nodes if not _is_view(n))  # (a normalization counts once)
        self.done.products += sum(1 for n in nodes if n.target in _PRODUCTS
                                  or n.target is torch.ops.aten.convolution.default)

    def cheap(self) -> None:
        for value in sorted(self.saved_tensors, key=tensor_bytes, reverse=True):
            size = tensor_bytes(value)
            if size < MIN_BYTES or not self._movable(value):
                continue
            found = self._chain(value, expensive=False)
            if found is None:
                continue
            nodes, leaves = found
            if sum(tensor_bytes(self.fw_nodes[name]) for name in leaves) > MAX_READ_RATIO * size:
                continue
            self._move(value, nodes, leaves)

    def held(self) -> int:
        """Bytes of activations the saved set holds (each memory counted once)."""
        roots = {_storage_root(self.fw_nodes[name]) for name in self.kept}
        return sum(tensor_bytes(r) for r in roots if r.op != "placeholder")  # (tensor_bytes: 0 for a size)

    def within(self, budget: float) -> None:
        """[Note: a memory budget] Move values until the saved bytes are at most ``budget`` times what the cheap
        step left, the cheapest rebuild per byte freed first: a rebuild's cost is its products' and
        convolutions' FLOPs plus the bytes its other ops read and write, weighted by the machine's FLOPs per byte
        (``GPU_FLOPS_PER_BYTE``, ``CPU_FLOPS_PER_BYTE``).  Stops where nothing more can move (what is left is
        then the forward's inputs' reach: values behind random ops, multi-output library calls, views of inputs);
        the report says whether the budget was met."""
        start = self.held()
        target = budget * start
        held = start
        while held > target:
            best = None
            for value in self.saved_tensors:
                if not self._movable(value, pinned_too=True) or tensor_bytes(value) == 0:
                    continue
                found = self._chain(value, expensive=True)
                if found is None:
                    continue
                readers = sum(value.name in other for other in self.leaves.values())  # (each rebuilds it again)
                per_byte = (1 + readers) * sum(_cost(n, self.balance) for n in found[0]) / tensor_bytes(value)
                if best is None or per_byte < best[0]:
                    best = (per_byte, value, found)
            if best is None:
                break
            _, value, (nodes, leaves) = best
            self._move(value, nodes, leaves)
            held = self.held()
        self.done.budget = (budget, start, held)


def recompute_saved(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, num_fwd_outputs: int,
                    budget: float = 1.0) -> Recomputed:
    """Move cheap saved values of a min-cut partition to the backward, in place on both graphs (the note above),
    then, for ``budget`` < 1, more until the saved bytes fit ([Note: a memory budget]).  Leaves the graphs as they
    were where their shape is not the one expected (the pass then does nothing)."""
    done = Recomputed()
    out_node = fw.graph.output_node()
    outputs = list(out_node.args[0])
    saved = outputs[num_fwd_outputs:]
    bw_inputs = {n.name: n for n in bw.graph.nodes if n.op == "placeholder"}
    fw_inputs = {n.name: n for n in fw.graph.nodes if n.op == "placeholder"}
    if not all(isinstance(s, torch.fx.Node) and s.name in bw_inputs for s in saved):
        return done  # not the layout this pass knows
    saved_tensors = [s for s in saved if isinstance(s.meta.get("val"), torch.Tensor)]
    if not saved_tensors:
        return done
    chooser = _Chooser(fw, saved, saved_tensors, outputs[:num_fwd_outputs], done)
    chooser.cheap()
    if budget < 1.0:
        chooser.within(budget)
    chains, kept = chooser.chains, chooser.kept
    if not chains:
        return done

    # forward inputs the backward now reads: handed over as saved tensors, first in the saved tensors' order
    needed = sorted({a.name for nodes in chains.values() for n in nodes for a in _reads(n, kept)
                     if a.name in fw_inputs and a.name not in bw_inputs})
    first_saved = next(bw_inputs[s.name] for s in saved if isinstance(s.meta.get("val"), torch.Tensor))
    with bw.graph.inserting_before(first_saved):
        for name in needed:
            placeholder = bw.graph.placeholder(name)
            placeholder.meta = dict(fw_inputs[name].meta)
            bw_inputs[name] = placeholder
    done.inputs_added = len(needed)

    bw_order = _order_of(bw.graph)  # (the original nodes' order: what is inserted below reads only placeholders)
    for name, nodes in chains.items():
        old = bw_inputs[name]
        first_user = min(old.users, key=bw_order.__getitem__) if old.users else None
        env: dict[torch.fx.Node, torch.fx.Node] = {}

        def mapped(arg: torch.fx.Node) -> torch.fx.Node:
            return env[arg] if arg in env else bw_inputs[arg.name]
        with bw.graph.inserting_before(first_user) if first_user is not None else bw.graph.inserting_after(old):
            for node in nodes:
                parts = _normalized(node, kept)
                if parts is not None:
                    env[node] = _emit_normalized(bw.graph, node,
                                                 [mapped(p) if isinstance(p, torch.fx.Node) else p for p in parts])
                else:
                    env[node] = bw.graph.node_copy(node, mapped)
        old.replace_all_uses_with(env[nodes[-1]])
        bw.graph.erase_node(old)

    removed = set(chains)
    kept_saved = [s for s in saved if s.name not in removed]
    new_saved = [fw_inputs[name] for name in needed] + kept_saved
    descs = out_node.meta.get("desc")
    out_node.args = (tuple(outputs[:num_fwd_outputs] + new_saved),)
    if isinstance(descs, list) and len(descs) == len(outputs) and all(d is not None for d in descs):
        kinds = [type(d) for s, d in zip(saved, descs[num_fwd_outputs:]) if s.name not in removed]
        plain = next((k for k in kinds if k.__name__ == "SavedForBackwardsAOTOutput"), None)
        kinds = [plain] * len(needed) + kinds
        out_node.meta["desc"] = descs[:num_fwd_outputs] + [k(i) if k is not None else None
                                                             for i, k in enumerate(kinds)]
    _tidy(fw, bw)
    return done


def _tidy(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule) -> None:
    """Both graphs after a rewrite: dead nodes gone, checked, their code made again."""
    for gm in (fw, bw):
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()


def _reads(node: torch.fx.Node, available: set[str]) -> list[torch.fx.Node]:
    """The nodes a chain node's recomputation reads: a normalization's parts, or its inputs."""
    parts = _normalized(node, available)
    return [p for p in parts if isinstance(p, torch.fx.Node)] if parts is not None else node.all_input_nodes


def _label(nodes: list[torch.fx.Node], value: torch.fx.Node) -> str:
    """What a moved value is, for the report: the last op of its rebuild that is not a view (a normalization by
    its name), and the value's shape."""
    op = next((n for n in reversed(nodes) if not _is_view(n)), value)
    name = op.args[0].target if op.target is operator.getitem and isinstance(op.args[0], torch.fx.Node) \
        else op.target
    text = getattr(name, "__name__", str(name)).split(".")[0].lstrip("_")
    return f"{text} {list(value.meta['val'].shape)}"


def _storage_root(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose memory a value lives in: itself, or for a view the root of what it views."""
    while node.op == "call_function" and node.args and isinstance(node.args[0], torch.fx.Node):
        if node.target in _VIEWS:
            node = node.args[0]
        elif _split_item(node):
            node = node.args[0].args[0]
        else:
            break
    return node


def _order_of(graph: torch.fx.Graph) -> dict[torch.fx.Node, int]:
    """Each node's position in ``graph``."""
    return {n: i for i, n in enumerate(graph.nodes)}


def _reads_nodes(args: list[Any]) -> bool:
    """Does any of ``args`` hold a graph node, also inside a list (a view's sizes under dynamic shapes:
    ``view(x, [primals_4, 12, 64])`` reads the forward's size symbol, which the backward does not have by that
    node - BERT trained over several lengths failed to capture: KeyError primals_4)?"""
    found: list[bool] = []
    torch.fx.node.map_arg(args, lambda n: found.append(True) or n)
    return bool(found)


def save_view_bases(fw: torch.fx.GraphModule, bw: torch.fx.GraphModule, num_fwd_outputs: int) -> int:
    """[Note: saved views travel as their bases] A saved value that is a strided view of another forward value
    (attention's ``transpose(q)``, ``[B*H, D, T]`` over a ``[B*H, T, D]`` buffer) reaches the backward as a
    non-contiguous input, which kiln's compiled backward reads through a contiguous copy - one copy of each such
    activation at every step (13 in a 4-layer GPT's backward; on the H100 28 ATen copy kernels a step).  Saving
    the view's base instead and taking the view again in the backward costs nothing: a view keeps its base's
    memory alive anyway, and a view op is free::

        before:  forward -> saved: transpose_22 (strided view of bmm_3)     backward: bmm(transpose_22, grad)
        after:   forward -> saved: bmm_3                                    backward: bmm(transpose(bmm_3), grad)

    Only chains of views (no size taken from another node, nor a symbolic size) over a contiguous base computed
    by the forward (not one of its inputs).  Returns how many saved values were replaced; the graphs are left as
    they were where there are none."""
    out_node = fw.graph.output_node()
    outputs = list(out_node.args[0])
    saved = outputs[num_fwd_outputs:]
    bw_inputs = {n.name: n for n in bw.graph.nodes if n.op == "placeholder"}
    if not all(isinstance(s, torch.fx.Node) and s.name in bw_inputs for s in saved):
        return 0
    swaps: list[tuple[torch.fx.Node, list[torch.fx.Node], torch.fx.Node]] = []  # (saved view, its chain, base)
    for s in saved:
        value = s.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.is_contiguous():
            continue
        chain, node = [], s
        while node.op == "call_function" and node.target in _VIEWS and isinstance(node.args[0], torch.fx.Node) \
                and not _reads_nodes([*node.args[1:], *node.kwargs.values()]):
            chain.append(node)
            node = node.args[0]
        base = node.meta.get("val")
        # (a forward input as the base - a transposed weight - stays a view: AOTAutograd hands saved inputs over
        # by its own rules, which a swap here broke under symbolic sizes)
        if not chain or node.op != "call_function" or not isinstance(base, torch.Tensor) or not base.is_contiguous():
            continue
        swaps.append((s, chain[::-1], node))
    if not swaps:
        return 0
    names = [s.name for s in saved]
    descs = out_node.meta.get("desc")
    described = isinstance(descs, list) and len(descs) == len(outputs) and all(d is not None for d in descs)
    kinds = [type(d) for d in descs[num_fwd_outputs:]] if described else [None] * len(saved)
    for view, chain, base in swaps:
        old = bw_inputs[view.name]
        position = names.index(view.name)
        if base.name in names:  # (the base is saved already: the view goes, its users read the base's input)
            source = bw_inputs[base.name]
            del names[position], saved[position], kinds[position]
        else:
            with bw.graph.inserting_before(old):
                source = bw.graph.placeholder(base.name)
            source.meta = dict(base.meta)
            bw_inputs[base.name] = source
            names[position] = base.name
            saved[position] = base
        env = {base: source}
        anchor = min(old.users, key=_order_of(bw.graph).__getitem__) if old.users else None
        with bw.graph.inserting_before(anchor) if anchor is not None else bw.graph.inserting_after(source):
            for node in chain:
                env[node] = bw.graph.node_copy(node, lambda a: env[a])
        old.replace_all_uses_with(env[chain[-1]])
        bw.graph.erase_node(old)
    out_node.args = (tuple(outputs[:num_fwd_outputs] + saved),)
    if described:
        out_node.meta["desc"] = descs[:num_fwd_outputs] + [k(i) for i, k in enumerate(kinds)]
    _tidy(fw, bw)
    return len(swaps)
