"""A per-row consumer of a reduction read through a size-1 dimension (attention weights averaged over the heads,
``sum(1) / H`` of ``[1, H, L, S]``) joins the reduction's kernel on the Triton target too ([Note: column
reduction] names the CPU side); outputs against eager on fresh inputs."""
import torch

from tests.gpu.conftest import DEVICE, compile_and_run


def test_heads_averaged_in_one_kernel():
    x = torch.softmax(torch.randn(1, 8, 16, 21, device=DEVICE), -1)
    got, report = compile_and_run(lambda t: t.sum(1) / 8, x)
    torch.testing.assert_close(got, x.sum(1) / 8, rtol=1.3e-5, atol=1.5e-5)
    assert len(report.kernels) == 1


def test_channel_statistics_with_the_normalizing_pass():
    x = torch.randn(2, 24, 5, 7, device=DEVICE)

    def norm(t):
        u = t.mean(1, keepdim=True)
        return (t - u) * torch.rsqrt((t - u).pow(2).mean(1, keepdim=True) + 1e-6)
    got, _ = compile_and_run(norm, x)
    torch.testing.assert_close(got, norm(x), rtol=1.3e-5, atol=1.5e-5)
