"""Every stage of a kiln compile, in order, each with the function that runs it and why it is where it is.

``compiler._compile`` runs them; the graph passes have their own ordered list, ``passes/pipeline.PIPELINE``
(one line of why each), and ``tests/unit/test_pipeline_stages.py`` checks that every function named here
exists.  ``kiln.explain`` shows what each stage produced: the graph IR after capture and after the passes, the
implementation choices, the kernels, the Program with its memory and the generated code.

    python -m kiln.pipeline          # prints this table
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    runs: str     # "module:function" that runs the stage
    target: str   # "cpu", "gpu" or "both"
    why: str


STAGES: tuple[Stage, ...] = (
    Stage("capture", "kiln.frontend.dynamo:kiln_backend", "both",
          "TorchDynamo + AOTAutograd give an ATen graph with the weights frozen: one op set for every model"),
    Stage("lower", "kiln.frontend.lower:lower_fx", "both",
          "ATen -> kiln's graph IR (explicit broadcasts and casts); an op without a lowering stays an extern"),
    Stage("graph passes", "kiln.passes.pipeline:run_pipeline", "both",
          "fold, simplify, choose libraries (measured: tune/choices.py), fuse epilogues into library calls; "
          "passes/pipeline.PIPELINE lists them in order"),
    Stage("partition", "kiln.schedule.fuse:partition", "both",
          "which values get a buffer and which kernels compute them: fusion by a bytes-moved cost model"),
    Stage("layouts", "kiln.schedule.layout:choose_layouts", "both",
          "buffer strides; convolutions and the kernels between them channels-last where that pays"),
    Stage("kernel IR", "kiln.schedule.kernel_build:build_kernel", "both",
          "each group becomes loops over index expressions (views folded into indexing, no copies)"),
    Stage("operand layouts", "kiln.schedule.operand_layout:choose_bmm_layouts", "cpu",
          "half-precision bmm operands re-laid out before the call where that measures faster (ATen's CPU bmm: "
          "up to 10x between layouts)"),
    Stage("schedules", "kiln.tune.cpu:apply_schedules", "cpu",
          "loop order, vector width, parallel loops: the database's, else the rule's (measured in max-autotune)"),
    Stage("operator steps", "kiln.library.gpu_matmul.fusion:fuse_into_plan", "gpu",
          "operators' own steps (Operator.plan_gpu): a matmul and its consumer as one Triton template where it "
          "beats cuBLAS + a kernel"),
    Stage("program", "kiln.schedule.program:build_program", "both",
          "the Program: steps in order, native-call binding, memory plan (one arena on the CPU), releases"),
    Stage("layout choice", "kiln.schedule.choose:build_best", "cpu",
          "graphs with convolutions: the faster of the contiguous and channels-last Programs (measured once)"),
    Stage("code generation", "kiln.codegen.cpp:translation_unit", "cpu",
          "C++17 + OpenMP + SIMD, one translation unit per graph; native library calls inside it"),
    Stage("code generation", "kiln.codegen.triton:module_source", "gpu",
          "@triton.jit kernels from the same kernel IR; a generated straight-line call (codegen/gpu_call.py)"),
    Stage("build", "kiln.runtime.build:load_module", "cpu",
          "g++ into a content-addressed cache: a warm compile loads, never rebuilds"),
    Stage("run", "kiln.runtime.module:CompiledGraph", "both",
          "binds buffers and runs the Program's steps; GPU: kiln.runtime.triton_module, CUDA graphs in "
          "reduce-overhead and max-autotune"),
)


def format_stages() -> str:
    """The stages, then kiln's operators (``kiln/library``) with the graph passes each adds to the pipeline."""
    from kiln import library
    width = max(len(s.name) for s in STAGES)
    lines = [f"{k:2d}. {s.name:<{width}}  [{s.target:<4}] {s.runs}\n      {s.why}" for k, s in enumerate(STAGES, 1)]
    lines.append("\noperators (kiln/library; their passes run in this order in the graph pass pipeline):")
    for op in library.OPERATORS:
        lines.append(f"  {op.name}: {op.what}")
        lines.extend(f"      pass {p.name}: {p.why}" for p in op.passes)
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_stages())
