"""The fuzzer's program: inputs, statements, outputs and tolerances, and the Python source they print as.

A ``Program`` is data (so the shrinker can edit it and a worker process can receive it as JSON); its
``source()`` is the module text that both the runner (through ``exec``) and a reproducer file contain::

    FT = torch.float32                       # the program's float dtype (float16/bfloat16 for half programs)

    def make_inputs(seed=7, shift=0):
        def g(i):                            # one generator per input: dropping an input keeps the others' values
            return torch.Generator().manual_seed(i + shift)
        x0 = (torch.rand((5, 13), generator=g(seed * 64 + 0)) * 4 - 2).to(FT)[..., 1::2]  # float[5, 6] sliced
        return [x0]

    def fn(x0):
        v0 = torch.tanh(x0)
        v1 = v0.amax(dim=1)
        return (v0, v1)

    OUT_TOL = [(1.3e-05, 1.5e-05), (2.6e-05, 3e-05)]    # per output (rtol, atol); (0, 0): bitwise
    INPUT_TOL = [None]                                  # None: the input must be left unchanged
"""
from __future__ import annotations

import dataclasses
import itertools
import re
import sys
import types
from typing import Any

import torch

_NAMESPACES = itertools.count()  # a fresh module name per namespace()

FLOAT_TYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# value kind -> expression of a float32 tensor of shape {s} drawn from generator {g}
FLOAT_KINDS = {
    "uniform": "torch.rand({s}, generator={g}) * 4 - 2",
    "normal": "torch.randn({s}, generator={g}).clamp(-3, 3)",
    "positive": "torch.rand({s}, generator={g}) * 2 + 0.5",
    "small": "(torch.rand({s}, generator={g}) * 2 - 1) * 0.25",
    # integer-valued floats: many exact ties, which probe tie-breaking (argmax, comparisons at a bound)
    "ties": "torch.randint(-3, 4, {s}, generator={g}).float()",
}


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One input of ``make_inputs``: dtype "float" (the program's FT), "int64" or "bool"; ``shape`` is what
    ``fn`` sees; ``layout`` says how the tensor is laid out (a transposed, sliced, offset or expanded view of
    a larger tensor, or channels-last); ``kind`` is the value distribution (for ints ``"index:<hi>"``,
    ``"perm:<hi>"`` - distinct values below ``hi``, a 1-D contiguous input - or ``"int"``, for bools
    ``"mask:<percent>"``)."""

    name: str
    index: int
    dtype: str
    shape: tuple[int, ...]
    layout: str = "contiguous"
    kind: str = "uniform"
    origin: int | None = None  # the seed of the program it came from, when merged into a group

    def stream(self) -> str:
        """The generator seed: per input, so dropping one input leaves the others' values unchanged."""
        return f"{'seed' if self.origin is None else self.origin} * 64 + {self.index}"

    def base_shape(self) -> tuple[int, ...]:
        """The shape of the tensor created before the view that gives ``shape``."""
        s = list(self.shape)
        if self.layout == "transposed":
            s[-1], s[-2] = s[-2], s[-1]
        elif self.layout == "sliced":
            s[-1] = 2 * s[-1] + 1
        elif self.layout == "offset":
            s[0] += 3
        elif self.layout == "expanded":
            s = [1 if i % 2 == 0 else d for i, d in enumerate(s)]
        return tuple(s)

    def view_suffix(self) -> str:
        rank = len(self.shape)
        return {
            "contiguous": "",
            "transposed": ".transpose(-1, -2)",
            "sliced": "[..., 1::2]",
            "offset": "[3:]",
            "expanded": f".expand({self.shape})",
            "channels_last": ".contiguous(memory_format=torch.channels_last)" if rank == 4 else "",
        }[self.layout]

    def value_expr(self) -> str:
        s, g = repr(self.base_shape()), f"g({self.stream()})"
        if self.dtype == "int64" and self.kind.startswith("perm:"):  # distinct indices (an index_copy_'s rows)
            return f"torch.randperm({int(self.kind.split(':')[1])}, generator={g})[:{self.shape[0]}]"
        if self.dtype == "int64":
            lo, hi = (0, int(self.kind.split(":")[1])) if self.kind.startswith("index:") else (-5, 6)
            return f"torch.randint({lo}, {hi}, {s}, generator={g})"
        if self.dtype == "bool":
            p = int(self.kind.split(":")[1]) / 100
            return f"(torch.rand({s}, generator={g}) < {p})"
        return f"({FLOAT_KINDS[self.kind].format(s=s, g=g)}).to(FT)"

    def source(self) -> str:
        comment = f"{self.dtype}{list(self.shape)}" + ("" if self.layout == "contiguous" else f" {self.layout}")
        line = f"{self.name} = {self.value_expr()}{self.view_suffix()}"
        return line if len(line) + len(comment) > 110 else f"{line}  # {comment}"


@dataclasses.dataclass(frozen=True)
class Stmt:
    """One line of ``fn``: ``defs`` are the names it binds, ``uses`` the names it reads, ``mutates`` the
    name it changes in place (and so every alias of it).  ``op`` names the op family (statistics, shrinker).

    What the numerical analysis (fuzz_numerics.py) needs to know about it: ``noise`` is "" for an exact op
    (views, max, clamp, where, ...: any correct implementation gives the same bits), "pw" for a rounded
    pointwise op, or an expression of the op's absolute error scale (reductions: ``sq(n) * mx(v3)``);
    ``weight`` is the op's share of the depth that scales the tolerance; ``checks`` are the discontinuities
    the op decides on (a comparison, a cast to int, an argmax), each ``(kind, operand, ...)``, whose operands
    must lie far enough from the decision boundary for any correct implementation to decide the same way."""

    text: str
    defs: tuple[str, ...]
    uses: tuple[str, ...]
    op: str
    mutates: str | None = None
    noise: str = ""
    weight: float = 0.0
    checks: tuple[tuple[str, ...], ...] = ()
    aliases: tuple[str, ...] = ()  # in-place: every name the write changes (the target's views and base)


@dataclasses.dataclass
class Program:
    """A random program; ``source()`` is its text.  ``vars`` maps every name to ``(dtype, shape)`` with
    dtype "float", "int64" or "bool" (the shrinker uses it to bypass a statement)."""

    seed: int
    ft: str
    inputs: list[InputSpec]
    stmts: list[Stmt]
    outputs: list[str]
    out_tol: list[tuple[float, float]]
    input_tol: list[tuple[float, float] | None]
    vars: dict[str, tuple[str, tuple[int, ...]]] = dataclasses.field(default_factory=dict)
    members: list[int] = dataclasses.field(default_factory=list)  # seeds merged into this program (groups)

    def fn_source(self) -> str:
        args = ", ".join(i.name for i in self.inputs)
        body = [f"    {s.text}" for s in self.stmts]
        outs = ", ".join(self.outputs) + ("," if len(self.outputs) == 1 else "")
        return "\n".join([f"def fn({args}):", *body, f"    return ({outs})"]) + "\n"

    def inputs_source(self) -> str:
        lines = [f"def make_inputs(seed={self.seed}, shift=0):",
                 "    def g(i):  # one generator per input: dropping an input leaves the others' values unchanged",
                 "        return torch.Generator().manual_seed(i + shift)  # shift: other values, same layouts"]
        lines += [f"    {i.source()}" for i in self.inputs]
        lines.append(f"    return [{', '.join(i.name for i in self.inputs)}]")
        return "\n".join(lines) + "\n"

    def source(self) -> str:
        """The module text: imports, FT, make_inputs, fn, OUT_TOL and INPUT_TOL."""
        return "\n".join([
            "import torch",
            "import torch.nn.functional as F  # noqa: F401",
            "",
            f"FT = torch.{self.ft}  # the program's float dtype",
            "", "",
            self.inputs_source(), "",
            self.fn_source(), "",
            "# per output: (rtol, atol); (0.0, 0.0) = bitwise (exact ops, int and bool outputs)",
            f"OUT_TOL = {_tol_repr(self.out_tol)}",
            "# per input: None = must be left bitwise unchanged; (rtol, atol) = mutated in place by fn",
            f"INPUT_TOL = {_tol_repr(self.input_tol)}",
        ]) + "\n"

    def namespace(self, ft: str | None = None) -> dict[str, Any]:
        """``exec`` of ``source()``: a dict with make_inputs, fn, OUT_TOL, INPUT_TOL.  ``ft`` replaces the float
        dtype that ``fn`` computes in (the analysis runs the same text in float64)."""
        # a real module in sys.modules: Dynamo (torch 2.11) imports the module a traced function's globals name.
        # One per call (the float64 analysis and the run must not share globals such as FT)
        module = types.ModuleType(f"kiln_fuzz_{self.seed}_{next(_NAMESPACES)}")
        sys.modules[module.__name__] = module
        ns: dict[str, Any] = module.__dict__
        exec(compile(self.source(), f"<fuzz program {self.seed}>", "exec"), ns)
        if ft is not None:
            ns["FT"] = getattr(torch, ft)
        return ns

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Program":
        d = dict(d)
        d["inputs"] = [InputSpec(**{**i, "shape": tuple(i["shape"])}) for i in d["inputs"]]
        d["stmts"] = [Stmt(**{**s, "defs": tuple(s["defs"]), "uses": tuple(s["uses"]),
                              "checks": tuple(tuple(c) for c in s["checks"]), "aliases": tuple(s["aliases"])})
                      for s in d["stmts"]]
        d["out_tol"] = [tuple(t) for t in d["out_tol"]]
        d["input_tol"] = [None if t is None else tuple(t) for t in d["input_tol"]]
        d["vars"] = {k: (v[0], tuple(v[1])) for k, v in d["vars"].items()}
        return cls(**d)


def _tol_repr(tols: list[Any]) -> str:
    return "[" + ", ".join("None" if t is None else f"({t[0]:.3g}, {t[1]:.3g})" for t in tols) + "]"


_NAME = re.compile(r"\b([xv])(\d+)\b")


def rename(text: str, prefix: str) -> str:
    """``x3``/``v12`` -> ``{prefix}x3``: merging programs into one function keeps their names apart."""
    return _NAME.sub(lambda m: f"{prefix}{m.group(1)}{m.group(2)}", text)


def merge(programs: list[Program]) -> Program:
    """Several programs as one function (one Dynamo trace, one C++ build): statements, inputs and outputs
    side by side, names prefixed ``p0_``, ``p1_``, ...  Each input keeps its values (its generator seed
    names the program it came from), so each member's tolerances still hold."""
    assert programs and len({p.ft for p in programs}) == 1, "merge: programs of one float dtype"
    inputs, stmts, outputs, out_tol, input_tol, vars_ = [], [], [], [], [], {}
    for k, p in enumerate(programs):
        pre = f"p{k}_"
        inputs += [dataclasses.replace(i, name=pre + i.name, origin=p.seed if i.origin is None else i.origin)
                   for i in p.inputs]
        stmts += [rename_stmt(s, pre) for s in p.stmts]
        outputs += [pre + o for o in p.outputs]
        out_tol += p.out_tol
        input_tol += p.input_tol
        vars_.update({pre + k2: v for k2, v in p.vars.items()})
    return Program(programs[0].seed, programs[0].ft, inputs, stmts, outputs, out_tol, input_tol, vars_,
                   members=[p.seed for p in programs])


def rename_stmt(s: Stmt, prefix: str) -> Stmt:
    return Stmt(rename(s.text, prefix), tuple(prefix + d for d in s.defs), tuple(prefix + u for u in s.uses),
                s.op, None if s.mutates is None else prefix + s.mutates, rename(s.noise, prefix), s.weight,
                tuple(tuple(rename(c, prefix) for c in chk) for chk in s.checks),
                tuple(prefix + a for a in s.aliases))


def live_stmts(stmts: list[Stmt], outputs: list[str], inputs: set[str]) -> list[Stmt]:
    """The statements whose results reach an output.  An in-place statement is live if a name it changes is
    read later or returned, or is an input (the caller sees the change)."""
    need = set(outputs)
    keep: list[Stmt] = []
    for s in reversed(stmts):
        changes = set(s.aliases) | ({s.mutates} if s.mutates else set())
        if need.intersection(s.defs) or (s.mutates is not None and (changes & need or changes & inputs)):
            keep.append(s)
            need.update(s.uses)
    return keep[::-1]
