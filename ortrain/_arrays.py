"""Turning user arguments into what a graph takes: counts, casts, shape and label checks, chunked runs.

Written once here and used by ``Model``, ``Trainer``, ``Snapshot``, the data sources and the fit
loop, so that every entry point accepts and refuses the same things with the same words.
"""

from __future__ import annotations

import collections.abc
import dataclasses

import numpy as np

from ortrain._label_hints import label_hint
from ortrain._warnings import warn
from ortrain.errors import NonFiniteError, OrtrainError, ShapeError, describe_shape


def read_array(value, argument: str) -> np.ndarray:
    """``value`` as numpy reads it, uncast; what numpy cannot read (a ragged nested list) is refused.
    A torch tensor that requires grad is read detached (its values), and pandas' nullable columns
    (``Float64``, ``Int64``) as floats with NaN where a value is missing."""
    if type(value) is np.ndarray:
        return value
    if isinstance(value, np.ndarray):
        return _plain(value, argument)
    if batch_source_like(value):
        raise ShapeError(f"{argument}: expected an array, received a {type(value).__name__}, which gives batches "
                         f"one at a time: a source of (x, y) batches goes alone to fit or evaluate (fit(batches), "
                         f"without y; its batches carry the labels), and predict takes arrays (predict each "
                         f"batch's x)")
    if getattr(value, "requires_grad", False) and callable(getattr(value, "detach", None)):
        value = value.detach()  # torch refuses to give the values of a tensor in a graph otherwise
    elif type(value).__module__.startswith("pandas") and callable(getattr(value, "to_numpy", None)):
        value = _pandas_values(value)
    if str(getattr(value, "dtype", "")) == "torch.bfloat16" and callable(getattr(value, "float", None)):
        value = value.float()  # numpy has no bfloat16: float32 holds every bfloat16 exactly
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:  # ragged nested lists, objects numpy cannot read
        batches = isinstance(value, (list, tuple)) and value and isinstance(value[0], tuple) and \
            len(value[0]) in (2, 3) and all(hasattr(v, "shape") for v in value[0])
        hint = ("; it looks like a list of (x, y) batches, which goes alone to fit or evaluate (fit(batches), "
                "without y)") if batches else ""
        raise ShapeError(f"{argument}: expected an array (nested lists need rows of equal length), received a "
                         f"{type(value).__name__} numpy cannot make one from ({str(exc).split('.')[0]}){hint}") \
            from None


def _plain(value: np.ndarray, argument: str) -> np.ndarray:
    """An ndarray subclass as the plain array of its values (``np.asarray``): a matrix keeps its
    shape, where its own methods keep two dimensions (a column's ``reshape(-1)`` is a row), and a
    masked array with masked entries is refused, its hidden values being read by some parts and
    the mask by others."""
    if isinstance(value, np.ma.MaskedArray) and np.ma.is_masked(value):
        n = int(np.ma.count_masked(value))
        raise ShapeError(f"{argument}: expected an array of values, received a masked array with {n} masked "
                         f"entr{'y' if n == 1 else 'ies'}, whose hidden values would be read as data; fill them "
                         "first (a.filled(value)), or leave out the samples that hold them")
    return np.asarray(value)


def batch_source_like(value) -> bool:
    """A generator, an iterator, a callable or another iterable that is no container of values (a
    torch DataLoader): what gives batches one at a time, as opposed to arrays, lists, tuples, dicts
    and objects numpy reads (tensors, frames)."""
    if isinstance(value, (np.ndarray, list, tuple, dict, str, bytes)) or hasattr(value, "__array__") or \
            hasattr(value, "__array_interface__") or hasattr(value, "shape"):
        return False
    return isinstance(value, collections.abc.Iterator) or callable(value) or \
        isinstance(value, collections.abc.Iterable) and not isinstance(value, collections.abc.Sequence)


def _pandas_values(frame):
    """A pandas frame's or series' values; nullable numeric columns (which numpy reads as objects),
    and numeric columns of several types with a boolean one (pandas joins them as objects), in the
    type numpy joins them to, or, where a value is missing, as float64 with NaN there, which the
    checks for non-finite data then name."""
    dtypes = list(frame.dtypes) if hasattr(frame, "columns") else [frame.dtype]
    kinds = [getattr(d, "kind", "O") for d in dtypes]
    nullable = any(type(d).__module__.startswith("pandas") and k in "iufb" for d, k in zip(dtypes, kinds))
    if not nullable and not ("b" in kinds and len(set(kinds)) > 1 and all(k in "iufb" for k in kinds)):
        return frame  # numpy reads it (numbers of several types join in the widest)
    try:
        if frame.isna().to_numpy().any():
            return frame.to_numpy(dtype=np.float64, na_value=np.nan)
        return frame.to_numpy(dtype=np.result_type(*[getattr(d, "numpy_dtype", d) for d in dtypes]))
    except (TypeError, ValueError):
        return frame


def as_array(value, dtype: np.dtype, argument: str) -> np.ndarray:
    """``value`` as a C-contiguous array of ``dtype``.

    float64 (and other real floats/ints) cast to float32 for float inputs; integer
    labels cast to int64 when they are integers, numbers to bool when they are 0 and 1. Strings,
    objects, complex numbers, floats with a fraction given as integer labels and other numbers
    given as booleans are refused.
    """
    if value is None:
        raise ShapeError(f"{argument}: expected an array, received None")
    a = read_array(value, argument)
    kind = a.dtype.kind
    if kind in "OUSVcMm":
        raise ShapeError(f"{argument}: expected a numeric array castable to {np.dtype(dtype).name}, received "
                         f"dtype {a.dtype} (strings, objects, complex numbers and dates cannot be cast)")
    dtype = np.dtype(dtype)
    if a.dtype == dtype:
        return a if a.flags.c_contiguous else np.ascontiguousarray(a)
    if dtype.kind in "iu":
        if kind == "f":
            if not all(np.isfinite(part).all() and (part == np.round(part)).all() for _, part in row_blocks(a)):
                raise ShapeError(f"{argument}: expected integer values for dtype {dtype.name}, received floats "
                                 "with a fractional part or non-finite values")
        elif kind not in "iub":
            raise ShapeError(f"{argument}: expected integers, received dtype {a.dtype}")
        info = np.iinfo(dtype)
        # floats compare against 2**63, not float(2**63 - 1), which rounds up to it
        top = float(info.max) + 1.0
        wider = kind == "f" or (kind in "iu" and (np.iinfo(a.dtype).max > info.max or np.iinfo(a.dtype).min < info.min))
        if a.size and wider:
            hi, lo = a.max(), a.min()
            if kind == "f":  # compared as Python floats: float16 cannot hold the bounds
                hi, lo = float(hi), float(lo)
            if (hi >= top if kind == "f" else hi > info.max) or lo < info.min:
                raise ShapeError(f"{argument}: holds {hi if lo >= info.min else lo}, beyond the range of "
                                 f"{dtype.name} [{info.min}, {info.max}]")
    elif dtype.kind == "b" and a.size and not np.isin(a, (0, 1)).all():
        # numpy's cast makes 0.5 or 2 True; a soft mask is another input than a boolean one
        raise ShapeError(f"{argument}: expected booleans (or 0 and 1), received dtype {a.dtype} holding "
                         f"{a[~np.isin(a, (0, 1))].flat[0]}; pass a boolean array, e.g. values > 0.5")
    if kind == "f" and dtype.kind == "f" and a.dtype.itemsize > dtype.itemsize:
        with np.errstate(over="ignore"):
            out = np.asarray(a, dtype=dtype, order="C")
        for start, part in row_blocks(out):
            if part.size and not np.isfinite(part).all():
                given = a[start:start + len(part)] if out.ndim else a
                beyond = ~np.isfinite(part) & np.isfinite(given)
                if beyond.any():
                    info = np.finfo(dtype)
                    # repr, not :g: a value just past the largest float32 prints as the bound at 6 digits;
                    # a long double beyond float64's range as numpy prints it (float() makes it inf)
                    value = given[beyond].flat[0]
                    shown = repr(float(value)) if np.isfinite(float(value)) else str(value)
                    raise ShapeError(f"{argument}: holds {shown}, beyond the range of "
                                     f"{dtype.name} [{float(info.min)!r}, {float(info.max)!r}]; scale the data to a "
                                     "usual range")
        return out
    return np.asarray(a, dtype=dtype, order="C")  # ascontiguousarray would make a scalar 1-d


# A data set larger than this many values that needs a cast (float64 rows for a float32 input, a view
# whose rows are not contiguous) is cast batch by batch as it is read, not copied whole first: a
# float64 memory map larger than memory trains and predicts in batches, as Keras reads arrays.
DEFERRED_VALUES = 1 << 22


class RowCast:
    """The rows of ``raw`` cast to ``dtype`` as they are read: ``rows[i]`` (a slice, an index array)
    is a C-contiguous array of ``dtype``; ``shape``, ``ndim``, ``size`` and ``len`` are the data's.
    Made by :func:`prepare_inputs` (``defer=True``) after checking every value in blocks, so reading
    casts only."""

    __slots__ = ("raw", "dtype")

    def __init__(self, raw: np.ndarray, dtype: np.dtype):
        self.raw, self.dtype = raw, np.dtype(dtype)

    shape = property(lambda self: self.raw.shape)
    ndim = property(lambda self: self.raw.ndim)
    size = property(lambda self: self.raw.size)
    nbytes = property(lambda self: self.raw.size * self.dtype.itemsize)

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, key) -> np.ndarray:
        with np.errstate(over="ignore"):  # (values beyond float32 were refused when it was made)
            return np.ascontiguousarray(self.raw[key], dtype=self.dtype)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self[...].astype(dtype, copy=False) if dtype is not None else self[...]

    def rows(self, key: slice) -> RowCast:
        """Some rows, still cast as they are read (``split_arrays``' training and held-out parts)."""
        return RowCast(self.raw[key], self.dtype)


def rows_of(a, key: slice):
    """Rows of a prepared array, a :class:`RowCast` staying one."""
    return a.rows(key) if isinstance(a, RowCast) else a[key]


def _deferred(value, dtype: np.dtype, argument: str):
    """``value`` as a :class:`RowCast` when it is a large array of real numbers that a float input
    reads only after a cast or a copy; its values are checked now, in blocks, as :func:`as_array`
    checks them. Else None (cast whole by :func:`as_array`)."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f" or not isinstance(value, np.ndarray):
        return None
    a = read_array(value, argument)
    if a.dtype.kind not in "fiub" or a.ndim < 1 or (a.dtype == dtype and a.flags.c_contiguous):
        return None
    if a.dtype.kind == "f" and a.dtype.itemsize > dtype.itemsize:
        for _, part in row_blocks(a):
            as_array(part, dtype, argument)  # refuses values beyond float32 (a block at a time)
    return RowCast(a, dtype)


def check_shape(a: np.ndarray, expected: tuple, argument: str, rows: int | None = None,
                rows_of: str | None = None) -> None:
    """``expected`` has ``None`` for free dimensions; ``rows`` pins the first one: a trainer's batch
    size, or with ``rows_of`` the rows of that other argument."""
    exp = (rows,) + tuple(expected[1:]) if rows is not None and expected else tuple(expected)
    if a.ndim != len(exp) or any(e is not None and e != n for e, n in zip(exp, a.shape)):
        if rows is not None and a.ndim == len(exp) and a.shape[0] != rows:
            hint = (f"; give one row per row of {rows_of}" if rows_of else
                    f"; every batch must hold exactly {rows} rows (pad the last one or drop it)")
        elif a.ndim == len(exp) and exp and exp[0] is not None and a.shape[0] != exp[0] and \
                all(e is None or e == n for e, n in zip(exp[1:], a.shape[1:])):
            hint = (f"; the model's graph fixes its batch at {exp[0]} rows (an export without a dynamic "
                    f"batch axis, e.g. torch.onnx.export without dynamic_axes={{'x': {{0: 'batch'}}}} or, with "
                    f"dynamo, dynamic_shapes), so every batch must hold {exp[0]} rows (predict, evaluate and "
                    f"fit cut arrays into such batches); or re-export it with a dynamic batch axis")
        elif a.ndim == len(exp) - 1 and all(e is None or e == n for e, n in zip(exp[1:], a.shape)):
            hint = (f"; it is one sample without the batch axis: a dataset indexed one sample at a time (a "
                    f"torch Dataset) goes through a loader that batches it (DataLoader(dataset, batch_size=...)), "
                    f"and one row is {argument}[None]")
        elif a.ndim == len(exp) == 4 and all(e is None or e == n for e, n in zip(exp[1:], np.take(a.shape, (3, 1, 2)))):
            hint = (f"; {argument} looks channels last (batch, height, width, channels), as Keras lays images out: "
                    f"ortrain's are channels first, so pass {argument}.transpose(0, 3, 1, 2)")
        else:
            hint = f"; reshape {argument} to that, or build the model for this shape"
        raise ShapeError(f"{argument}: expected shape {describe_shape(exp)}, received "
                         f"{describe_shape(a.shape)}{hint}")


def staged_weights(weights, like: dict[str, tuple[tuple, np.dtype]], whose: str) -> list[tuple[str, np.ndarray]]:
    """``set_weights``' argument as checked ``(name, array)`` pairs, new arrays: a list in the order of
    ``like`` (each weight's shape and dtype by name), or a dict by name holding any of them, each cast
    to its weight's dtype and of its shape (a single number for a weight of shape (1,)). Refused,
    naming the weight, before anything is set; ``whose`` ends the message naming unknown weights."""
    names = list(like)
    if isinstance(weights, collections.abc.Mapping):
        unknown = sorted(map(str, set(weights) - set(names)))
        if unknown:
            raise OrtrainError(f"set_weights: unknown weight names {unknown}; {whose}")
        items = list(weights.items())
    else:
        if weights is None or isinstance(weights, (str, bytes, np.ndarray)) or not hasattr(weights, "__iter__"):
            raise OrtrainError(f"set_weights: expected a list of arrays in weight_names() order or a dict "
                               f"keyed by weight name, received {type(weights).__name__}")
        weights = list(weights)
        if len(weights) != len(names):
            raise OrtrainError(f"set_weights: expected {len(names)} arrays ({', '.join(names)}), received "
                               f"{len(weights)}; give a dict to set some of them")
        items = list(zip(names, weights))
    staged = []
    for name, value in items:
        shape, dtype = like[name]
        a = as_array(value, dtype, f"set_weights[{name!r}]")
        if a.shape == () and shape == (1,):  # a trainable scalar is kept with shape (1,)
            a = a.reshape(1)
        if a.shape != shape:
            raise ShapeError(f"set_weights: {name!r} expected shape {describe_shape(shape)}, received "
                             f"{describe_shape(a.shape)}; nothing was changed")
        staged.append((name, np.array(a, copy=True, order="C")))
    return staged


def _rank(value) -> int | None:
    try:
        return np.ndim(value)
    except ValueError:  # ragged
        return None


def of_the_output(outputs: list[str], value, argument: str, ranks: range | tuple, rows: int | None = None):
    """Keras' per-output forms of labels or weights, for the first output, the one ortrain trains:
    a list of one array of one of the ``ranks`` the whole array may have (batch axis included), or a
    dict keyed by that output's name, as the array (a list of one array of a lower rank is one
    sample's, read as before). A dict keyed otherwise is refused, naming what is taken; anything
    else passes as it is. Given the batch's ``rows`` (of weights: labels have their own refusal of
    several arrays), a list of one array of those rows per output is refused too; a list of as
    many arrays as rows stays rows (weights per position)."""
    if isinstance(value, (list, tuple)):
        if len(value) == 1 and getattr(value[0], "ndim", None) in ranks:  # (ranks count the batch axis)
            return value[0]
        if rows is not None and 1 < len(value) <= len(outputs) and len(value) != rows and \
                all(_rank(v) in ranks and len(v) == rows for v in value):
            raise OrtrainError(f"{argument}: received a list of {len(value)} arrays, Keras' form for several "
                               f"outputs; ortrain trains the model's first output ({outputs[0]!r}) and takes its "
                               f"{argument} alone: give {argument}=array (the other outputs have no loss)")
    elif isinstance(value, dict):
        if list(value) == [outputs[0]]:
            return value[outputs[0]]
        alone = "" if len(outputs) == 1 else "; the other outputs have no loss"
        raise OrtrainError(f"{argument}: received a dict with keys {sorted(map(str, value))}; ortrain trains the "
                           f"model's first output ({outputs[0]!r}) and takes its {argument} alone: give "
                           f"{argument}=array, or {{{outputs[0]!r}: array}}{alone}")
    return value


def refuse_non_finite(arrays: list[np.ndarray], arguments: list[str], outcome: str,
                      needs: str = "training needs finite values", first_row: int = 0) -> None:
    """Raise :class:`NonFiniteError` naming the first float array holding a NaN or an infinity,
    the value and its row (counted from ``first_row``, where the arrays are the tail of others);
    ``outcome`` says what was (not) done, e.g. "nothing was trained"."""
    for a, arg in zip(arrays, arguments):
        if a.dtype.kind != "f":
            continue
        for start, part in row_blocks(a):
            if not np.isfinite(part).all():
                at = tuple(int(j) for j in np.argwhere(~np.isfinite(part))[0])
                value = np.asarray(part[at]).reshape(-1)[0]  # (a block cast as it is read indexes to an array)
                raise NonFiniteError(f"{arg}: holds {value} in row {first_row + start + at[0]}; {needs}, so "
                                     f"{outcome} (drop or repair that sample)")


# A whole data set is checked in blocks of about this many values: a check of all of it at once
# would make a mask of a byte a value (a quarter of a float32 data set, which may be a memory map).
BLOCK_VALUES = 1 << 20


def row_blocks(a: np.ndarray):
    """``(first row, rows)`` of ``a`` in blocks of about :data:`BLOCK_VALUES` values (one block for a
    small array, or a 0-d one)."""
    if a.size <= BLOCK_VALUES or a.ndim == 0:
        yield 0, a
        return
    step = max(1, BLOCK_VALUES // max(1, a[0].size))
    for start in range(0, a.shape[0], step):
        yield start, a[start:start + step]


# -- counts ----------------------------------------------------------------------------------------
# The smallest normal float32: ortrain's sessions flush smaller values to 0 (engine.denormals), so a
# setting below it (an epsilon, a Huber delta) is 0 there.
FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def as_float32(value) -> float:
    """A real number as the runtime holds it (float32): what a setting checked in float64 becomes
    there (inf beyond 3.4e38, 0 below 1.4e-45, 1.0 for 0.99999999)."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.float32(value))


def is_real(value) -> bool:
    """A real number, Python's or numpy's (``np.float32(0.5)`` included), not a bool."""
    if isinstance(value, np.ndarray):
        return value.ndim == 0 and value.dtype.kind in "iuf"
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def is_integer(value) -> bool:
    """An integer as numpy takes one for an axis or a dimension: a Python or numpy int, or a 0-d integer
    array; not a bool (``axis=True`` is a mistake) and not a float (numpy refuses ``axis=1.0`` too)."""
    if isinstance(value, np.ndarray):
        return value.ndim == 0 and value.dtype.kind in "iu"
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def one_of_two_names(where: str, ours: str, value, default, theirs: str, given):
    """An argument that has a second name (PyTorch's ``dim`` for ``axis``, Keras' ``learning_rate``
    for ``lr``): ``given`` when the caller used ``theirs``, else ``value``. Both, with different
    values, are refused; a value left at ``default`` gives way to the other name's."""
    if given is None:
        return value

    def same(a, b) -> bool:
        def plain(v):
            return tuple(np.asarray(v).ravel().tolist()) if isinstance(v, (list, tuple, np.ndarray)) else v
        return plain(a) == plain(b)
    if not same(value, default) and not same(value, given):
        raise OrtrainError(f"{where}: {ours}={value!r} and {theirs}={given!r} name one setting; pass one of them")
    return given


def checked_flag(value, argument: str) -> bool:
    """A True/False argument (numpy's bool too); anything else is refused, not read as truthy."""
    if not isinstance(value, (bool, np.bool_)):
        raise OrtrainError(f"{argument}: expected True or False, received {value!r}")
    return bool(value)


def checked_int(value, argument: str, *, minimum: int = 1, allow_none: bool = False) -> int | None:
    """``value`` as an int of at least ``minimum``; ``None`` passes through when ``allow_none``.

    Bools are refused although Python counts them as ints: ``batch_size=True`` is a mistake,
    not a batch of one.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu":
        value = value.item()  # a 0-d integer array, as kernel sizes and Python's range() take it
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
        raise OrtrainError(f"{argument}: expected {kind}{' or None' if allow_none else ''}, received {value!r}")
    return int(value)


def checked_seed(value, argument: str) -> int | None:
    """A seed that a graph's random op can carry (its ``seed`` attribute is an int64): an int from 0
    to 2**63 - 1, or None."""
    seed = checked_int(value, argument, minimum=0, allow_none=True)
    if seed is not None and seed > 2**63 - 1:
        raise OrtrainError(f"{argument}: expected an int from 0 to 2**63 - 1 or None, received {seed}; pass a "
                           "smaller seed")
    return seed


def positive_int(value, argument: str, *, allow_none: bool = False) -> int | None:
    """``value`` as an int >= 1 (``None`` passes through when ``allow_none``)."""
    return checked_int(value, argument, minimum=1, allow_none=allow_none)


# -- inputs, labels, weights -----------------------------------------------------------------------
class InputBounds(dict):
    """``Model.index_bounds()``: ``(lowest, highest, what)`` for each input read as row indices of a
    table; ``sizes``, where the model has free input sizes, refuses sizes its layers cannot take
    (:class:`ortrain.nn.sizes.SizeCheck`)."""

    sizes = None


def prepare_inputs(specs, x, argument: str = "x", rows: int | None = None,
                   bounds: dict[str, tuple[int, int, str]] | None = None, defer: bool = False) -> list[np.ndarray]:
    """The arrays for the graph inputs ``specs``, cast and checked; ``rows`` pins the batch size.

    One input takes ``x`` itself (or, as Keras does, a list holding it: one array, tensor or frame
    of the input's rank; a list of rows stays rows); several take a list or tuple of arrays in
    ``specs`` order, or (as Keras does) a dict keyed by input name. ``bounds`` (``Model.index_bounds()``) gives the
    range of inputs that index a table's rows and, with free input sizes, checks them. ``defer``: a large data set that needs a cast may
    come back as a :class:`RowCast`, for callers that read it only by rows.
    """
    if isinstance(x, dict):
        names = [s.name for s in specs]
        if set(x) != set(names):
            missing = [n for n in names if n not in x]
            extra = sorted(str(k) for k in x if k not in names)
            raise ShapeError(f"{argument}: a dict of inputs needs one array per input name {names} "
                             "(model.input_names); "
                             + "; ".join(([f"missing {missing}"] if missing else [])
                                         + ([f"unexpected {extra}"] if extra else [])))
        x = [x[n] for n in names] if len(specs) > 1 else x[names[0]]
    if len(specs) == 1 and isinstance(x, (list, tuple)) and len(x) == 1 and hasattr(x[0], "shape") and \
            len(getattr(x[0], "shape", ())) == len(specs[0].shape):
        x = x[0]  # [x] for a model of one input
    xs = list(x) if isinstance(x, (list, tuple)) and len(specs) > 1 else [x]
    if len(xs) != len(specs):
        raise ShapeError(f"{argument}: the model has {len(specs)} inputs ({', '.join(s.name for s in specs)}), "
                         f"received {len(xs)} arrays; pass one array per input, in this order")
    out = []
    for spec, a in zip(specs, xs):
        arg = argument if len(specs) == 1 else f"{argument}[{spec.name!r}]"
        # (only large arrays; indices are checked whole)
        deferred = defer and isinstance(a, np.ndarray) and a.size > DEFERRED_VALUES and \
            not (bounds and spec.name in bounds)
        a = (_deferred(a, spec.dtype, arg) if deferred else None) or as_array(a, spec.dtype, arg)
        check_shape(a, spec.shape, arg, rows)
        if bounds and spec.name in bounds and a.size:
            low, high, what = bounds[spec.name]
            if a.min() < low or a.max() > high:
                raise ShapeError(f"{arg}: indices into {what} must lie in [{low}, {high}], received values from "
                                 f"{a.min()} to {a.max()}; the table has {high + 1} rows")
            if a.min() < 0:  # the same text each time: Python shows it once per line of the caller
                warn(f"{arg}: negative indices into {what} count from the end of its {high + 1} rows, as ONNX's "
                     "Gather and onnxruntime read them (-1 is the last row); PyTorch's Embedding refuses them, so "
                     "check for a padding id of -1")
        out.append(a)
    if rows is None and len({a.shape[0] for a in out}) > 1:
        counts = ", ".join(f"{spec.name!r} {a.shape[0]}" for spec, a in zip(specs, out))
        raise ShapeError(f"{argument}: expected the same number of rows (axis 0, the batch) in every input, received "
                         f"{counts} rows; every input is read batch first: pass each with its batch along axis 0 "
                         "(an input that is no batch, such as a recurrent layer's initial state of shape (layers, "
                         "batch, hidden) or a mixing matrix, belongs in the model as a constant, or is transposed to "
                         "batch first before export)")
    sizes = getattr(bounds, "sizes", None)
    if sizes is not None:
        sizes({spec.name: a.shape for spec, a in zip(specs, out)}, argument)
    return out


def prepare_labels(spec, y, argument: str = "y", rows: int | None = None,
                   n_classes: int | None = None, rows_of: str | None = None, check_classes: bool = True,
                   one_hot: bool = False, probabilities: bool = False) -> np.ndarray:
    """Labels for the loss's label input ``spec``, cast, shaped and checked.

    As Keras does, ``(n, 1)`` integer labels stand for ``(n,)`` class indices and ``(n,)``
    targets for an output of shape ``(n, 1)``. Integer labels are class indices (sparse
    cross-entropy): every one must lie in ``[0, n_classes - 1]``, or be >= 0 where the number
    of classes is free; the graph's GatherElements would wrap a negative index into a wrong
    loss and fail on a large one only inside onnxruntime. ``check_classes=False``: the labels
    were checked already (a batch of arrays checked whole). ``one_hot``: the loss takes one-hot
    rows (categorical cross-entropy), so class indices given instead are named as such.
    ``probabilities``: the labels are probabilities (binary cross-entropy), which must lie in
    ``[0, 1]``: beyond, the loss has no least value and training drives it to minus infinity.
    """
    try:
        a = as_array(y, spec.dtype, argument)
        shape = tuple(spec.shape)
        if spec.dtype.kind in "iu" and a.ndim == len(shape) + 1 and a.shape[-1] == 1:
            a = a.reshape(a.shape[:-1])
        elif len(shape) >= 2 and shape[-1] == 1 and a.ndim == len(shape) - 1:
            a = a.reshape(a.shape + (1,))
        check_shape(a, shape, argument, rows, rows_of)
    except ShapeError as exc:
        several = list(y.values()) if isinstance(y, dict) else y
        if isinstance(several, (list, tuple)) and len(several) > 1 and \
                all(isinstance(v, np.ndarray) for v in several):
            raise ShapeError(f"{argument}: expected one label array, for the model's first output (the loss is "
                             f"computed on it alone), received a {type(y).__name__} of {len(several)} arrays; give "
                             "the first output's labels") from None
        if spec.dtype.kind in "iu" and len(spec.shape) == 3:  # the losses read classes on the last axis
            raise ShapeError(f"{exc}. For a class per pixel of a (batch, channels, height, width) prediction, "
                             "put the classes last with ot.layers.Permute((2, 3, 1)) and give labels (batch, "
                             "height, width)") from None
        try:
            given = None if isinstance(y, dict) else read_array(y, argument)
        except ShapeError:
            given = None
        said = str(exc).split("; reshape ")[0]  # the fix below, not the generic one
        if given is not None and given.ndim >= 1 and (rows is None or given.shape[0] == rows):
            hint = label_hint(said, argument, given, spec, n_classes, one_hot)
            if hint is not None:
                raise ShapeError(hint) from None
        raise
    if not check_classes or not a.size:
        return a
    if n_classes is not None:
        low, high = a.min(), a.max()
        if low < 0 or high >= n_classes:
            raise ShapeError(f"{argument}: class labels must lie in [0, {n_classes - 1}] (the output has {n_classes} "
                             f"classes), received values from {low} to {high}; number the classes from 0 or give "
                             "the output one unit per class")
    elif spec.dtype.kind in "iu" and a.min() < 0:  # class indices, the number of classes free
        raise ShapeError(f"{argument}: class labels must be >= 0, received values from {a.min()} to {a.max()}; "
                         "number the classes from 0")
    elif probabilities:
        outside = (a < 0) | (a > 1)  # (a NaN is neither: training refuses it with the other non-finite values)
        if outside.any():
            beyond = a[outside]
            raise ShapeError(f"{argument}: binary cross-entropy takes labels in [0, 1] (a class, 0 or 1, or a "
                             f"probability), received {beyond.size} outside it, from {float(beyond.min()):.9g} to "
                             f"{float(beyond.max()):.9g}; give labels in [0, 1] (y = (y == positive) for classes "
                             "named otherwise), or another loss for other targets")
    return a


def sample_weight_shape(pred_shape) -> tuple:
    """The shape of the loss-weight input of one weight per sample, for a prediction of
    ``pred_shape``: ``(batch,)``, ``(batch, 1)``, and for a prediction with positions between the
    batch and the last axis (time steps, pixels) ``(batch, None, ..., 1)``, which takes one weight
    per sample or one per position (a padding mask)."""
    rank = len(pred_shape)
    batch = pred_shape[0] if rank else None
    if rank < 3:
        return (batch,) + (1,) * (rank - 1)
    return (batch,) + (None,) * (rank - 2) + (1,)


def label_positions(labels: np.ndarray, weight_shape) -> tuple:
    """The positions of checked ``labels`` that per-position weights of ``weight_shape`` match:
    the labels' dimensions between the batch and the prediction's last axis."""
    return tuple(labels.shape[1:len(weight_shape) - 1])


def _takes_positions(shape) -> bool:
    return len(shape) >= 3 and shape[-1] == 1 and all(d is None or d == 1 for d in shape[1:-1]) \
        and any(d is None for d in shape[1:-1])


def prepare_sample_weight(w, shape, argument: str = "sample_weight", rows: int | None = None,
                          positions: tuple | None = None) -> np.ndarray:
    """Loss weights for a weight input of ``shape`` (batch first, ``None`` free), cast and checked.

    A weight input of shape ``(batch, 1, ...)`` holds one weight per sample and also takes
    ``(rows,)``. One of shape ``(batch, None, ..., 1)`` (see :func:`sample_weight_shape`) takes
    that (``(rows,)``, ``(rows, 1)``, ...) or one weight per position, ``(rows, *positions)`` or
    ``(rows, *positions, 1)``, where ``positions`` are the labels' dimensions between the batch
    and the last axis of the prediction. Any other shape holds one weight per output element and
    must match.
    """
    a = as_array(w, np.float32, argument)
    received = a.shape
    want = (rows,) + tuple(shape[1:])
    if _takes_positions(shape):
        return _sample_or_position_weights(a, want, argument, positions)
    per_sample = all(d == 1 for d in shape[1:])
    if per_sample and a.ndim == 1 and len(want) > 1:
        a = a.reshape(a.shape + (1,) * (len(want) - 1))
    elif per_sample and len(want) == 1 and a.ndim == 2 and a.shape[1] == 1:
        a = a.reshape(a.shape[:1])  # a prediction of shape (batch,) takes (rows, 1) too
    if a.ndim != len(want) or any(e is not None and e != n for e, n in zip(want, a.shape)):
        accepted = describe_shape(want)
        if per_sample and len(want) > 1:
            accepted = f"{describe_shape(want[:1])} or {accepted}"
        elif per_sample:
            accepted = f"{accepted} or {describe_shape(want + (1,))}"
        what = "one weight per sample" if per_sample else "one weight per output element"
        hint = ""
        if per_sample and len(want) == 2 and len(received) == 2 and received[1] > 1:
            hint = ("; for one weight per output unit (a mask over a (batch, time) output) give the model an "
                    "output of shape (batch, time, 1), which takes one weight per position, or for mean squared "
                    "error use loss_mask=<outputs>")
        if isinstance(w, (list, tuple)) and len(w) > 1 and \
                all(isinstance(v, np.ndarray) and v.ndim >= 1 and (rows is None or len(v) == rows) for v in w):
            hint += ("; if the list holds one array per output (Keras' form for several outputs), give the first "
                     "output's alone: ortrain trains that output only")
        raise ShapeError(f"{argument}: expected shape {accepted} ({what}), received "
                         f"{describe_shape(received)}{hint}")
    return a


def _sample_or_position_weights(a: np.ndarray, want: tuple, argument: str, positions) -> np.ndarray:
    """Weights of rank ``len(want)``: one per sample (all middle dimensions 1) or one per position
    (the middle dimensions are ``positions``), from any of the accepted forms."""
    rank, rows, received = len(want), want[0], a.shape
    mids = tuple(positions) if positions is not None else (None,) * (rank - 2)
    if 1 <= a.ndim <= rank and all(d == 1 for d in a.shape[1:]):  # (rows,), (rows, 1), ...: per sample
        a = a.reshape(a.shape[:1] + (1,) * (rank - 1))
    elif a.ndim == rank - 1:
        a = a.reshape(a.shape + (1,))
    ok = a.ndim == rank and (rows is None or a.shape[0] == rows) and a.shape[-1] == 1 and (
        a.shape[1:-1] == (1,) * (rank - 2)
        or all(m is None or m == n for m, n in zip(mids, a.shape[1:-1])))
    if not ok:
        ones = (rows, 1)
        per_position = (rows,) + mids
        raise ShapeError(f"{argument}: expected shape {describe_shape(want[:1])} or {describe_shape(ones)} (one "
                         f"weight per sample), or {describe_shape(per_position)} or "
                         f"{describe_shape(per_position + (1,))} (one weight per position, as the labels "
                         f"hold them), received {describe_shape(received)}")
    return a


# -- running in chunks -----------------------------------------------------------------------------
def row_slices(n: int, batch_size, argument: str = "batch_size") -> list[slice]:
    """Slices of at most ``batch_size`` rows covering ``n`` rows (all at once for ``None``).

    Zero rows still give one empty slice, so a graph runs once and reports its output shapes.
    """
    step = positive_int(batch_size, argument, allow_none=True) or max(n, 1)
    return [slice(start, start + step) for start in range(0, max(n, 1), step)]


def fixed_batch(specs) -> int | None:
    """The rows every input of a graph takes when its graph fixes them (an export without a
    dynamic batch axis), else None."""
    firsts = {s.shape[0] if s.shape else None for s in specs}
    first = firsts.pop() if len(firsts) == 1 else None
    return first if isinstance(first, int) else None


def rows_free(specs) -> list:
    """``specs`` with their batch free: the specs of whole arrays, which calls then cut into batches
    (of the graph's fixed batch, where it has one)."""
    return [dataclasses.replace(s, shape=(None, *s.shape[1:])) if s.shape and s.shape[0] is not None else s
            for s in specs]


def check_fixed_rows(specs, n: int, argument: str, batch_size, split: bool = False) -> int | None:
    """For a graph with a fixed batch, ``batch_size`` must be it (or None) and ``n`` rows a multiple
    of it, since each run takes exactly that many: returns the batch (None for a free batch).
    ``split``: the rows are a part ``validation_split`` made."""
    batch = fixed_batch(specs)
    if batch is None:
        return None
    fix = "or re-export the model with a dynamic batch axis"
    if batch_size is not None and batch_size != batch:
        raise ShapeError(f"batch_size: the model's graph fixes its batch at {batch} rows (an export without a "
                         f"dynamic batch axis), received batch_size={batch_size}; leave batch_size out (it "
                         f"takes {batch}), {fix}")
    if n % batch:
        drop = (f"choose a validation_split that leaves multiples of {batch} rows on both sides" if split else
                f"give at least {batch} rows" if n < batch else
                f"drop the last {n % batch} rows"
                + (f" ({argument}[:{n - n % batch}])" if argument.isidentifier() else ""))
        raise ShapeError(f"{argument}: holds {n} rows, not a multiple of the {batch} rows the model's graph "
                         f"fixes for every batch (an export without a dynamic batch axis): the last batch "
                         f"would hold {n % batch}; {drop}, {fix}")
    return batch


def run_chunks(runner, specs, xs: list[np.ndarray], extra_feeds: dict | None, batch_size) -> list[np.ndarray]:
    """Every output of ``runner`` over the rows of ``xs``, ``batch_size`` rows per run, joined.

    ``extra_feeds`` (weights kept outside the graph) go to every run whole. Outputs are joined on
    their first axis, so with more than one run every output must have the batch as its first axis;
    one that has not (a transpose, a reduction over the batch) is refused rather than joined wrong.
    A graph whose ``specs`` fix the batch runs that many rows at a time (``batch_size`` aside), the
    last run padded with copies of its last row, whose outputs are dropped.
    """
    batch = fixed_batch(specs)
    if xs and xs[0].shape[0] == 0:
        # onnxruntime's recurrent kernels abort the process on an empty batch: one row of zeros (or
        # the fixed batch) runs instead, and the outputs keep none of its rows
        rows = batch or 1
        dummy = [np.zeros((rows, *a.shape[1:]), a.dtype) for a in xs]
        feeds = {s.name: a for s, a in zip(specs, dummy)}
        feeds.update(extra_feeds or {})
        return [o[:0] if o.ndim and o.shape[0] == rows else o for o in runner.run(feeds)]
    if batch is not None:
        return _run_fixed(runner, specs, xs, extra_feeds, batch)
    n = xs[0].shape[0]
    slices = row_slices(n, batch_size)
    if len(slices) == 1:  # all rows in one run: data read by rows (RowCast) is cast once, here
        xs = [a[:] if isinstance(a, RowCast) else a for a in xs]
    later, seen = [], {}  # outputs with a free axis after the first: (shape, rows) of a run of each
    if len(slices) > 1:
        data = [s.name for s in specs]
        for name, shape in runner.inputs_without_batch(data).items():
            raise OrtrainError(
                f"batch_size: expected every input to have the batch as its first axis, to cut chunks of "
                f"{batch_size} rows, but input {name!r} has none (the graph declares its shape {shape}, where "
                f"another input's first axis is free); fix: make {name!r} a constant of the model (an "
                f"initializer), or pass batch_size=None with as many rows in every input")
        for name, shape in runner.declared_without_batch(data).items():
            raise _batchless(name, f"the graph declares its shape {shape}", batch_size)
        rows = {len(range(n)[sl]) for sl in slices}
        told = getattr(runner, "rows_told", set())
        unnamed, later = runner.batch_unnamed(data), [n for n in runner.later_axes_free() if n not in told]
        if (unnamed or later) and len(rows) == 1:  # (a runner keeps what runs told)
            # every chunk has the same rows: an output of a fixed first size equal to them would pass
            # the check below, so one run on other rows (one fewer; two for chunks of one) tells
            # whether that axis follows the batch (and whether a free later axis does: the loop below
            # compares the chunks' sizes with it)
            other = slice(0, min(rows) - 1 if min(rows) > 1 else 2)
            feeds = {s.name: a[other] for s, a in zip(specs, xs)}
            feeds.update(extra_feeds or {})
            try:
                outs = runner.run(feeds)
            except OrtrainError as exc:  # a graph for certain row counts only: no telling
                if unnamed:
                    raise _batchless(unnamed[0], f"a run on {other.stop} rows, to tell, failed: "
                                     f"{str(exc).splitlines()[0][:160]}", batch_size) from None
                outs = None  # the later axes stay untold, as they were before this check
            for name, out in zip(runner.output_names, outs or ()):
                if name in unnamed and (out.ndim == 0 or out.shape[0] != other.stop):
                    raise _batchless(name, f"it gave shape {out.shape} for {other.stop} rows", batch_size)
            seen = {name: (out.shape, other.stop) for name, out in zip(runner.output_names, outs or ()) if name in later}
    chunks = []
    for sl in slices:
        feeds = {s.name: a[sl] for s, a in zip(specs, xs)}
        if extra_feeds:
            feeds.update(extra_feeds)
        outs = runner.run(feeds)
        rows = len(range(n)[sl])
        for name, out in zip(runner.output_names, outs):
            if len(slices) > 1 and (out.ndim == 0 or out.shape[0] != rows):
                raise _batchless(name, f"it gave shape {out.shape} for a chunk of {rows} rows", batch_size)
            if len(slices) > 1 and name in later:
                shape, before = seen.setdefault(name, (out.shape, rows))
                if shape[1:] != out.shape[1:]:
                    raise _batchless(name, f"it gave shape {shape} for {before} rows and {out.shape} for {rows}: "
                                     "an axis after the first follows the rows", batch_size)
                if before != rows:
                    told.add(name)
        chunks.append(outs)
    return _joined(chunks)


def _joined(chunks: list[list[np.ndarray]]) -> list[np.ndarray]:
    """The outputs of several runs joined on their first axis (one run's as they are)."""
    if len(chunks) == 1:
        return list(chunks[0])
    return [np.concatenate([c[i] for c in chunks]) for i in range(len(chunks[0]))]


def _run_fixed(runner, specs, xs: list[np.ndarray], extra_feeds: dict | None, batch: int) -> list[np.ndarray]:
    n = xs[0].shape[0]

    def run(part):
        feeds = {s.name: p for s, p in zip(specs, part)}
        feeds.update(extra_feeds or {})
        return runner.run(feeds)

    chunks = []
    for start in range(0, n, batch):
        part = [a[start:start + batch] for a in xs]
        rows = part[0].shape[0]
        if rows < batch:  # copies of the last row, whose outputs are dropped
            part = [np.concatenate([p, np.repeat(p[-1:], batch - rows, axis=0)]) for p in part]
        outs = run(part)
        if n != batch:
            for name, out in zip(runner.output_names, outs):
                if out.ndim == 0 or out.shape[0] != batch:
                    raise OrtrainError(f"x: {n} rows need several runs of the {batch} rows the model's graph "
                                       f"fixes, joined on the outputs' first axis, but output {name!r} has shape "
                                       f"{out.shape} for {batch} rows; give exactly {batch} rows")
            if start == 0 and batch > 1:
                _refuse_mixed_rows(run, part, outs, n, batch)
        chunks.append([o[:rows] for o in outs])
    return _joined(chunks)


def _refuse_mixed_rows(run, part: list[np.ndarray], outs: list[np.ndarray], n: int, batch: int) -> None:
    """Runs of ``batch`` rows give each row's own outputs only where the graph keeps rows apart and
    reads no row's position (a softmax or a mean over the batch mixes rows; ``torch.arange(n)``
    numbers them). Two more runs tell: one with the last row changed, where no other row's outputs
    may move, and one of copies of the first row, whose outputs must all be alike."""
    changed = []
    for p in part:
        q = p.copy()
        q[-1] = 1 if not np.any(q[-1] == 1) else 0
        changed.append(q)
    again = run(changed)
    mixed = any(not np.array_equal(a[:-1], b[:-1], equal_nan=a.dtype.kind == "f") for a, b in zip(outs, again))
    if not mixed:
        alike = run([np.repeat(p[:1], batch, axis=0) for p in part])
        mixed = any(not np.array_equal(a, np.repeat(a[:1], batch, axis=0), equal_nan=a.dtype.kind == "f")
                    for a in alike)
    if mixed:
        raise OrtrainError(f"x: the model's graph fixes its batch at {batch} rows and mixes the rows of a batch or "
                           f"reads their positions (a softmax or a mean over the batch axis, torch.arange over the "
                           f"rows): run on {n} rows, in batches of {batch} and the last padded, its outputs would "
                           f"depend on how the rows are cut; give exactly {batch} rows, or re-export the model "
                           f"with a dynamic batch axis")


def _batchless(name: str, seen: str, batch_size) -> OrtrainError:
    return OrtrainError(
        f"batch_size: expected every output to have the batch as its first axis (and only there), to join "
        f"the predictions of chunks of {batch_size} rows, but output {name!r} has not ({seen}); fix: pass "
        f"batch_size=None to run all rows at once")
