"""Effect tokens: ``torch.ops.higher_order.with_effects`` in a captured graph.

Since torch 2.13, AOTAutograd threads an *effect token* through a graph that calls an op with a side effect, so
that the call stays in the graph and in order.  ``torch.linalg.inv(a)`` (likewise solve, cholesky, the LU and LDL
factorizations) captures as::

    %inv = aten.linalg_inv_ex(%a)                  # (inverse, info)
    %eff = with_effects(%token, aten._linalg_check_errors, %inv[1], "linalg.inv", is_matrix=True)
    return (%eff[0], %inv[0])                      # the new token first, then the graph's outputs

``_linalg_check_errors`` returns nothing and raises when ``info`` reports a singular or non-positive-definite
input, as eager does.  kiln lowers the call to an EXTERN of ``kiln::linalg_check_errors``, which runs the check
and returns a new token: the token being a graph output keeps the call alive through kiln's dead-code
elimination and after the factorization it checks.  Other effectful ops are not lowered (the graph runs
eagerly, and the report says why).
"""
from __future__ import annotations

from typing import Any

import torch

from kiln.frontend.lowering_base import Lowerer
from kiln.ir.extern import build_extern
from kiln.ir.graph import Node


@torch.library.custom_op("kiln::linalg_check_errors", mutates_args=())
def linalg_check_errors(token: torch.Tensor, info: torch.Tensor, api_name: str, is_matrix: bool) -> torch.Tensor:
    """``aten._linalg_check_errors(info, api_name, is_matrix=...)``, then a new token."""
    torch.ops.aten._linalg_check_errors(info, api_name, is_matrix=is_matrix)
    return torch.empty_like(token)


@linalg_check_errors.register_fake
def _(token: torch.Tensor, info: torch.Tensor, api_name: str, is_matrix: bool) -> torch.Tensor:
    return torch.empty_like(token)


def is_effect_token(placeholder: torch.fx.Node) -> bool:
    """Is this graph input an effect token (read only as the token of ``with_effects`` calls)?  AOTAutograd
    passes None for it at run time and drops the token the graph returns."""
    users = list(placeholder.users)
    return bool(users) and all(u.target is torch.ops.higher_order.with_effects and u.args[0] is placeholder
                               for u in users)


def lower_with_effects(L: Lowerer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Node, ...] | None:
    """``with_effects(token, op, *op_args, **op_kwargs)`` as kiln nodes: ``(new token,)`` for the ops kiln
    knows (their results are None), else None."""
    token, op, *op_args = args
    if op is not torch.ops.aten._linalg_check_errors.default or not isinstance(token, Node):
        return None
    info, api_name = op_args
    L.externs.append("aten._linalg_check_errors.default")
    target = linalg_check_errors._opoverload
    return (build_extern(L.b, target, [token, info, api_name, kwargs["is_matrix"]], {},
                         token.shape, token.dtype),)
