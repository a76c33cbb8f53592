"""Free input sizes checked against the layers at each call's sizes.

A model built over free sizes (``ot.Input((c, None, None))``) checks its layers' shapes once, with
those sizes unknown. The arrays of a call fix them: a pool or convolution whose window is larger
than the image, a ``Reshape`` whose target does not divide the values, a ``Concatenate`` of
lengths that differ. Onnxruntime fails on some of these deep in a step, naming a node, and
returns an empty image for a pool. :class:`SizeCheck` runs the layers' own shape rules at the
call's sizes first and refuses such inputs with the layer's reason and the sizes that would fit.
"""

from __future__ import annotations

from ortrain.errors import ShapeError, describe_shape

__all__ = ["SizeCheck"]

_PLAIN = (int, float, str, bool, type(None))
_KEPT_FITS = 256  # sets of sizes known to fit, kept for the next call
_LARGEST_STEP = 1024  # how far above a refused size the sizes that fit are looked for


def _plain(value) -> bool:
    return isinstance(value, _PLAIN) or isinstance(value, tuple) and all(_plain(v) for v in value)


def _shell(layer):
    """A copy of ``layer`` holding only its settings (no weights, no link to its graph), which its
    ``output_shape`` reads."""
    shell = object.__new__(type(layer))
    shell.__dict__.update({k: v for k, v in layer.__dict__.items() if _plain(v)})
    return shell


class SizeCheck:
    """The layers of a model with free input sizes, as their shape rules need them."""

    def __init__(self, model):
        self._names = [model._input_name(i) for i in range(len(model._inputs))]
        self._declared = [tuple(t.shape) for t in model._inputs]
        slots = {id(t): i for i, t in enumerate(model._inputs)}
        self._program = []
        for node in model._nodes:
            self._program.append((_shell(node.layer), tuple(slots[id(t)] for t in node.inputs)))
            slots[id(node.output)] = len(slots)
        self._fits: set[tuple] = set()

    def __call__(self, shapes: dict[str, tuple], argument: str) -> None:
        """Refuse inputs of ``shapes`` (by input name, batch first) that a layer cannot take."""
        if any(n not in shapes for n in self._names):
            return
        sizes = tuple(tuple(int(d) for d in shapes[n][1:]) for n in self._names)
        if sizes in self._fits:
            return
        refusal = self._refusal(sizes)
        if refusal is None:
            if len(self._fits) < _KEPT_FITS:
                self._fits.add(sizes)
            return
        raise ShapeError(self._message([shapes[n] for n in self._names], sizes, refusal, argument))

    def _refusal(self, sizes) -> tuple | None:
        """``(layer, reason)`` of the first layer refusing inputs of ``sizes``, None where all take them."""
        values = [(None, *s) for s in sizes]
        for layer, refs in self._program:
            try:
                values.append(tuple(layer.output_shape([values[r] for r in refs])))
            except ShapeError as exc:
                return layer, str(exc)
            except Exception:  # noqa: BLE001 - a layer whose rule needs more than its settings: onnxruntime decides
                return None
        return None

    def _message(self, shapes, sizes, refusal, argument: str) -> str:
        layer, reason = refusal
        args = [argument if len(self._names) == 1 else f"{argument}[{n!r}]" for n in self._names]
        received = ", ".join(f"{a} of shape {describe_shape(s)}" for a, s in zip(args, shapes))
        takes = ", ".join(describe_shape(d) for d in self._declared)
        text = (f"{received}: the model takes {takes} with free sizes, and at these sizes its layer "
                f"{layer.name!r} ({type(layer).__name__}) refuses them: {reason.rstrip('.')}. ")
        grow = self._growth(sizes)
        if not grow:
            return text + "Give inputs of sizes the layers take"
        bigger = [self._with(sizes, {a: n + k for a, n in grow.items()}) for k in (1, 2)]
        if all(self._refusal(b) is None for b in bigger):  # (a window: any larger size fits as well)
            return text + "Give " + " and ".join(self._axis(i, j, f"of at least {n}") for (i, j), n in grow.items()) \
                + " (pad or resize the inputs), or sizes the layers take"
        fits = self._with(sizes, grow)
        return text + "Give sizes the layers take, such as " + ", ".join(
            f"{a} of shape {describe_shape((s[0], *f))}" for a, s, f, given in zip(args, shapes, fits, sizes)
            if f != given) + " (pad or crop the inputs)"

    def _growth(self, sizes) -> dict[tuple[int, int], int]:
        """Free axes to grow, each to the smallest size the layers take with the other free axes large
        enough (every free axis raised to one size finds that first), where growing those alone fits;
        empty where none does. Keyed by ``(input, axis after the batch)``."""
        free = [(i, j) for i, d in enumerate(self._declared) for j in range(len(d) - 1) if d[j + 1] is None]
        low = min(sizes[i][j] for i, j in free)
        enough = next((n for n in range(low + 1, low + _LARGEST_STEP + 1)
                       if self._refusal(self._with(sizes, {(i, j): max(sizes[i][j], n) for i, j in free})) is None),
                      None)
        if enough is None:
            return {}
        others = {(i, j): max(sizes[i][j], enough) for i, j in free}
        least = {(i, j): next(n for n in range(sizes[i][j], others[i, j] + 1)
                              if self._refusal(self._with(sizes, others | {(i, j): n})) is None) for i, j in free}
        grow = {a: n for a, n in least.items() if n > sizes[a[0]][a[1]]}
        return grow if self._refusal(self._with(sizes, grow)) is None else {}

    @staticmethod
    def _with(sizes, changes: dict) -> tuple:
        return tuple(tuple(changes.get((i, j), d) for j, d in enumerate(s)) for i, s in enumerate(sizes))

    def _axis(self, i: int, j: int, what: str) -> str:
        rank = len(self._declared[i])
        named = {2: "a height", 3: "a width"}.get(j + 1) if rank == 4 else None
        which = f"{named} (axis {j + 1})" if named else f"axis {j + 1} a size"
        whose = "" if len(self._names) == 1 else f" to input {self._names[i]!r}"
        return f"{which} {what}{whose}"
