"""The model: :class:`Model`, a functional graph of layers and what every model can do
(weights, freezing, the forward graph, export, summary); training comes from
:class:`~ortrain.nn.training.TrainingMixin`.

A model compiles to a :class:`~ortrain.graph.forward.ForwardGraph`; training goes
through :class:`ortrain.Trainer` (``fit`` drives one), prediction and evaluation run
the forward graph in a plain ``InferenceSession``.
"""

from __future__ import annotations

import collections
import re
import zipfile

import numpy as np
import onnx

from ortrain._arrays import InputBounds, checked_flag, is_integer, staged_weights
from ortrain._files import atomic_path, checked_target
from ortrain._keywords import (
    name_unknown_arguments,
    names_unknown_arguments_of,
    names_unknown_arguments_of_methods,
)
from ortrain._names import picked
from ortrain._version import __version__
from ortrain._warnings import warn
from ortrain.errors import OrtrainError, describe_shape
from ortrain.graph import GraphBuilder, TensorSpec, check_model
from ortrain.graph.forward import ForwardGraph, ParamSpec, reserved_input_name, to_inference, with_weights
from ortrain.graph.passes import batchnorm_nodes, freeze_batchnorm_stats, name_free_dimensions
from ortrain.graph.repairs import activations_as_arithmetic
from ortrain.metrics import logged_names as metrics_logged_names
from ortrain.nn import training as _training
from ortrain.nn.base_layer import FREEZES, WEIGHTS_LOCK, EmitContext, Layer, sync_live
from ortrain.nn.core_layers import Embedding
from ortrain.nn.saving import model_from_record, model_record, save_model
from ortrain.nn.sizes import SizeCheck
from ortrain.nn.symbolic import SymbolicTensor, _topological
from ortrain.nn.training import TrainingMixin

__all__ = ["Model"]


def check_print_fn(print_fn) -> None:
    if not callable(print_fn):
        raise OrtrainError(f"summary(print_fn=...): expected a function taking a line, such as print, received "
                           f"{print_fn!r}")


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", name).lower().replace("2_d", "2d")


def checked_model_name(name, where: str) -> None:
    """A model's name goes into its ONNX files: a non-empty string, or None for the default."""
    if name is not None and (not isinstance(name, str) or not name):
        raise OrtrainError(f"{where}(name=...): expected a non-empty string (or None for the default name), "
                           f"received {name!r}")


class Model(TrainingMixin):
    """A functional model: ``ot.Model(inputs, outputs)`` over tensors from ``ot.Input`` and layer calls."""

    def __init__(self, inputs, outputs, name: str | None = None):
        checked_model_name(name, "Model")
        for argument, given in (("inputs", inputs), ("outputs", outputs)):
            if isinstance(given, dict):  # Keras' models keyed by name
                raise OrtrainError(f"Model({argument}=...): received a dict (keys {sorted(map(str, given))}); pass a "
                                   f"list of tensors in {argument[:-1]} order (a model keyed by name is not supported; "
                                   "data may still be given as a dict keyed by input name)")
            if isinstance(given, (list, tuple)) and any(isinstance(t, (list, tuple, dict)) for t in given):
                raise OrtrainError(f"Model({argument}=...): received a nested structure; pass a flat list of tensors")
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
        self.__dict__.pop("_sizes_for", None)  # (Sequential's add and pop come here again)
        self.layers: list[Layer] = list({id(node.layer): node.layer for node in nodes}.values())  # first calls' order
        self._name_layers()
        self._check_input_names()
        self._given_input_names = tuple(t.name for t in self._inputs)
        for lyr in self.layers:  # from here on a layer's name keys this model's weights
            lyr._in_model = True

    def _check_input_names(self) -> None:
        """Input names become graph names: they must differ from each other, the outputs' and
        the weights'."""
        names = [self._input_name(i) for i in range(len(self._inputs))]
        taken = {self._output_name(i) for i in range(len(self._outputs))} | set(self.weight_names())
        for i, n in enumerate(names):
            if n in names[:i] or n in taken:
                what = "another input's" if n in names[:i] else "an output's or a weight's"
                raise OrtrainError(f"Model: input name {n!r} is {what} name; give ot.Input(..., name=...) a name "
                                   "of its own")
            why = reserved_input_name(n)
            if why:
                raise OrtrainError(f"Model: input name {n!r}: {why}; give ot.Input(..., name=...) another name")

    # -- construction helpers -----------------------------------------------------------
    def _init_state(self, name: str) -> None:
        self.name = name
        self._frozen: set[str] = set()
        self._frozen_stats: set[str] = set()  # running-mean names of batch norms in inference form
        self._layer_frozen_stats: set[str] = set()  # of those, the layers frozen with freeze()
        self._version = 0
        self._init_training_state()

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
                lyr._auto_named = True
                taken.add(candidate)
        names = collections.Counter(lyr.name for lyr in self.layers)
        dup = {n for n, count in names.items() if count > 1}
        if dup:
            automatic = [n for n in sorted(dup) if any(lyr.name == n and lyr.__dict__.get("_auto_named")
                                                       for lyr in self.layers)]
            fix = (f" ({', '.join(automatic)}: names a model gave its layers, each model numbering its own from 0; "
                   f"name the layers when creating them, e.g. Dense(8, name='gen_dense_0'))") if automatic else \
                "; name the layers apart when creating them"
            raise OrtrainError(f"layer names must be unique within a model; repeated: {', '.join(sorted(dup))}{fix}")

    # -- parameters -----------------------------------------------------------------------
    def _base_params(self) -> list[ParamSpec]:
        return [ParamSpec(f"{lyr.name}.{s}", a.shape, a.dtype, lyr.roles[s])
                for lyr in self.layers for s, a in lyr.weights.items()]

    def _weight_table(self) -> dict[str, np.ndarray]:
        sync_live(self)
        with WEIGHTS_LOCK:
            return {f"{lyr.name}.{s}": a for lyr in self.layers for s, a in lyr.weights.items()}

    def _store_weights(self, staged) -> None:
        """``(name, array)`` pairs into the layers' weights, found by name once (a scan of the layers
        for each weight made set_weights quadratic in depth)."""
        layers = {lyr.name: lyr for lyr in self.layers}
        for name, value in staged:
            layer_name, suffix = name.rsplit(".", 1)
            layers[layer_name].weights.put(suffix, value)  # counted as a change: models sharing the layer see it

    def params(self) -> list[ParamSpec]:
        """Weights in documented order, with their current roles (freezing applied: ``freeze`` and
        layers set ``trainable = False``)."""
        out = []
        held = self._untrainable_layers_weights()
        for p in self._base_params():
            role = p.role
            if role == "trainable" and (p.name in self._frozen or p.name in held):
                role = "frozen"
            out.append(ParamSpec(p.name, tuple(p.shape), p.dtype, role))
        return out

    @property
    def trainable(self) -> bool:
        """Keras' switch for a whole model: ``model.trainable = False`` sets every layer's
        ``trainable`` (a model imported with ``from_onnx``, which has no layers, freezes all its
        weights instead); ``True`` lets every weight train, undoing ``model.freeze`` as well, the
        statistics of the batch norms it froze included (also where ``freeze_bn_stats()`` froze
        them too; the others it froze stay). Weights frozen when the model was imported stay
        frozen, with a warning. Reads whether any layer, or any weight, still trains."""
        if self.layers:
            return any(lyr.trainable for lyr in self.layers)
        return bool(self.trainable_weight_names)

    @trainable.setter
    def trainable(self, value) -> None:
        value = checked_flag(value, f"model {self.name!r}: trainable")
        for lyr in self.layers:
            lyr.trainable = value
        if value:  # everything trains, what model.freeze froze too
            self._warn_held(self.weight_names(), "model.trainable = True")
            self._frozen_stats -= self._layer_frozen_stats
            self._layer_frozen_stats.clear()
            self._frozen.clear()
            self._changed()
            FREEZES[0] += 1
        elif not self.layers:
            self.freeze("*")

    def _untrainable_layers_weights(self) -> set[str]:
        """The weights of the layers set ``trainable = False``."""
        return {f"{lyr.name}.{s}" for lyr in self.layers if not lyr.trainable for s in lyr.weights}

    def get_layer(self, name: str | None = None, index: int | None = None) -> Layer:
        """A layer by name or by index in :attr:`layers`, as Keras' ``get_layer``."""
        if (name is None) == (index is None):
            raise OrtrainError(f"get_layer: expected name=... or index=..., one of them, received name={name!r} and "
                               f"index={index!r}")
        if index is not None:
            n = len(self.layers)
            if not is_integer(index) or not -n <= index < n:
                raise OrtrainError(f"get_layer(index=...): expected an int in [-{n}, {n}) (this model has {n} layers), "
                                   f"received {index!r}")
            return self.layers[int(index)]
        for lyr in self.layers:
            if lyr.name == name:
                return lyr
        raise OrtrainError(f"get_layer: no layer named {name!r}; the layers are "
                           f"{', '.join(repr(lyr.name) for lyr in self.layers) or 'none'}")

    def count_params(self, trainable_only: bool = False) -> int:
        """How many numbers the weights hold, trainable or not (Keras counts a batch norm's
        running statistics too); ``trainable_only`` counts the trainable ones."""
        checked_flag(trainable_only, "count_params(trainable_only=...)")
        return int(sum(int(np.prod(p.shape, dtype=np.int64)) for p in self.params()
                       if not trainable_only or p.role == "trainable"))

    def weight_names(self) -> list[str]:
        """The names of every weight (trainable, frozen, batch-norm statistics), in
        :meth:`get_weights` order: ``"<layer name>.<weight>"`` (e.g. ``"dense_0.kernel"``) for a
        model of layers; the ONNX initializers' names for a model from :func:`ortrain.from_onnx`."""
        return [p.name for p in self._base_params()]

    def get_weights(self) -> list[np.ndarray]:
        """Copies of every weight, frozen ones and batch-norm statistics included, in layer order,
        each layer's in a fixed order: ``Dense`` kernel ``(in, out)`` then bias; ``Conv2D`` kernel
        ``(filters, channels, kh, kw)`` then bias; ``BatchNorm`` gamma, beta, running_mean,
        running_var; ``LayerNorm`` gamma, beta. :meth:`weight_names` names them in the same order,
        and :meth:`set_weights` takes a list in it. A model from :func:`ortrain.from_onnx` keeps
        the file's order (a PyTorch export's ``state_dict`` order)."""
        table = self._weight_table()
        return [table[n].copy() for n in self.weight_names()]

    def set_weights(self, weights) -> None:
        """Replace weights from a list (``weight_names()`` order) or a dict keyed by weight name.

        Everything is checked before anything changes.
        """
        names = self.weight_names()
        table = self._weight_table()
        staged = staged_weights(weights, {n: (table[n].shape, table[n].dtype) for n in names},
                                f"the model has {names}")
        with WEIGHTS_LOCK:  # a prediction or get_weights in another thread sees all old or all new
            self._store_weights(staged)  # recorded as edits, which a fit in progress takes over
            self._changed()

    def _take_trained(self, weights: dict[str, np.ndarray]) -> None:
        """Weights by name, fresh arrays a trainer read out of its session (of the weights' shapes and
        dtypes): stored as :meth:`set_weights` stores them, without its checks and copies."""
        with WEIGHTS_LOCK:
            self._store_weights(weights.items())
            self._changed()

    def _changed(self) -> None:
        self._version += 1
        self._runners.clear()

    def _weights_stamp(self) -> tuple:
        """Changes whenever the weights do, also through another model that shares a layer (one
        in a fit: its layers' weights are brought over first)."""
        sync_live(self)
        for lyr in getattr(self, "layers", ()):
            sync_live(lyr)
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
        return [TensorSpec(self._output_name(i), t.dtype, t.shape) for i, t in enumerate(self._outputs)]

    def index_bounds(self) -> dict[str, tuple[int, int, str]]:
        """For each input read as row indices of a table: ``(lowest, highest, what)`` it allows.

        An ``Embedding`` fed straight from a model input takes indices in ``[0, input_dim - 1]``, as
        in Keras and PyTorch; onnxruntime would fail on a larger one deep in a step and wrap a
        negative one into another row. With free input sizes, the dict's ``sizes`` also checks each
        call's sizes against the layers (:class:`~ortrain.nn.sizes.SizeCheck`).
        """
        names = {id(t): self._input_name(i) for i, t in enumerate(self._inputs)}
        bounds = InputBounds()
        for node in self._nodes:
            name = names.get(id(node.inputs[0])) if isinstance(node.layer, Embedding) else None
            if name is not None and (name not in bounds or node.layer.input_dim - 1 < bounds[name][1]):
                bounds[name] = (0, node.layer.input_dim - 1, f"Embedding {node.layer.name!r}")
        bounds.sizes = self._size_check()
        return bounds

    def _size_check(self) -> SizeCheck | None:
        """Where an input has free sizes after the batch: the check of each call's sizes against the
        layers, made once for this graph of layers (``Model.__init__`` drops it)."""
        if not any(None in t.shape[1:] for t in self._inputs):
            return None
        check = self.__dict__.get("_sizes_for")
        if check is None:
            check = self.__dict__["_sizes_for"] = SizeCheck(self)
        return check

    def _given_input_name(self, i: int) -> str | None:
        """The name ``ot.Input`` had when the model was built (an Input renamed later does not rename
        the model's input), None for none."""
        given = self.__dict__.get("_given_input_names")
        return given[i] if given is not None else self._inputs[i].name

    def _input_name(self, i: int) -> str:
        return self._given_input_name(i) or ("input" if len(self._inputs) == 1 else f"input_{i}")

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
            gb.add_output(self._output_name(i), t.dtype, t.shape)
        return gb.to_model(check=False)

    def forward_graph(self) -> ForwardGraph:
        held = self._untrainable_layers_weights()
        base = self._base_proto()
        stats = self._frozen_stats | {n.input[3] for n in batchnorm_nodes(base) if n.input[3] in held}
        # activations onnxruntime-training cannot differentiate (elu, softplus...), in arithmetic
        proto, _ = activations_as_arithmetic(freeze_batchnorm_stats(base, stats))
        weights = self._weight_table()
        fg = ForwardGraph(proto, tuple(self.params()), weights)
        return fg

    # -- freezing ---------------------------------------------------------------------------
    def _resolve(self, what, verb: str) -> list[str]:
        items = what if isinstance(what, (list, tuple, set)) else [what]
        names = self.weight_names()
        known = set(names)
        layer_names = {lyr.name: lyr for lyr in getattr(self, "layers", [])}
        held = {id(lyr) for lyr in layer_names.values()}
        out = []
        for item in items:
            if isinstance(item, Layer):
                if id(item) not in held:
                    named = f"layer {item.name!r}" if item.name else f"a {type(item).__name__} layer"
                    raise OrtrainError(f"{verb}: {named} is not part of this model; pass this model's layers "
                                       f"or weight names ({', '.join(layer_names)})")
                out += [f"{item.name}.{s}" for s in item.weights]
            elif isinstance(item, str) and item in layer_names:
                out += [f"{item}.{s}" for s in layer_names[item].weights]
            elif isinstance(item, str):
                hits = [item] if item in known else picked(names, item)
                if not hits:
                    shown = f"weights are {', '.join(names)}" if names else "the model has no weights"
                    raise OrtrainError(f"{verb}: {item!r} matches no layer or weight; {shown}")
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
        self._freeze(names_or_layers, "freeze")

    def _freeze(self, names_or_layers, by: str) -> None:
        """:meth:`freeze`; ``by`` names the caller in its warnings."""
        resolved = self._resolve(names_or_layers, "freeze")
        roles = {p.name: p.role for p in self._base_params()}
        pairs = self._bn_stat_pairs()
        means = set(pairs.values())
        self._warn_one_statistic(resolved, pairs, by)
        for n in resolved:
            if roles[n] == "trainable":
                self._frozen.add(n)
            elif n in means or n in pairs:
                mean = n if n in means else pairs[n]
                self._frozen_stats.add(mean)
                self._layer_frozen_stats.add(mean)
        self._changed()
        FREEZES[0] += 1

    def unfreeze(self, names_or_layers) -> None:
        """Train these weights again (as :meth:`freeze` names them). A weight whose layer is set
        ``trainable = False`` stays frozen, with a warning that says so."""
        resolved = self._resolve(names_or_layers, "unfreeze")
        self._warn_held(resolved, "unfreeze")
        pairs = self._bn_stat_pairs()
        self._warn_one_statistic(resolved, pairs, "unfreeze")
        for n in resolved:
            self._frozen.discard(n)
            for stats in (self._frozen_stats, self._layer_frozen_stats):
                stats.discard(n)
                stats.discard(pairs.get(n, ""))
        self._changed()
        FREEZES[0] += 1

    def _warn_one_statistic(self, names, pairs: dict[str, str], verb: str) -> None:
        """A batch norm's running statistics are fixed together or not at all: say so when ``names``
        holds one without the other and that changes the other's state."""
        given = set(names)
        for var, mean in pairs.items():
            changes = (mean in self._frozen_stats) == (verb == "unfreeze")
            if (var in given) != (mean in given) and changes:
                named, other = (var, mean) if var in given else (mean, var)
                fixed = "tracked again too" if verb == "unfreeze" else "fixed too, and the layer normalises by " \
                        "them in training as well (as freeze_bn_stats does)"
                warn(f"{verb}: {named!r} is one of a batch norm's two running statistics, which are fixed together "
                     f"or not at all: {other!r} is {fixed}", UserWarning)

    def _warn_held(self, names, verb: str) -> None:
        """Name the weights among ``names`` that ``verb`` leaves frozen, and why."""
        untrainable = self._untrainable_layers_weights()
        roles = {p.name: p.role for p in self._base_params()}
        held = [n for n in dict.fromkeys(names) if n in untrainable and roles.get(n) == "trainable"]
        if held:
            layers = list(dict.fromkeys(n.rsplit(".", 1)[0] for n in held))
            warn(f"{verb}: {', '.join(map(repr, held))} stay frozen: layer{'s' if len(layers) > 1 else ''} "
                 f"{', '.join(map(repr, layers))} {'are' if len(layers) > 1 else 'is'} set trainable=False; set "
                 "layer.trainable = True (or model.trainable = True)", UserWarning)
        imported = [n for n in dict.fromkeys(names) if roles.get(n) == "frozen"]
        if imported:
            warn(f"{verb}: {', '.join(map(repr, imported[:6]))}{', ...' if len(imported) > 6 else ''} stay frozen: "
                 "they were frozen when the model was imported (from_onnx's frozen= or trainable=, or a PyTorch "
                 "buffer); import it again with trainable= naming them to train them", UserWarning)

    def freeze_bn_stats(self) -> None:
        """Batch norms normalise by their running statistics in training too and stop updating them
        (until :meth:`unfreeze_bn_stats`, or :meth:`unfreeze` of a layer)."""
        self._frozen_stats = {n.input[3] for n in batchnorm_nodes(self._base_proto())}
        self._changed()
        FREEZES[0] += 1

    def unfreeze_bn_stats(self) -> None:
        """Batch norms train their running statistics again, but for the layers frozen with
        :meth:`freeze`, which keep them fixed (Keras' behaviour) until they are unfrozen."""
        self._frozen_stats = set(self._layer_frozen_stats)
        self._changed()
        FREEZES[0] += 1

    def _frozen_layer_stats(self) -> set[str]:
        """Of the frozen statistics, those of batch-norm layers whose scale is frozen: the layers
        :meth:`freeze` froze (for a record saved before the two were told apart)."""
        scale = {n.input[3]: n.input[1] for n in batchnorm_nodes(self._base_proto())}
        return {m for m in self._frozen_stats if scale.get(m) in self._frozen}

    @property
    def trainable_weight_names(self) -> list[str]:
        return [p.name for p in self.params() if p.role == "trainable"]

    # -- Keras' attributes (arrays where Keras has variables: copies, as get_weights gives) ----------
    @property
    def weights(self) -> list[np.ndarray]:
        """Keras' ``model.weights``: every weight, in :meth:`get_weights` order."""
        return self.get_weights()

    @property
    def trainable_weights(self) -> list[np.ndarray]:
        """The weights that train (freezing applied), in :meth:`get_weights` order."""
        return self._weights_that_train(True)

    @property
    def non_trainable_weights(self) -> list[np.ndarray]:
        """The weights that do not train: frozen ones and batch-norm running statistics."""
        return self._weights_that_train(False)

    def _weights_that_train(self, train: bool) -> list[np.ndarray]:
        table, trainable = self._weight_table(), set(self.trainable_weight_names)
        return [table[n].copy() for n in self.weight_names() if (n in trainable) == train]

    @property
    def input_shape(self):
        """The input's shape with ``None`` for the batch (a list of them for several inputs)."""
        return _one_or_list([s.shape for s in self.input_specs])

    @property
    def output_shape(self):
        """The output's shape with ``None`` for the batch (a list of them for several outputs)."""
        return _one_or_list([s.shape for s in self.output_specs])

    @property
    def input_names(self) -> list[str]:
        """The inputs' names, in order: the keys of a dict of inputs (``predict({name: array})``)
        and the exported graph's input names. An ``ot.Input`` given no name is ``"input"`` in a
        model of one input and ``"input_<i>"`` in one of several (its tensor's ``.name`` stays None)."""
        return [s.name for s in self.input_specs]

    @property
    def output_names(self) -> list[str]:
        """The outputs' names, in order: ``"output"``, or ``"output_<i>"`` for several (the keys of a
        dict of labels, and the exported graph's output names); an imported model's are its graph's."""
        return [s.name for s in self.output_specs]

    @property
    def inputs(self) -> list:
        """Keras' ``model.inputs``: the ``ot.Input`` tensors (for a model built of layers)."""
        return list(self._symbolic("inputs", self.__dict__.get("_inputs")))

    @property
    def outputs(self) -> list:
        """Keras' ``model.outputs``: the output tensors (for a model built of layers)."""
        return list(self._symbolic("outputs", self.__dict__.get("_outputs")))

    @property
    def input(self):
        """Keras' ``model.input``: the input tensor, or the list of them."""
        return _one_or_list(self.inputs, shapes=False)

    @property
    def output(self):
        """Keras' ``model.output``: the output tensor, or the list of them."""
        return _one_or_list(self.outputs, shapes=False)

    def _symbolic(self, what: str, tensors):
        if tensors is None:
            raise OrtrainError(f"model.{what}: this model has no layer tensors (a model imported from ONNX, or a "
                               f"Sequential with no layer yet); model.{what[:-1]}_specs describes its {what}")
        return tensors

    @property
    def metrics_names(self) -> list[str]:
        """What ``evaluate`` reports once compiled: ``loss``, then the metrics by their given names."""
        return ["loss", *metrics_logged_names(self.metrics, self.weighted_metrics)] if self.compiled else []

    # -- export and persistence --------------------------------------------------------------
    @names_unknown_arguments_of
    def export_onnx(self, path) -> str:
        """Write an inference graph: no loss, dropout in inference mode (its nodes pass their input
        through, as in any ONNX runtime; kept so that an import trains with them again), running
        batch-norm statistics, a free batch size (an imported graph whose export fixed the batch keeps
        it: its nodes are built for that many rows). ``producer_name``/``producer_version`` name
        ortrain; ``doc_string`` names ortrain and the model on its first line, with the producer of the
        file a model was imported from (kept over a re-import of an exported file), and keeps the
        imported file's own text after it."""
        path = checked_target(path, "export_onnx(path)")
        fg = self.forward_graph()
        # From the graph before freezing: batch norms with frozen statistics stay BatchNormalization
        # nodes (the same outputs in inference), so an importer still sees their statistics as such.
        proto = name_free_dimensions(with_weights(to_inference(self._base_proto()), fg.weights))
        proto.doc_string = _exported_doc_string(proto, self.name)
        proto.producer_name, proto.producer_version = "ortrain", __version__
        check_model(proto, "exported model")
        with atomic_path(path, "export_onnx(path)") as tmp:
            onnx.save(proto, tmp)
        return str(path)

    @names_unknown_arguments_of
    def save(self, path) -> str:
        """Architecture, weights, compile settings and optimizer state in one zip file (no pickle)."""
        return save_model(self, path)

    @names_unknown_arguments_of
    def save_weights(self, path) -> str:
        """The weights alone, by name, in one ``.npz`` file (the name is kept as given), which
        :meth:`load_weights` (or ``np.load``) reads back."""
        path = checked_target(path, "save_weights(path)")
        table = self._weight_table()
        with atomic_path(path, "save_weights(path)") as tmp, open(tmp, "wb") as f:
            np.savez(f, **{n: table[n] for n in self.weight_names()})
        return str(path)

    @names_unknown_arguments_of
    def load_weights(self, path) -> None:
        """Weights from :meth:`save_weights`' file, by name, all checked before any changes (as
        ``set_weights`` with a dict: a file may hold some of the weights)."""
        not_weights = (f"load_weights: {str(path)!r} is not a weights file of save_weights (an .npz of arrays by "
                       "weight name); a whole model file is read with ot.load_model")
        damaged = (f"load_weights: {str(path)!r} cannot be read as a weights file of save_weights: it is damaged "
                   "(cut short or changed after it was written); use another copy")
        try:
            loaded = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise OrtrainError(f"load_weights: no such file {str(path)!r}") from None
        except (PermissionError, IsADirectoryError) as exc:
            raise OrtrainError(f"load_weights: {str(path)!r} cannot be read ({exc.strerror}); give a weights file "
                               "of save_weights this process may read") from None
        except (zipfile.BadZipFile, NotImplementedError) as exc:  # a zip, cut short; "zip file version 10.9"
            raise OrtrainError(f"{damaged} ({exc})") from exc
        except (OSError, ValueError) as exc:  # not numpy's format
            raise OrtrainError(f"{not_weights} ({exc})") from exc
        except EOFError:  # an empty file
            raise OrtrainError(f"{not_weights} (it is empty)") from None
        if not isinstance(loaded, np.lib.npyio.NpzFile):  # a single .npy array
            raise OrtrainError(not_weights)
        with loaded as f:
            if "model.json" in f.files or "weights.npz" in f.files:  # model.save's zip
                raise OrtrainError(not_weights)
            try:
                weights = {n: f[n] for n in f.files}
            except (OSError, ValueError, zipfile.BadZipFile, EOFError, NotImplementedError, RuntimeError) as exc:
                # a bad CRC, a cut array; a flag or method changed: zipfile's "compression method is not
                # supported" (NotImplementedError) or "is encrypted, password required" (RuntimeError)
                raise OrtrainError(f"{damaged} ({exc})") from exc
        try:
            self.set_weights(weights)
        except OrtrainError as exc:
            raise type(exc)(f"load_weights: {str(path)!r} does not fit this model: {exc}") from None

    def __call__(self, x, training: bool = False):
        """``model(x)`` on arrays: :meth:`predict`, as Keras' call in inference mode."""
        if isinstance(x, SymbolicTensor) or (isinstance(x, (list, tuple)) and x and
                                             all(isinstance(t, SymbolicTensor) for t in x)):
            raise OrtrainError("a model called on symbolic tensors (a model used as a layer inside another model) is "
                               "not supported; build one functional model from the layers: h = x; "
                               "for layer in model.layers: h = layer(h) (for a Sequential; the layers keep their "
                               "weights and are shared with this model)")
        if training:
            raise OrtrainError("model(x, training=True): a forward pass in training mode runs inside training "
                               "steps only (Trainer.step, fit); model(x) predicts in inference mode")
        return self.predict(x)

    def predict_on_batch(self, x):
        """Keras' name for :meth:`predict` on one batch."""
        return self.predict(x)

    def copy(self) -> Model:
        """An independent model with the same architecture, weights, freezing and compile settings."""
        return self._copy_with(None)

    def _copy_with(self, weights: dict[str, np.ndarray] | None) -> Model:
        """A copy of this model holding ``weights`` (name -> array, taken as given where the model
        keeps arrays as they come) instead of copies of its own: one copy of the weights, not two."""
        with self._paired():  # from another thread than a running fit's: between its steps
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
        print_fn(self._param_totals())

    def _param_totals(self) -> str:
        """The last line of :meth:`summary`."""
        total, trainable = self.count_params(), self.count_params(trainable_only=True)
        return f"Total params: {total}  trainable: {trainable}  non-trainable: {total - trainable}"

    def __repr__(self) -> str:
        try:
            return f"<{type(self).__name__} {self.name!r}: {len(self.weight_names())} weights>"
        except Exception:  # noqa: BLE001 - a repr never raises (a model whose __init__ failed half-way)
            return f"<{type(self).__name__} {self.__dict__.get('name', '?')!r}: not built>"


# TrainingMixin's annotations name Model (compile returns the model): imported there only for type
# checkers (the import would be circular), the name is set here so typing.get_type_hints resolves them.
_training.Model = Model


def _one_or_list(items: list, shapes: bool = True):
    if shapes:
        items = [(None,) + tuple(shape[1:]) if shape else tuple(shape) for shape in items]
    return items[0] if len(items) == 1 else items


name_unknown_arguments(Model)  # ot.Model(inputs, outputs, nmae=...) names the argument and what it takes
names_unknown_arguments_of_methods(Model, "get_layer", "count_params", "weight_names", "get_weights", "set_weights",
                                   "weights_digest", "index_bounds", "forward_graph", "freeze", "unfreeze",
                                   "freeze_bn_stats", "unfreeze_bn_stats", "predict_on_batch", "copy", "summary")


# the model's name as repr writes it; text after it on the line is the user's, and so is the line
_PROVENANCE = re.compile(r"Exported by ortrain \S+ from model (?:'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\")"
                         r"(?: \(imported from a file by (?P<source>.*)\))?")


def _exported_doc_string(proto: onnx.ModelProto, name: str) -> str:
    """An exported file's ``doc_string``: a line naming ortrain, the model and the producer of the file
    it came from (carried over from an earlier export's line), then the file's own text."""
    first, _, rest = proto.doc_string.partition("\n")
    earlier = _PROVENANCE.fullmatch(first) if proto.producer_name == "ortrain" else None
    if earlier is not None:
        source, text = earlier.group("source"), rest.strip("\n")
    else:
        source = " ".join(p for p in (proto.producer_name, proto.producer_version) if p) \
            if proto.producer_name != "ortrain" else None
        text = proto.doc_string.strip("\n")
    line = f"Exported by ortrain {__version__} from model {name!r}" + \
        (f" (imported from a file by {source})" if source else "")
    return f"{line}\n\n{text}" if text.strip() else line
