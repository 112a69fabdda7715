"""Benchmark eager PyTorch, Inductor and kiln on the suite's models, in one process, on the same inputs.

    python -m benchmarks.runner                                  # the whole suite, 1 thread
    python -m benchmarks.runner --models gpt,chain --threads 2 --json out.json
    python -m benchmarks.runner --backends eager,inductor --small --repeats 2   # quick smoke run
    python -m benchmarks.runner --fresh-caches                   # cold compile times

Method, per model: build the model and its inputs once; for each backend, compile it and time the first call
(cold compile time, wall clock, Dynamo tracing included); compare its output with eager's; warm up; then run
``--repeats`` interleaved rounds in which every backend (in a rotating order) is timed for ``--calls`` calls.
Each round yields a median per backend; the reported time is the median of the round medians and the
speedup is eager's round median over the backend's, per round, then the median of those ratios (ratios
taken within a round are robust to a noisy machine).  Everything runs under ``torch.inference_mode()``.

Environment (thread counts, cache directories) is set before torch is imported, so this module imports
torch lazily.  A backend that fails on a model is recorded (with its traceback in the JSON) and skipped.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from torch import Tensor, nn

REPO = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as ``python benchmarks/runner.py``
    sys.path.insert(0, str(REPO))

BACKENDS = ("eager", "inductor", "kiln", "ort")  # ort: ONNX Runtime (CPU; needs onnxruntime and onnx)
MODES = {"default": "", "reduce-overhead": "-ro", "max-autotune": "-ma"}  # mode -> backend label suffix
DTYPES = ("fp32", "bf16", "fp16")
# Warnings not worth recording (torch's own deprecation notices while tracing).
_NOISE_WARNINGS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)
DEFAULT_SUITE = ("seed", "mlp", "resnet18", "gpt", "chain")  # mirrors benchmarks.models.SUITE (no torch import)
GPU_SUITE = ("seed", "seed_b16", "mlp", "resnet18", "resnet18_b16", "gpt", "gpt_b8x512", "chain")  # models.GPU_SUITE


# ------------------------------------------------------------------------------------------ command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The runner's command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.runner", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None, help="comma-separated models (default: the suite; on cuda the GPU suite)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="where models run (default cpu)")
    p.add_argument("--dtype", default="fp32", choices=DTYPES, help="model dtype (default fp32); bf16/fp16 "
                   "results are compared with an fp32 reference")
    p.add_argument("--modes", default="default", help="comma-separated torch.compile modes run for Inductor "
                   "and kiln: default,reduce-overhead,max-autotune (labels: inductor, inductor-ro, inductor-ma)")
    p.add_argument("--backends", default=None, help="comma-separated subset of eager,inductor,kiln,ort "
                   "(default: all; on cuda all but ort, which runs on the CPU only)")
    p.add_argument("--skip", default="", help="comma-separated backend labels to leave out (e.g. inductor-ma: "
                   "Inductor's max-autotune compiles for minutes per model)")
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (torch and OpenMP); default 1")
    p.add_argument("--repeats", type=int, default=10, help="interleaved timing rounds (default 10)")
    p.add_argument("--calls", type=int, default=5, help="timed calls per backend per round (default 5)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls per backend after the first (default 3)")
    p.add_argument("--kiln-mode", default="default", help="mode passed to kiln.compile (default 'default')")
    p.add_argument("--small", action="store_true", help="small shapes, for a quick smoke run")
    p.add_argument("--tol", type=float, default=None,
                   help="max relative error before a result is a MISMATCH (default 1e-3 fp32, 2e-2 bf16/fp16)")
    p.add_argument("--tf32", action="store_true",
                   help="fp32 on CUDA: let matmuls and cuDNN use TF32 (default: off - fp32 means fp32)")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="write all raw numbers here")
    p.add_argument("--fresh-caches", action="store_true",
                   help="use new, empty Inductor and kiln cache directories (cold compile times); deleted at exit")
    p.add_argument("--cache-dir-inductor", type=Path, default=None, metavar="DIR",
                   help="TORCHINDUCTOR_CACHE_DIR to use (e.g. reuse one for warm-cache measurements)")
    p.add_argument("--cache-dir-kiln", type=Path, default=None, metavar="DIR", help="KILN_CACHE_DIR to use")
    args = p.parse_args(argv)
    args.models = _split(args.models or ",".join(GPU_SUITE if args.device == "cuda" else DEFAULT_SUITE))
    backends = _split(args.backends or ",".join(b for b in BACKENDS if args.device == "cpu" or b != "ort"))
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        p.error(f"unknown backend(s) {unknown}; choose from {list(BACKENDS)}")
    modes = _split(args.modes)
    bad_modes = sorted(set(modes) - set(MODES))
    if bad_modes:
        p.error(f"unknown mode(s) {bad_modes}; choose from {list(MODES)}")
    moded = ("inductor", "kiln")  # backends that take torch.compile modes
    args.backends = [b + (MODES[m] if b in moded else "") for b in backends for m in (modes if b in moded
                                                                                      else ["default"])]
    args.backends = [b for b in args.backends if b not in _split(args.skip)]
    if "ort" in backends and args.device != "cpu":
        p.error("the ort backend (ONNX Runtime) runs on the CPU only")
    if args.tol is None:
        args.tol = 1e-3 if args.dtype == "fp32" else 2e-2
    for name in ("threads", "repeats", "calls"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        p.error("--warmup must be non-negative")
    return args


def _split(csv: str) -> list[str]:
    return [item.strip() for item in csv.split(",") if item.strip()]


# ----------------------------------------------------------------------------------------- environment


def set_tf32(device: str, dtype: str, tf32: bool) -> None:
    """fp32 on CUDA means fp32 unless ``tf32``: matmuls *and* cuDNN (whose default is TF32 on), every backend
    alike - kiln and Inductor read these flags when they compile."""
    import torch
    if device == "cuda" and dtype == "fp32":
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32


def setup_environment(args: argparse.Namespace) -> list[Path]:
    """Set thread counts and cache directories in ``os.environ``; returns the temporary dirs to delete at exit.

    Must run before torch (and torch._inductor, kiln) is imported.
    """
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    temporary: list[Path] = []
    for flag, env in ((args.cache_dir_inductor, "TORCHINDUCTOR_CACHE_DIR"), (args.cache_dir_kiln, "KILN_CACHE_DIR")):
        if flag is not None:
            flag.mkdir(parents=True, exist_ok=True)
            os.environ[env] = str(flag.resolve())
        elif args.fresh_caches:
            fresh = Path(tempfile.mkdtemp(prefix=f"bench-{env.lower()}-"))
            temporary.append(fresh)
            os.environ[env] = str(fresh)
    if args.fresh_caches and "TRITON_CACHE_DIR" not in os.environ:  # compiled Triton kernels: cold for both
        fresh = Path(tempfile.mkdtemp(prefix="bench-triton-"))
        temporary.append(fresh)
        os.environ["TRITON_CACHE_DIR"] = str(fresh)
    return temporary


def machine_info(args: argparse.Namespace) -> dict[str, Any]:
    """CPU, software versions, threads, date and command line, for the JSON record."""
    import torch
    return {
        "cpu": _cpu_model(),
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" and torch.cuda.is_available() else None,
        "device": args.device,
        "dtype": args.dtype,
        "tf32": bool(args.device == "cuda" and args.dtype == "fp32" and args.tf32),
        "triton": _triton_version(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "kiln": _kiln_version(),
        "git_commit": _git_commit(),
        "threads": torch.get_num_threads(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "caches": {env: os.environ.get(env) for env in ("TORCHINDUCTOR_CACHE_DIR", "KILN_CACHE_DIR")},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _triton_version() -> str | None:
    try:
        import triton
        return triton.__version__
    except Exception:  # noqa: BLE001
        return None


def _kiln_version() -> str | None:
    try:
        import kiln
        return kiln.__version__
    except Exception:  # noqa: BLE001 - any import failure just means "no kiln"
        return None


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=10, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# -------------------------------------------------------------------------------------------- backends


def ort_backend(model: nn.Module, inputs: tuple[Tensor, ...], threads: int) -> Callable[..., Any]:
    """ONNX Runtime on the CPU: the model exported with torch.onnx (TorchScript exporter, opset 17), every
    graph optimisation on, the runner's thread count; returns torch tensors like the model."""
    import io

    import onnxruntime
    import torch
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, inputs, buffer, dynamo=False, opset_version=17)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = onnxruntime.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def run(*xs: Tensor) -> Any:
        outs = session.run(None, {n: x.detach().numpy() for n, x in zip(names, xs)})
        outs = [torch.from_numpy(o) for o in outs]
        return outs[0] if len(outs) == 1 else outs
    return run


def make_backend(name: str, model: nn.Module, kiln_mode: str, inputs: tuple[Tensor, ...] = (),
                 threads: int = 1) -> Callable[..., Any]:
    """Return the callable that runs ``model`` on backend label ``name`` (``inductor-ro``: Inductor in mode
    reduce-overhead, ...); compilation happens at the first call."""
    import torch
    base, _, suffix = name.partition("-")
    mode = next((m for m, s in MODES.items() if s == ("-" + suffix if suffix else "")), None)
    if base == "eager":
        return model
    if base == "ort":
        return ort_backend(model, inputs, threads)
    if base == "inductor" and mode is not None:
        return torch.compile(model, mode=mode)
    if base == "kiln" and mode is not None:
        import kiln
        return kiln.compile(model, mode=mode if suffix else kiln_mode)
    raise ValueError(f"unknown backend {name!r}")


@dataclasses.dataclass
class BackendResult:
    """Everything measured for one (model, backend) pair; times in milliseconds unless named ``_s``."""

    backend: str
    first_call_s: float | None = None
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    status: str = "ok"  # ok | MISMATCH | ERROR
    error: str | None = None
    traceback: str | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)  # raised while compiling (e.g. fallbacks)
    calls_ms: list[list[float]] = dataclasses.field(default_factory=list)  # per round, per call
    round_median_ms: list[float] = dataclasses.field(default_factory=list)
    speedup_rounds: list[float] = dataclasses.field(default_factory=list)
    median_ms: float | None = None
    speedup: float | None = None
    # GPU memory (MiB): held after compiling and the first call (weights copies, arenas, caches), and the
    # peak a steady-state call adds on top of what was allocated before it (torch.cuda.max_memory_allocated)
    mem_held_mib: float | None = None
    mem_call_mib: float | None = None
    fn: Callable[..., Any] | None = dataclasses.field(default=None, repr=False)

    def fail(self, stage: str, exc: BaseException) -> None:
        """Record ``exc`` (raised while ``stage``) and take this backend out of the run."""
        self.status = "ERROR"
        self.error = f"{stage}: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        self.traceback = traceback.format_exc()
        self.fn = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "fn"}


# ----------------------------------------------------------------------------------------- measurement


def compare(out: Any, ref: Any) -> tuple[float, float]:
    """Max absolute error and max relative error of ``out`` against ``ref`` (any pytree of tensors).

    The relative error is ``max|out - ref| / max|ref|`` per tensor (then the max over tensors): it is not
    inflated by reference values near zero.  Non-finite differences give ``nan``; shape mismatches raise.
    """
    import torch
    from torch.utils._pytree import tree_leaves
    outs, refs = tree_leaves(out), tree_leaves(ref)
    if len(outs) != len(refs):
        raise ValueError(f"output has {len(outs)} tensors, eager's has {len(refs)}")
    max_abs = max_rel = 0.0
    for o, r in zip(outs, refs):
        if not isinstance(r, torch.Tensor):
            continue
        if tuple(o.shape) != tuple(r.shape):
            raise ValueError(f"output shape {tuple(o.shape)} differs from eager's {tuple(r.shape)}")
        if r.numel() == 0:
            continue
        o64, r64 = o.detach().to(torch.float64), r.detach().to(torch.float64)
        diff = (o64 - r64).abs().max().item() if not torch.equal(o64, r64) else 0.0  # equal() handles inf == inf
        scale = r64.abs().max().item()
        max_abs = max(max_abs, diff) if not math.isnan(diff) else math.nan
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        max_rel = max(max_rel, rel) if not math.isnan(rel) else math.nan
    return max_abs, max_rel


def time_calls(fn: Callable[..., Any], inputs: tuple[Tensor, ...], calls: int) -> list[float]:
    """Wall-clock milliseconds of each of ``calls`` calls of ``fn(*inputs)``; on a GPU the device is
    synchronized before and after each call, so the time includes launch overhead and all device work."""
    import torch
    cuda = any(x.is_cuda for x in inputs)
    times = []
    for _ in range(calls):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn(*inputs)
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return times


def first_call(result: BackendResult, model: nn.Module, inputs: tuple[Tensor, ...], ref: Any,
               args: argparse.Namespace, check: Callable[[Any, Any], tuple[float, float]] = compare) -> None:
    """Compile ``result.backend``, time its first call, check it against ``ref`` (``check`` gives max absolute
    and relative errors) and warm it up."""
    import torch
    cuda = any(x.is_cuda for x in inputs)
    held_before = torch.cuda.memory_allocated() if cuda else 0
    # Each backend's first call starts from a collected heap: CPython's full (generation-2) collection fires once
    # enough objects have outlived younger collections since the last one, so without this the backend timed
    # second pays - inside its first call - for the objects the backend before it left (a 0.2-s pause on a
    # process holding torch, transformers and Triton).  Its own compile's allocations still count against it.
    gc.collect()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.perf_counter()  # ort builds its session here; the others compile at the first call
            fn = make_backend(result.backend, model, args.kiln_mode, inputs, args.threads)
            out = fn(*inputs)
            if cuda:
                torch.cuda.synchronize()
            result.first_call_s = time.perf_counter() - start
    except Exception as exc:  # noqa: BLE001 - a failing backend is a result, not a crash
        result.fail("compile", exc)
        return
    finally:
        result.warnings = list(dict.fromkeys(f"{w.category.__name__}: {w.message}" for w in caught
                                             if not issubclass(w.category, _NOISE_WARNINGS)))
    try:
        result.max_abs_err, result.max_rel_err = check(out, ref)
        if not result.max_rel_err <= args.tol:  # also catches nan
            result.status = "MISMATCH"
        del out
        time_calls(fn, inputs, args.warmup)
        if cuda:
            result.mem_held_mib = (torch.cuda.memory_allocated() - held_before) / 2**20
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            out = fn(*inputs)
            torch.cuda.synchronize()
            result.mem_call_mib = (torch.cuda.max_memory_allocated() - before) / 2**20
            del out
        result.fn = fn
    except Exception as exc:  # noqa: BLE001
        result.fail("check" if result.max_abs_err is None else "warmup", exc)


def timing_rounds(results: list[BackendResult], inputs: tuple[Tensor, ...], args: argparse.Namespace) -> None:
    """Interleaved rounds: every live backend runs ``args.calls`` timed calls per round, in rotating order."""
    gc.collect()
    gc.disable()
    try:
        for round_index in range(args.repeats):
            live = [r for r in results if r.fn is not None]
            if not live:
                return
            shift = round_index % len(live)
            for result in live[shift:] + live[:shift]:
                try:
                    times = time_calls(result.fn, inputs, args.calls)
                except Exception as exc:  # noqa: BLE001
                    result.fail(f"timing round {round_index}", exc)
                    continue
                result.calls_ms.append(times)
                result.round_median_ms.append(statistics.median(times))
    finally:
        gc.enable()


def summarize(results: list[BackendResult]) -> None:
    """Median time over rounds, and per-round speedups over eager (then their median)."""
    eager = next((r for r in results if r.backend == "eager" and r.round_median_ms), None)
    for result in results:
        if result.round_median_ms:
            result.median_ms = statistics.median(result.round_median_ms)
        if eager is None or not result.round_median_ms or result.status == "ERROR":
            continue
        rounds = min(len(eager.round_median_ms), len(result.round_median_ms))
        result.speedup_rounds = [eager.round_median_ms[i] / result.round_median_ms[i] for i in range(rounds)]
        result.speedup = statistics.median(result.speedup_rounds)


def bench_model(name: str, args: argparse.Namespace, build: Callable[..., Any] | None = None,
                check: Callable[[Any, Any], tuple[float, float]] = compare) -> dict[str, Any]:
    """Build, compile, check and time model ``name`` on every requested backend; ``build`` (default
    ``benchmarks.models.build``) is called as ``build(name, small=, device=[, dtype=])`` -> (model, inputs),
    ``check(output, reference)`` gives the max absolute and relative errors (default :func:`compare`)."""
    import torch
    from benchmarks import models
    build = build or models.build

    record: dict[str, Any] = {"model": name, "error": None, "backends": {}}
    torch._dynamo.reset()
    try:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
        model, inputs = build(name, small=args.small, device=args.device, dtype=dtype)
        record["inputs"] = [{"shape": list(x.shape), "dtype": str(x.dtype)} for x in inputs]
        with torch.inference_mode():
            if dtype == torch.float32:
                ref = model(*inputs)
            else:  # half-precision results are judged against the same model in fp32
                ref_model, ref_inputs = build(name, small=args.small, device=args.device)
                ref = ref_model(*ref_inputs)
                del ref_model, ref_inputs
    except Exception as exc:  # noqa: BLE001
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc()
        return record
    results = [BackendResult(backend) for backend in args.backends]
    with torch.inference_mode():
        for result in results:
            _progress(f"  {name}: {result.backend} first call ...")
            first_call(result, model, inputs, ref, args, check)
            _progress(f"  {name}: {result.backend} {result.status}"
                      + (f" ({result.first_call_s:.2f} s)" if result.first_call_s is not None else "")
                      + (f" {result.error}" if result.error else ""))
        timing_rounds(results, inputs, args)
    summarize(results)
    record["backends"] = {r.backend: r.to_json() for r in results}
    del model, inputs, ref, results
    torch._dynamo.reset()
    gc.collect()
    return record


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- report


def geomean(values: Sequence[float]) -> float | None:
    """Geometric mean of positive values (``None`` when there are none)."""
    values = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def geomeans(records: list[dict[str, Any]], backends: Sequence[str]) -> dict[str, float | None]:
    """Per backend, the geomean of its speedups over the models where it ran correctly (status ``ok``)."""
    return {b: geomean([rec["backends"][b]["speedup"] for rec in records
                        if b in rec["backends"] and rec["backends"][b]["status"] == "ok"]) for b in backends}


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def _clip(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def format_table(records: list[dict[str, Any]], backends: Sequence[str]) -> str:
    """A Markdown table (readable as plain text) of every result, then the geomean speedups."""
    header = ["model", "backend", "median ms", "speedup", "compile s", "max abs err", "max rel err", "status"]
    rows = []
    for rec in records:
        if rec["error"]:
            rows.append([rec["model"], "-", "-", "-", "-", "-", "-", _clip(f"ERROR ({rec['error']})")])
            continue
        for backend, r in rec["backends"].items():
            status = r["status"] + (f" [{len(r['warnings'])} warning(s)]" if r["warnings"] else "")
            status = _clip(status + (f" ({r['error']})" if r["error"] else ""))
            compile_s = None if backend == "eager" else r["first_call_s"]
            rows.append([rec["model"], backend, _fmt(r["median_ms"], ".3f"), _fmt(r["speedup"], ".2f", "x"),
                         _fmt(compile_s, ".2f"), _fmt(r["max_abs_err"], ".2e"), _fmt(r["max_rel_err"], ".2e"),
                         status])
    for backend, value in geomeans(records, backends).items():
        rows.append(["geomean", backend, "", _fmt(value, ".2f", "x"), "", "", "", ""])
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = ["| " + " | ".join(cell.ljust(w) for cell, w in zip(row, widths)) + " |" for row in [header, *rows]]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns the process exit status (0 unless nothing could be measured)."""
    args = parse_args(argv)
    temporary = setup_environment(args)
    try:
        import torch
        torch.set_num_threads(args.threads)
        set_tf32(args.device, args.dtype, args.tf32)
        info = machine_info(args)
        _progress(f"benchmarks: {info['cpu']}, torch {info['torch']}, kiln {info['kiln']}, "
                  f"{info['threads']} thread(s), backends {args.backends}")
        records = []
        for name in args.models:
            _progress(f"{name}:")
            records.append(bench_model(name, args))
        table = format_table(records, args.backends)
        where = (f"{info['gpu']}  triton {info['triton']}" if info["gpu"]
                 else f"{info['cpu']}  threads {info['threads']}")
        print(f"\n{info['date']}  {where}  torch {info['torch']}  {info['dtype']}\n")
        print(table)
        if args.json is not None:
            payload = {"machine": info, "results": records, "geomean_speedup": geomeans(records, args.backends),
                       "table": table}
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")
            _progress(f"wrote {args.json}")
        return 0 if any(rec["backends"] for rec in records) else 1
    finally:
        for path in temporary:
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
