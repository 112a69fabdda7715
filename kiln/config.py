"""Every kiln knob in one place: typed, documented, with its environment variable.

No other module reads ``os.environ``; they read ``kiln.config.get()`` instead.  ``scope(**overrides)``
changes knobs for a ``with`` block (tests use it), and ``kiln.compile(..., **options)`` passes its options
through :func:`Config.with_options`, which rejects unknown names with the list of accepted ones and values of
the wrong type or outside a knob's accepted values, naming the option, what it takes and what came.  Environment
values (``KILN_*``) are parsed and checked the same way.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import typing
from pathlib import Path
from typing import Any, Callable, Iterator

# Code generators (``Config.target``, kiln.compile's ``target``): "cuda" is Triton on CUDA tensors (it needs a GPU),
# "triton" is Triton on the inputs' device (CPU tensors: Triton's interpreter, how CI tests the GPU generator).
TARGETS = ("auto", "cpu", "cuda", "triton")
_CHOICES = {"target": TARGETS, "gpu_attention_entry": ("auto", "efficient", "composite")}
_NON_NEGATIVE = ("max_folded_numel", "compile_workers", "tune_budget_s", "choice_budget_s",
                 "matmul_measured_configs")
_ENV_BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False,
              "off": False, "": False}

# What each field type accepts, and how errors describe it.  bool is an int subclass in Python, so ints and
# floats refuse it explicitly: ``compile_workers=True`` is a mistake, not 1.
_KINDS: dict[Any, tuple[Callable[[Any], bool], str]] = {
    bool: (lambda v: isinstance(v, bool), "a bool (True or False)"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an int"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number (int or float)"),
    str: (lambda v: isinstance(v, str), "a str"),
    tuple[str, ...]: (lambda v: isinstance(v, (tuple, list)) and all(isinstance(x, str) for x in v),
                      "a tuple of str"),
}


def _parse_env(env: str, typ: Any, text: str) -> Any:
    """Environment variable ``env``'s ``text`` as a value of ``typ``, or a ValueError naming the variable."""
    if typ is bool:
        word = text.strip().lower()
        if word not in _ENV_BOOLS:
            raise ValueError(f"kiln: environment variable {env} expects a bool (1/0, true/false, yes/no or on/off), "
                             f"got {text!r}")
        return _ENV_BOOLS[word]
    if typ in (int, float):
        try:
            return typ(text)
        except ValueError:
            raise ValueError(f"kiln: environment variable {env} expects {_KINDS[typ][1]}, got {text!r}") from None
    return text


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(Config)


def _checked(name: str, value: Any, label: str) -> Any:
    """``value`` for field ``name``, normalised (an int for a float field becomes a float, a list of flags a
    tuple); TypeError for a value of the wrong type, ValueError for one outside the field's accepted values, each
    naming ``label`` ("option 'check'", "environment variable KILN_CHECK")."""
    typ = _field_types()[name]
    accepts, kind = _KINDS.get(typ, (lambda v: True, ""))  # (a field of a type without a rule: not checked)
    if not accepts(value):
        raise TypeError(f"kiln: {label} expects {kind}, got {value!r} ({type(value).__name__})")
    value = float(value) if typ is float else tuple(value) if typ == tuple[str, ...] else value
    if name in _CHOICES and value not in _CHOICES[name]:
        raise ValueError(f"kiln: {label} expects one of {list(_CHOICES[name])}, got {value!r}")
    if name == "training_memory_budget" and not 0 < value <= 1:
        raise ValueError(f"kiln: {label} expects a share of the saved bytes in (0, 1], got {value!r}")
    if name in _NON_NEGATIVE and value < 0:
        raise ValueError(f"kiln: {label} expects a value >= 0, got {value!r}")
    if name == "winograd_tiles" and not all(re.fullmatch(r"[0-9]+", t.strip()) for t in value.split(",")
                                            if t.strip()):
        # (which sizes kiln's kernels have is the Winograd pass's business, library/conv/select.py: tiles())
        raise ValueError(f"kiln: {label} expects comma-separated tile sizes such as '2' or '2,4' ('' turns "
                         f"Winograd off), got {value!r}")
    if name == "choices" and not re.fullmatch(r"\s*(\w+\s*=\s*[\w-]+\s*(,\s*\w+\s*=\s*[\w-]+\s*)*)?,?\s*", value):
        # (which kinds and answers exist is the choosing passes' business: tune/choices.py checks them)
        raise ValueError(f"kiln: {label} expects comma-separated kind=answer pairs such as 'gemm=kiln,conv=winograd2'"
                         f", got {value!r}")
    if name == "triton_persistent_schedule" and value and not re.fullmatch(r"\s*[0-9]+\s*,\s*[0-9]+\s*", value):
        raise ValueError(f"kiln: {label} expects two comma-separated ints (xblock,num_warps) or '', got {value!r}")
    if name == "triton_tile_schedule" and value and not re.fullmatch(r"\s*[0-9]+(\s*,\s*[0-9]+){2}\s*", value):
        raise ValueError(f"kiln: {label} expects three comma-separated ints (tile_x,tile_y,num_warps) or '', got "
                         f"{value!r}")
    if name == "matmul_template_config" and value and not re.fullmatch(r"\s*[0-9]+(\s*,\s*[0-9]+){5}\s*", value):
        raise ValueError(f"kiln: {label} expects six comma-separated ints (block_m,block_n,block_k,group_m,"
                         f"num_warps,num_stages) or '', got {value!r}")
    return value


def _default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "kiln")


@dataclasses.dataclass(frozen=True)
class Config:
    """kiln's settings. Field name -> environment variable is ``KILN_<NAME upper>``."""

    # Run the reference interpreter after every pass and name the first pass that changes results.
    check: bool = False
    # Where built modules are cached across processes.
    cache_dir: str = dataclasses.field(default_factory=_default_cache_dir)
    # C++ compiler and the flags it is invoked with (an argument list, never a shell string).
    cxx: str = "g++"
    cxx_flags: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
                                  "-fno-math-errno", "-fno-trapping-math")
    # Print the report of what kiln did after each compile.
    verbose: bool = False
    # Fuse pointwise producers into consumers / reductions with their epilogues.
    fusion: bool = True
    # Fold BatchNorm into the preceding convolution/linear and evaluate constant subgraphs at compile time.
    constant_folding: bool = True
    # Largest constant (in elements) that constant folding may create.
    max_folded_numel: int = 1 << 26
    # Measure GEMM libraries (MKL via aten.addmm, oneDNN) per linear-layer shape and call the faster one.
    library_selection: bool = True
    # CPU: call kiln's own GEMM, convolution and attention ops from the generated C++ between the kernels, not
    # through Python, whose code runs cache-cold after a GEMM (runtime/native.py; ``benchmarks/native_calls.py``).
    native_calls: bool = True
    # Compile graphs traced with dynamic shapes (symbolic sizes): on the CPU once, for every size; on the GPU once,
    # with Triton kernels taking the sizes as parameters (docs/dynamic_shapes.md); off: such graphs run eagerly, as
    # before issue 19.
    dynamic_shapes: bool = True
    # GPU, dynamic shapes: one plan and kernels with size parameters for every size ([Note: GPU kernels with size
    # parameters], schedule/gpu_symbolic.py).  Off, or where those kernels cannot express the graph: a static module
    # built per size tuple ([Note: a GPU module per size]).
    gpu_symbolic_kernels: bool = True
    # reduce-overhead over a symbolic graph: its sizes' CUDA graphs share one memory pool ([Note: one memory pool
    # for a symbolic graph's sizes]: less memory, but every output the caller holds is copied before a replay);
    # off (the default since session 36): a private pool per recording.  H100, the GPT over 15 lengths: 6.2 ms
    # shared against 5.2 private (Inductor 6.6) - the copies of held outputs cost more than the memory saves.
    cuda_graph_shared_pool: bool = False
    # Training graphs (forward and backward) under reduce-overhead / max-autotune on the GPU: recorded as CUDA
    # graphs like inference graphs ([Note: training graphs], frontend/training.py); off: they run as in default mode.
    # On since session 42 (H100, bf16 autocast, step ms default -> reduce-overhead: GPT 7.16 -> 5.92, ResNet-18
    # 8.14 -> 5.21, MLP 2.63 -> 2.26, BERT 19.71 -> 17.23; each graph recorded once; peak memory Inductor-ro's).
    training_cuda_graphs: bool = True
    # reduce-overhead's graph on copies of an *inference* graph reads inputs that keep their address in place
    # instead of copying them ([Note: a graph on copies reads settled inputs in place], runtime/triton_module.py).
    # Training graphs always do (their parameters and saved activations: [Note: a training step replays one
    # recording per graph]); for inference graphs it is off until measured on the zoo and the decoding loops.
    cuda_graph_inputs_in_place: bool = False
    # Tests and diagnosis without a GPU: reduce-overhead's replay logic (recordings keyed by input addresses,
    # graphs on copies, held outputs moved before a replay) over CPU modules too, each "recording" an emulated
    # CUDA graph that reruns the module on the recorded input buffers and writes the recorded output buffers
    # ([Note: CUDA graphs emulated on the CPU], runtime/triton_module.py).  Slower than plain calls: never for speed.
    emulate_cuda_graphs: bool = False
    # Training: saved activations that are short elementwise chains over values the backward holds anyway are
    # recomputed there instead of saved ([Note: recompute what the backward can rebuild], frontend/partition.py).
    training_recompute: bool = True
    # Training: the share of the saved activations' bytes (after the step above) the forward may keep for the
    # backward, in (0, 1].  Below 1, kiln recomputes more - matrix products and convolutions included, the cheapest
    # per byte first by its cost model - until the rest fits ([Note: a memory budget], frontend/partition.py).
    training_memory_budget: float = 1.0
    # GPU, dynamic shapes, a static module per size: build a size's module at the n-th call at that size; the calls
    # before run eagerly.  A build compiles that size's kernels (~1 s), so a decoding loop - a new length every step,
    # each seen once - runs eagerly instead of compiling at every token; sizes that come back are compiled.
    gpu_dynamic_build_after: int = 2
    # Run convolutions and the kernels between them channels-last (NHWC) inside a graph.  Off by default:
    # measured on ResNet-18 (1 thread) it cost 9%, on the seed model it gained under 3% (see schedule/layout.py).
    layout_optimization: bool = False
    # For graphs with convolutions, build both layouts and keep the one that measures faster (the decision is
    # cached on disk beside the modules).
    layout_autotune: bool = True
    # On a GPU in reduce-overhead and max-autotune, hold re-laid-out (NHWC) and BatchNorm-folded copies of
    # weights: faster convolutions (H200, bf16, reduce-overhead: ResNet-18 batch 16 0.46-0.49 ms with copies,
    # 0.56-0.64 ms without), but the copies sit beside the model's own weights (ResNet-18: 22 MiB in bf16).
    # Default mode never holds copies (its memory stays at eager's): BatchNorm runs in the convolution's epilogue
    # kernel and a copy kernel of kiln's converts the weight's layout before each convolution into a transient
    # buffer (schedule/layout.relayout_copies).  False: no copies in any mode.
    gpu_weight_copies: bool = True
    # In reduce-overhead and max-autotune, let cuDNN measure its algorithms for the graph's convolutions
    # (cudnn.benchmark, only while kiln's graph runs; the choice is cached per shape by PyTorch, so only the
    # first call pays).  Default mode keeps cuDNN's heuristic choice, as eager does: a measured algorithm may
    # use workspace (peak memory above eager's) and was not faster on the suite's shapes
    # (``benchmarks/conv_layouts.py``).
    cudnn_benchmark: bool = True
    # GPU matmuls (mm/addmm) may run as kiln's Triton template with the consumer fused in: chosen by measurement
    # in max-autotune (kept in the tuning database, which default mode then also follows).
    matmul_templates: bool = True
    # GPU: every matmul with an epilogue (and every other one) runs as the Triton template in this tile
    # configuration, "block_m,block_n,block_k,group_m,num_warps,num_stages"; nothing is measured or recorded.
    # For tests and experiments: under TRITON_INTERPRET=1 it is how CI runs the template on CPU tensors.
    matmul_template_config: str = ""
    # GPU: persistent reductions run with this "xblock,num_warps" instead of the rule's (experiments:
    # benchmarks/gpu_sched_sweep.py); "" keeps the rule.
    triton_persistent_schedule: str = ""
    # GPU: 2-D tiled pointwise kernels (a transposing read) run with this "tile_x,tile_y,num_warps" (tile_x along
    # the stores' unit-stride axis) instead of the rule's (experiments: benchmarks/gpu_sched_sweep.py --tiles).
    triton_tile_schedule: str = ""
    # GPU max-autotune: how many of the matmul template's best-ranked tile configurations are compiled and timed
    # per problem (benchmarks/matmul_cost_model.py times them all to check the ranking).
    matmul_measured_configs: int = 2
    # GPU: calls run the generated straight-line Python wrapper of the plan (codegen/gpu_call.py, [Note: generated
    # wrapper]); False: the interpreted plan, step by step (what benchmarks/call_latency.py compares it with and
    # benchmarks/memory_steps.py measures step by step).
    gpu_call_wrapper: bool = True
    # A kernel computing an input's new value stores it into the input, where the graph only copied it back
    # (schedule/write_back.py, [Note: write-backs in place]: an optimizer step's parameters and moments).  False:
    # the copy stays a library call (the A/B, and a way out).
    write_backs_in_place: bool = True
    # An elementwise node whose chain the previous kernel cannot take joins an earlier kernel over its iteration
    # space where nothing between stops it (schedule/fuse.py, [Note: horizontal fusion]).  False: the last kernel
    # only (the A/B).
    horizontal_fusion: bool = True
    # A value two kernels read is recomputed in each while its inlined cost (schedule/fuse.py: 1 per op, 8 per
    # transcendental) is at most this, else stored once and loaded ([Note: recomputing on a GPU]).  The CPU's 8:
    # one transcendental is about the store and load of an fp32 element there.
    recompute_limit: int = 8
    # The same on the GPU (the plans of ``schedule/plan.triton_graph`` and ``gpu_symbolic``), where a store and a
    # load cost far more arithmetic than on the CPU.  8: the CPU's rule (the A/B).
    gpu_recompute_limit: int = 24
    # GPU: a long reduction into few rows (a BatchNorm's channel statistics over N*H*W) runs as two reductions
    # (passes/split_reductions.py, [Note: reductions split for the GPU]).  False: one kernel (the A/B).
    gpu_split_reductions: bool = True
    # GPU: a long reduction over leading axes into many columns (a bias or LayerNorm-weight gradient) runs as partial
    # sums over chunks of rows, then their sum ([Note: column reductions split for the GPU]).  False: the A/B.
    gpu_split_column_reductions: bool = True
    # GPU reductions over columns (bias and LayerNorm-weight gradients) with several columns a program, their loads
    # contiguous ([Note: column reductions on the GPU], codegen/triton.py).  H100 (session 43, keeping 128 programs):
    # GPT training step 6.92 -> 6.56 ms, BERT 19.34 -> 18.71.  False: one column a program (the A/B).
    gpu_column_reductions: bool = True
    # GPU training: a forward's saved values laid out as kiln's layout pass chooses (convolution inputs
    # channels-last), the backward compiled for them, ``convolution_backward`` run channels-last ([Note: saved
    # activations channels-last], frontend/training.py).  Off: measured on the H100 (ResNet-18's reduce-overhead
    # step, sessions 44/45: 5.31 -> 5.73 and 5.66 -> 5.60 ms): cuDNN's NCHW<->NHWC conversions (0.67 ms) go, but
    # 68 ATen elementwise copies (0.48 ms) and a BatchNorm backward reduction over channels-last data (0.35 ms)
    # come.
    training_channels_last: bool = False
    # GPU: ATen's cuDNN attention backward's gradients kept in the layouts ATen gives them (q's, k's, v's), and a
    # training forward's attention output handed to its backward in its own ([Note: attention results in ATen's
    # layout], library/attention/__init__.py).  H100 (session 45, one process, BERT-base bf16 step, gradients the
    # same): default mode 23.32 -> 21.21 ms, reduce-overhead 11.39 -> 11.16 (GPU kernels 9.78 -> 9.48).  On.
    attention_result_layouts: bool = True
    # Launch the Triton kernels compiled ahead with kiln's launcher (runtime/gpu_launch.py: one C call into the
    # driver, the grid and launch parameters recorded at build time) instead of Triton's Python launcher (11 us
    # of host time per launch on the H200 machine).  False: Triton's launcher (a kernel the record cannot
    # describe always uses it).
    gpu_static_launch: bool = True
    # GPU: how a generated call reaches ATen's attention where kiln's graph holds
    # ``aten.scaled_dot_product_attention`` (the attention fusion's call; ir/extern.py [Note: attention's entry]):
    # "auto" - the memory-efficient backend's op through its C binding (14 us of host time per call on the H100
    # machine against 24-41 us for the composite op, which picks a backend at every call) for problems small enough
    # that its kernel's time does not undo that (a bound per mode), else the composite; "efficient" - that op at
    # every size; "composite" - the composite op always (ATen's choice of backend: cuDNN on Hopper).
    gpu_attention_entry: str = "auto"
    # Processes that compile Triton kernels in parallel (0: compile in this process, with threads).  Off by
    # default: on the H200 machine a cold process compiled slower with 8 workers (MLP 9.4 s vs 6.5 s first
    # call; GPT 11.9 vs 10.6) - the parent then waited for their start-up (each imports torch).  Since session
    # 27 nothing waits for a worker (compile_pool.serve); measured in session 35 (H100, warm workers): first calls
    # still slower with 8 (decoder_fast 0.57 -> 1.15 s, GPT-2 2.76 -> 3.31 s), so off by default.
    compile_workers: int = 0
    # CPU 3x3 stride-1 convolutions may run as kiln's Winograd F(m x m, 3 x 3) for these output tile sizes m,
    # when measured faster than oneDNN (comma-separated; "" turns it off).  F(2x2) errs like direct
    # convolution (within ~1.5x); F(4x4) is faster still but ~10x less accurate in fp32, so it is opt-in ("2,4").
    winograd_tiles: str = "2"
    # Fall back to eager (with a warning) when code generation or compilation fails, instead of raising.
    fallback: bool = True
    # Code generator: "auto" (C++ for CPU tensors, Triton for CUDA tensors), "cpu" (C++), "cuda" (Triton, CUDA
    # tensors only) or "triton" (also on CPU tensors when TRITON_INTERPRET=1: how the GPU generator is tested
    # without a GPU).
    target: str = "auto"
    # max-autotune: seconds of measurement per compiled graph (schedules found are kept in the tuning database)
    tune_budget_s: float = 300.0
    # Default and reduce-overhead modes: seconds per compiled graph that choosing implementations (GEMM library,
    # convolution algorithm, attention kernel, layout) may spend measuring; past it each choice is predicted by its
    # pass's rule and measured by a later compile (what is measured is kept in the tuning database, so warm
    # compiles measure nothing).  max-autotune measures every choice.
    choice_budget_s: float = 3.0
    # Fix choices instead of measuring them: comma-separated kind=answer, e.g. "gemm=kiln,conv=winograd2" (kinds:
    # gemm kiln|onednn|aten, conv onednn|gemm|direct|dw|winograd<m>, attention kiln|aten, half_in_fp32 half|fp32,
    # layout contiguous|channels-last, bmm_layout as-given|a-column-major).  A forced kind applies wherever the machine and problem allow, also to
    # problems too small to measure.  For experiments, bug hunts and tests.
    choices: str = ""
    # max-autotune: a progress line on stderr from the start of each graph's compile (tune/progress.py)
    tune_progress: bool = True
    # Passes of passes/pipeline.py to skip, comma-separated names ("select_gemm,winograd"): how ``kiln bisect``
    # finds a guilty pass.  Every pass may be skipped (each keeps the graph's meaning; later ones cope).
    disabled_passes: str = ""

    _ENV = {
        "check": ("KILN_CHECK", bool),
        "cache_dir": ("KILN_CACHE_DIR", str),
        "cxx": ("KILN_CXX", str),
        "verbose": ("KILN_VERBOSE", bool),
        "fusion": ("KILN_FUSION", bool),
        "constant_folding": ("KILN_CONSTANT_FOLDING", bool),
        "fallback": ("KILN_FALLBACK", bool),
        "library_selection": ("KILN_LIBRARY_SELECTION", bool),
        "native_calls": ("KILN_NATIVE_CALLS", bool),
        "dynamic_shapes": ("KILN_DYNAMIC_SHAPES", bool),
        "gpu_symbolic_kernels": ("KILN_GPU_SYMBOLIC_KERNELS", bool),
        "cuda_graph_shared_pool": ("KILN_CUDA_GRAPH_SHARED_POOL", bool),
        "training_cuda_graphs": ("KILN_TRAINING_CUDA_GRAPHS", bool),
        "cuda_graph_inputs_in_place": ("KILN_CUDA_GRAPH_INPUTS_IN_PLACE", bool),
        "emulate_cuda_graphs": ("KILN_EMULATE_CUDA_GRAPHS", bool),
        "training_recompute": ("KILN_TRAINING_RECOMPUTE", bool),
        "training_memory_budget": ("KILN_TRAINING_MEMORY_BUDGET", float),
        "gpu_dynamic_build_after": ("KILN_GPU_DYNAMIC_BUILD_AFTER", int),
        "layout_optimization": ("KILN_LAYOUT_OPTIMIZATION", bool),
        "layout_autotune": ("KILN_LAYOUT_AUTOTUNE", bool),
        "target": ("KILN_TARGET", str),
        "gpu_weight_copies": ("KILN_GPU_WEIGHT_COPIES", bool),
        "cudnn_benchmark": ("KILN_CUDNN_BENCHMARK", bool),
        "matmul_templates": ("KILN_MATMUL_TEMPLATES", bool),
        "matmul_template_config": ("KILN_MATMUL_TEMPLATE_CONFIG", str),
        "compile_workers": ("KILN_COMPILE_WORKERS", int),
        "triton_persistent_schedule": ("KILN_TRITON_PERSISTENT_SCHEDULE", str),
        "triton_tile_schedule": ("KILN_TRITON_TILE_SCHEDULE", str),
        "matmul_measured_configs": ("KILN_MATMUL_MEASURED_CONFIGS", int),
        "gpu_call_wrapper": ("KILN_GPU_CALL_WRAPPER", bool),
        "write_backs_in_place": ("KILN_WRITE_BACKS_IN_PLACE", bool),
        "horizontal_fusion": ("KILN_HORIZONTAL_FUSION", bool),
        "recompute_limit": ("KILN_RECOMPUTE_LIMIT", int),
        "gpu_recompute_limit": ("KILN_GPU_RECOMPUTE_LIMIT", int),
        "gpu_split_reductions": ("KILN_GPU_SPLIT_REDUCTIONS", bool),
        "gpu_split_column_reductions": ("KILN_GPU_SPLIT_COLUMN_REDUCTIONS", bool),
        "gpu_column_reductions": ("KILN_GPU_COLUMN_REDUCTIONS", bool),
        "training_channels_last": ("KILN_TRAINING_CHANNELS_LAST", bool),
        "attention_result_layouts": ("KILN_ATTENTION_RESULT_LAYOUTS", bool),
        "gpu_static_launch": ("KILN_GPU_STATIC_LAUNCH", bool),
        "gpu_attention_entry": ("KILN_GPU_ATTENTION_ENTRY", str),
        "winograd_tiles": ("KILN_WINOGRAD_TILES", str),
        "tune_budget_s": ("KILN_TUNE_BUDGET_S", float),
        "choice_budget_s": ("KILN_CHOICE_BUDGET_S", float),
        "choices": ("KILN_CHOICES", str),
        "tune_progress": ("KILN_TUNE_PROGRESS", bool),
        "disabled_passes": ("KILN_DISABLED_PASSES", str),
    }

    def holds_weight_copies(self, mode: str) -> bool:
        """Does a GPU compile in ``mode`` hold modified copies of the model's weights beside them (channels-last
        ones for cuDNN, BatchNorm-folded ones)?  Outside default mode, when ``gpu_weight_copies`` allows it."""
        return self.gpu_weight_copies and mode != "default"

    @classmethod
    def from_env(cls) -> "Config":
        values: dict[str, Any] = {}
        for field, (env, typ) in cls._ENV.items():
            if env in os.environ:
                values[field] = _checked(field, _parse_env(env, typ, os.environ[env]), f"environment variable {env}")
        return cls(**values)

    @classmethod
    def option_names(cls) -> list[str]:
        return sorted(f.name for f in dataclasses.fields(cls))

    def with_options(self, **options: Any) -> "Config":
        unknown = sorted(set(options) - set(self.option_names()))
        if unknown:
            raise ValueError(f"kiln: unknown option(s) {unknown}; accepted options are {self.option_names()}")
        return dataclasses.replace(self, **{k: _checked(k, v, f"option {k!r}") for k, v in options.items()})


_current: Config | None = None


def get() -> Config:
    """The configuration in force (environment, then any active ``scope``)."""
    global _current
    if _current is None:
        _current = Config.from_env()
    return _current


@contextlib.contextmanager
def scope(**overrides: Any) -> Iterator[Config]:
    """Temporarily override knobs: ``with config.scope(check=True): ...``."""
    global _current
    previous = get()
    _current = previous.with_options(**overrides)
    try:
        yield _current
    finally:
        _current = previous
