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
            **fused_layer_decompositions(), **foreach_decompositions()}
