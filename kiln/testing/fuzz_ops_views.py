"""The fuzzer's op table, part 2: views (index maps in kiln), split/cat/stack, gather/index_select/indexing,
and in-place ops on intermediates (and, rarely, on inputs).  All exact: any correct implementation gives the
same bits, so their results compare bitwise unless a rounded op fed them."""
from __future__ import annotations

import math
from typing import Any

from kiln.testing.fuzz_program import Stmt


def _sl(start: int | None, stop: int | None, step: int) -> str:
    text = f"{'' if start is None else start}:{'' if stop is None else stop}"
    return text + (f":{step}" if step != 1 else "")


def reshape(g: Any) -> Stmt | None:
    """reshape/view/flatten/unflatten: merge two adjacent dims, split one, or flatten everything."""
    x = g.pick(None, lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    s = list(x.shape)
    r = g.rng.random()
    (out,) = g.names(1)
    if r < 0.3 and len(s) >= 2:
        i = g.rng.randrange(len(s) - 1)
        if g.rng.random() < 0.5:
            return Stmt(f"{out} = {x.name}.flatten({i}, {i + 1})", (out,), (x.name,), "flatten")
        new = s[:i] + [s[i] * s[i + 1]] + s[i + 2:]
    elif r < 0.7:
        i = g.rng.randrange(len(s))
        f = g.choice([d for d in range(1, s[i] + 1) if s[i] % d == 0] or [1])
        if g.rng.random() < 0.3:
            return Stmt(f"{out} = {x.name}.unflatten({i}, ({f}, {s[i] // f}))", (out,), (x.name,), "unflatten")
        new = s[:i] + [f, s[i] // f] + s[i + 1:]
    else:
        new = [-1] if g.rng.random() < 0.5 else [1, math.prod(s)]
    if new != [-1] and g.rng.random() < 0.3:
        new[g.rng.randrange(len(new))] = -1
    method = "view" if g.rng.random() < 0.3 and g.val(x).is_contiguous() else "reshape"
    return Stmt(f"{out} = {x.name}.{method}({', '.join(map(str, new))})", (out,), (x.name,), method)


def permute(g: Any) -> Stmt | None:
    """permute/transpose/t/mT/movedim."""
    x = g.pick(None, lambda v: len(v.shape) >= 2)
    if x is None:
        return None
    r = len(x.shape)
    (out,) = g.names(1)
    form = g.rng.random()
    if form < 0.4:
        perm = list(range(r))
        g.rng.shuffle(perm)
        return Stmt(f"{out} = {x.name}.permute({', '.join(map(str, perm))})", (out,), (x.name,), "permute")
    a, b = g.rng.sample(range(-r, r), 2) if r > 1 else (0, 0)
    if form < 0.7:
        return Stmt(f"{out} = {x.name}.transpose({a}, {b})", (out,), (x.name,), "transpose")
    if form < 0.85:
        return Stmt(f"{out} = {x.name}.t()" if r == 2 else f"{out} = {x.name}.mT", (out,), (x.name,), "t")
    return Stmt(f"{out} = torch.movedim({x.name}, {a % r}, {b % r})", (out,), (x.name,), "movedim")


def expand(g: Any) -> Stmt | None:
    """expand size-1 dims and/or add leading dims (the result's memory overlaps itself: never written)."""
    x = g.pick(None, lambda v: len(v.shape) <= 4)
    if x is None:
        return None
    shape = [g.rng.randint(2, 4) if d == 1 and g.rng.random() < 0.8 else d for d in x.shape]
    lead = [g.rng.randint(1, 3) for _ in range(g.rng.randint(0 if shape != list(x.shape) else 1, 2))]
    shape = lead + shape
    if math.prod(shape) > g.max_numel:
        return None
    args = ", ".join(str(d if (i < len(lead) or d != x.shape[i - len(lead)]) or g.rng.random() < 0.5 else -1)
                     for i, d in enumerate(shape))
    (out,) = g.names(1)
    form = "{x}.expand({a})" if g.rng.random() < 0.8 else "torch.broadcast_to({x}, ({a},))"
    return Stmt(f"{out} = {form.format(x=x.name, a=args)}", (out,), (x.name,), "expand")


def slice_(g: Any) -> Stmt | None:
    """Basic indexing: slices with offsets and steps (negative bounds too), select, narrow, None."""
    x = g.pick(None, lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    r = len(x.shape)
    d = g.rng.randrange(r)
    size = x.shape[d]
    (out,) = g.names(1)
    kind = g.rng.random()
    if kind < 0.25 and size > 0:
        i = g.rng.randrange(-size, size)
        text = f"{x.name}.select({d}, {i})" if g.rng.random() < 0.3 else f"{x.name}[{':, ' * d}{i}]"
        return Stmt(f"{out} = {text}", (out,), (x.name,), "select")
    if kind < 0.4 and size > 0:
        start = g.rng.randrange(size)
        length = g.rng.randint(1, size - start)
        return Stmt(f"{out} = {x.name}.narrow({d}, {start}, {length})", (out,), (x.name,), "narrow")
    if kind < 0.5:
        idx = ", ".join([":"] * d + ["None"])
        return Stmt(f"{out} = {x.name}[{idx}]", (out,), (x.name,), "index_none")
    start = g.rng.randint(-size, size - 1) if size and g.rng.random() < 0.7 else None
    stop = g.rng.randint(-size + 1, size) if size and g.rng.random() < 0.4 else None
    step = g.choice([1, 1, 2, 3])
    lo = 0 if start is None else start % size if size else 0
    hi = size if stop is None else stop % size if stop < 0 else stop
    if hi <= lo and g.rng.random() < 0.9:  # empty slices: rarely
        return None
    idx = f"..., {_sl(start, stop, step)}" if d == r - 1 and r > 1 else ", ".join([":"] * d + [_sl(start, stop, step)])
    return Stmt(f"{out} = {x.name}[{idx}]", (out,), (x.name,), "slice")


def reshape_misc(g: Any) -> Stmt | None:
    """unsqueeze/squeeze/flip/roll/repeat/tril/pad/diagonal/unfold/contiguous/clone/channels_last."""
    x = g.pick(None, lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    r, s = len(x.shape), x.shape
    (out,) = g.names(1)
    forms = [f"{x.name}.unsqueeze({g.rng.randint(-r - 1, r)})", f"{x.name}.squeeze({g.rng.randrange(-r, r)})",
             f"{x.name}.flip({g.rng.randrange(r)})", f"{x.name}.clone()", f"{x.name}.contiguous()",
             f"torch.roll({x.name}, {g.rng.randint(-2, 3)}, {g.rng.randrange(r)})"]
    if 1 in s:
        forms.append(f"{x.name}.squeeze()")
    if math.prod(s) * 4 <= g.max_numel:
        forms.append(f"{x.name}.repeat({', '.join(str(g.rng.randint(1, 2)) for _ in range(r + g.rng.randint(0, 1)))})")
    if r >= 2:
        forms += [f"torch.tril({x.name}, {g.rng.randint(-1, 1)})", f"{x.name}.triu({g.rng.randint(-1, 1)})",
                  f"torch.diagonal({x.name}, {g.rng.randint(-1, 1)}, {r - 2}, {r - 1})"]
    if x.dtype == "float":
        pads = ", ".join(str(g.rng.randint(-1 if s[-1] > 2 else 0, 2)) for _ in range(2 * min(r, 2)))
        forms.append(f"F.pad({x.name}, ({pads},), value={g.choice(['0.0', '-0.5'])})")
    if r == 4:
        forms.append(f"{x.name}.contiguous(memory_format=torch.channels_last)")
    d = g.rng.randrange(r)
    if s[d] >= 2:
        size = g.rng.randint(1, s[d])
        forms.append(f"{x.name}.unfold({d}, {size}, {g.rng.randint(1, 2)})")
    text = g.choice(forms)
    return Stmt(f"{out} = {text}", (out,), (x.name,), text.split("(")[0].split(".")[-1])


def split(g: Any) -> Stmt | None:
    """split (sizes or a chunk size), chunk, unbind, tensor_split: several views at once."""
    x = g.pick(None, lambda v: len(v.shape) >= 1 and max(v.shape) >= 2)
    if x is None:
        return None
    r = len(x.shape)
    d = g.choice([i for i in range(r) if x.shape[i] >= 2])
    size = x.shape[d]
    kind = g.rng.random()
    if kind < 0.35:
        cut = g.rng.randint(1, size - 1)
        text = "{x}.split([{a}, {b}], dim={d})"
        outs = g.names(2)
        return Stmt(f"{', '.join(outs)} = " + text.format(x=x.name, a=cut, b=size - cut, d=d), tuple(outs),
                    (x.name,), "split_sizes")
    if kind < 0.6:
        k = g.rng.randint(max(1, (size + 3) // 4), size - 1)
        n = -(-size // k)
        outs = g.names(n)
        return Stmt(f"{', '.join(outs)} = torch.split({x.name}, {k}, {d})", tuple(outs), (x.name,), "split")
    if kind < 0.8:
        n = g.rng.randint(2, min(4, size))
        per = -(-size // n)
        outs = g.names(len(range(0, size, per)))
        return Stmt(f"{', '.join(outs)} = {x.name}.chunk({n}, dim={d})", tuple(outs), (x.name,), "chunk")
    if size <= 4:
        outs = g.names(size)
        return Stmt(f"{', '.join(outs)}, = {x.name}.unbind({d})", tuple(outs), (x.name,), "unbind")
    outs = g.names(3)
    return Stmt(f"{', '.join(outs)} = torch.tensor_split({x.name}, 3, dim={d})", tuple(outs), (x.name,),
                "tensor_split")


def cat(g: Any) -> Stmt | None:
    """cat along a dim (sizes along it may differ) or stack (same shapes), of 2-3 tensors, sometimes one
    tensor twice."""
    x = g.pick(None, lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    r = len(x.shape)
    stack = g.rng.random() < 0.3
    d = g.rng.randrange(-r - 1, r + 1) if stack else g.rng.randrange(-r, r)
    parts = [x]
    for _ in range(g.rng.randint(1, 2)):
        if g.rng.random() < 0.2:
            parts.append(x)
            continue
        want = list(x.shape)
        if not stack:
            want[d] = -1
        other = g.pick(x.dtype, lambda v: v.name != x.name and len(v.shape) == r and all(
            w in (-1, s) for w, s in zip(want, v.shape)))
        if other is None:
            if not stack:
                want[d] = g.rng.randint(1, 5)
            other = g.new_input(x.dtype, tuple(want))
        parts.append(other)
    names = ", ".join(p.name for p in parts)
    (out,) = g.names(1)
    text = f"torch.stack([{names}], dim={d})" if stack else \
        g.choice([f"torch.cat([{names}], dim={d})", f"torch.cat(({names}), {d})"])
    return Stmt(f"{out} = {text}", (out,), tuple(dict.fromkeys(p.name for p in parts)), "stack" if stack else "cat")


def gather(g: Any) -> Stmt | None:
    """gather / index_select / advanced indexing / embedding, with int64 indices from an input or from the
    program (an argmax, a cast) when their values are in range."""
    x = g.pick(("float", "int64"), lambda v: len(v.shape) >= 1 and v.numel() > 0)
    if x is None:
        return None
    r = len(x.shape)
    d = g.rng.randrange(r)
    size = x.shape[d]
    (out,) = g.names(1)
    kind = g.rng.random()
    if kind < 0.45:
        shape = tuple(g.rng.randint(1, size + 2) if i == d else g.rng.randint(1, s) if s else 0
                      for i, s in enumerate(x.shape))
        idx = g.index(shape, size, lambda v: len(v.shape) == r and all(
            a <= b for i, (a, b) in enumerate(zip(v.shape, x.shape)) if i != d))
        form = g.choice(["torch.gather({x}, {d}, {i})", "{x}.gather({d}, {i})"])
        return Stmt(f"{out} = {form.format(x=x.name, d=d - r if g.rng.random() < 0.3 else d, i=idx.name)}",
                    (out,), (x.name, idx.name), "gather")
    if kind < 0.7:
        idx = g.index((g.rng.randint(1, size + 3),), size, lambda v: len(v.shape) == 1)
        return Stmt(f"{out} = {x.name}.index_select({d}, {idx.name})", (out,), (x.name, idx.name), "index_select")
    if kind < 0.9:
        idx = g.index(g.rand_shape(g.rng.randint(1, 2)), size, lambda v: len(v.shape) <= 2)
        sel = ", ".join([":"] * d + [idx.name])
        return Stmt(f"{out} = {x.name}[{sel}]", (out,), (x.name, idx.name), "index")
    if r != 2 or x.dtype != "float":
        return None
    idx = g.index(g.rand_shape(g.rng.randint(1, 2)), x.shape[0], lambda v: len(v.shape) <= 2)
    return Stmt(f"{out} = F.embedding({idx.name}, {x.name})", (out,), (x.name, idx.name), "embedding")


# in-place forms: name -> (template, exact)
INPLACE = {"add_": ("{t}.add_(0.5)", False), "mul_": ("{t}.mul_(1.5)", False), "mul_2": ("{t}.mul_(2.0)", True),
           "clamp_": ("{t}.clamp_(-1.0, 1.0)", True), "relu_": ("{t}.relu_()", True),
           "sigmoid_": ("{t}.sigmoid_()", False), "add_t": ("{t}.add_({u})", False), "mul_t": ("{t}.mul_({u})", False),
           "copy_": ("{t}.copy_({u})", True), "masked_fill_": ("{t}.masked_fill_({m}, 0.25)", True),
           "setitem": ("{t}[{sl}] = 1.5", True), "setitem_t": ("{t}[{sl}] = {w}", True),
           "sub_t": ("{t}.sub_({u}, alpha=0.5)", False), "div_2": ("{t}.div_(2.0)", True),
           # rows written at distinct indices (a static KV cache's update: kiln makes it in place where it may)
           "index_copy_": ("{t}.index_copy_(0, {p}, {v})", True), "index_setitem": ("{t}[{p}] = {v}", True),
           "index_put_acc": ("{t}.index_put_(({p},), {v}, accumulate=True)", False)}
INPLACE_INT = {"add_": ("{t}.add_(1)", True), "mul_": ("{t}.mul_(2)", True), "clamp_": ("{t}.clamp_(-1, 3)", True),
               "setitem": ("{t}[{sl}] = 7", True), "index_copy_": ("{t}.index_copy_(0, {p}, {v})", True)}


def inplace(g: Any) -> Stmt | None:
    """An in-place op on an intermediate (or a view of one: the base changes too), rarely on an input or a
    view of one (the caller's tensor changes: the runner compares inputs after the call)."""
    ok_input = g.rng.random() < 0.3
    t = g.pick(("float", "int64"), lambda v: g.writable(v) and (ok_input or not g.aliases_input(v)))
    if t is None:
        return None
    forms = INPLACE if t.dtype == "float" else INPLACE_INT
    name = g.choice(list(forms))
    form, exact = forms[name]
    if "{p}" in form and g.rng.random() < 0.5:  # rows written into a caller's tensor, as a static KV cache is
        cache = g.pick(t.dtype, lambda v: v.name.startswith("x") and g.writable(v) and bool(v.shape))
        t = cache if cache is not None else t
    uses = [t.name]
    fill = {"t": t.name}
    if "{u}" in form:
        u = g.pick(("float", "int64", "bool") if "add_" in form else "float", lambda v: len(v.shape) <= len(t.shape) and
                   g.bshape(v.shape, t.shape) == t.shape and not g.same_storage(v, t))
        if u is None:
            u = g.new_input("float", g.reduced_shape(t.shape))
        fill["u"] = u.name
        uses.append(u.name)
    if "{m}" in form:
        m = g.new_input("bool", g.reduced_shape(t.shape))
        fill["m"] = m.name
        uses.append(m.name)
    if "{sl}" in form:
        if not t.shape or t.shape[0] == 0:
            return None
        a = g.rng.randrange(t.shape[0])
        fill["sl"] = f"{a}:{g.rng.randint(a + 1, t.shape[0])}"
        if "{w}" in form:
            n_rows = int(fill["sl"].split(":")[1]) - a
            w = g.new_input("float", g.reduced_shape((n_rows, *t.shape[1:])))
            fill["w"] = w.name
            uses.append(w.name)
    if "{p}" in form:
        if not t.shape or t.shape[0] == 0:
            return None
        rows = g.rng.randint(1, t.shape[0])
        p = g.new_input("int64", (rows,), kind=f"perm:{t.shape[0]}", layout="contiguous")
        v = g.new_input(t.dtype, (rows, *t.shape[1:]))
        fill.update(p=p.name, v=v.name)
        uses += [p.name, v.name]
    return Stmt(form.format(**fill), (), tuple(uses), "inplace_" + name,
                mutates=t.name, noise="" if exact else "pw", weight=0 if exact else 1)
