"""``Sequential``: a model built from a stack of single-input layers."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ortrain import _random
from ortrain._arrays import checked_int, is_integer
from ortrain._keywords import name_unknown_arguments, names_unknown_arguments_of_methods
from ortrain.errors import OrtrainError
from ortrain.nn.base_layer import Layer
from ortrain.nn.base_model import Model, checked_model_name
from ortrain.nn.symbolic import Input, SymbolicTensor

__all__ = ["NotBuiltError", "Sequential"]


class NotBuiltError(OrtrainError, AttributeError):
    """A model method used on a ``Sequential`` that has no input shape or no layer yet."""


class Sequential(Model):
    """A stack of single-input layers: ``ot.Sequential([Dense(8, activation="relu"), Dense(2)], input_shape=(4,))``,
    or, as in Keras, ``ot.Sequential([ot.Input((4,)), Dense(8, activation="relu"), Dense(2)])``, or
    ``model = ot.Sequential(); model.add(ot.Input((4,))); model.add(Dense(2))``.

    :meth:`add` and :meth:`pop` rebuild the model (the layers keep their weights); compile after
    the last of them. Until it has an input shape and a layer, only ``add`` works."""

    def __init__(self, layers=None, input_shape=None, name: str | None = None, seed: int | None = None,
                 input_dtype=None):
        checked_model_name(name, "Sequential")
        if isinstance(layers, (Layer, str, bytes, Mapping)) or (layers is not None and not hasattr(layers, "__iter__")):
            fix = "; wrap a single layer in a list" if isinstance(layers, Layer) else ""
            raise OrtrainError(f"Sequential(layers=...): expected a list of layers, received "
                               f"{type(layers).__name__}{fix}")
        layers = list(layers or [])
        first = None
        if layers and isinstance(layers[0], SymbolicTensor):  # Keras' Sequential([Input((4,)), Dense(2)])
            first = _checked_input(layers.pop(0), input_shape, input_dtype)
            input_shape, input_dtype = first.shape[1:], first.dtype
        for lyr in layers:
            _check_layer(lyr)
        twice = next((lyr for k, lyr in enumerate(layers) if any(lyr is o for o in layers[:k])), None)
        if twice is not None:  # as add() refuses it: pop() and add() rebuild from the model's layers
            raise OrtrainError(f"Sequential(layers=...): {twice!r} is listed twice; a layer appears once in a "
                               "Sequential (to call one layer twice, use the functional API: h = d(d(x)))")
        seed = checked_int(seed, "Sequential(seed=...)", minimum=0, allow_none=True)
        self._seed = seed
        self._rng = _random.generator(seed)
        self._pending = (first, input_shape, input_dtype, name)
        if not layers:
            self._built = False  # Keras' Sequential() filled in by add()
            self._init_state(name or "sequential")
            self.layers = []
            return
        if input_shape is None:
            raise OrtrainError("Sequential(..., input_shape=...) is required: give the shape of one sample, "
                               "e.g. input_shape=(4,) for 4 features, or start the list with ot.Input((4,))")
        self._assemble(layers)

    def _assemble(self, layers: list) -> None:
        first, input_shape, input_dtype, name = self._pending
        dtype = input_dtype or layers[0].input_dtype
        x = inp = first if first is not None else Input(input_shape, dtype=dtype)
        # A layer first called in this model's earlier assembly takes its call in this one as its first
        # (Keras' layer.input and output): kept, every add() held a chain of the layers before it,
        # and a model built by L add()s held L**2 tensors (pickles and copies grew as much)
        earlier = set()
        for t in self.__dict__.get("_outputs") or ():
            while t.node is not None and id(t) not in earlier:
                earlier.add(id(t))
                t = t.node.inputs[0]
        for position, lyr in enumerate(layers):
            called = lyr.__dict__.get("_first_call")
            if called is not None and id(called[1]) in earlier:
                del lyr.__dict__["_first_call"]
            if not lyr.built_for and lyr.seed is None:
                # where a seeded stack stood before this layer drew: pop() puts it back there
                self.__dict__.setdefault("_drawn_before", {})[id(lyr)] = self._rng.bit_generator.state
                stack_seed = None if self._seed is None else \
                    int(np.random.SeedSequence([self._seed, position]).generate_state(1)[0] >> 1)
                lyr.build([x.shape], self._rng, stack_seed)  # seed= makes its dropout reproducible too
            x = lyr(x)
        Model.__init__(self, inp, x, name=name or getattr(self, "name", None) or "sequential")
        self._pending = (inp, None, None, self.name)
        self._built = True

    def __getattr__(self, name: str):
        # Only for attributes not found: a model method used before add() gave an input and a layer.
        if name.startswith("__") or self.__dict__.get("_built", True):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        if self._has_input():
            raise NotBuiltError("this Sequential has no layer yet; add layers first: model.add(ot.layers.Dense(2))")
        raise NotBuiltError("this Sequential has no input shape yet; add an ot.Input((features,)) and layers "
                            "first: model.add(ot.Input((4,))); model.add(ot.layers.Dense(2))")

    def __repr__(self) -> str:
        try:
            if not self.__dict__.get("_built", True):
                return f"<Sequential {self.name!r}: not built ({'no layer' if self._has_input() else 'no input'} yet)>"
        except Exception:  # noqa: BLE001 - a repr never raises (a model whose __init__ failed half-way)
            return f"<Sequential {self.__dict__.get('name', '?')!r}: not built>"
        return super().__repr__()

    def _has_input(self) -> bool:
        first, shape = self.__dict__.get("_pending", (None, None, None, None))[:2]
        return first is not None or shape is not None

    def add(self, layer) -> None:
        """Append a layer (or, first, an ``ot.Input``), as Keras' ``Sequential.add``. The layers
        already there keep their weights; an error leaves the model as it was."""
        self._refuse_while_fitting("Sequential.add", "change", "the graphs of its layers")
        built = self.__dict__.get("_built", True)
        if built:
            self._adopt()
        layers = list(self.layers) if built else []
        if isinstance(layer, SymbolicTensor):
            if built or self._has_input():
                raise OrtrainError("Sequential.add: the model has its input already; an ot.Input can only come first")
            _, _, dtype, name = self._pending
            self._pending = (_checked_input(layer, None, dtype), None, None, name)
            return
        _check_layer(layer)
        if any(layer is lyr for lyr in layers):
            raise OrtrainError(f"Sequential.add: {layer!r} is in this model already; a layer appears once in a "
                               "Sequential (share layers with the functional API)")
        if not built and not self._has_input():
            raise OrtrainError("Sequential.add: the model has no input shape yet; add an ot.Input((features,)) "
                               "first, or give Sequential(input_shape=...)")
        was_built, drawn = layer.built_for is not None, self._rng.bit_generator.state
        try:
            self._rebuild(layers + [layer])
        except BaseException:
            self._rng.bit_generator.state = drawn  # a refused layer draws nothing from a seeded stack
            if not was_built:
                layer.unbuild()
            raise

    def pop(self) -> Layer:
        """Remove the last layer (as Keras' ``Sequential.pop``) and return it."""
        self._refuse_while_fitting("Sequential.pop", "change", "the graphs of its layers")
        if not self.__dict__.get("_built", True):
            raise OrtrainError("Sequential.pop: the model has no layer to remove")
        self._adopt()
        layers = list(self.layers)
        drawn = self.__dict__.get("_drawn_before", {}).pop(id(layers[-1]), None)
        if len(layers) == 1:
            inp, name, seed, rng = self._inputs[0], self.name, self._seed, self._rng
            self.__dict__.clear()
            Sequential.__init__(self, [inp], name=name, seed=seed)
            self._rng = rng
        else:
            self._rebuild(layers[:-1])
        if drawn is not None:  # the next layer added draws what the popped one drew, as the list form would
            self._rng.bit_generator.state = drawn
        return layers[-1]

    def _adopt(self) -> None:
        """Give a loaded or copied model (built without ``Sequential.__init__``) the stack's state."""
        if "_pending" not in self.__dict__:
            self._pending, self._rng, self._seed = (self._inputs[0], None, None, self.name), _random.generator(None), None

    def _rebuild(self, layers: list) -> None:
        self._adopt()
        saved = dict(self.__dict__)
        first_calls = [(lyr, lyr.__dict__.get("_first_call")) for lyr in layers]  # _assemble moves them
        try:
            self._assemble(layers)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(saved)
            for lyr, called in first_calls:
                if called is None:
                    lyr.__dict__.pop("_first_call", None)
                else:
                    lyr.__dict__["_first_call"] = called
            raise
        # What model.freeze and freeze_bn_stats froze stays frozen (for the layers still there).
        names = set(self.weight_names())
        for key in ("_frozen", "_frozen_stats", "_layer_frozen_stats"):
            setattr(self, key, set(saved.get(key, ())) & names)


def _checked_input(first, input_shape, input_dtype):
    if first.node is not None:
        raise OrtrainError("Sequential: the first item may be an ot.Input(...), received a layer's output; "
                           "use the functional API (ot.Model(inputs, outputs)) for that")
    given = (input_shape,) if is_integer(input_shape) else input_shape
    if given is not None and tuple(given) != first.shape[1:]:
        raise OrtrainError(f"Sequential: input_shape={input_shape!r} and the ot.Input's shape "
                           f"{first.shape[1:]!r} disagree; give one of them")
    if input_dtype is not None and _dtype(input_dtype) not in (np.dtype(np.float32), np.dtype(np.int64)):
        raise OrtrainError(f"Sequential(input_dtype=...): expected 'float32' or 'int64', received {input_dtype!r}")
    if input_dtype is not None and _dtype(input_dtype) != first.dtype:
        raise OrtrainError(f"Sequential: input_dtype={input_dtype!r} and the ot.Input's dtype "
                           f"{first.dtype.name!r} disagree; give one of them")
    return first


def _check_layer(lyr) -> None:
    if hasattr(lyr, "layers") and hasattr(lyr, "weight_names"):  # Keras' Sequential([generator, discriminator])
        fix = ("list its layers instead, ot.Sequential(model.layers + [...]) (they keep their weights and are "
               "shared with it)") if lyr.layers else \
            ("an imported model (from_onnx) has no layers to list: add the layers to the model in the framework it "
             "came from and export it again, or train it alone")
        raise OrtrainError(f"Sequential: received a model ({lyr!r}) among the layers; a model used as a layer is not "
                           f"supported: {fix}")
    if not isinstance(lyr, Layer):
        raise OrtrainError(f"Sequential: expected ot.layers objects (after an optional ot.Input), received "
                           f"{lyr!r}; e.g. ot.Sequential([ot.Input((4,)), ot.layers.Dense(2)])")
    if lyr.n_inputs != 1:
        raise OrtrainError(f"Sequential: {type(lyr).__name__} merges several inputs; use the functional "
                           "API (ot.Input / ot.Model) for branches")


def _dtype(value) -> np.dtype | None:
    try:
        return np.dtype(value)
    except TypeError:
        return None


name_unknown_arguments(Sequential)
names_unknown_arguments_of_methods(Sequential, "add", "pop")
