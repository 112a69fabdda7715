"""Benchmark eager PyTorch, Inductor and kiln on the model zoo (kiln/testing/zoo.py) at full size.

    python -m benchmarks.zoo                                # the headline models, 1 thread, CPU
    python -m benchmarks.zoo --models bert,llama --threads 1
    python -m benchmarks.zoo --full                         # every zoo architecture
    python -m benchmarks.zoo --full --attn eager --small    # CI sizes, eager attention: a quick smoke run

Full-size configs (BERT-base, GPT-2 small, T5-small, ViT-base, a 4-layer LLaMA-style decoder with grouped-query
attention at hidden 512, DistilBERT, ResNet-50, ...) at batch 1, sequence 64 / 224x224 images, random weights.
The method is the runner's (``benchmarks/runner.py``): per model, each backend's first call is timed (compile
time), its outputs are checked against eager's on every tensor leaf (ModelOutput fields and caches), then
interleaved rounds give median times and per-round speedups over eager.  After the table, one line per model
says how many graphs kiln compiled, whether it fell back, and which ops ran as externs.  Every option of the
runner (``--repeats``, ``--calls``, ``--json``, ``--fresh-caches``, ``--backends``, ...) is accepted.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

if __package__ in (None, ""):  # run as ``python benchmarks/zoo.py``
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import runner  # noqa: E402 (no torch import at module level)

HEADLINE = ("bert", "gpt2", "t5", "vit", "llama", "distilbert", "resnet")  # the anchors' transformers models
DEFAULT_BACKENDS = "eager,inductor,kiln"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The zoo's own options; the rest go to the runner's parser."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.zoo", description=__doc__.split("\n\n")[0],
                                epilog="Other options: see python -m benchmarks.runner --help",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=None, help=f"comma-separated zoo models (default: {','.join(HEADLINE)})")
    p.add_argument("--full", action="store_true", help="every zoo architecture (default: the headline models)")
    p.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"),
                   help="transformers' attention implementation where the model has both (default sdpa)")
    own, rest = p.parse_known_args(argv)
    if "--backends" not in rest and not any(a.startswith("--backends=") for a in rest):
        rest += ["--backends", DEFAULT_BACKENDS]
    args = runner.parse_args(rest)
    args.models = runner._split(own.models) if own.models else None  # resolved by zoo_models, after torch's set-up
    args.full, args.attn = own.full, own.attn
    return args


def _write_json(args: argparse.Namespace, info: dict, records: list[dict], complete: bool) -> None:
    """The run so far to ``--json`` (``complete``: every model asked for was run)."""
    if args.json is None:
        return
    import json
    payload = {"machine": info, "complete": complete, "results": records,
               "table": runner.format_table(records, args.backends),
               "geomean_speedup": runner.geomeans(records, args.backends)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2, default=str) + "\n")


def zoo_models(args: argparse.Namespace) -> list[str]:
    """The models to run: ``--models``, else every zoo architecture (``--full``) or the headline ones."""
    from kiln.testing import zoo
    known = list(zoo.specs())
    names = args.models or (known if args.full else list(HEADLINE))
    unknown = sorted(set(names) - set(known))
    if unknown:
        raise SystemExit(f"benchmarks.zoo: unknown zoo model(s) {unknown}; choose from {known}")
    return names


def builder(attn: str) -> Any:
    """``build(name, small=, device=, dtype=)`` for ``runner.bench_model``: the zoo model at full (or CI) size."""

    def build(name: str, small: bool = False, device: Any = "cpu", dtype: Any = None) -> tuple[Any, tuple]:
        import torch
        from kiln.testing import zoo
        spec = zoo.specs()[name]
        model, inputs = zoo.build(name, "ci" if small else "full", attn if attn in spec.attns else None)
        dtype = dtype or torch.float32
        model = model.to(device=device, dtype=dtype)
        return model, tuple(x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)
                            for x in inputs)
    return build


def kiln_summary(reports: list[Any]) -> str:
    """One line about kiln's compiles of a model: graphs, fallbacks, externs by count."""
    if not reports:
        return "no kiln graph"
    externs = Counter(e for r in reports for e in r.externs)
    fallbacks = [r.fallback for r in reports if r.fallback]
    text = f"{len(reports)} graph(s), externs " + ", ".join(f"{k} x{v}" for k, v in sorted(externs.items()))
    return text + (f"; FELL BACK: {fallbacks[0]}" if fallbacks else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the zoo benchmark; prints the runner's table, then kiln's graphs and externs per model."""
    args = parse_args(argv)
    temporary = runner.setup_environment(args)  # before torch is imported
    try:
        import torch

        from kiln.report import mark, reports_since
        from kiln.testing import zoo
        torch.set_num_threads(args.threads)
        runner.set_tf32(args.device, args.dtype, args.tf32)
        args.models = zoo_models(args)
        info = runner.machine_info(args)
        runner._progress(f"zoo: {info['cpu']}, torch {info['torch']}, {info['threads']} thread(s), "
                         f"backends {args.backends}, attention {args.attn}")
        records, notes = [], []
        for name in args.models:
            runner._progress(f"{name}:")
            position = mark()
            record = runner.bench_model(name, args, builder(args.attn), zoo.max_errors)
            record["kiln_graphs"] = kiln_summary(reports_since(position))
            records.append(record)
            notes.append(f"  {name}: {record['kiln_graphs']}")
            # each model's rows (and the JSON so far) as soon as it is done: a long run that dies (the device
            # call's time limit) still leaves its numbers
            rows = runner.format_table([record], args.backends).splitlines()[2:]
            runner._progress("\n".join(row for row in rows if not row.startswith("| geomean")))
            _write_json(args, info, records, complete=False)
        size = "CI" if args.small else "full"
        print(f"\n{info['date']}  {info['cpu']}  threads {info['threads']}  torch {info['torch']}  "
              f"{size} size, attention {args.attn}\n")
        print(runner.format_table(records, args.backends))
        print("\nkiln:\n" + "\n".join(notes))
        _write_json(args, info, records, complete=True)
        return 0 if any(rec["backends"] for rec in records) else 1
    finally:
        import shutil
        for path in temporary:
            shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
