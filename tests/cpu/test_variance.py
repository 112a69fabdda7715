"""[Note: the variance of equal values] (frontend/aten.py): ``var``, ``std`` and ``var_mean`` give exactly 0 for
rows of equal values, as ATen does, and std's gradient there is eager's (gradient fuzz seed 9304)."""
import pytest
import torch

import kiln  # noqa: F401 - registers the "kiln" backend


torch.manual_seed(0)


def check_variance_of_equal_values(device: str = "cpu", **options) -> None:
    """The checks, for each target's tests (tests/gpu runs them through the Triton target)."""
    def stats(x):
        return x.std(-1), x.var(dim=(0, 2), keepdim=True), *torch.var_mean(x, dim=1, correction=0)

    x = torch.randn(3, 5, 7, device=device)
    x[1] = 1.0367  # (three equal fp32 values do not average to themselves: sum / 3 is 1 ulp off)
    x[:, 2] = -0.6037
    x[..., 4:] = x[..., 4:5].clone()
    torch._dynamo.reset()
    got = torch.compile(stats, backend="kiln", options=options)(x)
    want = stats(x)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1.3e-5, atol=1.5e-5)
        assert torch.equal(g == 0, w == 0), (g, w)  # (exact zeros where eager's are)

    def fn(a, b):
        return torch.max(a, b).std(dim=3, keepdim=True)
    a = torch.randn(1, 5, 3, 7, device=device).transpose(-1, -2).requires_grad_()
    b = torch.randn(5, 7, 1, device=device).requires_grad_()
    b.data[0, :3, 0] = a.detach().amax(-1).flatten()[:3].abs() + 3  # (rows where b wins every element: std 0)
    weight = torch.randn(1, 5, 7, 1, device=device)
    want = torch.autograd.grad((fn(a, b) * weight).sum(), [a, b])
    torch._dynamo.reset()
    got = torch.autograd.grad((torch.compile(fn, backend="kiln", options=options)(a, b) * weight).sum(), [a, b])
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_variance_of_equal_values_is_exactly_zero_and_its_gradient_eager_s():
    check_variance_of_equal_values()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_variance_of_data_far_from_zero(dtype):
    """The shift also keeps the variance of values with a large common part (1e4 + noise) close to float64's."""
    x = (1e4 + torch.randn(64, 256, dtype=torch.float64)).to(dtype)
    torch._dynamo.reset()
    got = torch.compile(lambda t: t.var(-1), backend="kiln")(x)
    exact = x.double().var(-1)
    assert ((got.double() - exact).abs() / exact).max() < 1e-3
