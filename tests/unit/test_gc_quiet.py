"""[Note: frozen heap during compile] (kiln/frontend/gc_quiet.py): the objects that exist when a compile starts
are out of the collector's sight while it runs, and back in sight after it, whatever happens inside."""
import gc

import pytest
import torch

import kiln
import kiln.compiler


@pytest.fixture
def seen_by_compiler(monkeypatch):
    """The frozen-object count each graph compile saw."""
    counts = []
    original = kiln.compiler.compile_aten_graph

    def spy(*args, **kwargs):
        counts.append(gc.get_freeze_count())
        return original(*args, **kwargs)
    monkeypatch.setattr(kiln.compiler, "compile_aten_graph", spy)
    return counts


def _compile_once(fn, *inputs):
    torch._dynamo.reset()
    with torch.inference_mode():
        return kiln.compile(fn)(*inputs)


def test_heap_frozen_while_compiling_and_unfrozen_after(seen_by_compiler):
    assert gc.get_freeze_count() == 0
    x = torch.randn(8, 5)
    got = _compile_once(lambda t: torch.tanh(t) * 2 + 1, x)
    torch.testing.assert_close(got, torch.tanh(x) * 2 + 1)
    assert seen_by_compiler and all(n > 1000 for n in seen_by_compiler), seen_by_compiler
    assert gc.get_freeze_count() == 0


def test_unfrozen_after_a_failed_compile(monkeypatch):
    def broken(*args, **kwargs):
        assert gc.get_freeze_count() > 0
        raise RuntimeError("kiln-test: compile failed")
    monkeypatch.setattr(kiln.compiler, "compile_aten_graph", broken)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="kiln-test: compile failed"):
        with torch.inference_mode():
            kiln.compile(lambda t: t.sin() + 1, fallback=False)(torch.randn(4))
    assert gc.get_freeze_count() == 0


def test_a_process_that_froze_its_heap_keeps_it_frozen(seen_by_compiler):
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        assert before > 0
        _compile_once(lambda t: t.cos() - 1, torch.randn(6))
        assert seen_by_compiler
        assert gc.get_freeze_count() > 0  # kiln did not unfreeze what the process froze
    finally:
        gc.unfreeze()
