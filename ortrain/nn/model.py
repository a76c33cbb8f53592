"""Models: the functional graph of layers, ``Sequential``, and what every model can do.

A model compiles to a :class:`~ortrain.graph.forward.ForwardGraph`; training goes
through :class:`ortrain.Trainer` (``fit`` drives one), prediction and evaluation run
the forward graph in a plain ``InferenceSession``.
"""

from __future__ import annotations

import fnmatch
import re
import weakref
from collections.abc import Mapping

import numpy as np

from ortrain import _random, losses, optim
from ortrain import metrics as metrics_mod
from ortrain._arrays import (
    as_array,
    checked_int,
    is_integer,
    positive_int,
    prepare_inputs,
    row_slices,
    run_chunks,
)
from ortrain._dag import post_order
from ortrain._files import atomic_path, checked_target
from ortrain.data import prepare_arrays, refuse_non_finite_weights
from ortrain.errors import OrtrainError, ShapeError, describe_shape
from ortrain.graph import GraphBuilder, TensorSpec, check_model
from ortrain.graph.forward import ForwardGraph, ParamSpec, with_weights
from ortrain.graph.passes import batchnorm_nodes, freeze_batchnorm_stats
from ortrain.nn.layers import EDITS, EmitContext, Layer

__all__ = ["Input", "Model", "Sequential", "SymbolicTensor"]


class _Node:
    __slots__ = ("layer", "inputs", "output")

    def __init__(self, layer, inputs, output):
        self.layer, self.inputs, self.output = layer, inputs, output


class SymbolicTensor:
    """A placeholder for a value in a functional model: shape (batch first, ``None`` = free) and dtype."""

    def __init__(self, shape: tuple, dtype, node: _Node | None = None, name: str | None = None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.node = node
        self.name = name

    @classmethod
    def from_layer(cls, layer: Layer, tensors: list[SymbolicTensor]) -> SymbolicTensor:
        for t in tensors:
            if t.dtype != layer.input_dtype:
                raise OrtrainError(f"{type(layer).__name__} takes {layer.input_dtype.name} inputs, received "
                                   f"{t.dtype.name}" + ("; give ot.Input(..., dtype='int64') for indices"
                                                         if layer.input_dtype.kind == "i" else ""))
        shapes = [t.shape for t in tensors]
        layer.build(shapes)
        out = cls(layer.output_shape(shapes), np.float32)
        out.node = _Node(layer, list(tensors), out)
        return out

    def __repr__(self) -> str:
        return f"SymbolicTensor(shape={describe_shape(self.shape)}, dtype={self.dtype.name})"


def Input(shape, dtype="float32", name: str | None = None) -> SymbolicTensor:  # noqa: N802 - Keras' name
    """A model input of per-sample ``shape`` (the batch dimension is added in front)."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise OrtrainError(f"Input(shape=...): expected a tuple of positive ints (None for a free size), received "
                           f"{shape!r}")
    if any(not (d is None or (is_integer(d) and d > 0)) for d in shape):
        raise OrtrainError(f"Input(shape=...): expected positive ints (None for a free size), received {shape!r}")
    shape = tuple(None if d is None else int(d) for d in shape)  # numpy ints reach onnx and JSON as ints
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dt not in (np.dtype(np.float32), np.dtype(np.int64)):
        raise OrtrainError(f"Input(dtype=...): expected 'float32' or 'int64', received {dtype!r}")
    if name is not None and (not isinstance(name, str) or not name):
        raise OrtrainError(f"Input(name=...): expected a non-empty string, received {name!r}")
    return SymbolicTensor((None,) + shape, dt, name=name)


class ShownRate:
    """What ``model.optimizer.lr`` reads outside a fit: the rate the model's next fit starts at,
    which is the rate its optimizer state carries (a schedule's last, as Keras' optimizer keeps
    it) unless a rate was written since, as :class:`ortrain.Trainer` decides. Weak references:
    the optimizer keeps neither the model nor itself alive."""

    def __init__(self, model, opt):
        self._model, self._opt = weakref.ref(model), weakref.ref(opt)

    def __call__(self) -> float:
        model, opt = self._model(), self._opt()
        if model is None or opt is None or model.optimizer is not opt:
            return opt._lr if opt is not None else float("nan")
        state = model._train_state  # the state the next fit starts from, not a running fit's
        return state.lr if state is not None and not model._lr_written() else opt._lr


def check_print_fn(print_fn) -> None:
    if not callable(print_fn):
        raise OrtrainError(f"summary(print_fn=...): expected a function taking a line, such as print, received "
                           f"{print_fn!r}")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", name).lower().replace("2_d", "2d")


def _topological(outputs: list[SymbolicTensor]) -> tuple[list[_Node], list[SymbolicTensor]]:
    """Nodes in dependency order and the input tensors reached."""
    tensors = post_order(outputs, lambda t: t.node.inputs if t.node is not None else ())
    return [t.node for t in tensors if t.node is not None], [t for t in tensors if t.node is None]


class Model:
    """A functional model: ``ot.Model(inputs, outputs)`` over tensors from ``ot.Input`` and layer calls."""

    def __init__(self, inputs, outputs, name: str | None = None):
        ins = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
        if not ins or not outs or not all(isinstance(t, SymbolicTensor) for t in ins + outs):
            raise OrtrainError("Model(inputs, outputs): expected tensors from ot.Input(...) and layer calls")
        twice = next(((i, j) for j, t in enumerate(ins) for i in range(j) if ins[i] is t), None)
        if twice is not None:
            raise OrtrainError(f"Model(inputs=...): inputs {twice[0]} and {twice[1]} are the same ot.Input (the first "
                               "array would be ignored); list each input once")
        nodes, reached = _topological(outs)
        missing = [t for t in reached if all(t is not i for i in ins)]
        if missing:
            raise OrtrainError(f"Model: the outputs depend on an input not listed in inputs "
                               f"({missing[0]!r}); pass every ot.Input the outputs use")
        self._init_state(name or "model")
        self._inputs, self._outputs, self._nodes = ins, outs, nodes
        self.layers: list[Layer] = []
        for node in nodes:
            if all(node.layer is not lyr for lyr in self.layers):
                self.layers.append(node.layer)
        self._name_layers()
        self._check_input_names()

    def _check_input_names(self) -> None:
        """Input names become graph names: they must differ from each other, the outputs' and
        the weights'."""
        names = [self._input_name(i) for i in range(len(self._inputs))]
        taken = {self._output_name(i) for i in range(len(self._outputs))} | set(self.weight_names())
        for i, n in enumerate(names):
            if n in names[:i] or n in taken or n.startswith("ortrain."):
                what = "another input's" if n in names[:i] else "an output's or a weight's" if n in taken else \
                    "reserved for ortrain's loss inputs"
                raise OrtrainError(f"Model: input name {n!r} is {what} name; give ot.Input(..., name=...) a name "
                                   "of its own")
    # -- construction helpers -----------------------------------------------------------
    def __getstate__(self) -> dict:
        # A deep copy or a pickle holds the model, not its prediction sessions (a cache, rebuilt on
        # use) nor links to a running or finished fit: the optimizer state as it is now, the
        # history's values, and whether the optimizer's rate was written since the last fit.
        from ortrain.history import History
        state = dict(self.__dict__)
        state["_runners"] = {}
        state["_live_state"] = state["_live_seen"] = None
        state["_train_state"] = self.train_state
        if self.history is not None:
            detached = History()
            detached.history = {k: list(v) for k, v in self.history.history.items()}
            detached.epoch, detached.params = list(self.history.epoch), dict(self.history.params)
            state["history"] = detached
        seen, opt = self._seen(), self.optimizer
        state["_lr_seen"] = ("this optimizer", seen[1]) if seen is not None and opt is not None and \
            seen[0] == id(opt) else seen
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        seen = self._lr_seen
        if seen is not None and seen[0] == "this optimizer":
            self._lr_seen = (id(self.optimizer), seen[1])
        if self.optimizer is not None:
            self.optimizer._lr_now = ShownRate(self, self.optimizer)

    def _lr_written(self) -> bool:
        """Whether ``optimizer.lr`` was written (or the optimizer replaced) since the last fit saw
        it: the next fit then starts at that rate instead of its state's."""
        opt = self.optimizer
        return opt is not None and (id(opt), opt.lr_writes) != (self._seen() or (id(opt), 0))

    def _seen(self):
        """(optimizer id, its lr_writes) when a fit last took the rate: a running fit's, else the last."""
        live = self._live_seen() if self._live_seen is not None else None
        return live if live is not None else self._lr_seen

    def _init_state(self, name: str) -> None:
        self.name = name
        self.loss: losses.Loss | None = None
        self.optimizer: optim.Optimizer | None = None
        self.metrics: list[str] = []
        self._frozen: set[str] = set()
        self._frozen_stats: set[str] = set()  # running-mean names of batch norms in inference form
        self.history = None  # the History of the last fit, as Keras keeps it
        self._live_state = None  # set by a running fit: returns its optimizer state once it has stepped
        self._live_seen = None  # set by a running fit: what it last took of optimizer.lr
        self.train_state = None  # optimizer state carried between fit() calls
        self._version = 0
        self._runners: dict = {}
        self._edits_seen = None  # layers.EDITS when the edits were last taken
        self._lr_seen = None  # (optimizer id, its lr_writes) when the last fit ended

    @property
    def train_state(self):
        """The optimizer state (moments, step, rate) a next ``fit`` continues from, None for fresh
        moments. While a fit runs it is that fit's live state once it has taken a step, so a callback
        that saves or copies ``self.model`` saves the state that goes with its weights, as in Keras
        (each read then copies the moments out of the runtime: read it once per save)."""
        live = self._live_state() if self._live_state is not None else None
        return live if live is not None else self._train_state

    @train_state.setter
    def train_state(self, value) -> None:
        self._train_state = value

    # -- the edit log: weights set since a running fit last took them ------------------------------
    def _take_edits(self) -> set[str]:
        """The names of the weights set since the last take (``set_weights``, a layer's own, or
        through another model sharing the layer; :class:`~ortrain.nn.layers.Weights` records them),
        forgotten once taken. No scan of the layers when no weight was set anywhere since."""
        if EDITS[0] == self._edits_seen:
            return set()
        self._edits_seen = EDITS[0]
        names = set()
        for lyr in self.layers:
            if lyr.weights.changed:
                names.update(f"{lyr.name}.{k}" for k in lyr.weights.changed)
                lyr.weights.changed.clear()
        return names

    def _keep_edits(self, names: set[str]) -> None:
        """Put back edits taken but not yet acted on."""
        layers = {lyr.name: lyr for lyr in self.layers}
        for name in names:
            layer_name, key = name.rsplit(".", 1)
            layers[layer_name].weights.changed.add(key)
        if names:
            EDITS[0] += 1

    def _name_layers(self) -> None:
        counts: dict[str, int] = {}
        taken = {lyr.name for lyr in self.layers if lyr.name}
        for lyr in self.layers:
            if lyr.name is None:
                base = _snake(type(lyr).__name__)
                while True:
                    n = counts.get(base, 0)
                    counts[base] = n + 1
                    candidate = f"{base}_{n}"
                    if candidate not in taken:
                        break
                lyr.name = candidate
                taken.add(candidate)
        names = [lyr.name for lyr in self.layers]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise OrtrainError(f"layer names must be unique within a model; repeated: {', '.join(sorted(dup))}")

    # -- parameters -----------------------------------------------------------------------
    def _base_params(self) -> list[ParamSpec]:
        return [ParamSpec(f"{lyr.name}.{s}", a.shape, a.dtype, lyr.roles[s])
                for lyr in self.layers for s, a in lyr.weights.items()]

    def _weight_table(self) -> dict[str, np.ndarray]:
        return {f"{lyr.name}.{s}": a for lyr in self.layers for s, a in lyr.weights.items()}

    def _store_weight(self, name: str, value: np.ndarray) -> None:
        layer_name, suffix = name.rsplit(".", 1)
        for lyr in self.layers:
            if lyr.name == layer_name:
                lyr.weights.put(suffix, value)  # counted as a change: models sharing the layer see it
                return
        raise KeyError(name)

    def params(self) -> list[ParamSpec]:
        """Weights in documented order, with their current roles (freezing applied)."""
        out = []
        for p in self._base_params():
            role = p.role
            if role == "trainable" and p.name in self._frozen:
                role = "frozen"
            out.append(ParamSpec(p.name, tuple(p.shape), p.dtype, role))
        return out

    def weight_names(self) -> list[str]:
        return [p.name for p in self._base_params()]

    def get_weights(self) -> list[np.ndarray]:
        table = self._weight_table()
        return [table[n].copy() for n in self.weight_names()]

    def set_weights(self, weights) -> None:
        """Replace weights from a list (``weight_names()`` order) or a dict keyed by weight name.

        Everything is checked before anything changes.
        """
        names = self.weight_names()
        table = self._weight_table()
        if isinstance(weights, Mapping):
            unknown = sorted(set(weights) - set(names))
            if unknown:
                raise OrtrainError(f"set_weights: unknown weight names {unknown}; the model has {names}")
            items = [(k, weights[k]) for k in weights]
        else:
            if weights is None or isinstance(weights, (str, bytes, np.ndarray)) or not hasattr(weights, "__iter__"):
                raise OrtrainError(f"set_weights: expected a list of arrays in weight_names() order or a dict "
                                   f"keyed by weight name, received {type(weights).__name__}")
            weights = list(weights)
            if len(weights) != len(names):
                raise OrtrainError(f"set_weights: expected {len(names)} arrays ({', '.join(names)}), "
                                   f"received {len(weights)}")
            items = list(zip(names, weights))
        staged = []
        for name, value in items:
            a = as_array(value, table[name].dtype, f"set_weights[{name!r}]")
            if a.shape == () and table[name].shape == (1,):  # a trainable scalar is kept with shape (1,)
                a = a.reshape(1)
            if a.shape != table[name].shape:
                raise ShapeError(f"set_weights: {name!r} expected shape {describe_shape(table[name].shape)}, "
                                 f"received {describe_shape(a.shape)}")
            staged.append((name, a.copy()))
        for name, a in staged:
            self._store_weight(name, a)  # recorded as an edit, which a fit in progress takes over
        self._changed()

    def _changed(self) -> None:
        self._version += 1
        self._runners.clear()

    def _weights_stamp(self) -> tuple:
        """Changes whenever the weights do, also through another model that shares a layer."""
        return (self._version, *(getattr(lyr, "_stored", 0) for lyr in getattr(self, "layers", ())))

    def weights_digest(self) -> str:
        """sha256 of the weights, remembered until ``set_weights`` (or training) changes them: a
        cache hit on ResNet-50's artifacts would otherwise spend most of its time hashing 100 MB."""
        memo = getattr(self, "_digest", None)
        if memo is None or memo[0] != self._weights_stamp():
            self._digest = memo = (self._weights_stamp(), self.forward_graph().weights_digest())
        return memo[1]

    # -- the forward graph ----------------------------------------------------------------
    @property
    def input_specs(self) -> list[TensorSpec]:
        return [TensorSpec(self._input_name(i), t.dtype, t.shape) for i, t in enumerate(self._inputs)]

    @property
    def output_specs(self) -> list[TensorSpec]:
        return [TensorSpec(self._output_name(i), np.float32, t.shape) for i, t in enumerate(self._outputs)]

    def index_bounds(self) -> dict[str, tuple[int, int, str]]:
        """For each input read as row indices of a table: ``(lowest, highest, what)`` it allows.

        An ``Embedding`` fed straight from a model input takes indices in ``[0, input_dim - 1]``, as
        in Keras and PyTorch; onnxruntime would fail on a larger one deep in a step and wrap a
        negative one into another row.
        """
        from ortrain.nn.layers import Embedding
        names = {id(t): self._input_name(i) for i, t in enumerate(self._inputs)}
        bounds: dict[str, tuple[int, int, str]] = {}
        for node in self._nodes:
            name = names.get(id(node.inputs[0])) if isinstance(node.layer, Embedding) else None
            if name is not None and (name not in bounds or node.layer.input_dim - 1 < bounds[name][1]):
                bounds[name] = (0, node.layer.input_dim - 1, f"Embedding {node.layer.name!r}")
        return bounds

    def _input_name(self, i: int) -> str:
        t = self._inputs[i]
        return t.name or ("input" if len(self._inputs) == 1 else f"input_{i}")

    def _output_name(self, i: int) -> str:
        return "output" if len(self._outputs) == 1 else f"output_{i}"

    def _base_proto(self):
        gb = GraphBuilder(name=self.name)
        values = {}
        for i, t in enumerate(self._inputs):
            values[id(t)] = gb.add_input(self._input_name(i), t.dtype, t.shape)
        for p in self._base_params():
            gb.add_input(p.name, p.dtype, p.shape)
        ctx = EmitContext(gb)
        for node in self._nodes:
            ctx.output_shape = node.output.shape
            with gb.scope(node.layer.name):
                values[id(node.output)] = node.layer.emit(ctx, [values[id(t)] for t in node.inputs])
        for i, t in enumerate(self._outputs):
            gb.op("Identity", [values[id(t)]], outputs=[self._output_name(i)])
            gb.add_output(self._output_name(i), np.float32, t.shape)
        return gb.to_model(doc=f"ortrain model {self.name}", check=False)

    def forward_graph(self) -> ForwardGraph:
        proto = freeze_batchnorm_stats(self._base_proto(), self._frozen_stats)
        weights = self._weight_table()
        fg = ForwardGraph(proto, tuple(self.params()), weights)
        return fg

    # -- freezing ---------------------------------------------------------------------------
    def _resolve(self, what, verb: str) -> list[str]:
        items = what if isinstance(what, (list, tuple, set)) else [what]
        names = self.weight_names()
        layer_names = {lyr.name: lyr for lyr in getattr(self, "layers", [])}
        out = []
        for item in items:
            if isinstance(item, Layer):
                if all(item is not lyr for lyr in layer_names.values()):
                    named = f"layer {item.name!r}" if item.name else f"a {type(item).__name__} layer"
                    raise OrtrainError(f"{verb}: {named} is not part of this model; pass this model's layers "
                                       f"or weight names ({', '.join(layer_names)})")
                out += [f"{item.name}.{s}" for s in item.weights]
            elif isinstance(item, str) and item in layer_names:
                out += [f"{item}.{s}" for s in layer_names[item].weights]
            elif isinstance(item, str):
                hits = [n for n in names if fnmatch.fnmatchcase(n, item)]
                if not hits:
                    raise OrtrainError(f"{verb}: {item!r} matches no layer or weight; weights are "
                                       f"{', '.join(names)}")
                out += hits
            else:
                raise OrtrainError(f"{verb}: expected layers, layer names, weight names or glob patterns, "
                                   f"received {item!r}")
        return out

    def _bn_stat_pairs(self) -> dict[str, str]:
        """running_var name -> running_mean name for every batch norm of the graph."""
        return {n.input[4]: n.input[3] for n in batchnorm_nodes(self._base_proto())}

    def freeze(self, names_or_layers) -> None:
        """Stop training these weights (layers, layer names, weight names or glob patterns).

        A frozen batch-norm layer also keeps its running statistics fixed (Keras' behaviour).
        """
        resolved = self._resolve(names_or_layers, "freeze")
        roles = {p.name: p.role for p in self._base_params()}
        pairs = self._bn_stat_pairs()
        means = set(pairs.values())
        for n in resolved:
            if roles[n] == "trainable":
                self._frozen.add(n)
            elif n in means:
                self._frozen_stats.add(n)
            elif n in pairs:
                self._frozen_stats.add(pairs[n])
        self._changed()

    def unfreeze(self, names_or_layers) -> None:
        resolved = self._resolve(names_or_layers, "unfreeze")
        pairs = self._bn_stat_pairs()
        for n in resolved:
            self._frozen.discard(n)
            self._frozen_stats.discard(n)
            self._frozen_stats.discard(pairs.get(n, ""))
        self._changed()

    def freeze_bn_stats(self) -> None:
        """Batch norms normalise by their running statistics in training too and stop updating them."""
        self._frozen_stats = {n.input[3] for n in batchnorm_nodes(self._base_proto())}
        self._changed()

    def unfreeze_bn_stats(self) -> None:
        self._frozen_stats = set()
        self._changed()

    @property
    def trainable_weight_names(self) -> list[str]:
        return [p.name for p in self.params() if p.role == "trainable"]

    # -- compile / fit --------------------------------------------------------------------
    def compile(self, optimizer="adam", loss="mse", metrics=None) -> Model:
        """Choose the optimizer, loss and metrics. A new compile starts optimizer state afresh.

        All three are checked before any is set: a refused compile leaves the model as it was.
        """
        new_optimizer = optim.get(optimizer)
        new_loss = losses.get(loss)
        if metrics is not None and not isinstance(metrics, (str, list, tuple)):
            raise OrtrainError(f"metrics: expected a list of names such as ['accuracy'], received {metrics!r}")
        new_metrics = [metrics] if isinstance(metrics, str) else list(metrics or [])
        metrics_mod.resolve(new_metrics, new_loss)  # validate names now
        first = self.output_specs[0]
        if np.dtype(first.dtype) != np.float32:
            names = ", ".join(f"{s.name!r} ({np.dtype(s.dtype).name})" for s in self.output_specs)
            raise OrtrainError(f"compile: the loss is computed on the model's first output, which must be float32; "
                               f"the outputs are {names}. Make a float output the first one (e.g. return the "
                               "logits before the arg-max)")
        if not first.shape:
            raise OrtrainError(f"compile: the loss is computed on the model's first output, which has no batch "
                               f"dimension ({first.name!r} has shape ()); ortrain trains outputs with one row per "
                               "input row. Keep the batch axis in the model (e.g. keepdims=1, or reduce over the "
                               "other axes only)")
        self.optimizer, self.loss, self.metrics = new_optimizer, new_loss, new_metrics
        self.train_state = None
        new_optimizer._lr_now = ShownRate(self, new_optimizer)
        self._runners.clear()  # evaluate's graph holds the loss
        return self

    @property
    def compiled(self) -> bool:
        return self.loss is not None and self.optimizer is not None

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose=1, callbacks=None, validation_split=0.0,
            validation_data=None, shuffle=True, sample_weight=None, initial_epoch=0, steps_per_epoch=None,
            validation_steps=None, class_weight=None, validation_freq=1):
        """Train on arrays (``x`` and ``y``) or on a generator (``x`` alone, see
        :func:`ortrain.fit_generator`), as Keras' ``fit``: ``batch_size`` (32 by default) rows a
        step, a shorter last batch included; ``validation_split`` holds out the last rows, before
        shuffling; ``validation_data`` arrays or a generator; ``sample_weight`` weights each
        sample's loss and metrics; ``shuffle`` redraws the order every epoch (reproducibly after
        ``ot.set_seed``); ``initial_epoch``/``epochs`` run epochs ``initial_epoch .. epochs-1``;
        ``class_weight`` (``{class index: weight}``, for cross-entropy losses) multiplies each
        training sample's weight by its class's, validation left unweighted; ``validation_freq``
        validates after every ``n``-th epoch (an int) or after the listed epochs (counted from 1),
        and epochs without validation log no ``val_`` values (NaN in the History). Details in
        :func:`ortrain.fit.fit_model`. Returns the :class:`History`; a later ``fit`` continues
        with the same optimizer state."""
        from ortrain.fit import fit_model
        return fit_model(self, x, y, batch_size=batch_size, epochs=epochs, verbose=verbose, callbacks=callbacks,
                         validation_split=validation_split, validation_data=validation_data, shuffle=shuffle,
                         sample_weight=sample_weight, initial_epoch=initial_epoch,
                         steps_per_epoch=steps_per_epoch, validation_steps=validation_steps,
                         class_weight=class_weight, validation_freq=validation_freq)

    # -- inference --------------------------------------------------------------------------
    def _runner(self, kind: str = "predict", weighting=None):
        key = (kind, weighting, self._weights_stamp())
        runner = self._runners.get(key)
        if runner is None:
            from ortrain import engine
            from ortrain.artifacts import loss_model
            from ortrain.graph.forward import to_inference
            fg = self.forward_graph()
            if kind == "predict":
                proto = to_inference(fg.proto)
            else:
                if self.loss is None:
                    raise OrtrainError("evaluate needs a loss: call model.compile(...) first")
                proto = to_inference(loss_model(fg, self.loss, weighting)[0])
            proto = with_weights(proto, fg.weights)
            runner = engine.InferenceRunner(proto)
            self._runners = {key: runner, **{k: v for k, v in self._runners.items() if k[2] == key[2]}}
        return runner

    def predict(self, x, batch_size=None, verbose=0) -> np.ndarray | list[np.ndarray]:
        """Outputs for any number of rows, in inference mode (no dropout, running batch-norm statistics).

        One array for a single-output model, a list in output order otherwise. ``batch_size``
        (a positive int) bounds the rows per run; ``None`` runs all rows at once. ``verbose`` is
        accepted for Keras code and shows nothing.
        """
        positive_int(batch_size, "batch_size", allow_none=True)
        xs = prepare_inputs(self.input_specs, x, "x", bounds=self.index_bounds())
        outs = run_chunks(self._runner("predict"), self.input_specs, xs, None, batch_size)
        return outs[0] if len(outs) == 1 else outs

    def evaluate(self, x, y, batch_size=None, sample_weight=None, verbose=0) -> dict:
        """Mean loss and metrics over all rows (``{"loss": ..., "accuracy": ...}``), in inference mode.

        Everything is checked before the first run: shapes, and class labels against the number
        of classes for sparse cross-entropy. ``verbose`` is accepted for Keras code and shows nothing.
        """
        from ortrain.artifacts import LABEL, LOSS, LOSS_SCALE, SAMPLE_WEIGHT
        positive_int(batch_size, "batch_size", allow_none=True)
        xs, yl, w = prepare_arrays(self, x, y, sample_weight, "x", "y", "sample_weight")
        refuse_non_finite_weights(w, "sample_weight", "nothing was evaluated")
        n = xs[0].shape[0]
        runner = self._runner("evaluate", None if w is None else "sample")
        specs = self.input_specs
        ms = metrics_mod.resolve(self.metrics, self.loss)
        total = 0.0
        for sl in row_slices(n, batch_size):
            feeds = {s.name: a[sl] for s, a in zip(specs, xs)}
            feeds[LABEL] = yl[sl]
            feeds[LOSS_SCALE] = np.array(1.0, np.float32)
            if w is not None:
                feeds[SAMPLE_WEIGHT] = w[sl]
            loss, pred = runner.run(feeds, [LOSS, self.output_specs[0].name])
            total += float(loss) * pred.shape[0]
            for m in ms:
                m.update(pred, yl[sl], None if w is None else w[sl])
        return {"loss": total / n, **{m.name: m.result() for m in ms}}

    def _n_classes(self, input_shapes=None) -> int | None:
        """How many classes an integer label of the loss indexes (None: labels are no class indices,
        or their number is not known). From the first output's declared width, else, where that is
        free and ``input_shapes`` are given, from its width at those input sizes
        (:meth:`_output_shape_for`)."""
        loss = self.loss
        n = loss.n_classes(self.output_specs[0].shape)
        if n is None and input_shapes is not None and loss.class_labels:
            shape = self._output_shape_for(input_shapes)
            n = None if shape is None else loss.n_classes(shape)
        return n

    def _output_shape_for(self, input_shapes) -> tuple | None:
        """The first output's shape for inputs of ``input_shapes`` (free dimensions None)."""
        return tuple(self.output_specs[0].shape)

    def _label_spec(self) -> TensorSpec:
        """The loss's label input for this model's first output."""
        if self.loss is None:
            raise OrtrainError("the model is not compiled: call model.compile(optimizer=..., loss=...) first")
        pred = self.output_specs[0]
        return TensorSpec("y", self.loss.label_dtype, self.loss.label_shape(pred.shape))

    # -- export and persistence --------------------------------------------------------------
    def export_onnx(self, path) -> str:
        """Write an inference graph (no loss, no dropout, running batch-norm statistics, free batch size)."""
        import onnx

        from ortrain.graph.forward import to_inference
        path = checked_target(path, "export_onnx(path)")
        fg = self.forward_graph()
        # From the graph before freezing: batch norms with frozen statistics stay BatchNormalization
        # nodes (the same outputs in inference), so an importer still sees their statistics as such.
        proto = with_weights(to_inference(self._base_proto()), fg.weights)
        proto.doc_string = f"Exported by ortrain from model {self.name!r}"
        check_model(proto, "exported model")
        with atomic_path(path, "export_onnx(path)") as tmp:
            onnx.save(proto, tmp)
        return str(path)

    def save(self, path) -> str:
        """Architecture, weights, compile settings and optimizer state in one zip file (no pickle)."""
        from ortrain.nn.saving import save_model
        return save_model(self, path)

    def copy(self) -> Model:
        """An independent model with the same architecture, weights, freezing and compile settings."""
        return self._copy_with(None)

    def _copy_with(self, weights: dict[str, np.ndarray] | None) -> Model:
        """A copy of this model holding ``weights`` (name -> array, taken as given where the model
        keeps arrays as they come) instead of copies of its own: one copy of the weights, not two."""
        from ortrain.nn.saving import model_from_record, model_record
        record, own, aux = model_record(self, with_weights=weights is None)
        return model_from_record(record, own if weights is None else weights, aux)

    def summary(self, print_fn=print) -> None:
        """Print each layer once (a shared layer too, as Keras does: its calls see one shape) and
        the parameter counts, through ``print_fn``."""
        check_print_fn(print_fn)
        rows = [("Layer (type)", "Output shape", "Params")]
        for lyr in self.layers:
            shape = next(node.output.shape for node in self._nodes if node.layer is lyr)
            n = sum(int(np.prod(a.shape)) for a in lyr.weights.values())
            rows.append((f"{lyr.name} ({type(lyr).__name__})", describe_shape(shape), str(n)))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        for r in rows:
            print_fn("  ".join(c.ljust(w) for c, w in zip(r, widths)))
        ps = self.params()
        total = sum(int(np.prod(p.shape)) for p in ps)
        trainable = sum(int(np.prod(p.shape)) for p in ps if p.role == "trainable")
        print_fn(f"Total params: {total}  trainable: {trainable}  non-trainable: {total - trainable}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}: {len(self.weight_names())} weights>"


class Sequential(Model):
    """A stack of single-input layers: ``ot.Sequential([Dense(8, activation="relu"), Dense(2)], input_shape=(4,))``."""

    def __init__(self, layers=None, input_shape=None, name: str | None = None, seed: int | None = None,
                 input_dtype=None):
        if isinstance(layers, (Layer, str, bytes, Mapping)) or (layers is not None and not hasattr(layers, "__iter__")):
            fix = "; wrap a single layer in a list" if isinstance(layers, Layer) else ""
            raise OrtrainError(f"Sequential(layers=...): expected a list of layers, received "
                               f"{type(layers).__name__}{fix}")
        layers = list(layers or [])
        for lyr in layers:
            if not isinstance(lyr, Layer):
                raise OrtrainError(f"Sequential: expected ot.layers objects, received {lyr!r}")
            if lyr.n_inputs != 1:
                raise OrtrainError(f"Sequential: {type(lyr).__name__} merges several inputs; use the functional "
                                   "API (ot.Input / ot.Model) for branches")
        if not layers:
            raise OrtrainError("Sequential needs at least one layer")
        if input_shape is None:
            raise OrtrainError("Sequential(..., input_shape=...) is required: give the shape of one sample, "
                               "e.g. input_shape=(4,) for 4 features")
        dtype = input_dtype or layers[0].input_dtype
        seed = checked_int(seed, "Sequential(seed=...)", minimum=0, allow_none=True)
        rng = _random.generator(seed)
        x = inp = Input(input_shape, dtype=dtype)
        for lyr in layers:
            if not lyr.built_for and lyr.seed is None:
                lyr.build([x.shape], rng)
            x = lyr(x)
        super().__init__(inp, x, name=name or "sequential")
        self._seed = seed
