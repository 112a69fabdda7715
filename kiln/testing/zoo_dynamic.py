"""The zoo with dynamic shapes: each model compiled once with ``dynamic=True`` and called at other sequence lengths
and batch sizes, every output compared with eager's (issue 19: "a dynamic variant of each zoo model").

    python -m kiln.testing.zoo_dynamic                      # every zoo model, CI sizes
    python -m kiln.testing.zoo_dynamic --models bert,resnet --size full

Variants of a model's inputs (``variants``), made from the inputs ``zoo.build`` gives:

- **shorter**: every dimension of the sequence length (the longest dimension of the integer inputs for text
  models, the query length of torch.nn's modules) cut to a shorter length - text, sequence-to-sequence and
  attention modules; models whose inputs have a fixed length (images, Whisper's features) have no such variant;
- **batch + 1**: one more row along each input's batch dimension (the first dimension of the batch's size),
  fresh random values for floating-point inputs, a copy of the first row for integer and boolean ones (token
  ids and masks stay valid).

A model passes when no graph ran eagerly and every variant's outputs match eager's (``zoo.assert_close``).
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

import torch
from torch import Tensor

from kiln.testing import zoo
from kiln.testing.zoo_base import text_shape

SHORTEN = 5  # tokens fewer in the shorter variant


def _sequence_length(name: str, inputs: tuple[Tensor, ...], size: str) -> int | None:
    """The length the shorter variant cuts: the zoo's text length where an input has it, else None."""
    family = zoo.specs()[name].family
    if family in ("vit", "convnet") or name in ("whisper", "wav2vec2"):
        return None  # (fixed-size images, features and the position tables they index)
    _, seq, _ = text_shape(size, zoo.SEED)
    return seq if any(seq in t.shape for t in inputs) else None


def _batch_dim(t: Tensor, batch: int) -> int | None:
    return next((d for d, s in enumerate(t.shape) if s == batch), None)


def variants(name: str, inputs: tuple[Tensor, ...], size: str = "ci",
             seed: int = 1) -> list[tuple[str, tuple[Tensor, ...]]]:
    """``[(label, inputs)]``: the inputs as built, then the shorter and the larger-batch variants (module
    docstring)."""
    out = [("as built", inputs)]
    seq = _sequence_length(name, inputs, size)
    if seq is not None and seq > SHORTEN + 1:
        short = seq - SHORTEN

        def cut(t: Tensor) -> Tensor:
            for d, s in enumerate(t.shape):
                if s == seq:
                    t = t.narrow(d, 0, short)
            return t.contiguous()
        out.append((f"length {short}", tuple(cut(t) for t in inputs)))
    batch, _, _ = text_shape(size, zoo.SEED)
    if all(t.dim() > 0 for t in inputs) and any(_batch_dim(t, batch) is not None for t in inputs):
        gen = torch.Generator().manual_seed(seed)

        def grow(t: Tensor) -> Tensor:
            d = _batch_dim(t, batch)
            if d is None:
                return t
            row = t.narrow(d, 0, 1)
            extra = (torch.randn(row.shape, generator=gen, dtype=t.dtype).to(t.device) if t.is_floating_point()
                     else row)
            return torch.cat([t, extra], d)
        out.append((f"batch {batch + 1}", tuple(grow(t) for t in inputs)))
    return out


def check(name: str, size: str = "ci", attn: str | None = None, device: str = "cpu",
          target: str = "auto") -> dict[str, Any]:
    """Compile zoo model ``name`` once with ``dynamic=True`` and run every variant; returns what happened
    (``ok``, the variants run, graphs compiled, graphs kiln ran eagerly, symbolic graphs, the first error).
    ``device``: where the model and inputs live; ``target``: kiln's (``triton`` on CPU tensors runs the GPU code
    generator under Triton's interpreter, with ``TRITON_INTERPRET=1`` set before Triton is imported)."""
    import kiln  # noqa: F401  (registers the backend)
    from kiln.report import mark, reports_since
    model, inputs = zoo.build(name, size, attn)
    model = model.to(device)
    inputs = tuple(x.to(device) if isinstance(x, Tensor) else x for x in inputs)
    torch._dynamo.reset()
    # (on the GPU each size's module is built at its first call here - not its second, the default - so that
    # every variant runs compiled code)
    compiled = torch.compile(model, backend="kiln", dynamic=True,
                             options={"target": target, "gpu_dynamic_build_after": 1})
    position = mark()
    result: dict[str, Any] = {"model": name, "variants": [], "error": None}
    with torch.inference_mode():
        for label, args in variants(name, inputs, size):
            try:
                zoo.assert_close(compiled(*args), model(*args))
            except Exception as exc:  # (a wrong result or a crash: reported, the sweep goes on)
                result["error"] = f"{label}: {type(exc).__name__}: {str(exc)[:300]}"
                break
            result["variants"].append(label)
    reports = reports_since(position)
    result["graphs"] = len(reports)
    result["eager"] = [r.fallback for r in reports if r.fallback is not None]
    result["symbolic"] = sum(r.dynamic is not None for r in reports)
    result["ok"] = result["error"] is None and not result["eager"]
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kiln.testing.zoo_dynamic", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=None, help="comma-separated zoo models (default: all)")
    p.add_argument("--size", default="ci", choices=tuple(zoo.SIZES))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--target", default="auto", choices=("auto", "cpu", "cuda", "triton"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = args.models.split(",") if args.models else list(zoo.specs())
    failed = 0
    for name in names:
        r = check(name, args.size, device=args.device, target=args.target)
        failed += not r["ok"]
        status = "ok" if r["ok"] else "FAIL"
        print(f"{name}: {status}, variants {r['variants']}, {r['graphs']} graph(s), {r['symbolic']} symbolic"
              + (f", eager: {r['eager']}" if r["eager"] else "") + (f", {r['error']}" if r["error"] else ""),
              flush=True)
    print(f"{len(names) - failed} of {len(names)} models ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
