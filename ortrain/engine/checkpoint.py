"""Reading and writing onnxruntime-training checkpoint files.

The training API can save a checkpoint (weights, Adam moments, optimizer step,
properties) but Python can neither read the moments nor hand them back. The file
is a flatbuffer whose schema ships with onnxruntime (``ort_flatbuffers_py``), so
this module reads and writes it directly: that is what lets ``opt.state()``
return the moments, ``opt.load_state()`` restore them in a new session, and
``Model.save`` keep optimizer state in a portable, pickle-free form.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import zipfile
import zlib
from dataclasses import dataclass, field

import flatbuffers
import numpy as np

from ortrain._files import atomic_path
from ortrain.engine._runtime import checkpoint_schema as _fbs
from ortrain.errors import OrtrainError
from ortrain.graph import np_dtype, onnx_dtype

Checkpoint, FloatProperty, IntProperty = _fbs.Checkpoint, _fbs.FloatProperty, _fbs.IntProperty
ModuleState, OptimizerGroup, PropertyBag = _fbs.ModuleState, _fbs.OptimizerGroup, _fbs.PropertyBag
ParameterOptimizerState, StringProperty, Tensor = _fbs.ParameterOptimizerState, _fbs.StringProperty, _fbs.Tensor

CHECKPOINT_VERSION = 2  # what onnxruntime-training 1.19.2 writes and reads
_IDENTIFIER = b"ODTC"
GROUP_NAME = "group0"
# A second optimizer group, which onnxruntime-training leaves alone (its optimizer reads group0): the
# moments of weights frozen in a trainer, which go on with them once they train again.
CARRIED_GROUP = "ortrain.frozen"
MOMENT_NAMES = ("momentum0", "momentum1")
# A property of a trainer's checkpoint: the crc32 of everything else it holds, so that a changed
# byte in a weight, a moment or a counter is told apart from training (the format has no checksum).
CHECKSUM = "ortrain.crc32"
CHECKSUM_PLACEHOLDER = -1  # written first, then replaced in place (0 would not be written at all)


@dataclass
class OptimizerState:
    """Adam's per-parameter moments and the number of updates taken so far."""

    step: int
    initial_lr: float = 1e-3
    moments: dict[str, tuple[np.ndarray, ...]] = field(default_factory=dict)


@dataclass
class CheckpointData:
    trainable: dict[str, np.ndarray]
    frozen: dict[str, np.ndarray] = field(default_factory=dict)
    optimizer: OptimizerState | None = None
    properties: dict[str, int | float | str] = field(default_factory=dict)
    carried: dict[str, tuple[np.ndarray, ...]] = field(default_factory=dict)  # moments of frozen weights


def _tensor_crc(t, crc: int) -> int:
    """``crc`` over a tensor: its name, type, shape and bytes, read in place."""
    dims = ",".join(str(t.Dims(i)) for i in range(t.DimsLength()))
    crc = zlib.crc32(t.Name() + f":{t.DataType()}:{dims}:".encode(), crc)
    return zlib.crc32(t.RawDataAsNumpy() if t.RawDataLength() else b"", crc)


def content_crc(buf) -> tuple[int, int | None]:
    """(crc32 of everything a checkpoint file's bytes ``buf`` hold but :data:`CHECKSUM`'s value: tensors
    (names, types, shapes, values), the optimizer's step and rate, properties; the byte offset of
    that value, None without it). The tensors' bytes are read where they lie, not copied."""
    ck = Checkpoint.Checkpoint.GetRootAs(buf, 0)
    crc, at = 0, None
    ms = ck.ModuleState()
    if ms is not None:
        for i in range(ms.RequiresGradParamsLength()):
            crc = _tensor_crc(ms.RequiresGradParams(i), crc)
        crc = zlib.crc32(b"|", crc)
        for i in range(ms.FrozenParamsLength()):
            crc = _tensor_crc(ms.FrozenParams(i), crc)
    for g in range(ck.OptimizerGroupsLength()):
        group = ck.OptimizerGroups(g)
        crc = zlib.crc32(f"|{group.GroupName()!r}:{group.Step()}:{group.InitialLearningRate()!r}".encode(), crc)
        for i in range(group.OptimizerStatesLength()):
            ps = group.OptimizerStates(i)
            crc = zlib.crc32(ps.ParamName(), crc)
            for j in range(ps.MomentumsLength()):
                crc = _tensor_crc(ps.Momentums(j), crc)
    bag = ck.PropertyBag()
    if bag is not None:
        for kind, count, get in (("i", bag.IntsLength(), bag.Ints), ("f", bag.FloatsLength(), bag.Floats),
                                 ("s", bag.StringsLength(), bag.Strings)):
            for i in range(count):
                p = get(i)
                if kind == "i" and p.Name().decode() == CHECKSUM:
                    offset = p._tab.Offset(6)  # IntProperty.value
                    at = p._tab.Pos + offset if offset else None
                    continue
                crc = zlib.crc32(f"|{kind}:{p.Name()!r}={p.Value()!r}".encode(), crc)
    return crc, at


def write_checksum(path) -> None:
    """Write :data:`CHECKSUM`'s value in the checkpoint file at ``path`` (in place: the file must hold
    the property already, with a value other than 0, which flatbuffers would leave out)."""
    with open(path, "r+b") as f:
        buf = f.read()
        crc, at = content_crc(buf)
        if at is None:
            raise OrtrainError(f"checkpoint {os.fspath(path)!r}: no {CHECKSUM} property to write")
        f.seek(at)
        f.write(int(crc).to_bytes(8, "little", signed=True))


def _read_tensor(t) -> tuple[str, np.ndarray]:
    name = t.Name().decode()
    dims = tuple(int(t.Dims(i)) for i in range(t.DimsLength()))
    if t.ExternalDataOffset() != -1:
        raise OrtrainError(f"tensor {name!r} is stored in an external data file, which ortrain "
                           "does not read; save the checkpoint again below 2 GB")
    try:
        dtype = np.dtype(np_dtype(t.DataType())).newbyteorder("<")
    except OrtrainError as exc:  # a changed byte, or a type no checkpoint of these graphs holds: not readable
        raise ValueError(f"tensor {name!r} has {str(exc).split(' is not')[0]}") from None
    raw = t.RawDataAsNumpy() if t.RawDataLength() else np.zeros(0, np.uint8)
    # one copy out of the file's buffer (a view of it may be unaligned), in the machine's byte order
    return name, np.frombuffer(raw, dtype=dtype).reshape(dims).astype(dtype.newbyteorder("="))


def read_checkpoint(path: str | os.PathLike, verify: bool = False, weights: bool = True) -> CheckpointData:
    """Parse a checkpoint written by onnxruntime-training (or by :func:`write_checkpoint`);
    ``verify``: one that holds :data:`CHECKSUM` (a trainer's) must match it; ``weights=False``: leave
    the weights out (``trainable`` and ``frozen`` empty), for the optimizer state alone. The file is
    mapped, not read into memory: each array is one copy out of it."""
    if not isinstance(path, (str, os.PathLike)):
        raise OrtrainError(f"checkpoint: expected a file path, received {path!r}")
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as exc:
        raise OrtrainError(f"cannot read checkpoint {os.fspath(path)!r}: {exc.strerror}; give the path of a "
                           "file that save_checkpoint (or a fit's ModelCheckpoint) wrote") from exc
    try:
        return _read_mapped(path, buf, verify, weights)
    finally:
        if isinstance(buf, mmap.mmap):
            with contextlib.suppress(BufferError):  # a view still held: the collector closes it
                buf.close()


def _zip_hint(path) -> str:
    """What a zip given as a checkpoint most likely is, and where it goes instead."""
    try:
        with zipfile.ZipFile(path) as z:
            names = set(z.namelist())
    except (OSError, zipfile.BadZipFile, ValueError):
        names = set()
    if names and all(n.endswith(".npy") for n in names):  # np.savez: data or save_weights' weights
        return ("; it is an .npz of arrays (data, or the weights of save_weights, which model.load_weights "
                "reads): a checkpoint is a file that save_checkpoint, ModelCheckpoint(save_model=False) or a "
                "command-line run (its checkpoints/) wrote")
    return ("; it looks like a model file (model.save, or ModelCheckpoint's default): open it with "
            "ot.load_model(path) and train on (fit, or a Trainer of that model), or write trainer "
            "checkpoints with ModelCheckpoint(save_model=False)")


def _read_mapped(path, buf, verify: bool, weights: bool) -> CheckpointData:
    if len(buf) < 8 or buf[4:8] != _IDENTIFIER:
        hint = ""
        if buf[:4] == b"PK\x03\x04":  # a zip: model.save's file (ModelCheckpoint's default), or an .npz
            hint = _zip_hint(path)
        raise OrtrainError(f"{os.fspath(path)!r} is not an onnxruntime-training checkpoint "
                           f"(missing the 'ODTC' file identifier){hint}")
    try:
        data = _parse(buf, weights)
    except OrtrainError as exc:  # a file that parses, which ortrain cannot use: its own reason, with the file
        raise OrtrainError(f"checkpoint {os.fspath(path)!r}: {exc}") from exc
    except Exception as exc:  # a truncated or corrupted flatbuffer raises anything from struct to IndexError
        if isinstance(exc, struct.error) and "actual buffer size" in str(exc):
            reason = f"the file ends early ({len(buf)} bytes; a copy or a write cut short?)"
        else:
            reason = f"its contents do not parse ({type(exc).__name__}: {exc})"
        raise OrtrainError(f"checkpoint {os.fspath(path)!r} cannot be read: {reason}; it is damaged, or was not "
                           "written by onnxruntime-training 1.19.2 or ortrain: use another checkpoint") from exc
    if verify and CHECKSUM in data.properties and data.properties[CHECKSUM] != content_crc(buf)[0]:
        raise OrtrainError(f"checkpoint {os.fspath(path)!r} is damaged: its contents do not match the checksum "
                           "written with them (changed after it was written); use another checkpoint or a copy of "
                           "this one")
    return data


def _parse(buf, weights: bool = True) -> CheckpointData:
    ck = Checkpoint.Checkpoint.GetRootAs(buf, 0)
    if ck.Version() != CHECKPOINT_VERSION:
        raise OrtrainError(f"its format version is {ck.Version()}, not the version {CHECKPOINT_VERSION} that "
                           "onnxruntime-training 1.19.2 writes: it is damaged, or was written by another version; "
                           "use another checkpoint")
    ms = ck.ModuleState()
    if ms is None:
        raise OrtrainError("it has no module state (weights); use another checkpoint")
    if ms.IsNominalState():
        raise OrtrainError("it is a nominal checkpoint, without weights; use a checkpoint that holds them")
    trainable, frozen = {}, {}
    if weights:
        trainable = dict(_read_tensor(ms.RequiresGradParams(i)) for i in range(ms.RequiresGradParamsLength()))
        frozen = dict(_read_tensor(ms.FrozenParams(i)) for i in range(ms.FrozenParamsLength()))
    optimizer, carried = None, {}
    for g in range(ck.OptimizerGroupsLength()):
        group = ck.OptimizerGroups(g)
        name = group.GroupName().decode()
        if name not in (GROUP_NAME, CARRIED_GROUP):
            continue
        moments = {}
        for i in range(group.OptimizerStatesLength()):
            ps = group.OptimizerStates(i)
            named = dict(_read_tensor(ps.Momentums(j)) for j in range(ps.MomentumsLength()))
            moments[ps.ParamName().decode()] = tuple(named[n] for n in MOMENT_NAMES if n in named)
        if name == CARRIED_GROUP:
            carried = moments
        else:
            optimizer = OptimizerState(int(group.Step()), float(group.InitialLearningRate()), moments)
    properties: dict[str, int | float | str] = {}
    bag = ck.PropertyBag()
    if bag is not None:
        for i in range(bag.IntsLength()):
            p = bag.Ints(i)
            properties[p.Name().decode()] = int(p.Value())
        for i in range(bag.FloatsLength()):
            p = bag.Floats(i)
            properties[p.Name().decode()] = float(p.Value())
        for i in range(bag.StringsLength()):
            p = bag.Strings(i)
            properties[p.Name().decode()] = p.Value().decode()
    return CheckpointData(trainable, frozen, optimizer, properties, carried)


def _tensor(b: flatbuffers.Builder, name: str, array: np.ndarray) -> int:
    array = np.ascontiguousarray(array)  # (a 0-d value becomes shape (1,), as the graphs hold scalars)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    name_off = b.CreateString(name)
    raw = b.CreateNumpyVector(array.reshape(-1).view(np.uint8))  # the builder's copy is the only one
    Tensor.TensorStartDimsVector(b, array.ndim)
    for d in reversed(array.shape):
        b.PrependInt64(int(d))
    dims = b.EndVector()
    Tensor.TensorStart(b)
    Tensor.TensorAddName(b, name_off)
    Tensor.TensorAddDims(b, dims)
    Tensor.TensorAddDataType(b, onnx_dtype(array.dtype))
    Tensor.TensorAddRawData(b, raw)
    return Tensor.TensorEnd(b)


def _vector(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _properties(b: flatbuffers.Builder, props: dict) -> int:
    ints, floats, strings = [], [], []
    for name, value in sorted(props.items()):
        name_off = b.CreateString(name)
        if isinstance(value, bool) or isinstance(value, (int, np.integer)):
            IntProperty.IntPropertyStart(b)
            IntProperty.IntPropertyAddName(b, name_off)
            IntProperty.IntPropertyAddValue(b, int(value))
            ints.append(IntProperty.IntPropertyEnd(b))
        elif isinstance(value, (float, np.floating)):
            FloatProperty.FloatPropertyStart(b)
            FloatProperty.FloatPropertyAddName(b, name_off)
            FloatProperty.FloatPropertyAddValue(b, float(value))
            floats.append(FloatProperty.FloatPropertyEnd(b))
        else:
            value_off = b.CreateString(str(value))
            StringProperty.StringPropertyStart(b)
            StringProperty.StringPropertyAddName(b, name_off)
            StringProperty.StringPropertyAddValue(b, value_off)
            strings.append(StringProperty.StringPropertyEnd(b))
    vecs = [_vector(b, v) if v else None for v in (ints, floats, strings)]
    PropertyBag.PropertyBagStart(b)
    if vecs[0] is not None:
        PropertyBag.PropertyBagAddInts(b, vecs[0])
    if vecs[1] is not None:
        PropertyBag.PropertyBagAddFloats(b, vecs[1])
    if vecs[2] is not None:
        PropertyBag.PropertyBagAddStrings(b, vecs[2])
    return PropertyBag.PropertyBagEnd(b)


def _group(b: flatbuffers.Builder, name: str, step: int, initial_lr: float, moments: dict) -> int:
    states = []
    for pname, ms in moments.items():
        name_off = b.CreateString(pname)
        mom = _vector(b, [_tensor(b, MOMENT_NAMES[i], m) for i, m in enumerate(ms)])
        ParameterOptimizerState.ParameterOptimizerStateStart(b)
        ParameterOptimizerState.ParameterOptimizerStateAddParamName(b, name_off)
        ParameterOptimizerState.ParameterOptimizerStateAddMomentums(b, mom)
        states.append(ParameterOptimizerState.ParameterOptimizerStateEnd(b))
    states_vec = _vector(b, states)
    group_name = b.CreateString(name)
    OptimizerGroup.OptimizerGroupStart(b)
    OptimizerGroup.OptimizerGroupAddGroupName(b, group_name)
    OptimizerGroup.OptimizerGroupAddStep(b, int(step))
    OptimizerGroup.OptimizerGroupAddInitialLearningRate(b, float(initial_lr))
    OptimizerGroup.OptimizerGroupAddOptimizerStates(b, states_vec)
    return OptimizerGroup.OptimizerGroupEnd(b)


def write_checkpoint(path: str | os.PathLike, data: CheckpointData) -> None:
    """Write ``data`` in the format onnxruntime-training 1.19.2 loads."""
    groups_in = ([(GROUP_NAME, data.optimizer.step, data.optimizer.initial_lr, data.optimizer.moments)]
                 if data.optimizer is not None else []) + \
        ([(CARRIED_GROUP, 0, 0.0, data.carried)] if data.carried else [])
    size = sum(a.nbytes for a in data.trainable.values()) + sum(a.nbytes for a in data.frozen.values())
    size += sum(m.nbytes for *_, moments in groups_in for ms in moments.values() for m in ms)
    count = len(data.trainable) + len(data.frozen) + sum(len(ms) + 1 for *_, moments in groups_in
                                                         for ms in moments.values())
    b = flatbuffers.Builder(size + 4096 + 256 * count)  # room for names and dims too: the builder never grows
    req = _vector(b, [_tensor(b, n, a) for n, a in data.trainable.items()])
    frozen = _vector(b, [_tensor(b, n, a) for n, a in data.frozen.items()])
    ModuleState.ModuleStateStart(b)
    ModuleState.ModuleStateAddRequiresGradParams(b, req)
    ModuleState.ModuleStateAddFrozenParams(b, frozen)
    module_state = ModuleState.ModuleStateEnd(b)
    groups = _vector(b, [_group(b, *g) for g in groups_in]) if groups_in else None
    bag = _properties(b, data.properties) if data.properties else None
    Checkpoint.CheckpointStart(b)
    Checkpoint.CheckpointAddVersion(b, CHECKPOINT_VERSION)
    Checkpoint.CheckpointAddModuleState(b, module_state)
    if groups is not None:
        Checkpoint.CheckpointAddOptimizerGroups(b, groups)
    if bag is not None:
        Checkpoint.CheckpointAddPropertyBag(b, bag)
    root = Checkpoint.CheckpointEnd(b)
    b.Finish(root, file_identifier=_IDENTIFIER)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(memoryview(b.Bytes)[b.Head():])  # (Output() would copy the whole buffer first)
