"""What the zoo's two sources share: the entry type, the seed, finishing a built model (constant weights
perturbed, eval mode) and the text input shape.  (``zoo`` lists the transformers entries and imports
``zoo_torch`` for the torch.nn ones; both import this, so neither imports the other back.)"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import Tensor, nn

SIZES = ("ci", "full")
ATTENTIONS = ("sdpa", "eager")
SEED = 0


@dataclasses.dataclass(frozen=True)
class Spec:
    """One zoo architecture: how to build it at each size, and the attention implementations it has."""

    name: str
    family: str
    build: Callable[[str, str | None, int], tuple[nn.Module, tuple[Tensor, ...]]]  # size, attn, input seed
    attns: tuple[str | None, ...] = ATTENTIONS  # (None,): the model has no choice of attention
    fast_path: bool | None = None  # torch.nn modules: whether eager takes the fused inference fast path
    compiled_op: str | None = None  # ... and the fused op Dynamo leaves in the compiled graph (an extern)


def perturb_constants(model: nn.Module, generator: torch.Generator) -> None:
    """Add noise to every floating-point parameter and buffer whose elements are all equal (zero biases, unit
    norm scales, BatchNorm's initial statistics): kernels that read the wrong bias or scale then show it.

    Values stay near the original (scale 0.1, positive where the original was positive, as for a variance)."""
    with torch.no_grad():
        for tensor in list(model.parameters()) + list(model.buffers()):
            if not tensor.is_floating_point() or tensor.numel() < 2 or tensor.min() != tensor.max():
                continue
            noise = torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype) * 0.1
            value = tensor.flatten()[0].item()
            tensor.copy_(tensor * (1 + noise).abs() if value > 0 else tensor + noise)


def finish(model: nn.Module, inputs: tuple[Tensor, ...]) -> tuple[nn.Module, tuple[Tensor, ...]]:
    """Perturb constant weights (seeded), switch to eval mode, return ``(model, inputs)``."""
    perturb_constants(model, torch.Generator().manual_seed(SEED + 1))
    return model.eval(), inputs


def text_shape(size: str, seed: int = SEED) -> tuple[int, int, list[int]]:
    """(batch, sequence, valid lengths): CI pads one of two rows (which one and by how much depends on the
    seed, so a compiled mask cannot pass by being constant); full size is one unpadded row of 64."""
    if size != "ci":
        return 1, 64, [64]
    short = 9 + seed % 5
    return 2, 16, [16, short] if seed % 2 == 0 else [short, 16]
