"""(b) ``Trainer.step`` per call on the reference page's example size: a 4 -> 8 -> 2 softmax
classifier, batch 16, Adam, categorical cross-entropy; and ``Model.train_on_batch`` on the same
model and batch (Keras' one-step call, which keeps its trainer open between calls).

Against the hand-written onnxruntime-training loop over the same artifacts and a PyTorch eager
loop with the same weights, each in its own process and on one thread: at this size a second
thread only adds synchronisation.
"""

from __future__ import annotations

import numpy as np

from bench.common import compare_workers, implementations, loop_ratios, ort_loop, paired_ratio, spread

BATCH, LR, THREADS = 16, 1e-3, 1
HERE = "bench.workloads.trainer_step"


def build_model():
    import ortrain as ot
    model = ot.Sequential([ot.layers.Dense(8, activation="relu"), ot.layers.Dense(2, activation="softmax")],
                          input_shape=(4,), seed=0)
    model.compile(optimizer=ot.optim.Adam(lr=LR), loss="categorical_crossentropy")
    return model


def data():
    rng = np.random.default_rng(0)
    x = rng.random((BATCH, 4), dtype=np.float32)
    y = np.eye(2, dtype=np.float32)[(x.sum(1) > 2).astype(int)]
    return x, y


def make_ortrain():
    import ortrain as ot
    ot.set_num_threads(THREADS)
    x, y = data()
    tr = ot.Trainer(build_model(), batch_size=BATCH)
    return lambda: tr.step(x, y)


def make_train_on_batch():
    import ortrain as ot
    ot.set_num_threads(THREADS)
    x, y = data()
    model = build_model()
    return lambda: model.train_on_batch(x, y)


def make_ort_loop():
    import ortrain as ot
    model = build_model()
    art = ot.artifacts.build(model, loss=model.loss, optimizer=model.optimizer)
    x, y = data()
    return ort_loop(art, [x, y, np.array(1.0, np.float32)], LR, THREADS)


def make_torch():
    import torch
    torch.set_num_threads(THREADS)
    w = [torch.tensor(a, requires_grad=True) for a in build_model().get_weights()]
    opt = torch.optim.Adam(w, lr=LR)
    x, y = (torch.from_numpy(a) for a in data())

    def step():
        opt.zero_grad()
        p = torch.softmax(torch.relu(x @ w[0] + w[1]) @ w[2] + w[3], dim=-1)
        loss = -(y * torch.log(p.clamp(1e-7, 1 - 1e-7))).sum(1).mean()
        loss.backward()
        opt.step()
        return loss.item()
    return step


def run(quick: bool = False) -> dict:
    rounds, warmup, calls = (6, 2, 300) if quick else (30, 4, 1000)
    times, _ = compare_workers(HERE, [*implementations(), "train_on_batch"], rounds, warmup, calls)
    us = {n: {k: 1e6 * v for k, v in spread(t).items() if k != "n"} for n, t in times.items()}
    ratios = loop_ratios(times)
    ratios["train_on_batch_over_step"] = paired_ratio(times["train_on_batch"], times["ortrain"])
    if "torch" in times:
        ratios["torch_over_train_on_batch"] = paired_ratio(times["torch"], times["train_on_batch"])
    out = {"workload": "trainer_step", "title": "Trainer.step, 4-8-2 softmax classifier, batch 16, Adam",
           "threads": THREADS, "rounds": rounds, "calls_per_round": calls, "us_per_call": us,
           "ratios": ratios}
    return out


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
