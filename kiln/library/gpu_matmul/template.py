"""Triton matmul template with the consumer's elementwise kernel fused as its epilogue.

``C = A @ B`` (``aten.mm``) or ``C = bias + A @ B`` (``aten.addmm``) on tensor cores, tiled
``BLOCK_M x BLOCK_N`` per program with a ``BLOCK_K`` loop, programs ordered in groups of ``GROUP_M`` row tiles
so neighbouring programs share B's column panel in L2.  When the only reader of ``C`` is a pointwise kernel
that reads it at the element it writes (bias, GELU, residual add, cast ...), that kernel's stores are emitted
after the loop on the accumulator, and ``C`` is never written to memory::

    before:  %c = extern(%a, %w, target=aten.mm)            after:  matmul_kernel_4(a, w, buf2, buf9)
             kernel_4: buf9[i] = gelu(buf7[i]) + buf2[i]              acc = dot loop over K
                                                                        mmv = acc (rounded to C's dtype)
                                                                        buf9[x] = gelu(mmv) + buf2[x]

The accumulator is rounded to ``C``'s dtype before the epilogue reads it, as the unfused kernel would read it
from memory, so fused and unfused results differ only by the order of the K summation.  Shapes are compile-
time constants; operand strides are run-time arguments (Triton specializes unit and 16-divisible strides).
"""
from __future__ import annotations

import dataclasses

import torch

from kiln.codegen.triton import TritonKernelWriter
from kiln.codegen.triton_expr import HALF, TritonPrinter, tl_type
from kiln.ir.kernel import KLoad, Kernel, subexprs

HEADER = '''"""kiln-generated Triton matmul template."""
import triton
import triton.language as tl

from kiln.runtime import triton_math as km
'''


@dataclasses.dataclass(frozen=True)
class MatmulConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int
    num_warps: int
    num_stages: int

    def trace(self) -> list[int]:
        return [self.block_m, self.block_n, self.block_k, self.group_m, self.num_warps, self.num_stages]

    @classmethod
    def from_trace(cls, t: list[int]) -> "MatmulConfig":
        return cls(*t)

    def __str__(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k} group {self.group_m}, {self.num_warps} warps, "
                f"{self.num_stages} stages")


# The search space: tile shapes for tensor cores at 16/32-bit operands (Hopper: 128x128/128x256 tiles with 3-4
# stages for large problems, narrower tiles for skinny ones); rules below drop tiles far larger than the problem.
_SPACE = [
    MatmulConfig(128, 128, 64, 8, 8, 3), MatmulConfig(128, 256, 64, 8, 8, 3), MatmulConfig(256, 128, 64, 8, 8, 3),
    MatmulConfig(128, 128, 32, 8, 4, 4), MatmulConfig(64, 128, 64, 8, 4, 4), MatmulConfig(128, 64, 64, 8, 4, 4),
    MatmulConfig(64, 64, 64, 8, 4, 4), MatmulConfig(64, 256, 32, 8, 8, 4), MatmulConfig(32, 64, 64, 8, 4, 5),
    MatmulConfig(16, 64, 128, 8, 4, 4),
]


def _fits(c: MatmulConfig, m: int, n: int, k: int) -> bool:
    return c.block_m <= max(16, 2 * m) and c.block_n <= max(16, 2 * n) and c.block_k <= max(16, k)


def candidate_configs(m: int, n: int, k: int, dtype: torch.dtype) -> list[MatmulConfig]:
    """Tile configurations worth measuring for an ``m x n x k`` problem."""
    space = [c for c in _SPACE if _fits(c, m, n, k)]
    if dtype == torch.float32:  # 4-byte operands: halve the K depth to keep stages in shared memory
        space = [dataclasses.replace(c, block_k=max(16, c.block_k // 2)) for c in space]
    return list(dict.fromkeys(space)) or [MatmulConfig(16, 64, 64, 8, 4, 3)]


@dataclasses.dataclass
class MatmulSpec:
    """What one template instance computes (shapes, dtypes, the fused epilogue)."""
    name: str
    m: int
    n: int
    k: int
    dtype: torch.dtype          # operand dtype
    out_dtype: torch.dtype      # dtype of C (what the epilogue reads)
    bias: bool                  # addmm
    epilogue: Kernel | None     # pointwise kernel reading C at its stored element, or None: store C
    c_buf: str                  # the epilogue's name for C
    tf32: bool = False

    def epilogue_args(self, dtype_of: dict[str, torch.dtype]) -> list[str]:
        if self.epilogue is None:
            return ["out"]
        return [b for b in TritonKernelWriter(self.epilogue, dtype_of).args() if b != self.c_buf]


def template_source(spec: MatmulSpec, dtype_of: dict[str, torch.dtype]) -> str:
    """Source of one ``@triton.jit`` function named ``spec.name``."""
    ep_args = spec.epilogue_args(dtype_of)
    params = ["a", "b"] + (["bias"] if spec.bias else []) + ep_args + [
        "sam", "sak", "sbk", "sbn"] + (["sbiasm", "sbiasn"] if spec.bias else []) + [
        "BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_K: tl.constexpr", "GROUP_M: tl.constexpr"]
    m, n, k = spec.m, spec.n, spec.k
    precision = ', input_precision="tf32"' if spec.tf32 else (', input_precision="ieee"'
                                                              if spec.dtype == torch.float32 else "")
    lines = [
        "@triton.jit",
        f"def {spec.name}({', '.join(params)}):",
        "    pid = tl.program_id(0)",
        f"    tiles_m = tl.cdiv({m}, BLOCK_M)",
        f"    tiles_n = tl.cdiv({n}, BLOCK_N)",
        "    group = pid // (GROUP_M * tiles_n)",
        "    first_m = group * GROUP_M",
        "    rows = min(tiles_m - first_m, GROUP_M)",
        "    pid_m = first_m + (pid % rows)",
        "    pid_n = (pid % (GROUP_M * tiles_n)) // rows",
        "    om = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "    on = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        # rows/columns past the edge read row/column 0 (always valid) instead of masking the K loop's loads
        f"    am = tl.where(om < {m}, om, 0)",
        f"    bn = tl.where(on < {n}, on, 0)",
        "    rk = tl.arange(0, BLOCK_K)",
        "    a_ptr = a + am[:, None] * sam + rk[None, :] * sak",
        "    b_ptr = b + rk[:, None] * sbk + bn[None, :] * sbn",
        "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        f"    for kk in range(0, tl.cdiv({k}, BLOCK_K)):",
    ]
    if k % 128 == 0:  # every BLOCK_K of the search space divides K: no masks in the loop
        lines += ["        a_t = tl.load(a_ptr)", "        b_t = tl.load(b_ptr)"]
    else:
        lines += [f"        kmask = rk < {k} - kk * BLOCK_K",
                  "        a_t = tl.load(a_ptr, mask=kmask[None, :], other=0.0)",
                  "        b_t = tl.load(b_ptr, mask=kmask[:, None], other=0.0)"]
    lines += [
        f"        acc = tl.dot(a_t, b_t, acc{precision})",
        "        a_ptr += BLOCK_K * sak",
        "        b_ptr += BLOCK_K * sbk",
        "    rm = om[:, None]",
        "    rn = on[None, :]",
        f"    xmask = (rm < {m}) & (rn < {n})",
    ]
    if spec.bias:
        lines.append("    acc += tl.load(bias + rm * sbiasm + rn * sbiasn, mask=xmask, other=0.0).to(tl.float32)")
    c_value = f"acc.to({tl_type(spec.out_dtype)})"
    if spec.epilogue is None:
        lines.append(f"    tl.store(out + (rm * {n} + rn), {c_value}, mask=xmask)")
        return "\n".join(lines) + "\n"
    lines.append(f"    mmv = {c_value}" + (".to(tl.float32)" if spec.out_dtype in HALF else ""))
    writer = TritonKernelWriter(spec.epilogue, dtype_of)
    writer.lines = lines
    lines.append(f"    x = rm * {n} + rn")
    writer._unflatten("x", "i", "    ")
    names = {(x, None): "mmv" for p in spec.epilogue.phases for st in getattr(p, "stores", [])
             for x in subexprs(st.value) if isinstance(x, KLoad) and x.buf == spec.c_buf}
    printer = TritonPrinter(lines, "    ", "xmask", names=names, stored=writer._stored)
    for phase in spec.epilogue.phases:
        for st in phase.stores:
            writer._store(printer, st, "xmask", "    ")
    return "\n".join(lines) + "\n"
