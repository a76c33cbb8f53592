"""Gradient forms of the upsampling ops (``FORMS`` entries of :mod:`ortrain.graph.gradient_forms`):
``Resize`` and ``ConvTranspose``, whose gradients onnxruntime-training 1.19.2 has kernels for on
CUDA only, written in ops whose gradients run on every device.

* ``Resize`` interpolates each resized axis on its own, so along an axis of input size ``n`` and
  output size ``m`` it is a product with a fixed ``m x n`` matrix (a ``MatMul``). The matrix is read
  off onnxruntime's own Resize, resizing one basis vector at a time with the node's own
  attributes, so every mode, coordinate rule and rounding is the one the exported model runs.
  The product does ``2 n`` operations an output element where the interpolation needs a few, but
  runs on the GEMM kernels: for images up to hundreds of pixels across it is much faster than
  gathering the taps (a ``Gather`` per tap took 50 times as long for 32 x 32 images, most of it in
  the gather's gradient). The resized axes need static sizes; the batch may be free. A nearest
  resize by whole factors that repeats each element (torch's ``Upsample(scale_factor=2)``, checked
  against the runtime at two lengths) of free sizes is instead an ``Expand`` of a new axis after
  each resized one, merged back by a ``Reshape``; with static sizes the matrices are faster (1.3 to
  1.6 times, at 32 to 128 pixels across: the runtime sums the expanded blocks slowly).
* ``ConvTranspose`` is the ``Conv`` of its input with zeros inserted between elements (``stride - 1``
  along each axis), over the weights with input and output channels swapped and the kernel
  flipped, padded by ``dilation * (kernel - 1) - pad`` (a negative padding crops the output).
  The zeros are inserted by ``Pad`` on a new axis after each spatial one and a ``Reshape``, which
  take free sizes; the flip is a ``Gather`` of the weights, which stay the trainable tensor. That
  convolution does ``stride ** dims`` times the transposed convolution's work, most of it on zeros,
  so two cases take other forms with no work on zeros:

  - without dilation and with a kernel at least the stride (DCGAN's ``ConvTranspose2d(c, c // 2, 4,
    stride=2, padding=1)``), one ``Conv`` per output phase (the output positions ``stride * q + r``
    for each ``r``), over the taps that reach it, the phases then interleaved (:func:`_phases`);
  - a 2-D one whose windows tile the output (kernel equal to the stride, no padding, one group) is
    a 1x1 convolution to ``c_out * kh * kw`` channels whose blocks a ``Reshape`` and a ``Transpose``
    put in place.

The exported model keeps ``Resize`` and ``ConvTranspose``; only the training and eval graphs hold
these forms.
"""

from __future__ import annotations

import itertools

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortrain.errors import UnsupportedOpError
from ortrain.graph.passes import attribute, text_attribute
from ortrain.graph.shapes import _Graph, _where

__all__ = ["resize_matrix"]


# -- Resize -------------------------------------------------------------------------------------

def _resize_needs(node, g: _Graph) -> bool:
    return node.input[0] in g.computed and g.floating(node.input[0])


def _refuse(node, i: int, why: str, fix: str):
    form = {"Resize": "a product with a fixed matrix along each axis",
            "ConvTranspose": "convolutions of its input with its kernel's taps"}[node.op_type]
    raise UnsupportedOpError(
        f"{_where(node, i)}: {why}. onnxruntime-training 1.19.2 has a gradient kernel for {node.op_type} on CUDA "
        f"only, so ortrain trains through it as {form}, which needs this. To train, {fix}")


def _resize_parts(node, i: int, g: _Graph, shape: list):
    """``(scales, sizes)`` of a Resize, one entry per axis of ``shape`` (either may be None)."""
    rank = len(shape)
    # models are read at opset 17 or later (ortrain.graph.opsets): Resize(X, roi, scales, sizes)
    scales_name = node.input[2] if len(node.input) > 2 else ""
    sizes_name = node.input[3] if len(node.input) > 3 else ""
    scales = g.constant(scales_name) if scales_name else None
    sizes = g.constant(sizes_name) if sizes_name else None
    if sizes_name and sizes is None:
        # torch writes an output size as Concat(Shape(x)[:2], size): onnx's inference finds it
        sizes = _inferred_sizes(g, node)
    if (scales_name and scales is None) or (sizes_name and sizes is None):
        _refuse(node, i, "its scales or sizes are computed in the graph", "export with a fixed scale "
                "factor or output size (nn.Upsample(scale_factor=2), not a size read from another tensor, and "
                "F.interpolate without recompute_scale_factor=True, which computes the size from the input's)")
    scales = None if scales is None or scales.size == 0 else [float(v) for v in scales.ravel()]
    if isinstance(sizes, np.ndarray):
        sizes = None if sizes.size == 0 else [int(v) for v in sizes.ravel()]
    axes = attribute(node, "axes", None)
    if axes is not None:
        axes = [a % rank for a in axes]
        full_scales = [1.0] * rank if scales is not None else None
        full_sizes = list(shape) if sizes is not None else None
        for k, a in enumerate(axes):
            if scales is not None:
                full_scales[a] = scales[k]
            if sizes is not None:
                full_sizes[a] = sizes[k]
        scales, sizes = full_scales, full_sizes
    if scales is None and sizes is None:
        _refuse(node, i, "it has neither scales nor sizes", "export the resize with one of them")
    if (scales is not None and len(scales) != rank) or (sizes is not None and len(sizes) != rank):
        _refuse(node, i, f"its scales or sizes do not match its input's rank {rank}", "fix the model")
    return scales, sizes


def _inferred_sizes(g: _Graph, node) -> list | None:
    """The output sizes of ``node`` (a Resize) by onnx's shape inference with values propagated,
    the input's dimension where it leaves the batch or the channels unknown (they are not
    resized); None where it leaves a spatial one unknown."""
    source, dims = g.propagated_shape(node.input[0]), g.propagated_shape(node.output[0])
    if source is None or dims is None or len(dims) != len(source) or any(type(d) is not int for d in dims[2:]):
        return None
    return [d if type(d) is int else s for d, s in zip(dims, source)]


def _resized_axes(node, i: int, shape: list, scales, sizes) -> list[int]:
    """The axes a Resize changes; the batch and the channels are refused."""
    axes = [a for a in range(len(shape))
            if (scales is not None and scales[a] != 1.0) or (sizes is not None and sizes[a] != shape[a])]
    for a in axes:
        if a < 2 and len(shape) > 2:
            _refuse(node, i, f"it resizes axis {a} (the batch or the channels)", "resize only the spatial axes")
    return axes


def _repeats(node, g: _Graph, axes: list[int], rank: int, scales) -> list[int] | None:
    """The whole factors of a nearest ``Resize`` that repeats each element along each resized axis
    (torch's ``Upsample(scale_factor=2)``), or None. Checked against the runtime's own answer at
    two lengths, so that it holds at any length (a free one included)."""
    if text_attribute(node, "mode", "nearest") != "nearest" or scales is None:
        return None
    factors = [scales[a] for a in axes]
    if not axes or not all(f == int(f) and f >= 2 for f in factors):
        return None
    for f in set(factors):
        for n in (5, 8):
            try:
                matrix = resize_matrix(node, g.opset, n, f, None, g.run)
            except Exception:  # the runtime takes no such resize: the matrices' path says why
                return None
            if matrix.shape != (n * int(f), n) or not np.array_equal(matrix, np.repeat(np.eye(n), int(f), axis=0)):
                return None
    return [int(scales[a]) for a in range(rank)]


def _resize_repeated(node, p: str, rank: int, repeats: list[int]):
    """A nearest ``Resize`` that repeats each element ``repeats[a]`` times along axis ``a``: a new axis
    after each resized one, ``Expand``-ed to the factor and merged back by a ``Reshape`` whose
    sizes come from the input's shape (free sizes work). Its gradient sums each block."""
    axes = [a for a in range(rank) if repeats[a] != 1]
    spread = [a + k + 1 for k, a in enumerate(axes)]  # the new axes, in the output's numbering
    widths = [1] * (rank + len(axes))
    for a, at in zip(axes, spread):
        widths[at] = repeats[a]
    inits = [numpy_helper.from_array(np.array(spread, np.int64), p + "spread_axes"),
             numpy_helper.from_array(np.array(widths, np.int64), p + "widths"),
             numpy_helper.from_array(np.array(repeats, np.int64), p + "factors")]
    nodes = [helper.make_node("Unsqueeze", [node.input[0], p + "spread_axes"], [p + "spread"], name=p + "Unsqueeze"),
             helper.make_node("Expand", [p + "spread", p + "widths"], [p + "repeated"], name=p + "Expand"),
             helper.make_node("Shape", [node.input[0]], [p + "input_shape"], name=p + "Shape"),
             helper.make_node("Mul", [p + "input_shape", p + "factors"], [p + "output_shape"], name=p + "Sizes"),
             helper.make_node("Reshape", [p + "repeated", p + "output_shape"], [node.output[0]], name=p + "Reshape")]
    return nodes, inits


def resize_matrix(node: onnx.NodeProto, opset: int, size: int, scale: float | None, out_size: int | None,
                  run) -> np.ndarray:
    """The interpolation of ``node`` (a Resize) along one axis of input length ``size``, with
    ``scale`` or ``out_size`` along it, as an ``(m, size)`` matrix: output ``j`` is row ``j`` times
    the input. Read off onnxruntime's own Resize (``run(model, feeds)``), which the exported model
    runs and which agrees with PyTorch, by resizing the ``size`` basis vectors as ``(size, 1, 1,
    size)`` with the node's attributes (onnx's reference implementation differs from both where a
    scale times the size is not whole, and in float64 rounding)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in ("axes",)}
    attrs.pop("keep_aspect_ratio_policy", None)  # one axis: every policy stretches it
    basis = np.eye(size, dtype=np.float32).reshape(size, 1, 1, size)  # row j is e_j
    inputs = ["x", "", "scales", ""] if scale is not None else ["x", "", "", "sizes"]
    feeds = {"x": basis}
    if scale is not None:
        feeds["scales"] = np.array([1.0, 1.0, 1.0, scale], np.float32)
    else:
        feeds["sizes"] = np.array([size, 1, 1, out_size], np.int64)
    graph = helper.make_graph(
        [helper.make_node("Resize", inputs, ["y"], **attrs)], "axis",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT if k != "sizes" else TensorProto.INT64, None)
         for k in feeds], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    probe = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    probe.ir_version = 8
    return np.asarray(run(probe, feeds)[0], np.float64)[:, 0, 0, :].T  # column j answers e_j


def _resize_as_matmuls(node, i: int, p: str, g: _Graph):
    """``Resize`` as a ``MatMul`` by a constant matrix along each resized axis (see the module's docstring)."""
    if text_attribute(node, "coordinate_transformation_mode", "half_pixel") == "tf_crop_and_resize":
        _refuse(node, i, "it crops (coordinate_transformation_mode tf_crop_and_resize)", "resize without cropping")
    if text_attribute(node, "keep_aspect_ratio_policy", "stretch") != "stretch":
        _refuse(node, i, "it keeps the aspect ratio (keep_aspect_ratio_policy)", "give it the output sizes")
    shape = g.propagated_shape(node.input[0])
    if shape is None:
        _refuse(node, i, "the rank of its input is not known", "export the model with its input shapes")
    scales, sizes = _resize_parts(node, i, g, shape)
    if g.run is None:
        raise UnsupportedOpError(f"{_where(node, i)}: ortrain writes a Resize for training with onnxruntime's own "
                                 "interpolation, and no runtime was given to read it from")
    axes = _resized_axes(node, i, shape, scales, sizes)
    free = [a for a in axes if type(shape[a]) is not int]
    if free:  # the matrices are faster (the runtime's Expand gradient is slow), but need the sizes
        repeats = _repeats(node, g, axes, len(shape), scales)
        if repeats is None:
            _refuse(node, i, f"axis {free[0]} of its input has no static size (input shape {shape})",
                    "export the model with static image sizes (no dynamic height or width; for a model of "
                    "ortrain's layers, give ot.Input its height and width), or upsample by a whole factor "
                    "in nearest mode")
        return _resize_repeated(node, p, len(shape), repeats)
    if not axes:
        return [helper.make_node("Identity", [node.input[0]], [node.output[0]], name=p + "Identity")], []
    dtype = helper.tensor_dtype_to_np_dtype(g.shapes.elem_type(node.input[0]) or TensorProto.FLOAT)
    rank = len(shape)
    nodes, inits = [], []
    current = node.input[0]
    for n_axis, a in enumerate(axes):
        try:
            matrix = resize_matrix(node, g.opset, shape[a], None if scales is None else scales[a],
                                   None if sizes is None else sizes[a], g.run)
        except Exception as exc:  # a mode or rule the runtime does not take
            _refuse(node, i, f"onnxruntime cannot resize axis {a} this way ({str(exc).splitlines()[0]})",
                    "export it with a mode and coordinate rule of the ONNX standard at opset 17 or later")
        out = node.output[0] if n_axis == len(axes) - 1 else f"{p}axis{a}"
        q = f"{p}axis{a}/"
        if a == rank - 1:  # x (..., n) @ A^T (n, m)
            inits.append(numpy_helper.from_array(np.ascontiguousarray(matrix.T).astype(dtype), q + "matrix"))
            nodes.append(helper.make_node("MatMul", [current, q + "matrix"], [out], name=q + "MatMul"))
        else:  # A (m, n) @ x (..., n, k), the axis moved next to last and back where it is not
            inits.append(numpy_helper.from_array(matrix.astype(dtype), q + "matrix"))
            perm = list(range(rank))
            perm[a], perm[rank - 2] = rank - 2, a
            moved = current if a == rank - 2 else q + "moved"
            if a != rank - 2:
                nodes.append(helper.make_node("Transpose", [current], [moved], name=q + "Transpose", perm=perm))
            product = out if a == rank - 2 else q + "product"
            nodes.append(helper.make_node("MatMul", [q + "matrix", moved], [product], name=q + "MatMul"))
            if a != rank - 2:
                nodes.append(helper.make_node("Transpose", [product], [out], name=q + "back", perm=perm))
        current = out
    return nodes, inits


# -- ConvTranspose ------------------------------------------------------------------------------

def _conv_transpose_needs(node, g: _Graph) -> bool:
    return True


def _conv_transpose_as_conv(node, i: int, p: str, g: _Graph):
    """``ConvTranspose`` as a ``Conv`` over the zero-inserted input (see the module's docstring)."""
    if text_attribute(node, "auto_pad", "NOTSET") not in ("NOTSET", "", "VALID") or \
            attribute(node, "output_shape", None) is not None:
        _refuse(node, i, "it is sized by auto_pad or output_shape", "export it with explicit pads and "
                "output_padding (as torch.nn.ConvTranspose2d does)")
    wshape = g.shapes.sizes(node.input[1])
    shape = g.propagated_shape(node.input[0])
    if wshape is None or shape is None:
        _refuse(node, i, f"the shape of its weights ({wshape}) or the rank of its input is not known",
                "export the model with its shapes")
    c_in, c_out_group, *kernel = wshape
    dims = len(kernel)
    group = int(attribute(node, "group", 1))
    strides = list(attribute(node, "strides", [1] * dims))
    dilations = list(attribute(node, "dilations", [1] * dims))
    pads = list(attribute(node, "pads", [0] * (2 * dims)))
    output_padding = list(attribute(node, "output_padding", [0] * dims))
    if len(shape) != dims + 2 or c_in % group:
        _refuse(node, i, f"its input {shape} and weights {wshape} do not agree", "fix the model")
    nodes, inits = [], []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), p + name))
        return p + name

    def op(kind, inputs, name, **attrs):
        nodes.append(helper.make_node(kind, inputs, [p + name], name=p + name, **attrs))
        return p + name

    if group == 1 and kernel == strides and not any(pads) and not any(output_padding) and \
            all(d == 1 for d in dilations) and dims == 2:
        # windows that tile the output without overlap (UNet's ConvTranspose2d(c, c // 2, 2, stride=2)):
        # a 1x1 convolution to c_out * kh * kw channels, each pixel's block then put in place
        kh, kw = kernel
        w = op("Transpose", [node.input[1]], "w_blocks", perm=[1, 2, 3, 0])  # (c_out, kh, kw, c_in)
        w = op("Reshape", [w, const("w_shape", np.array([c_out_group * kh * kw, c_in, 1, 1], np.int64))], "w_conv")
        blocks = op("Conv", [node.input[0], w], "blocks", kernel_shape=[1, 1])
        in_shape = op("Shape", [node.input[0]], "input_shape")
        n = op("Slice", [in_shape, const("zero", np.array([0], np.int64)), const("one", np.array([1], np.int64))],
               "batch")
        hw = op("Slice", [in_shape, const("two", np.array([2], np.int64)), const("four", np.array([4], np.int64))],
                "sizes")
        split = op("Concat", [n, const("block_dims", np.array([c_out_group, kh, kw], np.int64)), hw], "block_shape",
                   axis=0)
        x = op("Reshape", [blocks, split], "split_blocks")  # (n, c_out, kh, kw, h, w)
        x = op("Transpose", [x], "placed", perm=[0, 1, 4, 2, 5, 3])  # (n, c_out, h, kh, w, kw)
        merged = op("Concat", [n, const("c_out", np.array([c_out_group], np.int64)),
                               op("Mul", [hw, const("kernel", np.array(kernel, np.int64))], "out_sizes")],
                    "out_shape", axis=0)
        if len(node.input) > 2 and node.input[2]:
            x = op("Reshape", [x, merged], "unbiased")
            bias = op("Reshape", [node.input[2], const("bias_shape", np.array([c_out_group, 1, 1], np.int64))],
                      "bias")
            nodes.append(helper.make_node("Add", [x, bias], [node.output[0]], name=p + "Add"))
        else:
            nodes.append(helper.make_node("Reshape", [x, merged], [node.output[0]], name=p + "Reshape"))
        return nodes, inits

    # the weights: (c_in, c_out/g, *k) -> (c_out, c_in/g, *k), the kernel flipped along each axis
    w = node.input[1]
    if group > 1:
        w = op("Reshape", [w, const("w_groups", [group, c_in // group, c_out_group, *kernel])], "w_grouped")
        w = op("Transpose", [w], "w_swapped", perm=[0, 2, 1, *range(3, dims + 3)])
        w = op("Reshape", [w, const("w_shape", [group * c_out_group, c_in // group, *kernel])], "w_conv")
    else:
        w = op("Transpose", [w], "w_swapped", perm=[1, 0, *range(2, dims + 2)])
    # output position s * q + r (r < s along each axis) is reached only by the taps r, r + s, ...:
    # one small convolution per phase r, their outputs interleaved (no work on zeros); it needs every
    # phase to have a tap (kernel >= stride) and no dilation, and an end padding within reach
    reach = [-(-(k - pads[dims + a] + output_padding[a]) // s) - 1 for a, (k, s) in enumerate(zip(kernel, strides))]
    if any(s > 1 for s in strides) and all(d == 1 for d in dilations) and \
            all(k >= s for k, s in zip(kernel, strides)) and all(c >= 0 for c in reach):
        return _phases(node, w, kernel, strides, pads, output_padding, reach, group, c_out_group, op, const,
                       nodes, inits, p)
    for a, k in enumerate(kernel):
        if k > 1:
            w = op("Gather", [w, const(f"flip{a}", np.arange(k - 1, -1, -1, dtype=np.int64))], f"w_flipped{a}",
                   axis=a + 2)
    # the input with stride - 1 zeros after each element (none after the last) along each axis
    x = node.input[0]
    if any(s > 1 for s in strides):
        spread_axes = [3 + 2 * a for a in range(dims)]  # a new axis after each spatial one
        x = op("Unsqueeze", [x, const("spread_axes", np.array(spread_axes, np.int64))], "spread")
        rank = 2 * dims + 2
        pad_amounts = [0] * (2 * rank)  # Pad's pads: every axis' start, then every axis' end
        for a, s in enumerate(strides):
            pad_amounts[rank + 3 + 2 * a] = s - 1
        x = op("Pad", [x, const("spread_pads", np.array(pad_amounts, np.int64))], "spread_padded")
        # (n, c, h, s_h, w, s_w) -> (n, c, h * s_h, w * s_w)
        in_shape = op("Shape", [node.input[0]], "input_shape")
        head = op("Slice", [in_shape, const("zero", np.array([0], np.int64)), const("two", np.array([2], np.int64))],
                  "input_head")
        spatial = op("Slice", [in_shape, const("two_", np.array([2], np.int64)),
                               const("end", np.array([dims + 2], np.int64))], "input_spatial")
        spread_sizes = op("Mul", [spatial, const("strides", np.array(strides, np.int64))], "spread_sizes")
        target = op("Concat", [head, spread_sizes], "spread_shape", axis=0)
        x = op("Reshape", [x, target], "spread_input")
    # Conv padding: dilation * (k - 1) - pad at the start; at the end also output_padding, less the
    # stride - 1 zeros the spread left after the last element
    begin = [d * (k - 1) - pads[a] for a, (k, d) in enumerate(zip(kernel, dilations))]
    end = [d * (k - 1) - pads[dims + a] + output_padding[a] - (s - 1)
           for a, (k, d, s) in enumerate(zip(kernel, dilations, strides))]
    conv_pads = [max(v, 0) for v in begin] + [max(v, 0) for v in end]
    crop = any(v < 0 for v in begin + end)
    conv_out = p + "conv" if crop else node.output[0]
    inputs = [x, w] + ([node.input[2]] if len(node.input) > 2 and node.input[2] else [])
    nodes.append(helper.make_node("Conv", inputs, [conv_out], name=p + "Conv", group=group,
                                  kernel_shape=kernel, dilations=dilations, strides=[1] * dims, pads=conv_pads))
    if crop:
        big = np.iinfo(np.int64).max
        starts = [max(-v, 0) for v in begin]
        ends = [v if v < 0 else big for v in end]  # a negative end crops -v elements
        nodes.append(helper.make_node(
            "Slice", [conv_out, const("crop_starts", np.array(starts, np.int64)),
                      const("crop_ends", np.array(ends, np.int64)),
                      const("crop_axes", np.arange(2, dims + 2, dtype=np.int64))],
            [node.output[0]], name=p + "crop"))
    return nodes, inits


def _phases(node, w: str, kernel, strides, pads, output_padding, reach, group, c_out_group, op, const, nodes,
            inits, p):
    """``ConvTranspose`` (no dilation, ``kernel >= stride``) as one ``Conv`` per output phase.

    Along an axis, output ``s * q + r - pad_begin`` sums ``x[q - j] * w[r + j * s]`` over ``j``: a
    convolution of ``x`` with the taps ``r, r + s, ...`` (flipped, padded by their count less one
    at the start). Each phase is made ``n + reach`` long (``reach`` is what the output needs past the
    input's length, at most the taps' count less one: the end padding), the phases are stacked on a
    new axis after each spatial one and merged (``(n, c, q1, s1, q2, s2) -> (n, c, q1 s1, q2 s2)``),
    and the padding cropped. ``w`` is the weights as a convolution's, ``(c_out, c_in / group, *k)``,
    not flipped."""
    dims = len(kernel)
    outputs = {}
    for phase in itertools.product(*(range(s) for s in strides)):
        sub, conv_pads, taps = w, [], []
        for a, (r, k, s) in enumerate(zip(phase, kernel, strides)):
            picked = np.arange(r, k, s)[::-1].astype(np.int64)  # the phase's taps, flipped
            taps.append(len(picked))
            sub = op("Gather", [sub, const(f"taps{a}_{r}_{'_'.join(map(str, phase))}", picked)],
                     f"w_phase{'_'.join(map(str, phase))}_{a}", axis=a + 2)
            conv_pads.append(len(picked) - 1)
        conv_pads += list(reach)
        outputs[phase] = op("Conv", [node.input[0], sub], f"phase{'_'.join(map(str, phase))}", group=group,
                            kernel_shape=taps, pads=conv_pads)
    # stack the phases, the last axis first: each stacking adds an axis after its spatial one
    for a in range(dims - 1, -1, -1):
        axis = const(f"stack_axis{a}", np.array([3 + a], np.int64))
        merged = {}
        for phase in {ph[:a] for ph in outputs}:
            parts = [op("Unsqueeze", [outputs[phase + (r,)], axis], f"stack{a}_{'_'.join(map(str, phase + (r,)))}")
                     for r in range(strides[a])]
            merged[phase] = op("Concat", parts, f"stacked{a}_{'_'.join(map(str, phase))}", axis=3 + a)
        outputs = merged
    stacked = outputs[()]
    in_shape = op("Shape", [node.input[0]], "input_shape")
    head = op("Slice", [in_shape, const("zero", np.array([0], np.int64)), const("one", np.array([1], np.int64))],
              "batch")
    spatial = op("Slice", [in_shape, const("two", np.array([2], np.int64)),
                           const("end", np.array([dims + 2], np.int64))], "input_spatial")
    sizes = op("Mul", [op("Add", [spatial, const("reach", np.array(reach, np.int64))], "phase_sizes"),
                       const("strides", np.array(strides, np.int64))], "merged_sizes")
    target = op("Concat", [head, const("c_out", np.array([group * c_out_group], np.int64)), sizes], "merged_shape",
                axis=0)
    merged = op("Reshape", [stacked, target], "merged")
    # crop the padding: pad_begin at the start; at the end, what the phases hold past the output
    big = np.iinfo(np.int64).max
    ends = [(c + 1) * s - (k - pads[dims + a] + output_padding[a])
            for a, (c, s, k) in enumerate(zip(reach, strides, kernel))]
    last = node.output[0]
    has_bias = len(node.input) > 2 and node.input[2]
    if any(pads[:dims]) or any(ends):
        cropped = p + "cropped" if has_bias else last
        nodes.append(helper.make_node(
            "Slice", [merged, const("crop_starts", np.array(pads[:dims], np.int64)),
                      const("crop_ends", np.array([-e if e else big for e in ends], np.int64)),
                      const("crop_axes", np.arange(2, dims + 2, dtype=np.int64))], [cropped], name=p + "crop"))
        merged = cropped
    if has_bias:
        bias = op("Reshape", [node.input[2], const("bias_shape", np.array([-1] + [1] * dims, np.int64))], "bias")
        nodes.append(helper.make_node("Add", [merged, bias], [last], name=p + "Add"))
    elif merged != last:
        nodes.append(helper.make_node("Identity", [merged], [last], name=p + "Identity"))
    return nodes, inits
