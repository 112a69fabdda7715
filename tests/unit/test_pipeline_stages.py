"""kiln/pipeline.py names every stage of a compile by the function that runs it: each must exist."""
import importlib

from kiln.pipeline import STAGES, format_stages


def test_every_stage_names_a_function_that_exists():
    for stage in STAGES:
        module, _, name = stage.runs.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), stage
        assert stage.target in ("cpu", "gpu", "both") and stage.why, stage


def test_the_table_lists_every_stage_in_order():
    text = format_stages()
    positions = [text.index(s.runs) for s in STAGES]
    assert positions == sorted(positions) and text.startswith(" 1. capture")
