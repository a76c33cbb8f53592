"""Free input sizes checked against the layers at each call's sizes.

A model built over free sizes (``ot.Input((c, None, None))``) checks its layers' shapes once, with
those sizes unknown. The arrays of a call fix them: a pool or convolution whose window is larger
than the image, a ``Reshape`` whose target does not divide the values, a ``Concatenate`` of
lengths that differ. Onnxruntime fails on some of these deep in a step, naming a node, and
returns an empty image for a pool. :class:`SizeCheck` runs the layers' own shape rules at the
call's sizes first and refuses such inputs with the layer's reason and sizes that would fit.
"""

from __future__ import annotations

import time

from ortrain.errors import ShapeError, describe_shape

__all__ = ["SizeCheck"]

_PLAIN = (int, float, str, bool, type(None))
_KEPT_FITS = 256  # sets of sizes known to fit, kept for the next calls (then started over)
_NEAR = 64  # sizes looked at one by one from a refused one; beyond them, doubling steps up to 2 ** 16
_LARGER_TRIED = 32  # sizes above the least that fits tried before saying "at least" (strides make gaps)
_SEARCH_SECONDS = 0.2  # the time the search for sizes that fit may take (a refusal stays well under a second)


class _Spent(Exception):
    """The search for sizes that fit ran past its deadline."""


def _plain(value) -> bool:
    if isinstance(value, (tuple, list)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return isinstance(value, _PLAIN)


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
        self._program = []  # (layer's settings, its inputs' slots, its output's shape as built)
        for node in model._nodes:
            self._program.append((_shell(node.layer), tuple(slots[id(t)] for t in node.inputs),
                                  tuple(node.output.shape)))
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
            if len(self._fits) >= _KEPT_FITS:
                self._fits = set()
            self._fits.add(sizes)
            return
        raise ShapeError(self._message([shapes[n] for n in self._names], sizes, refusal, argument))

    def _refusal(self, sizes, deadline: float | None = None) -> tuple | None:
        """``(layer, reason)`` of the first layer refusing inputs of ``sizes``, None where all take them.
        A layer whose rule needs more than its settings (one of the caller's) gives the shape it was
        built with, and the layers after it are checked from there. ``deadline``: a search's end
        (``time.perf_counter``), past which :class:`_Spent` is raised."""
        if deadline is not None and time.perf_counter() > deadline:
            raise _Spent
        values = [(None, *s) for s in sizes]
        for layer, refs, built in self._program:
            try:
                values.append(tuple(layer.output_shape([values[r] for r in refs])))
            except ShapeError as exc:
                return layer, str(exc)
            except Exception:  # noqa: BLE001 - onnxruntime has the last word on what this layer takes
                values.append(built)
        return None

    def _message(self, shapes, sizes, refusal, argument: str) -> str:
        layer, reason = refusal
        # the reason as the layer gives it when a model is built, without its fix (which is the model's)
        reason = reason.removeprefix(f"{layer.name}: ").split("; ")[0].rstrip(".")
        args = [argument if len(self._names) == 1 else f"{argument}[{n!r}]" for n in self._names]
        received = ", ".join(f"{a} of shape {describe_shape(s)}" for a, s in zip(args, shapes))
        takes = ", ".join(describe_shape(d) for d in self._declared)
        text = (f"{received}: the model takes {takes} with free sizes, and at these sizes its layer "
                f"{layer.name!r} ({type(layer).__name__}) refuses them: {reason}. ")
        try:
            hint = self._hint(sizes, args, shapes, time.perf_counter() + _SEARCH_SECONDS)
        except _Spent:
            hint = None
        return text + (hint or "Give inputs of sizes the layers take")

    def _hint(self, sizes, args, shapes, deadline) -> str | None:
        """Sizes that fit: each free axis too small with the least it takes, where every larger size
        fits as well (a window's); else sizes that fit near the ones given; None where none is found."""
        grow = self._growth(sizes, deadline)
        if grow and self._larger_fit(sizes, grow, deadline):
            return "Give " + " and ".join(self._axis(i, j, n) for (i, j), n in grow.items()) \
                + " (pad or resize the inputs)"
        fits = self._with(sizes, grow) if grow else self._nearest(sizes, deadline)
        if fits is None:
            return None
        return "Give sizes the layers take, such as " + ", ".join(
            f"{a} of shape {describe_shape((s[0], *f))}" for a, s, f, given in zip(args, shapes, fits, sizes)
            if f != given) + " (pad or crop the inputs)"

    def _larger_fit(self, sizes, grow: dict, deadline) -> bool:
        """Whether sizes above ``grow``'s fit too: each axis grown alone and all together, by up to
        ``_LARGER_TRIED`` and to a few multiples (a window's period may be long)."""
        above = [lambda n, k=k: n + k for k in range(1, _LARGER_TRIED + 1)] + \
            [lambda n, m=m, k=k: n * m + k for m in (2, 3, 4, 8) for k in (0, 1)]
        for larger in above:
            tried = [{a: larger(n) for a, n in grow.items()}] + [grow | {a: larger(n)} for a, n in grow.items()]
            if any(self._refusal(self._with(sizes, t), deadline) is not None for t in tried):
                return False
        return True

    def _free(self) -> list[tuple[int, int]]:
        """The free axes, as ``(input, axis after the batch)``."""
        return [(i, j) for i, d in enumerate(self._declared) for j in range(len(d) - 1) if d[j + 1] is None]

    @staticmethod
    def _steps() -> list[int]:
        """How far from a given size the searches look: one by one, then doubling."""
        return list(range(1, _NEAR + 1)) + [2 ** k for k in range(_NEAR.bit_length(), 17)]

    def _growth(self, sizes, deadline) -> dict[tuple[int, int], int]:
        """Free axes to grow, each to the least size the layers take with the other free axes large
        enough (every free axis raised to one size finds that first), where growing those alone fits;
        empty where none does."""
        free = self._free()
        low = min(sizes[i][j] for i, j in free)
        enough = next((low + d for d in self._steps() if self._refusal(
            self._with(sizes, {(i, j): max(sizes[i][j], low + d) for i, j in free}), deadline) is None), None)
        if enough is None:
            return {}
        others = {(i, j): max(sizes[i][j], enough) for i, j in free}
        grow = {}
        for a in free:
            below, fits = sizes[a[0]][a[1]] - 1, others[a]  # the least that fits, by halving (checked below)
            while fits - below > 1:
                mid = (below + fits) // 2
                below, fits = (below, mid) if self._refusal(self._with(sizes, others | {a: mid}), deadline) is None \
                    else (mid, fits)
            if fits > sizes[a[0]][a[1]]:
                grow[a] = fits
        return grow if grow and self._refusal(self._with(sizes, grow), deadline) is None else {}

    def _nearest(self, sizes, deadline) -> tuple | None:
        """Sizes that fit with one free axis changed, the nearest to the size given (smaller first);
        None where no one axis does."""
        free = self._free()
        for step in self._steps():
            for i, j in free:
                for n in (sizes[i][j] - step, sizes[i][j] + step):
                    if n >= 1 and self._refusal(candidate := self._with(sizes, {(i, j): n}), deadline) is None:
                        return candidate
        return None

    @staticmethod
    def _with(sizes, changes: dict) -> tuple:
        return tuple(tuple(changes.get((i, j), d) for j, d in enumerate(s)) for i, s in enumerate(sizes))

    def _axis(self, i: int, j: int, least: int) -> str:
        rank = len(self._declared[i])
        named = {2: "a height", 3: "a width"}.get(j + 1) if rank == 4 else None
        which = f"{named} (axis {j + 1})" if named else f"axis {j + 1} a size"
        whose = "" if len(self._names) == 1 else f" to input {self._names[i]!r}"
        return f"{which} of at least {least}{whose}"
