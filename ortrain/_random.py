"""Seeding: ``ot.set_seed`` makes weight initialisation, shuffling and dropout reproducible."""

from __future__ import annotations

import numpy as np

from ortrain._arrays import checked_int
from ortrain._keywords import names_unknown_arguments_of

_seed: int | None = None
_rng = np.random.default_rng()


@names_unknown_arguments_of
def set_seed(seed: int | None) -> None:
    """Seed ortrain's generator (weights, shuffling, dropout seeds) for what is drawn from now on:
    call it before building a model, whose unseeded dropout layers take their seeds when built;
    ``None`` re-randomises."""
    global _seed, _rng
    _seed = checked_int(seed, "set_seed", minimum=0, allow_none=True)
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
