"""kiln's differential fuzzer: seeded random programs, compiled with kiln and compared with eager.

    python -m kiln.testing.fuzz --seeds 0:10000 --out DIR [--dtype fp32|half|all] [--jobs N] [--group G]

    from kiln.testing.fuzz import generate, run_program, shrink
    program = generate(7)                 # deterministic: the same seed gives the same source text
    print(program.source())               # make_inputs, fn, OUT_TOL, INPUT_TOL - what a reproducer contains
    result = run_program(program)         # ok / mismatch / crash / fallback / eager_error / torch_error

The parts: ``fuzz_program.py`` (the program as data and as text), ``fuzz_ops*.py`` (the op table),
``fuzz_gen.py`` (the generator), ``fuzz_numerics.py`` (validity, well-conditioning and tolerances - why the
fuzzer reports no false positives), ``fuzz_run.py`` (compiled vs eager, classified), ``fuzz_shrink.py``
(minimal reproducers), ``fuzz_pool.py`` (worker processes: a segfault costs one task).

[Note: groups]  Most of a program's time is fixed cost (a Dynamo trace, one g++ build of ~0.5 s), so
``--group G`` merges G programs into one function (``fuzz_program.merge``: their statements side by side,
inputs and outputs concatenated, each input keeping its values).  A group that is not ``ok`` is run again
member by member, so every failure is attributed to a seed and shrunk alone.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
import time
from typing import Any, Callable, Sequence

from kiln.testing.fuzz_gen import float_type, generate
from kiln.testing.fuzz_pool import eager_only
from kiln.testing.fuzz_program import Program, merge
from kiln.testing.fuzz_run import Result, run_program
from kiln.testing.fuzz_shrink import shrink, write_reproducer

__all__ = ["generate", "run_program", "shrink", "write_reproducer", "Program", "Result", "run_seeds", "Summary",
           "main"]
STATUSES = ("ok", "mismatch", "crash", "fallback", "eager_error", "torch_error", "fuzzer_error")


@dataclasses.dataclass
class Summary:
    """The outcome of a run over seeds: one ``Result`` per seed, and where the time went."""

    results: dict[int, Result] = dataclasses.field(default_factory=dict)
    # groups that failed although each member alone passes (kiln errs on the merged graph): kept as Results
    # whose ``members`` name the seeds; a failure all the same
    groups: list[Result] = dataclasses.field(default_factory=list)
    wall_seconds: float = 0.0
    compiles: int = 0  # compiled functions (groups count once)

    def counts(self) -> dict[str, int]:
        c = collections.Counter(r.status for r in self.results.values())
        return {s: c.get(s, 0) for s in STATUSES}

    def failing(self) -> list[Result]:
        return [r for _, r in sorted(self.results.items()) if r.failed] + self.groups

    def format(self) -> str:
        counts = self.counts()
        n = max(1, len(self.results))
        lines = [f"{len(self.results)} programs in {self.wall_seconds:.0f} s ({self.compiles} compiled functions): " +
                 ", ".join(f"{k} {v}" for k, v in counts.items())]
        for r in self.failing():
            who = f"group {r.members}" if len(r.members) > 1 else f"seed {r.seed}"
            lines.append(f"  {who}: {r.status} {r.signature}: {r.detail[:240]}")
        reasons = collections.Counter(r.detail[:120] for r in self.results.values() if r.status == "fallback")
        for why, k in reasons.most_common(8):
            lines.append(f"  fallback x{k}: {why}")
        lines.append(f"  failing seeds: {[r.members if len(r.members) > 1 else r.seed for r in self.failing()]}")
        lines.append(f"  per program: {self.wall_seconds / n:.2f} s wall")
        return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ worker

def _program_of(task: dict[str, Any]) -> Program:
    if "program" in task:
        return Program.from_json(task["program"])
    with eager_only():  # (the generator runs each statement eagerly: eager's own crash there is torch's - seed 15342,
        # a float16 conv2d of an unbatched input segfaults in torch 2.13's CPU kernel)
        progs = [generate(s, task.get("dtype", "fp32"), task.get("size", "ci")) for s in task["seeds"]]
    return progs[0] if len(progs) == 1 else merge(progs)


def _answer(task: dict[str, Any]) -> dict[str, Any]:
    start = time.perf_counter()
    program = _program_of(task)
    gen_s = time.perf_counter() - start
    res = run_program(program, task.get("backend", "kiln"), task.get("options"), grad=task.get("grad", False))
    res.phases["generate"] = gen_s
    return res.to_json()


def worker_main() -> None:
    """``--worker``: answer tasks (JSON lines on stdin) until stdin closes."""
    import warnings

    import torch
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):  # (the Triton target on CPU tensors)
        from kiln.testing import triton_interpreter
        triton_interpreter.patch()
    for line in sys.stdin:
        if not line.strip():
            continue
        task = json.loads(line)
        if task.get("segfault"):  # the pool's test: a crash in native code must cost only this task
            import ctypes
            ctypes.string_at(0)
        try:
            answer = _answer(task)
        except Exception as exc:  # noqa: BLE001 - a fuzzer bug must not look like a kiln crash
            answer = {"status": "fuzzer_error", "detail": f"{type(exc).__name__}: {exc}"[:400], "signature": ""}
        sys.stdout.write("@@FUZZ " + json.dumps(answer) + "\n")
        sys.stdout.flush()


# ------------------------------------------------------------------------------------------------ driver

def _result(seed: int, answer: dict[str, Any]) -> Result:
    fields = {f.name for f in dataclasses.fields(Result)}
    r = Result(**{k: v for k, v in answer.items() if k in fields and k != "seed"}, seed=seed)
    return r


def run_seeds(seeds: Sequence[int], *, dtype: str = "fp32", size: str = "ci", jobs: int = 1, group: int = 1,
              options: dict[str, Any] | None = None, log: Callable[[str], None] | None = print,
              progress_every: int = 100, grad: bool = False) -> Summary:
    """Run the programs of ``seeds`` in ``jobs`` worker processes, ``group`` programs per compiled function
    (``grad``: their gradients too, [Note: fuzzing gradients])."""
    from kiln.testing.fuzz_pool import Pool
    summary, start = Summary(), time.perf_counter()
    base = {"dtype": dtype, "size": size, "options": options, "grad": grad}
    tasks = collections.deque({**base, "seeds": chunk} for chunk in _groups(seeds, group, dtype))
    pool = Pool(jobs, timeout=120.0)
    split: dict[tuple[int, ...], Result] = {}  # groups that were not ok, while their members run alone

    def on_result(task: dict[str, Any], answer: dict[str, Any]) -> None:
        members = task["seeds"]
        summary.compiles += 1
        if answer.get("status") != "ok" and len(members) > 1:  # find out which member(s): one task each
            split[tuple(members)] = _result(members[0], answer)
            split[tuple(members)].members = list(members)
            if log:
                log(f"group {members}: {answer.get('status')} {answer.get('detail', '')[:160]}; members run alone")
            tasks.extendleft({**base, "seeds": [s], "group_of": members} for s in reversed(members))
            return
        if "group_of" in task:
            _group_done(summary, split, tuple(task["group_of"]), answer, log)
        for s in members:
            r = _result(s, answer)
            r.phases = {k: v / len(members) for k, v in r.phases.items()}  # a group's time, shared
            summary.results[s] = r
            if log and r.status != "ok":
                log(f"seed {s}: {r.status} {r.signature} {r.detail[:200]}")
        done = len(summary.results)
        if log and progress_every and done // progress_every != (done - len(members)) // progress_every:
            el = time.perf_counter() - start
            log(f"[{done}/{len(seeds)}] {_brief(summary.counts())}  ({done / el:.2f} programs/s)")

    try:
        pool.run(tasks, on_result, timeout=lambda t: 60.0 + 30.0 * len(t["seeds"]))
    finally:
        pool.close()
    summary.wall_seconds = time.perf_counter() - start
    return summary


def _groups(seeds: Sequence[int], size: int, dtype: str) -> list[list[int]]:
    """Seeds in groups of ``size`` whose programs share a float dtype (a merged function has one)."""
    by_type: dict[str, list[int]] = {}
    for s in seeds:
        by_type.setdefault(float_type(s, dtype), []).append(s)
    chunks = [ss[i:i + size] for ss in by_type.values() for i in range(0, len(ss), size)]
    return sorted(chunks, key=lambda c: c[0])


def _group_done(summary: Summary, split: dict[tuple[int, ...], Result], group: tuple[int, ...],
                answer: dict[str, Any], log: Callable[[str], None] | None) -> None:
    """A member of a failed group has run alone; when the last has, a group failure no member explains is
    recorded (e.g. kiln fused two programs' ops wrongly)."""
    g = split[group]
    g.phases.setdefault("members_left", float(len(group)))
    g.phases["members_left"] -= 1
    if answer.get("status") in ("mismatch", "crash"):
        g.phases["members_failed"] = 1.0
    if g.phases["members_left"] == 0 and not g.phases.get("members_failed") and g.failed:
        summary.groups.append(g)
        if log:
            log(f"group {list(group)}: {g.status} {g.signature} {g.detail[:200]} (no member fails alone)")


def _brief(counts: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in counts.items() if v or k in ("ok", "mismatch", "crash"))


def shrink_failures(summary: Summary, out_dir: str, *, dtype: str, size: str, options: dict[str, Any] | None,
                    log: Callable[[str], None] = print, max_tests: int = 120, grad: bool = False) -> list[str]:
    """Shrink every failing seed (candidates run in a worker, so a crash stays contained) and write a
    reproducer per seed into ``out_dir``; returns the paths."""
    from kiln.testing.fuzz_pool import Pool
    os.makedirs(out_dir, exist_ok=True)
    pool, paths = Pool(1, timeout=180.0), []

    def test(p: Program) -> Result:
        box: list[Result] = []
        pool.run(collections.deque([{"program": p.to_json(), "options": options, "grad": grad}]),
                 lambda _t, a: box.append(_result(p.seed, a)))
        return box[0]

    try:
        for r in summary.failing():
            log(f"shrinking seed {r.seed} ({r.signature})")
            program = generate(r.seed, dtype, size) if len(r.members) <= 1 else \
                merge([generate(s, dtype, size) for s in r.members])
            small, small_result = shrink(program, test, r.signature, max_tests=max_tests, log=log)
            tag = r.signature.replace(":", "_").replace(" ", "_")
            name = r.seed if len(r.members) <= 1 else "group_" + "_".join(map(str, r.members))
            path = os.path.join(out_dir, f"fuzz_{name}_{tag}.py")
            paths.append(write_reproducer(small, small_result or r, path))
            log(f"  wrote {path}")
    finally:
        pool.close()
    return paths


def _seed_range(text: str) -> list[int]:
    if ":" in text:
        a, b = text.split(":")
        return list(range(int(a), int(b)))
    return [int(s) for s in text.split(",")]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kiln.testing.fuzz", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0:100", help="A:B (range) or a comma-separated list")
    ap.add_argument("--out", help="write a shrunk reproducer per failing seed into this directory")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "half", "all"],
                    help="float32 programs, float16/bfloat16 ones, or a mix (a fifth half)")
    ap.add_argument("--size", default="full", choices=["ci", "full"],
                    help="ci: 4-10 statements, small shapes; full: 6-16 statements, dims up to 64")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="worker processes")
    ap.add_argument("--group", type=int, default=4, help="programs per compiled function (see [Note: groups])")
    ap.add_argument("--check", action="store_true", help="compile with KILN_CHECK (kiln names the step that errs)")
    ap.add_argument("--mode", default="default", choices=["default", "reduce-overhead"],
                    help="reduce-overhead: CUDA graphs replayed (emulated on the CPU), outputs held across replays "
                         "checked ([Note: fuzzing replays])")
    ap.add_argument("--target", default=None, choices=["cpu", "triton"],
                    help="kiln's code generator (default: the inputs' device's); triton on the CPU's tensors runs "
                         "under Triton's interpreter (set TRITON_INTERPRET=1)")
    ap.add_argument("--grad", action="store_true",
                    help="also compile each program for training and compare its inputs' gradients with eager's "
                         "([Note: fuzzing gradients], kiln/testing/fuzz_grad.py)")
    ap.add_argument("--json", help="write every result as JSON to this file")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    options = {"check": True} if args.check else {}
    if args.mode != "default":
        options.update(mode=args.mode, emulate_cuda_graphs=True)
    if args.target is not None:
        options.update(target=args.target)
    options = options or None
    summary = run_seeds(_seed_range(args.seeds), dtype=args.dtype, size=args.size, jobs=args.jobs,
                        group=args.group, options=options, grad=args.grad)
    print(summary.format())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({s: r.to_json() for s, r in summary.results.items()}, f, indent=1)
    if args.out and summary.failing():
        shrink_failures(summary, args.out, dtype=args.dtype, size=args.size, options=options, grad=args.grad)
    return 1 if summary.failing() else 0


if __name__ == "__main__":
    sys.exit(main())
