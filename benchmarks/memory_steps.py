"""Where a kiln compiled call's GPU memory peaks: allocated memory and its peak at each program step.

    python -m benchmarks.memory_steps --model resnet18_b16 [--top 8]

Runs the model once (compiling it), then once more with every step followed by a synchronize and a reading
of ``torch.cuda.max_memory_allocated`` (reset before the step), relative to what was allocated before the
call.  The steps with the highest peaks are printed with what they run and the call's tensors live when the
step began, so a library's workspace (the peak inside an extern step above what is live around it) can be
told from kiln's own buffers.  The caller's outputs (a channels-last library result copied to eager's
layout) count as a last step.
"""
from __future__ import annotations

import argparse

import torch

from benchmarks import models
from kiln.runtime.module import CompiledGraph

mib = 2 ** 20


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--top", type=int, default=8)
    args = p.parse_args()
    import kiln
    model, inputs = models.build(args.model, device="cuda", dtype=torch.bfloat16)
    readings: list[tuple[str, float, float, list[str]]] = []
    run_segment, run_extern, output = CompiledGraph.run_segment, CompiledGraph.run_extern, CompiledGraph.output_value

    def live(env) -> list[str]:
        """The call's own tensors in ``env`` (not the constants), largest first."""
        sizes = {}
        for n, t in env.items():
            if n.op.value not in ("constant", "input") and isinstance(t, torch.Tensor):
                sizes[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), n)
        return [f"{n} {nbytes / mib:.2f}" for nbytes, n in sorted(sizes.values(), key=lambda s: -s[0])[:4]]

    def measured(fn, describe):
        def wrapper(self, item, env):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = live(env)
            result = fn(self, item, env)
            torch.cuda.synchronize()
            readings.append((describe(self, item), torch.cuda.max_memory_allocated(), torch.cuda.memory_allocated(),
                             before))
            return result
        return wrapper

    with torch.inference_mode():
        model(*inputs)
        fn = kiln.compile(model, gpu_call_wrapper=False)  # the interpreted call: its steps are measured here
        fn(*inputs)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        CompiledGraph.run_segment = measured(run_segment, lambda self, i: "+".join(self.segments[i]))
        CompiledGraph.run_extern = measured(run_extern,
                                             lambda self, n: f"extern {n.attr('target')} -> {list(n.shape)}")
        CompiledGraph.output_value = measured(output, lambda self, n: f"output {n} {list(n.shape)}")
        out = fn(*inputs)
        del out
    print(f"{args.model}: {len(readings)} steps, peak {max(r[1] for r in readings) / mib - base / mib:.2f} MiB "
          f"above the {base / mib:.1f} MiB allocated before the call")
    for step, (what, peak, after, before) in sorted(enumerate(readings), key=lambda r: -r[1][1])[:args.top]:
        print(f"  step {step:3d}  peak {(peak - base) / mib:8.2f}  after {(after - base) / mib:8.2f}  {what}")
        print(f"            live before (MiB): {', '.join(before)}")


if __name__ == "__main__":
    main()
