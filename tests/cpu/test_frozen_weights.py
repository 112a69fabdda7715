"""[Note: frozen weights that change] (compiler.py): an inference graph freezes the module's weights and derives
constants from them (packed GEMM panels, Conv-BatchNorm folds); an in-place update after the compile -
``load_state_dict``, an optimizer step between evaluations, ``p.add_`` under ``no_grad`` - compiles the graph
again from the new values instead of answering with the old ones."""
import pytest
import torch
import torch.nn as nn

from kiln import config
from kiln.report import mark, reports_since


def _compiled(model):
    torch._dynamo.reset()
    return torch.compile(model, backend="kiln")


def _close(got, want):
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_load_state_dict_after_the_compile_takes_the_new_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 64)).eval()
    x = torch.randn(64, 256)
    with config.scope(choices="gemm=kiln"), torch.no_grad():  # (packed weights: constants derived at compile)
        compiled = _compiled(model)
        position = mark()
        _close(compiled(x), model(x))
        _close(compiled(x), model(x))
        reports = reports_since(position)
        assert reports and all(r.weights_changed == 0 for r in reports)  # (unchanged weights: no recompile)
        model.load_state_dict({k: torch.randn_like(v) * 0.05 for k, v in model.state_dict().items()})
        _close(compiled(x), model(x))
        model[0].bias.add_(1.0)
        _close(compiled(x), model(x))
    assert sum(r.weights_changed for r in reports) == 2


def test_an_optimizer_step_between_evaluations_is_seen():
    """Training eagerly, evaluating compiled under no_grad: each evaluation after a step uses the stepped weights
    (Conv-BatchNorm folded, the linear packed)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 16 * 16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    compiled = _compiled(model)
    for _ in range(3):
        model.train()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            _close(compiled(x), model(x))


@pytest.mark.parametrize("inference_mode", [False, True])
def test_weights_untouched_are_not_compiled_again(inference_mode):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU()).eval()
    x = torch.randn(8, 64)
    guard = torch.inference_mode() if inference_mode else torch.no_grad()
    with guard:
        compiled = _compiled(model)
        position = mark()
        for _ in range(3):
            _close(compiled(x), model(x))
    assert [r.weights_changed for r in reports_since(position)] == [0]
