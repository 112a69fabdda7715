"""Where a kiln compiled call's GPU memory peaks: allocated memory and its peak at each program step.

    python -m benchmarks.memory_steps --model resnet18_b16 [--top 8]

Runs the model once (compiling it), then once more with every step followed by a synchronize and a reading
of ``torch.cuda.max_memory_allocated`` (reset before the step), relative to what was allocated before the
call.  The steps with the highest peaks are printed with what they run, so a library's workspace (the peak
inside an extern step above what is live after it) can be told from kiln's own buffers.
"""
from __future__ import annotations

import argparse

import torch

from benchmarks import models
from kiln.runtime.module import CompiledGraph


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--top", type=int, default=8)
    args = p.parse_args()
    import kiln
    model, inputs = models.build(args.model, device="cuda", dtype=torch.bfloat16)
    readings: list[tuple[str, float, float]] = []
    run_segment, run_extern = CompiledGraph._run_segment, CompiledGraph._run_extern

    def measured(fn, describe):
        def wrapper(self, item, env):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            fn(self, item, env)
            torch.cuda.synchronize()
            readings.append((describe(self, item), torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated()))
        return wrapper

    with torch.inference_mode():
        model(*inputs)
        fn = kiln.compile(model)
        fn(*inputs)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        CompiledGraph._run_segment = measured(run_segment, lambda self, i: "+".join(self._segments[i]))
        CompiledGraph._run_extern = measured(run_extern, lambda self, n: f"extern {n.attr('target')} -> {list(n.shape)}")
        out = fn(*inputs)
        del out
    mib = 2 ** 20
    print(f"{args.model}: {len(readings)} steps, peak {max(r[1] for r in readings) / mib - base / mib:.2f} MiB "
          f"above the {base / mib:.1f} MiB allocated before the call")
    for step, (what, peak, after) in sorted(enumerate(readings), key=lambda r: -r[1][1])[:args.top]:
        print(f"  step {step:3d}  peak {(peak - base) / mib:8.2f}  after {(after - base) / mib:8.2f}  {what}")


if __name__ == "__main__":
    main()
