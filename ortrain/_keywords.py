"""Constructors that name the argument they do not take, and what to do instead, where Python
would raise its own ``TypeError`` (Keras code ported as written passes Keras' arguments)."""

from __future__ import annotations

import functools
import inspect

from ortrain.errors import ArgumentError

# What a Keras argument that has no counterpart here turns into.
_INSTEAD = {
    "data_format": "ortrain's images are channels first, (batch, channels, height, width): transpose "
                   "channels-last data with x.transpose(0, 3, 1, 2)",
    "kernel_initializer": "kernels start Glorot-uniform and biases at zero; set other values with set_weights",
    "bias_initializer": "biases start at zero; set other values with set_weights",
    "kernel_regularizer": "there are no regularizers; AdamW's weight_decay decays the weights",
    "bias_regularizer": "there are no regularizers; AdamW's weight_decay decays the weights",
    "dilation_rate": "convolutions here are not dilated; a model with dilated ones trains through ot.from_onnx",
    "label_smoothing": "smooth the labels before the loss: y * (1 - a) + a / classes",
    "amsgrad": "Adam here is plain Adam (as torch.optim.Adam's default)",
    "run_eagerly": "ortrain runs training graphs built ahead of time; there is no eager mode to choose",
    "jit_compile": "ortrain runs training graphs built ahead of time; there is nothing to compile",
    "steps_per_execution": "each step is one run of the training graphs",
    "loss_weights": "one loss is computed, on the model's first output",
    "workers": "batches are read in the calling thread: prepare them in a generator or a DataLoader",
    "use_multiprocessing": "batches are read in the calling thread: prepare them in a generator or a DataLoader",
    "max_queue_size": "batches are read in the calling thread: prepare them in a generator or a DataLoader",
    "custom_objects": "a saved model holds no Python objects to look up",
    "overwrite": "the file is replaced (written to a temporary path and renamed)",
    "batch_size": "the batch axis is free here; a Trainer fixes its own, Trainer(model, batch_size=...)",
}


def name_unknown_arguments(cls) -> None:
    """Wrap ``cls.__init__`` (its own, when it takes no ``**kwargs``) so a call it cannot bind
    raises :class:`~ortrain.errors.ArgumentError` (an ``OrtrainError`` and a ``TypeError``) naming the
    argument, what the class takes and the fix."""
    init = cls.__dict__.get("__init__")
    if init is None:  # inherited: a wrapped parent names type(self) already; an unwrapped one is wrapped here
        init = cls.__init__
        if getattr(init, "_names_unknown", False):
            return
    elif getattr(init, "_names_unknown", False):
        return
    if init is object.__init__:  # takes no arguments (a loss without settings)
        signature = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)])
    else:
        signature = inspect.signature(init)
    params = list(signature.parameters.values())[1:]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return

    cls.__init__ = _bound_first(init, signature, params, lambda args: type(args[0]).__name__)


def _bound_first(fn, signature, params, name_of):
    """``fn`` raising :class:`ArgumentError`, named by ``name_of(args)``, for a call that does not
    bind to ``signature``. Python binds the arguments before ``fn``'s first line, so nothing of it
    runs for such a call; the signature is only read when a ``TypeError`` comes back (a call that
    binds costs one frame more), and one raised from inside ``fn`` goes on as it was."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError:
            try:
                signature.bind(*args, **kwargs)
            except TypeError as unbound:
                raise ArgumentError(_message(name_of(args), params, args, kwargs, unbound)) from None
            raise  # from inside fn

    call._names_unknown = True
    call.__signature__ = signature  # (help() and inspect show it, also where fn is object.__init__)
    return call


def _message(name: str, params, args, kwargs, exc: TypeError) -> str:
    taken = ", ".join(p.name for p in params if p.kind is not p.VAR_POSITIONAL and not p.name.startswith("_")) \
        or "no arguments"
    unknown = [k for k in kwargs if k not in {p.name for p in params}]
    if unknown:
        key = unknown[0]
        instead = _INSTEAD.get(key)
        return (f"{name}({key}=...): {name} takes no argument {key!r} (it takes {taken})"
                + (f"; {instead}" if instead else ""))
    return f"{name}: {exc} (it takes {taken})"


def names_unknown_arguments_of(fn=None, *, label: str | None = None):
    """``fn`` (a public function or method) raising :class:`~ortrain.errors.ArgumentError` for a call
    it cannot bind, naming the argument, what it takes and the fix, instead of Python's TypeError.
    ``label``: how messages name it (``artifacts.build``), ``fn.__name__`` by default; with a label
    alone, a decorator."""
    if fn is None:
        return functools.partial(names_unknown_arguments_of, label=label)
    if getattr(fn, "_names_unknown", False):
        return fn
    signature = inspect.signature(fn)
    params = [p for p in signature.parameters.values() if p.name != "self"]
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return fn
    name = label or fn.__name__
    return _bound_first(fn, signature, params, lambda args: name)


def names_unknown_arguments_of_methods(cls, *names: str) -> None:
    """Give the named methods of ``cls`` (plain, class or static methods, own or inherited) the
    :class:`~ortrain.errors.ArgumentError` of :func:`names_unknown_arguments_of`, named
    ``Class.method``; set on ``cls`` itself, so a parent's method is wrapped for this class only."""
    for name in names:
        attr = inspect.getattr_static(cls, name)
        kind = type(attr) if isinstance(attr, (classmethod, staticmethod)) else None
        fn = attr.__func__ if kind else attr
        if not inspect.isfunction(fn):
            raise TypeError(f"{cls.__name__}.{name} is not a method")  # a name misspelled here
        if getattr(fn, "_names_unknown", False):
            continue
        signature = inspect.signature(fn)
        params = [p for p in signature.parameters.values()][0 if kind is staticmethod else 1:]
        if any(p.kind is p.VAR_KEYWORD for p in params):
            continue
        label = f"{cls.__name__}.{name}"
        wrapped = _bound_first(fn, signature, params, lambda args, label=label: label)
        # where pickle looks it up: this class's (a parent's method found there is the one unwrapped)
        wrapped.__module__, wrapped.__qualname__ = cls.__module__, f"{cls.__qualname__}.{name}"
        setattr(cls, name, kind(wrapped) if kind else wrapped)
