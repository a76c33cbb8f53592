"""The exceptions ortrain raises.

Every message names the argument, what was expected, what was received and,
where there is one, the fix.
"""

from __future__ import annotations

__all__ = ["OrtrainError", "ShapeError", "FreedError", "NonFiniteError", "UnsupportedOpError", "ArgumentError"]


class OrtrainError(Exception):
    """Base class of every error ortrain raises on purpose."""


class ShapeError(OrtrainError, ValueError):
    """An array has the wrong shape or dtype for the graph it is fed to."""


class FreedError(OrtrainError, RuntimeError):
    """A trainer, snapshot or captured step was used after ``free()``."""


class NonFiniteError(OrtrainError, FloatingPointError):
    """A loss or gradient norm is NaN or infinite; the update was refused."""


class UnsupportedOpError(OrtrainError, NotImplementedError):
    """A graph uses an operator ortrain cannot train through."""


class ArgumentError(OrtrainError, TypeError):
    """A constructor was given an argument it does not take (a ``TypeError`` too, as Python's own)."""


def describe_shape(shape) -> str:
    """``(32, 4)`` style text for error messages; ``None`` dimensions print as ``N``."""
    dims = ["N" if d is None or isinstance(d, str) else str(d) for d in shape]
    return "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
