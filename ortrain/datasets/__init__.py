"""Small real data sets bundled with ortrain, so examples and the demo need no network.

``load_digits``: the UCI "Optical Recognition of Handwritten Digits" test set
(1,797 8x8 images of the digits 0-9, pixel counts 0-16), E. Alpaydin and C. Kaynak,
1998, licensed CC BY 4.0 — see ``DIGITS.md`` beside this file.
"""

from __future__ import annotations

from importlib import resources

import numpy as np

from ortrain._arrays import checked_flag
from ortrain._keywords import names_unknown_arguments_of

__all__ = ["load_digits"]


@names_unknown_arguments_of(label="datasets.load_digits")
def load_digits(flatten: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: float32 pixels scaled to [0, 1] and int64 labels 0-9.

    ``x`` is ``(1797, 64)`` when ``flatten`` else ``(1797, 1, 8, 8)`` (channels first).

    >>> x, y = load_digits()
    >>> x.shape, y.shape, int(y.max())
    ((1797, 64), (1797,), 9)
    """
    flatten = checked_flag(flatten, "load_digits(flatten=...)")
    with resources.files(__package__).joinpath("digits.npz").open("rb") as f, np.load(f) as data:
        images = data["images"].astype(np.float32) / 16.0
        labels = data["labels"].astype(np.int64)
    x = images.reshape(len(images), 64) if flatten else images.reshape(len(images), 1, 8, 8)
    return x, labels
