"""Pick between whole-graph plans by measuring them (today: contiguous vs channels-last convolutions).

Whether a graph's convolutions gain from channels-last depends on the shapes and on what runs between them,
so for graphs with convolutions kiln builds both plans and keeps the faster one on random inputs of the graph's
types.  Both plans are checked against each other on those inputs, so a layout bug cannot be chosen silently.

Where measuring does not fit the compile's budget the rule predicts channels-last: kiln's own convolutions
(implicit GEMM, Winograd, depthwise) are built, and measured against oneDNN, channels-last, and write it; in a
contiguous plan every one of them is fed NCHW and followed by a transposing kernel.  Measured on one thread
(2026-12-03, the AVX2 Zen 3 dev box, ms per call contiguous -> channels-last): MobileNet-V2 35.4 -> 17.2 (its
depthwise layers read NCHW with strided loads), ConvNeXt-tiny 129.7 -> 122.3, ResNet-50 104.3 -> 97.3, seed
52-54 -> 49-55, ResNet-18 35-36 -> 33-35.
"""
from __future__ import annotations

import hashlib
import time
from typing import Callable

import torch

from kiln import config
from kiln.ir.graph import Graph
from kiln.passes.check import random_inputs
from kiln.report import CompileReport
from kiln.schedule.layout import is_conv2d
from kiln.tune.choices import Choices, Kind

LAYOUT = Kind("layout", 2, ("contiguous", "channels-last"))
BUILD_S = 2.0  # about what building the other plan costs (g++), for the measuring budget


def build_best(graph: Graph, report: CompileReport, build: Callable[[Graph, CompileReport], Callable],
               examples: Callable[[], list[torch.Tensor]] | None = None, choices: Choices | None = None) -> Callable:
    """Build the graph's module; with convolutions and ``layout_autotune``, the faster of both layouts, measured
    on ``examples()`` (copies of the call's inputs) where given, else on random inputs.

    The choice goes through ``choices`` (the compile's service: forced, stored, measured or predicted), keyed by
    the contiguous plan's source, so a warm compile builds (loads) only the chosen plan and measures nothing."""
    cfg = config.get()
    if cfg.layout_optimization or not cfg.layout_autotune or not any(is_conv2d(n) for n in graph.nodes):
        return build(graph, report)
    choices = choices if choices is not None else Choices()
    first_schedule = len(report.schedules)
    plain = build(graph, report)
    plain_schedules = len(report.schedules)  # (the report lists the schedules of the plan that is kept)
    key = (hashlib.sha256(report.source.encode()).hexdigest()[:32], torch.get_num_threads())
    what = f"graph {report.name!r}"
    known = choices.known(LAYOUT, key, what)
    if known == "contiguous":
        report.memory["layout"] = f"contiguous ({choices.made[-1].how})"  # (forced, or stored by an earlier compile)
        return plain
    plain_state = (report.kernels, report.externs, report.native_externs, dict(report.memory), report.source,
                   report.from_cache)

    def keep_plain(why: str) -> Callable:
        (report.kernels, report.externs, report.native_externs, report.memory, report.source,
         report.from_cache) = plain_state
        del report.schedules[plain_schedules:]
        report.memory["layout"] = f"contiguous ({why})"
        return plain

    if known is None and examples is None \
            and any(not (n.dtype.is_floating_point or n.dtype == torch.bool) for n in graph.inputs):
        # (random integers may be indices out of range - ATen raised on a size-1 dim, kiln's own gather would read
        # past its buffer - or integer divisors of 0: with no real values to measure on (a training graph's
        # compile sees fake tensors alone), nothing is run; gradient fuzz group 20000-20026 fell back to eager)
        return keep_plain("not measured: integer inputs, and no real values to run them on")
    measure = False
    if known is None:
        inputs = examples() if examples is not None else random_inputs(graph)
        with torch.inference_mode():
            plain(inputs)  # (the first call loads the module and warms the caches: not what a call costs)
            start = time.perf_counter()
            plain(inputs)
            once_s = time.perf_counter() - start
        measure = choices.can_measure(BUILD_S + 22 * once_s)  # (the other plan's build and ~22 calls of each)
    with config.scope(layout_optimization=True):
        nhwc = build(graph, report)

    def keep_nhwc(why: str) -> Callable:
        report.memory["layout"] = f"channels-last ({why})"
        del report.schedules[first_schedule:plain_schedules]
        return nhwc

    if known == "channels-last":
        return keep_nhwc(choices.made[-1].how)
    with torch.inference_mode():
        first, second = plain(inputs), nhwc(inputs)
        if not all(torch.allclose(b, a, rtol=1e-3, atol=1e-4, equal_nan=True) for a, b in zip(first, second)):
            # never trade correctness for speed: keep the contiguous plan and say why
            return keep_plain("the channels-last plan disagreed on random inputs")
    if not measure:
        choices.predicted(LAYOUT, what, "channels-last", f"measuring budget of {choices.budget_s:g} s too small")
        return keep_nhwc("predicted: measuring budget too small")
    choice = choices.decide(LAYOUT, key, lambda: {"contiguous": lambda: plain(inputs),
                                                  "channels-last": lambda: nhwc(inputs)},
                            baseline="contiguous", what=what)
    how = choices.made[-1]
    if choice == "channels-last":
        return keep_nhwc(f"{how.how}: {how.note}")
    return keep_plain(f"{how.how}: {how.note}" if how.note else how.how)
