"""kiln's own operators, one package each, and the one list of them the generic stages read.

Each package (``gemm``, ``conv``, ``attention``, ``bmm``, ``gpu_matmul``) holds its kernel source, its torch op,
the pass that chooses it, its tuner, and an ``OPERATOR`` describing what the rest of kiln needs to know
(``spec.py``).
No module outside ``kiln/library`` imports an operator package; they import ``OPERATORS`` (or the helpers
below) from here.  The order is fixed here, not by which module was imported first: it is the order their
graph passes run in (the GEMM's before the convolutions', as the library stage has always run them).

Adding an operator: a package with an ``OPERATOR``, listed below.
"""
from __future__ import annotations

from typing import Any, Callable

from kiln.library import attention, bmm, conv, gemm, gpu_matmul
from kiln.library.spec import GraphPass, Operator

OPERATORS: tuple[Operator, ...] = (gemm.OPERATOR, conv.OPERATOR, attention.OPERATOR, bmm.OPERATOR,
                                   gpu_matmul.OPERATOR)


def graph_passes() -> list[GraphPass]:
    """Every operator's graph passes, in the operators' order (the pipeline's library stage)."""
    return [p for op in OPERATORS for p in op.passes]


def libraries(graph: Any) -> dict[str, Callable[[], Any]]:
    """The native libraries ``graph`` may call, by name -> loader (the compile builds them in the background)."""
    out: dict[str, Callable[[], Any]] = {}
    for op in OPERATORS:
        out.update(op.libraries(graph))
    return out


def fixed_strides(node: Any) -> tuple[int, ...] | None:
    """The strides an operator's library writes ``node``'s result with, whatever its inputs; None if none does."""
    for op in OPERATORS:
        strides = op.fixed_strides(node)
        if strides is not None:
            return strides
    return None


def is_conv2d(node: Any) -> bool:
    """Is ``node`` one of the operators' 2-D convolutions (which read any layout)?"""
    return any(op.conv2d(node) for op in OPERATORS)


def out_variants() -> frozenset[Any]:
    """Operators' op packets whose ``.out`` overload writes into a buffer the caller gives."""
    return frozenset(p for op in OPERATORS for p in op.out_variants())


def records() -> tuple[str, ...]:
    """The tuning database record kinds the operators read today."""
    return tuple(r for op in OPERATORS for r in op.records())


__all__ = ["OPERATORS", "GraphPass", "Operator", "fixed_strides", "graph_passes", "is_conv2d", "libraries",
           "out_variants", "records"]
