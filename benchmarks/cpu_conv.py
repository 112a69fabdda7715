"""kiln's CPU convolutions against oneDNN, op level, on the suite's layer shapes (issue 4: generated convolutions).

One thread.  Per layer: oneDNN (``mkldnn._convolution_pointwise`` on a weight reordered beforehand, what kiln's
graphs call when oneDNN wins), kiln's Winograd F(2x2, 3x3) (3x3 stride 1 only) and kiln's implicit GEMM
(``kiln::conv_gemm``; for 3-channel inputs also its pack-free direct kernel), all on the same channels-last input
and bias; for the depthwise layers (MobileNetV2's, not
in the suite) oneDNN against kiln's depthwise kernel (``kiln::conv_dw``).  Each round runs every backend once over
``--weights`` distinct weights, so that, as in a model, the weights come from memory rather than from the last
call's cache; medians over rounds, interleaved.  Each backend's result is checked against float64 first.

    python -m benchmarks.cpu_conv [--rounds 9] [--weights 6]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from kiln.library.conv.source_gemm import DIRECT_MAX_CHANNELS

# (name, N, C, H, W, K, kernel, stride, padding): ResNet-18 at 224 and the seed model
LAYERS = [
    ("resnet stem 7x7/2", 1, 3, 224, 224, 64, 7, 2, 3),
    ("resnet 64@56 3x3", 1, 64, 56, 56, 64, 3, 1, 1),
    ("resnet 64->128 3x3/2", 1, 64, 56, 56, 128, 3, 2, 1),
    ("resnet 64->128 1x1/2", 1, 64, 56, 56, 128, 1, 2, 0),
    ("resnet 128@28 3x3", 1, 128, 28, 28, 128, 3, 1, 1),
    ("resnet 128->256 3x3/2", 1, 128, 28, 28, 256, 3, 2, 1),
    ("resnet 256@14 3x3", 1, 256, 14, 14, 256, 3, 1, 1),
    ("resnet 256->512 3x3/2", 1, 256, 14, 14, 512, 3, 2, 1),
    ("resnet 256->512 1x1/2", 1, 256, 14, 14, 512, 1, 2, 0),
    ("resnet 512@7 3x3", 1, 512, 7, 7, 512, 3, 1, 1),
    ("seed conv1 3->64", 1, 3, 224, 224, 64, 3, 1, 0),
]
# MobileNetV2's pointwise (1x1) layers at 224: low channel counts, GEMMs of small K
POINTWISE = [
    ("mbv2 16->96 1x1@112", 1, 16, 112, 112, 96, 1, 1, 0),
    ("mbv2 96->24 1x1@56", 1, 96, 56, 56, 24, 1, 1, 0),
    ("mbv2 24->144 1x1@56", 1, 24, 56, 56, 144, 1, 1, 0),
    ("mbv2 144->32 1x1@28", 1, 144, 28, 28, 32, 1, 1, 0),
    ("mbv2 32->192 1x1@28", 1, 32, 28, 28, 192, 1, 1, 0),
    ("mbv2 384->64 1x1@14", 1, 384, 14, 14, 64, 1, 1, 0),
    ("mbv2 960->160 1x1@7", 1, 960, 7, 7, 160, 1, 1, 0),
]
# depthwise (groups = C = K): MobileNetV2 at 224
DEPTHWISE = [
    ("dw 96@112 3x3/2", 1, 96, 112, 112, 96, 3, 2, 1),
    ("dw 144@56 3x3", 1, 144, 56, 56, 144, 3, 1, 1),
    ("dw 192@28 3x3", 1, 192, 28, 28, 192, 3, 1, 1),
    ("dw 576@14 3x3", 1, 576, 14, 14, 576, 3, 1, 1),
    ("dw 960@7 3x3", 1, 960, 7, 7, 960, 3, 1, 1),
]


def _calls(x: torch.Tensor, weights: list[torch.Tensor], bias: torch.Tensor, stride: int, pad: int,
           direct_max: int = DIRECT_MAX_CHANNELS) -> dict:
    from kiln.library.conv import op as cpu_conv
    from kiln.library.conv import op_dw as cpu_conv_dw
    k, cg, kh, kw = weights[0].shape
    s, p = [stride, stride], [pad, pad]
    groups = x.shape[1] // cg
    onednn = [torch.ops.mkldnn._reorder_convolution_weight(w, p, s, [1, 1], groups, list(x.shape)) for w in weights]
    out = {"onednn": lambda i: torch.ops.mkldnn._convolution_pointwise(x, onednn[i], bias, p, s, [1, 1], groups,
                                                                       "none", [], "")}
    if groups > 1:
        dw = [cpu_conv_dw.pack_weight(w) for w in weights]
        out["dw"] = lambda i: torch.ops.kiln.conv_dw(x, dw[i], bias, None, k, [kh, kw], s, p, False)
        return out
    if cpu_conv.supports(weights[0].shape, s, [1, 1], 1) and cpu_conv.available():
        wino = [cpu_conv.transform_weight(w, 2) for w in weights]
        out["winograd2"] = lambda i: torch.ops.kiln.conv_winograd(x, wino[i], bias, None, k, 2, p, False)
    gemm = [cpu_conv.pack_conv_weight(w) for w in weights]
    out["conv_gemm"] = lambda i: torch.ops.kiln.conv_gemm(x, gemm[i], bias, None, k, [kh, kw], s, p, False)
    if x.shape[1] <= direct_max:
        out["direct"] = lambda i: torch.ops.kiln.conv_gemm(x, gemm[i], bias, None, k, [kh, kw], s, p, False, True,
                                                           False, True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--weights", type=int, default=6)
    ap.add_argument("--layers", default="suite,pointwise,depthwise", help="which of suite, pointwise, depthwise")
    ap.add_argument("--direct-max", type=int, default=DIRECT_MAX_CHANNELS,
                    help="time the pack-free direct kernel up to this many input channels")
    args = ap.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    print(f"{'layer':24s} {'GFLOP':>6s}  ms: oneDNN / Winograd / implicit GEMM [/ direct, 3 channels] (depthwise: / "
          f"kiln)    kiln's best vs oneDNN")
    chosen = {"suite": LAYERS, "pointwise": POINTWISE, "depthwise": DEPTHWISE}
    for name, n, c, h, w, k, ks, stride, pad in [x for part in args.layers.split(",") for x in chosen[part]]:
        groups = c if name.startswith("dw") else 1
        x = torch.randn(n, c, h, w, generator=gen).contiguous(memory_format=torch.channels_last)
        weights = [torch.randn(k, c // groups, ks, ks, generator=gen) / (c // groups * ks * ks) ** 0.5
                   for _ in range(args.weights)]
        bias = torch.randn(k, generator=gen)
        calls = _calls(x, weights, bias, stride, pad, args.direct_max)
        ref = F.conv2d(x.double(), weights[0].double(), bias.double(), stride, pad, groups=groups)
        for fn in calls.values():
            torch.testing.assert_close(fn(0), ref.float(), rtol=1e-4, atol=1e-4)
        times: dict[str, list[float]] = {q: [] for q in calls}
        for _ in range(args.rounds):
            for q, fn in calls.items():
                start = time.perf_counter()
                for i in range(args.weights):
                    fn(i)
                times[q].append((time.perf_counter() - start) / args.weights)
        med = {q: statistics.median(v) * 1e3 for q, v in times.items()}
        best = min(v for q, v in med.items() if q != "onednn")
        cells = " / ".join(f"{med[q]:.3f}" if q in med else "-"
                           for q in ("onednn", "winograd2", "conv_gemm", "direct", "dw")
                           if q in med or groups == 1 and q not in ("dw", "direct"))
        print(f"{name:24s} {2 * ref.numel() * c // groups * ks * ks / 1e9:6.3f}  {cells:36s} "
              f"{med['onednn'] / best:.2f}x", flush=True)


if __name__ == "__main__":
    main()
