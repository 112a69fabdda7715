"""GPU tests: real CUDA when a GPU is present, else Triton's interpreter on CPU tensors (how CI runs them).

The interpreter must be chosen before Triton decorates any kernel, so this sets ``TRITON_INTERPRET`` at import
(collection) time; without the ``triton`` package the tests are skipped.
"""
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import triton  # noqa: F401
    HAS_TRITON = True
    if not HAS_CUDA:  # ([Note: the interpreter's scalar comparisons])
        from kiln.testing import triton_interpreter
        triton_interpreter.patch()
except ImportError:
    HAS_TRITON = False

DEVICE = "cuda" if HAS_CUDA else "cpu"


def pytest_collection_modifyitems(config, items):
    if HAS_TRITON:
        return
    skip = pytest.mark.skip(reason="triton is not installed")
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(skip)


@pytest.fixture
def no_tf32():
    """fp32 convolutions and matmuls in fp32 (not TF32) while the test runs: kiln and eager may pick different
    cuDNN algorithms (channels-last against NCHW), whose TF32 roundings differ by ~1e-3 relative."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def compile_and_run(model, *inputs, **options):
    """Compile ``model`` for the Triton target (no fallback, one graph), call it once: (outputs, report)."""
    import kiln
    from kiln.report import mark, reports_since
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(model, target="triton", fallback=False, fullgraph=True, **options)(*inputs)
    [report] = reports_since(position)
    return got, report
