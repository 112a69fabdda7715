"""KILN_CHECK: run the reference interpreter after every pass and name the first pass that changes results."""
from __future__ import annotations

import torch

from kiln.ir.graph import Graph
from kiln.ir.interp import interpret
from kiln.ir.ops import HALF
from kiln.ir.sym import size_hint
from kiln.runtime.checking import mismatch


class PassCheckError(AssertionError):
    pass


def random_inputs(graph: Graph, seed: int = 0) -> list[torch.Tensor]:
    """Fresh random inputs (never zeros) of the graph's input types; integer inputs stay small and valid."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in graph.inputs:
        shape = tuple(size_hint(d) for d in n.shape)  # (a symbolic graph: at its traced sizes, consistent for all)
        if n.dtype.is_floating_point:
            out.append(torch.randn(shape, generator=gen, dtype=torch.float64).to(n.dtype))
        elif n.dtype == torch.bool:
            out.append(torch.rand(shape, generator=gen) > 0.5)
        else:
            out.append(torch.randint(0, 2, shape, generator=gen).to(n.dtype))
    return out


class Checker:
    def __init__(self, graph: Graph, rtol: float = 1e-4, atol: float = 1e-5):
        self.inputs = random_inputs(graph)
        self.reference = interpret(graph, self.inputs)
        self.rtol, self.atol = rtol, atol

    def check(self, pass_name: str, graph: Graph) -> None:
        results = interpret(graph, self.inputs)
        for k, (got, want) in enumerate(zip(results, self.reference)):
            if want.dtype in HALF:  # a pass may move a rounding (half_in_fp32): the run-time check's half tolerance
                if mismatch(got, want):
                    raise PassCheckError(f"KILN_CHECK: pass {pass_name!r} changed output {k}: {mismatch(got, want)}")
                continue
            if got.shape != want.shape or got.dtype != want.dtype or \
                    not torch.allclose(got, want, rtol=self.rtol, atol=self.atol, equal_nan=True):
                diff = (got.double() - want.double()).abs().max().item() if got.shape == want.shape else "shape"
                raise PassCheckError(f"KILN_CHECK: pass {pass_name!r} changed output {k} (max abs diff {diff})")
        self.reference = results
