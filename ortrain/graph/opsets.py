"""The opsets and IR versions onnxruntime-training 1.19.2 reads, and the conversion of a model
from elsewhere into them (onnx's version converter)."""

from __future__ import annotations

import copy

import onnx
from onnx import helper, version_converter

from ortrain.errors import OrtrainError
from ortrain.graph.builder import IR_VERSION, OPSET

__all__ = ["MAX_OPSET", "default_opset", "upgrade_opset"]

MAX_OPSET = 21  # the newest default-domain opset onnxruntime 1.19.2 loads
MAX_IR = 10  # the newest IR version it reads


def default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def upgrade_opset(model: onnx.ModelProto, target: int = OPSET) -> onnx.ModelProto:
    """Convert opsets older than ``target`` (and newer than onnxruntime reads) with onnx's converter.

    Opsets from ``target`` to ``MAX_OPSET`` are kept: converting down can lose ops, and
    ortrain's loss graphs are valid at all of them.
    """
    have = default_opset(model)
    want = target if have < target else MAX_OPSET if have > MAX_OPSET else None
    out = model
    if want is not None:
        try:
            out = version_converter.convert_version(model, want)
        except Exception as exc:
            raise OrtrainError(f"from_onnx: the model uses opset {have}; converting it to opset {want} (what "
                               f"onnxruntime-training 1.19.2 trains) failed: {str(exc).splitlines()[0]}. "
                               f"Re-export it with opset_version between {target} and {MAX_OPSET}") from exc
    else:
        out = copy.deepcopy(model)
    needed = helper.find_min_ir_version_for(list(out.opset_import), ignore_unknown=True)
    out.ir_version = min(max(needed, IR_VERSION), MAX_IR)
    return out
