"""Small ONNX models and file helpers shared by the ``from_onnx`` tests."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

DATA = Path(__file__).parent / "data"


def load_data_module(name):
    """A script under tests/data imported as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_for_tests", DATA / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


make_models = load_data_module("make_models")


def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def model(nodes, inputs, outputs, inits=(), opset=17, ir=8):
    g = helper.make_graph(nodes, "handmade", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir
    return m


def f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def dynamo_copy(tmp_path) -> Path:
    """A private copy of the dynamo export (model.onnx + model.onnx.data) to tamper with."""
    dst = tmp_path / "model_dir"
    shutil.copytree(DATA / "convnet_dynamo", dst)
    return dst / "model.onnx"


def set_external(path: Path, tensor: str, **fields) -> Path:
    """Rewrite the external-data fields (location, offset, length) of one tensor of ``path``."""
    m = onnx.load(str(path), load_external_data=False)
    t = next(t for t in m.graph.initializer if t.name == tensor)
    entries = {e.key: e.value for e in t.external_data}
    entries.update({k: str(v) for k, v in fields.items()})
    del t.external_data[:]
    for k, v in entries.items():
        t.external_data.add(key=k, value=v)
    path.write_bytes(m.SerializeToString())
    return path
