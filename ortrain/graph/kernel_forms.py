"""Training-graph kernels of onnxruntime-training 1.19.2 that are slow on CPU, written in standard
ops, which the runtime vectorises and runs on its thread pool (applied by
:func:`~ortrain.graph.gradient_rewrites.for_gradients` to the graph the gradient builder wrote).

- :func:`batch_norm_2d_in_standard_ops`: a batch norm over ``(batch, features)`` (after a dense
  layer). The runtime's ``BatchNormInternal`` and ``BatchNormalizationGrad`` take 2.7 ms each for
  1024 x 256 values, against 0.3 ms for the standard ops (measured on 2 threads); over images
  (rank 3 and more) the kernels are the faster and stay.
- :func:`gelu_grad_in_standard_ops`: the exact GELU's gradient. The runtime fuses ortrain's
  ``x * (1 + erf(x / sqrt 2)) / 2`` into its ``Gelu`` before building the gradient, whose
  ``GeluGrad`` kernel takes about 4 ns a value.
- :func:`conv_input_grad_as_conv`: a stride-1 convolution's input gradient, as a ``Conv`` of the
  output gradient, where ``ConvGrad`` computes it image by image.
- :func:`grouped_conv_grads_kept_in_bounds`: a fault rather than a cost. ``ConvGrad`` writes the
  input gradient of a grouped 1-D or 3-D convolution past its buffer; what the ``Conv`` form leaves
  of those runs in 2-D, or is refused.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ortrain.errors import UnsupportedOpError
from ortrain.graph.opsets import default_opset
from ortrain.graph.passes import attribute, replace_nodes, text_attribute
from ortrain.graph.shapes import Shapes

__all__ = ["batch_norm_2d_in_standard_ops", "conv_input_grad_as_conv", "gelu_grad_in_standard_ops",
           "grouped_conv_grads_kept_in_bounds"]

_AXIS_0, _TRUE, _FIRST = "ortrain.batch_norm_2d/axis_0", "ortrain.batch_norm_2d/true", "ortrain.batch_norm_2d/first"


def batch_norm_2d_in_standard_ops(model: onnx.ModelProto, forward: onnx.ModelProto,
                                  float32: set[str]) -> onnx.ModelProto:
    """``model`` (a training graph) with each training-mode ``BatchNormInternal`` and each
    ``BatchNormalizationGrad`` whose input is a ``float32`` value of rank 2 (by the shapes of
    ``forward``, the standard-ONNX graph it was built from) written in standard ops; ``model``
    itself when there is none. Statistics over the batch axis, as the kernels compute them:

        mean = ReduceMean(x, 0);  d = x - mean;  var = ReduceMean(d * d, 0)  (the population variance)
        inv_std = 1 / Sqrt(var + epsilon);  y = d * (inv_std * scale) + bias
        running_mean <- running_mean * momentum + mean * (1 - momentum)  (running_var alike, from var)

    and the gradient, ``n`` the batch size and ``x_hat = (x - mean) * inv_std`` from the saved
    statistics:

        dbias = ReduceSum(dy, 0);  dscale = ReduceSum(dy * x_hat, 0)
        dx = scale * inv_std * (dy - dbias / n - x_hat * dscale / n)

    The kernel writes the running statistics into the buffers it reads (its outputs 1 and 2 alias
    inputs 3 and 4); the standard form writes them with ``InPlaceAccumulatorV2`` (overwrite), whose
    output aliases its buffer in the same way, so a later application that reads that output (a
    shared layer, chained by ``chain_shared_statistics``) updates after it."""
    shapes = Shapes(forward)

    def two_d(name: str) -> bool:
        return name in float32 and shapes.rank(name) == 2

    def rewritable(node) -> bool:
        if node.domain != "com.microsoft":
            return False
        if node.op_type == "BatchNormInternal":
            return attribute(node, "training_mode", 0) == 1 and len(node.input) == 5 and two_d(node.input[0])
        return node.op_type == "BatchNormalizationGrad" and len(node.input) == 5 and two_d(node.input[1])

    opset = default_opset(model)

    def reduce(op: str, x: str, out: str) -> onnx.NodeProto:
        if opset >= (18 if op == "ReduceMean" else 13):  # the axes became an input
            return helper.make_node(op, [x, _AXIS_0], [out], name=out, keepdims=0)
        return helper.make_node(op, [x], [out], name=out, axes=[0], keepdims=0)

    def standard(i, node):
        p = f"{node.name or node.op_type}/standard_{i}/"
        outputs = list(node.output) + [""] * (5 - len(node.output))

        def out(k: int, local: str) -> str:
            return outputs[k] or p + local

        def scalar(local: str, value) -> onnx.TensorProto:
            return numpy_helper.from_array(np.array(value, np.float32), p + local)

        if node.op_type == "BatchNormInternal":
            return _forward(node, p, out, scalar, reduce)
        return _gradient(node, p, out, reduce)

    return replace_nodes(model, rewritable, standard,
                         [numpy_helper.from_array(np.array([0], np.int64), _AXIS_0),
                          numpy_helper.from_array(np.array([True]), _TRUE),
                          numpy_helper.from_array(np.array(0, np.int64), _FIRST)])


def _forward(node, p: str, out, scalar, reduce):
    x, scale, bias, running_mean, running_var = node.input
    momentum = np.float32(attribute(node, "momentum", 0.9))
    eps, kept, moved = p + "epsilon", p + "momentum", p + "one_minus_momentum"
    mean, inv_std = out(3, "mean"), out(4, "inv_std")
    nodes = [reduce("ReduceMean", x, mean),
             helper.make_node("Sub", [x, mean], [p + "centred"], name=p + "Centred"),
             helper.make_node("Mul", [p + "centred", p + "centred"], [p + "squares"], name=p + "Squares"),
             reduce("ReduceMean", p + "squares", p + "var"),
             helper.make_node("Add", [p + "var", eps], [p + "var_eps"], name=p + "AddEpsilon"),
             helper.make_node("Sqrt", [p + "var_eps"], [p + "std"], name=p + "Std"),
             helper.make_node("Reciprocal", [p + "std"], [inv_std], name=p + "InvStd"),
             helper.make_node("Mul", [inv_std, scale], [p + "factor"], name=p + "Factor"),
             helper.make_node("Mul", [p + "centred", p + "factor"], [p + "scaled"], name=p + "Scaled"),
             helper.make_node("Add", [p + "scaled", bias], [out(0, "y")], name=p + "Shifted")]
    for k, (buffer, batch, what) in enumerate(((running_mean, mean, "mean"), (running_var, p + "var", "var")), 1):
        q = f"{p}running_{what}/"
        nodes += [helper.make_node("Mul", [buffer, kept], [q + "kept"], name=q + "Kept"),
                  helper.make_node("Mul", [batch, moved], [q + "moved"], name=q + "Moved"),
                  helper.make_node("Add", [q + "kept", q + "moved"], [q + "new"], name=q + "New"),
                  helper.make_node("InPlaceAccumulatorV2", [buffer, q + "new", _TRUE],
                                   [q + "written", out(k, f"running_{what}")], name=q + "Write",
                                   domain="com.microsoft")]
    inits = [scalar("epsilon", attribute(node, "epsilon", 1e-5)), scalar("momentum", momentum),
             scalar("one_minus_momentum", np.float32(1) - momentum)]
    return nodes, inits


def _gradient(node, p: str, out, reduce):
    dy, x, scale, mean, inv_std = node.input
    dbias, dscale = out(2, "dbias"), out(1, "dscale")
    nodes = [helper.make_node("Sub", [x, mean], [p + "centred"], name=p + "Centred"),
             helper.make_node("Mul", [p + "centred", inv_std], [p + "x_hat"], name=p + "XHat"),
             reduce("ReduceSum", dy, dbias),
             helper.make_node("Mul", [dy, p + "x_hat"], [p + "dy_x_hat"], name=p + "DyXHat"),
             reduce("ReduceSum", p + "dy_x_hat", dscale)]
    if node.output and node.output[0]:
        nodes += [helper.make_node("Shape", [x], [p + "shape"], name=p + "Shape"),
                  helper.make_node("Gather", [p + "shape", _FIRST], [p + "batch"], name=p + "Batch", axis=0),
                  helper.make_node("Cast", [p + "batch"], [p + "n"], name=p + "N", to=onnx.TensorProto.FLOAT),
                  helper.make_node("Reciprocal", [p + "n"], [p + "inv_n"], name=p + "InvN"),
                  helper.make_node("Mul", [dbias, p + "inv_n"], [p + "mean_dy"], name=p + "MeanDy"),
                  helper.make_node("Mul", [dscale, p + "inv_n"], [p + "mean_dy_x_hat"], name=p + "MeanDyXHat"),
                  helper.make_node("Mul", [p + "x_hat", p + "mean_dy_x_hat"], [p + "along_x_hat"], name=p + "Along"),
                  helper.make_node("Sub", [dy, p + "mean_dy"], [p + "centred_dy"], name=p + "CentredDy"),
                  helper.make_node("Sub", [p + "centred_dy", p + "along_x_hat"], [p + "projected"], name=p + "Projected"),
                  helper.make_node("Mul", [scale, inv_std], [p + "factor"], name=p + "Factor"),
                  helper.make_node("Mul", [p + "projected", p + "factor"], [node.output[0]], name=p + "Dx")]
    return nodes, []


def gelu_grad_in_standard_ops(model: onnx.ModelProto, float32: set[str]) -> onnx.ModelProto:
    """``model`` (a training graph) with each ``GeluGrad(dy, x)`` of a ``float32`` value written as

        dx = dy * (Phi(x) + x * phi(x)),  Phi(x) = erf(x / sqrt 2) / 2 + 1/2,  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)

    the exact GELU's derivative, as the kernel computes it. onnxruntime-training 1.19.2's CPU
    ``GeluGrad`` takes 2.2 ms for 128 x 4096 values, these ops 1.3 ms on two threads (measured), with
    about half the kernel's float32 error (1.2e-7 against 2.2e-7 at most). ``model`` itself when
    there is none."""

    def rewritable(node) -> bool:
        return node.op_type == "GeluGrad" and node.domain == "com.microsoft" and len(node.input) == 2 and \
            node.input[1] in float32

    def standard(i, node):
        dy, x = node.input
        p = f"{node.name or 'GeluGrad'}/standard_{i}/"
        c = {k: p + k for k in ("inv_sqrt2", "half", "minus_half", "inv_sqrt_2pi")}
        nodes = [helper.make_node("Mul", [x, c["inv_sqrt2"]], [p + "scaled"], name=p + "Scaled"),
                 helper.make_node("Erf", [p + "scaled"], [p + "erf"], name=p + "Erf"),
                 helper.make_node("Mul", [p + "erf", c["half"]], [p + "half_erf"], name=p + "HalfErf"),
                 helper.make_node("Add", [p + "half_erf", c["half"]], [p + "cdf"], name=p + "Cdf"),
                 helper.make_node("Mul", [x, x], [p + "square"], name=p + "Square"),
                 helper.make_node("Mul", [p + "square", c["minus_half"]], [p + "exponent"], name=p + "Exponent"),
                 helper.make_node("Exp", [p + "exponent"], [p + "bell"], name=p + "Bell"),
                 helper.make_node("Mul", [x, c["inv_sqrt_2pi"]], [p + "x_over"], name=p + "XOver"),
                 helper.make_node("Mul", [p + "bell", p + "x_over"], [p + "x_pdf"], name=p + "XPdf"),
                 helper.make_node("Add", [p + "cdf", p + "x_pdf"], [p + "slope"], name=p + "Slope"),
                 helper.make_node("Mul", [dy, p + "slope"], [node.output[0]], name=p + "Dx")]
        values = {"inv_sqrt2": 1 / math.sqrt(2), "half": 0.5, "minus_half": -0.5, "inv_sqrt_2pi": 1 / math.sqrt(2 * math.pi)}
        return nodes, [numpy_helper.from_array(np.array(values[k], np.float32), c[k]) for k in values]

    return replace_nodes(model, rewritable, standard)


def conv_input_grad_as_conv(model: onnx.ModelProto, forward: onnx.ModelProto, float32: set[str]) -> onnx.ModelProto:
    """``model`` (a training graph) with the input gradient of each stride-1 ``ConvGrad`` over a
    ``float32`` input computed as a ``Conv`` of the output gradient with the kernel flipped in
    space, its input and output channels swapped within each group (a transposed convolution at
    stride 1):

        dX = Conv(dY, flip(W^T), pads = dilation * (kernel - 1) - pads, same dilations and groups)

    ``ConvGrad`` keeps the weight and bias gradients. onnxruntime-training 1.19.2's kernel computes
    the input gradient image by image, a small GEMM and a ``col2im`` each; the ``Conv`` runs the
    runtime's convolution. Measured on 2 threads, the whole gradient against the kernel's:

    - 2-D, one group: 0.6-0.95 of the time where the convolution keeps or narrows the channels
      (16 to 32 channels of 64 x 14 x 14: 0.8), 0.95-1.06 where it doubles them, 1.2-2 times
      where it widens them more (8 to 64: 1.55), so it applies up to twice the input channels;
    - 1-D and 3-D: 0.25-0.6, up to 8 times the channels;
    - one group per channel (depthwise): 0.6-0.7.

    Grouped 1-D and 3-D convolutions take it at every group count, for a fault of the kernel as
    much as for speed: its input gradient of such a convolution writes past the end of its buffer
    (the process aborts: "free(): invalid pointer"); :func:`grouped_conv_grads_kept_in_bounds`
    takes those left over. Left to the kernel, where the convolution was measured slower or is not
    written: strides, ``auto_pad`` SAME, fewer than 8 input channels in one group (3 channels of 5 x 5:
    3.5 ms against 7.3), 2-D groups other than one per channel, unknown kernel sizes, and padding
    beyond the kernel's reach. ``model`` itself when there is none."""
    shapes = Shapes(forward)

    def geometry(node):
        """(kernel shape, dilations, flipped pads, group, weight shape) where the rewrite applies, else None."""
        found = _conv_grad(node, shapes)
        if found is None:
            return None
        w, kernel, strides, dilations, pads, group = found
        if node.input[1] not in float32 and (group == 1 or len(kernel) == 2):  # (the kernel is float32 only)
            return None
        rank, channels = len(kernel), w[1] * group
        if any(s != 1 for s in strides):
            return None
        if group == 1:
            fitting = channels >= 8 and (rank != 2 or w[0] <= 2 * channels)
        else:
            fitting = rank != 2 or group == channels == w[0]
        flipped = [d * (k - 1) - p for d, k, p in zip(dilations * 2, kernel * 2, pads)]
        return (kernel, dilations, flipped, group, w) if fitting and min(flipped) >= 0 else None

    def as_conv(i, node):
        kernel, dilations, pads, group, shape = geometry(node)
        dy, _, w = node.input
        p = f"{node.name or 'ConvGrad'}/input_as_conv_{i}/"
        rank = len(kernel)
        inits = [numpy_helper.from_array(np.array(v, np.int64), p + name) for name, v in
                 (("starts", [-1] * rank), ("ends", [np.iinfo(np.int64).min] * rank), ("axes", list(range(2, rank + 2))),
                  ("steps", [-1] * rank))]
        if group == 1:
            nodes = [helper.make_node("Transpose", [w], [p + "swapped"], name=p + "Swap", perm=[1, 0, *range(2, rank + 2)])]
        elif shape[0] == group and shape[1] == 1:  # one filter a channel: nothing to swap
            nodes = [helper.make_node("Identity", [w], [p + "swapped"], name=p + "Swap")]
        else:  # (M, C/g, k) -> (g, M/g, C/g, k) -> (g, C/g, M/g, k) -> (C, M/g, k)
            m, c = shape[0] // group, shape[1]
            inits += [numpy_helper.from_array(np.array([group, m, c, *kernel], np.int64), p + "grouped"),
                      numpy_helper.from_array(np.array([group * c, m, *kernel], np.int64), p + "ungrouped")]
            nodes = [helper.make_node("Reshape", [w, p + "grouped"], [p + "by_group"], name=p + "ByGroup"),
                     helper.make_node("Transpose", [p + "by_group"], [p + "swapped_by_group"], name=p + "Swap",
                                      perm=[0, 2, 1, *range(3, rank + 3)]),
                     helper.make_node("Reshape", [p + "swapped_by_group", p + "ungrouped"], [p + "swapped"],
                                      name=p + "Ungroup")]
        nodes += [helper.make_node("Slice", [p + "swapped", p + "starts", p + "ends", p + "axes", p + "steps"],
                                   [p + "flipped"], name=p + "Flip"),
                  helper.make_node("Conv", [dy, p + "flipped"], [node.output[0]], name=p + "Conv", kernel_shape=kernel,
                                   pads=pads, dilations=dilations, group=group)]
        rest = helper.make_node("ConvGrad", list(node.input), ["", *node.output[1:]], name=node.name, domain=node.domain)
        rest.attribute.extend(node.attribute)
        if any(rest.output):
            nodes.append(rest)
        return nodes, inits

    return replace_nodes(model, lambda n: geometry(n) is not None, as_conv)


def _conv_grad(node, shapes: Shapes):
    """``(weight shape, kernel, strides, dilations, pads, group)`` of a ``ConvGrad`` that computes an
    input gradient, with explicit pads and a known weight shape; else None."""
    if node.op_type != "ConvGrad" or node.domain != "com.microsoft" or len(node.input) != 3 or \
            not node.output or not node.output[0]:
        return None
    w = shapes.sizes(node.input[2])
    auto_pad = text_attribute(node, "auto_pad", "NOTSET")
    if w is None or len(w) < 3 or auto_pad not in ("NOTSET", "VALID"):
        return None
    rank = len(w) - 2
    kernel = list(attribute(node, "kernel_shape", None) or w[2:])
    strides = list(attribute(node, "strides", None) or [1] * rank)
    dilations = list(attribute(node, "dilations", None) or [1] * rank)
    pads = [0] * (2 * rank) if auto_pad == "VALID" else list(attribute(node, "pads", None) or [0] * (2 * rank))
    if kernel != w[2:] or len(strides) != rank or len(dilations) != rank or len(pads) != 2 * rank:
        return None
    return w, kernel, strides, dilations, pads, attribute(node, "group", 1)


def grouped_conv_grads_kept_in_bounds(model: onnx.ModelProto, forward: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (a training graph) with each ``ConvGrad`` of a grouped 1-D convolution that computes
    an input gradient (those :func:`conv_input_grad_as_conv` leaves: strided ones, padding beyond
    the kernel's reach) computed as the 2-D one over a height of 1. onnxruntime-training 1.19.2's
    kernel writes the input gradient of a grouped convolution that is not 2-D past the end of its
    buffer: it clears the whole input's size from each group's start, and the process aborts
    ("free(): invalid pointer", "corrupted size vs. prev_size") or goes on with its memory
    overwritten. Its 2-D path clears one group's share. A grouped 3-D convolution of that kind has
    no such form and is refused (:class:`~ortrain.errors.UnsupportedOpError`). ``model`` itself when
    there is none."""
    shapes = Shapes(forward)

    def grouped(node) -> bool:
        found = _conv_grad(node, shapes)
        if found is None:
            ungrouped_2d = attribute(node, "group", 1) == 1 or len(attribute(node, "kernel_shape", None) or [0, 0]) == 2
            if node.op_type == "ConvGrad" and node.output and node.output[0] and not ungrouped_2d:
                raise _grouped_conv_refused(node, "its weight's shape or its padding is not known")
            return False
        w, kernel, *_, group = found
        if group == 1 or len(kernel) == 2:
            return False
        if len(kernel) != 1:
            raise _grouped_conv_refused(node, "it is strided, or padded beyond its kernel's reach")
        return True

    def as_2d(i, node):
        _, kernel, strides, dilations, pads, group = _conv_grad(node, shapes)
        dy, x, w = node.input
        p = f"{node.name or 'ConvGrad'}/as_2d_{i}/"
        outputs = list(node.output) + [""] * (3 - len(node.output))
        nodes = [helper.make_node("Unsqueeze", [v, p + "axis"], [p + f"{k}_2d"], name=p + f"Lift_{k}")
                 for k, v in (("dy", dy), ("x", x), ("w", w))]
        grad = helper.make_node("ConvGrad", [p + "dy_2d", p + "x_2d", p + "w_2d"],
                                [p + "dx_2d", p + "dw_2d" if outputs[1] else "", outputs[2]], name=p + "ConvGrad",
                                domain="com.microsoft", kernel_shape=[1, *kernel], strides=[1, *strides],
                                dilations=[1, *dilations], pads=[0, pads[0], 0, pads[1]], group=group)
        nodes += [grad, helper.make_node("Squeeze", [p + "dx_2d", p + "axis"], [outputs[0]], name=p + "Drop_dx")]
        if outputs[1]:
            nodes.append(helper.make_node("Squeeze", [p + "dw_2d", p + "axis"], [outputs[1]], name=p + "Drop_dw"))
        return nodes, [numpy_helper.from_array(np.array([2], np.int64), p + "axis")]

    return replace_nodes(model, grouped, as_2d)  # (training graphs are at opset 17 or newer: axes are inputs)


def _grouped_conv_refused(node, why: str) -> UnsupportedOpError:
    return UnsupportedOpError(
        f"ConvGrad node {node.name!r}: onnxruntime-training 1.19.2's gradient of a grouped convolution that is not "
        f"2-D writes past its buffer (the process aborts), and ortrain cannot write it another way ({why}); "
        "give the convolution stride 1 and padding within its kernel, or freeze the weights before it")
