"""The model zoo (kiln/testing/zoo.py): transformers' model code and torch.nn's attention modules, small configs
with random weights, each compiled whole (``fullgraph=True``, ``fallback=False``) and compared with eager on
every output leaf (ModelOutput fields, caches, attention weights), on the example inputs and on fresh ones.

The kiln report says which ops ran as externs; an op outside ``LIBRARY_EXTERNS`` (one without a lowering) fails
the test, so that a new extern is a decision, not an accident.
"""
import time

import pytest
import torch

import kiln
from kiln.report import mark, reports_since
from kiln.testing import zoo, zoo_torch

pytest.importorskip("transformers")

# [Note: the zoo in CI] Every case runs in the default run (and CI): 51 tests, 4.1 min on the idle 2-core dev box
# (2026-12-02, after the fixes in tests/cpu/test_zoo_regressions.py and tests/fuzz/found/).  ``pytest -m zoo``
# runs the zoo alone; ``python -m benchmarks.zoo`` runs the full-size configs against eager and Inductor.
pytestmark = pytest.mark.zoo

# library calls (matmul: ATen/MKL, oneDNN or kiln's GEMM; convolution; attention; pooling)
LIBRARY_EXTERNS = {"convolution", "onednn_convolution", "conv_winograd", "conv_gemm", "conv_dw", "attention", "mm",
                   "addmm", "bmm", "baddbmm", "onednn_linear", "linear_packed", "scaled_dot_product_attention",
                   "_scaled_dot_product_flash_attention_for_cpu", "max_pool2d_with_indices", "avg_pool2d"}
# cumsum (RoBERTa's, OPT's and BLOOM's positions from the attention mask) is a scan, which kiln's kernel IR
# cannot express yet; torch.nn's fused inference fast path is decomposed by kiln (zoo_torch's note)
EXPECTED_EXTERNS = LIBRARY_EXTERNS | {"cumsum"}
RTOL, ATOL = 1e-3, 1e-4


def _ids(case):
    name, attn = case
    return name if attn is None else f"{name}-{attn}"


@pytest.mark.parametrize("case", zoo.cases(), ids=_ids)
def test_zoo_model_matches_eager(case):
    """One graph, no fallback, every output leaf within 1e-3 / 1e-4 of eager on two input sets (the second with
    other values and other padding, run without recompiling); externs only where expected."""
    name, attn = case
    spec = zoo.specs()[name]
    model, inputs = zoo.build(name, "ci", attn)
    _, fresh = zoo.build(name, "ci", attn, input_seed=1)  # same shapes, new values and padding
    start = time.perf_counter()
    position = mark()
    with torch.inference_mode():
        expected, expected_fresh = model(*inputs), model(*fresh)
        # (kiln's CPU attention forced: at these sizes a measurement may pick either, and ATen's is the extern)
        compiled = kiln.compile(model, fallback=False, fullgraph=True, choices="attention=kiln")
        zoo.assert_close(compiled(*inputs), expected, RTOL, ATOL)
        zoo.assert_close(compiled(*fresh), expected_fresh, RTOL, ATOL)
        if spec.fast_path is not None:
            fused = zoo_torch.aten_ops(model, inputs) & zoo_torch.FAST_OPS
            assert bool(fused) == spec.fast_path, f"eager took the {'fast' if fused else 'slow'} path"
    reports = reports_since(position)
    assert len(reports) == 1, f"{len(reports)} graphs: recompiled on fresh inputs?"
    report = reports[0]
    assert report.fallback is None
    externs = sorted(set(report.externs))
    print(f"\n{_ids(case)}: {time.perf_counter() - start:.1f} s, kiln compile {report.compile_seconds:.1f} s, "
          f"externs {externs}")
    assert set(externs) <= EXPECTED_EXTERNS, f"ops without a kiln lowering: {set(externs) - EXPECTED_EXTERNS}"
    if spec.fast_path is not None:  # which fused op Dynamo left in the graph (zoo_torch's note)
        assert set(externs) & zoo_torch.FAST_OPS == ({spec.compiled_op} if spec.compiled_op else set()), externs


def test_leaves_walk_outputs_and_caches():
    """``zoo.leaves`` reaches the tensors inside ModelOutputs and transformers' caches, with their paths."""
    model, inputs = zoo.build("gpt2", "ci", "sdpa")
    model.fixed = {**model.fixed, "use_cache": True}  # (the zoo builds models without one: a single forward)
    with torch.inference_mode():
        paths = [path for path, _ in zoo.leaves(model(*inputs))]
    assert paths[0] == "out.logits"
    assert "out.cache.layers[1].values" in paths and len(paths) == 5  # logits + keys/values of 2 layers


def test_assert_close_names_the_differing_leaf():
    model, inputs = zoo.build("t5", "ci", "eager")
    model.fixed = {**model.fixed, "use_cache": True}
    with torch.inference_mode():
        out = model(*inputs)
        other = model(*inputs)
        other.cache.cross_attention_cache.layers[0].keys[0, 0, 0, 0] += 1
    with pytest.raises(AssertionError, match=r"out\.cache\.cross_attention_cache\.layers\[0\]\.keys"):
        zoo.assert_close(other, out)


def test_the_zoo_benchmark_runs_and_writes_its_json(tmp_path):
    """``python -m benchmarks.zoo`` (the benchmark of record) on one CI-size model: a row per backend, correct
    results, and the JSON - written after each model, so a run its time limit ends keeps what it measured - marked
    complete at the end."""
    import json

    from benchmarks import zoo as zoo_benchmark
    out = tmp_path / "zoo.json"
    threads = torch.get_num_threads()
    try:  # (the benchmark sets the process's thread count)
        assert zoo_benchmark.main(["--models", "mha_self", "--small", "--backends", "eager,kiln", "--repeats", "1",
                                   "--calls", "1", "--warmup", "0", "--threads", "1", "--json", str(out)]) == 0
    finally:
        torch.set_num_threads(threads)
    payload = json.loads(out.read_text())
    assert payload["complete"] is True and [r["model"] for r in payload["results"]] == ["mha_self"]
    kiln_row = payload["results"][0]["backends"]["kiln"]
    assert kiln_row["status"] == "ok" and kiln_row["median_ms"] > 0, kiln_row
