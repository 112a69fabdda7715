"""The row-scratch cases of tests/cpu/test_row_scratch.py through the Triton generator (which recomputes a
scratch value instead of storing it)."""
import importlib.util
import pathlib

import pytest
import torch

from tests.gpu.conftest import DEVICE

_spec = importlib.util.spec_from_file_location(
    "cpu_row_scratch", pathlib.Path(__file__).parents[1] / "cpu" / "test_row_scratch.py")
_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cases)


@pytest.mark.parametrize("fn,shape", _cases.CASES, ids=[f.__name__ for f, _ in _cases.CASES])
def test_scratch_written_before_read_triton(fn, shape):
    torch.manual_seed(0)
    _cases.check(fn, (torch.rand(shape) * 4 - 2).to(DEVICE), target="triton")
