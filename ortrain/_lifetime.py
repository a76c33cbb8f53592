"""The lifetime rules shared by everything that holds a runtime session."""

from __future__ import annotations

import contextlib


class Releasable:
    """``with obj: ...`` frees on exit, and garbage collection frees as a backstop.

    Subclasses implement ``free()`` (idempotent) and ``_live()`` (raises ``FreedError`` once
    freed). Free explicitly: when the collector runs is not predictable.
    """

    def _live(self) -> None:
        raise NotImplementedError

    def free(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._live()
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.free()
