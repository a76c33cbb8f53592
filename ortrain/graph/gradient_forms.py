"""Forms whose gradient onnxruntime-training 1.19.2 builds wrong, silently or not, rewritten into
forms with the same values whose gradient it builds right (each measured against PyTorch).

Only the training and eval graphs are rewritten (:func:`for_training`); the model a user exports
keeps its own ops, but for one form that onnxruntime's inference optimizer gets wrong as well
(:func:`~ortrain.graph.tensor_forms.matmul_vectors_as_matrices`). Each entry of ``FORMS`` pairs a
test (does this node need a rewrite?) with the rewrite, which returns the nodes and initializers
that stand for the node. A form that cannot be rewritten because a shape is unknown is refused,
naming the node.

This module holds the ``FORMS`` table and :func:`for_training`; the forms themselves are in
:mod:`ortrain.graph.tensor_forms` (MatMul, Pow, Where, Split, Transpose, reductions, ReduceMax/Min, Einsum, Pad, adding scatters),
:mod:`ortrain.graph.layer_forms` (Conv, LayerNormalization, LSTM, GRU),
:mod:`ortrain.graph.upsampling_forms` (Resize, ConvTranspose: gradient kernels on CUDA only) and
:mod:`ortrain.graph.norm_forms` (InstanceNormalization and GroupNormalization, which have no gradient
at all), on the graph facts of :mod:`ortrain.graph.shapes`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import onnx

from ortrain.graph.layer_forms import (
    _conv_explicit,
    _conv_needs,
    _layer_norm_needs,
    _layer_norm_rewritten,
    _recurrent_complete,
    _recurrent_needs,
)
from ortrain.graph.norm_forms import _group_norm_decomposed, _instance_norm_decomposed, _norm_needs
from ortrain.graph.passes import average_pool_as_conv, name_batch_dimension, replace_nodes
from ortrain.graph.shapes import _Graph
from ortrain.graph.tensor_forms import (
    _einsum_as_matmuls,
    _einsum_needs,
    _extreme_as_top_k,
    _extreme_needs,
    _global_max_as_top_k,
    _matmul_as_matrix,
    _matmul_needs,
    _pad_as_gathers,
    _pad_needs,
    _pow_needs,
    _pow_widened,
    _reduce_kept,
    _reduce_needs,
    _scatter_add_needs,
    _scatter_add_split,
    _split_as_slices,
    _split_needs,
    _transpose_needs,
    _transpose_with_perm,
    _where_needs,
    _where_widened,
)
from ortrain.graph.upsampling_forms import (
    _conv_transpose_as_conv,
    _conv_transpose_needs,
    _resize_as_matmuls,
    _resize_needs,
)

__all__ = ["FORMS", "for_training", "gradient_forms"]


def for_training(model: onnx.ModelProto, run=None, trainable=None) -> onnx.ModelProto:
    """Rewrites that only the training and eval graphs need (the exported model is left alone).
    ``run`` runs a small model in onnxruntime, for the forms that read the runtime's arithmetic
    off it (``Resize``); without it, a model holding such an op is refused. ``trainable``: the
    weights that train, where known (an average pool no gradient reaches keeps its op)."""
    return name_batch_dimension(gradient_forms(average_pool_as_conv(model, trainable), run))


# Each rewrite: (node, its index, a prefix for new names, the graph) -> (nodes, initializers)
Rewrite = Callable[[onnx.NodeProto, int, str, _Graph], tuple[list, list]]


class Form(NamedTuple):
    needs: Callable[[onnx.NodeProto, _Graph], bool]
    rewrite: Rewrite


def gradient_forms(model: onnx.ModelProto, run=None) -> onnx.ModelProto:
    """``model`` with every node that ``FORMS`` says needs it rewritten (``model`` itself when none does).
    The forms are listed in the docstrings of the ``FORMS`` entries."""
    if not any(n.op_type in FORMS for n in model.graph.node):
        return model
    g = _Graph(model, run)

    def needs(node) -> bool:
        form = FORMS.get(node.op_type)
        return form is not None and form.needs(node, g)

    def rewrite(i, node):
        return FORMS[node.op_type].rewrite(node, i, f"{node.name or node.op_type}/gradient_form_{i}/", g)

    return replace_nodes(model, needs, rewrite)


FORMS: dict[str, Form] = {
    "MatMul": Form(_matmul_needs, _matmul_as_matrix),
    "Pow": Form(_pow_needs, _pow_widened),
    "Where": Form(_where_needs, _where_widened),
    "Split": Form(_split_needs, _split_as_slices),
    "Conv": Form(_conv_needs, _conv_explicit),
    "LayerNormalization": Form(_layer_norm_needs, _layer_norm_rewritten),
    "Transpose": Form(_transpose_needs, _transpose_with_perm),
    "ReduceL2": Form(_reduce_needs, _reduce_kept),
    "ReduceLogSumExp": Form(_reduce_needs, _reduce_kept),
    "ReduceMax": Form(_extreme_needs, _extreme_as_top_k),
    "ReduceMin": Form(_extreme_needs, _extreme_as_top_k),
    "GlobalMaxPool": Form(_extreme_needs, _global_max_as_top_k),
    "Einsum": Form(_einsum_needs, _einsum_as_matmuls),
    "LSTM": Form(_recurrent_needs, _recurrent_complete),
    "GRU": Form(_recurrent_needs, _recurrent_complete),
    "Resize": Form(_resize_needs, _resize_as_matmuls),
    "ConvTranspose": Form(_conv_transpose_needs, _conv_transpose_as_conv),
    "InstanceNormalization": Form(_norm_needs, _instance_norm_decomposed),
    "GroupNormalization": Form(_norm_needs, _group_norm_decomposed),
    "ScatterElements": Form(_scatter_add_needs, _scatter_add_split),
    "ScatterND": Form(_scatter_add_needs, _scatter_add_split),
    "Pad": Form(_pad_needs, _pad_as_gathers),
}
