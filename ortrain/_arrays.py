"""Turning user arrays into what a graph takes: casts, shape checks, clear refusals."""

from __future__ import annotations

import numpy as np

from ortrain.errors import ShapeError, describe_shape


def as_array(value, dtype: np.dtype, argument: str) -> np.ndarray:
    """``value`` as a C-contiguous array of ``dtype``.

    float64 (and other real floats/ints) cast to float32 for float inputs; integer
    labels cast to int64 when they are integers. Strings, objects, complex numbers and
    floats with a fraction given as integer labels are refused.
    """
    a = value if isinstance(value, np.ndarray) else np.asarray(value)
    kind = a.dtype.kind
    if kind in "OUSVcMm":
        raise ShapeError(f"{argument}: expected a numeric array castable to {np.dtype(dtype).name}, received "
                         f"dtype {a.dtype} (strings, objects, complex numbers and dates cannot be cast)")
    dtype = np.dtype(dtype)
    if a.dtype == dtype:
        return a if a.flags.c_contiguous else np.ascontiguousarray(a)
    if dtype.kind in "iu":
        if kind == "f":
            if not np.all(np.isfinite(a)) or np.any(a != np.round(a)):
                raise ShapeError(f"{argument}: expected integer values for dtype {dtype.name}, received floats "
                                 "with a fractional part or non-finite values")
        elif kind not in "iub":
            raise ShapeError(f"{argument}: expected integers, received dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=dtype)


def check_shape(a: np.ndarray, expected: tuple, argument: str, rows: int | None = None) -> None:
    """``expected`` has ``None`` for free dimensions; ``rows`` pins the first one."""
    exp = (rows,) + tuple(expected[1:]) if rows is not None and expected else tuple(expected)
    if a.ndim != len(exp) or any(e is not None and e != n for e, n in zip(exp, a.shape)):
        hint = ""
        if rows is not None and a.ndim == len(exp) and a.shape[0] != rows:
            hint = f"; every batch must hold exactly {rows} rows (pad the last one or drop it)"
        raise ShapeError(f"{argument}: expected shape {describe_shape(exp)}, received "
                         f"{describe_shape(a.shape)}{hint}")
