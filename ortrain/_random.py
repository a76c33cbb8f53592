"""Seeding: ``ot.set_seed`` makes weight initialisation, shuffling and dropout reproducible."""

from __future__ import annotations

import numpy as np

_seed: int | None = None
_rng = np.random.default_rng()


def set_seed(seed: int | None) -> None:
    """Seed ortrain's generator (weights, shuffling, dropout seeds); ``None`` re-randomises."""
    global _seed, _rng
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        from ortrain.errors import OrtrainError
        raise OrtrainError(f"set_seed: expected an int >= 0 or None, received {seed!r}")
    _seed = None if seed is None else int(seed)
    _rng = np.random.default_rng(_seed)


def generator(seed: int | None = None) -> np.random.Generator:
    """A generator for one use: seeded from ``seed`` if given, else drawn from the global one."""
    if seed is not None:
        return np.random.default_rng(seed)
    return np.random.default_rng(_rng.integers(0, 2**63 - 1))


def is_seeded() -> bool:
    return _seed is not None


def draw_seed() -> int:
    """An int seed for graph ops (dropout) drawn from the global generator."""
    return int(_rng.integers(0, 2**31 - 1))
