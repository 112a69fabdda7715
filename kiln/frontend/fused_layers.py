"""Decompositions of ATen's fused inference layers, which have none of their own in torch.

``nn.TransformerEncoderLayer`` in eval mode with gradients off (batch-first, even head count, boolean or
canonical float masks: the "fast path", see kiln/testing/zoo_torch.py) calls ``aten._transformer_encoder_layer_fwd``:
the whole layer - QKV projection, attention, output projection, residual adds, two LayerNorms and the
feed-forward block - as one opaque op.  As an extern kiln can only call it (measured on the zoo's two-layer
encoder, one thread: kiln 1.01x eager where Inductor is 1.13x); written out in ATen ops, its projections
become kiln's GEMMs with fused bias and activation epilogues, its norms fuse with the residual adds, and its
attention is the fused attention library call (``aten._scaled_dot_product_flash_attention_for_cpu`` on CPUs,
kept whole by ``decompositions.KEEP_WHOLE``).

The op's semantics (torch's ``transformer_encoder_layer_forward`` and ``native_multi_head_attention``):

    x = layer_norm_1(src) if norm_first else src
    q, k, v = split_heads(x @ qkv_weight.T + qkv_bias)
    a = softmax(q @ k.T / sqrt(head_dim), masked where ``mask`` is True or non-zero) @ v
    x = merge_heads(a) @ proj_weight.T + proj_bias + src
    x = layer_norm_1(x) unless norm_first
    ffn = activation(norm_first ? layer_norm_2(x) : x) @ W1.T + b1) @ W2.T + b2   (GELU or ReLU)
    out = x + ffn, then layer_norm_2 unless norm_first

``mask_type`` says how ``mask`` broadcasts over the ``[B, H, T, T]`` scores: 0 ``[T, T]`` (attention mask),
1 ``[B, T]`` (key padding), 2 any shape that broadcasts.  A query whose keys are all masked comes out NaN from
the native op (its whole row, through the residual and the norms); SDPA gives zeros there, so such rows are
set to NaN explicitly - after the output projection, not before: a row with a NaN gives a NaN row through any
linear map (NaN times any weight, zero included, is NaN), so the result is the same, and the fill fuses into
the residual add's kernel instead of costing a pass (and a kernel compile) over the attention output.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

aten = torch.ops.aten


def transformer_encoder_layer(src: Tensor, embed_dim: int, num_heads: int, qkv_weight: Tensor, qkv_bias: Tensor,
                              proj_weight: Tensor, proj_bias: Tensor, use_gelu: bool, norm_first: bool,
                              eps: float, norm_weight_1: Tensor, norm_bias_1: Tensor, norm_weight_2: Tensor,
                              norm_bias_2: Tensor, ffn_weight_1: Tensor, ffn_bias_1: Tensor, ffn_weight_2: Tensor,
                              ffn_bias_2: Tensor, mask: Tensor | None = None, mask_type: int | None = None) -> Tensor:
    """``aten._transformer_encoder_layer_fwd`` in ATen ops (module docstring)."""
    if src.dim() != 3 or src.shape[-1] != embed_dim or embed_dim % num_heads:
        return NotImplemented  # (the op's own checks reject these; let it say so)
    batch, seq, width = src.shape
    head = width // num_heads
    x = F.layer_norm(src, (width,), norm_weight_1, norm_bias_1, eps) if norm_first else src
    qkv = F.linear(x, qkv_weight, qkv_bias).view(batch, seq, 3, num_heads, head).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    no_key = None
    if mask is None:
        attn = F.scaled_dot_product_attention(q, k, v)
    else:
        masked = mask if mask.dtype == torch.bool else mask != 0
        if mask_type == 1:  # key padding [B, T]
            masked = masked.view(batch, 1, 1, seq)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=~masked)
        no_key = _queries_without_keys(masked)
    x = F.linear(attn.transpose(1, 2).reshape(batch, seq, width), proj_weight, proj_bias)
    if no_key is not None:  # no key left: NaN, as the op (module docstring: filled after the projection)
        x = x.masked_fill(no_key, float("nan"))
    x = x + src
    if not norm_first:
        x = F.layer_norm(x, (width,), norm_weight_1, norm_bias_1, eps)
    residual = x
    if norm_first:
        x = F.layer_norm(x, (width,), norm_weight_2, norm_bias_2, eps)
    hidden = F.linear(x, ffn_weight_1, ffn_bias_1)
    hidden = F.gelu(hidden) if use_gelu else F.relu(hidden)
    x = F.linear(hidden, ffn_weight_2, ffn_bias_2) + residual
    if not norm_first:
        x = F.layer_norm(x, (width,), norm_weight_2, norm_bias_2, eps)
    return x


def _queries_without_keys(masked: Tensor) -> Tensor:
    """``[b, t, 1]`` (each dim 1 or the batch's and sequence's size): True where some head of query ``t`` has
    every key masked.  ``masked`` (True: masked) broadcasts over the ``[B, H, T, T]`` scores."""
    full = masked.all(-1)  # [..., T_query]: the last three of [B, H, T_query] that the mask has
    while full.dim() < 3:
        full = full.unsqueeze(0)
    if full.shape[1] != 1:  # a mask per head: one head with no key is enough for NaN in the merged row
        full = full.any(1, keepdim=True)
    return full.view(full.shape[0], full.shape[2], 1)


def fused_layer_decompositions() -> dict[Any, Any]:
    return {aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer}
