"""kiln's CPU GEMM (library/gemm/source.py) against a float64 reference, on shapes that exercise every edge: rows
and columns that do not fill a micro-tile, K spanning several KC blocks, M spanning several MC blocks, one row,
a strided input, no bias.  Tolerance: the sum over K runs in another order than the reference's, so the error
bound grows with K (|error| <= K * eps32 * max|a| * max|b| per element, about 6e-8 * K here)."""
import pytest
import torch

from kiln.library.gemm.source import GemmSchedule
from kiln.library.gemm import op as cpu_gemm

pytestmark = pytest.mark.skipif(not cpu_gemm.available(), reason="needs AVX2+FMA or AVX-512 and a C++ compiler")


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (13, 7, 33), (37, 1100, 70), (300, 64, 31), (25, 513, 96)])
@pytest.mark.parametrize("bias", [True, False])
def test_gemm_matches_float64(m, k, n, bias):
    gen = torch.Generator().manual_seed(m * 1000 + k + n)
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    got = torch.ops.kiln.linear_packed(x, cpu_gemm.pack_weight(w), b, n)
    want = x.double() @ w.double().t() + (b.double() if bias else 0)
    scale = x.abs().max() * w.abs().max()
    torch.testing.assert_close(got.double(), want, rtol=0, atol=float(6e-8 * k * scale) + 1e-6)


@pytest.mark.parametrize("mr", [6, 7, 8, 12, 14])
@pytest.mark.parametrize("kc", [16, 13])
def test_strided_input_small_blocks_and_tile_heights(mr, kc):
    """A row-strided input (a slice of a wider tensor) through the op, and each micro-tile height with tiny
    blocks (many K and M blocks, edge tiles in both directions; K blocks a multiple of the packing's 8 x 8
    transposes and not, tile heights below, at and above 8 and not a multiple of it)."""
    wide = torch.randn(50, 90)
    x = wide[:, 5:45]  # row stride 90
    w, b = torch.randn(45, 40), torch.randn(45)
    want = torch.addmm(b, x, w.t())
    torch.testing.assert_close(torch.ops.kiln.linear_packed(x, cpu_gemm.pack_weight(w), b, 45), want,
                               rtol=1e-5, atol=1e-4)
    lib = cpu_gemm.library(GemmSchedule(mr=mr))
    out = torch.empty(50, 45)
    packed = cpu_gemm.pack_weight(w)
    lib.kiln_gemm(x.data_ptr(), x.stride(0), packed.data_ptr(), b.data_ptr(), out.data_ptr(), 45, 50, 45, 40,
                  kc, 2 * lib.kiln_gemm_mr(), 0, 2)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4)


def test_the_avx2_build_matches(tmp_path):
    """kiln_gemm as an AVX2 machine compiles it (16-column panels, 6-row tiles: A packed 6 rows of each 8 x 8
    transpose), built here with AVX-512 off: edge tiles both ways, K blocks with and without a remainder of 8."""
    from kiln import config
    from kiln.library.gemm.op import bind_gemm
    from kiln.library.gemm.source import gemm_source
    from kiln.runtime.build import load_module
    with config.scope(cache_dir=str(tmp_path)):
        avx2 = bind_gemm(load_module(gemm_source(GemmSchedule()), name="kiln_gemm_avx2",
                                     extra_flags=("-mno-avx512f",)).lib)
    assert avx2.kiln_gemm_nr() == 16 and avx2.kiln_gemm_mr() == 6
    gen = torch.Generator().manual_seed(5)
    for m, k, n, kc in [(50, 40, 45, 16), (31, 70, 33, 21), (6, 8, 16, 8)]:
        x, w, b = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
        packed = torch.empty(-(-n // 16) * 16 * k)
        avx2.kiln_pack_b(w.data_ptr(), k, n, 1, k, packed.data_ptr())
        out = torch.empty(m, n)
        avx2.kiln_gemm(x.data_ptr(), k, packed.data_ptr(), b.data_ptr(), out.data_ptr(), n, m, n, k, kc, 12, 0, 1)
        torch.testing.assert_close(out, torch.addmm(b, x, w.t()), rtol=1e-5, atol=1e-4)


def test_schedule_blocks_k_evenly_and_fills_l2():
    from kiln.library.gemm.source import KC_MAX, L2_BLOCK, schedule_for
    s = schedule_for(2048, 3000)
    assert s.kc == 1000 and s.kc <= KC_MAX  # three equal K blocks, not 1024 + 1024 + 952
    assert s.mc % s.mr == 0 and s.mc * s.kc * 4 <= L2_BLOCK
    assert schedule_for(64, 768).mc == 64  # no more rows packed than there are
    # A blocks of equal height: 784 rows as 4 x 200, not 3 x 256 + 16; a weight larger than the L2 lets a block
    # overfill by 1/16 rather than stream the weight once more (197 rows: one block of 200, not 192 + 5)
    assert schedule_for(784, 768, 192).mc == 200 and schedule_for(197, 3072, 64).mc == 104
    assert schedule_for(197, 3072, 768).mc == 200


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="2-D fp32 CPU input"):
        torch.ops.kiln.linear_packed(torch.randn(2, 3, dtype=torch.float64), torch.zeros(96), None, 3)


@pytest.mark.parametrize("m", [5, 300])
def test_threads_share_a_block_and_split_column_panels(m):
    """Two threads: one row block (5 rows) is split by column panels; several blocks (300 rows) too."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x, w, b = torch.randn(m, 200), torch.randn(150, 200), torch.randn(150)
        got = torch.ops.kiln.linear_packed(x, cpu_gemm.pack_weight(w), b, 150)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(got, torch.addmm(b, x, w.t()), rtol=1e-5, atol=1e-4)
