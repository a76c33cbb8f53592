"""``ot.from_onnx`` on hostile or damaged input: random bytes, truncated files, external data that
escapes its directory or lies about its size, and every other refusal with its message."""

from __future__ import annotations

import os
import warnings

import numpy as np
import onnx
import pytest
from _onnx_helpers import DATA, dynamo_copy, make_models, set_external
from _onnx_helpers import f32 as _f32
from _onnx_helpers import model as _model
from _onnx_helpers import vi as _vi
from onnx import TensorProto, helper, numpy_helper

import ortrain as ot

# -- loading untrusted files ------------------------------------------------------------------

def test_random_bytes_are_refused(tmp_path, rng):
    for i, size in enumerate((1, 17, 300, 5000)):
        blob = rng.bytes(size)
        with pytest.raises(ot.OrtrainError, match="not an ONNX model"):
            ot.from_onnx(blob)
        path = tmp_path / f"random{i}.onnx"
        path.write_bytes(blob)
        with pytest.raises(ot.OrtrainError, match="not an ONNX model"):
            ot.from_onnx(path)


def test_a_name_that_is_not_utf8_is_refused_as_damage(tmp_path):
    """A bit flipped in a name, a domain or a symbolic size: protobuf hands the field over as bytes,
    which failed far from the file with a bare TypeError or UnicodeDecodeError."""
    model = ot.Sequential([ot.layers.Dense(4, activation="relu"), ot.layers.Dense(3)], input_shape=(10,), seed=0)
    model.export_onnx(tmp_path / "m.onnx")
    data = (tmp_path / "m.onnx").read_bytes()
    for text in (b"ortrain", b"batch", b"dense_1.kernel"):
        at = data.index(text) + 2
        damaged = data[:at] + bytes([data[at] | 0x80]) + data[at + 1:]   # a lone continuation byte
        with pytest.raises(ot.OrtrainError, match=r"is damaged: its \w+'s \w+ b'.*' is not UTF-8 text"):
            ot.from_onnx(damaged)


def test_every_bit_flipped_in_a_small_model_file_loads_or_is_refused_clearly(tmp_path):
    model = ot.Sequential([ot.layers.Dense(4, activation="relu"), ot.layers.Dense(3)], input_shape=(10,), seed=0)
    model.export_onnx(tmp_path / "m.onnx")
    data = (tmp_path / "m.onnx").read_bytes()
    x = np.zeros((2, 10), np.float32)
    raw = []
    warnings.simplefilter("ignore")  # (what a flip may warn of is no failure; pytest restores the filters)
    for i in range(0, len(data), 3):   # a third of the bytes, every bit of each
        for bit in range(8):
            damaged = data[:i] + bytes([data[i] ^ (1 << bit)]) + data[i + 1:]
            try:
                ot.from_onnx(damaged).predict(x)
            except ot.OrtrainError:
                pass
            except Exception as exc:  # noqa: BLE001 - what escapes is the test
                raw.append((i, bit, f"{type(exc).__name__}: {exc}"[:120]))
    assert raw == []


def test_truncated_file_is_refused(tmp_path):
    data = (DATA / "encoder_opset17.onnx").read_bytes()
    for cut in (5, 200, len(data) // 2, len(data) - 1):
        path = tmp_path / "cut.onnx"
        path.write_bytes(data[:cut])
        with pytest.raises(ot.OrtrainError, match="not an ONNX model|not valid ONNX"):
            ot.from_onnx(path)


def test_missing_file_and_wrong_type():
    with pytest.raises(ot.OrtrainError, match="no such file"):
        ot.from_onnx("does/not/exist.onnx")
    with pytest.raises(ot.OrtrainError, match="expected a path to an .onnx file, its bytes or an onnx.ModelProto"):
        ot.from_onnx(42)


def test_external_data_beside_the_file_loads(tmp_path):
    path = dynamo_copy(tmp_path)
    model = ot.from_onnx(path)
    ref = onnx.load(str(path))  # onnx's own loader, as the reference
    w = dict(zip(model.weight_names(), model.get_weights(), strict=True))
    np.testing.assert_array_equal(w["fc1.weight"], numpy_helper.to_array(
        next(t for t in ref.graph.initializer if t.name == "fc1.weight")))


def test_external_data_escaping_the_directory_is_refused(tmp_path):
    path = dynamo_copy(tmp_path)
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 4096)
    set_external(path, "fc1.weight", location="../secret.bin")
    with pytest.raises(ot.OrtrainError, match=r"outside the model's directory \('\.\.'\); refused"):
        ot.from_onnx(path)
    set_external(path, "fc1.weight", location=str(secret))
    with pytest.raises(ot.OrtrainError, match="by absolute path"):
        ot.from_onnx(path)
    os.symlink(secret, path.parent / "link.bin")
    set_external(path, "fc1.weight", location="link.bin")
    with pytest.raises(ot.OrtrainError, match="symbolic link leads out"):
        ot.from_onnx(path)


def test_external_data_sizes_are_honoured(tmp_path):
    path = dynamo_copy(tmp_path)
    set_external(path, "fc1.weight", length=8)
    with pytest.raises(ot.OrtrainError, match="needs 1152 bytes, its external data declares 8"):
        ot.from_onnx(path)
    set_external(path, "fc1.weight", length=1152, offset=64)
    with pytest.raises(ot.OrtrainError, match="holds only 1152; the file is truncated"):
        ot.from_onnx(path)
    set_external(path, "fc1.weight", offset=0)
    (path.parent / "model.onnx.data").write_bytes(b"\0" * 100)
    with pytest.raises(ot.OrtrainError, match="the file is truncated"):
        ot.from_onnx(path)
    (path.parent / "model.onnx.data").unlink()
    with pytest.raises(ot.OrtrainError, match="is missing beside the model"):
        ot.from_onnx(path)


def test_external_data_needs_a_path():
    proto = onnx.load(str(DATA / "convnet_dynamo" / "model.onnx"), load_external_data=False)
    with pytest.raises(ot.OrtrainError, match="pass the model's path instead"):
        ot.from_onnx(proto)


def test_the_callers_modelproto_is_not_changed(rng):
    proto = make_models.light_model("squeezenet")
    before = proto.SerializeToString()
    ot.from_onnx(proto)
    assert proto.SerializeToString() == before


# -- the remaining refusals, one message each -------------------------------------------------

def _tile_opset1():
    """Tile in its opset-1 form, which onnx's version converter has no adapter for."""
    consts = [numpy_helper.from_array(np.array(2, np.float32), "t"), numpy_helper.from_array(np.array(1, np.float32), "a")]
    inputs = [_vi("x", [2, 3]), _vi("t", []), _vi("a", [])]
    return _model([helper.make_node("Tile", ["x", "t", "a"], ["y"])], inputs, [_vi("y", [2, 6])], consts, opset=5, ir=3)


def _bn_stats_read(rng):
    inits = [numpy_helper.from_array(np.abs(_f32(rng, 2)) + 0.5, n) for n in ("g", "b", "m", "v")]
    nodes = [helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y", "m2", "v2"],
                              training_mode=1, name="bn"),
             helper.make_node("Add", ["y", "m2"], ["z"], name="reads_stats")]
    return _model(nodes, [_vi("x", [None, 2])], [_vi("z", [None, 2])], inits, opset=15)


def _edited(path, **fields):
    return set_external(path, "fc1.weight", **fields)


REFUSALS = {
    "a directory": (lambda tmp, rng: tmp, "is not a regular file"),
    "no default opset": (lambda tmp, rng: _no_default_opset(rng), "imports no default ONNX opset"),
    "an empty model": (lambda tmp, rng: onnx.ModelProto().SerializeToString(), "no graph, nodes or outputs"),
    "no conversion": (lambda tmp, rng: _tile_opset1(), r"uses opset 5; converting it to opset 17 .* failed"),
    "stats read": (lambda tmp, rng: _bn_stats_read(rng), r"nodes \['reads_stats'\] read the updated running"),
    "empty location": (lambda tmp, rng: _edited(dynamo_copy(tmp), location=""), "without a location"),
    "bad offset": (lambda tmp, rng: _edited(dynamo_copy(tmp), offset="ten"), "non-integer external data offset"),
    "negative offset": (lambda tmp, rng: _edited(dynamo_copy(tmp), offset=-4), "invalid external data range"),
    "no data inputs": (lambda tmp, rng: _model([helper.make_node("Identity", ["w"], ["y"])], [_vi("w", [2])],
                                               [_vi("y", [2])], [numpy_helper.from_array(_f32(rng, 2), "w")]),
                       "has no data inputs"),
    "string input": (lambda tmp, rng: _model([helper.make_node("Identity", ["s"], ["y"])],
                                             [_vi("s", [None], TensorProto.STRING)], [_vi("y", [None], TensorProto.STRING)]),
                     r"input 's': ONNX element type STRING is not supported by ortrain; the inputs ortrain feeds are "
                     r"float32, float64, float16, 8- to 64-bit integers and bool"),
    "sequence input": (lambda tmp, rng: _model([helper.make_node("SequenceLength", ["s"], ["y"])],
                                               [helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)],
                                               [_vi("y", [], TensorProto.INT64)]), "input 's' is not a tensor"),
}


def _matmul_model(rng, nodes, inits=1):
    w = numpy_helper.from_array(_f32(rng, 3, 2), "w")
    return _model(nodes, [_vi("x", [None, 3])], [_vi("y", [None, 2])], [w] * inits)


# onnx's checker sees the graph without the weights' bytes (ortrain hands it a skeleton); these
# are refused all the same.
REFUSALS.update({
    "initializer reassigned": (lambda tmp, rng: _matmul_model(rng, [helper.make_node("MatMul", ["x", "w"], ["y"]),
                                                                     helper.make_node("Relu", ["y"], ["w"])]),
                               r"not valid ONNX: Graph must be in single static assignment .* 'w'"),
    "initializer twice": (lambda tmp, rng: _matmul_model(rng, [helper.make_node("MatMul", ["x", "w"], ["y"])], 2),
                          r"not valid ONNX: Graph must be in single static assignment .* 'w'"),
    "unknown op": (lambda tmp, rng: _matmul_model(rng, [helper.make_node("Frobnicate", ["x", "w"], ["y"])]),
                   "not valid ONNX: No Op registered for Frobnicate"),
})


def _initializer_model(rng, edit, ir=8, listed=False):
    w = numpy_helper.from_array(_f32(rng, 64, 2), "w")  # large enough that onnx would not inline-check it
    edit(w)
    inputs = [_vi("x", [None, 64])] + ([helper.make_tensor_value_info("w", w.data_type, [64, 2])] if listed else [])
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], inputs, [_vi("y", [None, 2])], [w],
                  opset=17 if ir >= 8 else 9, ir=ir)


def test_initializers_are_checked_without_their_bytes(rng):
    """What onnx's checker asked of each initializer, ortrain asks itself (the checker sees no weights)."""
    cases = [  # both float_data and raw_data; no values; no element type
        (lambda w: w.float_data.extend([1.0] * 128), "uses float_data, raw_data"),
        (lambda w: w.ClearField("raw_data"), "uses none"),
        (lambda w: setattr(w, "data_type", 0), "has no element type"),
    ]
    for edit, message in cases:
        with pytest.raises(ot.OrtrainError, match=f"from_onnx: the model is not valid ONNX: initializer 'w' .*{message}"):
            ot.from_onnx(_initializer_model(rng, edit))
    with pytest.raises(ot.OrtrainError, match="initializer 'w' is not a graph input, which IR version 3 requires"):
        ot.from_onnx(_initializer_model(rng, lambda w: None, ir=3))
    ot.from_onnx(_initializer_model(rng, lambda w: None, ir=3, listed=True))


def test_the_checker_is_not_handed_the_weights():
    from ortrain.graph import loading
    proto = make_models.light_model("squeezenet")
    skeleton = loading._skeleton(proto)
    assert skeleton.ByteSize() < proto.ByteSize() / 20
    assert not skeleton.graph.initializer
    assert [n.name for n in skeleton.graph.node] == [n.name for n in proto.graph.node]
    listed = {i.name: i for i in skeleton.graph.input}
    for t in proto.graph.initializer:
        shape = [d.dim_value for d in listed[t.name].type.tensor_type.shape.dim]
        assert shape == list(t.dims) and listed[t.name].type.tensor_type.elem_type == t.data_type


def _no_default_opset(rng):
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [None, 2])], [_vi("y", [None, 2])])
    del m.opset_import[:]
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    return m.SerializeToString()


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals_name_the_problem(case, tmp_path, rng):
    make, message = REFUSALS[case]
    with pytest.raises(ot.OrtrainError, match=message):
        ot.from_onnx(make(tmp_path, rng))


def test_a_file_over_the_protobuf_limit_is_refused(tmp_path, monkeypatch):
    from ortrain.graph import loading
    monkeypatch.setattr(loading, "MAX_MODEL_BYTES", 1000)
    with pytest.raises(ot.OrtrainError, match=r"holds 25170 bytes; an ONNX protobuf file is limited to 1000 "
                                              r"bytes\. Save the weights as external data"):
        ot.from_onnx(DATA / "encoder_opset17.onnx")


def test_an_unreadable_initializer_is_refused(rng):
    proto = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [None, 3])], [_vi("y", [None, 2])],
                   [numpy_helper.from_array(_f32(rng, 3, 2), "w")])
    proto.graph.initializer[0].raw_data = b"\0" * 7  # 24 bytes expected
    with pytest.raises(ot.OrtrainError, match="not valid ONNX|initializer 'w' cannot be read"):
        ot.from_onnx(proto)
