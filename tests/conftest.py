"""Shared test set-up: a private kiln cache per test session, fresh Dynamo state per test."""
import os
import tempfile

import pytest

os.environ.setdefault("KILN_CACHE_DIR", tempfile.mkdtemp(prefix="kiln-test-cache-"))


@pytest.fixture(autouse=True)
def _reset_dynamo():
    import torch
    torch._dynamo.reset()
    yield


@pytest.fixture
def candidate_recorder():
    """A choice service (``kiln.tune.choices.Choices``) that measures nothing: each ``decide`` keeps the candidates
    it was offered (built, not run) under its ``what`` and answers ``answer``.  Tests hand it to a pass's
    ``choose`` to check that every candidate computes what the graph needs."""
    from kiln.tune.choices import Choices

    class CandidateRecorder(Choices):
        def __init__(self, answer):
            super().__init__()
            self.answer, self.candidates = answer, {}

        def decide(self, kind, key, calls, baseline, what, **_):
            self.candidates[what] = calls()
            return self.answer
    return CandidateRecorder
