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
