"""``Snapshot``: an eval-mode copy of a trainer's weights with an inference session of its own,
taken by ``Trainer.snapshot`` and moved towards the trainer by ``Trainer.update_target``."""

from __future__ import annotations

import copy

import numpy as np

from ortrain import engine
from ortrain._arrays import positive_int, prepare_inputs, rows_free, run_chunks
from ortrain._lifetime import Releasable, busy_at_fork, exclusive, new_lock
from ortrain.errors import FreedError

__all__ = ["Snapshot"]


class Snapshot(Releasable):
    """An independent, eval-mode copy of a model's weights with its own inference session.

    It shares nothing mutable with the trainer that made it, does not move when the
    trainer steps, and outlives the trainer's ``free()``.
    """

    def __init__(self, forward_bytes: bytes, params, weights: dict[str, np.ndarray], input_specs,
                 device: str, bounds: dict | None = None, threads: int | None = None):
        self._forward = forward_bytes
        self._params = list(params)
        self._weights = weights
        self._inputs = list(input_specs)
        self._bounds = bounds if bounds is not None else {}  # (an empty InputBounds may check sizes)
        self._device = device
        self._threads = threads  # the trainer's: onnxruntime's intra-op threads
        self._runner = None
        self._freed = False
        self._lock = new_lock(self)  # free() from another thread waits for a predict or an update

    def _live(self):
        if self._freed:
            raise FreedError(self.__dict__.get("_why_freed") or "this snapshot was freed; take a new one with "
                             "trainer.snapshot()")

    def _busy_at_fork(self) -> None:  # (its runner's session is kept: see kept_in_forked_children)
        self._why_freed = busy_at_fork("snapshot")
        self._freed = True

    # A copy (copy, deepcopy, pickle) holds its own weights and opens its own session when it first
    # predicts: a shallow copy sharing the weights would move with the original's update_target.
    __reduce_ex__ = object.__reduce_ex__

    def __copy__(self) -> Snapshot:
        return copy.deepcopy(self)

    @exclusive  # the weights of one moment, not some from before an update_target and some from after
    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if k != "_lock"}
        return state | {"_runner": None, "_weights": {n: a.copy() for n, a in self._weights.items()}}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({"_threads": None} | state)
        self._lock = new_lock(self)

    @exclusive
    def weight_names(self) -> list[str]:
        """The weights' names, in the model's order (that of :meth:`get_weights`)."""
        self._live()
        return [p.name for p in self._params]

    @exclusive
    def get_weights(self) -> list[np.ndarray]:
        """Copies of the weights, in the model's order (:meth:`weight_names`). Raises
        :class:`FreedError` after :meth:`free`."""
        self._live()
        return [self._weights[p.name].copy() for p in self._params]

    def predict(self, x, batch_size=None) -> np.ndarray | list[np.ndarray]:
        """Outputs for any number of rows: one array, or a list in output order for several outputs.
        Raises :class:`ShapeError` for inputs of the wrong shape, :class:`FreedError` after :meth:`free`."""
        self._live()
        positive_int(batch_size, "batch_size", allow_none=True)
        # converted before the lock is taken: an input slow to give its data (a lazy array, a
        # memory map) does not hold up another thread's update_target or free
        xs = prepare_inputs(rows_free(self._inputs), x, "x", bounds=self._bounds, defer=True)
        return self._predict(xs, batch_size)

    @exclusive
    def _predict(self, xs: list[np.ndarray], batch_size) -> np.ndarray | list[np.ndarray]:
        self._live()
        if self._runner is None:
            self._runner = engine.InferenceRunner(self._forward, device=self._device, threads=self._threads)
        outs = run_chunks(self._runner, self._inputs, xs, self._weights, batch_size)
        return outs[0] if len(outs) == 1 else outs

    @exclusive
    def _shapes(self) -> dict[str, tuple]:
        return {p.name: tuple(self._weights[p.name].shape) for p in self._params}

    @exclusive
    def _move_towards(self, read, trainable: set[str], tau: float) -> None:
        """``weight <- tau * read(name) + (1 - tau) * weight`` in place for the ``trainable`` names;
        the others (batch-norm statistics, frozen weights) are copied whole, as is all at ``tau=1``."""
        tau32 = np.float32(tau)
        moved = {}
        for p in self._params:
            current, mine = read(p.name), self._weights[p.name]
            if p.name in trainable and tau != 1.0:
                w = mine * (np.float32(1.0) - tau32)
                w += tau32 * current
            else:
                w = np.array(current, dtype=mine.dtype, copy=True)  # read may give the session's own buffer
            moved[p.name] = w
        self._weights = moved  # in one assignment: an interrupt (Ctrl-C) leaves the target all old or all new

    @exclusive
    def free(self) -> None:
        """Release the session and weights; later ``predict``/``update_target`` on it raise FreedError."""
        self._freed = True
        if self._runner is not None:
            self._runner.free()
        self._runner = None
        self._weights = {}

    @property
    def freed(self) -> bool:
        """Whether :meth:`free` was called."""
        return self._freed

    def __repr__(self) -> str:
        # no lock: a repr (a debugger's, a log line's) never waits for a predict in another thread
        state = "freed" if getattr(self, "_freed", True) else f"device={getattr(self, '_device', '?')!r}"
        return f"<Snapshot weights={len(getattr(self, '_params', ()))} {state}>"
