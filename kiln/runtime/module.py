"""Turn an optimized graph into a callable: kernels + extern calls over planned buffers."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from kiln.ir.graph import Graph
from kiln.ir.interp import interpret
from kiln.report import CompileReport


def build_module(graph: Graph, report: CompileReport) -> Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]:
    def run(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return interpret(graph, inputs)
    return run
