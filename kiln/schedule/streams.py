"""CPU: pointwise kernels over many independent arrays split into loops over few arrays each.

[Note: loops over few streams] Horizontal fusion ([Note: horizontal fusion], schedule/fuse.py) joins every
elementwise chain of one iteration space into one kernel: an optimizer step over 8 weight matrices becomes one loop
that, per element, reads and writes 8 parameters, 8 momenta and reads 8 gradients - 40 memory streams at once.  A
core's hardware prefetchers follow a limited number of streams; past it, loads wait on memory.  Measured on the Zen
5 dev box (one thread, 8 x [512, 512] SGD with momentum, `benchmarks/optimizer_step.py`): one joined loop 0.84 ms,
a loop per parameter 0.70 ms (Inductor 0.67).  The join itself is worth keeping - it is what turns an AdamW
step's 64 kernels into a few, and on the GPU a launch per parameter would cost more than the streams - so on the
CPU a joined kernel's stores are split instead into the independent parts they are made of (stores that share no
buffer), packed in order into loops of at most ``MAX_STREAMS`` buffers each::

    before: kernel_0   loop i: p0, m0 <- f(p0, m0, g0); p1, m1 <- f(p1, m1, g1); ... p7, m7 <- ...   (24 arrays)
    after:  kernel_0_0 loop i: p0, m0 <- ...; p1, m1 <- ...                                          (6 arrays)
            kernel_0_1 loop i: p2, m2 <- ...; p3, m3 <- ...   ...

Only arrays larger than a core's L2 share matter (``MIN_BYTES`` each): small ones stay joined.  Parts that share
a buffer (a value two stores load, a stored value another store reads back) are never split apart.
"""
from __future__ import annotations

import dataclasses

import torch

from kiln.ir.kernel import FullLoop, KLoad, Kernel, Store, index_exprs, subexprs
from kiln.ir.ops import numel
from kiln.ir.program import Plan

MAX_STREAMS = 8  # buffers a split loop reads or writes at most (a part larger than this stays whole)
MIN_BYTES = 1 << 20  # arrays below this fit a core's L2: their loops are not split


def _buffers(st: Store) -> set[str]:
    """The arrays a store streams through: its own and those it loads (a scalar every element reads - a step
    count, a bias correction - is no stream, and joins no parts)."""
    found = {st.buf}
    for e in (st.value, *index_exprs(st.index)):
        found |= {x.buf for x in subexprs(e) if isinstance(x, KLoad) and not x.index.is_const()}
    return found


def arrays(k: Kernel) -> set[str]:
    """The arrays a pointwise kernel streams through (``_buffers`` of its stores)."""
    return set().union(*(_buffers(st) for p in k.phases for st in p.stores))


def _parts(stores: list[Store]) -> list[list[int]]:
    """The stores' indices grouped into parts that share no buffer (in store order)."""
    parent = list(range(len(stores)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i
    owner: dict[str, int] = {}
    for i, st in enumerate(stores):
        for b in _buffers(st):
            if b in owner:
                parent[find(i)] = find(owner[b])
            else:
                owner[b] = i
    parts: dict[int, list[int]] = {}
    for i in range(len(stores)):
        parts.setdefault(find(i), []).append(i)
    return list(parts.values())


def _split(k: Kernel, dtype_of: dict[str, torch.dtype]) -> list[Kernel] | None:
    """``k``'s loops over few arrays, or None where it stays whole."""
    if k.is_reduction or k.scratch or len(k.phases) != 1 or not isinstance(k.phases[0], FullLoop):
        return None
    loop = k.phases[0]
    size = numel(k.outer)
    if not isinstance(size, int):
        return None
    everything = arrays(k)
    if len(everything) <= MAX_STREAMS or any(
            size * torch.empty((), dtype=dtype_of.get(b, torch.float32)).element_size() < MIN_BYTES
            for b in everything):
        return None
    parts = _parts(loop.stores)
    if len(parts) < 2:
        return None
    bins: list[tuple[list[int], set[str]]] = []
    for part in parts:
        used = set().union(*(_buffers(loop.stores[i]) for i in part))
        if bins and len(bins[-1][1] | used) <= MAX_STREAMS:
            bins[-1][0].extend(part)
            bins[-1][1].update(used)
        else:
            bins.append((list(part), used))
    if len(bins) < 2:
        return None
    kernels = []
    for j, (members, used) in enumerate(bins):
        stores = [loop.stores[i] for i in sorted(members)]
        kernels.append(dataclasses.replace(
            k, name=f"{k.name}_{j}", phases=[FullLoop(stores, loop.old_values & {st.buf for st in stores})],
            reason=k.reason + f"; loop {j + 1} of {len(bins)}: {len(used)} of the kernel's {len(everything)} "
                              f"arrays ([Note: loops over few streams])"))
    return kernels


def split_streams(plan: Plan) -> Plan:
    """``plan`` with its wide pointwise kernels split into loops over few arrays (module docstring)."""
    dtype_of = {name: n.dtype for n, name in plan.buffer_of.items()}
    node_of = {name: n for n, name in plan.buffer_of.items()}
    replaced: dict[int, list[Kernel]] = {}
    for s in plan.steps:
        parts = _split(s, dtype_of) if isinstance(s, Kernel) else None
        if parts is not None:
            for part in parts:  # (the nodes each part stores, for the report; all where none is found)
                stored = {st.buf for st in part.phases[0].stores}
                mine = {node_of.get(b) for b in stored} | {plan.stored_into.get(b) for b in stored}
                part.nodes = [n for n in s.nodes if n in mine] or list(s.nodes)
            replaced[id(s)] = parts
    if replaced:
        plan.steps = [p for s in plan.steps for p in replaced.get(id(s), [s])]
        plan.kernels = [p for k in plan.kernels for p in replaced.get(id(k), [k])]
    return plan
