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
    baseline = _sleeper([slow] * 5 + [0.002] + [slow] * (2 * warm_and_rounds - 6))
    candidate = _sleeper([fast] * 2 * warm_and_rounds)  # (the winner is measured twice)
    assert decisions.fastest({"base": baseline, "cand": candidate}, "base", rounds=9, what="test") == "cand"
    line = decisions.take_measured()[-1]
    assert line.startswith("measured test: base") and "-> cand" in line and "(x0.8" in line, line
    assert "again: cand" in line, line


def test_a_win_must_hold_in_a_second_measurement():
    """A candidate that only looked faster in the first measurement (its calls met a quiet machine) does not
    replace the baseline; the runner-up is a finalist too, and wins if it holds."""
    first, second = 10, 10
    fluke = _sleeper([0.004] * first + [0.012] * second)
    steady = _sleeper([0.008] * (first + second))
    base = _sleeper([0.010] * (first + second))
    assert decisions.fastest({"base": base, "fluke": fluke, "steady": steady}, "base", rounds=9) == "steady"
    line = decisions.take_measured()[-1]
    assert "again: fluke" in line and "steady" in line.split("again:")[1], line
    fluke = _sleeper([0.004] * first + [0.012] * second)
    base = _sleeper([0.010] * (first + second))
    assert decisions.fastest({"base": base, "fluke": fluke}, "base", rounds=9) == "base"
    decisions.take_measured()


def test_fastest_keeps_the_baseline_within_the_margin():
    same = [0.005] * 10
    assert decisions.fastest({"base": _sleeper(same), "other": _sleeper(same)}, "base", rounds=9) == "base"
    decisions.take_measured()


def test_drift_corrected_times_follow_what_holds_in_every_round():
    """Round 2 ran at half speed, and in round 3 function b met a fast moment: a's 10% lead in the other rounds
    decides, and the level stays that of a typical round."""
    rounds = [[1.0, 1.1, 2.0], [2.0, 2.2, 4.0], [1.0, 0.5, 2.0], [1.0, 1.1, 2.0], [1.02, 1.12, 2.0]]
    a, b, c = decisions.drift_corrected(rounds)
    assert a < b < c
    assert 0.9 < a < 1.1 and 1.0 < b < 1.2 and 1.8 < c < 2.2
