"""OpInfo sweep: every float32 CPU sample of PyTorch's ``op_db`` through ``torch.compile(backend="kiln")``.

Each sample's tensors become the compiled function's arguments (everything else - dims, scalars, flags - is
baked in as a constant), the result is compared with eager at rtol=1.3e-5, atol=1.5e-5 (equal_nan; dtype and
shape must match too; ops in ``REDUCTION_OPS`` get 1e-4), and so are the input tensors after the call (ops
such as training-mode batch_norm update an input in place).  Only samples that run in eager count.  Compile
errors raise (``fallback=False``), so a graph kiln cannot compile is a failure, not a silent eager run.
Every sample starts from ``torch._dynamo.reset()``, with recompile limits raised and automatic dynamic shapes
off (kiln compiles static shapes).

Skipped: ops without float32 CPU support, in-place/out variants, random or otherwise nondeterministic ops,
ops that need autograd, samples whose input or output is not a tensor or a tuple/list of tensors.

    python tests/opinfo_sweep.py                                   # everything, 3 samples per op
    python tests/opinfo_sweep.py --ops sin,nn.functional.gelu --max-samples-per-op 0   # 0: all samples
    python tests/opinfo_sweep.py --jobs 2 --json out.json
    python tests/opinfo_sweep.py --dtype int64                     # explore another sample dtype
    python tests/opinfo_sweep.py --dtype bfloat16 --jobs 2         # half precision (HALF_TOLERANCES)

Every op runs in a worker process (``--jobs`` of them), so a crash in generated code costs one op (reported
as ``crash``), not the sweep.  ``run_isolated`` is the API the pytest uses.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Iterable, Iterator, Sequence

RTOL, ATOL = 1.3e-5, 1.5e-5
# the sample dtype (``--dtype``); float32 is the sweep the tests use, other dtypes are for exploring
DTYPE = "float32"
# Ops that reduce (or accumulate) over many elements: kiln's kernels sum in a different order (vectorized
# partial sums) than ATen, so float32 rounding differs by more than a few ulps of the result; 1e-4 for those.
REDUCTION_RTOL = REDUCTION_ATOL = 1e-4
REDUCTION_OPS = frozenset({
    "sum", "mean", "nanmean", "nansum", "prod", "var", "std", "var_mean", "std_mean", "logsumexp", "softmax",
    "log_softmax", "_softmax_backward_data", "_log_softmax", "nn.functional.softmin", "special.log_softmax",
    "special.softmax", "masked.sum", "masked.mean", "masked.var", "masked.std", "masked.softmax",
    "masked.log_softmax", "masked.softmin", "masked.logsumexp", "masked.prod", "masked.normalize",
    "nn.functional.layer_norm", "nn.functional.group_norm", "nn.functional.instance_norm",
    "nn.functional.batch_norm", "nn.functional.rms_norm", "native_layer_norm", "nn.functional.local_response_norm",
    "norm", "linalg.norm", "linalg.vector_norm", "linalg.matrix_norm", "nn.functional.normalize", "renorm",
    "cumsum", "cumprod", "logcumsumexp", "trace", "dist", "cdist", "nn.functional.pairwise_distance",
    "nn.functional.cosine_similarity", "nn.functional.avg_pool1d", "nn.functional.avg_pool2d",
    "nn.functional.avg_pool3d", "nn.functional.adaptive_avg_pool1d", "nn.functional.adaptive_avg_pool2d",
    "nn.functional.adaptive_avg_pool3d", "nn.functional.kl_div", "nn.functional.mse_loss",
    "nn.functional.l1_loss", "nn.functional.smooth_l1_loss", "nn.functional.huber_loss",
    "nn.functional.binary_cross_entropy", "nn.functional.binary_cross_entropy_with_logits",
    "nn.functional.cross_entropy", "nn.functional.nll_loss", "nn.functional.poisson_nll_loss",
    "nn.functional.gaussian_nll_loss", "nn.functional.soft_margin_loss", "nn.functional.margin_ranking_loss",
    "nn.functional.hinge_embedding_loss", "nn.functional.cosine_embedding_loss", "nn.functional.triplet_margin_loss",
    "nn.functional.triplet_margin_with_distance_loss", "nn.functional.multilabel_soft_margin_loss",
    "nn.functional.multi_margin_loss", "nn.functional.multilabel_margin_loss", "nn.functional.ctc_loss",
    "sum_to_size", "mean.dim", "aminmax", "_chunk_cat", "einsum", "matmul", "mm", "bmm", "addmm", "baddbmm",
    "addbmm", "addmv", "mv", "dot", "vdot", "inner", "tensordot", "linalg.multi_dot", "nn.functional.linear",
    "nn.functional.bilinear", "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d",
    "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d", "nn.functional.conv_transpose3d",
    "nn.functional.scaled_dot_product_attention", "nn.functional.multi_head_attention_forward",
    "special.logsumexp", "std_mean.unbiased", "var_mean.unbiased", "std.unbiased", "var.unbiased",
})

# Random or nondeterministic results (names, and substrings of names).
RANDOM_OPS = frozenset({
    "bernoulli", "multinomial", "normal", "cauchy", "exponential", "geometric", "log_normal", "uniform",
    "nn.functional.rrelu", "randint_like", "randn_like", "rand_like", "randint", "randn", "rand",
    "empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted",  # uninitialized
    "nn.functional.fractional_max_pool2d", "nn.functional.fractional_max_pool3d", "torch._C._nn.rrelu",
    "nn.functional.scaled_dot_product_attention",  # picks a kernel with nondeterministic dropout when asked
    "unique", "unique_consecutive",  # data-dependent output shapes
})
RANDOM_SUBSTRINGS = ("dropout", "bernoulli", "rand", "normal_", "multinomial")
# Ops whose meaning needs autograd (their samples require grad or call backward).
GRAD_OPS = frozenset({"torch.ops.aten._efficientzerotensor", "nn.functional.ctc_loss"})


def op_key(op: Any) -> str:
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def skip_reason(op: Any) -> str | None:
    """Why a whole op is left out of the sweep (None: it is swept)."""
    import torch
    name = op.name
    if getattr(torch, DTYPE) not in op.supported_dtypes("cpu"):
        return f"no {DTYPE} on CPU"
    if name.endswith("_") or op.variant_test_name in ("out", "in_place", "inplace") or \
            "inplace" in op.variant_test_name or name.startswith("_refs"):
        return "in-place/out variant"
    if name in RANDOM_OPS or any(s in name or s in op.variant_test_name for s in RANDOM_SUBSTRINGS):
        return "random/nondeterministic"
    if name in GRAD_OPS or "backward" in name:
        return "needs autograd"
    return None


# Half-precision samples: compared with eager in the same dtype.  kiln computes each op in fp32 and rounds where
# ATen rounds, but its exp/tanh/erf (fp32, within an ulp of ATen's) can round to the other half-precision
# neighbour, and reductions add in another order in fp32 before one rounding: two ulps of the type, relative, and
# a small absolute floor for results that cancel to near zero.
HALF_TOLERANCES = {"bfloat16": (2 * 2.0 ** -8, 1e-2), "float16": (2 * 2.0 ** -11, 1e-3)}
HALF_REDUCTION_TOLERANCES = {"bfloat16": (2e-2, 2e-2), "float16": (4e-3, 4e-3)}


def tolerance(op: Any) -> tuple[float, float]:
    reduction = op.name in REDUCTION_OPS or op_key(op) in REDUCTION_OPS
    if DTYPE in HALF_TOLERANCES:
        return (HALF_REDUCTION_TOLERANCES if reduction else HALF_TOLERANCES)[DTYPE]
    if reduction:
        return REDUCTION_RTOL, REDUCTION_ATOL
    return RTOL, ATOL


def all_ops() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db
    return list(op_db)


def select_ops(names: Iterable[str] | None = None, exact: bool = False) -> list[Any]:
    """op_db entries by key (``name`` or ``name.variant``); unless ``exact``, a bare name selects all its
    variants."""
    ops = all_ops()
    if not names:
        return ops
    wanted = [n.strip() for n in names if n.strip()]
    chosen = [op for op in ops if op_key(op) in wanted or (not exact and op.name in wanted)]
    missing = [w for w in wanted if not any(op_key(op) == w or op.name == w for op in ops)]
    if missing and not exact:
        raise SystemExit(f"opinfo_sweep: no op_db entry named {missing}")
    if missing:  # a list made for another torch version: sweep what exists
        print(f"opinfo_sweep: no op_db entry named {missing}", file=sys.stderr)
    return chosen


# ------------------------------------------------------------------------------------------ one sample

def _is_tensor_tree(v: Any) -> bool:
    import torch
    if isinstance(v, torch.Tensor):
        return True
    if isinstance(v, (list, tuple)):
        return len(v) > 0 and all(isinstance(x, torch.Tensor) for x in v)
    return False


def _plain_tensor(t: Any) -> bool:
    import torch
    return (type(t) is torch.Tensor or type(t) is torch.nn.Parameter) and t.layout == torch.strided and \
        t.device.type == "cpu" and not t.is_complex() and not t.is_quantized


def _clone(v: Any) -> Any:
    import torch
    from torch.utils._pytree import tree_map
    return tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, v)


def _short(exc: BaseException) -> str:
    """``Type: first line`` of an exception, with Dynamo's wrapping peeled off."""
    inner = exc
    for _ in range(4):
        nxt = getattr(inner, "inner_exception", None) or inner.__cause__
        if nxt is None or type(inner).__name__ not in ("BackendCompilerFailed", "InternalTorchDynamoError"):
            break
        inner = nxt
    text = str(inner).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(inner).__name__}: {first}"[:300]


def run_sample(op: Any, sample: Any, key: str) -> dict[str, Any]:
    """Run one sample eagerly and compiled; returns a result dict with ``status`` pass/fail/skip."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    import kiln.report

    if not _is_tensor_tree(sample.input):
        return {"status": "skip", "error": "input is not a tensor or tuple of tensors"}
    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    if not all(_plain_tensor(t) for t in tensors):
        return {"status": "skip", "error": "non-strided, complex or non-CPU tensor"}
    if any(t.requires_grad for t in tensors):
        return {"status": "skip", "error": "needs grad"}
    positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
    fixed = list(leaves)
    fn_op = op.op

    def fn(*ts: Any) -> Any:
        vals = list(fixed)
        for p, t in zip(positions, ts):
            vals[p] = t
        inp, args, kwargs = tree_unflatten(vals, spec)
        return fn_op(inp, *args, **kwargs)

    with torch.inference_mode():
        eager_inputs = _clone(tensors)
        try:
            expected = fn(*eager_inputs)
        except Exception as exc:  # noqa: BLE001 - eager rejects the sample: it does not count
            return {"status": "skip", "error": f"eager: {_short(exc)}"}
        if not _is_tensor_tree(expected) or not all(_plain_tensor(t) for t in
                                                   (expected if isinstance(expected, (list, tuple)) else [expected])):
            return {"status": "skip", "error": "output is not a tensor or tuple of tensors"}
        position = kiln.report.mark()
        compiled = torch.compile(fn, backend="kiln", dynamic=False, options={"fallback": False})
        compiled_inputs = _clone(tensors)
        try:
            got = compiled(*compiled_inputs)
        except Exception as exc:  # noqa: BLE001
            return {"status": "fail", "error": _short(exc), "kind": "compile/run"}
        reps = kiln.report.reports_since(position)
        info = {"graphs": len(reps), "externs": sorted({e for r in reps for e in (r.externs or [])}),
                "kernels": sum(len(r.kernels or []) for r in reps)}
        rtol, atol = tolerance(op)
        try:
            if isinstance(expected, torch.Tensor):
                if not isinstance(got, torch.Tensor):
                    raise AssertionError(f"expected a tensor, got {type(got).__name__}")
            elif not isinstance(got, (list, tuple)) or len(got) != len(expected):
                raise AssertionError(f"expected {len(expected)} outputs, got {type(got).__name__}")
            torch.testing.assert_close(got, expected, rtol=rtol, atol=atol, equal_nan=True)
            for k, (a, b) in enumerate(zip(compiled_inputs, eager_inputs)):  # ops that update an input in place
                torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True,
                                           msg=lambda m, k=k: f"input {k} after the call: {m}")
        except AssertionError as exc:
            msg = " ".join(str(exc).split())
            return {"status": "fail", "error": f"mismatch: {msg}"[:300], "kind": "mismatch", **info}
    return {"status": "pass", **info}


def iter_op(op: Any, max_samples: int) -> Iterator[dict[str, Any]]:
    """The records of one op's samples, as they are run (``max_samples`` 0: all of them)."""
    import torch
    key = op_key(op)
    reason = skip_reason(op)
    if reason:
        yield {"op": key, "sample": -1, "status": "skip", "error": reason}
        return
    try:
        torch.manual_seed(0)
        samples = iter(op.sample_inputs("cpu", getattr(torch, DTYPE), requires_grad=False))
        k = 0
        while not max_samples or k < max_samples:
            sample = next(samples, None)
            if sample is None:
                break
            torch._dynamo.reset()  # each sample compiles afresh (and guards do not pile up)
            torch.manual_seed(k)
            start = time.perf_counter()
            try:
                res = run_sample(op, sample, key)
            except Exception as exc:  # noqa: BLE001 - a bug in the harness path, still one failed sample
                res = {"status": "fail", "error": f"harness: {_short(exc)}", "trace": traceback.format_exc()[-800:]}
            yield {"op": key, "sample": k, **res, "seconds": round(time.perf_counter() - start, 3)}
            k += 1
    except Exception as exc:  # noqa: BLE001 - sample generation itself failed
        yield {"op": key, "sample": -1, "status": "skip", "error": f"sample_inputs: {_short(exc)}"}


def run_op(op: Any, max_samples: int) -> list[dict[str, Any]]:
    return list(iter_op(op, max_samples))


def _configure() -> None:
    import warnings

    import torch
    torch._dynamo.config.cache_size_limit = 1 << 16
    torch._dynamo.config.accumulated_cache_size_limit = 1 << 16
    torch._dynamo.config.automatic_dynamic_shapes = False
    torch._dynamo.config.assume_static_by_default = True
    torch._dynamo.config.suppress_errors = False
    warnings.filterwarnings("ignore")
    import logging
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)


def run_sweep(keys: Sequence[str] | None, max_samples: int, log: Any = None,
              exact: bool = False) -> list[dict[str, Any]]:
    """In-process sweep (no crash isolation).  ``log``: a file that gets one JSON line per record, framed
    by ``started`` and ``done`` lines per op (a worker that dies leaves an op started but not done)."""
    _configure()
    results = []

    def note(rec: dict[str, Any]) -> None:
        if log is not None:
            log.write(json.dumps(rec) + "\n")
            log.flush()

    limits = {}  # "key@N": N samples for that op
    for k in keys or ():
        if "@" in k:
            name, count = k.rsplit("@", 1)
            limits[name] = int(count)
    keys = [k.rsplit("@", 1)[0] for k in keys] if keys else keys
    for op in select_ops(keys, exact):
        key = op_key(op)
        note({"op": key, "started": True})
        for r in iter_op(op, limits.get(key, max_samples)):
            note(r)
            results.append(r)
        note({"op": key, "done": True})
    return results


# ------------------------------------------------------------------------------------------ isolation

def _worker_cmd(keys: Sequence[str], max_samples: int, log_path: str) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "--worker", "--ops", ",".join(keys),
            "--max-samples-per-op", str(max_samples), "--log", log_path, "--dtype", DTYPE]


def _read_log(path: str) -> tuple[list[dict[str, Any]], set[str], str | None, int]:
    """A worker log: its records, the ops it finished, the op it started but did not finish (if any), and
    the number of lines (progress)."""
    recs: list[dict[str, Any]] = []
    done: set[str] = set()
    started, lines = None, 0
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line being written
                lines += 1
                if r.get("started"):
                    started = r["op"]
                elif r.get("done"):
                    done.add(r["op"])
                else:
                    recs.append(r)
    return recs, done, (started if started is not None and started not in done else None), lines


# a fresh worker imports torch and op_db before its first line: this long without one is not a hang
WORKER_STARTUP_S = 300.0


def run_isolated(keys: Sequence[str] | None, max_samples: int, jobs: int = 1, timeout: float = 300,
                 verbose: bool = False, exact: bool = False,
                 samples_per_op: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """The sweep in ``jobs`` worker processes; an op whose worker dies, or spends more than ``timeout``
    seconds on one sample, gets a ``crash`` failure record and the worker restarts at the next op.

    ``exact``: ``keys`` are exact op keys (``name.variant``), so this process need not load op_db.
    ``samples_per_op``: op key -> number of samples, overriding ``max_samples`` for that op."""
    _configure_light()
    if not exact or keys is None:
        keys = [op_key(op) for op in select_ops(keys)]
    keys = list(dict.fromkeys(keys))
    limits = dict(samples_per_op or {})
    jobs = max(1, min(jobs, len(keys)))
    tmp = tempfile.mkdtemp(prefix="kiln-opinfo-")
    pending = {j: keys[j::jobs] for j in range(jobs)}
    procs: dict[int, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    runs = 0

    def launch(j: int) -> None:
        nonlocal runs
        runs += 1
        path = os.path.join(tmp, f"log-{j}-{runs}.jsonl")
        err = open(os.path.join(tmp, f"err-{j}-{runs}.txt"), "w+")
        ops = [f"{k}@{limits[k]}" if k in limits else k for k in pending[j]]
        p = subprocess.Popen(_worker_cmd(ops, max_samples, path), stdout=subprocess.DEVNULL,
                             stderr=None if verbose else err)
        procs[j] = {"p": p, "path": path, "err": err, "t": time.monotonic(), "lines": 0, "seen": 0}

    try:
        for j in pending:
            launch(j)
        while procs:
            time.sleep(0.2)
            for j, w in list(procs.items()):
                p = w["p"]
                recs, done, crashed, lines = _read_log(w["path"])
                if lines != w["lines"]:
                    w["t"], w["lines"] = time.monotonic(), lines
                if verbose:
                    for r in recs[w["seen"]:]:
                        print(f"  {r['op']}[{r['sample']}] {r['status']} {r.get('error', '')[:120]}", flush=True)
                    w["seen"] = len(recs)
                limit = timeout if lines else timeout + WORKER_STARTUP_S
                hung = p.poll() is None and time.monotonic() - w["t"] > limit
                if p.poll() is None and not hung:
                    continue
                if hung:
                    p.kill()
                p.wait()
                recs, done, crashed, lines = _read_log(w["path"])
                w["err"].seek(0)
                stderr = w["err"].read()[-2000:]
                w["err"].close()
                results.extend(recs)
                if crashed is None and p.returncode != 0:
                    crashed = next((k for k in pending[j] if k not in done), None)
                if crashed is not None:
                    why = "hung" if hung else f"worker exited with {p.returncode}"
                    last = max((r["sample"] for r in recs if r["op"] == crashed), default=-1)
                    tail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
                    results.append({"op": crashed, "sample": last + 1, "status": "fail", "kind": "crash",
                                    "error": f"crash: {why} {tail}".strip()[:300]})
                    done.add(crashed)
                pending[j] = [k for k in pending[j] if k not in done]
                del procs[j]
                if pending[j]:
                    launch(j)
    finally:
        for w in procs.values():
            w["p"].kill()
        shutil.rmtree(tmp, ignore_errors=True)
    order = {k: i for i, k in enumerate(keys)}
    results.sort(key=lambda r: (order.get(r["op"], 1 << 30), r["sample"]))
    return results


def _configure_light() -> None:
    import warnings
    warnings.filterwarnings("ignore")


# ------------------------------------------------------------------------------------------ summary

def tally(results: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """(passed, run): run counts samples that ran in eager (pass + fail, crashes count as one failure)."""
    passed = sum(r["status"] == "pass" for r in results)
    run = passed + sum(r["status"] == "fail" for r in results)
    return passed, run


def failures_by_op(results: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in results:
        if r["status"] == "fail":
            out[r["op"]].append(r)
    return dict(out)


def reason_class(error: str) -> str:
    """A coarse failure class for 'top reasons' (the message without numbers and names of shapes)."""
    import re
    if error.startswith("mismatch:"):
        if "after the call" in error:
            return "mismatch: an input updated in place differs"
        if "dtype" in error:
            return "mismatch: dtype"
        if "shape" in error or "size" in error.lower():
            return "mismatch: shape"
        return "mismatch: values"
    return re.sub(r"\d+", "N", error)[:120]


def summary(results: Sequence[dict[str, Any]]) -> str:
    passed, run = tally(results)
    lines = []
    ops_run = {r["op"] for r in results if r["status"] in ("pass", "fail")}
    pct = 100.0 * passed / run if run else 100.0
    lines.append(f"opinfo sweep: {passed} / {run} samples passed ({pct:.1f}%) over {len(ops_run)} ops; "
                 f"{sum(r['status'] == 'skip' for r in results)} skip records")
    fails = failures_by_op(results)
    if fails:
        lines.append(f"failures ({sum(len(v) for v in fails.values())} samples in {len(fails)} ops):")
        for key in sorted(fails):
            errs = collections.Counter(r["error"] for r in fails[key])
            for err, count in errs.most_common():
                lines.append(f"  {key}  x{count}: {err}")
        reasons = collections.Counter(reason_class(r["error"]) for v in fails.values() for r in v)
        lines.append("top failure reasons:")
        for err, count in reasons.most_common(15):
            lines.append(f"  {count:5d}  {err}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ops", default="", help="comma-separated op_db names (name or name.variant); default all")
    ap.add_argument("--max-samples-per-op", type=int, default=3, help="0: all samples")
    ap.add_argument("--json", default=None, help="write all records and the tally here")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--dtype", default="float32", help="sample dtype (float32 unless exploring)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one sample may take before its worker "
                    "is killed (reported as a crash)")
    ap.add_argument("--in-process", action="store_true", help="no worker processes (no crash isolation)")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--log", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    keys = [k for k in a.ops.split(",") if k.strip()] or None
    global DTYPE
    DTYPE = a.dtype
    if a.worker:
        with open(a.log, "a") as log:
            run_sweep(keys, a.max_samples_per_op, log, exact=True)
        return 0
    start = time.perf_counter()
    if a.in_process:
        results = run_sweep(keys, a.max_samples_per_op)
    else:
        results = run_isolated(keys, a.max_samples_per_op, jobs=a.jobs, timeout=a.timeout,
                               verbose=a.verbose)
    print(summary(results))
    print(f"({time.perf_counter() - start:.0f} s)")
    if a.json:
        passed, run = tally(results)
        with open(a.json, "w") as f:
            json.dump({"passed": passed, "run": run, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
