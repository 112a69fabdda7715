"""The printing core the C++ and Triton code generators share.

- ``OpTable``: one target's operators - the infix ones, the rules both targets write alike (``SHARED``) and the
  target's own - looked up the same way for both (``codegen/cpp_expr.CPP_OPS``, ``codegen/triton_expr.TRITON_OPS``);
- ``Temporaries``: the naming of a body's shared subexpressions (``t0, t1, ...``): one counter across a kernel's
  nested bodies, each body seeing the names its enclosing bodies bound;
- the index renderer is ``ir/index.render`` (C++'s ``/`` or Python's ``//``) and the reductions' start values
  ``ir/ops.reduction_identity``, each printed with the target's ``literal``.

What stays per target is what really differs: the type names and literals, how a half-precision value is read,
rounded and stored, loads (C++ indexes a pointer; Triton loads a masked block), and the forms each compiler
vectorizes best (C++'s ``relu`` is ``!(a <= 0) ? a : 0``, which GCC if-converts; Triton's is a ``tl.where``).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from kiln.ir.ops import Op

# (operands as text, result dtype, first operand's dtype) -> text; both dtypes already the compute types
Rule = Callable[[list[str], torch.dtype, torch.dtype], str]


def _bool_or(other: Rule) -> Rule:
    """A cast: to bool it is ``!= 0`` in both targets, else the target's conversion."""
    def rule(a: list[str], dtype: torch.dtype, arg_dtype: torch.dtype) -> str:
        return f"({a[0]} != 0)" if dtype == torch.bool else other(a, dtype, arg_dtype)
    return rule


SHARED: dict[Op, Rule] = {
    Op.DIV: lambda a, d, ad: f"({a[0]} / {a[1]})",
    Op.NEG: lambda a, d, ad: f"(-{a[0]})",
    Op.ISNAN: lambda a, d, ad: f"({a[0]} != {a[0]})",
}


class OpTable:
    """A target's operators: ``text(op, operands, dtype, arg_dtype)``."""

    def __init__(self, target: str, infix: dict[Op, str], rules: dict[Op, Rule], cast: Rule):
        self.target = target
        self.infix = infix
        self.rules = {**SHARED, **rules, Op.CAST: _bool_or(cast)}

    def text(self, op: Op, args: list[str], dtype: torch.dtype, arg_dtype: torch.dtype) -> str:
        if op in self.infix:
            return f"({args[0]} {self.infix[op]} {args[1]})"
        rule = self.rules.get(op)
        if rule is None:
            raise NotImplementedError(f"{self.target} codegen: no rule for {op.value}")
        return rule(args, dtype, arg_dtype)


class Temporaries:
    """The names of a kernel's shared subexpressions: ``names`` maps a key (an expression, or an expression and
    its guard) to the temporary holding it; ``fresh()`` gives the next name, the counter shared by every nested
    body (``child``'s) so names never clash."""

    def __init__(self, names: dict[Any, str] | None = None, counter: list[int] | None = None):
        self.names: dict[Any, str] = dict(names or {})
        self.counter = counter if counter is not None else [0]

    def fresh(self) -> str:
        name = f"t{self.counter[0]}"
        self.counter[0] += 1
        return name
