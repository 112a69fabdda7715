"""The fuzzer's op table, part 1: pointwise math, comparisons, casts, reductions and normalizations.

Each op is a function ``op(g) -> Stmt | None`` of a generator context ``g`` (``fuzz_gen.Gen``): it picks
operands among the program's values (or asks ``g`` for a new input of a shape it needs), chooses parameters
that are valid for their shapes, and returns one statement; ``None`` when nothing fits.  The statement then
runs in ``fuzz_numerics.Analysis``, which drops it if eager rejects it or it is ill-conditioned, so an op may
propose boldly where the shape rules are easy to state and let eager judge the rest.

Operands of the rounded math are guarded the way the regression files do (``log(x.abs() + 0.5)``,
``pow(x.abs() + 0.5, y.clamp(-2, 2))``, a denominator ``y.abs() + 0.5``): away from poles and branch cuts a
correct compiler's error stays within the tolerances, and overflow is left out by construction.
"""
from __future__ import annotations

import math
from typing import Any

from kiln.testing.fuzz_program import Stmt

# name -> (template over {x}, noise, weight, checks builder or None); noise "" = exact op
UNARY: dict[str, tuple[str, str, float]] = {
    "exp": ("torch.exp({x})", "pw", 1), "exp_guarded": ("torch.exp(torch.tanh({x}) * 3)", "pw", 2),
    "log": ("torch.log({x}.abs() + 0.5)", "pw", 1), "log1p": ("torch.log1p({x}.abs())", "pw", 1),
    "sqrt": ("torch.sqrt({x}.abs() + 0.25)", "pw", 1), "rsqrt": ("torch.rsqrt({x}.abs() + 0.5)", "pw", 1),
    "tanh": ("torch.tanh({x})", "pw", 1), "sigmoid": ("torch.sigmoid({x})", "pw", 1),
    "erf": ("torch.erf({x})", "pw", 1), "sin": ("torch.sin({x})", "pw", 1), "cos": ("{x}.cos()", "pw", 1),
    "gelu": ("F.gelu({x})", "pw", 1), "gelu_tanh": ("F.gelu({x}, approximate='tanh')", "pw", 1),
    "silu": ("F.silu({x})", "pw", 1), "softplus": ("F.softplus({x})", "pw", 1), "elu": ("F.elu({x})", "pw", 1),
    "leaky_relu": ("F.leaky_relu({x}, 0.1)", "pw", 1), "hardswish": ("F.hardswish({x})", "pw", 1),
    "reciprocal": ("torch.reciprocal({x}.abs() + 0.5)", "pw", 1), "square": ("{x} * {x}", "pw", 1),
    "pow2": ("{x} ** 2", "pw", 1), "pow3": ("torch.pow({x}, 3)", "pw", 1),
    "pow_frac": ("torch.pow({x}.abs() + 0.5, 1.5)", "pw", 1), "expm1": ("torch.expm1(torch.tanh({x}))", "pw", 2),
    "relu": ("torch.relu({x})", "", 0), "abs": ("{x}.abs()", "", 0), "neg": ("-{x}", "", 0),
    "hardtanh": ("F.hardtanh({x}, -0.5, 0.5)", "", 0), "clamp": ("torch.clamp({x}, -1.0, 0.75)", "", 0),
    "clamp_min": ("{x}.clamp_min(-0.5)", "", 0), "clamp_max": ("torch.clamp_max({x}, 0.5)", "", 0),
    "relu6": ("F.relu6({x} * 4.0)", "", 0), "half_scale": ("{x} * 0.5", "", 0), "double": ("{x} + {x}", "", 0),
    "scale": ("{x} * 1.7", "pw", 1), "add_const": ("{x} + 0.3", "pw", 1), "rsub": ("1.5 - {x}", "pw", 1),
    "div_const": ("{x} / 0.75", "pw", 1), "mul_neg": ("torch.mul({x}, -1.25)", "pw", 1),
}
# discontinuous unary ops: exact results, valid only away from their jumps (see fuzz_numerics)
DISCRETE: dict[str, tuple[str, str]] = {
    "floor": ("torch.floor({x} * 2.0)", "int"), "ceil": ("torch.ceil({x} * 2.0)", "int"),
    "round": ("torch.round({x} * 2.0)", "half"), "trunc": ("torch.trunc({x} * 2.0)", "int"),
    "sign": ("torch.sign({x})", "zero"),
}
BINARY: dict[str, tuple[str, str, float]] = {
    "add": ("{a} + {b}", "pw", 1), "sub": ("torch.sub({a}, {b})", "pw", 1), "mul": ("{a} * {b}", "pw", 1),
    "div": ("{a} / ({b}.abs() + 0.5)", "pw", 1), "maximum": ("torch.maximum({a}, {b})", "", 0),
    "minimum": ("torch.minimum({a}, {b})", "", 0), "max_binary": ("torch.max({a}, {b})", "", 0),
    "pow": ("torch.pow({a}.abs() + 0.5, {b}.clamp(-2.0, 2.0))", "pw", 2),
    "add_alpha": ("torch.add({a}, {b}, alpha=0.5)", "pw", 1), "rsub_t": ("torch.rsub({a}, {b})", "pw", 1),
    "where_cmp": ("torch.where({a} > {b}, {a}, {b} * 0.5)", "", 0),
    "addcmul": ("torch.addcmul({a}, {a}, {b}, value=0.5)", "pw", 2),
}
COMPARE = {"gt": "{a} > {b}", "lt": "torch.lt({a}, {b})", "ge": "{a} >= {b}", "le": "{a}.le({b})",
           "eq": "{a} == {b}", "ne": "torch.ne({a}, {b})"}
CONSTS = ("0.0", "0.5", "-0.5", "1.0", "-1.0", "0.25", "2.0")


def _f(x: float) -> str:
    return repr(float(x))


# ------------------------------------------------------------------------------------------------ pointwise

def unary(g: Any) -> Stmt | None:
    """A pointwise float op (exp, log of abs+eps, tanh, gelu, clamp, ...)."""
    x = g.pick("float")
    if x is None:
        return None
    name = g.choice(list(UNARY))
    if name == "exp" and g.mag(x) > 5:
        name = "exp_guarded"
    text, noise, weight = UNARY[name]
    (out,) = g.names(1)
    return Stmt(f"{out} = {text.format(x=x.name)}", (out,), (x.name,), name, noise=noise, weight=weight)


def discrete(g: Any) -> Stmt | None:
    """floor/ceil/round/trunc/sign: exact, but their operand must keep away from the jumps."""
    x = g.pick("float")
    if x is None:
        return None
    name = g.choice(list(DISCRETE))
    text, kind = DISCRETE[name]
    (out,) = g.names(1)
    check = (kind, x.name) if kind == "zero" else (kind, x.name, "2.0")
    return Stmt(f"{out} = {text.format(x=x.name)}", (out,), (x.name,), name, checks=(check,))


def binary(g: Any) -> Stmt | None:
    """A float binary op between two values whose shapes broadcast; sometimes an int or bool operand (type
    promotion) or one that is a new, smaller input broadcast along some dims."""
    a = g.pick("float")
    if a is None:
        return None
    name = g.choice(list(BINARY))
    dtypes = ("float", "int64", "bool") if name in ("add", "mul", "sub") and g.rng.random() < 0.3 else ("float",)
    b = g.partner(a, dtypes)
    if b is None:
        return None
    if g.rng.random() < 0.5:
        a, b = (b, a) if b.dtype == "float" else (a, b)
    text, noise, weight = BINARY[name]
    if b.dtype == "bool" and name == "mul":
        noise, weight = "", 0  # x * mask: x or 0, exact
    (out,) = g.names(1)
    checks = (("cmp", a.name, b.name),) if name == "where_cmp" else ()
    text = text.format(a=a.name, b=b.name)
    return Stmt(f"{out} = {text}", (out,), (a.name, b.name), name, noise=noise, weight=weight, checks=checks)


def compare(g: Any) -> Stmt | None:
    """A comparison -> bool, with a constant or a broadcast partner (ints compared exactly)."""
    a = g.pick(("float", "int64"))
    if a is None:
        return None
    name = g.choice(list(COMPARE))
    if g.rng.random() < 0.5:
        b_text, uses = (g.choice(CONSTS) if a.dtype == "float" else str(g.rng.randint(-2, 3))), (a.name,)
    else:
        b = g.partner(a, (a.dtype,))
        if b is None:
            return None
        b_text, uses = b.name, (a.name, b.name)
    (out,) = g.names(1)
    return Stmt(f"{out} = {COMPARE[name].format(a=a.name, b=b_text)}", (out,), uses, "cmp_" + name,
                checks=(("cmp", a.name, b_text),))


def logical(g: Any) -> Stmt | None:
    """Bool algebra: &, |, ^, ~, logical_and."""
    a = g.pick("bool")
    if a is None:
        x = g.pick("float")
        if x is None:
            return None
        a = g.new_input("bool", g.reduced_shape(x.shape))
    (out,) = g.names(1)
    if g.rng.random() < 0.25:
        return Stmt(f"{out} = ~{a.name}", (out,), (a.name,), "not")
    b = g.partner(a, ("bool",))
    if b is None:
        return None
    form = g.choice(["{a} & {b}", "{a} | {b}", "{a} ^ {b}", "torch.logical_and({a}, {b})",
                     "torch.logical_or({a}, {b})"])
    return Stmt(f"{out} = {form.format(a=a.name, b=b.name)}", (out,), (a.name, b.name), "logical")


def where(g: Any) -> Stmt | None:
    """torch.where(mask, a, b or a constant): exact."""
    c = g.pick("bool")
    a = g.pick("float")
    if a is None:
        return None
    if c is None or not g.broadcastable(c.shape, a.shape):
        c = g.new_input("bool", g.reduced_shape(a.shape))
    if g.rng.random() < 0.4:
        b_text, uses = g.choice(CONSTS), (c.name, a.name)
    else:
        b = g.partner(a, ("float",))
        if b is None or not g.broadcastable(c.shape, g.bshape(a.shape, b.shape)):
            return None
        b_text, uses = b.name, (c.name, a.name, b.name)
    (out,) = g.names(1)
    return Stmt(f"{out} = torch.where({c.name}, {a.name}, {b_text})", (out,), uses, "where")


def masked_fill(g: Any) -> Stmt | None:
    """x.masked_fill(mask, value) with a mask that broadcasts to x."""
    x = g.pick(("float", "int64"))
    if x is None:
        return None
    m = g.pick("bool", lambda v: len(v.shape) <= len(x.shape) and g.bshape(v.shape, x.shape) == x.shape)
    if m is None or g.rng.random() < 0.3:
        m = g.new_input("bool", g.reduced_shape(x.shape))
    value = g.choice(CONSTS) if x.dtype == "float" else str(g.rng.randint(-3, 3))
    (out,) = g.names(1)
    form = g.choice(["{x}.masked_fill({m}, {v})", "torch.masked_fill({x}, {m}, {v})"])
    return Stmt(f"{out} = {form.format(x=x.name, m=m.name, v=value)}", (out,), (x.name, m.name), "masked_fill")


def cast(g: Any) -> Stmt | None:
    """Casts: float -> int64 (by truncation, away from integers), int/bool -> the float dtype, bool -> int."""
    x = g.pick(("float", "int64", "bool"))
    if x is None:
        return None
    (out,) = g.names(1)
    if x.dtype == "float":
        k = g.choice(["1.0", "2.0", "4.0"])
        form = g.choice(["({x} * {k}).long()", "({x} * {k}).to(torch.int64)"])
        return Stmt(f"{out} = {form.format(x=x.name, k=k)}", (out,), (x.name,), "cast_f2i",
                    checks=(("int", x.name, k),))
    if x.dtype == "bool" and g.rng.random() < 0.3:
        return Stmt(f"{out} = {x.name}.long()", (out,), (x.name,), "cast_b2i")
    return Stmt(f"{out} = {x.name}.to(FT)", (out,), (x.name,), "cast_to_float")


SIZE_FORMS = ("{a} * ({n} / 3)", "{a} + {n} ** 0.5", "{a} / ({n} + 1)", "{a} * ({n} // 2 + 1)",
              "{a} - {a}.numel() / 64", "{a}.clamp(max={n} / 2)", "torch.full_like({a}, {n} / 4) + {a}",
              "{a} * ({n} % 3 + 0.5)",
              # positions from sizes: a start and an end that are both sizes (``arange(1, n + 1)`` lost its start
              # under dynamic shapes: the lowering picked the numbers out of the arguments)
              "{a} + torch.arange(1, {a}.shape[-1] + 1, device={a}.device)",
              "{a} * torch.arange({n}, {n} + {a}.shape[-1], device={a}.device)",
              "{a} - torch.arange({a}.shape[-1], 0, -1, device={a}.device) / ({n} + 1)")


def size_arith(g: Any) -> Stmt | None:
    """Arithmetic on a value's own sizes (Python ints and floats from ``shape`` and ``numel()``: true and floor
    division, powers, remainders).  Static programs see constants; under dynamic shapes (fuzz_symbolic) they are
    expressions over the size symbols, which the lowering must keep exact (``n / 3`` is not ``n // 3``)."""
    a = g.pick("float", lambda v: len(v.shape) > 0)
    if a is None:
        return None
    d = g.rng.randrange(len(a.shape))
    n = f"{a.name}.shape[{d - len(a.shape) if g.rng.random() < 0.5 else d}]"
    (out,) = g.names(1)
    form = g.choice(SIZE_FORMS).format(a=a.name, n=n)
    return Stmt(f"{out} = {form}", (out,), (a.name,), "size_arith", noise="pw", weight=1)


CONSTANT_FORMS = ("torch.zeros_like({x})", "torch.full_like({x}, {c})", "{x}.new_full(({k},), {c})",
                  "torch.ones((), dtype=FT, device={x}.device)",
                  "torch.full({x}.shape, {c}, dtype=FT, device={x}.device)",
                  "torch.zeros_like({x}, dtype=torch.bool)",
                  "torch.ones(({k}, 2), dtype=torch.bool, device={x}.device)",
                  "torch.full(({k},), 3, dtype=torch.int64, device={x}.device)")


def constant(g: Any) -> Stmt | None:
    """A fresh constant (zeros, ones, full) shaped like a value, 0-d or of a small shape of its own, in the program's
    float dtype, int64 or bool.  A program may return it - a kernel that stores a constant (a bf16 ``zeros(1)``
    output failed to compile on the Triton target, ``0.0.to(tl.bfloat16)``) - or compute on with it."""
    x = g.pick(None)
    if x is None:
        return None
    (out,) = g.names(1)
    form = g.choice(CONSTANT_FORMS).format(x=x.name, c=g.choice(CONSTS), k=g.choice([1, 3, 8]))
    return Stmt(f"{out} = {form}", (out,), (x.name,), "constant")


def int_op(g: Any) -> Stmt | None:
    """Integer arithmetic (exact): +, *, %, //, abs, clamp, maximum."""
    a = g.pick("int64")
    if a is None:
        return None
    (out,) = g.names(1)
    if g.rng.random() < 0.5:
        form = g.choice(["{a} * 3", "{a} % 3", "{a} // 2", "{a}.abs()", "{a}.clamp(-2, 4)", "-{a}", "{a} + 1"])
        return Stmt(f"{out} = {form.format(a=a.name)}", (out,), (a.name,), "int_unary")
    b = g.partner(a, ("int64",))
    if b is None:
        return None
    form = g.choice(["{a} + {b}", "{a} * {b}", "torch.maximum({a}, {b})", "{a} - {b}"])
    return Stmt(f"{out} = {form.format(a=a.name, b=b.name)}", (out,), (a.name, b.name), "int_binary")


# ------------------------------------------------------------------------------------------------ reductions

def reduce(g: Any) -> Stmt | None:
    """sum/mean/amax/amin/var/std/prod/logsumexp/norm along random dims, keepdim; int/bool sums, any/all."""
    x = g.pick(("float", "int64", "bool"), lambda v: len(v.shape) >= 1)
    if x is None:
        return None
    if x.dtype == "float":
        op = g.choice(["sum", "sum", "mean", "amax", "amin", "var", "std", "prod", "logsumexp", "norm"])
    else:
        op = g.choice(["sum", "amax", "amin"] if x.dtype == "int64" else ["sum", "any", "all"])
    single = op in ("prod", "any", "all")  # ops that take one dim (or none)
    dims = g.reduce_dims(x.shape, single=single, required=op == "logsumexp")
    if op in ("amax", "amin") and g.numel_over(x.shape, dims) == 0 or \
            op in ("var", "std") and g.numel_over(x.shape, dims) < 2:
        return None
    n = g.numel_over(x.shape, dims)
    args = []
    if dims is not None:
        args.append(f"dim={dims[0]}" if len(dims) == 1 and (single or g.rng.random() < 0.5) else f"dim={dims}")
        if g.rng.random() < 0.4:
            args.append("keepdim=True")
    (out,) = g.names(1)
    src = x.name
    if op == "prod" and g.mag(x) > 1.5:
        src = f"({x.name}.clamp(-1.5, 1.5) + 0.1)"
    extra = "".join(", " + a for a in args)
    call = f"torch.linalg.vector_norm({src}{extra})" if op == "norm" else f"{src}.{op}({', '.join(args)})"
    noise = "" if x.dtype != "float" else {
        "sum": f"sq({n}) * mx({x.name})", "mean": f"sq({n}) * mx({x.name}) / {max(n, 1)}", "amax": "", "amin": "",
        "var": f"sq({n}) * mx({x.name}) ** 2", "std": f"sq({n}) * mx({x.name}) ** 2 / (2 * mn({out}) + 1e-30)",
        "prod": f"{n} * mx({out})", "logsumexp": f"mx({x.name}) + sq({n})", "norm": f"sq({n}) * mx({x.name})"}[op]
    return Stmt(f"{out} = {call}", (out,), (x.name,), "reduce_" + op, noise=noise,
                weight=2 if noise else 0)


def max_dim(g: Any) -> Stmt | None:
    """torch.max/min along a dim with indices, argmax/argmin (no dim: over the flattened tensor)."""
    x = g.pick(("float", "int64"), lambda v: len(v.shape) >= 1 and v.numel() > 0)
    if x is None:
        return None
    rank = len(x.shape)
    d = g.rng.randrange(-rank, rank)
    sense = g.choice(["max", "min"])
    kd = g.rng.random() < 0.4
    if g.rng.random() < 0.5:
        vals, idx = g.names(2)
        text = f"{vals}, {idx} = torch.{sense}({x.name}, dim={d}{', keepdim=True' if kd else ''})"
        return Stmt(text, (vals, idx), (x.name,), f"{sense}_dim", checks=(("gap", x.name, str(d), sense, "strict"),))
    (out,) = g.names(1)
    if g.rng.random() < 0.3:
        return Stmt(f"{out} = torch.arg{sense}({x.name})", (out,), (x.name,), f"arg{sense}",
                    checks=(("gap", x.name, "None", sense),))
    text = f"{out} = {x.name}.arg{sense}(dim={d}{', keepdim=True' if kd else ''})"
    return Stmt(text, (out,), (x.name,), f"arg{sense}", checks=(("gap", x.name, str(d), sense),))


def softmax(g: Any) -> Stmt | None:
    """softmax/log_softmax along a random dim, sometimes over logits masked with -inf (attention's pattern)."""
    x = g.pick("float", lambda v: len(v.shape) >= 1 and v.numel() > 0)
    if x is None:
        return None
    d = g.rng.randrange(-len(x.shape), len(x.shape))
    n = x.shape[d]
    (out,) = g.names(1)
    src, uses = x.name, (x.name,)
    if g.rng.random() < 0.2:
        m = g.new_input("bool", g.reduced_shape(x.shape), kind="mask:25")
        src, uses = f"{x.name}.masked_fill({m.name}, float('-inf'))", (x.name, m.name)
    if g.rng.random() < 0.35:
        return Stmt(f"{out} = F.log_softmax({src}, dim={d})", (out,), uses, "log_softmax",
                    noise=f"mx({x.name}) + sq({n})", weight=2)
    form = g.choice(["torch.softmax({s}, dim={d})", "F.softmax({s}, dim={d})", "({s}).softmax({d})"])
    return Stmt(f"{out} = {form.format(s=src, d=d)}", (out,), uses, "softmax", noise=f"mx({x.name})", weight=2)


def norm(g: Any) -> Stmt | None:
    """layer_norm over the last 1-2 dims (weight/bias optional), rms_norm, group_norm, batch_norm (eval)."""
    x = g.pick("float", lambda v: len(v.shape) >= 1 and v.numel() > 0)
    if x is None:
        return None
    kind = g.choice(["layer_norm", "layer_norm", "rms_norm", "group_norm", "batch_norm"])
    if kind in ("group_norm", "batch_norm"):
        return _channel_norm(g, x, kind)
    k = 1 if len(x.shape) == 1 or g.rng.random() < 0.6 else 2
    shape = tuple(x.shape[-k:])
    n = math.prod(shape)
    args, uses = [x.name, repr(shape)], [x.name]
    for _ in range(2 if kind == "layer_norm" else 1):
        if g.rng.random() < 0.6:
            w = g.operand(shape, "float", kind="normal")
            args.append(w.name)
            uses.append(w.name)
        else:
            args.append("None")
    eps = g.choice(["1e-05", "1e-06"])
    (out,) = g.names(1)
    noise = f"sq({n}) * mx({x.name}) * inv_std({x.name}, {k}) * (1 + mx({uses[-1]}))"
    return Stmt(f"{out} = F.{kind}({', '.join(args)}, eps={eps})", (out,), tuple(uses), kind, noise=noise, weight=2)


def _channel_norm(g: Any, x: Any, kind: str) -> Stmt | None:
    if len(x.shape) < 2 or x.shape[1] == 0:
        return None
    c = x.shape[1]
    (out,) = g.names(1)
    n = x.numel() // max(c, 1)
    if kind == "group_norm":
        groups = g.choice([d for d in range(1, c + 1) if c % d == 0])
        w = g.operand((c,), "float", kind="normal")
        noise = f"sq({n}) * mx({x.name}) * inv_std({x.name}.transpose(0, 1).flatten(1), 1) * (1 + mx({w.name}))"
        return Stmt(f"{out} = F.group_norm({x.name}, {groups}, {w.name}, None)", (out,), (x.name, w.name),
                    "group_norm", noise=noise, weight=2)
    mean, var = g.operand((c,), "float", kind="small"), g.new_input("float", (c,), kind="positive")
    w, b = g.operand((c,), "float", kind="normal"), g.operand((c,), "float")
    text = f"{out} = F.batch_norm({x.name}, {mean.name}, {var.name}, {w.name}, {b.name}, training=False)"
    return Stmt(text, (out,), (x.name, mean.name, var.name, w.name, b.name), "batch_norm",
                noise=f"mx({x.name}) * 2 * mx({w.name}) + mx({b.name})", weight=2)
