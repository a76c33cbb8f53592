"""A traced function called with arrays: argument binding, per-call input checks, lifetime.

Both captures share this: the first call's arrays fix every input's name, shape and
dtype; later calls are checked against them with a few comparisons per input (no
dict building, no casting when the arrays already match), and a mismatch raises
``ot.ShapeError`` before anything runs. :class:`Capture` is the forward-only one.
"""

from __future__ import annotations

import contextlib
import inspect

import numpy as np

from ortrain import engine
from ortrain._arrays import as_array, read_array
from ortrain._lifetime import Releasable
from ortrain.ag import tensor
from ortrain.ag.tensor import RECORDING_DEPTH, Param
from ortrain.ag.tracer import example_inputs, trace
from ortrain.errors import FreedError, OrtrainError, ShapeError, describe_shape
from ortrain.graph.forward import to_inference

__all__ = ["Capture", "TracedCall"]


def _extra_params(params, where: str) -> list[Param]:
    if params is None:
        return []
    if not isinstance(params, Param) and (not hasattr(params, "__iter__") or isinstance(params, (str, bytes, dict))):
        raise OrtrainError(f"{where}: params expected None or a list of ag.param / ag.buffer objects (the ones "
                           f"fn reads that must not train), received {params!r:.60}")
    items = [params] if isinstance(params, Param) else list(params)
    bad = [p for p in items if not isinstance(p, Param)]
    if bad:
        raise OrtrainError(f"{where}: params expected ag.param / ag.buffer objects, received {bad[0]!r}")
    return items


def _mend(sources: str) -> str:
    if "buffer" in sources:
        return "Write values in range into the buffer, or mend the arithmetic that computes the indices"
    return "Pass inputs that keep the computed indices in range, or mend the arithmetic"


class TracedCall(Releasable):
    """Base of the captures: binds arguments, checks inputs, tracks ``free``."""

    _where = "capture"
    _instead = "capture the function again; params and opt.state() carry the values and moments"

    def __init__(self, fn, params):
        if not callable(fn):
            raise OrtrainError(f"{self._where}: fn expected a callable, received {type(fn).__name__}")
        self._fn = fn
        self._extra = _extra_params(params, self._where)
        try:
            sig = inspect.signature(fn).parameters.values()
            self._positional = [p.name for p in sig if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        except (TypeError, ValueError):
            self._positional = []
        self._specs = None
        self._freed = False

    def _bind(self, args, kwargs) -> dict:
        if len(args) > len(self._positional):
            raise OrtrainError(f"{self._where}: {len(args)} positional inputs given, fn names "
                               f"{len(self._positional)}; pass the inputs by name")
        bound = dict(zip(self._positional, args, strict=False))
        twice = sorted(set(bound) & set(kwargs))
        if twice:
            raise OrtrainError(f"{self._where}: input {twice[0]!r} given twice")
        bound.update(kwargs)
        return bound

    def _set_specs(self, traced, order) -> None:
        """``order``: the names of the graph's data inputs in the order the runtime takes them."""
        slot = {n: i for i, n in enumerate(order)}
        self._specs = tuple((s.name, s.shape, s.dtype, slot.get(s.name, -1)) for s in traced.inputs)
        self._feeds = [None] * len(order)
        self._checks = tuple((slot[name], name, rows, op) for name, rows, op in traced.index_checks)
        self._ranges = traced.range_checks

    def _arrive(self, args, kwargs, built: bool) -> list:
        """What every call does first: refuse after free, bind positional arrays to names, trace on
        the first call, and check the arrays against the traced inputs."""
        if self._freed:
            self._live()
        if RECORDING_DEPTH[0]:  # held by this thread's recording (recordings hold the turns this call holds)
            raise OrtrainError(f"{self._where} called while this thread records another capture's fn: called inside "
                               "that fn, it would run once, as fn is recorded, not at each of its calls (a step's "
                               "update, once); call it outside fn, before or after the other capture's call (from a "
                               "signal handler, after the recording: the first call of the other capture)")
        if args:
            kwargs = self._bind(args, kwargs)
        if not built:
            self._build(kwargs)
        return self._prepare(kwargs)

    def _prepare(self, kwargs) -> list:
        """The feeds in graph order; raises ShapeError (changing nothing) on a bad input."""
        feeds = self._feeds
        if len(kwargs) != len(self._specs):
            self._missing(kwargs)
        for name, shape, dtype, slot in self._specs:
            try:
                a = kwargs[name]
            except KeyError:
                self._missing(kwargs)
            if a.__class__ is not np.ndarray or a.dtype is not dtype or a.shape != shape:
                a = self._convert(name, a, shape, dtype)
            if slot >= 0:
                feeds[slot] = a
        for slot, name, rows, op in self._checks:
            a = feeds[slot]
            if a.size and (a.min() < 0 or a.max() >= rows):
                raise ShapeError(f"{self._where}: input {name!r} holds indices for {op} into {rows} entries; its "
                                 f"values must lie in [0, {rows - 1}], received values from {a.min()} to {a.max()}")
        return feeds

    def _check_ranges(self, ends) -> None:
        """Refuse indices computed inside fn that fall outside their table; ``ends`` holds the
        graph's [min, max] of each, as :func:`trace` added them. Runs before anything moves."""
        for (low, high), (rows, op, sources) in zip(ends, self._ranges, strict=True):
            if low <= high and (low < 0 or high >= rows):
                what = "class labels" if op != "get_rows" else "row indices"
                raise ShapeError(f"{self._where}: the {what} for {op} ({sources}) must lie in [0, {rows - 1}], "
                                 f"received values from {low} to {high}; nothing was updated. {_mend(sources)}")

    def _missing(self, kwargs):
        want = [s[0] for s in self._specs]
        missing = [n for n in want if n not in kwargs]
        extra = [n for n in kwargs if n not in want]
        raise ShapeError(f"{self._where}: the first call fixed the inputs ({', '.join(want)}); "
                         + (f"missing {', '.join(map(repr, missing))}" if missing else "")
                         + ("; " if missing and extra else "")
                         + (f"unexpected {', '.join(map(repr, extra))}" if extra else "")
                         + "; pass the same inputs by name at every call, or capture another step for others")

    def _convert(self, name, a, shape, dtype):
        typed = hasattr(a, "dtype")  # an array's dtype is the caller's choice; a list's is Python's
        a = read_array(a, f"{self._where}: input {name!r}")
        if a.dtype.kind == "b":  # as the first call refuses it: a boolean mask is no row index
            raise ShapeError(f"{self._where}: input {name!r} is boolean; pass 0/1 as float32 or int64")
        if typed and a.dtype.kind in "iuf" and (a.dtype.kind == "f") != (dtype.kind == "f"):
            # float64 for float32 and int32 for int64 are cast, as everywhere; floats for indices or
            # labels, or integers for values, are another input than the one traced
            fixed = "integer indices or labels (int64)" if dtype.kind in "iu" else "float32 values"
            raise ShapeError(f"{self._where}: input {name!r} expected {fixed}, as the first call fixed it, "
                             f"received {a.dtype}; pass {'int64' if dtype.kind in 'iu' else 'float32'} arrays, "
                             "or capture another step for the other dtype")
        a = as_array(a, dtype, f"{self._where}: input {name!r}")
        if a.shape != shape:
            hint = ""
            if len(a.shape) == len(shape) and a.shape[1:] == shape[1:]:
                hint = (f"; pad the batch to {shape[0]} rows (and mask the padding out of the loss) or capture "
                        "another step for the new shape")
            raise ShapeError(f"{self._where}: input {name!r} expected shape {describe_shape(shape)} (fixed by the "
                             f"first call), received {describe_shape(a.shape)}{hint or '; pad or reshape it'}")
        return a

    def _live(self):
        if self._freed:
            raise FreedError(f"this {self._where} was freed; capture the function again")

    def free(self) -> None:
        """Release the session; later calls raise ``ot.FreedError``, and freeing twice is harmless. A
        call running in another thread (a first one recording ``fn``, too) finishes first. A captured
        step's params keep their trained values, and ``opt.state()`` its moments."""
        with tensor.TURNS:
            self._free()

    def __del__(self):
        # Collected, no call can be running on it (a call holds it): no turn to wait for, which could
        # deadlock, the collector running in a thread that holds a lock a running call waits on.
        with contextlib.suppress(Exception):
            self._free()

    def _free(self) -> None:
        raise NotImplementedError

    @property
    def freed(self) -> bool:
        """Whether :meth:`free` was called."""
        return self._freed

    def _described(self, params, state: str) -> str:
        """``<Class fn params=[...] state>`` for the reprs; never raises."""
        try:
            names = ", ".join(str(getattr(p, "name", "?")) for p in params)
            fn = getattr(self.__dict__.get("_fn"), "__name__", "fn")
        except Exception:  # noqa: BLE001 - a repr never raises
            names, fn = "?", "fn"
        return f"<{type(self).__name__} {fn} params=[{names}] {'freed' if self.__dict__.get('_freed') else state}>"


class Capture(TracedCall):
    """A captured forward computation; see :func:`capture`."""

    def __init__(self, fn, params):
        super().__init__(fn, params)
        self._runner = None

    def __call__(self, *args, **kwargs):
        """Run the forward graph on the named input arrays with the params' current values."""
        # One call at a time, between captured steps, buffer writes and assigns from other threads:
        # the inputs go through buffers of this capture's own, and the params are fed as they live
        # in the sessions (a run reads all of an update or none of it)
        with tensor.TURNS:
            feeds = self._arrive(args, kwargs, self._runner is not None)
            named = self._named
            for i, name in enumerate(self._used):
                named[name] = feeds[i]
            for p in self._params:
                named[p.name] = p._current()
            try:
                outs = self._runner.run(named)
            except OrtrainError as exc:
                raise OrtrainError(str(exc)) from exc
            finally:
                named.clear()  # the caller's arrays are not kept
        if self._ranges:
            self._check_ranges(outs[len(self._keys):])
        if not self._dict:
            return outs[0]
        return dict(zip(self._keys, outs[:len(self._keys)], strict=True))

    def _build(self, kwargs) -> None:
        arrays = example_inputs(kwargs, self._where)
        traced = trace(self._fn, arrays, training=False, where=self._where)
        self._runner = engine.InferenceRunner(to_inference(traced.proto))
        self._params = list(traced.params)
        self._used = traced.used
        self._keys, self._dict = traced.keys, traced.returns_dict
        self._named = {}
        self._set_specs(traced, traced.used)

    def _free(self) -> None:
        if self.__dict__.get("_freed", True):
            return
        self._freed = True
        runner, self._runner = self.__dict__.get("_runner"), None
        if runner is not None:
            runner.free()
        self._named = {}

    def __repr__(self) -> str:
        traced = self.__dict__.get("_runner") is not None or "_params" in self.__dict__
        params = self.__dict__.get("_params", self.__dict__.get("_extra", ()))
        return self._described(params, "traced" if traced else "not yet traced")
