"""Dependency order over the graphs ortrain records (layer calls, traced ``ag`` tensors)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def post_order(roots: Iterable[T], inputs_of: Callable[[T], Iterable[T]]) -> list[T]:
    """Every item the roots depend on, each after its inputs, in a deterministic order.

    Iterative, so deep graphs cannot overflow the Python stack; items are told apart by identity.
    """
    order: list[T] = []
    seen: set[int] = set()
    stack: list[tuple[T, bool]] = [(r, False) for r in reversed(list(roots))]
    while stack:
        item, expanded = stack.pop()
        if expanded:
            order.append(item)
            continue
        if id(item) in seen:
            continue
        seen.add(id(item))
        stack.append((item, True))
        stack.extend((i, False) for i in reversed(list(inputs_of(item))) if id(i) not in seen)
    return order
