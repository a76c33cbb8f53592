"""Shared test fixtures (the artifact-cache isolation lives in the repository's root conftest.py,
so that the doctests in ``ortrain/`` get it too)."""

from __future__ import annotations

import importlib.util
import signal

import numpy as np
import pytest


@pytest.fixture
def ctrl_c():
    """Ctrl-C raises KeyboardInterrupt in the test, as in a terminal, also where the tests were started
    in the background by a shell (``make test &``), which starts Python with SIGINT ignored."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def flushed(a) -> np.ndarray:
    """``a`` as ortrain computes it: values below float32's smallest normal number are 0 (the
    runtime flushes subnormals while ortrain runs it, see ortrain.engine.denormals)."""
    a = np.asarray(a)
    return np.where(np.abs(a) < np.finfo(np.float32).tiny, np.zeros((), a.dtype), a)


def torch_or_skip():
    """Import torch, or skip the calling test when it is not installed."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (pip install -e '.[test]')")
    import torch
    torch.set_num_threads(2)
    return torch
