"""Optimizer objects: a description of the update rule plus, for captured steps, its state.

In ``compile`` an optimizer is only a description (the trainer keeps the step
counter and the learning rate). Given ``params``, it is also the owner of the
step counter and learning rate that :func:`ortrain.capture_step` reads on every
call, and of the moments that :meth:`Optimizer.state` returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import weakref

import numpy as np
import onnx

from ortrain._arrays import FLOAT32_TINY, as_array, as_float32, is_real, one_of_two_names
from ortrain._keywords import (
    name_unknown_arguments,
    names_unknown_arguments_of,
    names_unknown_arguments_of_methods,
)
from ortrain.errors import OrtrainError
from ortrain.optim.graphs import adamw_graph, sgd_graph

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "get", "check_lr", "check_momentum", "check_weight_decay"]


def _turns():
    """The lock captured steps take turns by (``ortrain.ag.tensor.TURNS``, read at each use: a forked
    child replaces it), which a captured step's optimizer is read and written under."""
    from ortrain.ag import tensor  # (ortrain.ag imports the optimizers)
    return tensor.TURNS


def is_step(value) -> bool:
    """An optimizer's update count: an int >= 0 that int64 holds with room to count on."""
    return not isinstance(value, bool) and isinstance(value, (int, np.integer)) and 0 <= value < 2 ** 62


def check_lr(value, where: str = "lr") -> float:
    """A learning rate must be a finite number >= 0."""
    if not is_real(value):
        raise OrtrainError(f"{where}: expected a finite number >= 0, received {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise OrtrainError(f"{where}: expected a finite number >= 0, received {value!r}; "
                           f"the learning rate is left unchanged")
    if not math.isfinite(as_float32(value)):
        raise OrtrainError(f"{where}: expected a number float32 holds (below 3.4e38; the runtime trains in "
                           f"float32), received {value!r}; the learning rate is left unchanged")
    return value


def check_weight_decay(value, where: str = "weight_decay") -> float:
    if not is_real(value) or not (0.0 <= float(value) <= 1.0):
        raise OrtrainError(f"{where}: expected a number in [0, 1] (the decay per unit of learning rate), "
                           f"received {value!r}")
    return float(value)


def check_momentum(value, where: str = "momentum") -> float:
    """SGD's momentum: a number in [0, 1) that stays below 1 in float32 (the runtime divides by 1 - momentum)."""
    if not is_real(value) or not 0.0 <= float(value) < 1.0 or as_float32(value) >= 1.0:
        raise OrtrainError(f"{where}: expected a number in [0, 1) (below 1 in float32, the runtime's precision), "
                           f"received {value!r}; e.g. momentum=0.9, or 0 for plain SGD")
    return float(value)


def _checked_adam(betas, eps, betas_name: str, eps_name: str, keeps: str | None = None) -> tuple[tuple, float]:
    """Adam's ``betas`` and ``eps``, checked together (the first update divides by
    ``(1 - beta_1) * (sqrt(v) + eps)``): ``((beta_1, beta_2), eps)`` as floats. ``keeps``: what an
    error adds of the values kept (an attribute's write)."""
    kept = f"; nothing changed ({keeps})" if keeps else ""
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        b1 = b2 = float("nan")
    if not all(is_real(b) and 0.0 <= b < 1.0 for b in (b1, b2)):
        raise OrtrainError(f"{betas_name}: expected two numbers in [0, 1), received {betas!r}{kept}; e.g. "
                           "betas=(0.9, 0.999), the default")
    b1, b2 = float(b1), float(b2)
    rounded = next((b for b in (b1, b2) if as_float32(b) >= 1.0), None)
    if rounded is not None:  # bias correction would divide by 1 - 1.0 = 0
        raise OrtrainError(f"{betas_name}: expected two numbers below 1 in float32, the runtime's precision, received "
                           f"{betas!r}, where {rounded!r} becomes 1.0{kept}; use at most 0.9999999")
    if not (is_real(eps) and eps > 0):
        raise OrtrainError(f"{eps_name}: expected a positive number, received {eps!r}{kept}")
    if not as_float32(eps) < math.inf:
        raise OrtrainError(f"{eps_name}: expected a positive number float32 holds (the runtime computes in float32), "
                           f"received {eps!r}, which becomes inf there{kept}; the default is 1e-8")
    # The first update divides by (1 - beta_1) * (sqrt(v) + eps) in float32 (onnxruntime's AdamW), and
    # the sessions flush values below the smallest normal float32 to 0: a weight whose gradient is 0
    # would get 0 / 0.
    first = np.float32(1.0) - np.float32(b1)
    if not first * np.float32(eps) >= FLOAT32_TINY:
        least = float(np.nextafter(np.float32(FLOAT32_TINY / first), np.float32(np.inf)))
        raise OrtrainError(f"{eps_name}: expected at least {least:.3g} with beta_1={b1!r}, received {eps!r}: the "
                           f"runtime divides the first update by (1 - beta_1) * (sqrt(v) + eps) in float32 and "
                           f"flushes values below 1.2e-38 to 0, so a weight whose gradient is 0 would become "
                           f"NaN{kept}; the default is 1e-8")
    return (b1, b2), float(eps)


def _held_as(cls: type, key: str) -> str:
    """The attribute a setting ``key`` is kept in: ``_key`` behind a property of ortrain's
    (``betas``, ``eps``, ``weight_decay``), else ``key`` itself (a subclass's own setting)."""
    return f"_{key}" if isinstance(getattr(cls, key, None), property) else key


def _checked_params(params, cls: str) -> list:
    """``params`` (None or any iterable of ag params) as a list; anything else gets an error that
    says what to write instead."""
    from ortrain.ag.tensor import Param
    if params is None:
        return []
    expected = "params: expected None or a list of ag.param objects (for capture_step), received"
    if isinstance(params, Param):
        raise OrtrainError(f"{expected} the single param {params.name!r}; wrap it in a list: "
                           f"ot.optim.{cls}([{params.name}], ...)")
    if isinstance(params, (int, float, np.number)) or (isinstance(params, np.ndarray) and params.ndim == 0):
        v = float(params)
        named = f"ot.optim.{cls}(lr={v!r})" + (f" or ot.optim.{cls}(weight_decay={v!r})" if cls == "AdamW" else "")
        raise OrtrainError(f"{expected} the number {v!r}; pass settings by name, e.g. {named}")
    items = list(params) if hasattr(params, "__iter__") and not isinstance(params, (str, bytes, dict)) else None
    if items is None:
        raise OrtrainError(f"{expected} {type(params).__name__}; pass a list, e.g. ot.optim.{cls}([W, b], lr=1e-3)")
    bad = next((p for p in items if not isinstance(p, Param)), None)
    if bad is not None:
        raise OrtrainError(f"{expected} a list holding {type(bad).__name__} {bad!r:.40}; create params with "
                           "ag.param(array, name=...)")
    items = list({id(p): p for p in items}.values())  # one param listed twice is held once, as torch does
    seen: dict = {}
    for p in items:
        if seen.setdefault(p.name, p) is not p:
            # state() keys the moments by name, so two params of one name would share them
            raise OrtrainError(f"params: two different params are named {p.name!r} ({seen[p.name]!r} and {p!r}); "
                               "give each its own name, e.g. ag.param(array, name=...)")
    return items


def _held(train) -> dict:
    """What a compiled model's training state (a ``TrainState``, or None for fresh moments) gives an
    optimizer that keeps it apart from the model: its ``_step``, ``_moments`` and ``_counts``."""
    if train is None:
        return {"_step": 0, "_moments": {}, "_counts": {"n_steps": 0, "draws": None}}
    # the model's own arrays, not copies (pickled with the model, they are written once)
    return {"_step": train.step, "_moments": dict(train.moments),
            "_counts": {"n_steps": train.n_steps, "draws": train.draws}}


class _Shown:
    """The rate an optimizer shows after the model it was compiled into is gone (until written)."""

    def __init__(self, rate: float):
        self.rate = rate

    def __call__(self) -> float:
        return self.rate


class Optimizer:
    """The base of ``Adam``, ``AdamW`` and ``SGD``: ``lr`` (settable; ``learning_rate`` is the same,
    by Keras' name, in the constructors too), ``step`` (updates taken), ``state()``/``load_state()``;
    ``params`` only for ``capture_step``."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        name_unknown_arguments(cls)  # Keras' arguments ported as written get an OrtrainError with the fix

    name = "optimizer"
    has_moments = False
    # the per-weight buffers onnxruntime-training's update graph keeps (its SGD one it never reads)
    runtime_moments = 1
    default_lr = 1e-3
    _left_out_of_state: dict = {}  # hyperparameters state() omits at these values

    def __init__(self, params=None, lr: float = 1e-3, learning_rate: float | None = None):
        self.params = _checked_params(params, type(self).__name__)
        lr = one_of_two_names(type(self).__name__, "lr", lr, self.default_lr, "learning_rate", learning_rate)
        self._lr = check_lr(lr, "lr" if learning_rate is None else "learning_rate")
        self._step = 0
        self._model = None  # for a compiled model's optimizer: a weak reference to the model
        self._model_id = None  # and that model's id, which its finalizer checks (the reference may be cleared first)
        self._counts = None  # kept from a model gone: {"n_steps", "draws"} for state()
        self._kept_for = None  # a weak reference to the model that compiled another optimizer, whose state it keeps
        self._for_next = False  # load_state gave it a state for the model it is compiled into next
        self._moments: dict[str, tuple[np.ndarray, ...]] = {}
        self._state_source = None  # set by a live capture: returns {param name: moments}
        self._state_version = 0
        self.lr_writes = 0  # a fit takes over a rate written since it last looked, even an equal one
        self._lr_now = None  # for a model's optimizer: the rate its fit trains at (or the next one starts at)

    @property
    def lr(self) -> float:
        """The learning rate. For a compiled model's optimizer, the rate its fit trains at (a
        schedule's included, as a Keras callback reads it), and outside a fit the rate the next
        fit starts at (the last rate of the one before, unless written since); else as made or
        last written. Writing it sets the rate the next step (or fit) takes."""
        now = self._lr_now
        return self._lr if now is None else now()

    @lr.setter
    def lr(self, value) -> None:
        self._lr = check_lr(value)
        self.lr_writes += 1
        self._lr_now = None

    @property
    def step(self) -> int:
        """Updates taken (as Keras' ``iterations``): a captured step's count, or for a compiled model's
        optimizer the model's (a running fit's included), which ``load_state`` restores."""
        if self._model is None:  # a captured step's optimizer, read at every call: no more than this
            return self._step
        model = self._compiled_model()
        return self._step if model is None else model._optimizer_step()

    @step.setter
    def step(self, value) -> None:
        if self._model is not None and self._compiled_model() is not None:
            raise OrtrainError(f"opt.step: this optimizer is compiled into model {self._compiled_model().name!r}, "
                               f"whose training counts its updates; received {value!r}, nothing changed. Restore "
                               "a saved count with its moments: opt.load_state(state)")
        if not is_step(value):
            raise OrtrainError(f"opt.step: expected the number of updates taken, an int from 0 to 2**62 - 1, "
                               f"received {value!r}; nothing changed (it stays {self._step})")
        with _turns():  # between a captured step's calls, which count their updates into it
            self._step = int(value)

    def _link(self, model) -> None:
        """Compiled into ``model`` (or a fit of it): ``step``, ``state()`` and ``load_state`` read
        and write the model's training state, through a weak reference."""
        self._model, self._model_id, self._counts = weakref.ref(model), id(model), None
        self._kept_for, self._for_next = None, False

    def _outlive(self, model) -> None:
        """``model``, which this optimizer is compiled into, is being collected: keep what it showed
        (step, moments, rate and counts), as a Keras optimizer keeps its variables, so that
        ``opt = ot.load_model(path).optimizer`` still holds the saved state."""
        if self._model is None or self._model_id != id(model) or model.__dict__.get("optimizer") is not self:
            return
        state = model.__dict__.get("_train_state")
        # The rate it showed is shown on, and is in state(); ``_lr`` (what a model compiled with it next
        # starts at, as while the model lived) stays, so no rate depends on when the collector runs.
        shown = state.lr if state is not None and not model._lr_written() else None
        self.__dict__.update(_held(state))
        self._model = self._model_id = None
        self._lr_now = None if shown is None else _Shown(shown)

    def _detach(self, model) -> None:
        """``model``, which this optimizer is compiled into, compiles another one: keep what it showed,
        as for a model gone, and give it back if ``model`` compiles this optimizer again (a Keras
        optimizer keeps its variables, and a recompile with it continues)."""
        linked = self._model is not None and self._model_id == id(model)
        self._outlive(model)
        if linked and self._model is None:
            self._kept_for = weakref.ref(model)

    def _kept_state(self, model) -> dict | None:
        """The state a compile of ``model`` with this optimizer continues from, as
        ``_load_optimizer_state`` takes it: the state kept when ``model`` compiled another optimizer,
        or one ``load_state`` gave it for the model it is compiled into next; else None (a fresh
        start, as for a model like one gone, whatever the collector did)."""
        if self.params or self._compiled_model() is not None:
            return None
        kept_for = self._kept_for
        if not (self._for_next or (kept_for is not None and kept_for() is model)):
            return None
        counts = self._counts or {}
        return {"step": self._step, "lr": self.lr, "moments": dict(self._moments),
                "n_steps": counts.get("n_steps", self._step), "draws": counts.get("draws")}

    def _compiled_model(self):
        """The model this optimizer is compiled into (the last to compile or fit with it), or None."""
        ref = self._model
        model = ref() if ref is not None else None
        return model if model is not None and model.optimizer is self else None

    def __getstate__(self) -> dict:
        # A copy or a pickle holds the optimizer's values, not links to a running fit or capture.
        with _turns():  # between a captured step's calls: its count and moments together
            state = dict(self.__dict__)
            source = self._state_source
            if source is not None:
                state["_moments"] = {p: tuple(np.array(m, copy=True) for m in ms) for p, ms in source().items()}
                state["_state_source"] = None
        model = self._compiled_model()
        if model is not None:  # what the model's optimizer state holds now
            state.update(_held(model.train_state))
        state["_model"] = state["_model_id"] = state["_kept_for"] = None
        state["_lr_now"] = self._lr_now if isinstance(self._lr_now, _Shown) else None
        return state

    def __setstate__(self, state: dict) -> None:
        if "step" in state:  # pickled when the count was a plain attribute
            state["_step"] = state.pop("step")
        for key in ("weight_decay", "betas", "eps"):  # (and so were these, where they are properties now)
            if key in state:
                state[_held_as(type(self), key)] = state.pop(key)
        state.setdefault("_model", None)
        state.setdefault("_model_id", None)
        state.setdefault("_counts", None)
        state.setdefault("_for_next", False)
        state["_kept_for"] = None
        self.__dict__.update(state)

    _weight_decay = 0.0

    @property
    def weight_decay(self) -> float:
        """The weight decay, in [0, 1]; a write is checked as the constructor checks it, and takes
        effect from a captured step's next call, or from the next fit or trainer."""
        return self._weight_decay

    @weight_decay.setter
    def weight_decay(self, value) -> None:
        self._set_hyperparameter("_weight_decay", check_weight_decay(value))

    def _set_hyperparameter(self, attribute: str, value) -> None:
        """Set a checked hyperparameter that the update graph holds; a captured step over this
        optimizer reopens its session with the new graph at its next call (as after ``load_state``)."""
        with _turns():  # between a captured step's calls
            if getattr(self, attribute) != value:
                setattr(self, attribute, value)
                self._state_version += 1

    @property
    def learning_rate(self) -> float:
        """Keras' name for :attr:`lr` (read and written alike)."""
        return self.lr

    @learning_rate.setter
    def learning_rate(self, value) -> None:
        self.lr = value

    @property
    def hyperparameters(self) -> dict:
        return {}

    def config(self) -> dict:
        return {"name": self.name, "lr": self._lr, **self.hyperparameters}

    def graph(self, weight_decay: float | None = None) -> onnx.ModelProto:
        raise NotImplementedError

    def state(self) -> dict:
        """A plain dict: ``step``, ``lr``, ``name``, ``hyperparameters`` and ``moments`` by param name;
        for a compiled model's optimizer also ``n_steps`` and ``draws`` (the steps its training ran, and
        the training-graph runs seeded dropout goes on from) and ``base_lr`` (the compiled or last written
        rate, which ``StepDecay``/``CosineDecay`` with ``initial_lr=None`` start their curve from), so
        ``load_state`` resumes it exactly, a schedule's curve included."""
        model = self._compiled_model()
        if model is not None:  # a compiled model's: its fit's (live while it runs) or its trainer's
            held = _held(model.train_state)
            step, moments, extra = held["_step"], held["_moments"], {**held["_counts"], "base_lr": self._lr}
        else:
            with _turns():  # between a captured step's calls: its count and moments together
                source = self._state_source  # read once: a captured step freed meanwhile clears it
                step, moments = self._step, (source() if source is not None else self._moments)
            # kept from a model gone (or compiled away, copied, pickled): its rate then is the base still
            extra = {} if self._counts is None else {**self._counts, "base_lr": self._lr}
        names = ("m", "v")
        return {
            "name": self.name,
            "step": int(step),
            "lr": self.lr,
            "hyperparameters": dict(self.hyperparameters),
            "moments": {p: {names[i]: np.array(m, copy=True) for i, m in enumerate(ms)}
                        for p, ms in moments.items()},
            **extra,
        }

    def load_state(self, state: dict) -> None:
        """Restore what :meth:`state` returned (moments, step, lr and the hyperparameters: betas, eps,
        weight decay); a capture over the same params then continues exactly, and so does the next
        fit (or Trainer) of the model this optimizer is compiled into."""
        if not isinstance(state, dict) or "step" not in state or "moments" not in state:
            raise OrtrainError("load_state: expected the dict returned by Optimizer.state() "
                               "(keys 'step', 'lr', 'moments'), received "
                               f"{type(state).__name__} with keys {sorted(state) if isinstance(state, dict) else '-'}")
        if state.get("name", self.name) != self.name:
            raise OrtrainError(f"load_state: state of a {state.get('name')!r} optimizer cannot be loaded into "
                               f"{self.name!r}: moments of one are not those of the other; load it into an "
                               f"optimizer of its kind (ot.optim.get({state.get('name')!r}) with the same settings)")
        step = state["step"]
        if not is_step(step):
            raise OrtrainError(f"load_state: 'step' must be an int from 0 to 2**62 - 1, received {step!r}")
        if not isinstance(state["moments"], dict):
            raise OrtrainError("load_state: 'moments' expected a dict {param name: {'m': array, 'v': array}}, "
                               f"received {type(state['moments']).__name__}")
        model = self._compiled_model()
        held = [p.name for p in self.params] if model is None else model._optimizer_weights()
        unknown = [str(n) for n in state["moments"] if (held or model is not None) and n not in held]
        if unknown:
            whose = "its params" if model is None else f"the weights model {model.name!r} trains"
            raise OrtrainError(f"load_state: moments of {', '.join(map(repr, unknown))}, which this optimizer "
                               f"does not hold ({whose}: {', '.join(map(repr, held)) or 'none'}); load the state of "
                               "an optimizer over the same params")
        hyper = self._checked_hyperparameters(state.get("hyperparameters"))
        # (the moments the loaded settings keep: an SGD state with momentum loaded into one without)
        with_moments = self._with_moments(hyper)
        moments = {pname: self._checked_moments(pname, ms, with_moments) for pname, ms in state["moments"].items()}
        lr = check_lr(state.get("lr", self._lr), "load_state: 'lr'")
        base_lr = check_lr(state["base_lr"], "load_state: 'base_lr'") if "base_lr" in state else None
        n_steps, draws = state.get("n_steps", step), state.get("draws")
        for key, value in (("n_steps", n_steps), ("draws", draws)):
            if not (is_step(value) or (key == "draws" and value is None)):
                raise OrtrainError(f"load_state: {key!r} expected an int >= 0 (as state() returns it), "
                                   f"received {value!r}; nothing was changed")
        n_steps, draws = int(n_steps), None if draws is None else int(draws)
        # A captured step's optimizer changes between its calls, which count their updates into it (a
        # compiled model's fit has its own lock, which a fit callback may hold while it runs a capture)
        with _turns() if model is None else contextlib.nullcontext():
            if model is not None:  # checked against the weights and a running fit before anything is set
                model._load_optimizer_state(int(step), lr, moments, n_steps, draws)
                if base_lr is not None:  # a schedule's base, not a write: the next fit starts at the state's rate
                    self._lr = base_lr
            else:  # (the counts kept for the model it is compiled into next, as a state() from a model holds them)
                self._moments, self._step = moments, int(step)
                counted = not self.params and ("n_steps" in state or "draws" in state)  # not a captured step's
                self._counts = {"n_steps": n_steps, "draws": draws} if counted else None
                self._for_next = not self.params  # for the model it is compiled into next
            if model is None:
                if base_lr is not None and self._for_next:  # a model's state, for the model compiled next:
                    self._lr, self._lr_now = base_lr, _Shown(lr)  # its schedule's base, showing the state's rate
                else:
                    self._lr, self._lr_now = lr, None
                self.lr_writes += 1
            # (a compiled model's state holds the rate, which its next fit starts at, as after a fit: the
            # rate it was compiled with stays a schedule's base, StepDecay(initial_lr=None)'s)
            for key, value in hyper.items():  # (the moments loaded are the settings', not to be rescaled)
                if key == "momentum":
                    self._momentum, self._kept_at = value, value or None
                else:  # (checked together above, where one attribute's write checks it against the others)
                    setattr(self, _held_as(type(self), key), value)
            # A live capture reads the loaded moments at its next call, instead of its own.
            self._state_source = None
            self._state_version += 1

    def _checked_hyperparameters(self, hyper) -> dict:
        """The attributes ``hyper`` (from :meth:`state`) sets, checked as the constructor checks them;
        as ``torch.optim.Optimizer.load_state_dict`` restores betas and decay, so does this. A key
        left out keeps this optimizer's value, except one ``state()`` leaves out itself (an SGD's
        decay of 0)."""
        if hyper is None:
            return {}
        known = [k for k in ("betas", "eps", "weight_decay", "momentum") if hasattr(self, k)]
        if not isinstance(hyper, dict) or set(hyper) - set(known):
            raise OrtrainError(f"load_state: 'hyperparameters' expected a dict with keys among {known}, as "
                               f"{type(self).__name__}.state() returns it, received {hyper!r:.120}")
        given = {k: getattr(self, k) for k in known} | self._left_out_of_state | hyper
        try:
            made = type(self)(None, **given)
        except OrtrainError as exc:
            raise OrtrainError(f"load_state: 'hyperparameters': {exc}; the state was not loaded") from None
        return {key: getattr(made, key) for key in known}

    def _with_moments(self, hyper: dict) -> bool:
        """Whether this optimizer with the settings ``hyper`` (from :meth:`_checked_hyperparameters`) keeps moments."""
        return self.has_moments

    def _checked_moments(self, pname: str, ms, with_moments: bool) -> tuple[np.ndarray, ...]:
        keys = ("m", "v") if with_moments else ()
        if not isinstance(ms, dict) or any(k not in ms for k in keys):
            raise OrtrainError(f"load_state: moments of {pname!r} expected a dict with keys {list(keys)}, "
                               f"received {ms!r:.80}")
        # as every array ortrain takes: real numbers only (strings, objects and complex values refused)
        arrays = tuple(np.array(as_array(ms[k], np.float32, f"load_state: moment {k!r} of {pname!r}"), copy=True)
                       for k in keys)
        shape = next((tuple(p.shape) for p in self.params if getattr(p, "name", None) == pname), None)
        for k, a in zip(keys, arrays, strict=True):
            if shape is not None and a.shape != shape:
                raise OrtrainError(f"load_state: moment {k!r} of {pname!r} has shape {a.shape}, the param "
                                   f"{shape}; load the state of an optimizer over the same params")
            held_at_zero = k == "v" and self.name == "sgd"  # SGD's second moment: the update divides by sqrt(v) + eps
            bad = ~np.isfinite(a) | ((a != 0) if held_at_zero else (a < 0) if k == "v" else False)
            if bad.any():
                need = ("0 (SGD keeps only a velocity, 'm')" if held_at_zero else
                        "finite values >= 0 (it averages squared gradients)" if k == "v" else "finite values")
                raise OrtrainError(f"load_state: moment {k!r} of {pname!r} holds {a[bad].flat[0]}; it needs "
                                   f"{need}, so the state was not loaded")
        return arrays

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "name")
        return f"{type(self).__name__}({args})"


class Adam(Optimizer):
    """Adam as ``torch.optim.Adam`` (bias-corrected moments); defaults ``lr=1e-3, betas=(0.9, 0.999), eps=1e-8``
    (Keras' names ``learning_rate``, ``beta_1``, ``beta_2`` and ``epsilon`` are taken too).

    A ``weight_decay`` given here is decoupled, as in ``torch.optim.AdamW`` (not added to the
    gradient as ``torch.optim.Adam`` does); :class:`AdamW` defaults it to 0.01."""

    name = "adam"
    has_moments = True
    runtime_moments = 2
    default_weight_decay = 0.0

    def __init__(self, params=None, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float | None = None, *, learning_rate: float | None = None,
                 beta_1: float | None = None, beta_2: float | None = None, epsilon: float | None = None):
        super().__init__(params, lr, learning_rate)
        where = type(self).__name__
        if beta_1 is not None or beta_2 is not None:  # Keras' names, one beta each
            keras = (betas[0] if beta_1 is None and isinstance(betas, (tuple, list)) and len(betas) == 2 else beta_1,
                     betas[1] if beta_2 is None and isinstance(betas, (tuple, list)) and len(betas) == 2 else beta_2)
            betas = one_of_two_names(where, "betas", betas, (0.9, 0.999), "beta_1/beta_2", keras)
        eps_name = "epsilon" if epsilon is not None else "eps"  # messages use the name given (Keras')
        eps = one_of_two_names(where, "eps", eps, 1e-8, "epsilon", epsilon)
        self._betas, self._eps = _checked_adam(betas, eps, "betas", eps_name)
        wd = self.default_weight_decay if weight_decay is None else weight_decay
        self._weight_decay = check_weight_decay(wd)

    @property
    def betas(self) -> tuple[float, float]:
        """``(beta_1, beta_2)``, each in [0, 1); written as :attr:`weight_decay` is."""
        return self._betas

    @betas.setter
    def betas(self, value) -> None:
        with _turns():  # checked against the eps it is set beside
            checked, _ = _checked_adam(value, self._eps, "opt.betas", "opt.eps", keeps=f"they stay {self._betas!r}")
            self._set_hyperparameter("_betas", checked)

    @property
    def eps(self) -> float:
        """The term added to the denominator, > 0; written as :attr:`weight_decay` is."""
        return self._eps

    @eps.setter
    def eps(self, value) -> None:
        with _turns():  # checked against the betas it is set beside
            _, checked = _checked_adam(self._betas, value, "opt.betas", "opt.eps", keeps=f"it stays {self._eps!r}")
            self._set_hyperparameter("_eps", checked)

    @property
    def hyperparameters(self):
        return {"betas": list(self.betas), "eps": self.eps, "weight_decay": self.weight_decay}

    def graph(self, weight_decay=None):
        wd = self.weight_decay if weight_decay is None else check_weight_decay(weight_decay)
        return adamw_graph(self.betas, self.eps, wd)


class AdamW(Adam):
    """Adam with decoupled weight decay (``torch.optim.AdamW``); ``weight_decay=0.01`` by default."""

    name = "adamw"
    default_weight_decay = 0.01


class SGD(Optimizer):
    """Stochastic gradient descent as ``torch.optim.SGD``; ``lr=1e-2`` by default.

    ``w -= lr * g`` without momentum. ``weight_decay`` (in [0, 1], 0 by default) adds
    ``weight_decay * w`` to the gradient first, as PyTorch does: without momentum that is
    ``w -= lr * (g + weight_decay * w)``, both PyTorch's decay and Keras' decoupled one.

    ``momentum`` (in [0, 1), 0 by default) keeps a velocity as PyTorch does (no dampening):
    ``buf = momentum * buf + g; w -= lr * buf``, ``g`` including the decay (Keras decays the
    weights apart). A rate that changes applies to the whole velocity, as in PyTorch, where
    Keras folds each step's rate into it. ``state()`` gives the velocity as
    onnxruntime-training keeps it: ``"m"`` is ``(1 - momentum) * buf`` (PyTorch's
    ``momentum_buffer`` is ``m / (1 - momentum)``) and ``"v"`` stays 0. ``nesterov=True`` is
    refused: the runtime's update kernels have no Nesterov form. Capture takes Adam and AdamW only."""

    name = "sgd"
    default_lr = 1e-2
    _left_out_of_state = {"weight_decay": 0.0, "momentum": 0.0}

    def __init__(self, params=None, lr: float = 1e-2, weight_decay: float = 0.0, *,
                 learning_rate: float | None = None, momentum: float = 0.0, nesterov: bool = False):
        super().__init__(params, lr, learning_rate)
        self._weight_decay = check_weight_decay(weight_decay)
        self._momentum = check_momentum(momentum)
        if nesterov is not False:
            raise OrtrainError(f"SGD: nesterov={nesterov!r}: Nesterov momentum is not offered (onnxruntime-training's "
                               "update kernels have no Nesterov form); use momentum without it "
                               f"(ot.optim.SGD(momentum={self.momentum or 0.9!r})), or ot.optim.Adam")

    _momentum = 0.0
    _kept_at = None  # the momentum the velocity was last kept at, where it differs from _momentum (0)

    @property
    def momentum(self) -> float:
        """The momentum, in [0, 1). A write takes effect from the next fit or trainer, and keeps the
        velocity a fit left (the runtime holds ``(1 - momentum) * buf``, rescaled to the new value),
        as ``torch.optim.SGD`` keeps its buffer when a param group's momentum changes."""
        return self._momentum

    @momentum.setter
    def momentum(self, value) -> None:
        value = check_momentum(value)
        # the momentum the kept velocity was made at: a fit at momentum 0 leaves it as it was, as
        # torch.optim.SGD leaves its buffer, for a later momentum to go on from
        kept = self._kept_at if self._kept_at is not None else self._momentum
        if value and kept and value != kept:
            self._rescale_velocity((1.0 - np.float64(np.float32(value))) / (1.0 - np.float64(np.float32(kept))))
        self._momentum = value
        if value:
            self._kept_at = value

    def _rescale_velocity(self, factor: float) -> None:
        """The velocity the runtime keeps as ``(1 - momentum) * buf``, for another momentum: of the
        model this optimizer is compiled into (refused while it fits), or kept by this optimizer."""
        def rescaled(moments: dict) -> dict:
            return {n: (np.asarray(ms[0] * factor, np.float32), *ms[1:]) if ms else ms for n, ms in moments.items()}
        model = self._compiled_model()
        if model is not None:
            model._refuse_while_fitting("momentum", "set", instead=": a running fit's update graph fixes the momentum")
            state = model._train_state
            if state is not None and state.moments:
                model._train_state = dataclasses.replace(state, moments=rescaled(state.moments))
        elif self._moments:
            self._moments = rescaled(self._moments)

    @property
    def has_moments(self) -> bool:  # the velocity, with momentum
        return bool(self.momentum)

    @property
    def runtime_moments(self) -> int:  # the velocity and a second moment held at 0; without momentum one never read
        return 2 if self.momentum else 1

    def _with_moments(self, hyper: dict) -> bool:
        return bool(hyper.get("momentum", self.momentum))

    @property
    def hyperparameters(self):
        # a setting at its default is left out: the config (and the artifacts' key) of the SGD before it had it
        return {k: getattr(self, k) for k in ("weight_decay", "momentum") if getattr(self, k)}

    def graph(self, weight_decay=None):
        wd = self.weight_decay if weight_decay is None else check_weight_decay(weight_decay)
        return sgd_graph(wd, check_momentum(self.momentum))


_BY_NAME = {"adam": Adam, "adamw": AdamW, "sgd": SGD}


@names_unknown_arguments_of(label="optim.get")
def get(spec) -> Optimizer:
    """An optimizer from ``"adam"``, ``"adamw"``, ``"sgd"``, a config dict or an object."""
    if isinstance(spec, Optimizer):
        return spec
    if isinstance(spec, dict):
        cfg = dict(spec)
        name = cfg.pop("name", None)
        if name not in _BY_NAME:
            raise OrtrainError(f"optimizer: unknown name {name!r} in {spec!r}")
        try:
            return _BY_NAME[name](**cfg)
        except (TypeError, OrtrainError) as exc:  # an unknown or misspelt key, a bad value
            raise OrtrainError(f"{name}: cannot build it from {spec!r}: {exc}") from None
    if isinstance(spec, str) and spec.lower() in _BY_NAME:
        return _BY_NAME[spec.lower()]()
    raise OrtrainError(f"optimizer: expected 'adam', 'adamw', 'sgd' or an ot.optim object, received {spec!r}")


names_unknown_arguments_of_methods(Optimizer, "state", "load_state")
