"""Reading ONNX files that come from elsewhere, without trusting them.

A model file is parsed from bytes ortrain read itself, so a truncated file or
random bytes end in an :class:`~ortrain.errors.OrtrainError` rather than deep
inside protobuf or the checker. Tensors stored as *external data* are read here
too, not by ``onnx.load``: their ``location`` must name a regular file inside the
model's own directory (no absolute paths, no ``..`` escapes, no symlinks that
lead out), and the byte range they declare must lie inside that file and hold
exactly the tensor's size. An untrusted file can therefore neither read arbitrary
files nor make ortrain allocate more than the data it actually ships.
"""

from __future__ import annotations

import copy
import os
from collections.abc import MutableSequence
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.descriptor import FieldDescriptor
from onnx import TensorProto, external_data_helper, helper

from ortrain.errors import OrtrainError

__all__ = ["MAX_MODEL_BYTES", "load_untrusted"]

# protobuf refuses messages of 2 GiB and more; bigger models keep their weights as external data.
MAX_MODEL_BYTES = 2**31 - 1

_FIXED_SIZE = {
    TensorProto.FLOAT: 4, TensorProto.DOUBLE: 8, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2,
    TensorProto.INT8: 1, TensorProto.UINT8: 1, TensorProto.INT16: 2, TensorProto.UINT16: 2,
    TensorProto.INT32: 4, TensorProto.UINT32: 4, TensorProto.INT64: 8, TensorProto.UINT64: 8,
    TensorProto.BOOL: 1,
}


def load_untrusted(source, what: str = "from_onnx") -> onnx.ModelProto:
    """A validated copy of ``source`` (a path, bytes or an ``onnx.ModelProto``) with all data inline."""
    if isinstance(source, onnx.ModelProto):
        model, base, origin = copy.deepcopy(source), None, "the ModelProto given"
    elif isinstance(source, (bytes, bytearray, memoryview)):
        origin = "the bytes given"
        model, base = _parse(bytes(source), what, origin), None
    elif isinstance(source, (str, os.PathLike)):
        path = Path(os.fspath(source))
        origin = repr(str(path))
        model, base = _parse(_read_file(path, what), what, origin), path.parent
    else:
        raise OrtrainError(f"{what}: expected a path to an .onnx file, its bytes or an onnx.ModelProto, "
                           f"received {type(source).__name__}")
    _check_structure(model, what, origin)
    _check_text(model, what, origin)
    _inline_external_data(model, base, what)
    newer = _newest_ir_read(model)
    _output_shapes_inferred(model, what)
    _check_onnx(model, what, newer)
    return model


def _output_shapes_inferred(model: onnx.ModelProto, what: str) -> None:
    """Graph outputs declared without a shape (``make_tensor_value_info(name, type, None)``, which
    onnxruntime runs) get the one onnx's shape inference gives; the checker refused them with its
    bare "Field 'shape' of 'type' is required but missing"."""
    bare = [o for o in model.graph.output if o.type.HasField("tensor_type") and not o.type.tensor_type.HasField("shape")]
    if not bare:
        return
    try:  # the whole model: a shape may follow from an initializer's values (a Squeeze's axes)
        inferred = {o.name: o for o in onnx.shape_inference.infer_shapes(model).graph.output}
    except Exception:  # noqa: BLE001 - the checker says what is wrong with the graph
        inferred = {}
    for o in bare:
        found = inferred.get(o.name)
        if found is None or not found.type.tensor_type.HasField("shape"):
            raise OrtrainError(f"{what}: output {o.name!r} is declared without a shape, and onnx's shape inference "
                               "finds none; declare it (helper.make_tensor_value_info(name, type, shape), with None or "
                               "a name for sizes that vary)")
        o.type.tensor_type.shape.CopyFrom(found.type.tensor_type.shape)


def _newest_ir_read(model: onnx.ModelProto) -> int | None:
    """A model of a newer IR version than onnx 1.17 and onnxruntime 1.19.2 read (onnx 1.18's
    ``make_model`` writes IR 11 by default) is read as IR 10, which the checker then checks (it said
    "not valid ONNX" of the newer version). Returns the version given where it was newer, else None."""
    given = model.ir_version
    if given <= onnx.IR_VERSION:
        return None
    model.ir_version = onnx.IR_VERSION
    return given


def _read_file(path: Path, what: str) -> bytes:
    try:
        size = path.stat().st_size if path.is_file() else None
    except OSError as exc:  # a folder on the way that may not be searched, a name too long
        raise OrtrainError(f"{what}: cannot read {str(path)!r} ({exc.strerror or exc}); check the path and the "
                           "permissions of the folders on it") from None
    if size is None:
        raise OrtrainError(f"{what}: no such file {str(path)!r}" if not path.exists() else
                           f"{what}: {str(path)!r} is not a regular file")
    if size > MAX_MODEL_BYTES:
        raise OrtrainError(f"{what}: {str(path)!r} holds {size} bytes; an ONNX protobuf file is limited to "
                           f"{MAX_MODEL_BYTES} bytes. Save the weights as external data "
                           "(onnx.save(..., save_as_external_data=True))")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise OrtrainError(f"{what}: cannot read {str(path)!r} ({exc})") from exc


def _parse(data: bytes, what: str, origin: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as exc:  # protobuf's DecodeError and friends
        if data[:4] == b"PK\x03\x04":  # a zip file: what model.save writes
            raise OrtrainError(f"{what}: {origin} is a zip file, not an ONNX model; a file written by model.save is "
                               "read by ot.load_model(path)") from None
        raise OrtrainError(f"{what}: {origin} is not an ONNX model: the protobuf does not parse "
                           f"({type(exc).__name__}: {exc}); the file is truncated or of another format") from exc
    return model


def _check_structure(model: onnx.ModelProto, what: str, origin: str) -> None:
    """Cheap sanity checks before anything walks the graph."""
    if not model.HasField("graph") or not model.graph.node or not model.graph.output:
        raise OrtrainError(f"{what}: {origin} is not an ONNX model (no graph, nodes or outputs); the file is "
                           "damaged, truncated or of another format")
    if not any(o.domain in ("", "ai.onnx") for o in model.opset_import):
        raise OrtrainError(f"{what}: the model imports no default ONNX opset (opset_import: "
                           f"{[(o.domain, o.version) for o in model.opset_import]}); it is damaged")


def _check_text(model: onnx.ModelProto, what: str, origin: str) -> None:
    """Every text field (names, domains, symbolic sizes) is UTF-8, as protobuf's ``string`` type
    requires: protobuf hands a field that is not as ``bytes``, which failed far from here with a bare
    TypeError or UnicodeDecodeError (a bit flipped in a name)."""
    string, message_type = FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_MESSAGE
    pending = [model]
    while pending:
        message = pending.pop()
        if isinstance(message, TensorProto):  # (its fields less the data, which ListFields would copy out)
            fields = [(message.DESCRIPTOR.fields_by_name[n], getattr(message, n)) for n in ("name", "doc_string")]
            fields.append((message.DESCRIPTOR.fields_by_name["external_data"], message.external_data))
        else:
            fields = message.ListFields()
        for field, value in fields:
            if field.type == string:
                for text in ((value,) if isinstance(value, (str, bytes)) else value):  # (one, or repeated)
                    if not isinstance(text, str):
                        raise OrtrainError(f"{what}: {origin} is damaged: its {message.DESCRIPTOR.name}'s "
                                           f"{field.name} {bytes(text)[:40]!r} is not UTF-8 text")
            elif field.type == message_type:
                if hasattr(value, "ListFields"):
                    pending.append(value)
                else:
                    pending.extend(value)


def _check_onnx(model: onnx.ModelProto, what: str, newer_ir: int | None = None) -> None:
    """onnx's checker on the model without its weights; ``newer_ir``: the IR version given, newer than
    the one it is read as."""
    _check_initializers(model, what)
    skeleton = _skeleton(model)
    try:
        onnx.checker.check_model(skeleton, full_check=False)
    except Exception as exc:
        fix = "" if newer_ir is None else (
            f"; it is of IR version {newer_ir}, newer than the {onnx.IR_VERSION} that onnx {onnx.__version__} and "
            f"onnxruntime-training 1.19.2 read, and was read as that: export it for IR version {onnx.IR_VERSION} "
            "(opset 21 at most)")
        raise OrtrainError(f"{what}: the model is not valid ONNX: {str(exc).splitlines()[0]}{fix}") from exc


_VALUE_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def _check_initializers(model: onnx.ModelProto, what: str) -> None:
    """What onnx's checker asks of each top-level initializer, without serializing its data: a type,
    values in exactly one field (none for an empty tensor), no raw bytes for strings, and (IR < 4)
    a graph input of the same name. Whether the bytes fit the shape, the importer checks as it
    reads each one."""
    listed = {i.name for i in model.graph.input}
    for t in model.graph.initializer:
        fields = [f for f in _VALUE_FIELDS if len(getattr(t, f))] + (["raw_data"] if t.HasField("raw_data") else [])
        problem = None
        if t.data_type == TensorProto.UNDEFINED:
            problem = "has no element type"
        elif len(fields) > 1 or (not fields and int(np.prod(t.dims)) != 0):
            problem = f"should keep its values in one field, it uses {', '.join(fields) or 'none'}"
        elif t.data_type == TensorProto.STRING and fields == ["raw_data"]:
            problem = "holds strings as raw bytes"
        elif model.ir_version < 4 and t.name not in listed:
            problem = f"is not a graph input, which IR version {model.ir_version} requires of initializers"
        if problem:
            raise OrtrainError(f"{what}: the model is not valid ONNX: initializer {t.name!r} {problem}; "
                               "the file is damaged")


def _skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its initializers turned into typed graph inputs, for onnx's checker.

    The checker takes a serialized model; handing it the weights costs a copy of every byte
    of them (a quarter of a second for ResNet-50). :func:`_check_initializers` checks the
    initializers themselves; on the skeleton the checker still checks names, types, shapes,
    single assignment and every node, subgraphs with their own initializers included.
    """
    sk = onnx.ModelProto()
    _copy_fields(sk, model, skip="graph")
    _copy_fields(sk.graph, model.graph, skip="initializer")
    listed = {i.name for i in model.graph.input}
    sk.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                          for t in model.graph.initializer if t.name not in listed)
    return sk


def _copy_fields(dst, src, skip: str) -> None:
    for field, value in src.ListFields():
        if field.name == skip:
            continue
        if isinstance(value, MutableSequence):  # repeated fields, in every protobuf version
            getattr(dst, field.name).extend(value)
        elif field.message_type is not None:
            getattr(dst, field.name).CopyFrom(value)
        else:
            setattr(dst, field.name, value)


def _inline_external_data(model: onnx.ModelProto, base: Path | None, what: str) -> None:
    for tensor in external_data_helper._get_all_tensors(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        if base is None:
            raise OrtrainError(f"{what}: tensor {tensor.name!r} keeps its data in an external file; pass the "
                               "model's path instead of a ModelProto or bytes so the file can be found beside it")
        info = {e.key: e.value for e in tensor.external_data}
        data = _read_external(tensor, info, base, what)
        del tensor.external_data[:]
        tensor.data_location = TensorProto.DEFAULT
        tensor.raw_data = data


def _external_path(location: str, base: Path, tensor: str, what: str) -> Path:
    if not location:
        raise OrtrainError(f"{what}: tensor {tensor!r} declares external data without a location")
    if os.path.isabs(location) or location.startswith(("/", "\\")) or (len(location) > 1 and location[1] == ":"):
        raise OrtrainError(f"{what}: tensor {tensor!r} points at external data by absolute path {location!r}; "
                           "only files inside the model's directory are read. Re-save the model with "
                           "relative external data locations")
    parts = Path(location.replace("\\", "/")).parts
    if ".." in parts:
        raise OrtrainError(f"{what}: tensor {tensor!r} points at external data {location!r} outside the "
                           "model's directory ('..'); refused")
    root = base.resolve()
    target = (base / location).resolve()
    if target != root and root not in target.parents:
        raise OrtrainError(f"{what}: external data {location!r} of tensor {tensor!r} resolves outside the model's "
                           "directory (a symbolic link leads out of it); refused")
    if not target.is_file():
        raise OrtrainError(f"{what}: external data file {location!r} of tensor {tensor!r} is missing beside "
                           f"the model (looked in {str(base)!r})")
    return target


def _read_external(tensor: TensorProto, info: dict, base: Path, what: str) -> bytes:
    path = _external_path(info.get("location", ""), base, tensor.name, what)
    try:
        offset = int(info.get("offset", 0))
        declared = int(info["length"]) if "length" in info else None
    except ValueError:
        raise OrtrainError(f"{what}: tensor {tensor.name!r} has a non-integer external data offset or length "
                           f"({info})") from None
    expected = _byte_size(tensor)
    length = declared if declared is not None else expected
    if offset < 0 or length is None or length < 0:
        raise OrtrainError(f"{what}: tensor {tensor.name!r} declares an invalid external data range "
                           f"(offset {offset}, length {declared})")
    if expected is not None and length != expected:
        raise OrtrainError(f"{what}: tensor {tensor.name!r} of shape {list(tensor.dims)} needs {expected} bytes, "
                           f"its external data declares {length}; the file is damaged")
    size = path.stat().st_size
    if offset + length > size:
        raise OrtrainError(f"{what}: external data of tensor {tensor.name!r} claims bytes {offset}..{offset + length} "
                           f"of {info['location']!r}, which holds only {size}; the file is truncated")
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def _byte_size(tensor: TensorProto) -> int | None:
    item = _FIXED_SIZE.get(tensor.data_type)
    if item is None:
        return None
    if any(d < 0 for d in tensor.dims):
        return -1
    return int(np.prod(tensor.dims, dtype=np.int64)) * item
