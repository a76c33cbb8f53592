"""Weight names picked by a name or a glob pattern."""

from __future__ import annotations

import fnmatch


def picked(names, pattern: str) -> list[str]:
    """The names ``pattern`` picks: the one it names exactly, else those it matches as a glob
    pattern (PyTorch names such as ``layers[0].weight`` hold the glob's ``[ ]``)."""
    names = list(names)
    return [pattern] if pattern in names else [n for n in names if fnmatch.fnmatchcase(n, pattern)]
