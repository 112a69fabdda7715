"""Where the time goes on the GPU: device copy bandwidth, then the top device kernels of one model compiled by
kiln and by Inductor (torch.profiler over a few calls), so kernel time can be told from launch overhead.

    python -m benchmarks.gpu_profile --models chain,gpt_b8x512 --dtype bf16
    python -m benchmarks.gpu_profile --zoo --models bert,swin --dtype bf16 --top 25    (zoo models at full size)
    python -m benchmarks.gpu_profile --zoo --models vit --dtype fp32 --mode reduce-overhead    (fp32: TF32 off)
"""
from __future__ import annotations

import argparse

import torch


def copy_bandwidth(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy, bytes read plus written per second (median of 20)."""
    a = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    times = []
    for _ in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times = sorted(times[5:])
    return nbytes / times[len(times) // 2]


def profile(fn, inputs, calls: int = 5) -> list[tuple[str, int, float]]:
    from torch.profiler import ProfilerActivity, profile as prof
    with torch.inference_mode():
        for _ in range(3):
            fn(*inputs)
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(calls):
                fn(*inputs)
            torch.cuda.synchronize()
    rows = []
    for e in p.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append((e.key, e.count, t / calls))
    return sorted(rows, key=lambda r: -r[2])


def main() -> None:
    import kiln
    from benchmarks import models
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="chain,gpt_b8x512")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--zoo", action="store_true", help="models of the zoo (kiln/testing/zoo.py) at full size")
    p.add_argument("--top", type=int, default=12, help="kernels listed per model and backend")
    p.add_argument("--mode", default="default", help="torch.compile mode of both backends")
    p.add_argument("--tf32", action="store_true", help="fp32: let matmuls and cuDNN use TF32 (default off)")
    args = p.parse_args()
    from benchmarks.runner import set_tf32
    set_tf32("cuda", args.dtype, args.tf32)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    print(f"device copy bandwidth: {copy_bandwidth() / 1e12:.2f} TB/s (read + write)")
    for name in args.models.split(","):
        if args.zoo:
            from benchmarks.zoo import builder
            model, inputs = builder("sdpa")(name, device="cuda", dtype=dtype)
            model.eval()
        else:
            model, inputs = models.build(name, device="cuda", dtype=dtype)
        for label, fn in (("kiln", kiln.compile(model, mode=args.mode)),
                          ("inductor", torch.compile(model, mode=args.mode))):
            rows = profile(fn, inputs)
            total = sum(r[2] for r in rows)
            print(f"\n{name} {label}: device time per call {total:.1f} us in {sum(r[1] for r in rows) // 5} "
                  f"kernels")
            for key, count, t in rows[:args.top]:
                print(f"  {t:9.1f} us  x{count // 5:<3d} {key[:100]}")
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
