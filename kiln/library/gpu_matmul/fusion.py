"""Matmuls on the GPU: the cuBLAS extern, or kiln's Triton template with the consumer fused as its epilogue
(the step: ``library/gpu_matmul/step.py``).

``fuse_matmuls`` walks a plan's steps.  For each ``aten.mm`` / ``aten.addmm`` extern it finds the epilogue a
template could take over (the one pointwise kernel that reads the product, at the element it writes, see
``epilogue_for``) and chooses between

- ``extern``: cuBLAS writes C, the pointwise kernel reads it back (what kiln did before the template), and
- ``template``: one Triton kernel, C kept in registers (``library/gpu_matmul/template.py``), in one of the tile
  configurations of ``candidate_configs``.

Only matmuls with an epilogue to take in are candidates (see ``fuse_matmuls``).

The choice: a tuning-database record for this problem when there is one (any mode); otherwise in
``max-autotune`` every candidate is compiled (in parallel) and timed on the GPU (CUDA events, median), the
fastest wins and is recorded; otherwise (``default``) the heuristic keeps cuBLAS, which wins on most shapes of
the suite in our measurements unless tuned (see benchmarks/RESULTS.md).

Before (plan steps)::                            After::

    extern  %7 = aten.addmm(%b, %x, %wt)            matmul  kernel_4 <- addmm(%b, %x, %wt)  [128x128x64 ...]
    kernel_4  buf9[i] = gelu(buf7[i])
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from typing import Any

import torch

from kiln import config
from kiln.library.gpu_matmul.template import MatmulConfig, MatmulSpec, template_source
from kiln.ir.graph import Node, mutates
from kiln.ir.index import Lin, Var
from kiln.ir.kernel import FullLoop, KLoad, Kernel, Store, index_exprs, subexprs
from kiln.ir.ops import VIEW, contiguous_strides, numel
from kiln.ir.program import ExternStep
from kiln.library.gpu_matmul.step import MatmulStep

aten = torch.ops.aten
_TEMPLATE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
KIND = "gpu-matmul"  # its tuning records (named in __init__.py too, which cannot import Triton)


def _is_matmul(n: Node) -> bool:
    target = getattr(n.attr("target"), "overloadpacket", None)
    if target not in (aten.mm, aten.addmm) or n.attr("out_index") is not None or len(n.shape) != 2:
        return False
    if n.dtype not in _TEMPLATE_DTYPES or any(len(i.shape) > 2 or i.dtype != n.dtype for i in n.inputs):
        return False
    args, kwargs = n.attr("template")
    if target is aten.addmm and (len(n.inputs) != 3 or kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1
                                 or len(args) > 3):
        return False
    return target is aten.addmm or len(n.inputs) == 2


def _is_flat(index: Lin, outer: tuple[int, ...]) -> bool:
    """Is ``index`` the row-major flat position over ``outer`` (``sum(i_d * stride_d)``)?"""
    if index.const != 0:
        return False
    strides = contiguous_strides(outer)
    seen = set()
    for atom in index.atoms():
        if not isinstance(atom, Var) or not re.fullmatch(r"i\d+", atom.name):
            return False
        d = int(atom.name[1:])
        if d >= len(outer) or index.coefficient(atom) != strides[d]:
            return False
        seen.add(d)
    return all(d in seen for d, size in enumerate(outer) if size > 1)


def epilogue_for(node: Node, c_buf: str, steps: list[Any], start: int, graph_outputs: set[Node]) -> Kernel | None:
    """The pointwise kernel after ``steps[start]`` that is the product's only reader and reads it at the
    element it stores (row-major over an outer loop of m*n points), or None."""
    if node in graph_outputs:
        return None
    found = None
    for s in steps[start + 1:]:
        if isinstance(s, Kernel):
            if c_buf in s.buffers()[0]:
                if found is not None:
                    return None
                found = s
        elif isinstance(s, ExternStep):
            if mutates(s.node) or any(_reaches(i, node) for i in s.node.inputs):
                return None
        else:
            return None
    k = found
    if k is None or k.is_reduction or len(k.phases) != 1 or not isinstance(k.phases[0], FullLoop):
        return None
    if numel(k.outer) != numel(node.shape):
        return None
    for st in k.phases[0].stores:
        for x in subexprs(st.value):
            if isinstance(x, KLoad) and x.buf == c_buf and not _is_flat(x.index, k.outer):
                return None
        if any(isinstance(y, KLoad) and y.buf == c_buf for y in _index_loads(st)):
            return None
    return k


def _index_loads(st: Store) -> list:
    """Expressions inside a store's index (a scatter-like write reads them)."""
    return [y for e in index_exprs(st.index) for y in subexprs(e)]


def _reaches(n: Node, target: Node) -> bool:
    while True:
        if n is target:
            return True
        if n.op not in VIEW:
            return False
        n = n.inputs[0]


# ---------------------------------------------------------------------------------------------- choosing


@dataclasses.dataclass
class Stats:
    """What ``fuse_matmuls`` did, for the report."""
    candidates: int = 0
    from_database: int = 0
    measured: int = 0          # template configurations and extern paths timed
    fused: list[str] = dataclasses.field(default_factory=list)
    kept_extern: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    problems: list[Any] = dataclasses.field(default_factory=list)  # measured (tune.gpu_matmul.Problem, timings)


def forced_config() -> MatmulConfig | None:
    """``Config.matmul_template_config``: the one tile configuration every matmul then runs in, or None."""
    text = config.get().matmul_template_config.strip()
    return MatmulConfig.from_trace([int(v) for v in text.split(",")]) if text else None


def fuse_matmuls(steps: list[Any], graph_outputs: list[Node], buffer_of: dict[Node, str],
                 strides_of: dict[Node, tuple[int, ...]], device: torch.device, tune: bool,
                 choices: Any = None) -> tuple[list[Any], Stats]:
    """The plan's steps with the chosen matmuls (and their epilogues) replaced by ``MatmulStep``s; each choice
    through ``choices`` (the compile's measured-choice service; else one for this call)."""
    from kiln.library.gpu_matmul.tune import Problem, measure_problems, operand_tensors
    from kiln.tune.choices import Choices
    start = time.perf_counter()
    forced = forced_config()
    stats = Stats()
    dtype_of = {b: n.dtype for n, b in buffer_of.items()}
    node_of = {b: n for n, b in buffer_of.items()}
    outputs = set(graph_outputs)
    candidates = []
    for i, s in enumerate(steps):
        if isinstance(s, ExternStep) and _is_matmul(s.node) and s.node in buffer_of:
            node = s.node
            pinned = node in outputs or any(_reaches(o, node) for o in graph_outputs)
            epilogue = None if pinned else epilogue_for(node, buffer_of[node], steps, i, outputs)
            if epilogue is None and forced is None:
                # alone, the template only competes with cuBLAS at the GEMM itself, with nothing to save: on the
                # H200 cuBLAS was faster on all 8 such problems of the suite (benchmarks/RESULTS.md), so they
                # are not measured (it halves max-autotune's compile time on the transformers)
                continue
            candidates.append((i, node, epilogue, _spec(node, epilogue, buffer_of)))
    stats.candidates = len(candidates)
    if not candidates:
        return steps, stats
    own = choices is None
    service = Choices() if own else choices
    choices: dict[int, dict] = {}
    try:
        problems: dict[str, Problem] = {}  # by database key: the layers of a transformer share one
        for i, node, epilogue, spec in candidates:
            if forced is not None:
                choices[i] = {"choice": "template", "config": forced.trace()}
                continue
            source = template_source(spec, dtype_of)
            # the operands' strides, from meta tensors: nothing is allocated unless the problem is measured
            key = _key(source, spec, operand_tensors(node, buffer_of, strides_of, torch.device("meta")))
            stored = service.stored_schedule(KIND, key, f"matmul {spec.m}x{spec.n}x{spec.k}")
            if stored is not None:
                stats.from_database += 1
                choices[i] = stored
            elif tune:
                problems.setdefault(key, Problem(key, spec, source, node, epilogue)).members.append(i)
        if problems:
            for p in measure_problems(list(problems.values()), dtype_of, node_of, strides_of, device):
                stats.problems.append(p)
                stats.measured += p.measured
                service.store_schedule(KIND, p.key, f"matmul {p.spec.m}x{p.spec.n}x{p.spec.k}", p.choice, p.median_s,
                                       p.spread_s, structure=f"{KIND}:{p.spec.bias}")
                for i in p.members:
                    choices[i] = p.choice
    finally:
        if own:
            service.close()
    index_of = {id(s): j for j, s in enumerate(steps)}
    place: dict[int, MatmulStep] = {}  # plan position -> the fused step that takes it (the epilogue's, if any)
    moved: set[int] = set()            # extern steps whose matmul now runs inside a fused step later on
    for i, node, epilogue, spec in candidates:
        choice = choices.get(i)
        if choice is None:
            continue
        if choice.get("choice") != "template":
            stats.kept_extern.append(f"{node} {spec.m}x{spec.n}x{spec.k}")
            continue
        step = MatmulStep(node, epilogue, spec, MatmulConfig.from_trace(choice["config"]), buffer_of[node])
        stats.fused.append(step.describe())
        if epilogue is None:
            place[i] = step
        else:
            place[index_of[id(epilogue)]] = step
            moved.add(i)
    out = [place.get(j, s) for j, s in enumerate(steps) if j not in moved]
    stats.seconds = time.perf_counter() - start
    return out, stats


def _spec(node: Node, epilogue: Kernel | None, buffer_of: dict[Node, str]) -> MatmulSpec:
    a, b = node.inputs[-2:]
    name = f"matmul_{epilogue.name}" if epilogue is not None else f"matmul_{buffer_of[node]}"
    tf32 = node.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    return MatmulSpec(name, node.shape[0], node.shape[1], a.shape[1], a.dtype, node.dtype,
                      len(node.inputs) == 3, epilogue, buffer_of[node], tf32)


def _key(source: str, spec: MatmulSpec, operands: list[torch.Tensor]) -> str:
    """The problem as the database knows it: the template's text with buffer and kernel names made positional
    (every layer of a transformer shares it), and the operands' strides."""
    text = re.sub(r"\bbuf\d+\b", "B", source.replace(spec.name, "KERNEL"))
    text = re.sub(r"\bkernel_\d+_\w+", "K", text)
    strides = ";".join(",".join(map(str, t.stride())) for t in operands)
    return "gpu-matmul:" + hashlib.sha256(f"{text}|{strides}".encode()).hexdigest()[:32]


def fuse_into_plan(plan: Any, graph: Any, report: Any, device: torch.device, choices: Any = None) -> None:
    """The GPU plan's matmuls whose measured (or recorded) best is the template take their epilogue kernel in
    (``fuse_matmuls``); the report gets the choices (``report.matmuls``) and the time spent."""
    if not config.get().matmul_templates or (device.type != "cuda" and forced_config() is None):
        return
    steps, stats = fuse_matmuls(plan.steps, graph.outputs, plan.buffer_of, plan.strides_of, device,
                                tune=report.mode == "max-autotune", choices=choices)
    report.phases["matmul_tuning"] = stats.seconds
    report.matmuls = stats
    fused = {id(s.epilogue) for s in steps if isinstance(s, MatmulStep) and s.epilogue is not None}
    plan.steps = steps
    plan.kernels = [k for k in plan.kernels if id(k) not in fused]
