"""ATen's fused ``nn.TransformerEncoderLayer`` (``aten._transformer_encoder_layer_fwd``, the eval fast path) is
decomposed by kiln (kiln/frontend/fused_layers.py) and compiled like any layer: checked against eager's fused
op for both norm orders, both activations and every mask kind the layer passes (none, key padding, an
attention mask, both merged), including a batch whose keys are all masked (NaN in eager)."""
import pytest
import torch
from torch import nn

import kiln
from kiln.report import mark, reports_since
from kiln.testing.zoo_torch import aten_ops


def _layer(norm_first: bool, activation: str) -> nn.Module:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, activation=activation, norm_first=norm_first)
    return layer.eval()


class _Masked(nn.Module):
    def __init__(self, layer: nn.Module, kind: str):
        super().__init__()
        self.layer, self.kind = layer, kind

    def forward(self, x, padding):
        seq = x.shape[1]
        causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=x.device), 1)
        if self.kind == "none":
            return self.layer(x)
        if self.kind == "padding":
            return self.layer(x, src_key_padding_mask=padding)
        if self.kind == "causal":
            return self.layer(x, src_mask=causal)
        return self.layer(x, src_mask=causal, src_key_padding_mask=padding)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("kind", ["none", "padding", "causal", "both"])
def test_encoder_layer_fast_path_matches_eager(norm_first, activation, kind):
    model = _Masked(_layer(norm_first, activation), kind)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, 9, 32, generator=gen)
    padding = torch.zeros(3, 9, dtype=torch.bool)
    padding[1, 5:] = True
    padding[2, :] = True  # a batch with no key left: the native op's output is NaN there
    with torch.inference_mode():
        assert "_transformer_encoder_layer_fwd" in aten_ops(model, (x, padding))  # (eager took the fast path)
        expected = model(x, padding)
        position = mark()
        got = kiln.compile(model, fallback=False)(x, padding)
    torch.testing.assert_close(got, expected, rtol=1.3e-5, atol=2e-5, equal_nan=True)
    externs = [name for report in reports_since(position) for name in report.externs]
    assert externs and not any("transformer_encoder" in name for name in externs), externs


@pytest.mark.parametrize("mask_shape,mask_type", [((3, 4, 9, 9), 2), ((9, 9), 0), ((3, 9), 1)])
def test_decomposition_fills_queries_without_keys_in_any_head(mask_shape, mask_type):
    """Every ``mask_type``: one mask per head (2), where a single head of one query has no key (the merged
    row - every head's output through the projection - is NaN in the native op), one shared by the batch (0),
    and a key padding mask (1)."""
    from kiln.frontend.fused_layers import transformer_encoder_layer
    layer = _layer(False, "gelu")
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(3, 9, 32, generator=gen)
    mask = torch.rand(mask_shape, generator=gen) < 0.3
    mask[..., 0] = False
    mask[{2: (1, 2, 4), 0: (4,), 1: (1,)}[mask_type]] = True  # that query (of that head) has no key
    attn, ffn = layer.self_attn, (layer.linear1, layer.linear2)
    args = (x, 32, 4, attn.in_proj_weight, attn.in_proj_bias, attn.out_proj.weight, attn.out_proj.bias, False,
            False, layer.norm1.eps, layer.norm1.weight, layer.norm1.bias, layer.norm2.weight, layer.norm2.bias,
            ffn[0].weight, ffn[0].bias, ffn[1].weight, ffn[1].bias, mask, mask_type)
    with torch.inference_mode():
        expected = torch.ops.aten._transformer_encoder_layer_fwd(*args)
        got = transformer_encoder_layer(*args)
    assert expected.isnan().any()
    torch.testing.assert_close(got, expected, rtol=1.3e-5, atol=2e-5, equal_nan=True)
