"""The decomposition table kiln owns: core ATen decompositions minus the ops kiln lowers better itself.

We keep softmax, layer_norm, batch_norm, gelu, silu, var/mean and friends whole because our lowerings
produce exactly the reductions the fusion pass wants (one kernel each), and keep matmul/conv/pooling whole
because they become extern library calls.  ``F.scaled_dot_product_attention`` written by the user reaches us as
the CPU flash-attention op, kept whole too: its decomposition is the math path (a materialized ``[B, H, T, S]``
score tensor between two bmm calls), measured 0.97x eager on Whisper-tiny's 1500-frame encoder where the
library call gives 1.25x (BERT-base 1.32x -> 1.43x, LLaMA-style 4 layers unchanged; 1 thread, sequence 64).
"""
from __future__ import annotations

import functools
from typing import Any

import torch
from torch._decomp import core_aten_decompositions

from kiln.frontend.foreach import foreach_decompositions
from kiln.frontend.fused_layers import fused_layer_decompositions

aten = torch.ops.aten

# packets whose decompositions we drop (we lower the op ourselves, or call the library kernel)
KEEP_WHOLE = (
    aten._softmax, aten._log_softmax, aten.native_layer_norm, aten._native_batch_norm_legit_no_training,
    aten._native_batch_norm_legit, aten.native_batch_norm, aten.gelu, aten.silu, aten.var, aten.var_mean,
    aten.std, aten.mean, aten.addmm, aten.mm, aten.bmm, aten.convolution, aten.max_pool2d_with_indices,
    aten.avg_pool2d, aten._adaptive_avg_pool2d, aten.hardtanh, aten.leaky_relu, aten.clamp, aten.clamp_min,
    aten.clamp_max, aten.embedding, aten.index_select, aten.gather, aten.tril, aten.triu, aten.arange,
    aten.masked_fill, aten.where, aten.sigmoid, aten.tanh, aten.rsqrt, aten.full, aten.expm1, aten.log1p,
    aten.split, aten.split_with_sizes, aten.unbind, aten.narrow, aten.select, aten.slice, aten.squeeze,
    aten.unsqueeze, aten.t, aten.transpose, aten.permute, aten.expand, aten.cat, aten.constant_pad_nd,
    aten.logical_not, aten.floor_divide, aten.remainder, aten.round, aten.sign, aten.std, aten.amax, aten.amin,
    aten.argmax, aten.argmin, aten.prod, aten.sum, aten.any, aten.all, aten.max, aten.min,
    aten._scaled_dot_product_flash_attention_for_cpu,
    # its decomposition (beta * self + alpha * bmm) takes self's strides, not eager's: a transposed self made a
    # result that a later view could not take (fuzz seed 9521); ATen's call is what kiln would run anyway
    aten.baddbmm,
    # its decomposition is index_put(zeros, [ids], grad, accumulate=True): ATen's out-of-place index_put copies the
    # whole zero gradient (a 30522 x 768 vocabulary: 94 MB) and sorts the ids; the op itself scatters feature
    # blocks straight into its output (BERT-base's step on the H100: the three embedding gradients 1.28 ms)
    aten.embedding_dense_backward,
)


@functools.lru_cache(maxsize=1)
def decomposition_table() -> dict[Any, Any]:
    table = dict(core_aten_decompositions())
    keep = set(KEEP_WHOLE)
    return {**{op: fn for op, fn in table.items() if getattr(op, "overloadpacket", None) not in keep},
            **fused_layer_decompositions(), **foreach_decompositions(),
            aten.native_group_norm_backward.default: group_norm_backward}


# [Note: a centered GroupNorm backward]
# torch's decomposition of ``native_group_norm_backward`` takes the input's gradient as
# ``c1 * dy + c2 * x + c3`` with ``c2 = (sum(dy * g) * mean - sum(dy * x * g)) * rstd^3 / n`` and
# ``c3 = -c2 * mean - ...``: two sums of products that cancel, times ``rstd^3`` - where a group's variance is far
# below ``eps`` (``rstd^3`` ~3e7 for eps 1e-5) the cancellation's rounding comes out as gradients 10-100x less
# accurate than eager's kernel (gradient fuzz seed 23815: groups of one element, every value equal).  The same
# gradient from the centered input, ``c2 = -sum(dy * g * (x - mean)) * rstd^3 / n`` applied to ``x - mean``,
# cancels nothing: a group of equal values gets ``c2 = 0`` exactly (and ``x - mean`` = 0, the norms' mean being
# exact: [Note: the variance of equal values]).  The same operations otherwise: a sub more per element.
def group_norm_backward(grad_output: torch.Tensor, input: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                        gamma: torch.Tensor | None, N: int, C: int, HxW: int, group: int,
                        output_mask: list[bool]) -> tuple[torch.Tensor | None, ...]:
    """``aten.native_group_norm_backward`` from the centered input (see the Note); half precision in fp32."""
    dtype = input.dtype
    acc = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    cpg = C // group
    dy = grad_output.to(acc).reshape(N, group, cpg, HxW)
    centered = input.to(acc).reshape(N, group, cpg, HxW) - mean.to(acc).reshape(N, group, 1, 1)
    r = rstd.to(acc).reshape(N, group, 1)
    ds = (dy * centered).sum(3)  # [N, group, cpg]: sum(dy * (x - mean)) per channel
    db = dy.sum(3)
    d_input = d_gamma = d_bias = None
    if output_mask[0]:
        g = gamma.to(acc).reshape(1, group, cpg) if gamma is not None else None
        ds_val = (ds if g is None else ds * g).sum(2, keepdim=True)  # [N, group, 1]
        db_val = (db if g is None else db * g).sum(2, keepdim=True)
        s = 1.0 / (HxW * cpg)
        c1 = r if g is None else r * g  # [N, group, cpg or 1]
        c2 = -(ds_val * r * r * r * s)
        c3 = -(db_val * r * s)
        d_input = (dy * c1.unsqueeze(-1) + centered * c2.unsqueeze(-1) + c3.unsqueeze(-1))
        d_input = d_input.reshape(input.shape).to(dtype)
    affine = gamma.dtype if gamma is not None else dtype  # (ATen's: a bf16 input's fp32 weight gets fp32 gradients)
    if output_mask[1]:
        d_gamma = (ds * r).sum(0).reshape(C).to(affine)
    if output_mask[2]:
        d_bias = db.sum(0).reshape(C).to(affine)
    return d_input, d_gamma, d_bias
