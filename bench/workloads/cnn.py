"""(d) A small CNN: two 3x3 convolutions with batch norm, 28x28 single-channel input, batch 64,
Adam, cross-entropy on logits: samples/s.

Conv(1->16, same) - BN - ReLU - MaxPool 2 - Conv(16->32, same) - BN - ReLU - MaxPool 2 - Dense 10.
ortrain, the hand-written onnxruntime-training loop and PyTorch eager, each in its own process.
"""

from __future__ import annotations

import numpy as np

from bench.common import compare_workers, implementations, loop_ratios, ort_loop, spread

BATCH, LR = 64, 1e-3
HERE = "bench.workloads.cnn"


def build_model():
    import ortrain as ot
    L = ot.layers
    model = ot.Sequential([L.Conv2D(16, 3, padding="same"), L.BatchNorm(), L.Activation("relu"), L.MaxPool2D(2),
                           L.Conv2D(32, 3, padding="same"), L.BatchNorm(), L.Activation("relu"), L.MaxPool2D(2),
                           L.Flatten(), L.Dense(10)], input_shape=(1, 28, 28), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=LR), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data():
    rng = np.random.default_rng(0)
    return rng.random((BATCH, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, BATCH).astype(np.int64)


def make_ortrain(threads: int | None = None):
    import ortrain as ot
    if threads:
        ot.set_num_threads(threads)
    x, y = data()
    tr = ot.Trainer(build_model(), batch_size=BATCH)
    return lambda: tr.step(x, y)


def make_ort_loop(threads: int | None = None):
    import ortrain as ot
    model = build_model()
    art = ot.artifacts.build(model, loss=model.loss, optimizer=model.optimizer)
    x, y = data()
    return ort_loop(art, [x, y, np.array(1.0, np.float32)], LR, threads)


def make_torch(threads: int | None = None):
    import torch
    F = torch.nn.functional
    if threads:
        torch.set_num_threads(threads)
    w = [torch.tensor(a, requires_grad=True) for a in build_model().get_weights()]
    k1, b1, g1, bt1, m1, v1, k2, b2, g2, bt2, m2, v2, dk, db = w
    trainable = [k1, b1, g1, bt1, k2, b2, g2, bt2, dk, db]
    stats = [t.detach() for t in (m1, v1, m2, v2)]
    opt = torch.optim.Adam(trainable, lr=LR)
    x, y = (torch.from_numpy(a) for a in data())

    def step():
        opt.zero_grad()
        h = F.max_pool2d(F.relu(F.batch_norm(F.conv2d(x, k1, b1, padding=1), stats[0], stats[1], g1, bt1,
                                             training=True, momentum=0.01, eps=1e-3)), 2)
        h = F.max_pool2d(F.relu(F.batch_norm(F.conv2d(h, k2, b2, padding=1), stats[2], stats[3], g2, bt2,
                                             training=True, momentum=0.01, eps=1e-3)), 2)
        loss = F.cross_entropy(h.flatten(1) @ dk + db, y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def run(quick: bool = False) -> dict:
    rounds, warmup, calls = (4, 1, 5) if quick else (15, 3, 20)
    from ortrain.engine import default_threads
    threads = default_threads()
    times, _ = compare_workers(HERE, implementations(), rounds, warmup, calls, threads=threads)
    sec = {n: spread(t) for n, t in times.items()}
    out = {"workload": "cnn", "title": "CNN 2x(conv3x3+BN), 28x28, batch 64, Adam", "threads": threads,
           "rounds": rounds, "calls_per_round": calls,
           "samples_per_s": {n: BATCH / s["median"] for n, s in sec.items()},
           "ms_per_step": {n: {k: 1e3 * s[k] for k in ("median", "p10", "p90")} for n, s in sec.items()},
           "ratios": loop_ratios(times)}
    return out


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
