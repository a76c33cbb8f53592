"""The one object that holds onnxruntime-training state.

A :class:`TrainingSession` owns a ``CheckpointState`` (weights, gradients, moments),
a ``Module`` (training and eval graphs) and optionally an ``Optimizer`` (the update
graph). Everything above it — Trainer, capture_step, the fit loops — talks to
onnxruntime-training only through this class.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile

import numpy as np
import onnx

from ortrain._files import atomic_path, scratch_dir, write_advice
from ortrain._lifetime import busy_at_fork, exclusive, new_lock
from ortrain._warnings import warn
from ortrain.engine import denormals
from ortrain.engine._runtime import C, OrtValue, release_freed_memory, runtime_path
from ortrain.engine.checkpoint import (
    CHECKSUM,
    CHECKSUM_PLACEHOLDER,
    read_checkpoint,
    write_checkpoint,
    write_checksum,
)
from ortrain.engine.device import Device, parse_device, session_options
from ortrain.errors import FreedError, OrtrainError, ShapeError, UnsupportedOpError, describe_shape
from ortrain.graph import TensorSpec, spec_of
from ortrain.graph.dropout_masks import MaskSource, kernel_warning
from ortrain.graph.gradient_ops import ancestors
from ortrain.graph.passes import all_nodes, node_inputs, subgraphs


def read_input_specs(path: str | os.PathLike, names: list[str]) -> list[TensorSpec]:
    """Specs of the named graph inputs of an ONNX file (weights are not loaded)."""
    return input_specs(onnx.load(os.fspath(path), load_external_data=False), names)


def input_specs(model: onnx.ModelProto, names: list[str]) -> list[TensorSpec]:
    by_name = {vi.name: vi for vi in model.graph.input}
    return [spec_of(by_name[n]) for n in names]


_RECURRENT = ("LSTM", "GRU", "RNN", "LSTMTraining", "GRUTraining")  # the last two: training graphs'


def recurrent_reads(model: onnx.ModelProto) -> set[str]:
    """The graph inputs an ``LSTM``, ``GRU`` or ``RNN`` reads its sequence from, through any nodes
    (one inside an ``If``/``Loop``/``Scan`` body: whatever the node holding it reads)."""
    found: set[str] = set()
    for node in model.graph.node:
        if node.op_type in _RECURRENT and node.input:
            found |= ancestors(model, node.input[0])
        elif any(inner.op_type in _RECURRENT for g in subgraphs(node) for inner in all_nodes(g)):
            for name in node_inputs(node):
                found |= ancestors(model, name)
    return found & {i.name for i in model.graph.input}


def refuse_empty_steps(named) -> None:
    """``named``: ``(input name, array)`` pairs read by recurrent layers. onnxruntime's recurrent
    kernels end the process on a sequence of no steps (the GRU's) or make up values (the LSTM's)."""
    for name, a in named:
        shape = getattr(a, "shape", ())
        if 0 in shape[1:]:
            raise ShapeError(f"{name}: axis {shape.index(0, 1)} holds no elements ({describe_shape(shape)}); the "
                             f"model's recurrent layers need at least one step (onnxruntime's kernels end the "
                             f"process on an empty sequence)")


def check_feeds(specs: list[TensorSpec], arrays, where: str) -> list[np.ndarray]:
    """Validate arrays against graph input specs; symbolic dimensions must agree with each other.

    Returns the arrays as contiguous numpy arrays. Raises :class:`ShapeError` naming the input,
    the expected and the received shape or dtype. Nothing is cast here: callers cast first.
    """
    if len(arrays) != len(specs):
        raise ShapeError(f"{where}: expected {len(specs)} inputs ({', '.join(s.name for s in specs)}), "
                         f"received {len(arrays)}")
    out = []
    for spec, a in zip(specs, arrays):
        if not isinstance(a, np.ndarray):
            raise ShapeError(f"{where}: input {spec.name!r} must be a numpy array, received {type(a).__name__}")
        if a.dtype != spec.dtype:
            raise ShapeError(f"{where}: input {spec.name!r} expected dtype {np.dtype(spec.dtype).name}, "
                             f"received {a.dtype.name}")
        if a.ndim != len(spec.shape) or any(d is not None and d != n for d, n in zip(spec.shape, a.shape)):
            raise ShapeError(f"{where}: input {spec.name!r} expected shape {describe_shape(spec.shape)}, "
                             f"received {describe_shape(a.shape)}")
        out.append(np.ascontiguousarray(a))
    # Free dimensions that share a name in the graph (the batch) must share a size; the
    # graph's own symbols are lost in TensorSpec, so check the leading dimension of inputs
    # whose first dimension is free.
    batch = {a.shape[0] for s, a in zip(specs, out) if s.shape and s.shape[0] is None}
    if len(batch) > 1:
        sizes = ", ".join(f"{s.name}: {a.shape[0]}" for s, a in zip(specs, out) if s.shape and s.shape[0] is None)
        raise ShapeError(f"{where}: inputs disagree on the number of rows ({sizes}); every input of one "
                         f"step must hold the same samples")
    return out


def write_failure(exc: BaseException) -> tuple[str, str] | None:
    """Why a file could not be written and what to do, when ``exc`` says so: an ``OSError`` (a
    full disk, a size limit, no permission), or the runtime's failure to save a checkpoint, whose
    message ends with the system's reason; None for anything else."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc), write_advice(exc.errno)
    if isinstance(exc, RuntimeError):
        found = re.search(r"error:\s*(.+?)\s*errno:\s*(\d+)", _reason(exc))
        if found:
            return f"{found.group(1)} (errno {found.group(2)})", write_advice(int(found.group(2)))
    return None


def _reason(exc: Exception) -> str:
    """The runtime's message, less the C++ function it came from and any stack trace."""
    lines = []
    for line in str(exc).splitlines():
        if line.strip().startswith("Stacktrace"):
            break
        lines.append(line.strip())
    text = " ".join(line for line in lines if line)
    _, marker, reason = text.partition("[ONNXRuntimeError] : ")
    reason = reason.split(" : ", 2)[-1] if marker else text  # drop "<code> : <STATUS> : "
    return reason.strip() or type(exc).__name__


def despite_interrupts(fn, attempts: int = 5):
    """``fn()``, called again when an interrupt (Ctrl-C) stops it: for the clean-up after a step
    an interrupt already stopped, which a user pressing Ctrl-C again must not leave half done."""
    for attempt in range(attempts):
        try:
            return fn()
        except Exception:
            raise
        except BaseException:
            if attempt == attempts - 1:
                raise


def runtime_failure(exc: Exception, what: str) -> OrtrainError:
    """An :class:`OrtrainError` for a run the runtime refused (an index out of range that no check
    before the run could see, say), carrying the runtime's reason."""
    return OrtrainError(f"onnxruntime could not run the {what}: {_reason(exc)}")


_NO_KERNEL = re.compile(r"Could not find an implementation for (\w+?)Grad\(\d+\) node with name '(.*?)_Grad/")


def _open_failure(exc: Exception, device) -> OrtrainError:
    reason = _reason(exc)
    missing = _NO_KERNEL.search(reason)
    if missing:
        op, node = missing.groups()
        return UnsupportedOpError(
            f"onnxruntime-training 1.19.2 has no {device.kind.upper()} kernel for the gradient of {op} (node "
            f"{node!r}), so the model cannot train through it on this device. Freeze its weights and those before it "
            f"(ot.from_onnx(..., frozen=[...])) or replace the op")
    return OrtrainError(f"onnxruntime-training could not open the artifacts: {reason}")


@contextlib.contextmanager
def dropout_advanced(training_path, draws: int):
    """The training graph at ``training_path`` as a session that has run ``draws`` steps would
    draw dropout masks: a path to open it from.

    onnxruntime-training's CPU ``Dropout`` with a ``seed`` attribute draws its k-th mask (counted
    from 0 in a session) from ``seed + k``; a new session starts again at ``seed``. So a session
    that continues ``draws`` earlier steps opens a copy whose seeds are ``seed + draws``, and
    draws exactly the masks the earlier session would have drawn next. A graph without seeded
    dropout (or ``draws == 0``) is opened as it is.
    """
    if draws <= 0:
        yield training_path
        return
    model = onnx.load(os.fspath(training_path))
    seeded = [a for node in _all_nodes(model.graph) if node.op_type == "Dropout"
              for a in node.attribute if a.name == "seed"]
    if not seeded:
        yield training_path
        return
    for a in seeded:  # onnxruntime's counter is an int64, which wraps around
        a.i = (a.i + draws + 2**63) % 2**64 - 2**63
    with scratch_dir() as tmp:
        path = os.path.join(tmp, "training.onnx")
        onnx.save(model, path)
        yield path


def _all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for a in node.attribute:
            for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                yield from _all_nodes(g)


# The update graphs' kernels (AdamWOptimizer, SGDOptimizerV2, SequenceMap's weight decay) run on
# the calling thread alone: each update took the same time on 1 thread as on 2 (Adam over 670k
# weights 1.0 ms, SGD 0.25, SGD with decay 1.3, with momentum 0.93). A pool there only spins: its
# new thread took a core from the training graph's for tens of milliseconds after every opening
# (a fit's first epoch of a 784-256-10 MLP 37 -> 32.5 ms, its second 32.5 -> 27 ms on 2 cores).
UPDATE_THREADS = 1


class TrainingSession:
    """Training graph, eval graph, optional optimizer graph and their shared state.

    Gradients accumulate across :meth:`train_step` calls until :meth:`zero_grad`
    (the next train step then overwrites them). :meth:`optimizer_step` applies the
    update graph to the accumulated gradients.
    """

    def __init__(self, training_path, eval_path, checkpoint_path, optimizer_path=None, *,
                 device: str | Device = "cpu", threads: int | None = None, draws: int = 0):
        """``draws``: how many training steps ran before (in earlier sessions), so that seeded
        dropout goes on with the masks it would have drawn next: the masks ortrain draws are a
        function of the step count (:mod:`ortrain.graph.dropout_masks`); a ``Dropout`` left to
        the runtime's kernel opens with advanced seeds (:func:`dropout_advanced`)."""
        if eval_path is None:
            # The library aborts the process when eval mode runs without an eval graph.
            raise OrtrainError("a training session needs an eval graph; rebuild the artifacts")
        # the runtime's module, optimizer and state point into one another: a free() from another
        # thread in the middle of a call would pull memory from under it (see exclusive)
        self._lock = new_lock(self)
        self.device = parse_device(device)
        so = session_options(threads)
        dev = self.device.ort_device()
        with denormals.kept():  # the runtime sets the flush on the thread that creates the first session
            self._open(checkpoint_path, training_path, eval_path, optimizer_path, draws, dev, so)
        # Training steps run, counting those of earlier sessions: each draws one mask per dropout.
        self.draws = int(draws)
        training = onnx.load(os.fspath(training_path), load_external_data=False)
        masks = MaskSource(training, list(self._module.input_names(True)))
        if masks.kept:
            warn(kernel_warning(masks.kept))
        self.train_inputs = input_specs(training, masks.data_names)
        stepped = recurrent_reads(training)
        self._stepped = [(i, s.name) for i, s in enumerate(self.train_inputs) if s.name in stepped]
        self._masks = masks if masks else None  # ortrain draws the dropout masks (graph.dropout_masks)
        # a step that ran used up its kernel-drawn masks: the count follows the kernel even for a step
        # not counted (a dropped step draws ortrain's masks again, see undraw)
        self._kernel_dropout = bool(masks.kept)
        self.eval_inputs = read_input_specs(eval_path, list(self._module.input_names(False)))
        self._eval_stepped = [(i, s.name) for i, s in enumerate(self.eval_inputs) if s.name in stepped]
        self.train_outputs = list(self._module.output_names(True))
        self.eval_outputs = list(self._module.output_names(False))
        self.param_names = list(self._state.parameter_names())
        self.trainable_names = [n for n in self.param_names if self._state.get_parameter(n).requires_grad]
        self._views: dict[str, np.ndarray] = {}
        self._lr: float | None = None
        self._bound = None
        self._freed = False
        # Counts the calls that may change parameter values (train steps move batch-norm
        # statistics), so a copy of the weights can tell whether it is still current.
        self.writes = 0

    # -- lifetime ---------------------------------------------------------------------
    def _live(self):
        if self._freed:
            raise FreedError(self.__dict__.get("_why_freed") or "this training session was freed")

    def _busy_at_fork(self) -> None:
        # (its runtime objects were kept by _after_fork_in_child: never destroyed in the child)
        self._why_freed = busy_at_fork("training session")
        self._freed = True

    def _after_fork_in_child(self) -> None:
        """onnxruntime-training's module crashes a forked child that destroys it (by ``free``, by
        garbage collection, or at exit): the child's copies of the runtime's objects get one
        reference more, so none is ever destroyed; the child can still step them, and the
        system takes its memory back when it ends."""
        import ctypes
        # a session another thread of the parent was opening at the fork has only some of them
        for obj in (self.__dict__.get("_module"), self.__dict__.get("_optimizer"), self.__dict__.get("_state")):
            if obj is not None:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))

    @exclusive
    def free(self) -> None:
        """Release the graphs and state; safe to call twice."""
        self._freed = True
        self._views.clear()
        self._bound = None
        self._optimizer = self._module = self._state = None
        release_freed_memory()

    @property
    def freed(self) -> bool:
        return self._freed

    def _open(self, checkpoint_path, training_path, eval_path, optimizer_path, draws, dev, so) -> None:
        try:
            self._state = C.load_checkpoint(runtime_path(checkpoint_path, "checkpoint"))
        except (RuntimeError, IndexError, KeyError, ValueError) as exc:  # a changed byte: any of these
            raise OrtrainError(f"checkpoint {os.fspath(checkpoint_path)!r} cannot be read: {_reason(exc).rstrip('.')}; it is "
                               "damaged (cut short or changed after it was written): use another checkpoint or a "
                               "copy of this one") from exc
        try:
            with dropout_advanced(training_path, draws) as advanced:
                self._module = C.Module(runtime_path(advanced, "training graph"), self._state,
                                        runtime_path(eval_path, "eval graph"), dev, so)
            self._optimizer = (C.Optimizer(runtime_path(optimizer_path, "optimizer graph"), self._state, dev,
                                           session_options(UPDATE_THREADS))
                               if optimizer_path is not None else None)
        except RuntimeError as exc:
            raise _open_failure(exc, self.device) from exc
        except (IndexError, KeyError) as exc:  # a weight the graphs name is not in the checkpoint's table
            raise OrtrainError(f"checkpoint {os.fspath(checkpoint_path)!r} does not hold the weights the training "
                               f"graphs name ({_reason(exc)}): it is damaged, or belongs to other artifacts; use "
                               "another checkpoint or a copy of this one") from exc

    # -- steps ------------------------------------------------------------------------
    # Each step method has a form that takes the lock and one that does not (``_train_step``...):
    def undraw(self, draws: int) -> None:
        """Put the mask count back to ``draws`` after a step that is not counted (dropped or
        refused), so the next one draws that step's masks again; not where onnxruntime's kernel
        draws masks, whose generator the step has advanced."""
        if not self._kernel_dropout:
            self.draws = draws

    # a caller making several calls for one step takes the lock once around them (``with
    # session._lock``), which saves a microsecond or two a step.
    def _train_step(self, feeds, check: bool = True):
        """Forward and backward; gradients are added to the accumulation buffers. Returns raw fetches."""
        self._live()
        if check:
            feeds = check_feeds(self.train_inputs, feeds, "train step")
        if self._stepped:
            refuse_empty_steps((name, feeds[i]) for i, name in self._stepped)
        fetches = C.OrtValueVector()
        self.writes += 1
        if self._masks is not None:
            feeds = self._masks.feeds(feeds, self.draws)
        try:
            self._module.train_step(feeds, fetches)
        except Exception as exc:  # the runtime's exception types derive from RuntimeError or Exception
            raise runtime_failure(exc, "training step") from exc
        except BaseException:  # an interrupt, raised once the step has run
            self.draws += 1
            raise
        self.draws += 1
        return fetches

    train_step = exclusive(denormals.flushing(_train_step))

    @exclusive
    def bind_train_outputs(self, arrays: list[np.ndarray]) -> None:
        """Have :meth:`train_step_into` write the outputs into ``arrays`` (contiguous, exactly the
        outputs' shapes and dtypes; the caller keeps them): no fetch is allocated per step."""
        self._live()
        if len(arrays) != len(self.train_outputs) or not all(a.flags.c_contiguous for a in arrays):
            raise OrtrainError(f"bind_train_outputs: expected {len(self.train_outputs)} contiguous arrays, one per "
                               f"output ({', '.join(self.train_outputs)})")
        vec = C.OrtValueVector()
        for a in arrays:
            vec.push_back(OrtValue.ortvalue_from_numpy(a)._ortvalue)
        self._bound = [vec, list(arrays), True]

    def _train_step_into(self, feeds) -> None:
        """A train step (no input checks) writing its outputs into the arrays of :meth:`bind_train_outputs`."""
        if self._freed:
            self._live()
        if self._stepped:
            refuse_empty_steps((name, feeds[i]) for i, name in self._stepped)
        vec, arrays, unconfirmed = self._bound
        self.writes += 1
        if self._masks is not None:
            feeds = self._masks.feeds(feeds, self.draws)
        try:
            self._module.train_step(feeds, vec)
        except Exception as exc:  # the runtime's exception types derive from RuntimeError or Exception
            raise runtime_failure(exc, "training step") from exc
        except BaseException:  # an interrupt, raised once the step has run
            self.draws += 1
            raise
        self.draws += 1
        if unconfirmed:
            # The runtime writes into caller-allocated outputs whose shapes match; until a step shows
            # that it did, copy from whatever buffers it handed back.
            if all(vec[i].data_ptr() == a.ctypes.data for i, a in enumerate(arrays)):
                self._bound[2] = False
            else:
                for i, a in enumerate(arrays):
                    a[...] = vec[i].numpy()

    train_step_into = exclusive(denormals.flushing(_train_step_into))

    @exclusive
    @denormals.flushing
    def eval_step(self, feeds, check: bool = True):
        """Forward with the loss, without backward and without dropout."""
        self._live()
        if check:
            feeds = check_feeds(self.eval_inputs, feeds, "eval step")
        if self._eval_stepped:
            refuse_empty_steps((name, feeds[i]) for i, name in self._eval_stepped)
        fetches = C.OrtValueVector()
        try:
            self._module.eval_step(feeds, fetches)
        except Exception as exc:  # the runtime's exception types derive from RuntimeError or Exception
            raise runtime_failure(exc, "evaluation step") from exc
        return fetches

    def _optimizer_step(self) -> None:
        self._live()
        if self._optimizer is None:
            raise OrtrainError("this session was opened without an optimizer graph")
        self.writes += 1
        try:
            self._optimizer.optimizer_step()
        except Exception as exc:  # the runtime's exception types derive from RuntimeError or Exception
            raise runtime_failure(exc, "optimizer step") from exc

    optimizer_step = exclusive(denormals.flushing(_optimizer_step))

    def _zero_grad(self) -> None:
        """The next train step overwrites the gradient buffers instead of adding to them."""
        self._live()
        try:
            self._module.lazy_reset_grad()
        except Exception as exc:  # the runtime's exception types derive from RuntimeError or Exception
            raise runtime_failure(exc, "gradient reset") from exc

    def _update(self) -> None:
        """:meth:`_optimizer_step` then :meth:`_zero_grad`: one call on a hot path."""
        if self._freed or self._optimizer is None:
            self._optimizer_step()  # raises what it says
        self.writes += 1
        try:
            self._optimizer.optimizer_step()
        except Exception as exc:  # the runtime's exception types derive from RuntimeError or Exception
            raise runtime_failure(exc, "optimizer step") from exc
        try:
            self._module.lazy_reset_grad()
        except Exception as exc:  # the update ran: the caller's abandon_step counts it
            raise runtime_failure(exc, "gradient reset after the update (the update ran and is counted)") from exc

    zero_grad = exclusive(_zero_grad)

    @property
    def lr(self) -> float | None:
        return self._lr

    def _set_lr(self, value: float) -> None:
        self._live()
        if self._optimizer is None:
            raise OrtrainError("this session was opened without an optimizer graph")
        self._optimizer.set_learning_rate(float(value))
        self._lr = float(value)

    lr = lr.setter(exclusive(_set_lr))

    # -- parameters -------------------------------------------------------------------
    @exclusive
    def view(self, name: str) -> np.ndarray:
        """A live numpy view of a parameter (CPU only): writing into it changes the weight."""
        self._live()
        v = self._views.get(name)
        if v is None:
            if self.device.kind != "cpu":
                raise OrtrainError("live parameter views exist only on the CPU; use get()/set()")
            if name not in self.param_names:
                raise OrtrainError(f"parameter {name!r} is not in this session; it holds "
                                   f"{', '.join(self.param_names)}")
            v = self._views[name] = self._state.get_parameter(name).data.numpy()
        return v

    @exclusive
    def grad_view(self, name: str) -> np.ndarray | None:
        """A live view of a trainable parameter's accumulated gradient, or None before the first step."""
        self._live()
        return self._state.get_parameter(name).grad.numpy() if self._state.get_parameter(name).grad.has_value() \
            else None

    @exclusive
    def get(self, name: str) -> np.ndarray:
        """A copy of a parameter's current value."""
        self._live()
        if self.device.kind == "cpu":
            return self.view(name).copy()
        return self._state.get_parameter(name).data.numpy()

    @exclusive
    def set(self, name: str, value: np.ndarray) -> None:
        self._live()
        self.writes += 1
        if self.device.kind == "cpu":
            view = self.view(name)
            if view.shape != value.shape:
                raise ShapeError(f"parameter {name!r} expected shape {describe_shape(view.shape)}, "
                                 f"received {describe_shape(value.shape)}")
            view[...] = value
        else:
            self._state.copy_parameter_from(name, C.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(value)))

    # -- checkpoints and export -------------------------------------------------------
    @exclusive
    def save_checkpoint(self, path, properties: dict | None = None, include_optimizer: bool = True,
                        carried: dict | None = None) -> None:
        """Write the state with ``properties`` and, with them, :data:`CHECKSUM` of what it holds
        (the runtime writes the file with a placeholder, whose bytes the checksum then replaces).
        ``carried``: moments of weights frozen here, which the file holds beside the runtime's own
        (the runtime writes the file, which is then written again with them)."""
        self._live()
        for key, value in (properties or {}).items():
            self._state.add_property(key, value)
        if properties:
            self._state.add_property(CHECKSUM, CHECKSUM_PLACEHOLDER)
        runtime_path(path, "save_checkpoint(path)")  # before anything is written
        with atomic_path(path, "save_checkpoint(path)") as tmp:
            try:
                C.save_checkpoint(self._state, tmp, include_optimizer and self._optimizer is not None)
                if carried:
                    data = read_checkpoint(tmp)
                    data.carried = carried
                    write_checkpoint(tmp, data)
                if properties:
                    write_checksum(tmp)
            except (RuntimeError, OSError) as exc:  # a full disk, a file-size limit: the reason ends the message
                reason, advice = write_failure(exc) or (_reason(exc), write_advice(None))
                raise OrtrainError(f"save_checkpoint: cannot write {os.fspath(path)!r}: {reason}; a file already "
                                   f"there is left as it was. {advice}") from exc

    @exclusive
    def optimizer_state(self):
        """The optimizer's state (its update count and moments by parameter name; None without an
        optimizer), read back through a checkpoint in a scratch directory: the runtime offers no
        other way to it."""
        self._live()
        try:
            with scratch_dir() as scratch:
                path = os.path.join(scratch, "state")
                C.save_checkpoint(self._state, path, self._optimizer is not None)
                return read_checkpoint(path, weights=False).optimizer
        except (RuntimeError, OSError) as exc:  # a full temporary folder, a file-size limit
            found = write_failure(exc)
            if found is None:
                raise
            raise OrtrainError(f"the optimizer state cannot be read back: onnxruntime gives it only as a checkpoint, "
                               f"written to the temporary folder {tempfile.gettempdir()!r} for that, which failed: "
                               f"{found[0]}. {found[1].replace('choose another folder', 'point TMPDIR elsewhere')}"
                               ) from exc

    def optimizer_moments(self) -> dict:
        """The optimizer's moments by parameter name (``{}`` before any)."""
        state = self.optimizer_state()
        return state.moments if state is not None else {}

    @exclusive
    def abandon_step(self, exc: BaseException, updates_before: int, updating: bool = True) -> bool:
        """After a step that raised ``exc``: drop the gradients (the runtime may have added the
        batch's), and say whether the update ran all the same. ``updating``: the update had been
        called, and then an interrupt (Ctrl-C), which Python raises once a runtime call has
        returned, or a failure of a call after it (the gradients' reset) may have come after it ran;
        the optimizer's own count, compared with ``updates_before``, tells (False when it cannot be
        read, so that ``exc`` is what propagates). A second interrupt during all this does not stop
        it: it is one more Ctrl-C on the way out."""
        with contextlib.suppress(Exception):  # a reset failing again: ``exc`` propagates
            despite_interrupts(self.zero_grad)
        if not updating:
            return False
        try:
            state = despite_interrupts(self.optimizer_state)
        except Exception:
            return False
        return state is not None and state.step > updates_before

    @exclusive
    def properties(self) -> dict:
        self._live()
        return {n: self._state.get_property(n) for n in self._state.property_names()}

    @exclusive
    def export_inference(self, path, output_names: list[str]) -> None:
        """Write an inference model with the current weights (library export, from the eval graph)."""
        self._live()
        self._module.export_model_for_inferencing(os.fspath(path), list(output_names))
