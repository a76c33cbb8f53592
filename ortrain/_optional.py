"""Optional dependencies (matplotlib, pandas): a missing one and one that is installed but cannot
be imported (built for another numpy, say) are told apart, each with what to do."""

from __future__ import annotations

import importlib

from ortrain.errors import OrtrainError


class Unusable(OrtrainError, ImportError):
    """An optional package is missing, or installed but fails to import (an ``ImportError`` too, so
    ``except ImportError`` falls back as it would around the import itself)."""

    def __init__(self, message: str, missing: bool):
        super().__init__(message)
        self.missing = missing


def load(name: str, who: str):
    """Import ``name`` (``matplotlib.pyplot``) for ``who`` (``History.plot``), or raise
    :class:`Unusable` saying whether its package is missing or broken, and the fix."""
    package = name.split(".")[0]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == package:
            raise Unusable(f"{who} needs {package}, which is not installed; install the plot extra: "
                           f"pip install 'ortrain[plot]' (or pip install {package})", missing=True) from None
        reason = f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # noqa: BLE001 - a broken install raises anything (ValueError for a numpy ABI)
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    import numpy
    raise Unusable(f"{who} needs {package}, which is installed but fails to import ({reason}); install a "
                   f"version built for numpy {numpy.__version__}: pip install --upgrade {package}",
                   missing=False) from None
