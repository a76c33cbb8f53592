"""(c) MLP 784-512-512-10, batch 128, Adam, cross-entropy on logits: samples/s.

ortrain's ``Trainer.step`` against the hand-written onnxruntime-training loop over the
same artifacts, a plain PyTorch eager loop with the same weights, data and optimizer,
and numpy's sgemm rate as the machine's ceiling. Training FLOPs are counted as
6 x parameters x samples; the ceiling is numpy's rate on 1024x1024 products (the
machine's peak) and on the very GEMMs of this step (the peak at these shapes).
"""

from __future__ import annotations

import numpy as np

import ortrain as ot
from bench.common import dense_training_gemms, have_torch, interleave, ort_loop, paired_ratio, sgemm_rate, spread

SIZES = [784, 512, 512, 10]
BATCH = 128
LR = 1e-3


def build_model(seed: int = 0) -> ot.Model:
    layers = [ot.layers.Dense(n, activation="relu") for n in SIZES[1:-1]] + [ot.layers.Dense(SIZES[-1])]
    model = ot.Sequential(layers, input_shape=(SIZES[0],), seed=seed)
    model.compile(optimizer=ot.optim.Adam(lr=LR), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data(seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.random((BATCH, SIZES[0]), dtype=np.float32), rng.integers(0, SIZES[-1], BATCH).astype(np.int64)


def torch_step(model: ot.Model, x: np.ndarray, y: np.ndarray, threads: int):
    import torch
    torch.set_num_threads(threads)
    weights = model.get_weights()
    layers = []
    for i in range(0, len(weights), 2):
        lin = torch.nn.Linear(*weights[i].shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(weights[i].T.copy()))
            lin.bias.copy_(torch.from_numpy(weights[i + 1]))
        layers += [lin, torch.nn.ReLU()]
    net = torch.nn.Sequential(*layers[:-1])
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    lossf = torch.nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad()
        loss = lossf(net(xt), yt)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def run(quick: bool = False) -> dict:
    rounds, warmup, calls = (4, 1, 10) if quick else (15, 3, 25)
    threads = ot.get_num_threads()
    model = build_model()
    x, y = data()
    params = sum(int(np.prod(w.shape)) for w in model.get_weights())
    notes = []
    with ot.Trainer(model, batch_size=BATCH) as tr:
        art = tr._art
        steps = {"ortrain": lambda: tr.step(x, y),
                 "ort_loop": ort_loop(art, [x, y, np.array(1.0, np.float32)], LR, threads)}
        if have_torch():
            steps["torch"] = torch_step(model, x, y, threads)
        else:
            notes.append("torch is not installed: the PyTorch eager loop was skipped")
        times = interleave(steps, rounds, warmup, calls)
    peak = sgemm_rate()
    at_shapes = sgemm_rate(dense_training_gemms(SIZES, BATCH))
    flops = 6.0 * params * BATCH
    sec = {n: spread(v) for n, v in times.items()}
    out = {
        "workload": "mlp", "title": "MLP 784-512-512-10, batch 128, Adam", "threads": threads,
        "params": params, "rounds": rounds, "calls_per_round": calls,
        "samples_per_s": {n: BATCH / s["median"] for n, s in sec.items()},
        "ms_per_step": {n: {k: 1e3 * v for k, v in s.items() if k != "n"} for n, s in sec.items()},
        "sgemm_flops": {"square_1024": peak, "step_shapes": at_shapes},
        "ortrain_flops": flops / sec["ortrain"]["median"],
        "fraction_of_sgemm": {"square_1024": flops / sec["ortrain"]["median"] / peak,
                              "step_shapes": flops / sec["ortrain"]["median"] / at_shapes},
        "ratios": {"ortrain_over_ort_loop_time": paired_ratio(times["ortrain"], times["ort_loop"])},
        "notes": notes,
    }
    if "torch" in times:
        out["ratios"]["speedup_vs_torch"] = paired_ratio(times["torch"], times["ortrain"])
    return out


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
