"""The fuzzer's op table, part 3: the ops kiln sends to libraries or its own library kernels - matmul, mm,
bmm, linear, addmm, baddbmm (operands transposed, sliced, expanded), conv2d/conv1d (stride, padding,
dilation, groups, channels-last inputs), avg/max/adaptive pooling and scaled_dot_product_attention (no mask,
a bool or float mask, causal).

Their error model (``noise``): a dot product of ``K`` terms errs by about ``sqrt(K) * max|a| * max|b|``
roundoffs (blocked and vectorized accumulation orders differ between libraries).
"""
from __future__ import annotations

from typing import Any

from kiln.testing.fuzz_program import Stmt


def _mat(g: Any, shape: tuple[int, ...], uses: list[str]) -> str:
    """An operand of ``shape`` for a contraction: a value of that shape, the transpose of one, an expanded
    lower-rank one, or a new input (possibly transposed/sliced in memory)."""
    v = g.pick("float", lambda w: w.shape == shape)
    if v is not None and g.rng.random() < 0.7:
        uses.append(v.name)
        return v.name
    if len(shape) >= 2:
        t = g.pick("float", lambda w: w.shape == (*shape[:-2], shape[-1], shape[-2]))
        if t is not None and g.rng.random() < 0.7:
            uses.append(t.name)
            return f"{t.name}.transpose(-1, -2)" if len(shape) > 2 else f"{t.name}.t()"
    if len(shape) == 3 and g.rng.random() < 0.25:
        w = g.operand(shape[1:], "float")
        uses.append(w.name)
        return f"{w.name}.expand({shape[0]}, -1, -1)"
    w = g.new_input("float", shape, kind=g.choice(["uniform", "small", "normal"]))
    uses.append(w.name)
    return w.name


def matmul(g: Any) -> Stmt | None:
    """mm / @ / matmul (broadcast batch dims) / bmm / linear / addmm / baddbmm."""
    kind = g.choice(["mm", "matmul", "matmul", "bmm", "linear", "linear", "addmm", "baddbmm"])
    rank = {"mm": 2, "addmm": 2, "bmm": 3, "baddbmm": 3, "linear": g.rng.randint(1, 3),
            "matmul": g.rng.randint(1, 4)}[kind]
    a = g.pick("float", lambda v: len(v.shape) == rank and v.numel() > 0)
    if a is None:
        a = g.new_input("float", g.rand_shape(rank))
    k = a.shape[-1]
    n = g.dim()
    uses = [a.name]
    (out,) = g.names(1)
    if kind == "linear":
        w = _mat(g, (n, k), uses)
        bias = g.operand((n,), "float").name if g.rng.random() < 0.6 else None
        uses += [bias] if bias else []
        text = f"F.linear({a.name}, {w}{', ' + bias if bias else ''})"
    elif kind in ("addmm", "baddbmm"):
        batch = a.shape[:-2]
        b = _mat(g, (*batch, k, n), uses)
        bshape = g.choice([(n,), (1, n), a.shape[:-1] + (n,)])
        c = g.operand(bshape, "float")
        uses.append(c.name)
        scal = g.choice(["", ", beta=0.5", ", alpha=2.0", ", beta=2.0, alpha=0.5"])
        text = f"torch.{kind}({c.name}, {a.name}, {b}{scal})"
    else:
        text = f"{_contraction(g, kind, a, k, n, uses)}"
        if text is None:
            return None
    names = list(dict.fromkeys(uses))
    big = " * ".join(f"mx({u})" for u in (names + names)[:2])  # a @ a.t(): |a|^2
    return Stmt(f"{out} = {text}", (out,), tuple(names), kind, noise=f"sq({k}) * {big} + mx({names[-1]})",
                weight=2)


def _contraction(g: Any, kind: str, a: Any, k: int, n: int, uses: list[str]) -> str:
    rank = len(a.shape)
    if kind == "mm":
        b = _mat(g, (k, n), uses)
        return g.choice([f"torch.mm({a.name}, {b})", f"{a.name} @ {b}"])
    if kind == "bmm":
        b = _mat(g, (a.shape[0], k, n), uses)
        return f"torch.bmm({a.name}, {b})"
    r = g.rng.random()
    if rank == 1 or r < 0.2:
        shape: tuple[int, ...] = (k,) if r < 0.1 or rank == 1 and r < 0.5 else (k, n)
    elif r < 0.6:
        shape = (k, n)
    else:  # batched, broadcasting against a's batch dims
        batch = tuple(d if g.rng.random() < 0.7 else 1 for d in a.shape[:-2])
        shape = (*batch[g.rng.randint(0, len(batch)):], k, n) if batch else (g.rng.randint(1, 3), k, n)
    return f"torch.matmul({a.name}, {_mat(g, shape, uses)})"


def conv(g: Any) -> Stmt | None:
    """conv2d (unbatched 3-D or 4-D input, sometimes channels-last) or conv1d, with groups (depthwise too),
    stride, padding ('same' too), dilation, bias."""
    two_d = g.rng.random() < 0.85
    rank = (4 if g.rng.random() < 0.85 else 3) if two_d else 3
    x = g.pick("float", lambda v: len(v.shape) == rank and v.numel() > 0 and min(v.shape[-2:]) >= 1)
    if x is None or g.rng.random() < 0.3:
        c = g.choice([1, 2, 3, 4, 8])
        spatial = (g.rng.randint(3, 9), g.rng.randint(3, 9))[: 2 if two_d else 1]
        lead = (g.rng.randint(1, 2),) if rank - len(spatial) == 2 else ()
        layout = "channels_last" if rank == 4 and g.rng.random() < 0.4 else None
        x = g.new_input("float", (*lead, c, *spatial), layout=layout)
    c = x.shape[-3] if two_d else x.shape[-2]
    groups = g.choice([1, 1, 1, c] + [d for d in range(2, c) if c % d == 0])
    cout = groups * g.rng.randint(1, max(1, 8 // groups))
    ks = [g.choice([1, 2, 3, 3]) for _ in range(2 if two_d else 1)]
    spatial = x.shape[-2:] if two_d else x.shape[-1:]
    dil = 2 if g.rng.random() < 0.15 else 1
    stride = g.choice([1, 1, 2])
    pad = g.choice(["0", "1", "'same'"]) if stride == 1 else g.choice(["0", "1"])
    p = 1 if pad == "1" else 0
    if pad != "'same'" and any(s + 2 * p - dil * (k - 1) - 1 < 0 for s, k in zip(spatial, ks)):
        return None
    w = g.new_input("float", (cout, c // groups, *ks), kind=g.choice(["uniform", "small"]))
    uses = [x.name, w.name]
    bias = ""
    if g.rng.random() < 0.5:
        b = g.operand((cout,), "float")
        bias, uses = f", {b.name}", uses + [b.name]
    args = f"stride={stride}, padding={pad}" + (f", dilation={dil}" if dil > 1 else "") + \
        (f", groups={groups}" if groups > 1 else "")
    (out,) = g.names(1)
    fn = "conv2d" if two_d else "conv1d"
    kk = c // groups * ks[0] * (ks[1] if two_d else 1)
    return Stmt(f"{out} = F.{fn}({x.name}, {w.name}{bias}, {args})", (out,), tuple(uses), fn,
                noise=f"sq({kk}) * mx({x.name}) * mx({w.name})" + (f" + mx({uses[-1]})" if bias else ""),
                weight=2)


def pool(g: Any) -> Stmt | None:
    """max_pool2d / avg_pool2d (padding, stride, ceil_mode, count_include_pad) / adaptive_avg_pool2d."""
    x = g.pick("float", lambda v: len(v.shape) in (3, 4) and v.numel() > 0 and min(v.shape[-2:]) >= 2)
    if x is None:
        x = g.new_input("float", (g.rng.randint(1, 2), g.rng.randint(1, 4), g.rng.randint(4, 9),
                                  g.rng.randint(4, 9)), layout="channels_last" if g.rng.random() < 0.3 else None)
    h, w = x.shape[-2:]
    kind = g.choice(["max_pool2d", "avg_pool2d", "adaptive_avg_pool2d"])
    (out,) = g.names(1)
    if kind == "adaptive_avg_pool2d":
        oh, ow = g.rng.randint(1, h), g.rng.randint(1, w)
        return Stmt(f"{out} = F.adaptive_avg_pool2d({x.name}, ({oh}, {ow}))", (out,), (x.name,), kind,
                    noise=f"mx({x.name})", weight=1)
    k = g.rng.randint(2, min(3, h, w))
    s = g.choice([1, 2, k])
    p = g.rng.randint(0, k // 2)
    ceil = g.rng.random() < 0.3
    args = f"{k}, stride={s}, padding={p}" + (", ceil_mode=True" if ceil else "")
    if kind == "avg_pool2d":
        args += ", count_include_pad=False" if g.rng.random() < 0.3 else ""
        return Stmt(f"{out} = F.avg_pool2d({x.name}, {args})", (out,), (x.name,), kind,
                    noise=f"mx({x.name})", weight=1)
    return Stmt(f"{out} = F.max_pool2d({x.name}, {args})", (out,), (x.name,), kind)


def attention(g: Any) -> Stmt | None:
    """F.scaled_dot_product_attention: 3-D or 4-D q/k/v, no mask / bool mask / float mask / causal, scale."""
    rank = g.choice([3, 4, 4])
    q = g.pick("float", lambda v: len(v.shape) == rank and v.numel() > 0 and v.shape[-1] <= 16)
    if q is None:
        q = g.new_input("float", g.rand_shape(rank))
    lq, e = q.shape[-2:]
    s, ev = g.rng.randint(1, 9), g.dim()
    uses = [q.name]
    k = _mat(g, (*q.shape[:-2], s, e), uses)
    v = _mat(g, (*q.shape[:-2], s, ev), uses)
    extra, scale = "", 1.0 / e ** 0.5
    r = g.rng.random()
    if r < 0.25:
        m = g.new_input("bool", (lq, s), kind="mask:75")
        extra, uses = f", attn_mask={m.name}", uses + [m.name]
    elif r < 0.45:
        m = g.new_input("float", g.choice([(lq, s), (1, s)]), kind="normal")
        extra, uses = f", attn_mask={m.name}", uses + [m.name]
    elif r < 0.65:
        extra = ", is_causal=True"
    if g.rng.random() < 0.3:
        scale = g.choice([0.5, 0.125])
        extra += f", scale={scale}"
    (out,) = g.names(1)
    names = list(dict.fromkeys(uses))
    qn, kn, vn = (uses + uses)[:3]  # q, k, v (names; k or v may be q itself)
    noise = f"(sq({e}) * mx({qn}) * mx({kn}) * {scale:.4g} + 1) * mx({vn}) * 4"
    return Stmt(f"{out} = F.scaled_dot_product_attention({q.name}, {k}, {v}{extra})", (out,), tuple(names),
                "sdpa", noise=noise, weight=3)
