"""The TorchDynamo backend: Dynamo graph -> AOTAutograd (ATen, kiln's decompositions) -> kiln.

``torch.compile(model, backend="kiln", mode=..., options={...})`` reaches ``kiln_backend`` through the
``torch_dynamo_backends`` entry point.  Guards stay with Dynamo.  In inference (no grad needed), module
parameters and buffers are frozen into the graph as constants so that folding passes can use them.
"""
from __future__ import annotations

import os
import re
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.fx

from kiln import config

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def _is_static(fx_node: torch.fx.Node, value: Any) -> bool:
    """Parameters and buffers that Dynamo lifted as graph inputs (they do not change between calls)."""
    if isinstance(value, torch.nn.Parameter):
        return True
    tensor_dict = fx_node.meta.get("tensor_dict", {})
    return bool(tensor_dict.get("_dynamo_static_input_type")) or \
        getattr(value, "_dynamo_static_input_type", None) is not None


def _argument_name(fx_node: torch.fx.Node) -> str | None:
    """The user's name for a graph input, from TorchDynamo's source: ``L['x']`` -> ``x``, ``L['batch']['ids']``
    -> ``batch['ids']`` (forward's or the function's parameters); None where TorchDynamo recorded no source."""
    source = getattr(fx_node.meta.get("grapharg"), "source", None)
    if source is None:
        return None
    name = source.name() if callable(source.name) else source.name  # (a method in older torch)
    local = re.fullmatch(r"L\['([^']+)'\](.*)", name)
    return local.group(1) + local.group(2) if local else name


def check_mode(mode: str | None) -> str:
    mode = mode or "default"
    if mode not in MODES:
        raise ValueError(f"kiln: unknown mode {mode!r}; accepted modes are {list(MODES)}")
    return mode


def kiln_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None,
                 options: dict[str, Any] | None = None, name: str | None = None) -> Callable:
    """Dynamo backend entry point.  ``name``: the compiled model's class or function (``kiln.compile`` knows
    it), which names the graph in kiln's reports."""
    mode = check_mode(mode)
    cfg = config.get().with_options(**(options or {}))
    from kiln.frontend.training import compile_training, needs_grad
    reached: list[bool] = []  # an entry once AOTAutograd reached kiln's compiler (its errors are kiln's own)
    if needs_grad(example_inputs):  # [Note: training graphs]
        return _captured(lambda: compile_training(gm, example_inputs, mode, cfg, _graph_name(gm, name), reached),
                         reached, gm, cfg, mode, name)
    from torch._functorch.aot_autograd import aot_module_simplified

    from kiln.frontend.decompositions import decomposition_table
    if cfg.target != "cpu" and any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs):
        from kiln.runtime import compile_pool
        with config.scope(**(options or {})):
            compile_pool.warm()  # torch.compile(backend="kiln"): start the Triton workers before AOT tracing

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    static = [_is_static(p, x) for p, x in zip(placeholders, example_inputs)]
    module_params = [t for _, t in gm.named_parameters(remove_duplicate=False)] + \
        [t for _, t in gm.named_buffers(remove_duplicate=False)]
    frozen_values = module_params + list(example_inputs)
    frozen_mask = [True] * len(module_params) + static
    names = [None] * len(module_params) + [_argument_name(p) for p in placeholders]

    def fw_compiler(fx_gm: torch.fx.GraphModule, fx_inputs: Sequence[Any]) -> Callable:
        reached.append(True)
        from kiln.compiler import compile_aten_graph
        fx_placeholders = [n for n in fx_gm.graph.nodes if n.op == "placeholder"]
        frozen: dict[int, torch.Tensor] = {}
        arg_names: list[str | None] = []
        if len(fx_placeholders) == len(frozen_values):  # (AOTAutograd's inputs: the parameters, then Dynamo's)
            # never a value the graph itself updates (an optimizer step's parameters and state, BatchNorm's
            # running statistics in training mode): folding it would compute from its value at compile time
            written = mutated_placeholders(fx_gm)
            frozen = {i: v for i, (v, m) in enumerate(zip(frozen_values, frozen_mask))
                      if m and isinstance(v, torch.Tensor) and i not in written}
            arg_names = names
        examples = frozen_values if len(fx_placeholders) == len(frozen_values) else None
        return compile_aten_graph(fx_gm, frozen, cfg=cfg, mode=mode, name=_graph_name(gm, name), arg_names=arg_names,
                                  examples=examples)

    from kiln.tune import progress
    if mode == "max-autotune":
        with config.scope(**(options or {})):
            progress.begin(f"graph {_graph_name(gm, name)!r}")  # at once: capture and passes take seconds
    try:
        return _captured(lambda: aot_module_simplified(gm, example_inputs, fw_compiler=fw_compiler,
                                                       decompositions=decomposition_table(),
                                                       keep_inference_input_mutations=True),
                         reached, gm, cfg, mode, name)
    finally:
        progress.end()


def _captured(capture: Callable[[], Callable], reached: list[bool], gm: torch.fx.GraphModule,
              cfg: config.Config, mode: str, name: str | None) -> Callable:
    """``capture()`` (AOTAutograd around kiln's compilers), or - never break the user's model - Dynamo's graph run
    eagerly where AOTAutograd's capture failed before it reached kiln's compiler (``reached`` still empty)."""
    from kiln.frontend.gc_quiet import frozen_heap
    try:
        with frozen_heap():  # see [Note: frozen heap during compile]
            return capture()
    except Exception as exc:
        if reached or not cfg.fallback or _dynamo_control_flow(exc):
            raise
        return _capture_failed(gm, exc, mode, name)


def mutated_placeholders(fx_gm: torch.fx.GraphModule) -> set[int]:
    """Positions of the placeholders the graph writes (AOTAutograd keeps an inference graph's input mutations as
    ``copy_`` into the input, or an in-place op on it)."""
    placeholders = {n: k for k, n in enumerate(n for n in fx_gm.graph.nodes if n.op == "placeholder")}
    written = set()
    for n in fx_gm.graph.nodes:
        schema = getattr(n.target, "_schema", None) if n.op == "call_function" else None
        if schema is None or not schema.is_mutable:
            continue
        for arg, value in zip(schema.arguments, n.args):
            if arg.alias_info is not None and arg.alias_info.is_write and value in placeholders:
                written.add(placeholders[value])
    return written


def _dynamo_control_flow(exc: Exception) -> bool:
    """Is ``exc`` Dynamo telling itself to trace the frame again (``RestartAnalysis``: with dynamic shapes, a float
    scalar it will now pass as a tensor - ``TensorifyScalarRestartAnalysis``)?  Not a failure: it must reach
    Dynamo, which calls the backend again with the new graph."""
    restart = getattr(getattr(torch._dynamo, "exc", None), "RestartAnalysis", None)
    return restart is not None and isinstance(exc, restart)


def _capture_failed(gm: torch.fx.GraphModule, exc: Exception, mode: str | None, owner: str | None) -> Callable:
    """Dynamo's graph, run eagerly, after AOTAutograd failed to trace it to ATen with kiln's decompositions (a
    decomposition whose result has other strides than eager's, which a later ``view`` cannot take); the report
    says so."""
    from kiln.report import CompileReport, record
    report = CompileReport(name=_graph_name(gm, owner), mode=mode or "default")
    first_line = (str(exc).splitlines() or [""])[0]
    report.fallback = f"capture to ATen (AOTAutograd) failed: {type(exc).__name__}: {first_line}"
    record(report)
    warnings.warn(f"kiln: {report.fallback}; running graph {report.name!r} eagerly", stacklevel=2)
    return gm.forward


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _graph_name(gm: torch.fx.GraphModule, owner: str | None = None) -> str:
    """The graph's name in reports: the compiled model's class or function when known, else the function
    Dynamo traced and where (``forward (model.py:13)``); a recompilation of the same frame gets ``#n``."""
    name = owner
    if name is None:
        for n in gm.graph.nodes:
            frames = _FRAME.findall(n.meta.get("stack_trace") or "")
            if frames:
                path, line, fn = frames[-1]
                name = f"{fn} ({os.path.basename(path)}:{line})"
                break
    cid = getattr(gm, "meta", {}).get("dynamo_compile_id")
    again = getattr(cid, "frame_compile_id", 0) or 0
    return (name or type(gm).__name__) + (f" #{again + 1}" if again else "")
