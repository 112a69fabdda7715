"""Triton compile workers: kernels compile for the GPU target in other processes (no GPU needed: the workers
never touch one), into Triton's disk cache; a bad job is reported, not fatal, and the others still compile."""
import json
import os

from kiln.runtime.compile_pool import CompilePool

SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def kernel_0(p0, p1, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(p1 + x, tl.exp(tl.load(p0 + x, mask=x < 1000).to(tl.float32)).to(p1.dtype.element_ty), mask=x < 1000)


@triton.jit
def kernel_1(p0, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    tl.store(p0 + tl.arange(0, XBLOCK), undefined_name)


kernel_2 = kernel_0
'''


def test_workers_compile_into_the_cache_and_isolate_failures(tmp_path):
    path = tmp_path / "kiln_0123456789abcdef01234567.py"
    path.write_text(SOURCE)
    cache = tmp_path / "triton-cache"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile for real, not interpret
    env["TRITON_CACHE_DIR"] = str(cache)
    pool = CompilePool(2, ("cuda", 90, 32), env=env)
    try:
        job = {"path": str(path), "grid": [4, 1, 1], "constants": {"XBLOCK": 256, "RBLOCK": 1}, "num_warps": 4}
        answers = pool.compile([{**job, "id": 0, "kernel": "kernel_0", "dtypes": ["bfloat16", "bfloat16"]},
                                {**job, "id": 1, "kernel": "kernel_1", "dtypes": ["float32"]},
                                {**job, "id": 2, "kernel": "no_such_kernel", "dtypes": ["float32"]},
                                {**job, "id": 3, "kernel": "kernel_2", "dtypes": ["float32", "float32"]}],
                               deadline_s=240)
    finally:
        pool.close()
    assert answers[0]["ok"] and answers[3]["ok"], json.dumps(answers)
    assert not answers[1]["ok"] and "undefined_name" in answers[1]["error"]
    assert not answers[2]["ok"] and "no_such_kernel" in answers[2]["error"]
    cubins = list(cache.rglob("*.cubin"))
    assert len(cubins) == 2  # kernel_0 for bf16 and (as kernel_2) for fp32
    assert pool.compiled == 2
