"""Fixtures for every test and doctest: each gets its own artifact cache, so runs never touch
``~/.cache`` and cannot see each other's artifacts, and starts from the same seed."""

import pytest

import ortrain as ot


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory):
    ot.artifacts.set_cache_dir(tmp_path_factory.mktemp("artifact-cache"))
    ot.set_seed(1234)
    yield
    ot.artifacts.set_cache_dir(None)
