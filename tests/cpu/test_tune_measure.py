"""Measurement isolates bad candidates: compile errors, crashes and hangs are recorded and skipped, and the
good candidates are still measured (kiln/tune/measure.py), and results can go into the tuning database."""
from kiln.tune.db import TuningDB
from kiln.tune.measure import Candidate, measure

GOOD = r"""
#include <cstdint>
extern "C" void kiln_segment_0(void** b) {
  const float* x = (const float*)b[0];
  float* y = (float*)b[1];
  float s = 0;
  for (int64_t i = 0; i < %d; ++i) s += x[i];
  y[0] = s;
}
"""
CRASH = r"""
extern "C" void kiln_segment_0(void** b) { __builtin_trap(); }
"""
HANG = r"""
extern "C" void kiln_segment_0(void** b) { volatile int go = 1; while (go) {} }
"""
BROKEN = r"""
extern "C" void kiln_segment_0(void** b) { this is not C++; }
"""
BUFS = (((1 << 14,), "float32"), ((1,), "float32"))


def test_bad_candidates_are_isolated_and_tuning_goes_on(tmp_path):
    candidates = [
        Candidate("good-small", GOOD % (1 << 12), BUFS, trace={"n": 1 << 12}),
        Candidate("crash", CRASH, BUFS),
        Candidate("hang", HANG, BUFS),
        Candidate("broken", BROKEN, BUFS),
        Candidate("good-full", GOOD % (1 << 14), BUFS, trace={"n": 1 << 14}),
    ]
    results = measure(candidates, repeats=8, warmup=1, timeout_s=12, jobs=2)
    status = {m.name: m.status for m in results}
    assert status == {"good-small": "ok", "crash": "crash", "hang": "timeout", "broken": "compile-error",
                      "good-full": "ok"}, [(m.name, m.status, m.detail[-200:]) for m in results]
    small, full = results[0], results[4]
    assert small.median_s > 0 and full.median_s > 0 and small.spread_s >= 0
    assert "error" in results[3].detail
    db = TuningDB(tmp_path / "t.sqlite", hardware="h", versions="v")
    for m in results:
        if m.status == "ok":
            db.put(f"sum:{m.name}", "reduction", m.trace, m.median_s, m.spread_s, structure="sum:f32")
    assert {r.key for r in db.records()} == {"sum:good-small", "sum:good-full"}


def test_copies_hold_the_values_in_separate_memory():
    """The operand copies a measurement cycles through: the same values, each in memory of its own (so each call
    reads its copy from memory, not from the cache the previous call filled), the original first."""
    import torch

    from kiln.tune import timing
    t = torch.randn(4, 5)
    cs = timing.copies(t, 3)
    assert cs[0] is t and len({c.data_ptr() for c in cs}) == 3
    assert all(torch.equal(c, t) for c in cs)
