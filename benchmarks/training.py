"""Training steps (issue 20): eager, Inductor and kiln in one process - step time, first-step (compile) time, peak
memory, and how far each compiled run's loss and parameters drift from eager's.

    python -m benchmarks.training [--models mlp,gpt,resnet18,bert,llama] [--device cpu|cuda] [--threads 1]
                                  [--size small|full] [--steps 20] [--repeats 5] [--backends eager,inductor,kiln]
                                  [--autocast] [--compile-step] [--foreach] [--profile kiln,inductor] [--json F]

Backends: ``eager``, ``inductor``, ``kiln``, and ``inductor-ro``, ``kiln-ro`` (mode="reduce-overhead": CUDA graphs
over the forward and backward on a GPU); a kiln backend may carry kiln options, ``kiln-ro:gpu_column_reductions=true``
(``;`` between options), to A/B them in one process.

A step is what a training loop runs: ``zero_grad(set_to_none=True)``, forward, loss, backward, AdamW's
``step()`` (eager in every backend unless ``--compile-step``: then each compiled backend also compiles
``opt.step`` - the issue's "+ ``torch.compile(opt.step)``" column; ``--foreach``: AdamW's foreach implementation,
torch's default on a GPU, on the CPU too).  Each backend trains its own
copy of the model, from the same weights, on the same batches.  The first step (Dynamo, AOTAutograd and the
backend's compile of the forward and backward graphs, then the step) is the compile time; then ``--steps`` steps
in rounds of ``--repeats``, the backends interleaved step by step (each backend's i-th step on the same batch),
and the median step time per backend.  After the steps, each compiled backend's last loss and parameters
against eager's (``_drift``: the largest relative difference of any parameter, as a tensor and elementwise;
issue 20's bar: 1e-4 in fp32, 2e-2 with bf16 autocast).  Peak memory is the CUDA allocator's peak over a step
(GPU only).  ``--fp64-reference``: eager in float64 trains alongside on the same batches (untimed), and each run's
drift from it is printed too - eager's own float32 drift from the exact result is the yardstick for a compiled
run's.

Models (``--size full`` = the issue's anchors; ``small`` sizes the CPU can step in about a second):
- ``mlp``: 3 x (Linear 1024-4096-1024 + GELU), LayerNorm; batch 64; MSE (small: 256-1024, batch 32);
- ``gpt``: the suite's 4-layer GPT (d=768), batch 8 x 256 tokens; next-token cross-entropy (small: batch 2 x 64);
- ``resnet18``: batch 16 x 224 x 224, 1000 classes; cross-entropy (small: batch 4 x 96 x 96);
- ``bert``: transformers' BertForSequenceClassification (BERT-base, 2 labels), batch 16 x 128 right-padded tokens;
  cross-entropy (small: 4 layers of 256, batch 4 x 64);
- ``llama``: transformers' LlamaForCausalLM (4 layers of 512, 8 heads, 2 key/value heads, vocabulary 32000),
  batch 8 x 256; next-token cross-entropy (small: width 256, vocabulary 8192, batch 2 x 64).
Transformers models are built from configs with random weights and dropout off.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F

from benchmarks.ab_options import parse_options
from benchmarks.models import gpt, mlp, resnet18

BACKENDS = ["eager", "inductor", "kiln"]
MODELS = ("mlp", "gpt", "resnet18", "bert", "llama")
NOISE_GRADIENT = 1e-6  # an entry's gradient this far below the model's RMS gradient is rounding noise (_drift)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """Logits in at least float32 for the loss (bf16 autocast's are bf16; the float64 reference's stay float64)."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _double(xs: Any) -> Any:
    """The batch for the float64 reference: floating tensors in float64, the rest as they are."""
    if isinstance(xs, tuple):
        return tuple(_double(x) for x in xs)
    return xs.double() if isinstance(xs, torch.Tensor) and xs.is_floating_point() else xs


def _model(name: str, size: str, device: str) -> tuple[torch.nn.Module, Callable[[int], tuple], Callable]:
    """(model in train mode, ``batch(step) -> (inputs, target)``, ``loss(output, target)``)."""
    full = size == "full"
    if name == "mlp":
        dim, hidden, batch = (1024, 4096, 64) if full else (256, 1024, 32)
        model, _ = mlp(batch, device, dim=dim, hidden=hidden)

        def batches(step: int) -> tuple:
            g = torch.Generator().manual_seed(step)
            return (torch.randn(batch, dim, generator=g).to(device),), torch.randn(batch, dim, generator=g).to(device)
        return model.train(), batches, F.mse_loss
    if name == "gpt":
        batch, seq, vocab = (8, 256, 8192) if full else (2, 64, 8192)
        model, _ = gpt(batch, device, seq=seq, vocab=vocab)

        def batches(step: int) -> tuple:
            g = torch.Generator().manual_seed(step)
            ids = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(device)
            return (ids[:, :-1],), ids[:, 1:]

        def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(_wide(logits.flatten(0, 1)), target.flatten())
        return model.train(), batches, loss
    if name == "resnet18":
        batch, image = (16, 224) if full else (4, 96)
        model, _ = resnet18(batch, device)

        def batches(step: int) -> tuple:
            g = torch.Generator().manual_seed(step)
            return ((torch.randn(batch, 3, image, image, generator=g).to(device),),
                    torch.randint(0, 1000, (batch,), generator=g).to(device))
        return model.train(), batches, lambda out, target: F.cross_entropy(_wide(out), target)
    if name in ("bert", "llama"):
        return _transformers_model(name, full, device)
    raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}")


def _transformers_model(name: str, full: bool, device: str) -> tuple[torch.nn.Module, Callable[[int], tuple],
                                                                       Callable]:
    """A BERT fine-tuning step (sequence classification over right-padded batches) or a LLaMA-style decoder's
    language-model step, from transformers' model code with random weights (nothing downloaded).  Dropout off:
    the compiled runs' parameters are compared with eager's after the steps (issue 20 checks dropout apart)."""
    from kiln.testing.zoo import padding_mask, token_ids, transformers_module
    transformers = transformers_module()
    torch.manual_seed(0)
    if name == "bert":
        size = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072) if full \
            else dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
        batch, seq = (16, 128) if full else (4, 64)
        config = transformers.BertConfig(**size, num_labels=2, hidden_dropout_prob=0.0,
                                         attention_probs_dropout_prob=0.0)
        net = transformers.BertForSequenceClassification(config).to(device)

        def batches(step: int) -> tuple:
            g = torch.Generator().manual_seed(step)
            lengths = [seq - (7 * row) % (seq // 2) for row in range(batch)]  # right padding, row by row
            ids = token_ids(config.vocab_size, batch, seq, g, config.pad_token_id, lengths)
            return ((ids.to(device), padding_mask(batch, seq, lengths).to(device)),
                    torch.randint(0, 2, (batch,), generator=g).to(device))
        return _Logits(net, ("input_ids", "attention_mask")).train(), batches, \
            lambda out, target: F.cross_entropy(_wide(out), target)
    size = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                intermediate_size=1376, vocab_size=32000) if full else \
        dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=688, vocab_size=8192)
    batch, seq = (8, 256) if full else (2, 64)
    config = transformers.LlamaConfig(**size, max_position_embeddings=2 * seq, use_cache=False)
    net = transformers.LlamaForCausalLM(config).to(device)

    def lm_batches(step: int) -> tuple:
        g = torch.Generator().manual_seed(step)
        ids = torch.randint(3, config.vocab_size, (batch, seq + 1), generator=g).to(device)
        return (ids[:, :-1],), ids[:, 1:]

    def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(_wide(logits.flatten(0, 1)), target.flatten())
    return _Logits(net, ("input_ids",)).train(), lm_batches, lm_loss


class _Logits(torch.nn.Module):
    """A transformers model called with positional tensors, returning its logits."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.names, inputs))).logits


class Run:
    """One backend's copy of the model, its optimizer and its compiled callable."""

    def __init__(self, backend: str, model: torch.nn.Module, loss: Callable, device: str, autocast: bool,
                 compile_step: bool = False, foreach: bool | None = None):
        self.backend = backend
        self.model = copy.deepcopy(model)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, weight_decay=0.01, foreach=foreach)
        self.opt_step: Callable = self.opt.step
        self.loss_fn = loss
        self.device = device
        self.autocast = autocast
        if backend == "eager":
            self.fn: Callable = self.model
        else:
            # "kiln-ro": kiln in reduce-overhead mode; "kiln-ro:a=1;b=x": with kiln options (an A/B in one process)
            name, _, option_text = backend.partition(":")
            compiler, _, suffix = name.partition("-")
            mode = {"": "default", "ro": "reduce-overhead"}[suffix]
            if compiler == "kiln":
                import kiln
                options = parse_options(option_text)
                compile_fn: Callable = lambda f: kiln.compile(f, mode=mode, **options)  # noqa: E731
            else:
                compile_fn = lambda f: torch.compile(f, backend=compiler, mode=mode)  # noqa: E731
            self.fn = compile_fn(self.model)
            if compile_step:
                self.opt_step = compile_fn(self.opt.step)
        self.times: list[float] = []
        self.last_loss = float("nan")
        self.losses: list[float] = []  # (every step's, the first included: --losses)
        self.peak_mib = float("nan")

    def step(self, inputs: tuple, target: torch.Tensor) -> float:
        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        sync()
        start = time.perf_counter()
        if self.backend.startswith("inductor-ro"):  # (cudagraph trees: a new step begins - else a compiled
            torch.compiler.cudagraph_mark_step_begin()  # opt.step reading the last replay's outputs is refused)
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.autocast):
            loss = self.loss_fn(self.fn(*inputs), target)
        loss.backward()
        self.opt_step()
        sync()
        seconds = time.perf_counter() - start
        self.last_loss = loss.item()
        self.losses.append(self.last_loss)
        if self.device == "cuda":
            self.peak_mib = torch.cuda.max_memory_allocated() / 2 ** 20
        return seconds


def _drift(run: Run, eager: Run) -> tuple[float, float, list[str]]:
    """How far the parameters moved from eager's: the largest over parameters of ``|p - q| / |q|`` (2-norms of
    the whole tensor: the relative error of the parameter), and of ``max|p - q| / max|q|`` (elementwise, stricter:
    AdamW turns noise-level gradient differences of entries whose gradient is ~0 into whole ``lr``-sized steps),
    and the names of the parameters with entries left out: those whose eager gradient (last step) is at rounding
    level, below ``NOISE_GRADIENT`` x the root mean square of every parameter entry's, but not zero (entries
    whose gradient is exactly zero - embedding rows no token used - are left out too, unnamed: they agree).
    Their exact gradient is zero, or lost in rounding - an attention key's bias shifts every score of a query
    alike, which softmax ignores - so AdamW steps each by the sign of rounding noise and no two implementations
    agree: BERT's key biases (gradient norm 2e-10 against 1e-2: drift 1-2), the key third of a fused ``qkv`` bias
    (the suite GPT: 6e-3 for the whole bias)."""
    named = list(eager.model.named_parameters())
    grads = [q.grad.detach().double() if q.grad is not None else torch.zeros(q.shape, dtype=torch.float64,
                                                                              device=q.device) for _, q in named]
    count = sum(g.numel() for g in grads)
    rms = (sum(g.square().sum().item() for g in grads) / max(count, 1)) ** 0.5
    norm = elementwise = 0.0
    left_out = []
    for p, (name, q), g in zip(run.model.parameters(), named, grads):
        kept = g.abs() >= NOISE_GRADIENT * rms
        if bool(((~kept) & (g != 0)).any()):  # (named only where noise is left out: exact zeros agree anyway)
            left_out.append(name)
        if not kept.any():
            continue
        d, q = (p.detach().double() - q.detach().double())[kept], q.detach().double()[kept]
        norm = max(norm, (d.norm() / q.norm().clamp_min(1e-30)).item())
        elementwise = max(elementwise, (d.abs().max() / q.abs().max().clamp_min(1e-30)).item())
    return norm, elementwise, left_out


def _grads(model: torch.nn.Module) -> list[torch.Tensor | None]:
    return [p.grad.detach().double().clone() if p.grad is not None else None for p in model.parameters()]


def _grad_error(grads: list, reference: list, names: list[str] | None = None) -> tuple[float, float, list]:
    """First-step gradients against a reference run's (``--grads``): the largest over parameters of the relative
    error ``|g - r| / |r|`` (2-norms), and the same over the whole gradient vector - what the step's update sees
    before an optimizer turns small differences into sign-sized steps (AdamW's first step is ``lr * sign(g)``).
    Parameters whose reference gradient norm is below 1e-6 of the largest are left out (rounding-level
    gradients, see ``_drift``).  Third: the three parameters with the largest share of the whole error, as
    (name, relative error, share) - where a wrong gradient lies."""
    names = names or [str(k) for k in range(len(grads))]
    triples = [(name, g, r) for name, g, r in zip(names, grads, reference) if g is not None and r is not None]
    top = max((r.norm().item() for _, _, r in triples), default=0.0)
    worst = total_diff = total_ref = 0.0
    shares = []
    for name, g, r in triples:
        n = r.norm().item()
        d = (g - r).norm().item()
        total_diff += d * d
        total_ref += n * n
        shares.append((d * d, name, d / max(n, 1e-300)))
        if n > 1e-6 * top:
            worst = max(worst, d / n)
    largest = [(name, rel, sq / max(total_diff, 1e-300)) for sq, name, rel in sorted(shares, reverse=True)[:3]]
    return worst, (total_diff / max(total_ref, 1e-300)) ** 0.5, largest


def bench(name: str, args: argparse.Namespace) -> dict[str, Any]:
    from kiln.report import mark, reports_since
    model, batches, loss = _model(name, args.size, args.device)
    backends = args.backends.split(",")
    runs = [Run(b, model, loss, args.device, args.autocast, args.compile_step, True if args.foreach else None)
            for b in backends]
    # the float64 reference (--fp64-reference): eager in float64 on the same batches, untimed - how far each run,
    # eager's float32 included, strays from the exact result, against how far they stray from each other
    ref = Run("eager", copy.deepcopy(model).double(), loss, args.device, False, False,
              True if args.foreach else None) if args.fp64_reference else None
    compile_s: dict[str, float] = {}
    position = mark()
    inputs, target = batches(0)
    first_grads = {}  # (--grads: each run's gradients of the first step, before any update)
    for run in runs:  # the first step: compiles included
        torch._dynamo.reset() if run.backend == "eager" else None
        compile_s[run.backend] = run.step(inputs, target)
        if args.grads:
            first_grads[run.backend] = _grads(run.model)
    if ref is not None:
        ref.step(_double(inputs), _double(target))
        if args.grads:
            first_grads["fp64"] = _grads(ref.model)
    kiln_reports = [r for r in reports_since(position)]
    for step in range(1, args.steps + 1):
        inputs, target = batches(step)
        order = runs[step % len(runs):] + runs[:step % len(runs)]  # (rotated: no backend always follows another)
        for run in order:
            run.times.append(run.step(inputs, target))
        if ref is not None:
            ref.step(_double(inputs), _double(target))
    eager = next((r for r in runs if r.backend == "eager"), None)
    rows = {}
    names = [name for name, _ in model.named_parameters()]
    grad_errors = {b: {against: _grad_error(g, first_grads[against], names) for against in ("eager", "fp64")
                       if against in first_grads and against != b}
                   for b, g in first_grads.items() if b != "fp64"}
    for run in runs:
        median = statistics.median(run.times)
        rows[run.backend] = {
            "step_ms": median * 1e3, "compile_s": compile_s[run.backend], "peak_mib": run.peak_mib,
            "loss": run.last_loss,
            "param_drift": _drift(run, eager) if eager is not None and run is not eager else (0.0, 0.0, []),
            "vs_eager": (statistics.median(eager.times) / median) if eager is not None else float("nan"),
            "fp64_drift": _drift(run, ref) if ref is not None else None,
            "losses": run.losses,
            "grad_error": grad_errors.get(run.backend),
        }
    if ref is not None:
        rows["fp64"] = {"losses": ref.losses}
    rows["kiln_graphs"] = [{"name": r.name, "training": r.training, "fallback": r.fallback,
                            "kernels": len(r.kernels or []), "externs": len(r.externs or [])} for r in kiln_reports]
    # (profiled after the drift is taken: the profiled steps move only the profiled runs' parameters)
    rows["profiles"] = [_profile(name, run, batches(args.steps + 1), args.profile_rows, args.profile_ops)
                        for run in runs if run.backend in args.profile.split(",")]
    rows["profiles"] += [_host_profile(name, run, batches(args.steps + 1), args.profile_rows)
                         for run in runs if run.backend in args.cprofile.split(",")]
    return rows


def _profile(model: str, run: Run, batch: tuple, rows: int, ops: int = 0, steps: int = 3) -> str:
    """``steps`` steps of ``run`` under torch.profiler: device time per kernel name (CPU time on the CPU), the
    largest first, and the step's device total against its wall time - where a backend's step goes, the same
    way for every backend (``--profile kiln,inductor``).  ``ops``: also the ``ops`` ATen copies called most often
    on the host, by input shapes (in default mode: the copies a compiled graph makes around its kernels)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.device == "cuda" else [])
    inputs, target = batch
    with profile(activities=activities, record_shapes=ops > 0) as prof:
        wall = sum(run.step(inputs, target) for _ in range(steps))
    use_device = run.device == "cuda"
    totals: dict[str, list[float]] = {}
    for e in prof.events():
        if use_device and e.device_type.name != "CUDA" or not use_device and e.cpu_parent is not None:
            continue
        if e.name.startswith(("Optimizer.", "## ")):  # (range annotations - the optimizer's, Inductor's graphs' -
            continue                                     # not kernels)
        t = e.device_time if use_device else e.cpu_time
        entry = totals.setdefault(e.name, [0.0, 0])
        entry[0] += t
        entry[1] += 1
    device_total = sum(t for t, _ in totals.values())
    lines = [f"\n{model} / {run.backend}: {steps} steps, wall {wall / steps * 1e3:.2f} ms a step, "
             f"{'GPU' if use_device else 'CPU'} kernels {device_total / steps / 1e3:.2f} ms a step",
             "| kernel | ms a step | calls a step | share |", "|---|---|---|---|"]
    for kernel, (t, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:rows]:
        lines.append(f"| {kernel[:90]} | {t / steps / 1e3:.3f} | {count / steps:.0f} | "
                     f"{t / max(device_total, 1e-9):.1%} |")
    if ops:
        copies = [a for a in prof.key_averages(group_by_input_shape=True)
                  if a.key in ("aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy")]
        lines += ["| host op | input shapes | calls a step |", "|---|---|---|"]
        lines += [f"| {a.key} | {str(a.input_shapes)[:100]} | {a.count / steps:.0f} |"
                  for a in sorted(copies, key=lambda a: -a.count)[:ops]]
    return "\n".join(lines)


def _host_profile(model: str, run: Run, batch: tuple, rows: int, steps: int = 20) -> str:
    """``steps`` steps of ``run`` under cProfile (``--cprofile``): where the host's time goes - the Python
    functions with the most time of their own, and the step's wall time without the profiler.  On the GPU a
    step whose wall time exceeds its kernels' is host-bound; this says by what."""
    import cProfile
    import io
    import pstats
    inputs, target = batch
    plain = statistics.median(run.step(inputs, target) for _ in range(steps))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        run.step(inputs, target)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(rows)
    stats.sort_stats("cumulative").print_stats(rows)
    header = f"\n{model} / {run.backend}: host profile of {steps} steps (wall {plain * 1e3:.2f} ms a step unprofiled)"
    return "\n".join([header, *(line for line in out.getvalue().splitlines() if line.strip())])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--size", default="small", choices=("small", "full"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--autocast", action="store_true", help="bf16 autocast around forward and loss")
    ap.add_argument("--compile-step", action="store_true", help="compiled backends also compile opt.step")
    ap.add_argument("--foreach", action="store_true", help="AdamW's foreach implementation (a GPU's default)")
    ap.add_argument("--fp64-reference", action="store_true",
                    help="also train eager in float64 (untimed) and give each run's drift from it")
    ap.add_argument("--profile", default="", help="backends whose steps to profile: kernel times (e.g. kiln,inductor)")
    ap.add_argument("--cprofile", default="", help="backends whose host time to profile with cProfile (e.g. "
                    "kiln-ro,inductor-ro): the functions with the most time of their own")
    ap.add_argument("--profile-rows", type=int, default=25)
    ap.add_argument("--profile-ops", type=int, default=0, help="with --profile: the N host copies called most often")
    ap.add_argument("--grads", action="store_true",
                    help="compare each run's first-step gradients with eager's (and the float64 reference's)")
    ap.add_argument("--losses", action="store_true", help="print every backend's loss at every step")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    print("| model | backend | step ms | vs eager | first step s | peak MiB | last loss | param drift (norm / max) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        rows = bench(name, args)
        results[name] = rows
        for backend in args.backends.split(","):
            r = rows[backend]
            print(f"| {name} | {backend} | {r['step_ms']:.2f} | {r['vs_eager']:.2f} | {r['compile_s']:.2f} | "
                  f"{r['peak_mib']:.0f} | {r['loss']:.5f} | {r['param_drift'][0]:.1e} / {r['param_drift'][1]:.1e} |",
                  flush=True)
        if args.fp64_reference:
            drifts = [f"{b} {rows[b]['fp64_drift'][0]:.1e} / {rows[b]['fp64_drift'][1]:.1e}"
                      for b in args.backends.split(",")]
            print("  drift from the float64 reference (norm / max): " + ", ".join(drifts))
        if args.grads:
            for b in args.backends.split(","):
                errors = rows[b]["grad_error"] or {}
                print(f"  first-step gradients {b}: " + ", ".join(
                    f"vs {k} worst {w:.1e} / all {a:.1e} (most: " + ", ".join(
                        f"{name} {rel:.1e} {share:.0%}" for name, rel, share in largest) + ")"
                    for k, (w, a, largest) in errors.items()))
        if args.losses:
            for b in args.backends.split(",") + (["fp64"] if args.fp64_reference else []):
                print(f"  losses {b}: " + " ".join(f"{x:.4f}" for x in rows[b]["losses"]))
        left_out = sorted({n for b in args.backends.split(",") for n in rows[b]["param_drift"][2]})
        if left_out:
            print(f"  drift leaves out entries of {len(left_out)} parameter(s) whose eager gradient is at rounding "
                  f"level: {', '.join(left_out[:4])}{' ...' if len(left_out) > 4 else ''}")
        for g in rows["kiln_graphs"]:
            if g["fallback"]:
                print(f"  kiln graph {g['name']!r} ({g['training'] or 'inference'}) ran eagerly: {g['fallback']}")
        for text in rows.pop("profiles"):
            print(text, flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
