"""Traced tensors, parameters and buffers.

A :class:`Tensor` is a node of a computation recorded for later: it knows its
shape, dtype, the op that makes it and that op's inputs, never a value. Params
and buffers are the leaves that do hold values; while a captured step holds a
param, its value lives in that step's session and :meth:`Param.numpy` reads it
from there.
"""

from __future__ import annotations

import itertools
import os
import threading
import weakref

import numpy as np

from ortrain._arrays import as_array, checked_flag, is_integer, read_array
from ortrain._keywords import names_unknown_arguments_of, names_unknown_arguments_of_methods
from ortrain.errors import OrtrainError, ShapeError, describe_shape

__all__ = ["Buffer", "Const", "Input", "Param", "Tensor", "buffer", "param"]

FLOAT = np.dtype(np.float32)
INT = np.dtype(np.int64)


class Tensor:
    """A value in a traced computation: shape and dtype are known, the value is not.

    Ops (``ag.matmul``, ``+``, ...) on tensors build a graph; ``ot.capture_step`` and
    ``ot.capture`` turn it into ONNX and run it. Reading a value while tracing
    (``float(t)``, ``if t > 0``, ``np.asarray(t)``) is an error: return the tensor from
    ``fn`` instead.
    """

    __slots__ = ("shape", "dtype", "op", "inputs", "_emit", "__weakref__")
    # numpy must not broadcast an ndarray over a Tensor: ``array * t`` calls ``t.__rmul__``
    # (ag.ops replaces this with the ufunc dispatch that keeps it so and refuses the rest by name).
    __array_ufunc__ = None

    def __init__(self, shape: tuple, dtype, op: str, inputs: tuple = (), emit=None):
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.op = op
        self.inputs = tuple(inputs)
        self._emit = emit

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def _no_value(self, *_):
        raise OrtrainError(f"{self!r} has no value: ag ops record a graph, and values exist only when the "
                           "captured function runs. Inside fn, return the tensor (as the loss or an entry of the "
                           "returned dict) to read it; outside a capture, compute on param.numpy() with numpy")

    __bool__ = __float__ = __int__ = __index__ = __array__ = _no_value
    __iter__ = _no_value

    # identity stays the hash: tensors are keys by object, never by value (comparisons are refused below)
    __hash__ = object.__hash__

    def __getitem__(self, key):
        raise OrtrainError(f"{self!r}[{key!r}]: ag records no indexing or slicing (the tensor is not subscriptable); "
                           "take rows of a param or buffer with ag.get_rows(t, idx), change its layout with "
                           "ag.reshape, ag.transpose or ag.concat, or slice the arrays before the call and pass the "
                           "parts as inputs")

    def numpy(self) -> np.ndarray:
        self._no_value()

    def __repr__(self) -> str:
        return f"Tensor({self.op}, shape={describe_shape(self.shape)}, dtype={self.dtype.name})"


# Captured steps and captures run one after another, from whichever thread (ortrain.capture), and
# writes into params and buffers and reads of them land between those runs: all take turns on it.
TURNS = threading.RLock()


def _fresh_turns_in_child() -> None:
    """A forked child gets its own lock: a thread of the parent that held it at the fork does not
    exist in the child, which would wait for it forever (read as ``tensor.TURNS`` at each use)."""
    global TURNS
    TURNS = threading.RLock()
    RECORDING_DEPTH[0] = 0  # a recording thread of the parent does not exist in the child


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_turns_in_child)

# What the calling thread is recording (ortrain.ag.tracer.trace sets it around fn): a param's value
# read or written there happens once, at the recording, and is not part of the graph. Recordings run
# under TURNS, so a captured call that finds RECORDING_DEPTH above 0 with TURNS held is inside one.
RECORDING = threading.local()
RECORDING_DEPTH = [0]


_READS = "reads the value once, as fn is recorded, and every later call would compute with that copy"
_WRITES = "would write once, as fn is recorded, not at each call"


def _refuse_while_recording(call: str, why: str) -> None:
    where = getattr(RECORDING, "where", None)
    if where is not None:
        raise OrtrainError(f"{where}: {call} inside fn {why}: fn must not read values back or write them. Use the "
                           "param itself in ag ops (its value at each call); for a value that must not train (a "
                           "target network) use a frozen ag.param(..., trainable=False) and assign() it between "
                           "calls, or pass the array as an input")


def _refusing(op: str):
    """An operator ag does not record: Python's own (``==`` compares the objects, so ``W * (k == 0)``
    was ``W * False``) would give a wrong value without a word."""
    def refuse(*_):
        raise OrtrainError(f"{op} on an ag tensor: ag records no comparisons or integer division (Python's {op} "
                           f"would compare the objects or fail, not compute on their values); make the mask or the "
                           f"quotient from the arrays before the call and pass it as an input "
                           f"(mask=(k == 0).astype(np.float32)), or write it with ag ops")
    return refuse


for _op, _dunders in (("==", ("__eq__",)), ("!=", ("__ne__",)), ("<", ("__lt__",)), ("<=", ("__le__",)),
                      (">", ("__gt__",)), (">=", ("__ge__",)), ("//", ("__floordiv__", "__rfloordiv__")),
                      ("%", ("__mod__", "__rmod__"))):
    for _dunder in _dunders:
        setattr(Tensor, _dunder, _refusing(_op))


class Input(Tensor):
    """A named argument of a traced function; its array arrives with every call."""

    __slots__ = ("name",)

    def __init__(self, name: str, shape: tuple, dtype):
        super().__init__(shape, dtype, "input")
        self.name = name

    def __repr__(self) -> str:
        return f"Input({self.name!r}, shape={describe_shape(self.shape)}, dtype={self.dtype.name})"


class Const(Tensor):
    """A constant folded into the graph (Python numbers and numpy arrays given to ops)."""

    __slots__ = ("value",)

    def __init__(self, value: np.ndarray):
        super().__init__(value.shape, value.dtype, "const")
        self.value = value


_auto_names = itertools.count()


class Param(Tensor):
    """A weight: a leaf tensor with a value, trained by a captured step when the optimizer holds it.

    ``trainable=False`` (or listing it in ``params=`` of a capture) makes it a frozen weight.
    Its value lives in the session of the captured step that trains it while that step is
    alive; :meth:`numpy` always returns a copy of the current value.
    """

    __slots__ = ("name", "trainable", "_home", "_holder", "_users")

    def __init__(self, value: np.ndarray, name: str, trainable: bool):
        super().__init__(value.shape, value.dtype, "param")
        self.name = name
        self.trainable = trainable
        self._home = value
        self._holder = None  # the live captured step whose session holds the current value
        self._users = weakref.WeakSet()  # live captured steps with a copy of this value

    @property
    def grad(self):
        """Always ``None``: a captured step keeps gradients inside its session."""
        return None

    def _current(self) -> np.ndarray:
        """The array holding the current value (a live session view or the home array); do not keep it."""
        holder = self._holder
        return self._home if holder is None else holder._views[self.name]

    def numpy(self) -> np.ndarray:
        """A copy of the current value (the trained value while a captured step holds the param),
        read between captured steps, never during one run from another thread. Refused inside a
        captured ``fn``, where the value read would be recorded as a constant."""
        _refuse_while_recording(f"{self.name}.numpy()", _READS)
        with TURNS:
            return np.array(self._current(), copy=True)

    def assign(self, value) -> None:
        """Overwrite the whole value (e.g. copy online weights into a target network); no re-recording."""
        _refuse_while_recording(f"{self.name}.assign(value)", _WRITES)
        a = as_array(value, self.dtype, f"{self.name}.assign(value)")
        if a.shape != self.shape:
            raise ShapeError(f"{self.name}.assign(value): expected shape {describe_shape(self.shape)}, received "
                             f"{describe_shape(a.shape)}")
        self._write(..., a)

    def _write(self, index, values: np.ndarray) -> None:
        # Every session holding a copy gets the new rows, so no step reads a stale value; between
        # captured runs, so that a run in another thread reads all of a write or none of it.
        with TURNS:
            if self._holder is None:
                self._home[index] = values
            for step in list(self._users):
                view = step._views.get(self.name)
                if view is not None:
                    view[index] = values

    def __reduce__(self):
        # A copy (copy, deepcopy, pickle) is a new param of the same name holding the current value,
        # held by no captured step.
        _refuse_while_recording(f"a copy of {self.name} (copy, deepcopy or pickle)", _READS)
        with TURNS:  # the value between captured runs, as numpy() reads it
            value = np.array(self._current(), copy=True)
        return _rebuilt, (type(self), value, self.name, self.trainable)

    def _attach(self, step) -> None:
        self._users.add(step)

    def _detach(self, step) -> None:
        if self._holder is step:
            self._home = np.array(step._views[self.name], copy=True)
            self._holder = None
        self._users.discard(step)

    def __repr__(self) -> str:
        kind = type(self).__name__
        frozen = "" if self.trainable else ", trainable=False"
        return f"{kind}({self.name!r}, shape={describe_shape(self.shape)}, dtype={self.dtype.name}{frozen})"


class Buffer(Param):
    """A table kept in the session between calls (a replay buffer, a lookup table); never trained.

    Read it inside ``fn`` with ``ag.get_rows(buf, idx)``; update it with :meth:`write`, which
    writes the rows straight into every session that holds the table (no re-recording, no
    upload of the whole table).
    """

    __slots__ = ()

    def __init__(self, value: np.ndarray, name: str):
        super().__init__(value, name, trainable=False)

    @property
    def capacity(self) -> int:
        return self.shape[0]

    def write(self, rows, values) -> None:
        """Write ``values`` into ``rows``: an int (the first of ``len(values)`` consecutive rows),
        a slice, or a sequence of row indices. Bad rows or values change nothing."""
        where = f"{self.name}.write"
        _refuse_while_recording(f"{where}(rows, values)", _WRITES)
        if not self.shape:
            raise ShapeError(f"{where}: a 0-d buffer has no rows")
        a = as_array(values, self.dtype, f"{where}(values)")
        index = self._rows(rows, a, where)
        n = len(range(*index.indices(self.capacity))) if isinstance(index, slice) else len(index)
        want = (n,) + self.shape[1:]
        if a.shape != want and a.shape == self.shape[1:] and n == 1:
            a = a.reshape(want)
        if a.shape != want:
            raise ShapeError(f"{where}: values expected shape {describe_shape(want)} ({n} rows of "
                             f"{describe_shape(self.shape[1:])}), received {describe_shape(a.shape)}")
        self._write(index, a)

    def _rows(self, rows, values: np.ndarray, where: str):
        cap = self.capacity
        if isinstance(rows, slice):
            if rows.step is not None and rows.step == 0:
                raise ShapeError(f"{where}: rows: a slice step cannot be 0, received {rows!r}")
            return rows
        if is_integer(rows):
            first, n = int(rows), values.shape[0] if values.ndim == len(self.shape) else 1
            if not 0 <= first <= cap - n:
                raise ShapeError(f"{where}: rows {first}..{first + n - 1} do not fit a buffer of {cap} rows; "
                                 f"the first row must lie in [0, {cap - n}]")
            return slice(first, first + n)
        idx = read_array(rows, f"{where}(rows)")
        if idx.ndim != 1 or idx.dtype.kind not in "iu":
            raise ShapeError(f"{where}: rows expected an int, a slice or a 1-d sequence of ints, received "
                             f"{type(rows).__name__} of dtype {idx.dtype} and shape {describe_shape(idx.shape)}")
        if idx.size and (idx.min() < 0 or idx.max() >= cap):
            raise ShapeError(f"{where}: row indices must lie in [0, {cap - 1}], received values from "
                             f"{idx.min()} to {idx.max()}")
        return idx.astype(np.int64)


def _rebuilt(cls, value: np.ndarray, name: str, trainable: bool) -> Param:
    return cls(value, name) if cls is Buffer else cls(value, name, trainable)


def _value(array, argument: str, trainable: bool) -> np.ndarray:
    a = read_array(array, argument)
    if a.dtype.kind not in "fiub":
        return as_array(a, FLOAT, argument)  # refuses strings, objects, complex numbers with the reason
    if a.dtype.kind == "f":
        return np.array(as_array(a, FLOAT, argument), copy=True)
    if trainable:
        raise OrtrainError(f"{argument}: a trainable param must hold floating-point values (stored as float32), "
                           f"received dtype {a.dtype}; pass trainable=False for an integer table")
    return np.array(as_array(a, INT if a.dtype.kind != "b" else a.dtype, argument), copy=True)


def _name(name, kind: str) -> str:
    if name is None:
        return f"{kind}_{next(_auto_names)}"
    if not isinstance(name, str) or not name or name.startswith(("ag/", "output/")):
        raise OrtrainError(f"name: expected a non-empty str not starting with 'ag/' or 'output/' (reserved for "
                           f"generated names), received {name!r}")
    return name


def param(array, name: str | None = None, trainable: bool = True) -> Param:
    """A weight holding a copy of ``array`` (float values are stored as float32).

    ``name`` identifies it in ``opt.state()`` and checkpoints (a fresh ``param_N`` when omitted);
    a new capture over params of the same names continues from ``opt.load_state``.
    """
    trainable = checked_flag(trainable, "trainable")
    return Param(_value(array, "ag.param(array)", trainable), _name(name, "param"), trainable)


def buffer(array, name: str | None = None) -> Buffer:
    """A table of rows (first axis) kept in the session between calls; see :class:`Buffer`."""
    value = _value(array, "ag.buffer(array)", False)
    if value.ndim < 1:
        raise ShapeError(f"ag.buffer(array): expected at least 1 dimension (rows first), received shape "
                         f"{describe_shape(value.shape)}")
    return Buffer(value, _name(name, "buffer"))


names_unknown_arguments_of_methods(Tensor, "numpy")
names_unknown_arguments_of_methods(Param, "numpy", "assign")
names_unknown_arguments_of_methods(Buffer, "write")
param = names_unknown_arguments_of(param, label="ag.param")
buffer = names_unknown_arguments_of(buffer, label="ag.buffer")
