"""How well the CPU GEMM cost model ranks schedules (issue 4's bar: Spearman >= 0.7 with measured times, and its
top 8 within 5% of the exhaustive best on >= 90% of the problems).

Every candidate of each problem is measured (``library/gemm/tune.py``'s timing: alternating rounds, corrected for
the machine's drift between them).
The learned correction for a problem is fitted only to the *other* problems' samples (leave one problem out), as
it would be on a machine that tuned those before; the analytic model alone is reported beside it.

    python -m benchmarks.cpu_gemm_cost_model [--shapes 64x1024x4096,256x768x2304] [--threads 1] [--rounds 21]

``--rounds`` (default: the tuner's) sets how many alternating rounds each problem's measurement takes.  Many
of a problem's schedules lie within 2-3% of each other, about the spread of a 7-round median on a noisy machine,
so with the tuner's rounds the "measured" order of near-ties is partly noise; more rounds measure the model
against a steadier order (max-autotune itself needs only the best few to be found, which the top-8 figure says).
"""
from __future__ import annotations

import argparse

import torch

from kiln.library.gemm import tune as tg
from kiln.tune.ranking import spearman

# the suite's linear layers (MLP batch 64; GPT 256 tokens) and a square one
SHAPES = "64x1024x4096,64x4096x4096,64x4096x1024,256x768x2304,256x768x768,256x768x3072,256x3072x768,256x768x8192," \
         "1024x1024x1024"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=tg.ROUNDS)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    machine = tg.Machine.here()
    problems = []
    for text in args.shapes.split(","):
        m, k, n = (int(v) for v in text.split("x"))
        space = tg.candidates(m, k, n, machine)
        times = tg._time_all(space, m, k, n, args.rounds)
        problems.append(((m, k, n), space, times))
        print(f"measured {m}x{k}x{n}: {len(space)} schedules, best {min(times) * 1e3:.3f} ms", flush=True)
    rows = {"analytic": [], "corrected": []}
    for i, ((m, k, n), space, times) in enumerate(problems):
        others = [(s, *shape, t) for j, (shape, sp, ts) in enumerate(problems) if j != i for s, t in zip(sp, ts)]
        for label, corr in (("analytic", tg.Correction()), ("corrected", tg.fit_correction(others, machine))):
            est = [tg.estimate_s(s, m, k, n, machine) * corr.factor(tg.features(s, machine)) for s in space]
            rho = spearman(est, times)
            order = sorted(range(len(space)), key=lambda j: est[j])
            best = min(times)
            first = 1 + next(r for r, j in enumerate(order) if times[j] <= 1.05 * best)
            rows[label].append((rho, first))
            print(f"  {m}x{k}x{n} {label:9s}: spearman {rho:.2f}, first within 5% of the best at rank {first} "
                  f"of {len(space)}; rule's schedule {times[space.index(tg.schedule_for(m, k))] / best:.3f}x the best"
                  if tg.schedule_for(m, k) in space else f"  {m}x{k}x{n} {label:9s}: spearman {rho:.2f}, "
                  f"first within 5% at rank {first} of {len(space)}")
    for label, r in rows.items():
        print(f"{label}: mean spearman {sum(x for x, _ in r) / len(r):.2f}, top-8 hit rate "
              f"{sum(f <= 8 for _, f in r) / len(r):.0%}, top-{tg.MEASURED} (what max-autotune measures) "
              f"{sum(f <= tg.MEASURED for _, f in r) / len(r):.0%}")


if __name__ == "__main__":
    main()
