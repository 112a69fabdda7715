"""Measured choices (kiln/runtime/decisions.py): the statistic that picks a winner on a machine whose speed
drifts."""
import time

from kiln.runtime import decisions


def _sleeper(times_s):
    calls = iter(times_s)

    def fn():
        time.sleep(next(calls))
    return fn


def test_fastest_compares_rounds_not_one_lucky_sample():
    """The baseline has one fast moment (the machine was quiet for one call); the candidate is 20% faster in every
    round.  A best-of-N time would keep the baseline; the per-round ratio picks the candidate."""
    slow, fast = 0.010, 0.008
    warm_and_rounds = 1 + 9
    baseline = _sleeper([slow] * 5 + [0.002] + [slow] * (warm_and_rounds - 6))
    candidate = _sleeper([fast] * warm_and_rounds)
    assert decisions.fastest({"base": baseline, "cand": candidate}, "base", rounds=9, what="test") == "cand"
    line = decisions.take_measured()[-1]
    assert line.startswith("measured test: base") and "-> cand" in line and "(x0.8" in line, line


def test_fastest_keeps_the_baseline_within_the_margin():
    same = [0.005] * 10
    assert decisions.fastest({"base": _sleeper(same), "other": _sleeper(same)}, "base", rounds=9) == "base"
    decisions.take_measured()
