"""How well the GPU matmul cost model ranks tile configurations (kiln/library/gpu_matmul/tune.py), on the suite.

Compiles the suite's matmul models in max-autotune with an empty tuning database and *every* candidate
configuration measured, then per problem: Spearman correlation between the model's estimate and the measured
time, and whether the model's top ``MEASURED`` contain a configuration within 5% of the exhaustive best.

    python -m benchmarks.matmul_cost_model --models mlp,gpt,gpt_b8x512
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch

from kiln.tune.ranking import spearman


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="mlp,gpt,gpt_b8x512")
    args = p.parse_args()
    os.environ["KILN_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln-costmodel-")
    import kiln
    from benchmarks import models
    from kiln import config
    from kiln.library.gpu_matmul.template import MatmulConfig
    from kiln.report import mark, reports_since
    from kiln.library.gpu_matmul import tune as gpu_matmul
    top = config.get().matmul_measured_configs  # (what max-autotune compiles; here every configuration is timed)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    position = mark()
    for name in args.models.split(","):
        model, inputs = models.build(name, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            kiln.compile(model, mode="max-autotune", matmul_measured_configs=1000)(*inputs)
    seen = [p for r in reports_since(position) if r.matmuls is not None for p in r.matmuls.problems]
    rhos, hits, ranks = [], 0, []
    for prob in seen:
        s = prob.spec
        rows = [(MatmulConfig.from_trace(c["config"]), t) for c, t in prob.timings if c["choice"] == "template"]
        if len(rows) < 3:
            continue
        est = [gpu_matmul.estimate_s(c, s.m, s.n, s.k, s.dtype, sms) for c, _ in rows]
        measured = [t for _, t in rows]
        rho = spearman(est, measured)
        ranked = sorted(zip(est, measured), key=lambda r: r[0])
        best = min(measured)
        hit = min(t for _, t in ranked[:top]) <= 1.05 * best
        ranks.append(1 + next(i for i, (_, t) in enumerate(ranked) if t <= 1.05 * best))
        rhos.append(rho)
        hits += hit
        extern = next(t for c, t in prob.timings if c["choice"] == "extern")
        print(f"{s.m}x{s.n}x{s.k} epilogue={prob.epilogue is not None}: {len(rows)} configs, spearman {rho:.2f}, "
              f"top-{top} within 5%: {hit} (first within 5% at rank {ranks[-1]}), best template {best * 1e6:.1f} us "
              f"vs cuBLAS path {extern * 1e6:.1f} us")
    if rhos:
        print(f"problems {len(rhos)}: mean spearman {sum(rhos) / len(rhos):.2f}, top-{top} hit rate "
              f"{hits / len(rhos):.0%}")
        print("hit rate of the top k: " + ", ".join(f"k={k} {sum(r <= k for r in ranks) / len(ranks):.0%}"
                                                     for k in (1, 2, 4, 8)))


if __name__ == "__main__":
    main()
