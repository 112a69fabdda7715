"""Matmuls on the GPU as kiln's Triton template: the ``MatmulStep`` a plan holds, and how it launches.

``fusion.py`` decides which matmuls run as the template (with their epilogue kernel fused); the runtime
(``runtime/triton_module.py``) loads and runs the step through the ``OwnStep`` methods, ``load`` and ``run``.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from kiln.library.gpu_matmul.template import HEADER, MatmulConfig, MatmulSpec, template_source
from kiln.ir.graph import Node
from kiln.ir.kernel import Kernel
from kiln.ir.program import OwnStep

@dataclasses.dataclass
class MatmulStep(OwnStep):
    """A program step: the matmul ``node`` computed by the Triton template, its epilogue kernel fused."""
    node: Node                   # the mm/addmm extern (its result is not materialized when fused)
    epilogue: Kernel | None
    spec: MatmulSpec
    config: MatmulConfig
    out_buf: str                 # what the step writes when there is no epilogue: C's own buffer
    fn: Any = None               # the jitted template, bound by the runtime
    args: list[Node] = dataclasses.field(default_factory=list)  # epilogue buffer nodes, in argument order

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def node_inputs(self) -> list[Node]:
        return list(self.node.inputs)

    def buffers(self) -> tuple[set[str], set[str]]:
        """Buffers read and written besides the matmul operands (which are graph nodes, read through views)."""
        if self.epilogue is None:
            return set(), {self.out_buf}
        reads, writes = self.epilogue.buffers()
        return reads - {self.spec.c_buf}, writes

    def describe(self) -> str:
        what = f"epilogue {self.epilogue.name}" if self.epilogue is not None else "no epilogue"
        return f"{self.spec.name}: {self.spec.m}x{self.spec.n}x{self.spec.k} {what} [{self.config}]"

    def load(self, import_source: Any, dtype_of: dict[str, torch.dtype], node_of: dict[str, Node]) -> None:
        # the same text the measurement compiled: Triton's cache has it
        module, _ = import_source(matmul_module_text(template_source(self.spec, dtype_of)))
        self.fn = getattr(module, self.spec.name)
        self.args = [node_of[b] for b in self.spec.epilogue_args(dtype_of)] if self.epilogue is not None \
            else [self.node]

    def run(self, operands: list[Any], values: list[torch.Tensor]) -> None:
        launch(self.fn, self.spec, self.config, launch_args(self.spec, operands, values))


def launch_args(spec: MatmulSpec, operands: list[Any], epilogue: list[torch.Tensor]) -> list[Any]:
    """The template's arguments; ``operands`` as the extern takes them (``bias, a, b`` or ``a, b``)."""
    a, b = operands[-2:]
    args: list[Any] = [a, b]
    tail = [a.stride(0), a.stride(1), b.stride(0), b.stride(1)]
    if spec.bias:
        bias = operands[0].expand(spec.m, spec.n)
        args.append(bias)
        tail += list(bias.stride())
    return args + epilogue + tail


def launch(fn: Any, spec: MatmulSpec, c: MatmulConfig, args: list[Any]) -> None:
    grid = (-(-spec.m // c.block_m) * -(-spec.n // c.block_n),)
    fn[grid](*args, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, GROUP_M=c.group_m,
             num_warps=c.num_warps, num_stages=c.num_stages)


def matmul_module_text(source: str) -> str:
    """One template instance as a module of its own (imported through the source cache)."""
    return HEADER + "\n\n" + source
