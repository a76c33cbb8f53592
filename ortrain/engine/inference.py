"""Forward-only sessions: predictions, snapshots, forward captures."""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np
import onnx

from ortrain._lifetime import (
    LEFT_AT_EXIT,
    busy_at_fork,
    hold_if_left_at_exit,
    kept_in_forked_children,
    wait_at_exit,
)
from ortrain.engine import denormals
from ortrain.engine._runtime import ort
from ortrain.engine.device import Device, parse_device, session_options
from ortrain.engine.session import recurrent_reads, refuse_empty_steps, runtime_failure
from ortrain.errors import FreedError, OrtrainError


class InferenceRunner:
    """An ``InferenceSession`` over a forward graph.

    Weights may be graph inputs rather than initializers; then every :meth:`run`
    feeds them, which lets a caller keep the weights in its own arrays (a trainer's
    live views, a snapshot's private copies) without rebuilding the session.
    """

    def __init__(self, model: onnx.ModelProto | bytes | str, *, device: str | Device = "cpu",
                 threads: int | None = None):
        self.device = parse_device(device)
        providers = [self.device.provider] if self.device.kind == "cpu" else \
            [(self.device.provider, {"device_id": self.device.index}), "CPUExecutionProvider"]
        data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
        try:
            with denormals.kept():  # the runtime sets the flush on the thread that creates the first session
                self._sess = ort.InferenceSession(data, sess_options=session_options(threads), providers=providers)
        except Exception as exc:
            raise OrtrainError(f"onnxruntime could not load the forward graph: {str(exc).splitlines()[0]}") from exc
        if self.device.kind == "cpu":
            # onnxruntime's Python session keeps the model's bytes for good, to open it again on the next
            # provider should one fail: a copy of every weight a graph holds (a third of what predict and
            # evaluate kept). A session of the CPU provider alone has no provider to fall back to.
            self._sess.disable_fallback()
            self._sess._model_bytes = None
        self._running: set[int] = set()  # the threads in run(): a forked child cannot use a session busy at the fork
        kept_in_forked_children(self)
        _RUNNERS.add(self)
        self.input_names = [i.name for i in self._sess.get_inputs()]
        self.output_names = [o.name for o in self._sess.get_outputs()]
        # outputs whose free later axes runs on two row counts found not to follow the rows
        # (:func:`~ortrain._arrays.run_chunks` asks no more runs of them)
        self.rows_told: set[str] = set()
        # inputs read by recurrent layers; a serialized graph is parsed only if it may hold one
        if isinstance(model, onnx.ModelProto):
            self._stepped = sorted(recurrent_reads(model))
        elif isinstance(data, bytes) and any(op.encode() in data for op in ("LSTM", "GRU", "RNN")):
            self._stepped = sorted(recurrent_reads(onnx.load_from_string(data)))
        else:
            self._stepped = []

    def declared_without_batch(self, data_inputs: list[str]) -> dict[str, tuple]:
        """Outputs whose declared shape says the batch is not their first axis alone, by name, with
        that shape: a scalar, or the batch's name on a later axis (a transpose; a (batch, batch)
        similarity matrix, whose chunks would be its diagonal blocks). A fixed first size alone is no
        proof (an export may leave a stale one), so the sizes a run gives are what
        :func:`~ortrain._arrays.run_chunks` checks then."""
        batch_names = {i.shape[0] for i in self._sess.get_inputs()
                       if i.name in data_inputs and isinstance(i.shape, list) and i.shape and
                       isinstance(i.shape[0], str)}
        found = {}
        for o in self._sess.get_outputs():
            shape = o.shape if isinstance(o.shape, list) else None
            if shape is not None and (not shape or batch_names & set(shape[1:])):
                found[o.name] = tuple(shape)
        return found

    def inputs_without_batch(self, data_inputs: list[str]) -> dict[str, tuple]:
        """Data inputs whose declared shape has no batch axis, by name, with that shape: a scalar, or a
        fixed first size where another data input's first axis is free (a mixing matrix, a mask).
        Chunks of rows cannot be cut from them."""
        shapes = {i.name: i.shape for i in self._sess.get_inputs()
                  if i.name in data_inputs and isinstance(i.shape, list)}
        if not any(s and not isinstance(s[0], int) for s in shapes.values()):
            return {}
        return {name: tuple(s) for name, s in shapes.items() if not s or isinstance(s[0], int)}

    def batch_unnamed(self, data_inputs: list[str]) -> list[str]:
        """Outputs whose declared first size is not named as an input's batch is: their first axis
        follows the batch only if a run says so (:func:`~ortrain._arrays.run_chunks` asks one)."""
        names = {i.shape[0] for i in self._sess.get_inputs() if i.name in data_inputs and
                 isinstance(i.shape, list) and i.shape and isinstance(i.shape[0], str)}
        return [o.name for o in self._sess.get_outputs()
                if not (isinstance(o.shape, list) and o.shape and o.shape[0] in names)]

    def later_axes_free(self) -> list[str]:
        """Outputs with an axis after the first whose size the graph leaves free (a name, or none):
        whether it follows the batch (a (batch, batch) matrix an exporter left unnamed) only runs on
        other row counts tell (:func:`~ortrain._arrays.run_chunks` compares them)."""
        return [o.name for o in self._sess.get_outputs()
                if isinstance(o.shape, list) and any(not isinstance(d, int) for d in o.shape[1:])]

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> list[np.ndarray]:
        sess = self._sess  # once: a free() from another thread may clear it meanwhile
        if sess is None:
            raise FreedError(self.__dict__.get("_why_freed") or "this inference session was freed")
        if self._stepped:
            refuse_empty_steps((name, feeds[name]) for name in self._stepped if name in feeds)
        flush = denormals.here()
        me = threading.get_ident()
        try:
            self._running.add(me)
            if LEFT_AT_EXIT:
                self._running.discard(me)
                hold_if_left_at_exit()
                self._running.add(me)
            denormals.on(flush)
            return sess.run(outputs or self.output_names, feeds)
        except Exception as exc:  # the runtime's exception types derive from RuntimeError or Exception
            raise runtime_failure(exc, "forward graph") from exc
        finally:
            self._running.discard(me)
            denormals.off(flush)

    def free(self) -> None:
        self._sess = None

    def _after_fork_in_child(self) -> None:
        import ctypes
        session = self.__dict__.get("_sess")
        if session is not None:  # (see kept_in_forked_children)
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(session))
            if self.__dict__.get("_running"):  # another thread of the parent was running it
                self._why_freed = busy_at_fork("prediction session")
                self._sess = None


_RUNNERS = weakref.WeakSet()


def _runs_at_exit(deadline: float) -> None:
    """Wait until ``deadline`` at most for the runs in flight of the threads the interpreter's exit
    left running (their next ones wait: see ortrain._lifetime.LEFT_AT_EXIT), so that none is running
    when the interpreter is torn down (its return then aborts the process: "terminate called without
    an active exception")."""
    left = set(LEFT_AT_EXIT)
    while time.monotonic() < deadline and any(left & r.__dict__.get("_running", set()) for r in list(_RUNNERS)):
        time.sleep(0.002)


wait_at_exit(_runs_at_exit)


def run_model(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The outputs of a small model on ``feeds``, by onnxruntime on the CPU, on one thread."""
    runner = InferenceRunner(model, threads=1)
    try:
        return runner.run(feeds)
    finally:
        runner.free()
