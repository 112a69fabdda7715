"""A training step of every zoo model (issue 20): the model in training mode, compiled by kiln whole
(``fallback=False``: AOTAutograd's forward and backward graphs, [Note: training graphs]), one forward and
backward; the loss and every parameter's gradient against eager's on the same weights and inputs.

Dropout, layer drop and wav2vec2's SpecAugment masks are turned off (random in training mode, so the gradients
would differ by design - tests/cpu/test_training.py checks dropout's distribution); BatchNorm runs in training
mode (batch statistics, running statistics updated).  A gradient is compared at the scale of the model's gradients: an
attention key's bias has a gradient of exactly zero in exact arithmetic (softmax does not see a constant added
to every key), so both eager's and kiln's are rounding noise (~1e-9) whose relative difference means nothing."""
import copy

import pytest
import torch

from kiln.report import mark, reports_since
from kiln.testing import zoo

pytest.importorskip("transformers")
pytestmark = pytest.mark.zoo

RTOL = 1e-3        # of a gradient, against its own largest entry (as the inference zoo's outputs)
ATOL_SCALE = 1e-5  # ... plus this fraction of the largest gradient entry of the whole model


def _without_randomness(model: torch.nn.Module) -> None:
    """Dropout, layer drop and SpecAugment's masks off: what training mode draws at random."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
        owners = [m] + ([m.config] if getattr(m, "config", None) is not None else [])
        for owner in owners:  # (transformers: ``self.dropout_prob``, ``config.layerdrop``, ...)
            for key, value in list(vars(owner).items()):
                if ("dropout" in key or "layerdrop" in key) and isinstance(value, float):
                    setattr(owner, key, 0.0)
                if key == "apply_spec_augment" and value:
                    setattr(owner, key, False)


def _loss(out) -> torch.Tensor:
    """Every floating output leaf, weighted by a ramp (a plain sum would cancel through softmax and LayerNorm)."""
    total = torch.zeros(())
    for _, t in zoo.leaves(out):
        if t.is_floating_point():
            ramp = torch.linspace(-1.0, 1.0, t.numel(), dtype=torch.float32).view(t.shape)
            total = total + (t.float() * ramp).sum()
    return total


@pytest.mark.parametrize("name", sorted(zoo.specs()))
def test_zoo_model_training_step_matches_eager(name):
    torch._dynamo.reset()
    model, inputs = zoo.build(name, "ci")
    model.train()
    _without_randomness(model)
    ref = copy.deepcopy(model)
    position = mark()
    compiled = torch.compile(model, backend="kiln", options={"fallback": False})
    loss = _loss(compiled(*inputs))
    loss.backward()
    expected = _loss(ref(*inputs))
    expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-4, atol=1e-4)
    scale = max(q.grad.abs().max().item() for q in ref.parameters() if q.grad is not None)
    for (param, p), q in zip(model.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None), param
        if q.grad is not None:
            err = (p.grad - q.grad).abs().max().item()
            bound = RTOL * q.grad.abs().max().item() + ATOL_SCALE * scale
            assert err <= bound, f"{param}: gradient differs by {err:.2e} (bound {bound:.2e})"
    for (buffer, b), c in zip(model.named_buffers(), ref.buffers()):  # (BatchNorm's running statistics)
        if b.is_floating_point():
            torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-5, msg=buffer)
    reports = reports_since(position)
    # (one forward and one backward graph, or more where Dynamo breaks the graph: wav2vec2's training path)
    parts = [r.training.split(";")[0] for r in reports]
    assert parts.count("forward") == parts.count("backward") >= 1, [r.name for r in reports]
    assert all(r.fallback is None for r in reports)
