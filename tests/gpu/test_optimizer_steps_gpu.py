"""Compiled optimizer steps on the Triton target ([Note: write-backs in place]): the kernels store parameters and
moments into the inputs - SGD with momentum and weight decay too, whose updates read each other's old values (no
buffer of its own: [Note: old values loaded first]) - on a GPU, and under Triton's interpreter in CI."""
import copy

import pytest
import torch
import torch.nn as nn

from kiln.report import mark, reports_since
from tests.gpu.conftest import DEVICE

OPTIMIZERS = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, foreach=True),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01, foreach=True),
}


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_a_compiled_step_on_the_triton_target_updates_parameters_in_place(name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).to(DEVICE)
    ref = copy.deepcopy(model)
    opt, ref_opt = OPTIMIZERS[name](model.parameters()), OPTIMIZERS[name](ref.parameters())
    torch._dynamo.reset()
    step = torch.compile(opt.step, backend="kiln", options={"target": "triton", "fallback": False})
    position = mark()
    for k in range(3):
        x = torch.randn(8, 16, generator=torch.Generator().manual_seed(k)).to(DEVICE)
        for m, o, s in ((model, opt, step), (ref, ref_opt, ref_opt.step)):
            o.zero_grad()
            m(x).pow(2).mean().backward()
            s()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-4 * q.abs().max().item())
    reports = reports_since(position)
    assert reports and all(r.target == "triton" and r.fallback is None for r in reports)
    assert not any(e == "copy_" or e.startswith("_foreach") for r in reports for e in (r.externs or []))
    text = "".join(r.format(source=False) for r in reports)
    assert "write-back in place" in text
    assert "copied into input" not in text  # (SGD's cycle: both stored in place, the old values loaded first)
