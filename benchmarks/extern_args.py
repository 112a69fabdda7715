"""The ATen calls a compiled model makes, with their operands' layouts: shape, strides, storage offset and the
address's alignment (a power of two up to 256 bytes; cuBLASLt picks its kernels by it), for kiln and Inductor
side by side - two backends calling one op on one shape can still get different library kernels.

    python -m benchmarks.extern_args --model mha_cross --device cpu --ops baddbmm,bmm

Known gap: on the H200 (torch 2.11, 2026-12-03) the dispatch mode saw no call of either compiled model on CUDA
(roberta fp32: "0 calls" for both), cause not found; it works on the CPU.  A run that records nothing says so.
"""
from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode


def alignment(t: torch.Tensor) -> int:
    address = t.data_ptr()
    for a in (256, 128, 64, 32, 16, 8, 4, 2):
        if address % a == 0:
            return a
    return 1


def describe(x: Any) -> str:
    if isinstance(x, torch.Tensor):
        return (f"{str(x.dtype).replace('torch.', '')}{list(x.shape)} s{list(x.stride())} o{x.storage_offset()} "
                f"a{alignment(x)}")
    return repr(x)


class Record(TorchDispatchMode):
    def __init__(self, ops: set[str]) -> None:
        super().__init__()
        self.ops, self.calls, self.first = ops, Counter(), {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.overloadpacket.__name__ in self.ops:
            sig = (f"{func} (" + ", ".join(describe(a) for a in args)
                   + "".join(f", {k}={describe(v)}" for k, v in kwargs.items()) + f") -> {describe(out)}")
            self.calls[sig] += 1
            self.first.setdefault(sig, (func, args, kwargs))
        return out


def fresh(x: Any) -> Any:
    """A tensor operand moved to a new allocation with the same strides (so 512-byte aligned, offset 0)."""
    if not isinstance(x, torch.Tensor):
        return x
    out = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
    return out.copy_(x)


def main() -> None:
    import kiln
    from benchmarks.gpu_memory import DTYPES
    from benchmarks.runner import set_tf32
    from benchmarks.zoo import builder
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="roberta")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="fp32")
    p.add_argument("--ops", default="addmm,mm,bmm,baddbmm")
    args = p.parse_args()
    set_tf32(args.device, args.dtype, False)
    dtype = getattr(torch, DTYPES[args.dtype])
    model, inputs = builder("sdpa")(args.model, device=args.device, dtype=dtype)
    model.eval()
    for label, fn in (("kiln", kiln.compile(model)), ("inductor", torch.compile(model))):
        with torch.inference_mode():
            fn(*inputs)
            fn(*inputs)
            record = Record(set(args.ops.split(",")))
            with record:
                fn(*inputs)
        print(f"\n{args.model} {label}: {sum(record.calls.values())} calls")
        if not record.calls:
            print("  (none seen: the compiled call's ATen ops did not reach this dispatch mode - see the docstring)")
        for sig, n in sorted(record.calls.items(), key=lambda kv: -kv[1]):
            print(f"  x{n:<3d} {sig}")
            if args.device == "cuda":  # the call as made, then on operands in fresh allocations
                from benchmarks.transpose_tiles import device_us
                func, fargs, fkwargs = record.first[sig]
                with torch.inference_mode():
                    as_made = device_us(lambda: func(*fargs, **fkwargs))
                    moved = [fresh(a) for a in fargs]
                    realigned = device_us(lambda: func(*moved, **fkwargs))
                print(f"        {as_made:8.1f} us as called, {realigned:8.1f} us on fresh aligned copies")
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
