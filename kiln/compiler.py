"""Compile one captured ATen graph: lower -> passes -> kernels -> C++ -> runtime module.

Everything that can go wrong after capture is caught here: with ``fallback`` on (the default) the graph
runs eagerly and the report says why; with it off the error propagates.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.fx

from kiln import config as config_mod
from kiln.report import CompileReport, record


def compile_aten_graph(fx_gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor], *,
                       cfg: config_mod.Config, mode: str = "default", name: str = "graph") -> Callable:
    report = CompileReport(name=name, mode=mode)
    record(report)
    start = time.perf_counter()
    try:
        # AOTAutograd calls us under its fake-tensor mode; kiln folds real weights, so step out of it.
        from torch.utils._python_dispatch import _disable_current_modes
        with _disable_current_modes(), torch.no_grad(), \
                config_mod.scope(**{k: getattr(cfg, k) for k in config_mod.Config.option_names()}):
            fn = _compile(fx_gm, frozen, cfg, report)
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


def _eager(fx_gm: torch.fx.GraphModule) -> Callable:
    def run(args: list[Any]) -> Any:
        return fx_gm(*args)
    return run


TARGET_NAMES = ("auto", "cpu", "triton")


def _device_of(fx_gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor]) -> torch.device:
    """The device of the graph's tensors (inputs first, then frozen weights); CPU when it has none."""
    for n in fx_gm.graph.nodes:
        val = n.meta.get("val") if n.op == "placeholder" else None
        if isinstance(val, torch.Tensor):
            return val.device
    for t in frozen.values():
        return t.device
    return torch.device("cpu")


def _use_triton(target: str, device: torch.device) -> bool:
    if target not in TARGET_NAMES:
        raise ValueError(f"kiln: unknown target {target!r}; accepted targets are {list(TARGET_NAMES)}")
    return target == "triton" or (target == "auto" and device.type == "cuda")


def _compile(fx_gm: torch.fx.GraphModule, frozen: dict[int, torch.Tensor], cfg: config_mod.Config,
             report: CompileReport) -> Callable:
    from kiln.frontend.lower import lower_fx
    from kiln.frontend.lowering_base import KERNEL_DTYPES, TRITON_KERNEL_DTYPES
    from kiln.passes.pipeline import run_pipeline
    from kiln.runtime.choose import build_best
    from kiln.runtime.module import build_module

    device = _device_of(fx_gm, frozen)
    triton = _use_triton(cfg.target, device)
    start = time.perf_counter()
    graph, externs = lower_fx(fx_gm, frozen, TRITON_KERNEL_DTYPES if triton else KERNEL_DTYPES)
    report.captured = graph
    report.phases["lower"] = time.perf_counter() - start
    graph = run_pipeline(graph, report, check=cfg.check)
    report.optimized = graph
    report.phases["passes"] = time.perf_counter() - start - report.phases["lower"]
    if triton:
        from kiln.runtime.triton_module import build_triton_module
        report.target = "triton"
        module = build_triton_module(graph, report, device, report.mode)
    else:
        if device.type != "cpu":
            raise ValueError(f"kiln: target {cfg.target!r} generates C++ for CPU tensors, but the inputs are on "
                             f"{device}; use target='auto' or 'cuda'")
        module = build_best(graph, report, build_module)
    input_positions = [n.attr("index") for n in graph.inputs]

    def run(args: Sequence[Any]) -> list[torch.Tensor]:
        return module([args[i] for i in input_positions])
    return run
