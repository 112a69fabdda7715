"""cuDNN convolution per layout: time and peak memory of one call, for the suite's convolution shapes.

For each shape of ResNet-18 (batch 1 and 16) and the seed model, bf16, the convolution runs as
  nchw      NCHW input and weight (eager's layout)
  nhwc      channels-last input, NCHW weight (ATen converts the weight on every call)
  nhwc_held channels-last input and weight (a converted weight copy is held)
with ``cudnn.benchmark`` off and on.  Peak is ``max_memory_allocated`` during the call above what was allocated
before it (input and weight), so it counts the result, converted operands and cuDNN's workspace.

    python -m benchmarks.conv_layouts [--json PATH]
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F

# (batch, in channels, size, out channels, kernel, stride, padding)
SHAPES = [(b, cin, hw, cout, k, s, p) for b in (1, 16) for (cin, hw, cout, k, s, p) in [
    (3, 224, 64, 7, 2, 3), (64, 56, 64, 3, 1, 1), (64, 56, 128, 3, 2, 1), (64, 56, 128, 1, 2, 0),
    (128, 28, 128, 3, 1, 1), (128, 28, 256, 3, 2, 1), (256, 14, 256, 3, 1, 1), (256, 14, 512, 3, 2, 1),
    (256, 14, 512, 1, 2, 0), (512, 7, 512, 3, 1, 1)]] + [(1, 64, 222, 128, 3, 1, 0)]
LAYOUTS = ("nchw", "nhwc", "nhwc_held")


def measure(shape: tuple[int, ...], layout: str, benchmark: bool, iters: int = 50) -> dict:
    b, cin, hw, cout, k, s, p = shape
    x = torch.randn(b, cin, hw, hw, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(cout, cin, k, k, device="cuda", dtype=torch.bfloat16) / (cin * k * k) ** 0.5
    if layout != "nchw":
        x = x.contiguous(memory_format=torch.channels_last)
    if layout == "nhwc_held":
        w = w.contiguous(memory_format=torch.channels_last)
    torch.backends.cudnn.benchmark = benchmark
    for _ in range(3):
        F.conv2d(x, w, None, s, p)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = F.conv2d(x, w, None, s, p)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            F.conv2d(x, w, None, s, p)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / iters)
    out_bytes = b * cout * ((hw + 2 * p - k) // s + 1) ** 2 * 2
    return {"shape": list(shape), "layout": layout, "benchmark": benchmark, "us": statistics.median(times),
            "peak_mib": peak / 2**20, "extra_mib": (peak - out_bytes) / 2**20, "weight_mib": w.numel() * 2 / 2**20}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    args = p.parse_args()
    rows = [measure(shape, layout, bench) for shape in SHAPES for bench in (False, True) for layout in LAYOUTS]
    print(f"{'shape (b, cin, hw, cout, k, s, p)':36s} {'bench':5s} " +
          " ".join(f"{lay + ' us':>12s} {'extra MiB':>9s}" for lay in LAYOUTS))
    for i in range(0, len(rows), len(LAYOUTS)):
        group = rows[i:i + len(LAYOUTS)]
        print(f"{str(tuple(group[0]['shape'])):36s} {str(group[0]['benchmark']):5s} " +
              " ".join(f"{r['us']:12.1f} {r['extra_mib']:9.2f}" for r in group))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
