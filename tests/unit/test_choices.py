"""The measured-choice service (kiln/tune/choices.py): forced, stored, measured, predicted - and one store."""
import time

import pytest

from kiln import config
from kiln.tune.choices import Choices, Kind, parse_forced

TOY = Kind("toy_choice", 1, ("slow", "fast"))


def _calls(made):
    """Candidates whose building is counted (``made``): 'fast' is clearly faster than the baseline 'slow'."""
    def build():
        made.append(1)
        return {"slow": lambda: time.sleep(0.004), "fast": lambda: time.sleep(0.001)}
    return build


def test_measured_once_then_stored_for_every_later_compile(tmp_path):
    with config.scope(cache_dir=str(tmp_path)):
        made = []
        first = Choices()
        assert first.decide(TOY, (64, 1), _calls(made), baseline="slow", what="toy 64") == "fast"
        assert made == [1] and first.made[-1].how == "measured" and "-> fast" in first.made[-1].note
        first.close()
        later = Choices()  # (a new compile, as in a new process: only the database carries the answer)
        assert later.decide(TOY, (64, 1), _calls(made), baseline="slow", what="toy 64") == "fast"
        assert made == [1] and later.made[-1].how == "stored"
        assert later.decide(TOY, (65, 1), _calls(made), baseline="slow", what="toy 65") == "fast"
        assert made == [1, 1]  # another problem is measured
        bumped = Kind("toy_choice", 2, ("slow", "fast"))  # new candidates or timing: stored answers are not read
        assert later.known(bumped, (64, 1), "toy 64") is None
        later.close()


def test_forced_answers_are_not_measured(tmp_path):
    with config.scope(cache_dir=str(tmp_path)):
        made = []
        choices = Choices(forced="toy_choice=slow")
        assert choices.forced_value(TOY) == "slow"
        assert choices.decide(TOY, (1,), _calls(made), baseline="fast", what="toy") == "slow"
        assert made == [] and choices.made[-1].how == "forced"


def test_past_the_budget_the_rule_predicts_and_nothing_is_stored(tmp_path):
    with config.scope(cache_dir=str(tmp_path)):
        made = []
        choices = Choices(budget_s=0.0)
        assert choices.decide(TOY, (8,), _calls(made), baseline="slow", what="toy", predict=lambda: "fast") == "fast"
        assert choices.decide(TOY, (9,), _calls(made), baseline="slow", what="toy") == "slow"
        assert made == [] and [m.how for m in choices.made] == ["predicted", "predicted"]
        assert Choices().known(TOY, (8,), "toy") is None  # a later compile with budget left measures it
        roomy = Choices(budget_s=60.0)
        assert roomy.decide(TOY, (8,), _calls(made), baseline="slow", what="toy", estimate_s=120.0) == "slow"
        assert made == [] and roomy.made[-1].how == "predicted"  # (a measurement estimated past the budget)


def test_one_candidate_is_not_measured_or_stored(tmp_path):
    with config.scope(cache_dir=str(tmp_path)):
        choices = Choices()
        assert choices.decide(TOY, (3,), lambda: {"slow": lambda: None}, baseline="slow", what="toy") == "slow"
        assert choices.made[-1].how == "only candidate" and choices.known(TOY, (3,), "toy") is None


def test_forcing_names_unknown_kinds_and_answers():
    with pytest.raises(ValueError, match="unknown kind 'nope'.*toy_choice"):
        parse_forced("nope=1")
    with pytest.raises(ValueError, match=r"toy_choice takes one of \['slow', 'fast'\]"):
        parse_forced("toy_choice=medium")
    assert parse_forced(" toy_choice = fast , ") == {"toy_choice": "fast"}
    with pytest.raises(ValueError, match="kind=answer pairs"):
        config.get().with_options(choices="gemm:kiln")


def test_kiln_compile_checks_forced_choices_before_the_first_call():
    import torch

    import kiln
    with pytest.raises(ValueError, match="gemm takes one of"):
        kiln.compile(torch.nn.Linear(4, 4), choices="gemm=mkl")


def test_every_compile_measures_the_same_problems(tmp_path):
    """The budget is spent in estimated seconds, stored answers included: a second compile finds what the first
    measured and predicts what the first predicted, so it builds the same module (no more measuring, no new
    build)."""
    def compile_once():
        made = []
        choices = Choices(budget_s=1.0)
        answers = [choices.decide(TOY, (n,), _calls(made), baseline="slow", what=f"toy {n}", estimate_s=0.6)
                   for n in (1, 2, 3)]
        return answers, [m.how for m in choices.made], made
    with config.scope(cache_dir=str(tmp_path)):
        first = compile_once()
        second = compile_once()
    assert first[:2] == (["fast", "slow", "slow"], ["measured", "predicted", "predicted"]) and first[2] == [1]
    assert second[:2] == (["fast", "slow", "slow"], ["stored", "predicted", "predicted"]) and second[2] == []


def test_answers_with_a_hyphen_can_be_forced():
    """``layout=channels-last`` and ``bmm_layout=a-column-major`` pass Config's check (it once allowed only word
    characters, so the layout could not be forced from an option or KILN_CHOICES)."""
    import kiln
    from kiln import config
    from kiln.schedule import choose, operand_layout  # noqa: F401  (they declare the kinds)
    with config.scope(choices="layout=channels-last,bmm_layout=a-column-major"):
        assert parse_forced(config.get().choices) == {"layout": "channels-last", "bmm_layout": "a-column-major"}
    kiln.compile(lambda x: x + 1, choices="layout=channels-last")  # (checked when compile is called)
