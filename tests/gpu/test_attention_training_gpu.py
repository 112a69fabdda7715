"""Attention layers trained through kiln on the GPU under bf16 autocast: first-step gradients against eager's
and against float32 - the check that would have caught BERT's wrong gradients (session 44: cuDNN's attention
backward read kiln's contiguous output through the query's strides; [Note: cuDNN attention's backward reads its
operands in the forward's layouts]).  With a padding mask (on Hopper ATen picks cuDNN's attention for it) and
without, with and without ``attention_result_layouts``.  CUDA only: the interpreter runs the CPU's attention."""
import copy

import pytest
import torch
import torch.nn as nn

import kiln
from tests.gpu.conftest import HAS_CUDA

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


class _Layer(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads, self.qkv, self.out, self.norm = heads, nn.Linear(d, 3 * d), nn.Linear(d, d), nn.LayerNorm(d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = (u.transpose(1, 2) for u in self.qkv(x).view(b, t, 3, self.heads, d // self.heads).unbind(2))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.norm(x + self.out(y.transpose(1, 2).reshape(b, t, d)))


class _Encoder(nn.Module):
    def __init__(self, d: int = 256, heads: int = 4, layers: int = 2):
        super().__init__()
        self.layers = nn.ModuleList(_Layer(d, heads) for _ in range(layers))

    def forward(self, x, mask):
        for layer in self.layers:
            x = layer(x, mask)
        return x


def _grads(model, x, mask, autocast):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
        out = model(x, mask)
    out.float().square().mean().backward()
    return torch.cat([p.grad.float().flatten() for p in model.parameters()])


@pytest.mark.parametrize("layouts", [False, True])
@pytest.mark.parametrize("masked", [True, False])
def test_first_step_gradients_under_autocast(masked, layouts):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _Encoder().cuda()
    eager, exact = copy.deepcopy(model), copy.deepcopy(model)
    x = torch.randn(4, 128, 256, device="cuda")
    mask = None
    if masked:  # (right padding: the last positions of each sequence masked out, as BERT's batches are)
        lengths = torch.tensor([128, 100, 64, 17], device="cuda")
        keep = torch.arange(128, device="cuda")[None, :] < lengths[:, None]
        mask = torch.zeros(4, 1, 1, 128, device="cuda").masked_fill(~keep[:, None, None, :], float("-inf"))
    compiled = kiln.compile(model, fallback=False, attention_result_layouts=layouts)
    ref = _grads(exact, x, mask, autocast=False)  # (float32: TF32 off by default for matmuls)
    kiln_error = ((_grads(compiled, x, mask, True) - ref).norm() / ref.norm()).item()
    eager_error = ((_grads(eager, x, mask, True) - ref).norm() / ref.norm()).item()
    assert kiln_error < 2 * eager_error + 5e-3, (kiln_error, eager_error)
