"""The graph-level pass pipeline, in order.  Each line says why the pass is where it is.

With ``check=True`` (``KILN_CHECK=1``) the reference interpreter runs the graph on random inputs after every
pass, and the first pass whose results differ from the previous graph's is named in an error.
"""
from __future__ import annotations

import time
from typing import Callable

from kiln import config
from kiln.ir.graph import Graph, verify
from kiln.library import graph_passes, libraries
from kiln.passes.cse import cse
from kiln.passes.dce import dce
from kiln.passes.fold import fold_constants
from kiln.passes.fold_affine import fold_affine
from kiln.passes.fold_pad import fold_pad
from kiln.passes.half_in_fp32 import half_in_fp32
from kiln.passes.inplace_updates import inplace_updates
from kiln.passes.merge_linears import merge_linears
from kiln.passes.order import hoist_last_readers
from kiln.passes.rewrite import RewriteLog
from kiln.passes.simplify import simplify
from kiln.report import CompileReport, PassRecord
from kiln.runtime.build import start_builds
from kiln.tune.choices import Choices

Pass = Callable[[Graph, RewriteLog], Graph]


def _fold(g: Graph, log: RewriteLog) -> Graph:
    cfg = config.get()
    return fold_constants(g, log, cfg.max_folded_numel) if cfg.constant_folding else g


def _fold_affine(g: Graph, log: RewriteLog) -> Graph:
    return fold_affine(g, log) if config.get().constant_folding else g


def _merge_linears(g: Graph, log: RewriteLog) -> Graph:
    return merge_linears(g, log) if config.get().constant_folding else g


def _half_in_fp32(g: Graph, log: RewriteLog) -> Graph:
    return half_in_fp32(g, log) if config.get().library_selection else g


PIPELINE: list[tuple[str, Pass]] = [
    ("dce", lambda g, log: dce(g)),            # drop what lowering produced but nothing uses (e.g. BN's saved stats)
    ("simplify", simplify),                    # canonical scalars and view chains make folding and CSE see more
    ("cse", cse),                              # merge duplicates before folding, so each constant is folded once
    ("fold_constants", _fold),                 # weights are constants: BN scale/shift, transposed weights
    ("fold_affine", _fold_affine),             # needs folded per-channel constants: BN -> conv/linear weights
    ("fold_pad", fold_pad),                    # before the library passes, which choose each convolution by its
                                               # padded shape; its pad node dies in the next line
    ("dce_folded", lambda g, log: dce(g)),     # the unfolded layers: else the library passes pack their weights too
    ("merge_linears", _merge_linears),         # weights final; before the library passes choose per (wider) shape
    ("half_in_fp32", _half_in_fp32),           # after folding, before the library passes: they see fp32 products
    # the operators' passes (kiln/library: kiln's GEMM, convolutions, attention), in their registry's order:
    # after folding (weights are final), before the second clean-up.  Each says why it is where it is
    # (``python -m kiln.pipeline`` prints them).
    *((p.name, p.run) for p in graph_passes()),
    ("simplify_2", simplify),                  # folding exposes x*1, x+0 and new view chains
    ("cse_2", cse),
    ("dce_2", lambda g, log: dce(g)),          # folded constants leave their inputs dead
    ("inplace_updates", inplace_updates),      # after the clean-ups (an input's other readers are gone or final):
                                               # copy_(x, index_put(x, ...)) -> index_put_(x, ...)
    ("order", hoist_last_readers),             # last: the program order the runtime keeps (shorter lifetimes)
]


def run_pipeline(graph: Graph, report: CompileReport | None = None, check: bool = False,
                 choices: Choices | None = None, passes: list[tuple[str, Pass]] | None = None) -> Graph:
    """The passes (``PIPELINE``, or ``passes``) in order over ``graph``; ``choices``: the compile's measured-choice
    service (else one for this run), whose answers go into ``report.choices``."""
    passes = PIPELINE if passes is None else passes
    mode = report.mode if report is not None else "default"
    from kiln.passes.check import Checker
    checker = Checker(graph) if check else None
    if checker is not None and checker.skipped and report is not None:
        report.passes.append(PassRecord("check", 0.0, len(graph.nodes), len(graph.nodes), [checker.skipped]))
    choices = choices if choices is not None else Choices.for_compile(mode)
    if config.get().library_selection:  # kiln's libraries the graph may need build in parallel, from now on
        start_builds(libraries(graph))
    disabled = {name.strip() for name in config.get().disabled_passes.split(",") if name.strip()}
    unknown = disabled - {name for name, _ in passes}
    if unknown:
        raise ValueError(f"kiln: disabled_passes names unknown passes {sorted(unknown)}; the passes are "
                         f"{[name for name, _ in passes]}")
    for name, fn in passes:
        if name in disabled:
            continue
        log = RewriteLog(mode=mode, choices=choices)
        start = time.perf_counter()
        before = len(graph.nodes)
        graph = fn(graph, log)
        verify(graph)
        if report is not None:
            report.passes.append(PassRecord(name, time.perf_counter() - start, before, len(graph.nodes),
                                            log.notes() + choices.take_lines()))
        if checker is not None:
            checker.check(name, graph)
    if report is not None:  # (the same lists: the schedule stage adds its entries to them later)
        report.choices = choices.made
        report.schedules = choices.schedules
    return graph
