"""Calls that need gradients: AOTAutograd's forward and backward graphs, each compiled by kiln (issue 20, step 1).

[Note: training graphs] Where a call needs gradients (grad mode on, an input or parameter with
``requires_grad``), AOTAutograd traces the joint forward-backward graph with kiln's decompositions (the
``*_backward`` ops of layer norm, GELU, softmax and friends become the elementwise and reduction ops kiln fuses),
partitions it into a forward graph - the outputs plus the values the backward needs - and a backward graph, and
hands each to a compiler::

    Dynamo graph --AOTAutograd (joint graph, decompositions)--> partition (torch's min-cut: what to save, what
        to recompute; then kiln's: saved values the backward can rebuild cheaply)
        --> forward graph  -- kiln --> compiled forward (outputs, saved activations)
                      --> backward graph -- kiln --> compiled backward (gradients), compiled at the first backward

Both are ordinary ATen graphs for kiln, with one difference from inference: nothing is frozen.  Parameters are
inputs of every call (an optimizer changes them in place between steps), so weight-derived constants (packed
GEMM panels, folded BatchNorm) do not apply; activations' fusion, the memory plan and the library calls do.
Buffers updated in the forward (BatchNorm's running statistics in training mode) are AOTAutograd's input
mutations, written back by its runtime wrapper.

The partition starts from torch's min-cut rematerialization (the baseline the issue names), with torch's
Inductor op classes; kiln then moves the saved values that are short elementwise chains over what the backward
holds anyway - a GELU's or a LayerNorm's output next to its input, BatchNorm + ReLU in training mode - into the
backward ([Note: recompute what the backward can rebuild], frontend/partition.py).  Inference and training graphs of one
model coexist: TorchDynamo guards on grad mode, and an inference graph compiled while training goes on notices
its frozen weights changing ([Note: frozen weights that change], compiler.py).

With ``Config.training_cuda_graphs`` (on since session 42, when the H100 measured it: benchmarks/RESULTS.md), under
reduce-overhead (and max-autotune) both graphs replay CUDA graphs, as inference graphs do; off, they run as in
default mode and the report says so.  The forward's recording reads the parameters where they lie and copies only
the batch; the backward's reads the saved activations - the forward replay's outputs, at the same addresses every
step - in place once they have settled ([Note: a graph on copies reads settled inputs in place],
runtime/triton_module.py).  A forward's saved activations that must outlive the next replay (gradient
accumulation: two forwards before the backwards) are moved onto copies before it ([Note: outputs of a replay]).
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.fx

from kiln import config
from kiln.frontend.partition import tensor_bytes


def needs_grad(example_inputs: Sequence[Any]) -> bool:
    """Does this call need gradients: grad mode on and some input (parameters included) requiring them?"""
    return torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)


def compile_training(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], mode: str, cfg: config.Config,
                     name: str, reached: list[bool] | None = None) -> Callable:
    """The callable TorchDynamo runs for a graph that needs gradients: AOTAutograd's runtime around kiln's
    compiled forward and backward (the module docstring).  ``reached`` gets an entry once AOTAutograd's capture
    reached kiln's compiler (an error after that is kiln's own, not a capture failure)."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    from kiln.compiler import compile_aten_graph
    from kiln.frontend.decompositions import decomposition_table
    from kiln.frontend.partition import Recomputed, recompute_saved, save_view_bases

    graph_mode = mode
    on_gpu = any(isinstance(x, torch.Tensor) and x.is_cuda for x in example_inputs)
    replays = on_gpu or cfg.emulate_cuda_graphs  # (emulated: [Note: CUDA graphs emulated on the CPU])
    if replays and mode in ("reduce-overhead", "max-autotune") and not cfg.training_cuda_graphs:
        graph_mode = "max-autotune-no-cudagraphs" if mode == "max-autotune" else "default"

    note = "" if graph_mode == mode else (f"; mode {mode!r} runs as {graph_mode!r} here (training_cuda_graphs "
                                          f"off)")

    partition: dict[str, str] = {}  # the partition's summary, for both graphs' reports

    def partition_fn(joint: torch.fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        fw, bw = min_cut_rematerialization_partition(joint, joint_inputs, compiler="inductor", **kwargs)
        moved = recompute_saved(fw, bw, kwargs["num_fwd_outputs"], cfg.training_memory_budget) \
            if cfg.training_recompute else Recomputed()
        bases = save_view_bases(fw, bw, kwargs["num_fwd_outputs"])  # ([Note: saved views travel as their bases])
        described = "; ".join(part for part in (moved.describe(), f"{bases} strided saved views handed over as "
                                                f"their bases" if bases else "") if part)
        partition["summary"] = partition_summary(bw) + (f"; {described}" if described else "")
        partition["visible"] = kwargs["num_fwd_outputs"]  # (the forward's outputs after these are saved values)
        return fw, bw

    def compiler(part: str) -> Callable:
        def compile_part(fx_gm: torch.fx.GraphModule, fx_inputs: Sequence[Any]) -> Callable:
            if reached is not None:
                reached.append(True)
            saved_from = None
            if part == "forward":
                _no_donated_buffers()
                laid_out = cfg.training_channels_last or cfg.attention_result_layouts
                saved_from = partition.get("visible") if laid_out else None
            else:  # ([Note: saved activations channels-last])
                laid_out_inputs(fx_gm, fx_inputs, partition.get("reported"), partition.get("visible", 0))
            summary = partition.get("summary")
            described = f"; the partition (torch's min-cut, then kiln's): {summary}" if summary else ""
            compiled = compile_aten_graph(fx_gm, {}, cfg=cfg, mode=graph_mode, name=f"{name} ({part})",
                                          training=part + note + described, saved_from=saved_from)
            if part == "forward":  # (the strides the forward reported for its outputs, if any)
                context = torch._guards.TracingContext.try_get()
                partition["reported"] = list(getattr(context, "output_strides", None) or [])
            return compiled
        return compile_part

    # (keep_inference_input_mutations: buffers updated under no_grad - BatchNorm's running statistics - are
    # written by the forward graph itself, not copied back by AOTAutograd's wrapper after each call: on the H100,
    # ResNet-18's 60 host copies a step outside reduce-overhead's CUDA graphs)
    return aot_module_simplified(gm, example_inputs, fw_compiler=compiler("forward"),
                                 bw_compiler=compiler("backward"), partition_fn=partition_fn,
                                 decompositions=decomposition_table(), keep_inference_input_mutations=True)


def laid_out_inputs(bw: torch.fx.GraphModule, fx_inputs: Sequence[Any], reported: Sequence[Any] | None = None,
                    visible: int = 0) -> int:
    """[Note: saved activations channels-last] On the GPU, cuDNN runs convolutions channels-last (NHWC): given
    NCHW tensors it converts each operand and result around every call (ResNet-18's training step on the H100:
    110 + 55 conversion kernels, 0.73 ms of a 5.6 ms step).  Inference graphs keep their convolutions' inputs
    channels-last inside the graph (schedule/layout.py); a training forward's conv inputs are also saved for the
    backward - graph outputs, which kept eager's layout, so every one was converted in the forward and again in
    the backward.  With ``Config.training_channels_last`` the forward lays out its *saved* values as the layout
    pass chooses (the user's outputs keep eager's layout) and tells AOTAutograd their strides
    (``TracingContext.output_strides``, as Inductor does); AOTAutograd then hands the backward's compiler
    placeholders with those strides (``fx_inputs``), which this copies into the placeholders' metadata, where the
    lowering reads each input's layout (``Op.INPUT``'s ``strides``); the runtime takes inputs in that layout.
    ``reported``: the strides the forward reported for its outputs (``visible`` of them the user's; the saved
    tensors follow, in the order of the backward's inputs after its saved sizes): an input whose forward output
    was reported in the layout the trace had anyway (an attention output: [Note: attention results in ATen's
    layout]) is marked too, where AOTAutograd changed nothing.  Returns how many placeholders were marked."""
    from kiln.frontend.lower import LAID_OUT
    changed = 0
    placeholders = [n for n in bw.graph.nodes if n.op == "placeholder"]
    sizes = next((k for k, n in enumerate(placeholders) if isinstance(n.meta.get("val"), torch.Tensor)), 0)
    reported = list(reported or [])
    for k, (node, value) in enumerate(zip(placeholders, fx_inputs)):
        traced = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or not isinstance(traced, torch.Tensor) \
                or not all(isinstance(d, int) for d in (*value.shape, *value.stride(), *traced.stride())) \
                or tuple(value.shape) != tuple(traced.shape):
            continue
        position = visible + k - sizes
        said = reported[position] if k >= sizes and position < len(reported) else None
        if value.stride() != traced.stride() or (said is not None and tuple(said) == tuple(value.stride())):
            node.meta["val"] = value
            node.meta[LAID_OUT] = True
            changed += 1
    return changed


def partition_summary(bw: torch.fx.GraphModule) -> str:
    """What the partition decided, from the backward graph: the forward values it saves (its inputs that are not
    incoming gradients; the forward's own inputs - parameters, the batch - cost no memory of their own, so only
    the activations' bytes are summed) and the forward values it recomputes (its nodes that no incoming gradient
    reaches: computed from saved values alone; views not counted)::

        saved 5 activations, 1.50 MiB (largest: addmm [64, 4096] 1.00 MiB) and 3 inputs; recomputed 3 ops (gelu, ...)"""
    placeholders = [n for n in bw.graph.nodes if n.op == "placeholder"]
    grads = {n for n in placeholders if n.name.startswith("tangents")}
    saved, inputs = [], 0
    for n in placeholders:
        value = n.meta.get("val")
        if n in grads or not isinstance(value, torch.Tensor):
            continue
        if n.name.startswith("primals"):
            inputs += 1
            continue
        saved.append((tensor_bytes(n), n.name, list(value.shape)))
    reached_by_grad = set(grads)
    for n in bw.graph.nodes:
        if any(i in reached_by_grad for i in n.all_input_nodes):
            reached_by_grad.add(n)
    recomputed = [n for n in bw.graph.nodes if n.op == "call_function" and n not in reached_by_grad
                  and isinstance(n.meta.get("val"), torch.Tensor) and not getattr(n.target, "is_view", False)]
    total = sum(b for b, _, _ in saved)
    text = f"saved {len(saved)} activations, {total / 2 ** 20:.2f} MiB"
    if saved:
        b, name, shape = max(saved)
        text += f" (largest: {name} {shape} {b / 2 ** 20:.2f} MiB)"
    text += f" and {inputs} inputs"
    ops = [getattr(n.target, "__name__", str(n.target)).split(".")[0] for n in recomputed]
    text += f"; recomputed {len(ops)} ops" + (f" ({', '.join(ops[:6])}{', ...' if len(ops) > 6 else ''})"
                                               if ops else "")
    return text


def _no_donated_buffers() -> None:
    """Tell AOTAutograd's runtime that this backward reuses none of the saved activations' memory (its "donated
    buffers", which Inductor's backward may overwrite, so that ``backward(retain_graph=True)`` is refused).
    kiln's memory planner never writes into the backward's inputs, so a backward may run twice, as in eager.
    (Switching ``torch._functorch.config.donated_buffer`` off during the compile is not enough: the runtime
    checks that config again at each backward, and would refuse the metadata it left unset.)"""
    context = torch._guards.TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    if metadata is not None and hasattr(metadata, "bw_donated_idxs"):
        metadata.bw_donated_idxs = []
