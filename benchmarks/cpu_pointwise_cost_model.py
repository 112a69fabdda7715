"""How well the pointwise schedules' cost model ranks loop-nest traces (``kiln/tune/cpu_pointwise.py``).

The suite's models are compiled for the CPU; every plain pointwise kernel (those whose loops come from a trace)
has each candidate of its rule-generated space compiled and timed in its own process (``tune/measure.py``).
The correction for a kernel is fitted only to the *other* kernels' samples (leave one kernel out), as on a
machine that tuned those before; the analytic estimate alone is reported beside it.  Kernels whose
candidates all time within 3% of each other are counted apart: no ranking can be told from noise there.

    python -m benchmarks.cpu_pointwise_cost_model [--models seed,mlp,resnet18,gpt,chain] [--threads 1]
"""
from __future__ import annotations

import argparse

import torch

import kiln
from benchmarks import models
from kiln.codegen.cpp_schedule import candidates, takes_loop_trace
from kiln.report import mark, reports_since
from kiln.tune import cpu_pointwise as pw
from kiln.tune.cpu import _standalone
from kiln.tune.measure import measure
from kiln.tune.ranking import spearman


def kernels_of(name: str) -> list[tuple]:
    """(kernel, dtype_of, node_of) of the model's plain pointwise kernels, from a default-mode compile."""
    from kiln.schedule.plan import make_plan
    model, inputs = models.build(name)
    position = mark()
    with torch.inference_mode():
        kiln.compile(model)(*inputs)
    out = []
    for report in reports_since(position):
        plan = make_plan(report.optimized)
        node_of = {b: n for n, b in plan.buffer_of.items()}
        dtype_of = {b: n.dtype for n, b in plan.buffer_of.items()}
        out += [(k, dtype_of, node_of) for k in plan.kernels if takes_loop_trace(k) and len(candidates(k)) > 1]
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="seed,mlp,resnet18,gpt,chain")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    problems = []
    for name in args.models.split(","):
        for k, dtype_of, node_of in kernels_of(name):
            space = candidates(k)
            results = measure([_standalone(k, dtype_of, node_of, s) for s in space], timeout_s=60)
            if any(r.status != "ok" for r in results):
                print(f"{name} {k.name}: skipped ({[r.status for r in results]})")
                continue
            nbytes = pw.kernel_bytes(k, node_of, dtype_of)
            samples = [pw.Sample(s.loops, tuple(k.outer), nbytes, args.threads, r.median_s)
                       for s, r in zip(space, results)]
            problems.append((f"{name}:{k.name}{list(k.outer)}", samples))
            print(f"measured {name} {k.name} {list(k.outer)}: " +
                  ", ".join(f"{r.median_s * 1e6:.1f}" for r in results) + " us", flush=True)
    rows = {"analytic": [], "corrected": []}
    for i, (label_k, samples) in enumerate(problems):
        times = [s.seconds for s in samples]
        flat = max(times) <= 1.03 * min(times)
        others = [s for j, (_, ss) in enumerate(problems) if j != i for s in ss]
        for label, corr in (("analytic", pw.Correction()), ("corrected", pw.fit_correction(others))):
            est = [pw.predict_s(s.loops, s.extents, s.nbytes, s.threads, corr) for s in samples]
            order = sorted(range(len(samples)), key=lambda j: est[j])
            first = 1 + next(r for r, j in enumerate(order) if times[j] <= 1.05 * min(times))
            rows[label].append((spearman(est, times), first, flat))
            print(f"  {label_k:40s} {label:9s}: spearman {rows[label][-1][0]:5.2f}, first within 5% of the best "
                  f"at rank {first} of {len(samples)}{'  (all within 3%)' if flat else ''}")
    for label, r in rows.items():
        spread = [x for x in r if not x[2]]
        print(f"{label}: {len(r)} kernels; top-{pw.TOP} (what max-autotune measures) finds one within 5% of the "
              f"best on {sum(f <= pw.TOP for _, f, _ in r) / len(r):.0%}; on the {len(spread)} kernels whose "
              f"candidates differ by more than 3%: mean spearman "
              f"{sum(x for x, _, _ in spread) / max(len(spread), 1):.2f}, top-{pw.TOP} "
              f"{sum(f <= pw.TOP for _, f, _ in spread) / max(len(spread), 1):.0%}")


if __name__ == "__main__":
    main()
