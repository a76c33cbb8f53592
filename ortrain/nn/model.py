"""Models: the functional graph of layers, ``Sequential``, and what every model can do.

They live in ``symbolic`` (``Input``, :class:`SymbolicTensor`), ``base_model`` (:class:`Model`),
``training`` (its compile, fit, predict and evaluate) and ``sequential``; this module gathers them.
"""

from ortrain.nn.base_model import Model
from ortrain.nn.sequential import Sequential
from ortrain.nn.symbolic import Input, SymbolicTensor

__all__ = ["Input", "Model", "Sequential", "SymbolicTensor"]
