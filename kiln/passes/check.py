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


def random_inputs(graph: Graph, seed: int = 0, int_high: int = 2) -> list[torch.Tensor]:
    """Fresh random inputs (never zeros) of the graph's input types; integer inputs in ``[0, int_high)``."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in graph.inputs:
        shape = tuple(size_hint(d) for d in n.shape)  # (a symbolic graph: at its traced sizes, consistent for all)
        if n.dtype.is_floating_point:
            out.append(torch.randn(shape, generator=gen, dtype=torch.float64).to(n.dtype))
        elif n.dtype == torch.bool:
            out.append(torch.rand(shape, generator=gen) > 0.5)
        else:
            out.append(torch.randint(0, int_high, shape, generator=gen).to(n.dtype))
    return out


class Checker:
    def __init__(self, graph: Graph, rtol: float = 1e-4, atol: float = 1e-5):
        self.rtol, self.atol = rtol, atol
        self.skipped: str | None = None  # why this graph's passes are not checked
        # integer inputs in [0, 2); then, where one indexes a dim of size 1 (a gather's, an index_copy_'s rows) and
        # 1 is out of range, all 0 (a valid index wherever there is one)
        ints = any(not (n.dtype.is_floating_point or n.dtype == torch.bool) for n in graph.inputs)
        for int_high in (2, 1) if ints else (2,):
            self.inputs = random_inputs(graph, int_high=int_high)
            try:
                self.reference = self._run(graph)
                return
            except (IndexError, RuntimeError) as exc:
                error = exc
        # an index computed from the inputs that random values make invalid: the graph cannot be run on made-up
        # inputs, so its passes go unchecked - said in the report, not a failed compile
        self.skipped = f"pass checks skipped: the graph does not run on random inputs ({type(error).__name__}: " \
                       f"{str(error).splitlines()[0][:160]})"

    def _run(self, graph: Graph) -> list[torch.Tensor]:
        """The graph's outputs, then its inputs after the run, on fresh copies of the inputs: a graph that updates
        an input (a cache written in place) must see the same values at every check, and its update is part of
        its result (``inplace_updates`` makes one where the copy back was)."""
        inputs = [x.clone() for x in self.inputs]
        return [*interpret(graph, inputs), *inputs]

    def check(self, pass_name: str, graph: Graph) -> None:
        if self.skipped:
            return
        results = self._run(graph)
        outputs = len(graph.outputs)
        for k, (got, want) in enumerate(zip(results, self.reference)):
            what = f"output {k}" if k < outputs else f"input {k - outputs} (as the graph leaves it)"
            if want.dtype in HALF:  # a pass may move a rounding (half_in_fp32): the run-time check's half tolerance
                if mismatch(got, want):
                    raise PassCheckError(f"KILN_CHECK: pass {pass_name!r} changed {what}: {mismatch(got, want)}")
                continue
            if got.shape != want.shape or got.dtype != want.dtype or \
                    not torch.allclose(got, want, rtol=self.rtol, atol=self.atol, equal_nan=True):
                diff = (got.double() - want.double()).abs().max().item() if got.shape == want.shape else "shape"
                raise PassCheckError(f"KILN_CHECK: pass {pass_name!r} changed {what} (max abs diff {diff})")
        self.reference = results
