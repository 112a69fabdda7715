"""Decoding with Hugging Face ``generate`` (issue 19, point 7): time per token, eager and compiled backends in one
process, on the same prompt.

    python -m benchmarks.hf_decode [--backends kiln,inductor,kiln-ro] [--layers 4] [--tokens 32]
                                   [--cache dynamic|static] [--device cpu|cuda] [--dtype fp32|bf16]

A GPT-2 (random weights, d=768, vocab 8192) greedy-decodes ``--tokens`` tokens after a 32-token prompt; each
backend compiles ``model.forward`` (torch's default ``dynamic=None``: the decode steps' growing cache makes the
second step's graph symbolic), is warmed up by one ``generate``, then timed over ``--repeats`` generates (median, 5
by default).
Tokens are checked against eager's.  ``-ro`` after a backend's name: ``mode="reduce-overhead"``.  On the CPU one
thread by default; on the GPU the time of a generate includes its synchronization (``generate`` reads each
step's token on the host anyway).
"""
from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", default="kiln,inductor")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    # (5: under reduce-overhead kiln records a size's CUDA graph at its second sighting, so with a warm-up of 8
    # tokens the first two timed generates record - the median of 3 was a recording one, session 34's 5.63 ms)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cache", default="dynamic", choices=["dynamic", "static"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    ap.add_argument("--profile", type=int, default=0,
                    help="after timing, one generate per backend under torch.profiler: its N ops and kernels with "
                         "the most self time, host and device (where a token's time goes)")
    args = ap.parse_args()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    config = GPT2Config(n_layer=args.layers, n_embd=768, n_head=12, vocab_size=8192, n_positions=512)
    model = GPT2LMHeadModel(config).eval().to(device=args.device, dtype=dtype)
    prompt = torch.randint(0, 8192, (1, 32)).to(args.device)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    extra: dict[str, Any] = {"cache_implementation": "static"} if args.cache == "static" else {}
    if args.cache == "static" and hasattr(model.generation_config, "disable_compile"):
        # with a static cache on a GPU, transformers compiles the forward itself (Inductor, CUDA graphs) unless
        # told not to: "eager" would be Inductor's reduce-overhead mode (session 35, H100: 1.33 ms a token)
        extra["disable_compile"] = True
    forward = model.forward

    def run(fn: Callable[..., Any]) -> tuple[float, torch.Tensor]:
        model.forward = fn
        with torch.inference_mode():
            model.generate(prompt, max_new_tokens=8, do_sample=False, **extra)  # (compiles)
            times = []
            for _ in range(args.repeats):
                sync()
                start = time.perf_counter()
                out = model.generate(prompt, max_new_tokens=args.tokens, do_sample=False, **extra)
                sync()
                times.append(time.perf_counter() - start)
            if args.profile:
                _profile(lambda: model.generate(prompt, max_new_tokens=args.tokens, do_sample=False, **extra),
                         args.profile, args.device)
        return statistics.median(times) * 1e3 / args.tokens, out

    eager_ms, want = run(forward)
    print(f"eager: {eager_ms:.2f} ms per token", flush=True)
    for label in args.backends.split(","):
        backend, *flags = label.split("-")
        kwargs = {"mode": "reduce-overhead"} if "ro" in flags else {}
        if backend == "kiln":
            import kiln  # noqa: F401  (registers the backend)
        torch._dynamo.reset()
        from torch._dynamo.utils import counters
        from kiln.report import mark, reports_since
        position, before = mark(), counters["stats"]["unique_graphs"]
        ms, got = run(torch.compile(forward, backend=backend, **kwargs))
        graphs = counters["stats"]["unique_graphs"] - before
        eager = sum(r.fallback is not None for r in reports_since(position))  # (kiln's: graphs it ran eagerly)
        print(f"{label}: {ms:.2f} ms per token ({eager_ms / ms:.2f}x eager), same tokens: {torch.equal(got, want)}, "
              f"{graphs} graph(s)" + (f", {eager} run eagerly" if backend == "kiln" else ""), flush=True)
    model.forward = forward


def _profile(generate: Callable[[], Any], top: int, device: str) -> None:
    """One ``generate`` under torch.profiler: the ``top`` entries by self host time, then by self device time."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        generate()
    table = prof.key_averages()
    print(table.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=70))
    if device == "cuda":
        print(table.table(sort_by="self_cuda_time_total", row_limit=top, max_name_column_width=70))


if __name__ == "__main__":
    main()
