"""Measure which ONNX ops the installed onnxruntime-training can differentiate.

``python tests/data/probe_gradient_ops.py`` hands every single-node model of the ONNX
backend test suite (inside the onnx wheel) to the gradient builder, with the node's
float inputs made trainable and a ``ReduceSum`` of its first float output as the loss,
and prints the ops whose verdict differs from ``ortrain.graph.gradient_ops.GRADIENT_OPS``. An
``LSTM`` or ``GRU`` gets the form ortrain's training graphs give it (``gradient_forms.for_training``:
zero initial states, without which the builder's graph does not type), as a model being trained does.
An op counts as differentiable when at least one of its test models builds. Verdicts
other than "no builder registered" (for instance an input that has no gradient path)
are reported but not counted either way.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortrain.engine import run_model
from ortrain.engine.gradients import build_training_graphs
from ortrain.errors import UnsupportedOpError
from ortrain.graph.gradient_forms import for_training
from ortrain.graph.gradient_ops import NON_DIFFERENTIABLE_INPUTS

NODE_TESTS = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "node"
NEWEST_OPSET = 21  # what onnxruntime 1.19.2 loads; newer test models are retried at 17 and 21


def _inputs(case: Path, model: onnx.ModelProto) -> dict:
    values = {}
    for i, vi in enumerate(model.graph.input):
        path = case / "test_data_set_0" / f"input_{i}.pb"
        try:
            t = TensorProto()
            t.ParseFromString(path.read_bytes())
            values[vi.name] = numpy_helper.to_array(t)
        except Exception:  # sequences, optionals, missing data: not a plain tensor
            values[vi.name] = None
    return values


def _with_loss(model: onnx.ModelProto, values: dict) -> tuple[onnx.ModelProto, list[str]] | None:
    floats = [n for n, a in values.items() if isinstance(a, np.ndarray) and a.dtype == np.float32 and a.size]
    outs = [o for o in model.graph.output if o.type.tensor_type.elem_type == TensorProto.FLOAT]
    if not floats or not outs:
        return None
    g = model.graph
    g.initializer.extend(numpy_helper.from_array(values[n], n) for n in floats)
    keep = [vi for vi in g.input if vi.name not in floats]
    del g.input[:]
    g.input.extend(keep)
    g.node.append(helper.make_node("ReduceSum", [outs[0].name], ["probe_loss"], keepdims=0))
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("probe_loss", TensorProto.FLOAT, []))
    model.ir_version = min(model.ir_version, 10)
    return model, floats


def _loadable_opset(model: onnx.ModelProto) -> None:
    if next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) <= NEWEST_OPSET:
        return
    for version in (17, NEWEST_OPSET):
        for o in model.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = version
        try:
            onnx.checker.check_model(model)
            onnx.shape_inference.infer_shapes(model, strict_mode=True)
            return
        except Exception:
            continue


def probe_case(case: Path) -> tuple[str, str] | None:
    """``(op_type, verdict)`` for one backend test directory, or None when it cannot be probed."""
    try:
        model = onnx.load(str(case / "model.onnx"))
    except Exception:
        return None
    if len(model.graph.node) != 1 or model.graph.node[0].domain not in ("", "ai.onnx"):
        return None
    op = model.graph.node[0].op_type
    prepared = _with_loss(model, _inputs(case, model))
    if prepared is None:
        return None
    model, floats = prepared
    node = model.graph.node[0]
    skip = {node.input[k] for k in NON_DIFFERENTIABLE_INPUTS.get(op, ()) if k < len(node.input)}
    floats = [f for f in floats if f not in skip]  # no gradient is asked there (Pow's exponent)
    if not floats:
        return None
    _loadable_opset(model)
    try:
        if op in ("LSTM", "GRU"):  # their builder's graph types only with initial states, which ortrain adds
            model = for_training(model, run=run_model)
        build_training_graphs(model, floats, [], ["probe_loss"])
        return op, "yes"
    except UnsupportedOpError:
        return op, "no"
    except Exception as exc:
        return op, "error: " + str(exc.__cause__ or exc).splitlines()[-1][-160:]


def probe(ops: set[str] | None = None) -> dict[str, str]:
    """``{op_type: "yes" | "no" | "error: ..."}`` over the backend tests (only ``ops`` when given)."""
    verdicts = defaultdict(list)
    for case in sorted(NODE_TESTS.glob("test_*")):
        if "expanded" in case.name:
            continue
        found = probe_case(case) if ops is None or _op_of(case) in ops else None
        if found is not None and "yes" not in verdicts[found[0]]:
            verdicts[found[0]].append(found[1])
    return {op: "yes" if "yes" in v else "no" if "no" in v else v[0] for op, v in sorted(verdicts.items())}


def _op_of(case: Path) -> str | None:
    try:
        model = onnx.load(str(case / "model.onnx"), load_external_data=False)
    except Exception:
        return None
    return model.graph.node[0].op_type if len(model.graph.node) == 1 else None


def main() -> int:
    from ortrain.graph.gradient_ops import GRADIENT_OPS
    found = probe()
    for op, verdict in found.items():
        listed = op in GRADIENT_OPS
        if (verdict == "yes") != listed and not (verdict.startswith("error") and listed):
            print(f"{op}: measured {verdict}, table says {'yes' if listed else 'no'}")
    print(f"{sum(v == 'yes' for v in found.values())} differentiable of {len(found)} probed ops")
    return 0


if __name__ == "__main__":
    sys.exit(main())
