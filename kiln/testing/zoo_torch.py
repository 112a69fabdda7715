"""The zoo's ``torch.nn`` entries: ``nn.MultiheadAttention``, ``nn.TransformerEncoder(Layer)`` and
``nn.TransformerDecoderLayer``, each on and off the inference fast path.

[Note: the torch.nn fast path] In eval mode with gradients off, ``batch_first=True``, an even head count, the
same tensor as query, key and value, boolean (not float) masks and no ``bias_k``/``add_zero_attn``,
``nn.MultiheadAttention`` calls the fused ``aten._native_multi_head_attention`` and
``nn.TransformerEncoderLayer`` calls ``aten._transformer_encoder_layer_fwd`` (both checks in
``torch/nn/modules/activation.py`` and ``transformer.py``).  Dynamo traces that branch, so the compiled graph
holds the fused op, which has no decomposition in torch: kiln writes it out in ATen ops
(kiln/frontend/fused_layers.py), so no fused op reaches kiln's graph.  Any other setting (a float
mask, ``need_weights=True`` with cross-attention, ``batch_first=False``, a custom activation) takes the slow
path of plain ATen ops.  ``FAST_OPS`` names the fused ops; ``aten_ops`` records which ATen ops an eager call
ran, so a test can assert which path it exercised.  Dynamo itself traces ``nn.MultiheadAttention``'s slow path
even where eager takes the fast one (its ``_is_make_fx_tracing()`` check is true while Dynamo traces), so only
``_transformer_encoder_layer_fwd`` reaches kiln: the compiled side of ``mha_self`` and ``decoder_fast`` is the
slow path, compared with eager's fast one.  ``nn.TransformerEncoder`` is built with
``enable_nested_tensor=False``: its nested-tensor path zeroes padded positions in eager only (Dynamo skips it),
so eager and compiled results would differ there by design.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from kiln.testing.zoo_base import SEED, Spec, finish, text_shape

FAST_OPS = frozenset({"_native_multi_head_attention", "_transformer_encoder_layer_fwd"})
# (width, heads, feed-forward width, key width, value width) per size: CI, and a transformer-base layer
DIMS = {"ci": (64, 4, 128, 48, 40), "full": (512, 8, 2048, 384, 256)}


class _Record(TorchDispatchMode):
    """Collects the names of the ATen ops that run under it (a dispatch mode leaves the fast-path checks,
    which look for torch-function overrides, unaffected)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.ops.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def aten_ops(model: nn.Module, inputs: tuple[Tensor, ...]) -> set[str]:
    """Names of the ATen ops one eager call ``model(*inputs)`` runs (call it under ``torch.inference_mode``)."""
    record = _Record()
    with record:
        model(*inputs)
    return record.ops


class SelfAttention(nn.Module):
    """``nn.MultiheadAttention`` as self-attention with a key padding mask, outputs only (fast path)."""

    def __init__(self, size: str) -> None:
        super().__init__()
        dim, heads = DIMS[size][:2]
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)

    def forward(self, x: Tensor, key_padding_mask: Tensor) -> Any:
        return self.attn(x, x, x, key_padding_mask=key_padding_mask, need_weights=False)


class CrossAttention(nn.Module):
    """``nn.MultiheadAttention`` over keys of another width (``kdim``/``vdim``), sequence-first, with a float
    mask, ``bias_k``/``bias_v`` and averaged attention weights returned: every slow-path feature at once."""

    def __init__(self, size: str) -> None:
        super().__init__()
        dim, heads, _, kdim, vdim = DIMS[size]
        self.attn = nn.MultiheadAttention(dim, heads, kdim=kdim, vdim=vdim, add_bias_kv=True)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor) -> Any:
        return self.attn(query, key, value, attn_mask=mask, need_weights=True)


class Encoder(nn.Module):
    """Two ``nn.TransformerEncoderLayer`` (``nn.TransformerEncoder``) with a key padding mask."""

    def __init__(self, size: str, fast: bool) -> None:
        super().__init__()
        dim, heads, ffn = DIMS[size][:3]
        # fast: batch-first, gelu; slow: sequence-first, pre-norm, an activation given as a function
        layer = (nn.TransformerEncoderLayer(dim, heads, ffn, batch_first=True, activation="gelu") if fast else
                 nn.TransformerEncoderLayer(dim, heads, ffn, activation=F.silu, norm_first=True))
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x: Tensor, key_padding_mask: Tensor) -> Tensor:
        return self.encoder(x, src_key_padding_mask=key_padding_mask)


class Decoder(nn.Module):
    """``nn.TransformerDecoderLayer``: fast self-attention (boolean padding mask, batch-first) or slow (float
    causal mask, pre-norm); the cross-attention always takes the slow path (query is not key)."""

    def __init__(self, size: str, fast: bool) -> None:
        super().__init__()
        self.fast = fast
        dim, heads, ffn = DIMS[size][:3]
        self.layer = nn.TransformerDecoderLayer(dim, heads, ffn, batch_first=True, norm_first=not fast)

    def forward(self, tgt: Tensor, memory: Tensor, tgt_padding: Tensor, memory_padding: Tensor) -> Tensor:
        if self.fast:
            return self.layer(tgt, memory, tgt_key_padding_mask=tgt_padding, memory_key_padding_mask=memory_padding)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        return self.layer(tgt, memory, tgt_mask=causal, memory_key_padding_mask=memory_padding, tgt_is_causal=True)


def _padding(batch: int, seq: int, lengths: list[int]) -> Tensor:
    """Boolean key padding mask: True (ignored) after each row's length."""
    return torch.arange(seq)[None, :] >= torch.tensor(lengths)[:, None]


def _inputs(name: str, size: str, seed: int) -> tuple[Tensor, ...]:
    """Inputs for the torch.nn entries: CI batch 2 x 16 with one row padded (as ``zoo.text_shape``); full 1 x 64."""
    g = torch.Generator().manual_seed(seed)
    batch, seq, lengths = text_shape(size, seed)
    dim, _, _, kdim, vdim = DIMS[size]
    x = torch.randn(batch, seq, dim, generator=g)
    pad = _padding(batch, seq, lengths)
    if name == "mha_cross":
        causal = torch.triu(torch.full((seq, seq + 4), float("-inf")), diagonal=5)  # every row keeps a key
        return (x.transpose(0, 1).contiguous(), torch.randn(seq + 4, batch, kdim, generator=g),
                torch.randn(seq + 4, batch, vdim, generator=g), causal)
    if name == "encoder_slow":
        return x.transpose(0, 1).contiguous(), pad
    if name.startswith("decoder"):
        memory = torch.randn(batch, seq + 3, dim, generator=g)
        return x, memory, pad, _padding(batch, seq + 3, [length + 3 for length in lengths[::-1]])
    return x, pad


# name -> (module factory, eager takes the fast path, the fused op left in kiln's compiled graph)
FACTORIES: dict[str, tuple[Callable[[str], nn.Module], bool, str | None]] = {
    "mha_self": (SelfAttention, True, None),
    "mha_cross": (CrossAttention, False, None),
    "encoder_fast": (lambda size: Encoder(size, fast=True), True, None),  # (decomposed by kiln)
    "encoder_slow": (lambda size: Encoder(size, fast=False), False, None),
    "decoder_fast": (lambda size: Decoder(size, fast=True), True, None),
    "decoder_slow": (lambda size: Decoder(size, fast=False), False, None),
}


def specs() -> list[Spec]:
    """The zoo entries."""

    def entry(name: str) -> Any:
        factory, fast, compiled_op = FACTORIES[name]

        def build(size: str, attn: str | None, input_seed: int) -> tuple[nn.Module, tuple[Tensor, ...]]:
            torch.manual_seed(SEED)
            return finish(factory(size), _inputs(name, size, input_seed))
        return Spec(name, "torch.nn", build, (None,), fast, compiled_op)
    return [entry(name) for name in FACTORIES]
