"""Models that ``python -m bench.profile`` profiles besides the workloads': layers whose training
kernels ortrain writes in other ops (``ortrain/graph/kernel_forms.py``), at sizes where they
matter. Each has ``build_model()`` and ``data()``, as a workload module does: a classifier of
784 features into 10 classes, trained with Adam."""

from __future__ import annotations

import numpy as np


class _Classifier:
    batch = 0

    @staticmethod
    def layers(L) -> list:
        raise NotImplementedError

    @classmethod
    def build_model(cls):
        import ortrain as ot
        model = ot.Sequential(cls.layers(ot.layers), input_shape=(784,), seed=0)
        return model.compile(optimizer=ot.optim.Adam(lr=1e-3),
                             loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))

    @classmethod
    def data(cls):
        rng = np.random.default_rng(0)
        return rng.random((cls.batch, 784), dtype=np.float32), rng.integers(0, 10, cls.batch).astype(np.int64)


class DenseBatchNorm(_Classifier):
    """784 -> 256, a batch norm over the features, ReLU -> 10; batch 1024."""
    batch = 1024

    @staticmethod
    def layers(L) -> list:
        return [L.Dense(256), L.BatchNorm(), L.Activation("relu"), L.Dense(10)]


class GeluMLP(_Classifier):
    """784 -> 4096 GELU -> 10; batch 128."""
    batch = 128

    @staticmethod
    def layers(L) -> list:
        return [L.Dense(4096, activation="gelu"), L.Dense(10)]
