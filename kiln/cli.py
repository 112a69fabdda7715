"""The ``kiln`` command.

    kiln db list|show|export|import|prune         the tuning database
    kiln tune PACKAGE.MODULE:FACTORY [--budget S]  tune a model: FACTORY() returns (model, example_inputs)
    kiln bisect PACKAGE.MODULE:FACTORY [--out DIR]  why kiln's result differs from eager (kiln.bisect)
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence


def _db_command(args: argparse.Namespace) -> int:
    from kiln.tune.db import TuningDB, iter_lines
    db = TuningDB.open(args.path)
    try:
        if args.action == "list":
            records = db.records(everything=args.all)
            for line in iter_lines(records):
                print(line)
            print(f"{len(records)} record(s) in {db.path}")
        elif args.action == "show":
            record = db.get(args.key)
            if record is None:
                print(f"no record for {args.key!r} on this machine", file=sys.stderr)
                return 1
            print(json.dumps(record.to_json(), indent=2))
        elif args.action == "export":
            data = db.export_json()
            with open(args.file, "w") as f:
                json.dump(data, f, indent=1)
            print(f"exported {len(data)} record(s) to {args.file}")
        elif args.action == "import":
            with open(args.file) as f:
                count = db.import_json(json.load(f))
            print(f"imported {count} record(s) from {args.file}")
        elif args.action == "prune":
            older = args.older_than_days * 86400 if args.older_than_days is not None else None
            from kiln.tune import live_kinds
            keep = live_kinds() if args.retired else None
            print(f"pruned {db.prune(older, args.other_machines, keep)} record(s)")
    finally:
        db.close()
    return 0


def _tune_command(args: argparse.Namespace) -> int:
    """Compile the model in max-autotune with a progress line: kernels done, best time so far, time left."""
    import torch

    import kiln
    from kiln.report import mark, reports_since
    model, inputs = _factory(args.factory)
    position = mark()
    with torch.inference_mode():  # (the progress line: tune/progress.py)
        kiln.compile(model, mode="max-autotune", tune_budget_s=args.budget, tune_progress=True)(*inputs)
    tuned = [r.tuning for r in reports_since(position) if r.tuning is not None]
    skipped = [line for t in tuned for line in t.skipped]
    print(f"measured {sum(t.measured for t in tuned)} candidate(s); "
          f"{sum(t.from_database for t in tuned)} kernel(s) already in the database; "
          f"skipped: {skipped or 'none'}")
    return 0


def _factory(spec: str) -> tuple:
    """``module:function`` (or ``path/to/script.py:function``) -> function() -> (model, example_inputs).  The
    current directory is on the import path, as for ``python -m``: a script beside the caller is found."""
    import importlib
    import importlib.util
    import os
    module_name, _, attr = spec.partition(":")
    if module_name.endswith(".py"):
        path = os.path.abspath(module_name)
        if not os.path.exists(path):
            raise SystemExit(f"kiln: no file {module_name!r} (expected module:function or script.py:function)")
        loaded = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
        module = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(module)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    model, inputs = getattr(module, attr or "main")()
    return model, tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)


def _bisect_command(args: argparse.Namespace) -> int:
    from kiln.testing.bisect import bisect
    model, inputs = _factory(args.factory)
    result = bisect(model, *inputs, rtol=args.rtol, atol=args.atol, out_dir=args.out)
    return 1 if result.differs else 0


def parser() -> argparse.ArgumentParser:
    from kiln.version import __version__
    p = argparse.ArgumentParser(prog="kiln", description="kiln, a deep-learning compiler for PyTorch")
    p.add_argument("--version", action="version", version=f"kiln {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    db = sub.add_parser("db", help="the tuning database")
    db.add_argument("--path", default=None, help="database file (default: <cache_dir>/tuning.sqlite)")
    actions = db.add_subparsers(dest="action", required=True)
    lst = actions.add_parser("list", help="records of this machine (--all: every machine)")
    lst.add_argument("--all", action="store_true")
    show = actions.add_parser("show", help="one record as JSON")
    show.add_argument("key")
    exp = actions.add_parser("export", help="all records to a JSON file")
    exp.add_argument("file")
    imp = actions.add_parser("import", help="records from a JSON file (faster ones win)")
    imp.add_argument("file")
    prune = actions.add_parser("prune", help="delete old records or those of other machines/versions")
    prune.add_argument("--older-than-days", type=float, default=None)
    prune.add_argument("--other-machines", action="store_true")
    prune.add_argument("--retired", action="store_true", help="records of kinds kiln no longer reads (a tuner's "
                       "older timing or kernel)")
    tune = sub.add_parser("tune", help="tune a model's kernels (max-autotune) with a progress bar")
    tune.add_argument("factory", help="module:function returning (model, example_inputs)")
    tune.add_argument("--budget", type=float, default=300.0, help="seconds of measurement (default 300)")
    bis = sub.add_parser("bisect", help="narrow a difference from eager to a pass, choice or kernel")
    bis.add_argument("factory", help="module:function returning (model, example_inputs)")
    bis.add_argument("--out", default=".", help="folder for the reproducer (default: here)")
    bis.add_argument("--rtol", type=float, default=1e-4)
    bis.add_argument("--atol", type=float, default=1e-4)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "db":
        return _db_command(args)
    if args.command == "tune":
        return _tune_command(args)
    if args.command == "bisect":
        return _bisect_command(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
