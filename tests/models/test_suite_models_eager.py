"""Sanity of the benchmark suite's model factories (benchmarks/models.py), eagerly, at small shapes."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # benchmarks/ is not an installed package
    sys.path.insert(0, str(REPO))

from benchmarks import models, runner  # noqa: E402

# (factory keyword arguments, expected output shape)
CASES: dict[str, tuple[dict[str, int], tuple[int, ...]]] = {
    "seed": ({"size": 64}, (1, 128, 60, 60)),
    "mlp": ({"batch": 4, "dim": 128, "hidden": 256}, (4, 128)),
    "resnet18": ({"size": 64}, (1, 1000)),
    "gpt": ({"seq": 16}, (1, 16, 8192)),
    "chain": ({"size": 64}, (64, 64)),
}


def _run(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    with torch.inference_mode():
        return model(*inputs)


def test_registry_matches_suite():
    assert models.SUITE == ["seed", "mlp", "resnet18", "gpt", "chain"]
    assert set(models.SUITE) == set(models.SMALL) == set(CASES)
    assert set(models.MODELS) == set(models.SUITE) | set(models.GPU_SUITE)
    assert list(runner.DEFAULT_SUITE) == models.SUITE  # the runner keeps its own copy to avoid importing torch
    assert list(runner.GPU_SUITE) == models.GPU_SUITE


@pytest.mark.parametrize("name", list(CASES))
def test_factory_builds_and_runs(name):
    kwargs, shape = CASES[name]
    model, inputs = models.MODELS[name](**kwargs)
    assert isinstance(model, nn.Module) and not model.training
    assert isinstance(inputs, tuple) and inputs and all(isinstance(x, torch.Tensor) for x in inputs)
    for x in inputs:
        assert x.count_nonzero() > 0, "inputs must be random, never zeros"
    out = _run(model, inputs)
    assert tuple(out.shape) == shape
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
    assert out.abs().max() > 0


@pytest.mark.parametrize("name", ["seed", "chain", "gpt"])
def test_factory_is_deterministic(name):
    kwargs, _ = CASES[name]
    (m1, x1), (m2, x2) = models.MODELS[name](**kwargs), models.MODELS[name](**kwargs)
    for a, b in zip(x1, x2):
        assert torch.equal(a, b)
    assert torch.equal(_run(m1, x1), _run(m2, x2))


def test_small_shapes_build():
    model, inputs = models.build("chain", small=True)
    assert tuple(inputs[0].shape) == (models.SMALL["chain"]["size"],) * 2
    with pytest.raises(KeyError, match="unknown model"):
        models.build("nope")


def test_batchnorm_is_not_trivial():
    model, _ = models.seed(size=16)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert len(bns) == 2
    for bn in bns:
        assert not torch.allclose(bn.running_mean, torch.zeros_like(bn.running_mean))
        assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
        assert not torch.allclose(bn.weight, torch.ones_like(bn.weight))
        assert not torch.allclose(bn.bias, torch.zeros_like(bn.bias))
        assert (bn.running_var > 0).all()


def test_gpt_inputs_and_causality():
    model, (idx,) = models.gpt(seq=8)
    assert idx.dtype == torch.int64 and idx.min() >= 0 and idx.max() < 8192
    assert model.blocks[0].attn.mask.shape == (1, 1, 1024, 1024)
    # Changing the last token must not change the logits of earlier positions.
    changed = idx.clone()
    changed[0, -1] = (changed[0, -1] + 1) % 8192
    a, b = _run(model, (idx,)), _run(model, (changed,))
    torch.testing.assert_close(a[:, :-1], b[:, :-1])
    assert not torch.allclose(a[:, -1], b[:, -1])


def test_chain_rows_are_normalized():
    model, inputs = models.chain(size=64)
    out = _run(model, inputs)
    torch.testing.assert_close(out.mean(-1), torch.zeros(64), atol=1e-5, rtol=0)
    torch.testing.assert_close(out.pow(2).mean(-1), torch.ones(64), atol=1e-3, rtol=0)


def test_dtype_and_batch_keywords():
    model, (a, b) = models.chain(batch=3, size=32, dtype=torch.float64)
    assert a.shape == (3, 32) and a.dtype == torch.float64
    assert _run(model, (a, b)).dtype == torch.float64
    model, (x,) = models.mlp(batch=2, dim=32, hidden=64, dtype=torch.float64)
    assert x.shape == (2, 32) and next(model.parameters()).dtype == torch.float64
