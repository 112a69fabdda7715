"""Time per step of compiled graphs, against the machine's limit: ``kiln.profile``.

    prof = kiln.profile(model, x)        # compiles, warms up, then times calls step by step; prints the table
    with kiln.Profile() as prof:         # or around any calls of kiln-compiled code
        fast(x)
    print(prof)

While a ``Profile`` is active, every compiled graph that runs times each step of its program and adds the
times to it.  On the CPU each segment (a run of generated kernels and native library calls in one C function)
has a twin that reads ``omp_get_wtime()`` after each entry (``codegen/cpp.py``), so the kernels and library
calls inside a segment are timed one by one without leaving C++ - the torch profiler sees none of them.
Python externs are timed around the call.  On the GPU the interpreted program runs instead of the generated
wrapper (or the CUDA graph), with CUDA events recorded around each step, behind a GPU sleep long enough for the
host to queue the whole call: a step's time is the GPU's, as when a CUDA graph replays the steps back to back,
and a call's time is the GPU's span from its first step to its last.

A step's work: FLOPs (a matrix product 2mnk, a convolution 2 x outputs x C/groups x kh x kw, attention
4 x b h t s d, halved when causal; a generated kernel its arithmetic ops per element x elements) and bytes
(each buffer it reads or writes, once: a lower bound).  Its limit is the roofline bound
``max(FLOPs / peak, bytes / bandwidth)`` with the peaks measured on this machine (``runtime/peaks.py``), and
"of limit" is that bound over the measured time: 100% is as fast as the hardware allows.  (FLOPs are the direct
algorithm's: Winograd, which multiplies less, can show more than 100%.)
"""
from __future__ import annotations

import contextvars
import ctypes
import dataclasses
import math
import statistics
import time
from typing import Any, Callable

import torch

from kiln.runtime import peaks

# The profile of the ``with`` block the current thread (or task) is in: a context, as torch.autocast's state is,
# which the runtime reads at each call; not a switch anyone flips.
_ACTIVE: contextvars.ContextVar["Profile | None"] = contextvars.ContextVar("kiln_profile", default=None)


def current() -> "Profile | None":
    """The ``Profile`` whose ``with`` block the caller is in, or None."""
    return _ACTIVE.get()
_SLEEP_CYCLES_PER_S = 2.0e9  # GPU clock for torch.cuda._sleep (about the H200's; more only lengthens the lead)


@dataclasses.dataclass
class Step:
    graph: str
    index: int            # position in the graph's program
    name: str
    kind: str             # "kernel", "native" (a library call from C++), "extern" (from Python), "matmul"
    flops: float
    nbytes: float
    seconds: list[float] = dataclasses.field(default_factory=list)

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds) if self.seconds else 0.0


class Profile:
    """Per-step times of the compiled graphs that run while it is active (``with profile:``)."""

    def __init__(self) -> None:
        self.steps: dict[tuple[int, int], Step] = {}
        self.calls: dict[int, list[float]] = {}   # graph -> wall time of each call
        self.names: dict[int, str] = {}
        self.peaks: peaks.Peaks | None = None
        self._token: Any = None
        self._host_s: dict[int, float] = {}  # GPU: the host's time for the last call of each graph

    def __enter__(self) -> "Profile":
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.reset(self._token)

    # ------------------------------------------------------------------ recording
    def run(self, graph: Any, inputs: Any) -> list[torch.Tensor]:
        """One call of ``graph`` (a ``CompiledGraph``) with each program step timed."""
        costs = graph.step_costs()
        key = id(graph)
        self.names.setdefault(key, graph.name)
        if self.peaks is None:
            self.peaks = graph.peaks()
        cuda = graph.device.type == "cuda"
        timed_twins = getattr(graph, "_timed_segment_fns", None)
        pending: list[tuple[Any, Any, Any]] = []  # (step key, start event, end event) on the GPU

        def note(step_key: Any, seconds: list[float]) -> None:
            for (index, name, kind, flops, nbytes), s in zip(costs[step_key], seconds):
                step = self.steps.get((key, index))
                if step is None:
                    step = self.steps[(key, index)] = Step(graph.name, index, name, kind, flops, nbytes)
                step.seconds.append(s)

        def timed(step_key: Any, fn: Callable[[], Any]) -> None:
            if cuda:  # events on the stream: the GPU's time for the step, with no synchronization between steps
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                pending.append((step_key, start, end))
                return
            begin = time.perf_counter()
            fn()
            note(step_key, [time.perf_counter() - begin])

        def around(kind: str, item: Any, run: Callable[[], None]) -> None:
            """One program step, timed (a C++ segment by its timed twin: each entry's own time)."""
            if kind == "segment" and timed_twins is not None:
                stamps = (ctypes.c_double * (len(costs[("segment", item)]) + 1))()
                timed_twins[item](graph.ptrs_addr, stamps)
                note(("segment", item), [b - a for a, b in zip(stamps, stamps[1:])])
                return
            timed((kind, id(item) if kind == "fused" else item), run)

        if not cuda:
            start = time.perf_counter()
            out = graph.interpret(inputs, around)
            self.calls.setdefault(key, []).append(time.perf_counter() - start)
            return out
        # The interpreted program launches slower than the GPU runs small kernels, and an event pair would then
        # time the wait for the launch.  So the GPU first sleeps while the host queues the whole call (twice the
        # host's last time for it): the events time the steps back to back, as a replay runs them.
        torch.cuda.synchronize(graph.device)
        torch.cuda._sleep(int(_SLEEP_CYCLES_PER_S * max(0.005, 2 * self._host_s.get(key, 0.05))))
        start = time.perf_counter()
        out = graph.interpret(inputs, around)
        self._host_s[key] = time.perf_counter() - start
        torch.cuda.synchronize(graph.device)
        for step_key, begin, end in pending:
            note(step_key, [begin.elapsed_time(end) / 1e3])
        if pending:
            self.calls.setdefault(key, []).append(pending[0][1].elapsed_time(pending[-1][2]) / 1e3)
        return out

    # ------------------------------------------------------------------ report
    def format(self) -> str:
        if not self.steps:
            return "kiln profile: no compiled graph ran while profiling"
        lines = ["kiln profile: per step, median over calls; limit = max(FLOPs / peak, bytes / bandwidth)"]
        if self.peaks is not None:
            lines.append(f"  peaks: {self.peaks.what}")
        for key, name in self.names.items():
            steps = sorted((s for (k, _), s in self.steps.items() if k == key), key=lambda s: s.index)
            wall = statistics.median(self.calls[key])
            total = sum(s.median_s for s in steps)
            lines.append(f"\ngraph {name}: {len(self.calls[key])} call(s), {wall * 1e3:.3f} ms per call "
                         f"({total * 1e3:.3f} ms in its steps)")
            lines.append(f"  {'#':>3}  {'step':44s} {'kind':7s} {'ms':>8s} {'share':>6s} {'GFLOP/s':>8s} "
                         f"{'GB/s':>7s} {'limit ms':>9s} {'of limit':>8s}")
            for s in steps:
                t = s.median_s
                limit = self.peaks.limit_s(s.flops, s.nbytes) if self.peaks else 0.0
                lines.append(f"  {s.index:>3}  {s.name[:44]:44s} {s.kind:7s} {t * 1e3:8.3f} "
                             f"{t / total if total else 0:6.1%} {_rate(s.flops, t, 1e9):>8s} "
                             f"{_rate(s.nbytes, t, 1e9):>7s} {limit * 1e3:9.3f} "
                             f"{limit / t if t > 0 else 0:8.0%}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _rate(amount: float, seconds: float, unit: float) -> str:
    return f"{amount / seconds / unit:.1f}" if amount and seconds > 0 else "-"


# ---------------------------------------------------------------------- work per step
def tensor_bytes(shape: Any, dtype: torch.dtype) -> float:
    return float(math.prod(shape)) * torch.empty((), dtype=dtype).element_size()


def library_flops(name: str, args: dict[str, Any], out_shape: tuple[int, ...]) -> float:
    """FLOPs of a library call (``name``: ``ir.extern.short_name`` of its op) from its arguments by schema
    name (tensors or graph nodes; only shapes are read); 0 for ops that only move or compare data."""
    shape = {k: tuple(v.shape) for k, v in args.items() if hasattr(v, "shape")}
    out = float(math.prod(out_shape))
    if name in ("linear_packed", "onednn_linear", "linear", "mm", "bmm") and shape:
        first = shape.get("x") or shape.get("input") or shape.get("self") or next(iter(shape.values()))
        return 2.0 * out * first[-1]
    if name in ("addmm", "baddbmm") and ("mat1" in shape or "batch1" in shape):
        return 2.0 * out * (shape.get("mat1") or shape["batch1"])[-1]
    if name in ("conv_winograd", "conv_gemm"):
        kh, kw = args.get("kernel") or (3, 3)
        return 2.0 * out * shape["x"][1] * kh * kw
    if name == "conv_dw":
        kh, kw = args["kernel"]
        return 2.0 * out * kh * kw
    weight = shape.get("weight") or shape.get("W") or ()  # (aten's and oneDNN's schema names)
    if name in ("convolution", "onednn_convolution") and len(weight) >= 3:  # 1-, 2- and 3-D
        return 2.0 * out * math.prod(weight[1:])  # (input channels per group x the filter's taps)
    if "attention" in name and ("query" in shape or "q" in shape):
        b, h, t, d = shape.get("q") or shape["query"]
        s = (shape.get("k") or shape["key"])[2]
        return 4.0 * b * h * t * s * d * (0.5 if args.get("causal") or args.get("is_causal") else 1.0)
    return 0.0


def step_costs(m: Any) -> dict[Any, list[tuple[int, str, str, float, float]]]:
    """Per program step of compiled graph ``m`` (``runtime/module.py``): its entries' names, kinds and work."""
    from kiln.ir.extern import short_name
    from kiln.ir.graph import Node
    from kiln.runtime import native
    node_of = {name: n for n, name in m.plan.buffer_of.items()}
    kernels = {k.name: k for k in m.plan.kernels}

    def size(n: Node) -> float:
        return tensor_bytes(n.shape, n.dtype)

    def library(n: Node, kind: str, label: str = "") -> tuple[str, str, float, float]:
        args = native.named_args(n) if hasattr(n.attr("target"), "_schema") else {}
        values = [v for v in args.values() if isinstance(v, (Node, torch.Tensor))]
        nbytes = size(n) + sum(size(v) if isinstance(v, Node) else v.numel() * v.element_size() for v in values)
        name = short_name(n.attr("target"))
        return (f"{label} ({name})" if label else name, kind,
                library_flops(name, args, tuple(n.shape)), nbytes)

    def kernel(k: Any) -> tuple[str, str, float, float]:
        reads, writes = k.buffers()
        nbytes = sum(size(node_of[b]) for b in reads | writes if b in node_of)
        return k.name, "kernel", k.arithmetic_ops(), nbytes

    out: dict[Any, list[tuple[int, str, str, float, float]]] = {}
    index = 0
    for kind, item in m.program:
        if kind == "segment":
            entries = [kernel(kernels[e]) if isinstance(e, str) else library(e.node, "native", e.label)
                       for e in m.segments[item]]
            key: Any = ("segment", item)
        elif kind == "extern":
            entries, key = [library(item, "extern")], ("extern", item)
        else:
            entries, key = [library(item.node, "matmul", "template")], ("fused", id(item))
        out[key] = [(index + i, *e) for i, e in enumerate(entries)]
        index += len(entries)
    return out
