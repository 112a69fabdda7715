"""The first call of each attention backend at a new shape, against its second ([Note: cuDNN attention's first
call] in kiln/ir/extern.py): cuDNN builds an execution plan per shape, the memory-efficient kernel does not.

    python -m benchmarks.attention_first_call [--shapes 1x8x64x64,1x8x80x64,2x8x64x64] [--dtype bf16]

Each call is timed alone between two synchronizations (so it includes launch latency: compare first calls with
second calls, not backends' steady speed - benchmarks/zoo.py measures that).  The process's first cuDNN call also
loads and initializes the library: the second shape's first call is the per-shape cost.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F


def _timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shapes", default="1x8x64x64,1x8x80x64,2x8x64x64", help="B x H x T x D, comma-separated")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    args = p.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention
    for text in args.shapes.split(","):
        b, h, t, d = (int(v) for v in text.split("x"))
        q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=dtype) for _ in range(3))
        mask = torch.zeros(b, 1, 1, t, device="cuda", dtype=dtype)  # a key padding mask, additive
        calls = {
            "cudnn": lambda: cudnn(q, k, v, mask, False, 0.0, False, False),
            "efficient": lambda: efficient(q, k, v, mask.expand(b, h, t, t), False),
            "F.scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        }
        for name, fn in calls.items():
            first, second = _timed(fn), _timed(fn)
            print(f"{text} {name:32s} first call {first:8.2f} ms   second {second:6.2f} ms")


if __name__ == "__main__":
    main()
