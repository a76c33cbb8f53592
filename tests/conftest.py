"""Shared test fixtures.

Every test gets its own artifact cache (``tmp_path``-based) so runs never touch
``~/.cache`` and tests cannot see each other's artifacts.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import ortrain as ot


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory):
    ot.artifacts.set_cache_dir(tmp_path_factory.mktemp("artifact-cache"))
    ot.set_seed(1234)
    yield
    ot.artifacts.set_cache_dir(None)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def torch_or_skip():
    """Import torch, or skip the calling test when it is not installed."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (pip install -e '.[test]')")
    import torch
    torch.set_num_threads(2)
    return torch
