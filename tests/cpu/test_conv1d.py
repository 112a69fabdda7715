"""CPU 1-D convolutions run as 2-D ones of height 1 (library/conv/as_2d.py), so kiln's convolution choices take
them: results against eager (float64 where the sums are long) for strides, padding, dilation, groups, no bias,
batches and inputs in other layouts; the rewrite reported; what stays with ATen (transposed, a computed weight)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import kiln
from kiln.report import mark, reports_since


def _compile_and_check(fn, *inputs, choices=None):
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(fn, fallback=False, **({"choices": choices} if choices else {}))(*inputs)
        expected = fn(*[x.double() for x in inputs]) if not isinstance(fn, nn.Module) else \
            fn.double()(*[x.double() for x in inputs])
        if isinstance(fn, nn.Module):
            fn.float()
    torch.testing.assert_close(got, expected.float(), rtol=1.3e-5, atol=1.5e-5)
    report = reports_since(position)[-1]
    return report, " ".join(note for p in report.passes for note in p.notes)


CASES = [  # (in channels, out channels, kernel, stride, padding, dilation, groups, bias, length)
    (80, 96, 3, 1, 1, 1, 1, True, 300),      # Whisper's first stem layer, shorter
    (96, 96, 3, 2, 1, 1, 1, True, 301),      # its second: stride 2, odd length
    (1, 32, 10, 5, 0, 1, 1, False, 400),     # wav2vec2's first feature layer: one channel, no bias
    (32, 32, 2, 2, 0, 1, 1, False, 79),
    (48, 48, 5, 1, 4, 2, 48, True, 64),      # depthwise, dilated
    (64, 64, 16, 1, 8, 1, 16, True, 50),     # wav2vec2's grouped positional convolution, smaller
]


@pytest.mark.parametrize("cin,cout,k,stride,pad,dil,groups,bias,length", CASES)
@pytest.mark.parametrize("choice", [None, "conv=onednn"])
def test_conv1d_matches_eager(cin, cout, k, stride, pad, dil, groups, bias, length, choice):
    torch.manual_seed(cin + k)
    conv = nn.Conv1d(cin, cout, k, stride=stride, padding=pad, dilation=dil, groups=groups, bias=bias).eval()
    report, notes = _compile_and_check(conv, torch.randn(2, cin, length), choices=choice)
    assert "1-D convolution -> 2-D of height 1: 1" in notes, notes


def test_conv1d_chain_on_a_transposed_input_with_activations():
    """Whisper's stem: conv, gelu, strided conv, gelu, then the time axis moved first; the input a transposed
    view (channels-last audio features)."""
    torch.manual_seed(1)
    c1, c2 = nn.Conv1d(40, 64, 3, padding=1).eval(), nn.Conv1d(64, 64, 3, stride=2, padding=1).eval()

    def stem(x):
        return F.gelu(c2(F.gelu(c1(x.transpose(1, 2))))).permute(0, 2, 1)

    x = torch.randn(1, 200, 40)
    position = mark()
    with torch.inference_mode():
        got = kiln.compile(stem, fallback=False)(x)
        expected = stem(x)
    torch.testing.assert_close(got, expected, rtol=1.3e-5, atol=1.5e-5)
    notes = " ".join(note for p in reports_since(position)[-1].passes for note in p.notes)
    assert "1-D convolution -> 2-D of height 1: 2" in notes, notes


def test_what_stays_one_dimensional():
    """A transposed 1-D convolution, and one whose weight is an input, keep ATen's call."""
    torch.manual_seed(2)
    up = nn.ConvTranspose1d(16, 8, 4, stride=2).eval()
    report, notes = _compile_and_check(up, torch.randn(1, 16, 30))
    assert "1-D convolution" not in notes, notes
    report, notes = _compile_and_check(lambda x, w: F.conv1d(x, w, padding=1), torch.randn(1, 16, 30),
                                       torch.randn(8, 16, 3))
    assert "1-D convolution" not in notes, notes
