"""max-autotune for GPU matmuls: the cuBLAS path against kiln's Triton template, measured per problem.

A *problem* is one template text (shapes, dtypes, fused epilogue) with its operands' strides; the layers of a
model share problems, so each is measured once per graph and once per machine (the tuning database keeps the
answer, see ``library/gpu_matmul/step.py``).  For each problem:

1. a cost model ranks the template's tile configurations and only the best ``Config.matmul_measured_configs``
   are compiled: the estimate is the number of waves of programs over the SMs (programs resident per SM limited by shared
   memory) times the time of one program's K loop, at a tensor-core rate that drops for small tiles (less
   operand reuse per load);
2. all problems' candidates compile at once, in threads (LLVM and ptxas run outside the GIL; Triton's front end
   does not, so compile time still grows with the number of candidates);
3. each variant - cuBLAS followed by the epilogue kernel as the default mode runs it, and each compiled
   configuration - is timed as a CUDA graph of back-to-back calls (max-autotune replays the compiled graph as
   a CUDA graph, so host launch costs must not decide), median of rounds.
"""
from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch

from kiln import config
from kiln.codegen.triton import TritonKernelWriter, module_source, schedule_for
from kiln.library.gpu_matmul.template import MatmulConfig, MatmulSpec, candidate_configs
from kiln.ir.extern import argument_builder
from kiln.ir.graph import Node
from kiln.ir.interp import view_function
from kiln.ir.kernel import Kernel
from kiln.ir.ops import VIEW, Op, contiguous_strides

# Template configurations compiled and timed per problem.  Compiling is what max-autotune's time goes to (a cold
# process: 3.45 s for MLP's one problem at 4), and on the suite's epilogue problems the first configuration
# within 5% of the exhaustive best ranked 2, 5 and 2 (H200, benchmarks/matmul_cost_model.py): the top 2 find what
# the top 4 find, in half the compile time.
SHARED_MEMORY = 227 * 1024  # bytes per SM a program may use on Hopper


@dataclasses.dataclass
class Problem:
    key: str
    spec: MatmulSpec
    source: str
    node: Node
    epilogue: Kernel | None
    members: list[int] = dataclasses.field(default_factory=list)  # plan steps that share it
    # results
    choice: dict = dataclasses.field(default_factory=dict)
    median_s: float = 0.0
    spread_s: float = 0.0
    measured: int = 0
    timings: list[tuple[dict, float]] = dataclasses.field(default_factory=list)  # (choice, median s) each


def estimate_s(c: MatmulConfig, m: int, n: int, k: int, dtype: torch.dtype, sms: int) -> float:
    """Relative time of configuration ``c`` (the cost model; only the ranking is used)."""
    item = torch.empty((), dtype=dtype).element_size()
    smem = c.num_stages * (c.block_m + c.block_n) * c.block_k * item
    if smem > SHARED_MEMORY:
        return float("inf")
    resident = max(1, min(SHARED_MEMORY // smem, 64 // c.num_warps))
    programs = -(-m // c.block_m) * -(-n // c.block_n)
    waves = -(-programs // (sms * resident))
    # per-program MMA rate relative to a 128x128 tile: operand loads per FLOP grow as 1/bm + 1/bn
    reuse = (1 / c.block_m + 1 / c.block_n) / (2 / 128)
    program_s = c.block_m * c.block_n * -(-k // c.block_k) * c.block_k * max(1.0, reuse)
    return waves * program_s * min(resident, -(-programs // sms))


def rank_configs(spec: MatmulSpec, sms: int) -> list[MatmulConfig]:
    configs = candidate_configs(spec.m, spec.n, spec.k, spec.dtype)
    return sorted(configs, key=lambda c: estimate_s(c, spec.m, spec.n, spec.k, spec.dtype, sms))


def random_like(n: Node, strides_of: dict[Node, tuple[int, ...]], device: torch.device) -> torch.Tensor:
    strides = strides_of.get(n) or contiguous_strides(n.shape)
    t = torch.empty_strided(n.shape, strides, dtype=n.dtype, device=device)
    return t.normal_() if n.dtype.is_floating_point else t.zero_()


def base_tensor(n: Node, strides_of: dict[Node, tuple[int, ...]], device: torch.device) -> torch.Tensor:
    """Constants as they are (weights), other buffers random in the layout the plan gives them."""
    if n.op is Op.CONSTANT:
        return n.attr("value").tensor.to(device).contiguous()
    return random_like(n, strides_of, device)


def operand_tensors(node: Node, buffer_of: dict[Node, str], strides_of: dict[Node, tuple[int, ...]],
                    device: torch.device) -> list[torch.Tensor]:
    """Tensors laid out as the matmul's operands will be at run time (views applied to their bases)."""
    out = []
    for x in node.inputs:
        chain = []
        while x not in buffer_of and x.op in VIEW:
            chain.append(x)
            x = x.inputs[0]
        t = base_tensor(x, strides_of, device)
        for v in reversed(chain):
            t = view_function(v)(t)
        out.append(t)
    return out


def time_on_device(fn: Callable[[], None], calls: int = 10, rounds: int = 7) -> tuple[float, float]:
    """Median and spread (max - min) over rounds of GPU seconds per call, ``calls`` calls replayed as one
    CUDA graph per round."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    times.sort()
    return times[len(times) // 2], times[-1] - times[0]


@dataclasses.dataclass
class _Prepared:
    problem: Problem
    extern_path: Callable[[], None]
    fn: Any
    args: list[Any]
    configs: list[MatmulConfig]


def _prepare(p: Problem, dtype_of: dict[str, torch.dtype], node_of: dict[str, Node],
             strides_of: dict[Node, tuple[int, ...]], device: torch.device, sms: int) -> _Prepared:
    from kiln.library.gpu_matmul.step import launch_args, matmul_module_text
    from kiln.runtime.triton_module import import_source
    spec, epilogue = p.spec, p.epilogue
    tensors: dict[str, torch.Tensor] = {}
    if epilogue is not None:
        for b in TritonKernelWriter(epilogue, dtype_of).args():
            if b != spec.c_buf:
                tensors[b] = base_tensor(node_of[b], strides_of, device)
        ep_tensors = [tensors[b] for b in spec.epilogue_args(dtype_of)]
    else:
        ep_tensors = [torch.empty(p.node.shape, dtype=p.node.dtype, device=device)]
    operands = operand_tensors(p.node, {n: b for b, n in node_of.items()}, strides_of, device)
    ext_args, ext_kwargs = argument_builder(p.node.attr("template"))(operands)
    target = p.node.attr("target")
    if epilogue is not None:
        module, _ = import_source(module_source([epilogue], dtype_of))
        ep_fn, s = getattr(module, epilogue.name), schedule_for(epilogue)
        ep_names = TritonKernelWriter(epilogue, dtype_of).args()

        def extern_path() -> None:
            c = target(*ext_args, **ext_kwargs)
            ts = [c if b == spec.c_buf else tensors[b] for b in ep_names]
            ep_fn[s.grid3](*ts, XBLOCK=s.xblock, RBLOCK=max(s.rblock, 1), num_warps=s.num_warps)
    else:
        def extern_path() -> None:
            target(*ext_args, **ext_kwargs)
    module, _ = import_source(matmul_module_text(p.source))
    return _Prepared(p, extern_path, getattr(module, spec.name), launch_args(spec, ext_args, ep_tensors),
                     rank_configs(spec, sms)[:config.get().matmul_measured_configs])


def _compile(job: tuple[_Prepared, MatmulConfig]) -> bool:
    prep, c = job
    spec = prep.problem.spec
    try:
        grid = (-(-spec.m // c.block_m) * -(-spec.n // c.block_n),)
        prep.fn.warmup(*prep.args, grid=grid, BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
                       GROUP_M=c.group_m, num_warps=c.num_warps, num_stages=c.num_stages)
        return True
    except Exception:  # noqa: BLE001 - a configuration that does not compile (resources) is skipped
        return False


def measure_problems(problems: list[Problem], dtype_of: dict[str, torch.dtype], node_of: dict[str, Node],
                     strides_of: dict[Node, tuple[int, ...]], device: torch.device) -> list[Problem]:
    """Fill in each problem's fastest choice (``{"choice": "extern"}`` or the template and its config)."""
    from kiln.library.gpu_matmul.step import launch
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    prepared = [_prepare(p, dtype_of, node_of, strides_of, device, sms) for p in problems]
    jobs = [(prep, c) for prep in prepared for c in prep.configs]
    with ThreadPoolExecutor(max_workers=min(16, max(len(jobs) + len(prepared), 1))) as pool:
        # a first run of each cuBLAS path compiles its epilogue kernel beside the configurations, not after them
        first_runs = [pool.submit(prep.extern_path) for prep in prepared]
        compiled = dict(zip(((id(prep), c) for prep, c in jobs), pool.map(_compile, jobs)))
        for run in first_runs:
            run.result()
    for prep in prepared:
        p = prep.problem
        results = [(*time_on_device(prep.extern_path), {"choice": "extern"})]
        for c in prep.configs:
            if not compiled[(id(prep), c)]:
                continue
            try:
                median, spread = time_on_device(lambda: launch(prep.fn, p.spec, c, prep.args))
            except Exception:  # noqa: BLE001 - fails at launch (resources): skipped
                continue
            results.append((median, spread, {"choice": "template", "config": c.trace()}))
        p.median_s, p.spread_s, p.choice = min(results, key=lambda r: r[0])
        p.measured = len(results)
        p.timings = [(choice, median) for median, _, choice in results]
    return problems
