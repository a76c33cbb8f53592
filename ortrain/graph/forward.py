"""The forward graph every model compiles to, and pure passes over it.

A :class:`ForwardGraph` is the one description the artifact builder, the trainer
and the exporters share, whatever the model came from (layers, a traced function,
an ``.onnx`` file). Its ONNX graph is in *training flavour* (dropout nodes carry a
``training_mode`` input) and holds every parameter as a **graph input**, not an
initializer: the weights live beside it in ``weights``. That keeps the graph small
and its digest independent of the weight values, so the artifact cache keys on the
architecture, and it is exactly the form onnxruntime-training's sessions take.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.errors import OrtrainError
from ortrain.graph.builder import GraphBuilder, TensorSpec, check_model, spec_of
from ortrain.graph.passes import node_inputs
from ortrain.graph.tensor_forms import matmul_vectors_as_matrices

ROLES = ("trainable", "frozen", "buffer")


@dataclass(frozen=True)
class ParamSpec:
    """A weight of the model. ``role``: trainable, frozen (no gradient) or buffer (running statistics)."""

    name: str
    shape: tuple
    dtype: np.dtype
    role: str

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": np.dtype(self.dtype).name, "role": self.role}

    @classmethod
    def from_json(cls, d: dict) -> ParamSpec:
        return cls(d["name"], tuple(d["shape"]), np.dtype(d["dtype"]), d["role"])


@dataclass(frozen=True)
class ForwardGraph:
    proto: onnx.ModelProto
    params: tuple[ParamSpec, ...]
    weights: dict[str, np.ndarray] = field(compare=False)

    @property
    def param_names(self) -> list[str]:
        return [p.name for p in self.params]

    def names(self, role: str) -> list[str]:
        return [p.name for p in self.params if p.role == role]

    @property
    def inputs(self) -> list[TensorSpec]:
        """Data inputs (graph inputs that are not parameters), in graph order."""
        pnames = set(self.param_names)
        return [spec_of(vi) for vi in self.proto.graph.input if vi.name not in pnames]

    @property
    def outputs(self) -> list[TensorSpec]:
        return [spec_of(vi) for vi in self.proto.graph.output]

    def digest(self) -> str:
        """sha256 of the architecture: the graph, constants and parameter roles, not the weight values,
        nor the names of the model and its graph (a renamed model trains the same graphs)."""
        h = hashlib.sha256(unnamed(self.proto).SerializeToString(deterministic=True))
        for p in self.params:
            h.update(repr((p.name, tuple(p.shape), np.dtype(p.dtype).name, p.role)).encode())
        return h.hexdigest()

    def weights_digest(self) -> str:
        h = hashlib.sha256()
        for p in self.params:
            a = np.ascontiguousarray(self.weights[p.name])
            h.update(p.name.encode())
            h.update(a.tobytes())
        return h.hexdigest()


def unnamed(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``proto`` without its graph's name and its doc string (which name the model)."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    out.graph.name, out.doc_string = "", ""
    return out


def forward_from_builder(gb: GraphBuilder, params: list[ParamSpec], weights: dict[str, np.ndarray],
                         doc: str = "") -> ForwardGraph:
    """Finish a builder whose parameters were added with ``add_input`` into a checked ForwardGraph."""
    proto = gb.to_model(doc=doc, check=False)
    check_model(with_weights(proto, weights), "forward graph")
    return ForwardGraph(proto, tuple(params), dict(weights))


_PROTOBUF_LIMIT = 2**31  # bytes: protobuf refuses to serialize a message of 2 GiB or more


def with_weights(proto: onnx.ModelProto, weights: dict[str, np.ndarray]) -> onnx.ModelProto:
    """Turn parameter graph inputs into initializers holding ``weights`` (a new model)."""
    size = proto.ByteSize() + sum(int(np.asarray(a).nbytes) + 64 + len(n) for n, a in weights.items())
    if size >= _PROTOBUF_LIMIT:
        raise OrtrainError(f"the model and its weights take {size / 2**30:.2f} GiB; onnxruntime's sessions and "
                           f"ONNX files without external data are one protobuf message, which holds at most 2 GiB, "
                           f"and ortrain builds its prediction sessions and exports from one: models over 2 GiB "
                           f"cannot be run or exported here (model.save still writes them). Make the model "
                           f"smaller, e.g. a smaller embedding table")
    model = copy.deepcopy(proto)
    keep = [vi for vi in model.graph.input if vi.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(keep)
    model.graph.initializer.extend(numpy_helper.from_array(np.ascontiguousarray(a), n) for n, a in weights.items())
    return model


def reserved_input_name(name: str) -> str | None:
    """Why a data input may not be named ``name`` in a training graph, or None: onnxruntime-training
    takes an input ending in ``_grad`` (or named as its accumulation buffers) for one of the
    gradients it feeds, and ortrain's loss inputs start with ``ortrain.``."""
    if name.startswith("ortrain."):
        return "the name is reserved for ortrain's loss inputs"
    if name.endswith("_grad") or "_grad." in name or name == "lazy_reset_grad":
        return "onnxruntime-training reserves names ending in '_grad' (and its buffers' names) for the gradients"
    return None


def to_inference(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Inference flavour: dropout without its training input and mask, batch norm in inference mode,
    layer norm without the mean and inverse deviation it keeps for the gradient (some converters
    compute wrong values with them), and a ``MatMul`` with a 1-D operand as a matrix product
    (onnxruntime's optimizer fuses it wrongly)."""
    model = copy.deepcopy(proto)
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    for node in model.graph.node:
        if node.op_type == "Dropout":
            del node.input[2:]
            if len(node.output) > 1 and node.output[1] not in used:
                del node.output[1:]
        elif node.op_type == "BatchNormalization":
            for attr in list(node.attribute):
                if attr.name == "training_mode":
                    node.attribute.remove(attr)
            del node.output[1:]
        elif node.op_type == "LayerNormalization" and not any(o in used for o in node.output[1:]):
            del node.output[1:]
    _drop_unused_initializers(model)
    used = {i for n in model.graph.node for i in node_inputs(n)} | {o.name for o in model.graph.output}
    dead = [n for n in model.graph.node if n.op_type == "Constant" and not any(o in used for o in n.output)]
    for n in dead:  # e.g. the training flag a Dropout no longer reads
        model.graph.node.remove(n)
    return matmul_vectors_as_matrices(model)


def _drop_unused_initializers(model: onnx.ModelProto) -> None:
    used = {i for n in model.graph.node for i in node_inputs(n)} | {o.name for o in model.graph.output}
    keep = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(keep)


def extend(proto: onnx.ModelProto, gb: GraphBuilder, outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    """``proto`` plus the nodes, initializers and inputs of ``gb``, with new graph outputs."""
    model = copy.deepcopy(proto)
    model.graph.node.extend(gb.nodes)
    model.graph.initializer.extend(gb.initializers.values())
    model.graph.input.extend(gb.inputs)
    del model.graph.output[:]
    model.graph.output.extend(outputs)
    have = {o.domain for o in model.opset_import}
    for d in sorted(gb.domains - have):
        model.opset_import.append(helper.make_opsetid(d, 1))
    return model
