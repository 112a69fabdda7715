"""Transposing ReLU (NHWC-strided bf16 -> NCHW): tile and grid-order variants, device time."""
import torch, triton, triton.language as tl

@triton.jit
def k_xy(p0, p1, HW: tl.constexpr, C: tl.constexpr, TX: tl.constexpr, TY: tl.constexpr, YFIRST: tl.constexpr):
    if YFIRST:
        py = tl.program_id(0); px = tl.program_id(1)
    else:
        px = tl.program_id(0); py = tl.program_id(1)
    z = tl.program_id(2)
    i2 = px * TX + tl.arange(0, TX)[None, :]
    i1 = py * TY + tl.arange(0, TY)[:, None]
    m = (i2 < HW) & (i1 < C)
    t0 = tl.load(p0 + (HW * C * z + i1 + C * i2), mask=m, other=0)
    t1 = tl.where((t0 > 0) | (t0 != t0), t0, 0)
    tl.store(p1 + (HW * C * z + HW * i1 + i2), t1, mask=m)

def bench(fn, n=50):
    for _ in range(5): fn()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(n):
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e) * 1000)
    ts.sort(); return ts[len(ts) // 2]

for (N, C, H) in ((16, 128, 220), (16, 64, 222)):
    HW = H * H
    x = torch.randn(N, C, H, H, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    y = torch.empty(N, C, H, H, device="cuda", dtype=torch.bfloat16)
    ref = torch.relu(x).contiguous()
    print(f"N{N} C{C} HW{HW}: torch relu+contiguous {bench(lambda: torch.relu(x).contiguous()):.1f} us, copy_ {bench(lambda: y.copy_(x)):.1f} us", flush=True)
    for yfirst in (0, 1):
        for tx, ty, w in ((64, 32, 4), (32, 64, 4), (64, 64, 4), (64, 64, 8), (32, 128, 4), (32, 128, 8), (16, 128, 4), (64, 128, 8), (128, 64, 8), (16, 64, 2), (32, 32, 4)):
            if ty > C: continue
            gx, gy = triton.cdiv(HW, tx), triton.cdiv(C, ty)
            grid = (gy, gx, N) if yfirst else (gx, gy, N)
            f = lambda: k_xy[grid](x, y, HW, C, tx, ty, yfirst, num_warps=w)
            f(); torch.cuda.synchronize(); assert torch.equal(y, ref)
            print(f"  yfirst {yfirst} tile {tx}x{ty} w{w}: {bench(f):.1f} us", flush=True)
