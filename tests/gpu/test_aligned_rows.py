"""library/gpu_matmul/aligned.py: a product whose result rows break cuBLAS's 16-byte alignment (GPT-2's LM head,
vocabulary 50257) is written into padded rows; kernels after it and the caller read it right."""
import pytest
import torch

import kiln
from kiln.library.gpu_matmul import aligned
from kiln.report import mark, reports_since
from tests.gpu.conftest import DEVICE


@pytest.fixture
def on_this_device(monkeypatch):
    monkeypatch.setattr(aligned, "DEVICES", (DEVICE,))
    monkeypatch.setattr(aligned, "MIN_ELEMENTS", 1)


def test_padded_row_lengths():
    assert aligned.padded_row(50257, torch.bfloat16) == 50264
    assert aligned.padded_row(50257, torch.float32) == 50260
    assert aligned.padded_row(64, torch.float16) == 64


def test_op_writes_padded_rows():
    x, w, b = torch.randn(6, 8, device=DEVICE), torch.randn(8, 13, device=DEVICE), torch.randn(13, device=DEVICE)
    y = aligned.mm_rows(x, w, b)
    assert y.shape == (6, 13) and y.stride() == (16, 1)
    torch.testing.assert_close(y, torch.addmm(b, x, w), rtol=1.3e-5, atol=1.5e-5)
    torch.testing.assert_close(aligned.mm_rows(x, w, None), x @ w, rtol=1.3e-5, atol=1.5e-5)


@pytest.mark.parametrize("target", ["triton", "cpu"])
def test_head_with_odd_vocabulary_matches_eager(on_this_device, target):
    if target == "cpu" and DEVICE != "cpu":
        pytest.skip("the C++ target runs CPU tensors")
    torch.manual_seed(0)
    emb = torch.nn.Embedding(37, 16).to(DEVICE)  # a tied head: logits = h @ emb.weight^T, 37 columns
    lin = torch.nn.Linear(16, 21).to(DEVICE)     # with a bias

    def fn(h):
        logits = h @ emb.weight.t()
        other = lin(h)
        return logits, torch.softmax(logits, -1) * 2, other.relu()

    h = torch.randn(9, 16, device=DEVICE)
    position = mark()
    with torch.inference_mode():
        expected = fn(h)
        got = kiln.compile(fn, target=target, fallback=False)(h)
    [report] = reports_since(position)
    [record] = [p for p in report.passes if p.name == "align_matmul_rows"]
    assert record.notes == ["matmul result rows padded to 16 bytes: 2"], record.notes
    for a, e in zip(got, expected):
        assert a.is_contiguous()
        torch.testing.assert_close(a, e, rtol=1.3e-5, atol=1.5e-5)


@pytest.mark.parametrize("layout", ["transposed", "offset-slice", "expanded-bias", "strided-rows"])
def test_op_reads_operands_in_any_layout(layout):
    """``kiln::mm_rows`` takes what ATen's mm/addmm take: a transposed or offset-sliced input, a bias that is an
    expanded view, rows with a stride - the result is the same product in padded rows."""
    torch.manual_seed(0)
    x, w, b = torch.randn(6, 8, device=DEVICE), torch.randn(8, 13, device=DEVICE), torch.randn(13, device=DEVICE)
    if layout == "transposed":
        x, w = torch.randn(8, 6, device=DEVICE).t(), torch.randn(13, 8, device=DEVICE).t()
    elif layout == "offset-slice":
        x = torch.randn(9, 11, device=DEVICE)[2:8, 3:11]
        w = torch.randn(10, 15, device=DEVICE)[1:9, 2:15]
    elif layout == "expanded-bias":
        b = torch.randn(1, device=DEVICE).expand(13)
    else:
        x = torch.randn(12, 8, device=DEVICE)[::2]
    y = aligned.mm_rows(x, w, b)
    assert y.shape == (6, 13) and y.stride() == (16, 1)
    torch.testing.assert_close(y, torch.addmm(b, x, w), rtol=1.3e-5, atol=1.5e-5)
    torch.testing.assert_close(aligned.mm_rows(x, w, None), x @ w, rtol=1.3e-5, atol=1.5e-5)


def test_head_on_a_transposed_and_sliced_input_matches_eager(on_this_device):
    """The rewritten product reading its input through views kiln hands over without a copy (a transpose, a
    slice with an offset), and the result read by a kernel and returned."""
    torch.manual_seed(0)
    emb = torch.nn.Embedding(37, 16).to(DEVICE)

    def fn(h):
        t = h.t()[1:]                       # [8, 16] view: transposed, offset by one row
        logits = t @ emb.weight.t()
        return logits, logits.relu() * 3

    h = torch.randn(16, 9, device=DEVICE)
    position = mark()
    with torch.inference_mode():
        expected = fn(h)
        got = kiln.compile(fn, target="triton", fallback=False)(h)
    [report] = reports_since(position)
    [record] = [p for p in report.passes if p.name == "align_matmul_rows"]
    assert record.notes == ["matmul result rows padded to 16 bytes: 1"], record.notes
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e, rtol=1.3e-5, atol=1.5e-5)
