"""Host time against device time per call on the GPU, kiln's default mode against Inductor's, per model: is a call
bound by the host (Python, launches) or by the device (kernels)?

- ``device``: the kernels' time per call (torch.profiler, summed), and how many kernels a call launches;
Backends: eager, kiln (default mode), Inductor (default mode), and kiln-tl (kiln with Triton's own launcher,
``gpu_static_launch=False``).

- ``host``: the host's time to issue one call while the GPU is kept busy (a long ``torch.cuda._sleep`` queued
  first, so no launch waits for the device): the runtime's own cost, launches included;
- ``wall``: calls back to back, synchronized at the end only (what a serving loop sees): about
  max(host, device) when the two overlap.

Then the cost of one launch of a small Triton kernel by each way kiln can launch it (``--launches``).

    python -m benchmarks.host_time --models seed,mlp,gpt,resnet18 --dtype bf16 [--launches]
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch


def device_kernels(fn, inputs, calls: int = 5) -> list[tuple[str, float, int]]:
    """(kernel name, device us per call, launches per call) for each kernel a call runs (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            fn(*inputs)
        torch.cuda.synchronize()
    out = []
    for e in p.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            out.append((e.key, t / calls, e.count // calls))
    return sorted(out, key=lambda row: -row[1])


def device_us(fn, inputs, calls: int = 5) -> tuple[float, int]:
    rows = device_kernels(fn, inputs, calls)
    return sum(r[1] for r in rows), sum(r[2] for r in rows)


def host_us(fn, inputs, kernels: int) -> float:
    """Microseconds to issue one call behind a GPU kept busy (median of 5 rounds of a few calls: fewer than the
    driver's queue of about 1000 launches holds, else a launch waits for the device)."""
    calls = max(2, min(20, 600 // max(kernels, 1)))
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        torch.cuda._sleep(int(2e9))  # ~1 s of device time at H200 clocks: launches only queue behind it
        start = time.perf_counter()
        for _ in range(calls):
            fn(*inputs)
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(rounds)


def wall_us(fn, inputs, calls: int = 30) -> float:
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(*inputs)
        torch.cuda.synchronize()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds)


def models(names: list[str], dtype: torch.dtype, cprofile: bool = False, dump: str = "", kernels: int = 0) -> None:
    import kiln
    from benchmarks import models as suite
    print(f"{'model':<14}{'backend':<10}{'kernels':>8}{'device us':>11}{'host us':>10}{'wall us':>10}")
    for name in names:
        model, inputs = suite.build(name, device="cuda", dtype=dtype)
        fns = {"eager": model, "kiln": kiln.compile(model), "inductor": torch.compile(model),
               "kiln-tl": kiln.compile(model, gpu_static_launch=False)}  # kiln with Triton's launcher
        with torch.inference_mode():
            for fn in fns.values():
                for _ in range(3):
                    fn(*inputs)
            for label, fn in fns.items():
                dev, kernels = device_us(fn, inputs)
                print(f"{name:<14}{label:<10}{kernels:>8}{dev:>11.1f}{host_us(fn, inputs, kernels):>10.1f}"
                      f"{wall_us(fn, inputs):>10.1f}", flush=True)
            if cprofile:
                host_profile(fns["kiln"], inputs)
            for label in ("inductor", "kiln") if kernels else ():
                print(f"  {label}: the {kernels} longest kernels per call (us, launches)")
                for key, us, count in device_kernels(fns[label], inputs)[:kernels]:
                    print(f"    {us:8.1f} {count:3d}  {key[:100]}")
            if dump:
                from kiln.report import reports
                wrapper = [r.wrapper for r in reports() if getattr(r, "wrapper", "")]
                with open(f"{dump}/{name}_wrapper.py", "w") as f:
                    f.write(wrapper[-2] if len(wrapper) > 1 else "")  # the default-launcher kiln's
        torch._dynamo.reset()


def host_profile(fn, inputs, calls: int = 50, top: int = 14) -> None:
    """Where kiln's host time goes (cProfile over ``calls`` calls, by own time; cProfile's own cost inflates
    every row, so read the shares, not the microseconds)."""
    import cProfile
    import pstats
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn(*inputs)
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    total = sum(v[2] for v in stats.stats.values())
    print(f"  kiln host profile: {total / calls * 1e6:.0f} us per call under cProfile")
    for (path, line, func), (cc, nc, tt, ct, _) in rows:
        where = f"{path.rsplit('/', 1)[-1]}:{line}({func})"
        print(f"    {tt / calls * 1e6:8.1f} us {nc // calls:5d} calls  {where[:90]}")


def launches() -> None:
    """One launch of a one-block Triton kernel, by each path: microseconds of host time each."""
    import triton
    import triton.language as tl

    from kiln.runtime import gpu_launch

    @triton.jit
    def add_one(x, y, XBLOCK: tl.constexpr):
        i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        tl.store(y + i, tl.load(x + i) + 1)

    x = torch.randn(128, device="cuda")
    y = torch.empty_like(x)
    compiled = add_one.warmup(x, y, XBLOCK=128, grid=(1,))
    add_one[(1,)](x, y, XBLOCK=128)
    runner = compiled[(1, 1, 1)]
    paths = {"jit entry fn[grid](...)": lambda: add_one[(1,)](x, y, XBLOCK=128),
             "compiled[grid](...) (Triton's launcher)": lambda: runner(x, y, 128)}
    if gpu_launch.available():
        record = gpu_launch.record(compiled, (1, 1, 1), [0, 1])
        one = gpu_launch.Launch([record], ["add_one"], lambda tensors: None).call
        ten = gpu_launch.Launch([record] * 10, ["add_one"] * 10, lambda tensors: None).call
        stream = gpu_launch.stream_getter(x.device)
        paths["kiln's launcher (as the generated call issues it)"] = lambda: one(stream(), x, y)
        paths["kiln's launcher, 10 kernels per call (per kernel)"] = lambda: ten(stream(), x, y)
        torch.cuda.synchronize()
        expected = x + 1
        y.zero_()
        assert one(stream(), x, y) == 0
        torch.cuda.synchronize()
        assert torch.equal(y, expected), "kiln's launcher computed a wrong result"
    print(f"\nhost time per launch (GPU kept busy), {torch.cuda.get_device_name()}:")
    for label, fn in paths.items():
        per = 10 if "10 kernels" in label else 1
        rounds = []
        for _ in range(5):
            torch.cuda.synchronize()
            torch.cuda._sleep(int(1e9))
            start = time.perf_counter()
            for _ in range(600 // per):
                fn()
            rounds.append((time.perf_counter() - start) / (600 // per * per) * 1e6)
            torch.cuda.synchronize()
        print(f"  {statistics.median(rounds):7.2f} us  {label}")


def _host_each(paths: dict[str, Callable[[], Any]], count: int = 200) -> None:
    for label, fn in paths.items():
        fn()
        rounds = []
        for _ in range(5):
            torch.cuda.synchronize()
            torch.cuda._sleep(int(1e9))
            start = time.perf_counter()
            for _ in range(count):
                fn()
            rounds.append((time.perf_counter() - start) / count * 1e6)
            torch.cuda.synchronize()
        print(f"  {statistics.median(rounds):7.2f} us  {label}")


def externs(dtype: torch.dtype) -> None:
    """Host time of the calls a generated GPU call makes besides launches, each way it could make them: a
    ResNet-18 3x3 convolution (channels-last, no bias) through ATen's dispatcher entry or cuDNN's op, an addmm
    into an out tensor, allocations and views."""
    aten = torch.ops.aten
    x = torch.randn(1, 64, 56, 56, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
    w = torch.randn(64, 64, 3, 3, device="cuda", dtype=dtype).contiguous(memory_format=torch.channels_last)
    w_nchw = w.contiguous()
    a, b, bias = (torch.randn(256, 768, device="cuda", dtype=dtype), torch.randn(768, 768, device="cuda", dtype=dtype),
                  torch.randn(768, device="cuda", dtype=dtype))
    out = torch.empty(256, 768, device="cuda", dtype=dtype)
    conv = aten.convolution.default
    cudnn = aten.cudnn_convolution.default
    cudnn_flags = torch.backends.cudnn
    buf = torch.empty(257 * 768, device="cuda", dtype=dtype)  # (room for the offset view)
    cuda = torch.device("cuda")
    paths = {
        "aten.convolution.default (OpOverload), NHWC weight": lambda: conv(x, w, None, [1, 1], [1, 1], [1, 1], False,
                                                                           [0, 0], 1),
        "aten.convolution.default, NCHW weight (converted in the call)": lambda: conv(
            x, w_nchw, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        "torch.convolution (C binding)": lambda: torch.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False,
                                                                   [0, 0], 1),
        "aten.cudnn_convolution.default": lambda: cudnn(x, w, [1, 1], [1, 1], [1, 1], 1, False, False, True),
        "aten.cudnn_convolution + flags read per call": lambda: cudnn(
            x, w, [1, 1], [1, 1], [1, 1], 1, cudnn_flags.benchmark, cudnn_flags.deterministic,
            cudnn_flags.allow_tf32),
        "aten.addmm.out (OpOverloadPacket)": lambda: aten.addmm.out(bias, a, b, out=out),
        "torch.addmm(out=)": lambda: torch.addmm(bias, a, b, out=out),
        "torch.addmm (allocates its result)": lambda: torch.addmm(bias, a, b),
        "torch.mm(out=)": lambda: torch.mm(a, b, out=out),
        "torch.empty_strided(shape, strides, dtype=, device=)": lambda: torch.empty_strided(
            (256, 768), (768, 1), dtype=dtype, device=cuda),
        "torch.empty(shape, dtype=, device=)": lambda: torch.empty((256, 768), dtype=dtype, device=cuda),
        "t.as_strided(shape, strides, t.storage_offset())": lambda: buf.as_strided((256, 768), (768, 1),
                                                                                   buf.storage_offset()),
        "t.as_strided(shape, strides)": lambda: buf.as_strided((256, 768), (768, 1)),
        "t.as_strided(shape, strides, 768)": lambda: buf.as_strided((256, 768), (768, 1), 768),
        "t.view(shape)": lambda: buf.view(257, 768),
        "t.stride() != (...)": lambda: buf.stride() != (1,),
    }
    paths.update(_attention_paths(dtype))
    print(f"\nhost time per library call and per tensor op (GPU kept busy), {dtype}:")
    _host_each(paths)


def _attention_paths(dtype: torch.dtype, T: int = 37) -> dict[str, Callable[[], Any]]:
    """Causal attention as the suite's GPT calls it (batch 1, 12 heads, ``T`` queries, head size 64, Q/K/V strided
    views of one QKV product), through each entry ATen has: the composite (which picks a backend per call) and
    the backends' own ops."""
    from kiln.ir.extern import attention_efficient_first
    aten = torch.ops.aten
    qkv = torch.randn(T, 3 * 768, device="cuda", dtype=dtype)
    q, k, v = (qkv.as_strided((1, 12, T, 64), (T * 2304, 64, 2304, 1), i * 768) for i in range(3))
    chosen = torch._fused_sdp_choice(q, k, v, is_causal=True, scale=0.125)
    paths = {
        f"aten.scaled_dot_product_attention.default (composite; picks backend #{chosen})":
            lambda: aten.scaled_dot_product_attention.default(q, k, v, is_causal=True, scale=0.125),
        "torch._C._nn.scaled_dot_product_attention": lambda: torch._C._nn.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=0.125),
        "aten._scaled_dot_product_flash_attention.default": lambda: aten._scaled_dot_product_flash_attention.default(
            q, k, v, 0.0, True, False, scale=0.125),
        "torch._scaled_dot_product_flash_attention (C binding)": lambda: torch._scaled_dot_product_flash_attention(
            q, k, v, 0.0, True, False, scale=0.125),
        "torch._scaled_dot_product_efficient_attention (C binding)":
            lambda: torch._scaled_dot_product_efficient_attention(q, k, v, None, False, 0.0, True, scale=0.125),
        "torch._scaled_dot_product_cudnn_attention (C binding)": lambda: torch._scaled_dot_product_cudnn_attention(
            q, k, v, None, False, 0.0, True, False, scale=0.125),
        "kiln's entry (ir/extern.py attention_efficient_first)": lambda: attention_efficient_first(
            q, k, v, is_causal=True, scale=0.125),
    }
    out = {}
    for label, fn in paths.items():
        try:
            fn()
            out[label] = fn
        except Exception as e:  # noqa: BLE001 - a backend this build or GPU lacks
            print(f"  (skipped: {label}: {type(e).__name__}: {str(e)[:80]})")
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="seed,mlp,gpt,resnet18")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--launches", action="store_true")
    p.add_argument("--externs", action="store_true", help="host time of library calls, allocations, views")
    p.add_argument("--cprofile", action="store_true", help="also where kiln's host time goes, per model")
    p.add_argument("--kernels", type=int, default=0, help="list each model's N longest kernels, Inductor and kiln")
    p.add_argument("--dump", default="", help="a folder to write kiln's generated call of each model into")
    args = p.parse_args()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    if args.launches:
        launches()
    if args.externs:
        externs(dtype)
        from kiln.library.gpu_matmul.tune import time_on_device
        for T in (37, 256, 1024):
            print(f"\ndevice time of attention, {T} queries (CUDA graph of 10 calls, median):")
            for label, fn in _attention_paths(dtype, T).items():
                print(f"  {time_on_device(fn)[0] * 1e6:7.2f} us  {label}")
    if args.models:
        models(args.models.split(","), dtype, args.cprofile, args.dump, args.kernels)


if __name__ == "__main__":
    main()
