"""How kiln times candidates (kiln/tune/timing.py): the statistic that picks a winner on a machine whose speed
drifts."""
import time

from kiln.tune import timing


PRE = 1 + timing.LANDSLIDE_ROUNDS  # calls of the landslide check (a warm-up and two rounds), the first of the rounds


def _sleeper(times_s):
    """Sleeps ``times_s`` in turn: a warm-up, the rounds of the first measurement, then those of the second."""
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
    verdict = timing.fastest({"base": baseline, "cand": candidate}, "base", rounds=9, what="test")
    line = verdict.line
    assert verdict.choice == "cand" and abs(verdict.seconds - fast) < 0.002
    assert line.startswith("measured test: base") and "-> cand" in line and "(x0.8" in line, line
    assert "again: cand" in line, line


def test_a_win_must_hold_in_a_second_measurement():
    """A candidate that only looked faster in the first measurement (its calls met a quiet machine) does not
    replace the baseline; the runner-up is a finalist too, and wins if it holds."""
    first, second = 10, 10
    fluke = _sleeper([0.006] * first + [0.012] * second)  # (not under half the others': no landslide)
    steady = _sleeper([0.008] * (first + second))
    base = _sleeper([0.010] * (first + second))
    verdict = timing.fastest({"base": base, "fluke": fluke, "steady": steady}, "base", rounds=9)
    assert verdict.choice == "steady"
    assert "again: fluke" in verdict.line and "steady" in verdict.line.split("again:")[1], verdict.line
    fluke = _sleeper([0.006] * first + [0.012] * second)
    base = _sleeper([0.010] * (first + second))
    assert timing.fastest({"base": base, "fluke": fluke}, "base", rounds=9).choice == "base"


def test_fastest_keeps_the_baseline_within_the_margin():
    same = [0.005] * 10
    assert timing.fastest({"base": _sleeper(same), "other": _sleeper(same)}, "base", rounds=9).choice == "base"


def test_a_landslide_is_settled_in_two_rounds():
    """A candidate under half of every other's time in both rounds of the first check wins without the nine
    rounds (a slow library call would cost twenty calls); a 2x gap in one round only is no landslide."""
    counts = {"base": 0, "fast": 0, "mid": 0}

    def timed(name, t):
        def fn():
            counts[name] += 1
            time.sleep(t)
        return fn
    # (gaps of 5x and 10x, not 3x and 6x: a 2 ms sleep overran half of a 6 ms one on a loaded CI machine)
    calls = {"base": timed("base", 0.020), "fast": timed("fast", 0.002), "mid": timed("mid", 0.010)}
    verdict = timing.fastest(calls, "base", rounds=9, what="slide")
    assert verdict.choice == "fast"
    assert counts == {"base": PRE, "fast": PRE, "mid": PRE}
    line = verdict.line
    assert line.startswith("measured slide:") and "landslide" in line and line.endswith("-> fast"), line
    # fast in one round only: measured in full (and the baseline kept: no 3% win in the median)
    times = iter([0.010, 0.002] + [0.010] * 30)
    fluke = lambda: time.sleep(next(times))  # noqa: E731 - warm-up, then 0.002 in round one only
    verdict = timing.fastest({"base": _sleeper([0.010] * 22), "fluke": fluke}, "base", rounds=9)
    assert verdict.choice == "base" and "landslide" not in verdict.line


def test_the_landslide_rounds_count_as_the_first_rounds():
    """Nine rounds in all, not two thrown away and nine more: a warm-up and nine timed calls per candidate."""
    counts = {"base": 0, "other": 0}

    def timed(name):
        def fn():
            counts[name] += 1
            time.sleep(0.002)
        return fn
    assert timing.fastest({"base": timed("base"), "other": timed("other")}, "base", rounds=9).choice == "base"
    assert counts == {"base": 10, "other": 10}


def test_drift_corrected_times_follow_what_holds_in_every_round():
    """Round 2 ran at half speed, and in round 3 function b met a fast moment: a's 10% lead in the other rounds
    decides, and the level stays that of a typical round."""
    rounds = [[1.0, 1.1, 2.0], [2.0, 2.2, 4.0], [1.0, 0.5, 2.0], [1.0, 1.1, 2.0], [1.02, 1.12, 2.0]]
    a, b, c = timing.drift_corrected(rounds)
    assert a < b < c
    assert 0.9 < a < 1.1 and 1.0 < b < 1.2 and 1.8 < c < 2.2
