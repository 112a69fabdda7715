"""Compile one captured ATen graph: lower -> passes -> kernels -> C++ -> runtime module.

Everything that can go wrong after capture is caught here: with ``fallback`` on (the default) the graph
runs eagerly and the report says why; with it off the error propagates.  A target that cannot run here (no GPU
for "cuda", CUDA tensors for "cpu") is the caller's configuration, not a compile failure: it is raised either way.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import time
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.fx

from kiln import config as config_mod
from kiln.report import CompileReport, record


def compile_aten_graph(fx_gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor], *,
                       cfg: config_mod.Config, mode: str = "default", name: str = "graph",
                       arg_names: Sequence[str | None] = (), examples: Sequence[Any] | None = None,
                       training: str = "", saved_from: int | None = None) -> Callable:
    """Compile ``fx_gm`` (AOTAutograd's forward graph); ``frozen`` maps placeholder positions to the weights they
    are frozen to, ``arg_names`` names placeholders after the user's arguments for errors (None: unknown),
    ``examples`` holds a real value per placeholder (the call being compiled) for measuring plans; ``training``:
    which graph of a training step this is, for the report ([Note: training graphs]); ``saved_from``: a training
    forward's first output that is a value saved for the backward, laid out as kiln chooses ([Note: saved
    activations channels-last]; None: every output in eager's layout)."""
    report = CompileReport(name=name, mode=mode, training=training)
    record(report)
    start = time.perf_counter()
    check_target(cfg.target, _device_of(fx_gm, frozen))
    try:
        from kiln.frontend.data_dependent import compile_split, needs_pieces
        if needs_pieces(fx_gm):  # see [Note: data-dependent sizes]: each piece compiles through this function
            report.target = "pieces"
            fn = compile_split(fx_gm, frozen, functools.partial(compile_aten_graph, cfg=cfg, mode=mode), name,
                               arg_names, examples, report)
        else:
            fn = _compile_outside_fake_mode(fx_gm, frozen, cfg, report, arg_names, examples, saved_from)
            fn = _watching_frozen(fn, fx_gm, frozen, cfg, report, arg_names)
    except Exception as exc:  # never break the user's model
        if not cfg.fallback:
            raise
        report.fallback = f"{type(exc).__name__}: {exc}"
        warnings.warn(f"kiln: compiling graph {name!r} failed, running it eagerly instead ({report.fallback})",
                      stacklevel=2)
        fn = _eager(fx_gm)
    report.compile_seconds = time.perf_counter() - start
    if cfg.verbose:
        print(report.format())
    fn._boxed_call = True  # AOTAutograd's boxed convention: fn(list_of_args), so inputs can be freed early
    return fn


def _compile_outside_fake_mode(fx_gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor],
                               cfg: config_mod.Config, report: CompileReport, arg_names: Sequence[str | None],
                               examples: Sequence[Any] | None, saved_from: int | None = None) -> Callable:
    # AOTAutograd calls us under its fake-tensor mode; kiln folds real weights, so step out of it.
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes(), torch.no_grad(), \
            config_mod.scope(**{k: getattr(cfg, k) for k in config_mod.Config.option_names()}):
        return _compile(fx_gm, frozen, cfg, report, arg_names, examples, saved_from)


def _watching_frozen(fn: Callable, fx_gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor],
                     cfg: config_mod.Config, report: CompileReport, arg_names: Sequence[str | None]) -> Callable:
    """``fn``, compiled again from the weights' new values whenever one of the frozen weights changed in place.

    [Note: frozen weights that change] An inference graph freezes the module's parameters and buffers into the
    graph, and kiln derives constants from them - packed GEMM panels, Conv-BatchNorm folds, merged QKV weights,
    half-precision copies.  TorchDynamo guards on which tensors the module holds, not on their values, so an
    in-place update after the compile (``optimizer.step()`` between evaluations, ``load_state_dict``,
    ``p.add_(...)`` under ``no_grad``) would leave the derived constants stale: silently wrong results.  Every
    in-place write bumps a tensor's version counter, so each call compares the frozen tensors' versions with those
    it was compiled at (~50 ns a tensor) and, where one moved, compiles the graph again from the current values
    (the report counts it, ``weights_changed``).  Not seen: writes through ``p.data`` (a tensor with a version
    counter of its own) and tensors made under ``torch.inference_mode`` (they keep none) - kiln cannot tell those
    changed."""
    tensors = list({id(t): t for t in frozen.values() if isinstance(t, torch.Tensor) and not t.is_inference()
                    }.values())
    if not tensors:
        return fn
    state = {"fn": fn, "versions": [t._version for t in tensors]}

    def run(args: list[Any]) -> Any:
        versions = [t._version for t in tensors]
        if versions != state["versions"]:
            state["versions"] = versions
            report.weights_changed += 1
            again = CompileReport(name=f"{report.name} (weights changed)", mode=report.mode)
            record(again)
            state["fn"] = _compile_outside_fake_mode(fx_gm, frozen, cfg, again, arg_names, None)
        return state["fn"](args)
    return run


def _eager(fx_gm: torch.fx.GraphModule) -> Callable:
    def run(args: list[Any]) -> Any:
        return fx_gm(*args)
    return run


def _tensors(fx_gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """The graph's tensor values: its inputs' (traced), then its frozen weights."""
    placeholders = [n for n in fx_gm.graph.nodes if n.op == "placeholder"]
    inputs = [n.meta.get("val") for k, n in enumerate(placeholders) if k not in frozen]
    return [t for t in inputs if isinstance(t, torch.Tensor)] + list(frozen.values())


def _devices(fx_gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor]) -> list[torch.device]:
    """The devices of the graph's tensors, each once: the inputs' first, then the frozen weights'."""
    return list(dict.fromkeys(t.device for t in _tensors(fx_gm, frozen)))


def _device_of(fx_gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor]) -> torch.device:
    """The device kiln generates code for: its inputs', else its frozen weights'; CPU when it has no tensors.  A
    0-d CPU tensor, which ATen lets meet tensors of any device, decides only where there is nothing else."""
    tensors = _tensors(fx_gm, frozen)
    beside = [t.device for t in tensors if not (t.dim() == 0 and t.device.type == "cpu")]
    return next(iter(beside), next((t.device for t in tensors), torch.device("cpu")))


def _check_devices(fx_gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor]) -> None:
    """kiln generates code for CPU and CUDA tensors; a graph with others (a meta tensor, which eager may accept
    beside CPU weights) fails compilation, so that ``fallback`` runs it eagerly."""
    other = [d for d in _devices(fx_gm, frozen) if d.type not in ("cpu", "cuda")]
    if other:
        raise ValueError(f"kiln: the graph has {other[0].type} tensors; kiln generates code for CPU and CUDA tensors")


def _use_triton(target: str, device: torch.device) -> bool:
    return target in ("cuda", "triton") or (target == "auto" and device.type == "cuda")


def check_target(target: str, device: torch.device | None = None) -> None:
    """Raise a clear error where ``target`` cannot run on this machine, or (when known) on ``device``'s tensors.

    kiln.compile calls it before any input is seen (``device`` None); the compiler again for each graph."""
    if target not in config_mod.TARGETS:
        raise ValueError(f"kiln: unknown target {target!r}; accepted targets are {list(config_mod.TARGETS)}")
    if target == "cuda" and not torch.cuda.is_available():
        why = "this PyTorch build has no CUDA support (torch.version.cuda is None)" if torch.version.cuda is None \
            else "PyTorch finds no CUDA device (torch.cuda.is_available() is False)"
        raise RuntimeError(f"kiln: target 'cuda' needs an NVIDIA GPU, but {why}; use target='auto' or 'cpu' to "
                           f"generate C++ for the CPU")
    if target in ("cuda", "triton") and importlib.util.find_spec("triton") is None:
        raise RuntimeError(f"kiln: target {target!r} generates Triton kernels, but Triton is not installed "
                           f"(pip install triton, or kiln's [gpu] extra)")
    if device is None or target == "auto":
        return
    if target == "cpu" and device.type != "cpu":
        raise ValueError(f"kiln: target 'cpu' generates C++ for CPU tensors, but the inputs are on {device}; use "
                         f"target='auto' or 'cuda'")
    if target == "cuda" and device.type != "cuda":
        raise ValueError(f"kiln: target 'cuda' generates Triton kernels for CUDA tensors, but the inputs are on "
                         f"{device}; move the model and its inputs to the GPU, or use target='auto'")
    if target == "triton" and device.type != "cuda" and not _triton_interprets():
        raise RuntimeError(f"kiln: target 'triton' runs Triton kernels on {device} tensors only in Triton's "
                           f"interpreter, which needs TRITON_INTERPRET=1 in the environment before Triton is "
                           f"imported; use target='auto' or 'cpu' for C++ on the CPU")


def _triton_interprets() -> bool:
    from kiln.runtime.triton_math import INTERPRET  # (how kiln's Triton runtime decides it, at its import)
    return INTERPRET


def _compile(fx_gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor], cfg: config_mod.Config,
             report: CompileReport, arg_names: Sequence[str | None] = (),
             examples: Sequence[Any] | None = None, saved_from: int | None = None) -> Callable:
    from kiln.frontend.lower import has_symbolic_sizes, lower_fx, symbol_inputs
    from kiln.frontend.training_outputs import dense_outputs
    from kiln.frontend.lowering_base import KERNEL_DTYPES, TRITON_KERNEL_DTYPES
    from kiln.ir.graph import compiling_for
    from kiln.passes.pipeline import run_pipeline
    from kiln.schedule.choose import build_best
    from kiln.schedule.plan import build_cpu, build_cpu_symbolic, build_triton
    from kiln.tune.choices import Choices

    _check_devices(fx_gm, frozen)
    device = _device_of(fx_gm, frozen)
    triton = _use_triton(cfg.target, device)
    start = time.perf_counter()
    # a graph traced with dynamic shapes: one build for every size on the CPU, a GPU module per size on the GPU
    # (docs/dynamic_shapes.md)
    symbolic = cfg.dynamic_shapes and has_symbolic_sizes(fx_gm)
    size_outputs: dict[int, Any] = {}
    graph, externs = lower_fx(fx_gm, frozen, TRITON_KERNEL_DTYPES if triton else KERNEL_DTYPES, triton, symbolic,
                              size_outputs)
    report.captured = graph
    report.phases["lower"] = time.perf_counter() - start
    choices = Choices.for_compile(report.mode)
    try:
        with compiling_for(device.type):  # (passes that judge the device from weights: a weightless graph's)
            graph = run_pipeline(graph, report, check=cfg.check, choices=choices)
            if triton and cfg.gpu_split_reductions:
                graph = _split_reductions(graph, report, cfg.gpu_split_column_reductions)
            if report.training and not symbolic:  # ([Note: a training graph's outputs in eager's layout])
                graph = dense_outputs(fx_gm, graph, set(size_outputs))
        report.optimized = graph
        report.phases["passes"] = time.perf_counter() - start - report.phases["lower"]
        if triton and not symbolic:
            report.target = "triton"
            free = _saved_positions(fx_gm, size_outputs, saved_from) if saved_from is not None else frozenset()
            module = build_triton(graph, report, device, report.mode, choices, free)
            if free:
                _report_output_strides(fx_gm, graph, module, size_outputs)
        elif symbolic:
            int_sizes = symbol_inputs(fx_gm)
            if triton:
                report.target = "triton"
                module = _symbolic_triton(report.captured, graph, report, device, cfg,
                                          [name for name, _ in int_sizes])
            else:
                module = build_cpu_symbolic(graph, report, choices, [name for name, _ in int_sizes])
            positions = [n.attr("index") for n in graph.inputs] + [k for _, k in int_sizes]
            fixes = _alias_fixes(fx_gm, graph, module.call_sizes, set(size_outputs), not report.training)
            if report.training:
                fixes += _views_of_outputs(graph, module.call_sizes, {f.output for f in fixes})
            run = _runner(module, positions, arg_names, fixes)
            run = _with_size_outputs(run, size_outputs, module.call_sizes) if size_outputs else run
            if triton:
                if getattr(module, "build_after", 1) > 1:  # (a size's first calls run eagerly until it is built)
                    run = _eager_until_built(run, module, positions, fx_gm)
                return _host_scalars_moved(run, fx_gm, device, report)
            return run
        else:
            module = build_best(graph, report, functools.partial(build_cpu, choices=choices),
                                _example_inputs(graph, examples), choices)
            if cfg.emulate_cuda_graphs:  # ([Note: CUDA graphs emulated on the CPU]: tests and diagnosis)
                from kiln.runtime.cuda_graphs import with_cuda_graph
                module = with_cuda_graph(module, report, report.mode)
    finally:
        choices.close()
    run = _runner(module, [n.attr("index") for n in graph.inputs], arg_names,
                  _alias_fixes(fx_gm, graph, skip=set(size_outputs), output_views=not report.training))
    # (a static graph's outputs that are no tensors are constants: no sizes to bind, ``dict()`` is empty)
    run = _with_size_outputs(run, size_outputs, dict) if size_outputs else run
    return _host_scalars_moved(run, fx_gm, device, report) if triton else run


def _saved_positions(fx_gm: torch.fx.GraphModule, size_outputs: dict[int, Any], saved_from: int) -> frozenset[int]:
    """The positions among the kiln graph's outputs (the FX outputs less the sizes) of a training forward's saved
    values: FX outputs ``saved_from`` on ([Note: saved activations channels-last])."""
    count = len(fx_gm.graph.output_node().args[0])
    tensors = [k for k in range(count) if k not in size_outputs]
    return frozenset(p for p, k in enumerate(tensors) if k >= saved_from)


def _report_output_strides(fx_gm: torch.fx.GraphModule, graph: Any, module: Any,
                           size_outputs: dict[int, Any]) -> None:
    """Tell AOTAutograd the strides of the outputs kiln lays out otherwise than the traced graph (a training
    forward's saved values, [Note: saved activations channels-last]): it compiles the backward for inputs in those
    strides.  Outputs kiln hands out as traced are None (AOTAutograd keeps the traced strides)."""
    context = torch._guards.TracingContext.try_get()
    strides_list = getattr(context, "output_strides", None)
    if strides_list is None or strides_list:  # (none asked for, or a compiler already answered)
        return
    laid_out = getattr(getattr(module, "module", module), "laid_out_outputs", {})
    outputs = iter(graph.outputs)
    for k in range(len(fx_gm.graph.output_node().args[0])):
        if k in size_outputs:
            strides_list.append(None)
            continue
        strides = laid_out.get(next(outputs))
        strides_list.append(tuple(strides) if strides is not None else None)


def _split_reductions(graph: Any, report: CompileReport, columns: bool) -> Any:
    """The GPU's two-stage reductions ([Note: reductions split for the GPU]; ``columns``: [Note: column reductions
    split for the GPU] too), as a pass of the report."""
    from kiln.passes.rewrite import RewriteLog
    from kiln.passes.split_reductions import split_reductions
    from kiln.report import PassRecord
    log, start, before = RewriteLog(), time.perf_counter(), len(graph.nodes)
    graph = split_reductions(graph, log, columns=columns)
    report.passes.append(PassRecord("split_reductions", time.perf_counter() - start, before, len(graph.nodes),
                                    log.notes()))
    return graph


def _host_scalars_moved(run: Callable, fx_gm: torch.fx.GraphModule, device: torch.device,
                        report: CompileReport) -> Callable:
    """``run``, with the graph's 0-d CPU tensor inputs copied to the GPU graph's ``device`` first.

    ATen lets a 0-d CPU tensor meet CUDA tensors, and TorchDynamo passes one where a graph reads a Python float it
    does not specialize (``dynamic=True``: a module's ``self.scale = 0.125`` becomes a float64 input); kiln's
    kernels read every input from the device, so the value is copied there at each call (8 bytes, no wait for the
    device) and the report says so."""
    if device.type != "cuda":
        return run
    placeholders = [n for n in fx_gm.graph.nodes if n.op == "placeholder"]
    # (any 0-d input, whatever its traced device, is copied where it comes on the CPU: memory-efficient
    # attention's random seed and offset, which its forward returns on the CPU outside a CUDA graph's capture and
    # on the GPU inside one - its meta function leaves the device open - reach a training backward as CPU
    # tensors where the trace had the GPU: refused, session 45 on the H100)
    host = [k for k, n in enumerate(placeholders) if isinstance(v := n.meta.get("val"), torch.Tensor) and v.dim() == 0]
    if not host:
        return run
    traced = [k for k in host if placeholders[k].meta["val"].device.type != device.type]
    if traced:
        report.host_inputs = (f"{len(traced)} 0-d CPU tensor(s) (arguments {traced}: Python floats TorchDynamo "
                              f"passes as tensors, attention's random seeds) copied to {device} at each call")

    def call(args: Sequence[Any]) -> Any:
        args = list(args)
        for k in host:
            if isinstance(args[k], torch.Tensor) and args[k].device.type == "cpu":
                args[k] = args[k].to(device, non_blocking=True)
        return run(args)
    return call


def _symbolic_triton(captured: Any, optimized: Any, report: CompileReport, device: torch.device,
                     cfg: config_mod.Config, int_sizes: list[str]) -> Callable:
    """A symbolic graph's GPU module: kernels with size parameters ([Note: GPU kernels with size parameters]),
    else - switched off, or a graph they cannot express (the report says why) - a static build per size."""
    from kiln.ir.graph import compiling_for
    from kiln.schedule.gpu_symbolic import build_triton_symbolic
    why = "switched off (gpu_symbolic_kernels)"
    if cfg.gpu_symbolic_kernels:
        try:
            with compiling_for(device.type):
                return build_triton_symbolic(optimized, report, device, int_sizes)
        except NotImplementedError as exc:
            why = str(exc)
    module = _sized_triton(captured, optimized, report, device, cfg, int_sizes)
    report.dynamic["per_size"] += f" (kernels with size parameters: {why})"
    return module


def _sized_triton(captured: Any, optimized: Any, report: CompileReport, device: torch.device,
                  cfg: config_mod.Config, int_sizes: list[str]) -> Callable:
    """A symbolic graph's GPU module: a static build per size tuple ([Note: a GPU module per size]), each made
    under the compile's options, outside any fake mode, with a measured-choice service of its own.

    Each size's graph is the *captured* graph at those sizes, optimized by the pass pipeline as a static graph
    is (passes that need static shapes - a size-1 broadcast, a row count to align - fire there as in a static
    compile), unless at that size an output would become an input or a view of one where the symbolic
    optimization (whose outputs the caller's alias fixes were made for) has none: that size takes the symbolic
    optimization's graph instead."""
    from torch.utils._python_dispatch import _disable_current_modes
    from kiln.ir.graph import Op, compiling_for, view_root
    from kiln.ir.sym import symbols_of
    from kiln.passes.pipeline import run_pipeline
    from kiln.runtime.dynamic import SizedTritonGraph
    from kiln.schedule.plan import build_triton
    from kiln.schedule.specialize import concrete_graph, holds_size, static_nodes
    from kiln.tune.choices import Choices
    options = {k: getattr(cfg, k) for k in config_mod.Config.option_names()}

    def concretizer(graph: Any) -> Callable[[dict[str, int]], Any]:
        static = static_nodes(graph)
        sized = {n for n in graph.nodes if n not in static and holds_size(n.attrs)}
        return lambda env: concrete_graph(graph, env, static, sized)[0]

    def input_outputs(graph: Any) -> list[bool]:
        return [view_root(o).op is Op.INPUT for o in graph.outputs]

    at_sizes, optimized_at_sizes = concretizer(captured), concretizer(optimized)
    expected = input_outputs(optimized)

    def build(env: dict[str, int], size_report: CompileReport) -> Any:
        start = time.perf_counter()
        with _disable_current_modes(), torch.no_grad(), config_mod.scope(**options):
            choices = Choices.for_compile(size_report.mode)
            try:
                # (the compile's own report, the first size's, keeps the symbolic pipeline's record)
                passes_report = size_report if size_report is not report else CompileReport(report.name)
                with compiling_for(device.type):
                    graph = run_pipeline(at_sizes(env), passes_report, check=cfg.check, choices=choices)
                if input_outputs(graph) != expected or len(graph.inputs) != len(optimized.inputs):
                    graph = optimized_at_sizes(env)
                size_report.optimized = graph
                module = build_triton(graph, size_report, device, size_report.mode, choices)
            finally:
                choices.close()
        size_report.target = "triton"
        size_report.phases["size_build"] = time.perf_counter() - start
        return module

    by_name = {s.name: s for g in (captured, optimized) for n in g.nodes for d in n.shape for s in symbols_of(d)}
    symbols = [by_name[name] for name in sorted(by_name)]
    module = SizedTritonGraph(optimized, report, build, [s.name for s in symbols], device, int_sizes=int_sizes,
                              build_after=cfg.gpu_dynamic_build_after)
    report.dynamic["ranges"] = ", ".join(f"{s.name} in [{s.lo}, {'inf' if s.hi is None else s.hi}]" for s in symbols)
    report.dynamic["per_size"] = "a static GPU module built per size tuple"
    return module


def _eager_until_built(run: Callable, module: Any, positions: list[int], fx_gm: torch.fx.GraphModule) -> Callable:
    """``run``, except for calls at a size whose GPU module is not built yet and is not due to be
    (``SizedTritonGraph.ready``): those run the captured graph eagerly."""
    from kiln.runtime.errors import InputMismatch
    eager = _eager(fx_gm)

    def call(args: Sequence[Any]) -> Any:
        try:
            ready = module.ready([args[i] for i in positions])
        except InputMismatch:
            return run(args)  # (whose error names the user's argument)
        return run(args) if ready else eager(args)
    return call


def _example_inputs(graph: Any, examples: Sequence[Any] | None) -> Callable[[], list[torch.Tensor]] | None:
    """A function giving copies of the call's real values of the graph's inputs (None where they are not known or
    do not match): plans are measured on them, not on random values, which may be out-of-range indices for a
    gather (whose kernel does not check: a random index read past its buffer, fuzz seeds 20033-20038) or integer
    divisors of 0.  Copies, made only when a plan is measured: a graph may update an input in place."""
    from torch._subclasses.fake_tensor import FakeTensor
    if examples is None:
        return None
    values = []
    for n in graph.inputs:
        k = n.attr("index")
        v = examples[k] if k < len(examples) else None
        if not isinstance(v, torch.Tensor) or isinstance(v, FakeTensor) or v.device.type == "meta" \
                or v.dtype != n.dtype or tuple(v.shape) != n.shape:
            return None
        values.append(v)
    return lambda: [v.detach().clone() for v in values]


def _aliases_input(node: Any) -> bool:
    """Is FX value ``node`` a graph input or a view of one (AOTAutograd knows such outputs alias an input)?"""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and getattr(node.target, "is_view", False):
        node = node.args[0]
    return isinstance(node, torch.fx.Node) and node.op == "placeholder"


@dataclasses.dataclass
class _AliasFix:
    """An output that kiln's graph computes as an input (or a view chain of one) where the FX graph computes a
    new tensor: ``copy(amax(x), y)`` is ``y`` broadcast, ``x * 1`` is ``x``.  Handed back as is, the caller would
    get its own input.  ``views`` rebuild it from a copy of input ``position``, taken before the call when the
    graph updates that input in place (else the output would show the update: fuzz seed 4591)."""
    output: int
    position: int                       # the input's position among AOTAutograd's arguments
    views: list[Callable[[torch.Tensor], torch.Tensor]]
    before_call: bool                   # the graph mutates the input: copy it before the call
    alias: bool = False                 # the FX output is a view of the input: hand back the view itself
    from_output: int | None = None      # a view of another output instead ([Note: outputs that view outputs])


def _with_size_outputs(run: Callable, size_outputs: dict[int, Any], call_sizes: Callable[[], dict[str, int]]
                       ) -> Callable:
    """``run`` with the graph's outputs that are no tensors put back at their positions: sizes (evaluated at the
    call's sizes) and constants (a backward graph's ``None`` for an input that needs no gradient)."""
    from kiln.ir.sym import concrete
    order = sorted(size_outputs.items())

    def with_sizes(args: Sequence[Any]) -> list[Any]:
        outs = list(run(args))
        sizes = call_sizes()
        for k, expr in order:
            outs.insert(k, concrete(expr, sizes))
        return outs
    return with_sizes


def _alias_fixes(fx_gm: torch.fx.GraphModule, graph: Any,
                 call_sizes: Callable[[], dict[str, int]] | None = None, skip: set[int] = frozenset(),
                 output_views: bool = True) -> list[_AliasFix]:
    """``call_sizes``: for a symbolic graph, the sizes of the module's last call (views take them); ``skip``: FX
    output positions that are sizes, not graph outputs; ``output_views``: outputs that view other outputs are
    handed back as views ([Note: outputs that view outputs]; not in a training step's graphs, where AOTAutograd
    rebuilds the aliases that need gradients and a saved value or a gradient must not share a user's tensor - a
    symbolic one's take ``_views_of_outputs``)."""
    from kiln.ir.graph import Op, view_root
    from kiln.ir.interp import eval_node, view_function
    from kiln.ir.ops import VIEW
    from kiln.ir.graph import mutates

    placeholders = [n for n in fx_gm.graph.nodes if n.op == "placeholder"]
    fx_outputs = next(n for n in fx_gm.graph.nodes if n.op == "output").args[0]
    fx_outputs = fx_outputs if isinstance(fx_outputs, (list, tuple)) else [fx_outputs]
    fx_outputs = [o for k, o in enumerate(fx_outputs) if k not in skip]
    mutated = {view_root(i) for m in graph.nodes if mutates(m) for i in m.inputs}
    fixes = []
    for k, (fx_out, out) in enumerate(zip(fx_outputs, graph.outputs)):
        chain = []
        while out.op in VIEW:
            chain.append(out)
            out = out.inputs[0]
        root = _aliased_placeholder(fx_out, placeholders) if call_sizes is not None else None
        if root is not None and root is not fx_out:
            # [Note: outputs aliasing inputs under dynamic shapes] AOTAutograd rebuilds such an output from the
            # caller's input with the strides and offset of what the graph returned (as_strided): it must be that
            # very view of the caller's tensor - not a view of the contiguous copy kiln read it through, nor a
            # computed copy with the same values (fuzz-symbolic seeds 156, 288: wrong elements).  Its geometry is
            # the FX output's, evaluated at the call's sizes.
            geometry = _view_geometry(fx_out, root)
            if geometry is not None:
                fixes.append(_AliasFix(k, placeholders.index(root),
                                       [lambda t, g=geometry: _as_view(t, g, call_sizes())], False, alias=True))
                continue
            if out.op is Op.INPUT and chain:  # (an input traced strided: kiln's own view chain of it)
                fixes.append(_AliasFix(k, out.attr("index"), [lambda t, v=v: eval_node(v, [t], call_sizes())
                                                              for v in reversed(chain)], False, alias=True))
            continue
        if out.op is Op.INPUT and not _aliases_input(fx_out):
            views = [view_function(v) if call_sizes is None else
                     (lambda t, v=v: eval_node(v, [t], call_sizes())) for v in reversed(chain)]
            fixes.append(_AliasFix(k, out.attr("index"), views, out in mutated))
    fixes += _distinct_outputs(fx_outputs, graph.outputs, {f.output for f in fixes})
    if not output_views:
        return fixes
    return fixes + _output_views(fx_outputs, placeholders, {f.output for f in fixes}, call_sizes)


# [Note: one value at two outputs]
# The passes may make two outputs that are tensors of their own in FX one node of kiln's graph: CSE merges
# ``x * 2`` computed twice, a clone of a value is the value, two empty results are one zero-size expand.  kiln
# would hand the caller one tensor object at both positions: an in-place update of one would show in the other,
# and in a training step AOTAutograd marks outputs non-differentiable by object - output 0 marked with output 2
# (an integer cast's) gets no gradient, and the backward crashed on its missing tangent (gradient fuzz seed
# 4192).  The later positions get copies.
def _distinct_outputs(fx_outputs: list[Any], graph_outputs: list[Any], fixed: set[int]) -> list[_AliasFix]:
    from kiln.ir.graph import view_root
    first: dict[Any, int] = {}
    fixes = []
    for k, (fx_out, out) in enumerate(zip(fx_outputs, graph_outputs)):
        if k in fixed:
            continue
        j = first.setdefault(view_root(out), k)
        if j == k:
            continue
        shared = _fx_storage(fx_out)
        if fx_out is fx_outputs[j] or shared is not None and shared == _fx_storage(fx_outputs[j]):
            continue  # (one tensor in eager too, or views of one: [Note: outputs that view outputs])
        fixes.append(_AliasFix(k, -1, [torch.Tensor.clone], False, alias=True, from_output=k))
    return fixes


# [Note: outputs that view outputs]
# ``y = x * 2; return y, y.view(-1), y[1:]``: in eager the three share y's storage - an in-place update of one
# shows through the others, and the views have y's strides and offsets.  AOTAutograd rebuilds such views from
# their base only where they need gradients; in inference the compiler must return them as views.  kiln computes
# each output into a buffer of its own, so an output whose FX value shares storage with another output that
# covers that whole storage (the base) is handed back as that very view of the base kiln returned (its traced
# sizes, strides and offset, evaluated at the call's sizes).  Where the base came back laid out otherwise than
# traced, the computed output stays (right values, no aliasing) rather than a view of a copy.
def _output_views(fx_outputs: list[Any], placeholders: list[Any], fixed: set[int],
                  call_sizes: Callable[[], dict[str, int]] | None) -> list[_AliasFix]:
    inputs = {key for key in map(_storage, (p.meta.get("val") for p in placeholders)) if key is not None}
    groups: dict[Any, list[int]] = {}
    vals = [o.meta.get("val") if isinstance(o, torch.fx.Node) else None for o in fx_outputs]
    for k, v in enumerate(vals):
        key = _storage(v)
        if key is not None and key not in inputs and k not in fixed:
            groups.setdefault(key, []).append(k)
    fixes = []
    for ks in groups.values():
        if len(ks) < 2:
            continue
        base = next((k for k in ks if _covers_its_storage(vals[k])), None)
        if base is None:
            continue
        for k in ks:
            geometry = None if k == base or fx_outputs[k] is fx_outputs[base] else \
                _view_geometry(fx_outputs[k], fx_outputs[base])
            if geometry is not None:
                fixes.append(_AliasFix(k, -1, [lambda t, g=geometry: _traced_view(t, g, call_sizes)], False,
                                       alias=True, from_output=base))
    return fixes


def _views_of_outputs(graph: Any, call_sizes: Callable[[], dict[str, int]], fixed: set[int]) -> list[_AliasFix]:
    """[Note: views of outputs in a symbolic training graph] A symbolic module returns each output as a buffer of
    its own.  In a training forward AOTAutograd returns an intermediate (``where``) beside outputs that view it
    (its ``tensor_split``) and rebuilds those from it with the strides and offset of what kiln returned: a dense
    copy's made them read the base's first rows - wrong gradients on both targets (fuzz_symbolic --grad seeds 84
    and 307; in 307 kiln lays the base out otherwise than eager, so eager's view geometry would be wrong too).  An
    output kiln computes as a view chain of another output's node is handed back as that chain applied to that
    output: kiln's own layout, consistent with the base it returned."""
    from kiln.ir.graph import Op
    from kiln.ir.interp import eval_node
    from kiln.ir.ops import VIEW
    first: dict[Any, int] = {}
    for k, o in enumerate(graph.outputs):
        if o.op not in VIEW and o.op is not Op.INPUT:
            first.setdefault(o, k)
    fixes = []
    for k, o in enumerate(graph.outputs):
        if k in fixed or o.op not in VIEW:
            continue
        chain, n = [], o
        while n.op in VIEW and n not in first:
            chain.append(n)
            n = n.inputs[0]
        if n in first and first[n] != k:
            def apply(t: torch.Tensor, chain: list = chain[::-1]) -> torch.Tensor:
                sizes = call_sizes()
                for v in chain:
                    t = eval_node(v, [t], sizes)
                return t
            fixes.append(_AliasFix(k, -1, [apply], False, alias=True, from_output=first[n]))
    return fixes


def _covers_its_storage(v: torch.Tensor) -> bool:
    """Is ``v`` (a traced value) a contiguous tensor that is its whole storage, from its start?"""
    try:
        return v.storage_offset() == 0 and v.is_contiguous() and \
            v.untyped_storage().nbytes() == v.numel() * v.element_size()
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def _traced_view(t: torch.Tensor, geometry: tuple, call_sizes: Callable[[], dict[str, int]] | None
                 ) -> torch.Tensor | None:
    """The traced view of output ``t``, or None where ``t`` is not laid out as traced."""
    from kiln.ir.sym import concrete
    sizes = call_sizes() if call_sizes is not None else None
    base_strides = [concrete(s, sizes) for s in geometry[3]]
    if not t.is_contiguous() or list(t.stride()) != base_strides and t.numel() > 1:
        return None
    return _as_view(t, geometry, sizes)


def _aliased_placeholder(fx_out: Any, placeholders: list[Any]) -> Any:
    """The placeholder whose storage FX output ``fx_out`` shares (a view of an input, through any op: a chunk is
    ``split`` and ``getitem``), or None."""
    storage = _storage(fx_out.meta.get("val") if isinstance(fx_out, torch.fx.Node) else None)
    if storage is None:
        return None
    return next((p for p in placeholders if (key := _storage(p.meta.get("val"))) is not None and key == storage),
                None)


def _fx_storage(node: Any) -> Any:
    """``_storage`` of FX output ``node``'s traced value (None for an output that is no node)."""
    return _storage(node.meta.get("val")) if isinstance(node, torch.fx.Node) else None


def _storage(val: Any) -> Any:
    """A key for the storage of traced value ``val`` (equal for values that share it), or None where it is no
    tensor or has no storage to compare."""
    from torch.multiprocessing.reductions import StorageWeakRef
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return StorageWeakRef(val.untyped_storage())
    except (RuntimeError, NotImplementedError):
        return None


def _view_geometry(fx_out: Any, root: Any) -> tuple | None:
    """(sizes, strides, storage offset from the input's, the input's strides) of an FX output that views its input
    ``root``, as size expressions over the graph's symbols (None: a size kiln has no expression for).  The
    strides address the input's storage: those of a view of an input traced with strides of its own (an expanded
    input: zeros) hold for a call whose input has the strides traced, which Dynamo's guards see to."""
    from kiln.frontend.lowering_base import Unsupported, sym_size
    val, base = fx_out.meta.get("val"), root.meta.get("val")
    try:
        return ([sym_size(x) for x in val.shape], [sym_size(x) for x in val.stride()],
                sym_size(val.storage_offset()) - sym_size(base.storage_offset()),
                [sym_size(x) for x in base.stride()])
    except (Unsupported, TypeError):
        return None


def _as_view(t: torch.Tensor, geometry: tuple, sizes: dict[str, int]) -> torch.Tensor:
    """The view ``geometry`` (``_view_geometry``'s) describes of input ``t``, at the call's ``sizes``."""
    from kiln.ir.sym import concrete
    from kiln.ir.ops import contiguous_strides
    shape, strides, offset, base_strides = (concrete(g, sizes) for g in geometry)
    if list(t.stride()) == base_strides or t.is_contiguous() and base_strides == list(contiguous_strides(t.shape)):
        return t.as_strided(shape, strides, t.storage_offset() + offset)
    # (the call's input is laid out otherwise than traced: the view of a copy in the traced layout, which
    # AOTAutograd may rebuild from the input itself)
    copy = torch.empty_strided(t.shape, base_strides, dtype=t.dtype, device=t.device)
    copy.copy_(t)
    return copy.as_strided(shape, strides, offset)


def _runner(module: Callable, input_positions: list[int], arg_names: Sequence[str | None],
            fixes: Sequence[_AliasFix] = ()) -> Callable:
    """The graph's call on AOTAutograd's arguments: the module's inputs picked by position; an input the module
    was not compiled for is reported under the user's argument name; outputs that would alias an input are
    rebuilt on a copy (``_AliasFix``)."""
    from kiln.runtime.errors import InputMismatch
    before = [f for f in fixes if f.before_call]

    def plain(args: Sequence[Any]) -> list[torch.Tensor]:  # (no fixes: the common case, ~1 us less per call)
        try:
            return module([args[i] for i in input_positions])
        except InputMismatch as exc:
            position = input_positions[exc.k]
            raise exc.named(arg_names[position] if position < len(arg_names) else None) from None

    if not fixes:
        return plain

    def run(args: Sequence[Any]) -> list[torch.Tensor]:
        saved = {id(f): args[f.position].clone() for f in before}
        try:
            outs = module([args[i] for i in input_positions])
        except InputMismatch as exc:  # (a try costs nothing until it catches)
            position = input_positions[exc.k]
            raise exc.named(arg_names[position] if position < len(arg_names) else None) from None
        if fixes and not isinstance(outs, list):
            outs = list(outs)  # (a generated GPU wrapper may return a tuple)
        for f in fixes:
            if f.from_output is not None:  # ([Note: outputs that view outputs]: None keeps the computed output)
                view = f.views[0](outs[f.from_output])
                outs[f.output] = outs[f.output] if view is None else view
                continue
            value = saved[id(f)] if f.before_call else args[f.position]
            for view in f.views:
                value = view(value)
            # (a view chain may expand: eager's result is a tensor of its own, unless it is a view in FX too)
            outs[f.output] = value if f.alias else value.clone()
        return outs
    return run
