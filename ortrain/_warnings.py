"""Warnings that point at the user's line, however deep inside ortrain they are raised."""

from __future__ import annotations

import os
import sys
import warnings

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn`` attributed to the first frame outside ortrain: the user's call (or a
    callback of theirs that called ortrain), so the warning names their file and line, and
    filters on their module apply. A fixed ``stacklevel`` named ortrain's own lines from
    some call paths (``Model.fit`` with a generator goes three frames deeper than
    ``fit_generator``)."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
