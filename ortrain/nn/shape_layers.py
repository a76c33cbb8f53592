"""Layers without weights that reshape one tensor (Flatten, Reshape, Permute) or merge several
(Add, Concatenate)."""

from __future__ import annotations

import numpy as np

from ortrain._arrays import is_integer
from ortrain._warnings import warn
from ortrain.errors import OrtrainError, ShapeError, describe_shape
from ortrain.nn.base_layer import Layer

__all__ = ["Add", "Concatenate", "Flatten", "Permute", "Reshape"]


class Flatten(Layer):
    """Every non-batch dimension into one: ``(batch, d1, d2, ...) -> (batch, d1 * d2 * ...)``."""

    def output_shape(self, input_shapes):
        rest = input_shapes[0][1:]
        return (input_shapes[0][0], None if any(d is None for d in rest) else int(np.prod(rest, dtype=np.int64)))

    def emit(self, ctx, inputs):
        return ctx.gb.op("Flatten", [inputs[0]], axis=1)


class Reshape(Layer):
    """Reshape the non-batch dimensions to ``target_shape`` (one entry may be -1)."""

    def __init__(self, target_shape, name=None):
        super().__init__(name)
        if is_integer(target_shape):
            target_shape = (target_shape,)
        if isinstance(target_shape, np.ndarray) and target_shape.ndim == 1:
            target_shape = list(target_shape)
        if not isinstance(target_shape, (tuple, list)) or not all(is_integer(d) for d in target_shape):
            raise OrtrainError(f"Reshape(target_shape=...): expected a tuple of ints, received {target_shape!r}")
        target = tuple(int(d) for d in target_shape)
        if not target or sum(d == -1 for d in target) > 1 or any(d == 0 or d < -1 for d in target):
            raise OrtrainError(f"Reshape(target_shape=...): expected positive sizes and at most one -1, "
                               f"received {target_shape!r}")
        self.target_shape = target

    def output_shape(self, input_shapes):
        rest = input_shapes[0][1:]
        target = list(self.target_shape)
        if any(d is None for d in rest):
            return (input_shapes[0][0],) + tuple(None if d == -1 else d for d in target)
        total = int(np.prod(rest, dtype=np.int64))
        known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
        if (total % known) if -1 in target else known != total:
            why = f"not a multiple of {known}" if -1 in target else f"the target holds {known}"
            raise ShapeError(f"{self.name + ': ' if self.name else ''}Reshape(target_shape={self.target_shape}) cannot hold its input "
                             f"{describe_shape(input_shapes[0])}: {total} values a sample, {why}; give a "
                             f"target_shape whose sizes multiply to {total} (one of them may be -1)")
        if -1 in target:
            target[target.index(-1)] = total // known
        return (input_shapes[0][0],) + tuple(target)

    def emit(self, ctx, inputs):
        # 0 copies the batch dimension, so the batch stays free. The -1 is written resolved where the
        # sizes are known: with 0 rows the runtime cannot infer it.
        rest = ctx.output_shape[1:]
        target = rest if rest and None not in rest else self.target_shape
        shape = ctx.gb.const([0, *target], np.int64, hint="shape")
        return ctx.gb.op("Reshape", [inputs[0], shape])

    def get_config(self):
        return {"name": self.name, "target_shape": list(self.target_shape)}


class Add(Layer):
    """Elementwise sum of two or more tensors of one rank, whose sizes agree or are 1 (broadcast, as
    Keras' merge layers do: a dueling network's value ``(batch, 1)`` plus advantages ``(batch, n)``)."""

    n_inputs = None

    def output_shape(self, input_shapes):
        out = list(input_shapes[0][1:])
        for s in input_shapes[1:]:
            if len(s) - 1 != len(out):
                raise ShapeError(f"Add needs inputs of one rank, received "
                                 f"{', '.join(describe_shape(s) for s in input_shapes)}")
            for k, (a, b) in enumerate(zip(out, s[1:])):
                if a == b or b == 1:
                    continue
                if a == 1 or a is None or b is None:
                    out[k] = None if a is None or b is None else b
                    continue
                raise ShapeError(f"Add needs inputs whose sizes agree or are 1 (broadcast), received "
                                 f"{', '.join(describe_shape(s) for s in input_shapes)}")
        return (input_shapes[0][0], *out)

    def emit(self, ctx, inputs):
        out = inputs[0]
        for other in inputs[1:]:
            out = ctx.gb.op("Add", [out, other])
        return out


class Permute(Layer):
    """Reorder the non-batch dimensions, as Keras' ``Permute``: ``dims`` counts them from 1, so
    ``Permute((2, 3, 1))`` turns ``(batch, channels, height, width)`` into ``(batch, height,
    width, channels)`` (e.g. to put a per-pixel classifier's classes last, where the losses read
    them)."""

    def __init__(self, dims, name=None):
        super().__init__(name)
        if isinstance(dims, np.ndarray) and dims.ndim == 1:
            dims = list(dims)
        if not isinstance(dims, (tuple, list)) or not dims or not all(is_integer(d) for d in dims) \
                or sorted(int(d) for d in dims) != list(range(1, len(dims) + 1)):
            raise OrtrainError(f"Permute(dims=...): expected a permutation of 1 .. n (the non-batch axes, counted "
                               f"from 1, as Keras counts them), e.g. (2, 1), received {dims!r}")
        self.dims = tuple(int(d) for d in dims)

    def output_shape(self, input_shapes):
        shape = input_shapes[0]
        if len(shape) != len(self.dims) + 1:
            raise ShapeError(f"Permute(dims={self.dims}) reorders {len(self.dims)} non-batch axes; its input "
                             f"{describe_shape(shape)} has {len(shape) - 1}")
        return (shape[0],) + tuple(shape[d] for d in self.dims)

    def emit(self, ctx, inputs):
        return ctx.gb.op("Transpose", [inputs[0]], perm=[0, *self.dims])

    def get_config(self):
        return {"name": self.name, "dims": list(self.dims)}


class Concatenate(Layer):
    """Join tensors along ``axis`` (0 is the batch and is refused).

    By default (``axis=None``) along the features: the channels of images, axis 1 of
    ``(batch, channels, height, width)`` tensors (ortrain's images are channels first), else the
    last axis. That is the axis Keras' default (-1, its channels-last images' channels) joins, so
    a U-Net's skip connection ``Concatenate()([up, skip])`` stacks channels here too."""

    n_inputs = None

    def __init__(self, axis: int | None = None, name=None):
        super().__init__(name)
        if axis is not None and (isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer))):
            raise OrtrainError(f"Concatenate(axis=...): expected an int or None (the features), received {axis!r}")
        if axis == 0:
            raise OrtrainError("Concatenate(axis=0) would join along the batch; choose a feature axis")
        self.axis = None if axis is None else int(axis)

    def _build(self, input_shapes, rng) -> None:
        if len(input_shapes[0]) == 4 and self.axis == -1 and not self.__dict__.get("rebuilt"):
            # Keras code ported as written: its axis=-1 is the channels of channels-last images (said
            # once, when the layer is first built, not when a copy or a loaded model rebuilds it;
            # axis=3 names the width without a word)
            warn("Concatenate(axis=-1) joins the width of images, which ortrain lays out as (batch, channels, "
                 "height, width); Keras' axis=-1 joins the channels of its channels-last images. For the "
                 "channels write Concatenate() or Concatenate(axis=1); for the width, axis=3", UserWarning)

    def _axis(self, rank: int) -> int:
        """The axis joined, for inputs of ``rank``."""
        if self.axis is None:
            return 1 if rank == 4 else rank - 1
        return self.axis

    def output_shape(self, input_shapes):
        rank = len(input_shapes[0])
        given = self._axis(rank)
        said = f"Concatenate(axis={self.axis})" if self.axis is not None else \
            f"Concatenate() (axis {given}: {'the channels of images' if given == 1 else 'the last'})"
        if not -rank <= given < rank:
            raise ShapeError(f"{said}: inputs of rank {rank} have axes {-rank} to {rank - 1}")
        axis = given % rank
        if axis == 0:
            raise ShapeError(f"{said}: axis {given} of inputs of rank {rank} is the batch; choose a feature axis")
        if any(len(s) != rank for s in input_shapes):
            raise ShapeError(f"{said} cannot join {', '.join(describe_shape(s) for s in input_shapes)}")
        for d in range(1, rank):
            if d != axis and len({s[d] for s in input_shapes}) > 1:
                raise ShapeError(f"{said} needs equal sizes off the axis, received "
                                 f"{', '.join(describe_shape(s) for s in input_shapes)}; give the axis to join, "
                                 f"e.g. Concatenate(axis={d if d != rank - 1 else -1})")
        sizes = [s[axis] for s in input_shapes]
        total = None if any(v is None for v in sizes) else sum(sizes)
        out = list(input_shapes[0])
        out[axis] = total
        return tuple(out)

    def emit(self, ctx, inputs):
        return ctx.gb.op("Concat", list(inputs), axis=self._axis(len(self.built_for[0]) + 1))

    def get_config(self):
        return {"name": self.name, "axis": self.axis}
