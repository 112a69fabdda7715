"""The benchmark suite's models, written with plain ``torch.nn``.

Every factory in :data:`MODELS` takes keyword arguments (``batch``, ``device``, ``dtype`` and a few
model-specific shape knobs, all with defaults) and returns ``(model.eval(), example_inputs)``.  Weights and
inputs are random but reproducible: each factory starts with ``torch.manual_seed(0)`` and draws everything on
the CPU before moving it to ``device``.  BatchNorm layers get random (non-trivial) running statistics and
affine parameters, so that BatchNorm folding is actually exercised.

:data:`SMALL` holds keyword arguments that shrink each model for quick smoke runs and tests.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Factory = Callable[..., tuple[nn.Module, tuple[Tensor, ...]]]

SEED = 0


def _finish(model: nn.Module, inputs: tuple[Tensor, ...], device: str | torch.device,
            dtype: torch.dtype) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """Move ``model`` and the floating-point ``inputs`` to ``device``/``dtype``; put the model in eval mode."""
    model = model.to(device=device, dtype=dtype).eval()
    moved = tuple(x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device=device) for x in inputs)
    return model, moved


def randomize_batchnorm(model: nn.Module) -> None:
    """Give every BatchNorm layer random running statistics and affine parameters (drawn from the global RNG).

    The values stay in a sane range (variance in [0.5, 1.5], scale in [0.5, 1.5]) so that activations neither
    explode nor vanish through deep networks.
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.running_mean.copy_(torch.randn_like(module.running_mean) * 0.1)
                module.running_var.copy_(torch.rand_like(module.running_var) + 0.5)
                module.weight.copy_(torch.rand_like(module.weight) + 0.5)
                module.bias.copy_(torch.randn_like(module.bias) * 0.1)


# --------------------------------------------------------------------------------------------------- seed


def seed(batch: int = 1, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
         size: int = 224) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """Conv-BN-ReLU twice (3 -> 64 -> 128 channels, 3x3, no padding) on a ``batch x 3 x size x size`` image."""
    torch.manual_seed(SEED)
    model = nn.Sequential(
        nn.Conv2d(3, 64, 3), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 128, 3), nn.BatchNorm2d(128), nn.ReLU(),
    )
    randomize_batchnorm(model)
    return _finish(model, (torch.randn(batch, 3, size, size),), device, dtype)


# ---------------------------------------------------------------------------------------------------- mlp


class MLP(nn.Module):
    """``layers`` x [Linear(dim, hidden) -> GELU -> Linear(hidden, dim)], then LayerNorm(dim)."""

    def __init__(self, dim: int = 1024, hidden: int = 4096, layers: int = 3) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[
            nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)) for _ in range(layers)
        ])
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.blocks(x))


def mlp(batch: int = 64, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
        dim: int = 1024, hidden: int = 4096) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """Three Linear-GELU-Linear blocks and a final LayerNorm on a ``batch x dim`` input."""
    torch.manual_seed(SEED)
    model = MLP(dim, hidden)
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        model.norm.weight.copy_(torch.rand(dim) + 0.5)
        model.norm.bias.copy_(torch.randn(dim) * 0.1)
    return _finish(model, (torch.randn(batch, dim),), device, dtype)


# ----------------------------------------------------------------------------------------------- resnet18


class BasicBlock(nn.Module):
    """ResNet basic block: two 3x3 conv-BN, a residual (projected when the shape changes), ReLU."""

    def __init__(self, in_ch: int, out_ch: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_ch)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_ch)
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out_ch))

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.downsample(x))


class ResNet18(nn.Module):
    """ResNet-18: 7x7/2 stem, 3x3/2 max-pool, four stages of two basic blocks, global average pool, fc."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, in_ch = [], 64
        for out_ch, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(in_ch, out_ch, stride), BasicBlock(out_ch, out_ch)))
            in_ch = out_ch
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: Tensor) -> Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18(batch: int = 1, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
             size: int = 224) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """ResNet-18 (random weights and BatchNorm statistics) on a ``batch x 3 x size x size`` image."""
    torch.manual_seed(SEED)
    model = ResNet18()
    randomize_batchnorm(model)
    return _finish(model, (torch.randn(batch, 3, size, size),), device, dtype)


# ---------------------------------------------------------------------------------------------------- gpt


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention written out by hand (no fused SDPA)."""

    def __init__(self, d_model: int, n_head: int, max_seq: int) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.register_buffer("mask", torch.tril(torch.ones(max_seq, max_seq)).view(1, 1, max_seq, max_seq))

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        hd = C // self.n_head
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, hd).transpose(1, 2)
        k = k.view(B, T, self.n_head, hd).transpose(1, 2)
        v = v.view(B, T, self.n_head, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_head: int, max_seq: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, max_seq)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """A small GPT: token + learned position embeddings, pre-LN blocks, final LayerNorm, untied lm_head."""

    def __init__(self, vocab: int = 8192, d_model: int = 768, n_head: int = 12, n_layer: int = 4,
                 max_seq: int = 1024) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(max_seq, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_head, max_seq) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: Tensor) -> Tensor:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def gpt(batch: int = 1, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
        seq: int = 256, vocab: int = 8192) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """4-layer GPT (d=768, 12 heads, max sequence 1024) on ``batch x seq`` random token ids."""
    if not 1 <= seq <= 1024:
        raise ValueError(f"gpt: seq must be in [1, 1024], got {seq}")
    torch.manual_seed(SEED)
    model = GPT(vocab=vocab)
    return _finish(model, (torch.randint(0, vocab, (batch, seq), dtype=torch.int64),), device, dtype)


# -------------------------------------------------------------------------------------------------- chain


class Chain(nn.Module):
    """A pointwise chain on two tensors followed by mean-centering and RMS normalisation over the last dim."""

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        x = torch.sigmoid(a) * torch.tanh(b) + F.silu(a - b)
        x = x - x.mean(-1, keepdim=True)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def chain(batch: int | None = None, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
          size: int = 4096) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """The elementwise-plus-reduction chain on two ``batch x size`` tensors (``batch`` defaults to ``size``)."""
    torch.manual_seed(SEED)
    rows = size if batch is None else batch
    return _finish(Chain(), (torch.randn(rows, size), torch.randn(rows, size)), device, dtype)


# ------------------------------------------------------------------------------------------------ registry

MODELS: dict[str, Factory] = {
    "seed": seed,
    "mlp": mlp,
    "resnet18": resnet18,
    "gpt": gpt,
    "chain": chain,
}

# Larger batches of the same models (the GPU suite: enough work to fill an H200).
MODELS["seed_b16"] = functools.partial(seed, batch=16)
MODELS["resnet18_b16"] = functools.partial(resnet18, batch=16)
MODELS["gpt_b8x512"] = functools.partial(gpt, batch=8, seq=512)

SUITE: list[str] = ["seed", "mlp", "resnet18", "gpt", "chain"]
GPU_SUITE: list[str] = ["seed", "seed_b16", "mlp", "resnet18", "resnet18_b16", "gpt", "gpt_b8x512", "chain"]

# Keyword arguments for quick smoke runs (``runner --small``) and tests.
SMALL: dict[str, dict[str, int]] = {
    "seed": {"size": 64},
    "mlp": {"batch": 8, "dim": 256, "hidden": 1024},
    "resnet18": {"size": 64},
    "gpt": {"seq": 16},
    "chain": {"size": 256},
}


def build(name: str, small: bool = False, **kwargs: object) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """Build model ``name`` (with :data:`SMALL` shapes when ``small``); ``kwargs`` override either."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known models are {sorted(MODELS)}")
    options = {**(SMALL.get(name.split("_")[0], {}) if small else {}), **kwargs}
    return MODELS[name](**options)
