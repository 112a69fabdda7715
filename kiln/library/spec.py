"""What a kiln operator package declares about itself, so that the generic stages never import it.

An *operator* is one of kiln's own implementations of a library-sized op (the CPU GEMM, the CPU convolutions,
attention, the GPU matmul template).  Its package (``kiln/library/<op>/``) holds every part of it: the kernel
source, the torch op it registers with its native-call binder and checking reference, the pass that chooses it
and its tuner.  It then describes itself with one ``Operator``; ``kiln/library/__init__.py`` lists them in a fixed
order and the generic stages ask that list:

- the graph pass pipeline runs each operator's ``passes`` in the library stage (``passes/pipeline.py``);
- the compile starts building each operator's ``libraries(graph)`` at once (in parallel with the passes);
- the layout stage asks ``conv2d`` (a convolution whose input wants channels-last) and ``fixed_strides``
  (a result whose layout the library fixes: correctness, not speed - kernels must index it that way);
- the program builder lets ``out_variants`` write into the arena;
- the GPU plan lets ``plan_gpu`` replace steps with its own (the matmul template with its epilogue);
- ``kiln db prune --retired`` keeps the ``records`` and the ``kinds``' records.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

Pass = Callable[[Any, Any], Any]  # (Graph, RewriteLog) -> Graph


@dataclasses.dataclass(frozen=True)
class GraphPass:
    """A graph -> graph pass an operator adds to the pipeline: its name (``Config.disabled_passes`` and the report
    use it), the function, and why it sits where it does."""
    name: str
    run: Pass
    why: str


def _none(_: Any) -> None:
    return None


def _false(_: Any) -> bool:
    return False


def _no_libraries(_: Any) -> dict[str, Callable[[], Any]]:
    return {}


def _nothing() -> tuple[Any, ...]:
    return ()


@dataclasses.dataclass(frozen=True)
class Operator:
    name: str
    what: str
    passes: tuple[GraphPass, ...] = ()
    # graph -> {library name: loader}: the native libraries the graph may call, built in the background
    libraries: Callable[[Any], dict[str, Callable[[], Any]]] = _no_libraries
    # node -> is it a 2-D convolution of this operator (the layout stage makes its input channels-last)
    conv2d: Callable[[Any], bool] = _false
    # node -> the strides this operator's library writes the node's result with whatever its inputs, or None
    fixed_strides: Callable[[Any], tuple[int, ...] | None] = _none
    # op overload packets whose ``.out`` overload writes into a buffer the caller gives (the arena)
    out_variants: Callable[[], tuple[Any, ...]] = _nothing
    # (plan, graph, report, device, choices) -> None: rewrite a GPU plan's steps in place (its own step kinds),
    # its measured choices through ``choices`` (the compile's service)
    plan_gpu: Callable[..., None] | None = None
    # the tuning database record kinds this operator reads and writes (its measured choices' kinds and tuners)
    records: Callable[[], tuple[str, ...]] = _nothing


def when_selecting(run: Pass) -> Pass:
    """``run`` as a pipeline pass that does nothing under ``Config.library_selection=False`` (ATen keeps every
    library-sized op: how ``kiln bisect`` and the tests take kiln's own libraries out of a compile)."""
    from kiln import config

    def selecting(graph: Any, log: Any) -> Any:
        return run(graph, log) if config.get().library_selection else graph
    selecting.__name__ = selecting.__qualname__ = getattr(run, "__name__", "selecting")
    selecting.__doc__ = run.__doc__
    return selecting
