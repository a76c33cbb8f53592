"""Captured steps: a traced function run as ONNX graphs on every call.

``capture_step`` records ``fn`` once, builds the training graph (forward and
backward) and the optimizer's update graph, and then every call is: check the
inputs, one training-graph run, optional clipping on the live gradient views,
one update-graph run. Two graphs rather than one because the update writes each
weight in place while the training graph reads it; one graph would leave the
order of that read and that write to the runtime.

Where a param's value lives: in the session of the live captured step that
trains it (``Param._holder``), else in the param's own array. Captured steps
that share params copy the freshest values in before they run whenever any
shared step has moved (``_world`` counts those moves), so steps that share
weights behave as one program run in call order.
"""

from __future__ import annotations

import math
import os
import threading

import numpy as np
import onnx

from ortrain import artifacts, engine
from ortrain._arrays import is_real
from ortrain._keywords import names_unknown_arguments_of, names_unknown_arguments_of_methods
from ortrain.ag import tensor
from ortrain.ag.calls import Capture, TracedCall
from ortrain.ag.tensor import Buffer, Param
from ortrain.ag.tracer import example_inputs, refuse_gradient_names, trace
from ortrain.engine import denormals
from ortrain.engine.session import despite_interrupts
from ortrain.errors import FreedError, NonFiniteError, OrtrainError, ShapeError, describe_shape
from ortrain.graph import spec_of
from ortrain.graph.repairs import read_as_scalars
from ortrain.optim import SGD, Adam, Optimizer
from ortrain.optim.optimizers import is_step

__all__ = ["Capture", "CaptureStep", "capture", "capture_step"]

_world = [0]       # bumped whenever a param's freshest value moves between sessions
_live_steps = [0]  # captured steps alive; with one, nothing can be shared
_counting = threading.Lock()  # held only while _live_steps changes, never while waiting for anything
_FLOAT32_MAX = float(np.finfo(np.float32).max)
_FLOAT32_TINY = float(np.finfo(np.float32).tiny)


def _fresh_locks_in_child() -> None:
    """A forked child gets its own locks: a thread of the parent that held one at the fork does not
    exist in the child, which would wait for it forever."""
    global _counting
    _counting = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_in_child)


def _check_max_norm(value):
    if value is None:
        return None
    if not is_real(value) or not math.isfinite(value) or value <= 0:
        raise OrtrainError(f"max_grad_norm: expected None or a positive finite number, received {value!r}")
    return float(value)


class CaptureStep(TracedCall):
    """A captured training step; see :func:`capture_step`."""

    _where = "capture_step"

    def __init__(self, fn, params, optimizer, max_grad_norm):
        super().__init__(fn, params)
        if not isinstance(optimizer, Adam):
            got = type(optimizer).__name__ if isinstance(optimizer, Optimizer) else repr(optimizer)
            if isinstance(optimizer, SGD):
                fix = "a captured step updates with Adam only; train with SGD through ot.Trainer"
            else:
                fix = "create one with the params to train, e.g. ot.optim.Adam([W, b], lr=1e-3)"
            raise OrtrainError(f"capture_step: optimizer expected an ot.optim.Adam or AdamW holding the params to "
                               f"train, received {got}; {fix}")
        if not optimizer.params:
            raise OrtrainError("capture_step: the optimizer holds no params; create it with the params to train, "
                               "e.g. ot.optim.Adam([W, b], lr=1e-3)")
        bad = [p for p in optimizer.params if not isinstance(p, Param)]
        if bad:
            raise OrtrainError(f"capture_step: the optimizer's params must be ag.param objects, received {bad[0]!r}")
        self._opt = optimizer
        self._max_norm = _check_max_norm(max_grad_norm)
        self._session = None
        self._views: dict[str, np.ndarray] = {}
        self._source = self._read_moments  # one bound-method object: compared by identity on every call

    # -- the hot path ------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        """Run one step on the named input arrays; returns the loss, or a dict of outputs."""
        # Steps that share params or an optimizer hand values over between them: one runs at a time,
        # from whichever thread, so that no step's update is lost to another's.
        with tensor.TURNS:
            feeds = self._arrive(args, kwargs, self._session is not None)
            opt = self._opt
            # opt._step is opt.step for an optimizer with params (only a compiled model's reads another count)
            if opt._state_source is not self._source or opt._state_version != self._version or opt._step != self._step:
                self._resync()
            if _world[0] != self._world_seen:
                self._sync_params()
            if opt._lr != self._lr:
                self._session.lr = self._lr = opt._lr
            # The step itself, written out here: a method call costs about 0.1 us of a 15 us step.
            # A captured step's session is reached only under tensor.TURNS (calls, free, and opt.state()
            # reading the moments): its own lock is not taken.
            session = self._session
            outs = self._outs
            norm = None
            drawn = session.draws
            before = self._step
            updating = False
            flush = denormals.here()
            try:
                denormals.on(flush)  # subnormals flushed, once for the step's calls
                try:
                    session._train_step_into(feeds)
                except Exception as exc:
                    raise OrtrainError(f"capture_step: the training graph failed: {str(exc).splitlines()[0]}") \
                        from exc
                if self._ranges:
                    self._check_ranges(outs[len(self._keys):])
                loss = outs[0].copy()
                if not math.isfinite(loss):
                    self._refuse("loss", float(loss))
                if self._max_norm is not None:
                    norm = self._clip()
                updating = True
                session._update()  # the update, then the gradients zeroed
                # counted: an interrupt that came just before, abandon_step counts it
                if _live_steps[0] > 1:
                    _world[0] += 1
                    self._world_seen = _world[0]
                # the optimizer's count, then this step's own, which the except below reads
                opt._step = self._step = before + 1
            except BaseException as exc:
                # Nothing but the gradients moved: they are dropped. An interrupt that came just after
                # the update ran counts it.
                if self._step > before:  # counted: the gradients alone may be left
                    session.zero_grad()
                # (a second Ctrl-C during the recovery does not stop it; no call after it, so none parts the two)
                elif despite_interrupts(lambda exc=exc: session.abandon_step(exc, before, updating)):
                    if _live_steps[0] > 1:
                        _world[0] += 1
                        self._world_seen = _world[0]
                    opt._step = self._step = before + 1
                else:  # a refused step: the next call draws its dropout masks again
                    session.undraw(drawn)
                raise
            finally:
                denormals.off(flush)
            if not self._dict and norm is None:
                return loss
            out = {"loss": loss}
            for i in range(1, len(self._keys)):
                out[self._keys[i]] = outs[i].copy()
            if norm is not None:
                out["grad_norm"] = np.array(norm, np.float32)
            return out

    def _clip(self) -> float:
        grads = self._grads
        if grads is None:
            grads = self._grads = [self._session.grad_view(n).reshape(-1) for n in self._trainable]
        total = 0.0
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is retried in float64 below
            for g in grads:
                total += float(np.dot(g, g))
        # float32 squares overflow above ~1.8e19 (NaN and inf stay so) and underflow below ~1e-19
        # (flushed to 0 here, see engine.denormals): both are summed again in float64
        if not math.isfinite(total) or total < 1e-30:
            total = sum(float(np.dot(g64, g64)) for g64 in (g.astype(np.float64) for g in grads))
        norm = math.sqrt(total)
        if not norm <= _FLOAT32_MAX:  # inf, NaN, or past float32, where the reported norm is inf
            self._refuse("gradient norm", norm)
        coef = self._max_norm / (norm + 1e-6)
        if coef < 1.0:
            # a factor below float32's smallest normal would be flushed to 0 (a norm near float32's
            # largest): two factors of its square root each, which are not
            factors = [np.float32(coef)] if coef >= _FLOAT32_TINY else [np.float32(math.sqrt(coef))] * 2
            for g in grads:
                for c in factors:
                    g *= c
        return norm

    def _refuse(self, what: str, value: float):
        # _run drops the gradients: nothing else has moved yet.
        raise NonFiniteError(f"capture_step: the {what} is {value}; the update was refused and the weights, the "
                             f"optimizer's moments and step ({self._step}) are unchanged. Look for inf or NaN in "
                             "the inputs, or lower the learning rate")

    # -- settings and lifetime ---------------------------------------------------------------------
    def set(self, **settings) -> None:
        """Change settings between calls, without tracing again: ``set(max_grad_norm=0.5)``.

        Settings: ``max_grad_norm`` (a positive number, or None to turn clipping off), as
        :func:`capture_step` takes it; it applies from the next call. An unknown setting raises
        ``OrtrainError`` naming the ones there are, and :class:`FreedError` after :meth:`free`."""
        self._live()
        unknown = sorted(set(settings) - {"max_grad_norm"})
        if unknown:
            raise OrtrainError(f"set: unknown setting {unknown[0]!r}; settable: max_grad_norm")
        if "max_grad_norm" in settings:
            self._max_norm = _check_max_norm(settings["max_grad_norm"])

    @property
    def max_grad_norm(self) -> float | None:
        """The clipping norm the next call uses, or None (no clipping); :meth:`set` changes it."""
        return self._max_norm

    @property
    def optimizer(self) -> Optimizer:
        """The optimizer given to :func:`capture_step`."""
        return self._opt

    def _free(self) -> None:
        if self._freed:
            return
        self._freed = True
        session = self._session
        if session is None:
            return
        opt = self._opt
        if opt._state_source is self._source:  # hand the moments over before the session goes
            opt._moments = self._moments_of(session)
            opt._state_source = None
        self._session = None
        for p in self._params:
            p._detach(self)
        self._views = {}
        self._grads = None
        with _counting:  # the collector frees without the steps' turn: the count is kept apart
            _live_steps[0] -= 1
        session.free()

    # -- building ---------------------------------------------------------------------------------
    def _build(self, kwargs) -> None:
        arrays = example_inputs(kwargs, self._where)
        empty = next((name for name, a in arrays.items() if a.size == 0), None)
        if empty is not None:  # the gradient of a mean over nothing divides by zero in the runtime
            raise ShapeError(f"{self._where}: input {empty!r} has shape {describe_shape(arrays[empty].shape)}, with no "
                             "elements; a training step needs data along every axis (the first call fixes the "
                             "shapes): pass at least one element")
        traced = trace(self._fn, arrays, training=True, where=self._where)
        held = {id(p) for p in self._opt.params}
        frozen_by_list = {id(p) for p in self._extra}
        # As in PyTorch, a param the loss does not depend on gets no gradient and is left alone.
        in_loss = {id(p) for p in traced.loss_params}
        trainable, frozen = [], []
        for p in traced.params:
            train = p.trainable and id(p) in held and id(p) not in frozen_by_list and id(p) in in_loss
            (trainable if train else frozen).append(p)
        if not trainable:
            raise OrtrainError("capture_step: nothing to train: the loss depends on no param that the optimizer "
                               "holds and that is trainable (trainable=False and params= freeze a param)")
        refuse_gradient_names([p.name for p in trainable], [p.name for p in traced.params] + list(traced.used),
                              self._where)
        training, evaluation = engine.build_training_graphs(
            _scalars_held_as_rank_one(traced.proto, [p.name for p in trainable + frozen if p.shape == ()]),
            [p.name for p in trainable], [p.name for p in frozen], list(traced.output_names))
        self._models = [m.SerializeToString() for m in (training, evaluation, self._opt.graph())]
        self._trainable = [p.name for p in trainable]
        self._params = trainable + frozen
        self._keys, self._dict = traced.keys, traced.returns_dict
        # The training graph writes its outputs straight into these on every step.
        self._outs = [np.empty(s.shape, s.dtype) for s in map(spec_of, traced.proto.graph.output)]
        moments = self._opt_moments()
        session = self._open({p.name: p._current() for p in self._params}, moments, self._opt.step)
        self._adopt(session)
        self._set_specs(traced, [s.name for s in session.train_inputs])
        with _counting:
            _live_steps[0] += 1
        for p in self._params:
            p._attach(self)
        self._claim()

    def _opt_moments(self) -> dict:
        source = self._opt._state_source
        moments = dict(source() if source is not None else self._opt._moments)
        for p in self._params:
            ms = moments.get(p.name)
            if ms is not None and p.name in self._trainable and any(m.shape != p.shape for m in ms):
                raise OrtrainError(f"capture_step: the optimizer's moments for {p.name!r} have shape "
                                   f"{describe_shape(ms[0].shape)}, the param {describe_shape(p.shape)}; load the "
                                   "state of an optimizer over the same params")
        return moments

    def _open(self, values: dict, moments: dict, step: int):
        trainable = {n: values[n] for n in self._trainable}
        frozen = {p.name: values[p.name] for p in self._params if p.name not in trainable}
        state = None
        if step or any(n in moments for n in trainable):
            mine = {n: moments.get(n) or (np.zeros_like(a), np.zeros_like(a)) for n, a in trainable.items()}
            state = engine.OptimizerState(int(step), float(self._opt.lr), mine)
        self._carried = {n: m for n, m in moments.items() if n not in trainable}
        # Until this session updates, the moments it started without stay absent from opt.state() (a
        # refused first call left zero moments there, which no update had made).
        self._opened = (int(step), {n for n in trainable if n in moments})
        with artifacts.scratch_dir() as d:
            paths = [d / "training.onnx", d / "eval.onnx", d / "optimizer.onnx"]
            for path, data in zip(paths, self._models, strict=True):
                path.write_bytes(data)
            engine.write_checkpoint(d / "checkpoint", engine.CheckpointData(trainable, frozen, state))
            # Dropout masks are drawn at the optimizer's step count: a reopened session, or a new capture
            # resumed with opt.load_state, goes on with the masks an uninterrupted run would draw.
            return engine.TrainingSession(paths[0], paths[1], d / "checkpoint", paths[2], draws=int(step))

    def _adopt(self, session) -> None:
        old, self._session = self._session, session
        # In the param's own shape: the checkpoint holds a 0-d weight as one element of shape (1,).
        self._views = {p.name: session.view(p.name).reshape(p.shape) for p in self._params}
        session.bind_train_outputs(self._outs)
        self._grads = None
        self._lr = None
        self._step = self._opt.step
        self._version = self._opt._state_version
        self._opt._state_source = self._source
        if old is not None:
            old.free()

    def _claim(self) -> None:
        """Make this session the home of the params it trains (others copy from it before they run)."""
        moved = False
        for p in self._params[:len(self._trainable)]:
            if p._holder is not self:
                p._holder = self
                moved = True
        if moved:
            _world[0] += 1
        self._world_seen = _world[0]

    def _sync_params(self) -> None:
        # Buffers are kept equal in every session by Buffer.write; everything else is copied
        # from wherever its freshest value lives.
        for p in self._params:
            if p._holder is not self and not isinstance(p, Buffer):
                self._views[p.name][...] = p._current()
        self._claim()

    def _resync(self) -> None:
        """Reopen the session from a checkpoint: ``opt.load_state()``, a changed ``opt.step``, a write of
        ``opt.betas``, ``opt.eps`` or ``opt.weight_decay`` (the update graph holds them), or another
        captured step that used this optimizer since this one last ran."""
        opt = self._opt
        step = opt.step
        if not is_step(step):
            raise OrtrainError(f"opt.step: expected the number of updates taken, an int from 0 to 2**62 - 1, "
                               f"received {step!r}; nothing was run (set it to an int, or restore a state with "
                               "opt.load_state)")
        if opt._state_source is self._source:
            moments = self._read_moments()
        else:
            moments = self._opt_moments()
        if _world[0] != self._world_seen:
            self._sync_params()
        values = {n: np.array(v, copy=True) for n, v in self._views.items()}
        self._models[2] = opt.graph().SerializeToString()  # load_state may have brought other betas or decay
        self._adopt(self._open(values, moments, opt.step))
        self._claim()

    def _moments_of(self, session) -> dict:
        shapes = {p.name: p.shape for p in self._params}  # a 0-d param's moments come back as shape (1,)
        step, given = self._opened
        live = {n: tuple(m.reshape(shapes[n]) for m in ms) for n, ms in session.optimizer_moments().items()
                if self._step != step or n in given}
        return {**self._carried, **live}

    def _read_moments(self) -> dict:
        """``opt.state()`` reads the live moments through this while the step is alive: between calls,
        whichever thread reads them (a call takes the session's calls and its count together)."""
        with tensor.TURNS:
            session = self._session
            if session is not None:
                try:
                    return self._moments_of(session)
                except FreedError:
                    pass
            return self._opt._moments  # freed meanwhile, by another thread: free() handed them over first

    def __repr__(self) -> str:
        state = "not yet traced" if self.__dict__.get("_session") is None else f"step={self._step}"
        opt = self.__dict__.get("_opt")
        return self._described(getattr(opt, "params", ()), state)


def _scalars_held_as_rank_one(proto, names: list[str]):
    """The traced graph with each 0-d param in ``names`` taken as shape (1,), as the session's
    checkpoint holds it, and read through a reshape to rank 0: an output computed from such a
    param alone (``ag.exp(log_alpha)``) came back with shape (1,) and failed the output check."""
    if not names:
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for vi in out.graph.input:
        if vi.name in names:
            shape = vi.type.tensor_type.shape
            del shape.dim[:]
            shape.dim.add().dim_value = 1
    read_as_scalars(out, names)
    return out


@names_unknown_arguments_of
def capture_step(fn, optimizer=None, params=None, max_grad_norm=None) -> CaptureStep:
    """Capture a whole training step: ``fn``'s forward pass, its backward pass and the update.

    ``fn`` takes named tensors and returns the loss tensor or a dict with a ``"loss"`` entry; it
    takes data only through its arguments and reads no values back (``param.numpy()``,
    ``assign`` and ``buf.write`` inside it are refused: they would run once, as it is traced).
    The first call traces it with the given arrays (which fix the input names, shapes and
    dtypes: a later call may pass float64 for float32 or int32 for int64, which are cast, but an
    integer array for a float input or the reverse raises ``ShapeError``) and builds two graphs, forward with backward, then the optimizer's update; every
    call runs both and returns the forward outputs from before the update (the loss as an
    ndarray, or a dict of ndarrays). The learning rate and the step counter are read from
    ``optimizer`` on every call, so schedules and ``opt.load_state()`` take effect at once.

    ``optimizer`` is an ``ot.optim.Adam`` or ``AdamW`` holding the params to train (SGD and
    gradient accumulation are refused); params ``fn`` uses that it does not hold, that are
    ``trainable=False``, or that are listed in ``params`` are frozen, even when the optimizer
    holds them (their moments then stay as they are, as in PyTorch for a param without a
    gradient); buffers are never trained. Captured steps may share one optimizer: it keeps one
    step count for all its params (``opt.step``, as Keras' ``iterations``), where PyTorch counts
    each param's updates, so a param a later step trains first starts at that count.

    ``max_grad_norm``: gradients are scaled by ``min(1, max_grad_norm / (norm + 1e-6))`` before
    the update (as ``torch.nn.utils.clip_grad_norm_``) and the result gains ``grad_norm``, the
    norm before clipping. A non-finite loss, and with clipping a gradient norm that is not finite
    in float32 (above 3.4e38), raise ``ot.NonFiniteError`` before the update: weights, moments
    and the step counter stay as they were. Without clipping the gradients are not read, so a
    finite loss whose gradient holds NaN or inf (``tanh`` of an infinite input) updates the
    weights with it, as in PyTorch: set ``max_grad_norm`` to have every step checked. Clipping
    costs one pass over each param's gradient in numpy per call. The moments accumulate clipped
    gradients. CPU only; float32 weights.

    Captured steps run one at a time: calls from several threads take turns, so that steps
    sharing params or an optimizer behave as if called one after another.
    """
    if isinstance(optimizer, (Param, list, tuple)):  # the params where the optimizer goes
        raise OrtrainError("optimizer: expected an ot.optim.Adam or AdamW, received params (capture_step takes fn, "
                           "optimizer, params, max_grad_norm in that order); pass them by name: "
                           "ot.capture_step(fn, optimizer=opt, params=[...])")
    return CaptureStep(fn, params, optimizer, max_grad_norm)


@names_unknown_arguments_of
def capture(fn, params=None) -> Capture:
    """Capture a forward computation (evaluation, acting in an environment): no backward, no update.

    Same rules as :func:`capture_step`: the first call fixes input names, shapes and dtypes;
    every call reads the params' current values (also while a captured step trains them) and
    returns an ndarray, or a dict of ndarrays when ``fn`` returns a dict. Dropout is off.
    """
    return Capture(fn, params)


names_unknown_arguments_of_methods(CaptureStep, "set", "free")
