"""C++ code generation: the emitted source (names, headers, pragmas) and the compiler's vectorization report."""
import re
import subprocess

import torch

import kiln
from kiln import config
from kiln.report import mark, reports_since


def _compile(fn, *inputs):
    position = mark()
    with torch.inference_mode():
        out = kiln.compile(fn, fallback=False)(*inputs)
        torch.testing.assert_close(out, fn(*inputs), rtol=1.3e-5, atol=1.5e-5)
    return reports_since(position)[-1]


def _softmax_gelu(x):
    return torch.nn.functional.gelu(torch.softmax(x, -1) * 3.0 - 1.0)


def test_kernel_names_and_headers():
    r = _compile(_softmax_gelu, torch.randn(64, 128))
    src = r.source
    assert len(r.kernels) == 1
    k = r.kernels[0]
    assert k.name.startswith("kernel_0_amax")
    assert f"// {k.name}:" in src and f"static void {k.name}(void** b)" in src
    assert "#pragma omp parallel for" in src and "#pragma omp simd" in src
    assert 'extern "C" void kiln_segment_0(void** b)' in src


def _vectorized_lines(source: str, tmp_path) -> tuple[set[int], str]:
    path = tmp_path / "unit.cpp"
    path.write_text(source)
    cfg = config.get()
    cmd = [cfg.cxx, *cfg.cxx_flags, "-fopt-info-vec-optimized", "-o", str(tmp_path / "unit.so"), str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    lines = {int(m.group(1)) for m in re.finditer(r"unit\.cpp:(\d+):\d+: optimized: loop vectorized", proc.stderr)}
    return lines, proc.stderr


def _is_vectorized(loop_line: int, vectorized: set[int]) -> bool:
    """GCC reports a vectorized loop at the for statement or at the first statement of its body."""
    return any(loop_line + d in vectorized for d in range(3))


def _loop_lines(source: str, name: str) -> list[int]:
    """Line numbers of the for-loops inside kernel ``name``."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"static void {name}("))
    end = next(i for i in range(start, len(lines)) if lines[i] == "}")
    return [i + 1 for i in range(start, end) if lines[i].lstrip().startswith("for (int64_t r")]


def test_reduction_and_epilogue_loops_vectorize(tmp_path):
    r = _compile(_softmax_gelu, torch.randn(64, 128))
    vectorized, log = _vectorized_lines(r.source, tmp_path)
    loops = _loop_lines(r.source, r.kernels[0].name)
    # every per-row loop (the lane loops of both reductions and the epilogue) is reported vectorized
    assert loops, "no row loops found"
    lane_loops = [i + 1 for i, line in enumerate(r.source.splitlines()) if "for (int64_t l = 0;" in line]
    assert len(lane_loops) == 2 and all(_is_vectorized(ln, vectorized) for ln in lane_loops), log
    epilogue = [ln for ln in loops if "r = 0; r <" in r.source.splitlines()[ln - 1]]
    assert epilogue and all(_is_vectorized(ln, vectorized) for ln in epilogue), log


def test_row_reduction_lanes_combine_as_a_tree():
    """The per-lane partial sums and maxima of a row combine pairwise (lane l with l + w, w halving), not in a
    chain of VW - 1 dependent scalar steps; NaN and infinities in any lane still decide the row as eager's."""
    x = torch.randn(96, 69)
    x[3, 40], x[5, 2], x[7, 68] = float("nan"), float("inf"), float("-inf")
    fn = lambda t: (t.sum(-1), t.amax(-1), torch.nn.functional.layer_norm(t, (69,)))  # noqa: E731
    position = mark()
    with torch.inference_mode():
        torch.testing.assert_close(kiln.compile(fn, fallback=False)(x), fn(x), rtol=1.3e-5, atol=1.5e-5,
                                   equal_nan=True)
    r = reports_since(position)[-1]
    assert re.search(r"_l\[l\] = .*_l\[l \+ 1\]\)", r.source), r.source
    assert "for (int l = 1; l <" not in r.source, r.source


def test_pointwise_loop_vectorizes(tmp_path):
    r = _compile(lambda a, b: torch.sigmoid(a) * torch.tanh(b) + torch.exp(a - b), torch.randn(32, 256),
                 torch.randn(32, 256))
    vectorized, log = _vectorized_lines(r.source, tmp_path)
    lines = r.source.splitlines()
    # the flat loop is split into chunks shared by threads ("split(i0, 4096); parallel(i0.o); vectorize(i0.i)"),
    # and the chunk's loop is the vector loop
    inner = [i + 2 for i, line in enumerate(lines[:-1]) if line.strip() == "#pragma omp simd"
             and lines[i + 1].lstrip().startswith("for (int64_t i0_i = 0;")]
    assert inner and all(_is_vectorized(ln, vectorized) for ln in inner), log


def _opaque_uses(source: str) -> int:
    return source.count("k_opaque_index(") - source.count("k_opaque_index(T v)")  # (the prelude's definition)


def test_gather_index_from_a_comparison_is_opaque_to_the_vectorizer():
    """[Note: gather index from a comparison]: GCC 12 vectorizing for AVX-512 read such an index from the
    comparison's mask bits as bytes (wrong, different per call); the index goes through k_opaque_index."""
    def f(x, y, w):
        idx = (x >= y).long()
        return torch.gather(w, 0, idx) * 2.0, torch.gather(w, 0, torch.where(x < y, idx + 2, idx))

    compiled = kiln.compile(f, fallback=False)
    position = mark()
    with torch.inference_mode():
        for _ in range(3):  # (fresh values each call: the miscompiled loop also varied from call to call)
            x, y, w = torch.randn(750), torch.randn(750), torch.randn(750)
            torch.testing.assert_close(compiled(x, y, w), f(x, y, w), rtol=0, atol=0)
    assert _opaque_uses(reports_since(position)[0].source) == 2


def test_gather_index_loaded_from_memory_stays_vectorizable():
    """An index read from memory (an embedding's ids) with the usual negative-index wrap is not made opaque."""
    r = _compile(lambda ids, table: torch.nn.functional.embedding(ids, table) * 3.0,
                 torch.randint(-5, 40, (64,)).remainder(40), torch.randn(40, 16))
    assert _opaque_uses(r.source) == 0
