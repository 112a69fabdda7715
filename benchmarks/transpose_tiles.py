"""A transposing pointwise kernel (channels-last bf16 -> NCHW, + per-channel bias, ReLU) in tile shapes, grid
orders and cache hints, against Inductor's kernel for the same function; device time, interleaved rounds,
medians.  Evidence for kiln/codegen/triton.py's TILE_X/TILE_Y and tile order.

    python -m benchmarks.transpose_tiles            (on a CUDA machine)
"""
from __future__ import annotations

import statistics

import torch
import triton
import triton.language as tl


@triton.jit
def tiled(p0, pb, p1, HW: tl.constexpr, C: tl.constexpr, N: tl.constexpr, TX: tl.constexpr, TY: tl.constexpr,
          ORDER: tl.constexpr, EVICT: tl.constexpr):
    """ORDER 0: store-side tiles first (x on axis 0, channel tiles on axis 1, image on axis 2); 1: load-side
    tiles first on one flat axis; 2: Inductor's (y = image*channel flattened on axis 1, x on axis 0)."""
    if ORDER == 2:
        y = tl.program_id(1) * TY + tl.arange(0, TY)[:, None]
        x = tl.program_id(0) * TX + tl.arange(0, TX)[None, :]
        c = y % C
        z = y // C
        m = x < HW
    else:
        if ORDER == 1:
            t = tl.program_id(0)
            ct = (C + TY - 1) // TY
            px = t // ct
            py = t % ct
        else:
            px = tl.program_id(0)
            py = tl.program_id(1)
        z = tl.program_id(2)
        x = px * TX + tl.arange(0, TX)[None, :]
        c = py * TY + tl.arange(0, TY)[:, None]
        m = (x < HW) & (c < C)
    if EVICT:
        v = tl.load(p0 + (HW * C * z + c + C * x), mask=m, other=0, eviction_policy="evict_first").to(tl.float32)
    else:
        v = tl.load(p0 + (HW * C * z + c + C * x), mask=m, other=0).to(tl.float32)
    v = v + tl.load(pb + c).to(tl.float32)
    v = tl.where(v > 0, v, 0)
    tl.store(p1 + (HW * C * z + HW * c + x), v.to(tl.bfloat16), mask=m)


def device_us(fn, calls: int = 20) -> float:
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    fn()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / calls


def main() -> None:
    n, c, h = 16, 128, 220
    hw = h * h
    x = torch.randn(n, c, h, h, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=torch.channels_last)
    bias = torch.randn(c, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(n, c, h, h, device="cuda", dtype=torch.bfloat16)
    ref = torch.relu(x.float() + bias.float()[:, None, None]).to(torch.bfloat16).contiguous()
    variants = {}
    for order, shapes in ((0, ((64, 32, 4), (32, 64, 4), (64, 64, 8))),
                          (1, ((32, 64, 4), (64, 64, 8), (64, 128, 8), (32, 128, 4), (16, 128, 4))),
                          (2, ((32, 32, 4), (64, 64, 8), (256, 16, 8), (16, 256, 8), (32, 128, 8), (64, 128, 8)))):
        for tx, ty, w in shapes:
            for evict in (0, 1):
                if order == 2:
                    grid = (triton.cdiv(hw, tx), triton.cdiv(n * c, ty), 1)
                elif order == 1:
                    grid = (triton.cdiv(hw, tx) * triton.cdiv(c, ty), 1, n)
                else:
                    grid = (triton.cdiv(hw, tx), triton.cdiv(c, ty), n)
                variants[f"order{order} {tx}x{ty} w{w} evict{evict}"] = (
                    lambda grid=grid, tx=tx, ty=ty, w=w, order=order, evict=evict:
                    tiled[grid](x, bias, y, hw, c, n, tx, ty, order, evict, num_warps=w))
    compiled = torch.compile(lambda a, b: torch.relu(a + b[:, None, None]).contiguous())
    variants["inductor"] = lambda: compiled(x, bias)
    for name, fn in variants.items():
        out = fn()
        torch.cuda.synchronize()
        got = out if name == "inductor" else y
        if not torch.allclose(got.float(), ref.float(), rtol=1e-2, atol=1e-2):
            print(f"{name}: WRONG RESULT", flush=True)
    times: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(7):
        for name, fn in variants.items():
            times[name].append(device_us(fn))
    for name, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"{statistics.median(ts):8.1f} us  (min {min(ts):6.1f})  {name}", flush=True)


if __name__ == "__main__":
    main()
