"""How reduce-overhead's CUDA graphs behave over a training loop (issue 20 point 4): per kiln graph (each training
step has a forward and a backward), its calls, the graphs recorded, the inputs its graph on copies reads in place
and copies ([Note: a graph on copies reads settled inputs in place]), the calls that ran the plain module because
the caller held views of earlier outputs, and the step times - to see whether the steady state replays.

    python -m benchmarks.cuda_graph_replays [--models mlp,gpt,resnet18] [--size full] [--steps 12] [--autocast]

Runs kiln in mode reduce-overhead with ``training_cuda_graphs`` and ``cuda_graph_inputs_in_place`` on (both off by
default until measured; the options of this run only), on the models of ``benchmarks.training``.  ``--device cpu``
runs the same logic without a GPU, over emulated CUDA graphs ([Note: CUDA graphs emulated on the CPU]): the
recordings, replays and copies are those a GPU would make for the same addresses (the step times are not), and
each step's loss is checked against an eager copy of the model.
"""
from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,gpt,resnet18")
    ap.add_argument("--size", default="full", choices=("small", "full"))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--autocast", action="store_true")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args()
    import copy
    from kiln import config
    from kiln.runtime import triton_module
    from benchmarks.training import Run, _model

    made: list = []
    init = triton_module.GraphReplay.__init__

    def noting(self, *a, **k):
        init(self, *a, **k)
        made.append(self)
    triton_module.GraphReplay.__init__ = noting
    emulated = args.device == "cpu"
    with config.scope(training_cuda_graphs=True, cuda_graph_inputs_in_place=True, emulate_cuda_graphs=emulated):
        for name in args.models.split(","):
            model, batches, loss = _model(name, args.size, args.device)
            reference = Run("eager", copy.deepcopy(model), loss, args.device, args.autocast) if emulated else None
            made.clear()
            run = Run("kiln-ro", model, loss, args.device, args.autocast)
            times, drift = [], []
            for i in range(args.steps):
                times.append(run.step(*batches(i)) * 1e3)
                if reference is not None:
                    reference.step(*batches(i))
                    drift.append(abs(run.last_loss - reference.last_loss) / max(abs(reference.last_loss), 1e-12))
            print(f"{name}: step ms " + " ".join(f"{t:.2f}" for t in times))
            if drift:
                print("  loss against eager, relative: " + " ".join(f"{d:.1e}" for d in drift))
            for g in made:
                copied = sum(x is not None for x in g.static_inputs)
                print(f"  graph ({len(g.expected)} inputs): calls {g.calls}, keyed graphs {len(g.graphs)}, "
                      f"recordings on copies {g.copy_recordings}, read in place {len(g.in_place)}, copied {copied}, "
                      f"moved {len(g.moved)}, plain calls for held views {g.unprotected_runs}, "
                      f"capture error {g.capture_error}")
    if args.device == "cuda":
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
