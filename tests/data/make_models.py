"""Make the ONNX files the import tests train, and the PyTorch figures they are checked against.

``python tests/data/make_models.py`` (torch installed, plus onnxscript for the dynamo
exporter) rewrites the committed files beside this script:

* ``cnn_bn_train.onnx`` / ``cnn_bn_eval.onnx``: conv + batch norm + linear, legacy exporter
  in TRAINING mode (three-output BatchNormalization) and in EVAL mode, free batch axis;
* ``convnet_dynamo/model.onnx`` + ``model.onnx.data``: conv + flatten + dense + LayerNorm +
  GELU + a scalar constant, dynamo exporter at opset 18, batch fixed at 4 (the flatten is a
  Reshape to a constant shape), weights as external data;
* ``encoder_opset17.onnx``: ``nn.TransformerEncoderLayer`` plus a linear head, legacy
  exporter at opset 17 (single-output LayerNormalization), free batch axis;
* ``<name>.npz`` for each: three batches ``x``/``y``, the losses of three plain SGD steps
  in PyTorch (``losses``) and the weights after them (``w/<initializer name>``).

The tests import these functions to make fresh files when torch is present. The
``light_*`` helpers give the ONNX model zoo's light models (whose weights the onnx
wheel replaces by ``ConstantOfShape``) random weights.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
LR = 0.1
STEPS = 3

# name -> (loss for ortrain, batch, input shape per sample, number of classes or outputs)
SPECS = {
    "cnn_bn_train": ("sparse_logits", 4, (3, 6, 6), 3),
    "cnn_bn_eval": ("sparse_logits", 4, (3, 6, 6), 3),
    "convnet_dynamo": ("mse", 4, (3, 6, 6), 3),
    "encoder_opset17": ("sparse_logits", 4, (5, 8), 3),
}


# -- the ONNX model zoo's light models ---------------------------------------------------------

def light_path(name: str) -> Path:
    return Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def light_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """A light zoo model with every ``ConstantOfShape`` weight replaced by a random initializer.

    He-normal kernels, unit-ish batch-norm scales and positive running variances keep the
    activations of a deep random network finite.
    """
    model = onnx.load(str(light_path(name)))
    rng = np.random.default_rng(seed)
    g = model.graph
    shapes = {t.name: numpy_helper.to_array(t) for t in g.initializer if t.data_type == onnx.TensorProto.INT64}
    roles = {}
    for node in g.node:
        if node.op_type == "BatchNormalization":
            for pos, role in zip(range(1, 5), ("scale", "bias", "mean", "var"), strict=True):
                roles[node.input[pos]] = role
    nodes, used_shapes, inits = [], set(), []
    for node in g.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in shapes:
            shape = tuple(int(d) for d in shapes[node.input[0]])
            used_shapes.add(node.input[0])
            inits.append(numpy_helper.from_array(_random_weight(rng, shape, roles.get(node.output[0])),
                                                 node.output[0]))
        else:
            nodes.append(node)
    for t in g.initializer:  # the few float initializers the light files kept, in the same spirit
        if t.data_type == onnx.TensorProto.FLOAT and t.name in roles:
            inits.append(numpy_helper.from_array(_random_weight(rng, tuple(t.dims), roles[t.name]), t.name))
    replaced = {t.name for t in inits}
    keep = [t for t in g.initializer if t.name not in used_shapes and t.name not in replaced]
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(keep + inits)
    inputs = [vi for vi in g.input if vi.name not in used_shapes]
    listed = {vi.name for vi in inputs}
    # IR 3 lists every initializer among the graph inputs; the new ones too.
    inputs += [onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits
               if t.name not in listed]
    del g.input[:]
    g.input.extend(inputs)
    return model


def _random_weight(rng, shape: tuple, role: str | None) -> np.ndarray:
    if role == "scale":
        return rng.uniform(0.5, 1.0, shape).astype(np.float32)
    if role in ("bias", "mean"):
        return np.float32(0.05) * rng.standard_normal(shape, dtype=np.float32)
    if role == "var":
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if len(shape) == 1:
        return np.zeros(shape, np.float32)
    fan_in = int(np.prod(shape[1:]))
    return np.float32(np.sqrt(2.0 / fan_in)) * rng.standard_normal(shape, dtype=np.float32)


# -- PyTorch modules and exports --------------------------------------------------------------

def torch_module(name: str):
    import torch
    from torch import nn
    torch.manual_seed(0)
    if name.startswith("cnn_bn"):
        return _distinct(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                       nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 3 * 3, 3)))
    if name == "convnet_dynamo":
        class ConvNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 2, 3, padding=1)
                self.fc1, self.norm, self.fc2 = nn.Linear(18, 16), nn.LayerNorm(16), nn.Linear(16, 3)

            def forward(self, x):
                h = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2).flatten(1)
                return self.fc2(nn.functional.gelu(self.norm(self.fc1(h))) * 0.5)
        return _distinct(ConvNet())
    if name == "encoder_opset17":
        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
                self.head = nn.Linear(8, 3)

            def forward(self, x):
                return self.head(self.layer(x).mean(dim=1))
        return _distinct(Encoder())
    raise KeyError(name)


def _distinct(module):
    """Jitter every parameter: the legacy exporter merges initializers with equal values (the ones and
    zeros of fresh normalisation layers) into one, which would tie weights PyTorch trains apart."""
    import torch
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return module


def export(name: str, directory: Path) -> Path:
    """Export ``name`` into ``directory``; returns the .onnx path."""
    import torch
    module = torch_module(name)
    _, batch, shape, _ = SPECS[name]
    x = torch.randn(batch, *shape)
    directory.mkdir(parents=True, exist_ok=True)
    if name == "convnet_dynamo":
        out = directory / "convnet_dynamo" / "model.onnx"
        out.parent.mkdir(exist_ok=True)
        module.eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(module, (x,), dynamo=True, opset_version=18, verbose=False)
        program.save(str(out), external_data=True)
        return out
    mode = torch.onnx.TrainingMode.TRAINING if name == "cnn_bn_train" else torch.onnx.TrainingMode.EVAL
    out = directory / f"{name}.onnx"
    module.train(mode == torch.onnx.TrainingMode.TRAINING)
    with warnings.catch_warnings():
        # The legacy exporter is the point here (it is what emits these graphs); its deprecation
        # notice and tracer chatter say nothing about the files.
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (x,), str(out), dynamo=False, training=mode, do_constant_folding=False,
                          opset_version=17, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
    return out


def torch_reference(name: str, onnx_path: Path, seed: int = 1) -> dict[str, np.ndarray]:
    """Three SGD steps in PyTorch (batch norm in training mode) from the weights in ``onnx_path``.

    The file's weights, not the module's: exporting in TRAINING mode runs a forward pass
    that moves the running statistics before they are written.
    """
    import torch
    module = torch_module(name)
    stored = {t.name: numpy_helper.to_array(t, base_dir=str(onnx_path.parent))
              for t in onnx.load(str(onnx_path), load_external_data=False).graph.initializer}
    state = module.state_dict()
    module.load_state_dict({k: torch.from_numpy(stored[k].copy()) if k in stored else v for k, v in state.items()})
    module.train()
    loss_kind, batch, shape, n_out = SPECS[name]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((STEPS * batch,) + shape).astype(np.float32)
    if loss_kind == "mse":
        y = rng.standard_normal((STEPS * batch, n_out)).astype(np.float32)
        criterion = torch.nn.MSELoss()
    else:
        y = rng.integers(0, n_out, STEPS * batch).astype(np.int64)
        criterion = torch.nn.CrossEntropyLoss()
    opt = torch.optim.SGD(module.parameters(), lr=LR)
    losses = []
    for i in range(STEPS):
        sl = slice(i * batch, (i + 1) * batch)
        opt.zero_grad()
        loss = criterion(module(torch.from_numpy(x[sl])), torch.from_numpy(y[sl]))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    ref = {"x": x, "y": y, "losses": np.array(losses, np.float64), "batch": np.array(batch)}
    for k, v in module.state_dict().items():
        if v.dtype == torch.float32:
            ref[f"w/{k}"] = v.detach().numpy().copy()
    return ref


def make(name: str, directory: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """Export ``name`` and compute its reference; writes ``<name>.npz`` beside the model."""
    path = export(name, directory)
    ref = torch_reference(name, path)
    np.savez(directory / f"{name}.npz", **ref)
    return path, ref


def main(argv: list[str]) -> int:
    directory = Path(argv[1]) if len(argv) > 1 else HERE
    for name in SPECS:
        path, _ = make(name, directory)
        sizes = sorted(f"{p.name}: {p.stat().st_size} B" for p in path.parent.iterdir() if p.is_file()
                       and p.name.startswith(path.stem if name != "convnet_dynamo" else "model"))
        print(name, "->", ", ".join(sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
