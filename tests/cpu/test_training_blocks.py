"""Training steps of the layers models are built from, each compiled by kiln and stepped against an eager copy:
attention (with padding and causal masks), transformer encoder and decoder layers, recurrent layers (Dynamo runs
them eagerly), 1-d/2-d/transposed/depthwise convolutions with group, instance and batch norms, tied and bagged
embeddings, pooling, upsampling, gated MLPs with RMSNorm, sorting, gathers and scatters, padding and unfolding,
checkpointed regions.  Every parameter's gradient matches eager's over three SGD steps (issue 20's 1e-4), except
those whose exact gradient is zero (a bias before a norm: rounding noise, below 1e-4 of the model's largest)."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from kiln.report import mark, reports_since


class _Apply(nn.Module):
    """A function of the inputs around the given submodules (their parameters are the model's)."""

    def __init__(self, fn, **modules):
        super().__init__()
        self.fn = fn
        self.parts = nn.ModuleDict(modules)

    def forward(self, *inputs):
        return self.fn(self.parts, *inputs)


def _causal_decoder(p, x, memory):
    return p["m"](x, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(x.shape[1]))


def _sdpa_causal(p, x):
    q, k, v = p["qkv"](x).view(2, 9, 3, 4, 8).permute(2, 0, 3, 1, 4)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 9, 32)


def _tied(p, ids):
    return F.linear(p["ln"](p["e"](ids)), p["e"].weight)


def _swiglu(p, x):
    h = p["n"](x)
    return x + p["c"](F.silu(p["a"](h)) * p["b"](h))


def _sorting(p, x):
    y = p["l"](x)
    return y.cumsum(-1) + y.sort(-1).values + y.topk(3, -1).values.sum(-1, keepdim=True)


def _gather_scatter(p, x, i):
    y = p["l"](x)
    return y.gather(1, i).sum(-1, keepdim=True) * 2 + torch.zeros_like(y).scatter_add(1, i, y[:, :3])


def _reductions(p, x):
    y = p["l"](x)
    return torch.logsumexp(y, -1) + y.norm(dim=-1) + y.var(-1) + y.abs().amax(-1)


def _padding_mask():
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    return pad


def _softmax_mask():
    m = torch.rand(5, 12) < 0.3
    m[:, 0] = False
    return m


BUILDERS = {
    "mha": lambda: (_Apply(lambda p, x: p["m"](x, x, x, need_weights=False)[0],
                           m=nn.MultiheadAttention(32, 4, batch_first=True)), (torch.randn(2, 7, 32),)),
    "mha_padding_mask": lambda: (_Apply(lambda p, x, pad: p["m"](x, x, x, key_padding_mask=pad)[0],
                                        m=nn.MultiheadAttention(32, 4, batch_first=True)),
                                 (torch.randn(2, 7, 32), _padding_mask())),
    "encoder_layer": lambda: (nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
                              (torch.randn(2, 9, 32),)),
    "encoder_layer_norm_first_gelu": lambda: (nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True,
                                                                         norm_first=True, activation="gelu"),
                                              (torch.randn(2, 9, 32),)),
    "decoder_layer_causal": lambda: (_Apply(_causal_decoder, m=nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0,
                                                                                           batch_first=True)),
                                     (torch.randn(2, 6, 32), torch.randn(2, 5, 32))),
    "gru": lambda: (_Apply(lambda p, x: p["m"](x)[0], m=nn.GRU(8, 16, batch_first=True)), (torch.randn(3, 5, 8),)),
    "lstm_2_layers": lambda: (_Apply(lambda p, x: p["m"](x)[0], m=nn.LSTM(8, 16, num_layers=2, batch_first=True)),
                              (torch.randn(3, 5, 8),)),
    "conv1d_group_norm": lambda: (nn.Sequential(nn.Conv1d(4, 16, 3, padding=1), nn.GroupNorm(4, 16), nn.SiLU(),
                                                nn.Conv1d(16, 8, 5, stride=2)), (torch.randn(2, 4, 33),)),
    "conv_transpose_instance_norm": lambda: (nn.Sequential(
        nn.ConvTranspose2d(4, 8, 3, stride=2, padding=1, output_padding=1), nn.InstanceNorm2d(8, affine=True),
        nn.LeakyReLU(0.1)), (torch.randn(2, 4, 7, 7),)),
    "depthwise_batch_norm": lambda: (nn.Sequential(
        nn.Conv2d(8, 8, 3, groups=8, padding=1), nn.BatchNorm2d(8), nn.Hardswish(), nn.Conv2d(8, 16, 1),
        nn.BatchNorm2d(16), nn.ReLU6()), (torch.randn(4, 8, 10, 10),)),
    "tied_embedding": lambda: (_Apply(_tied, e=nn.Embedding(50, 16, padding_idx=0), ln=nn.LayerNorm(16)),
                               (torch.randint(0, 50, (3, 11)),)),
    "embedding_bag": lambda: (nn.EmbeddingBag(40, 8, mode="mean"), (torch.randint(0, 40, (4, 6)),)),
    "sdpa_causal": lambda: (_Apply(_sdpa_causal, qkv=nn.Linear(32, 96)), (torch.randn(2, 9, 32),)),
    "masked_softmax": lambda: (_Apply(lambda p, x, m: torch.softmax(p["l"](x).masked_fill(m, float("-inf")), -1) * x,
                                      l=nn.Linear(12, 12)), (torch.randn(5, 12), _softmax_mask())),
    "pooling": lambda: (nn.Sequential(nn.Conv2d(3, 8, 3), nn.MaxPool2d(3, 2, ceil_mode=True),
                                      nn.Conv2d(8, 8, 3, padding=1), nn.AvgPool2d(2), nn.Flatten(),
                                      nn.Linear(8 * 3 * 3, 5)), (torch.randn(2, 3, 15, 15),)),
    "upsample": lambda: (nn.Sequential(nn.Conv2d(3, 4, 1), nn.Upsample(scale_factor=2, mode="bilinear"),
                                       nn.Conv2d(4, 2, 3, padding=1)), (torch.randn(2, 3, 6, 6),)),
    "prelu_elu_selu": lambda: (nn.Sequential(nn.Linear(10, 20), nn.PReLU(20), nn.Linear(20, 20), nn.ELU(),
                                             nn.Linear(20, 20), nn.SELU(), nn.Linear(20, 3), nn.LogSoftmax(-1)),
                               (torch.randn(6, 10),)),
    "rms_norm_swiglu": lambda: (_Apply(_swiglu, n=nn.RMSNorm(16), a=nn.Linear(16, 32, bias=False),
                                       b=nn.Linear(16, 32, bias=False), c=nn.Linear(32, 16, bias=False)),
                                (torch.randn(3, 5, 16),)),
    "cumsum_sort_topk": lambda: (_Apply(_sorting, l=nn.Linear(10, 10)), (torch.randn(4, 10),)),
    "gather_scatter": lambda: (_Apply(_gather_scatter, l=nn.Linear(10, 10)),
                               (torch.randn(4, 10), torch.randint(0, 10, (4, 3)))),
    "reflect_pad_unfold": lambda: (_Apply(lambda p, x: F.unfold(F.pad(p["c"](x), (1, 2, 0, 1), mode="reflect"), 2)
                                          .pow(2).mean(1), c=nn.Conv2d(2, 3, 3)), (torch.randn(2, 2, 8, 8),)),
    "layer_norm_transposed_input": lambda: (_Apply(lambda p, x: F.layer_norm(p["l"](x.transpose(0, 1)), (16,))
                                                   * x.transpose(0, 1).sigmoid(), l=nn.Linear(16, 16)),
                                            (torch.randn(5, 3, 16),)),
    "checkpoint": lambda: (_Apply(lambda p, x: torch.utils.checkpoint.checkpoint(p["a"], x, use_reentrant=False) + x,
                                  a=nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))),
                           (torch.randn(4, 8),)),
    "logsumexp_norm_var": lambda: (_Apply(_reductions, l=nn.Linear(8, 8)), (torch.randn(6, 8),)),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_block_trains_like_eager(name):
    torch.manual_seed(0)
    model, inputs = BUILDERS[name]()
    model.train()
    ref = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="kiln")
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.05), torch.optim.SGD(ref.parameters(), lr=0.05)
    position = mark()
    for step in range(3):
        for m, o in ((compiled, opt), (ref, ref_opt)):
            o.zero_grad()
            out = m(*inputs)
            (out.float() * torch.randn(out.shape, generator=torch.Generator().manual_seed(step))).sum().backward()
            o.step()
        scale = max(q.grad.abs().max().item() for q in ref.parameters() if q.grad is not None)
        for (n, p), q in zip(model.named_parameters(), ref.parameters()):
            assert (p.grad is None) == (q.grad is None), n
            if q.grad is None or q.grad.abs().max() < 1e-4 * scale:
                continue
            err = ((p.grad - q.grad).abs().max() / q.grad.abs().max()).item()
            assert err <= 1e-4, f"{name}: {n} at step {step}: relative difference {err:.2e}"
    assert all(r.fallback is None for r in reports_since(position)), [r.fallback for r in reports_since(position)]
