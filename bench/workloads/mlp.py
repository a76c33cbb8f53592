"""(c) MLP 784-512-512-10, batch 128, Adam, cross-entropy on logits: samples/s; and (g) the peak
resident memory of the processes that train it.

ortrain's ``Trainer.step`` against the hand-written onnxruntime-training loop over the same
artifacts and a plain PyTorch eager loop with the same initial weights, data and optimizer,
each in its own process, with numpy's sgemm rate as the ceiling. Training FLOPs are counted
as 6 x parameters x samples. The ceiling is numpy's rate on 1024x1024 products (the machine's
peak) and on the very GEMMs of this step (the peak at these shapes).

It also estimates the machine's floor for this step, the step at numpy's rates: the
step's GEMMs at numpy's peak rate, plus Adam's update at the memory bandwidth numpy reaches
(the update reads weight, gradient and both moments and writes weight and both moments: 28
bytes a weight, with next to no arithmetic). Everything else a step does (activations, loss,
the ReLU and bias gradients) is left out. PyTorch's time over the floor says how much an
implementation at numpy's rates could gain over PyTorch in this run.

The raw loop's own ratios (its samples/s over PyTorch's, its fraction of sgemm) are the most
any library driving onnxruntime-training's sessions can reach here: they are the runtime's
kernels with nothing else around them.
"""

from __future__ import annotations

import numpy as np

from bench.common import (
    compare_workers,
    dense_training_gemms,
    implementations,
    loop_ratios,
    memory_bandwidth,
    ort_loop,
    paired_ratio,
    sgemm_rate,
    spread,
)

SIZES = [784, 512, 512, 10]
BATCH = 128
LR = 1e-3
HERE = "bench.workloads.mlp"


def build_model(sizes=SIZES, seed: int = 0):
    import ortrain as ot
    layers = [ot.layers.Dense(n, activation="relu") for n in sizes[1:-1]] + [ot.layers.Dense(sizes[-1])]
    model = ot.Sequential(layers, input_shape=(sizes[0],), seed=seed)
    model.compile(optimizer=ot.optim.Adam(lr=LR), loss=ot.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def data(sizes=SIZES, batch: int = BATCH, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.random((batch, sizes[0]), dtype=np.float32), rng.integers(0, sizes[-1], batch).astype(np.int64)


def make_ortrain(threads: int | None = None, sizes=SIZES, batch: int = BATCH):
    import ortrain as ot
    if threads:
        ot.set_num_threads(threads)
    x, y = data(sizes, batch)
    tr = ot.Trainer(build_model(sizes), batch_size=batch)
    return lambda: tr.step(x, y)


def make_ort_loop(threads: int | None = None, sizes=SIZES, batch: int = BATCH):
    import ortrain as ot
    model = build_model(sizes)
    art = ot.artifacts.build(model, loss=model.loss, optimizer=model.optimizer)
    x, y = data(sizes, batch)
    return ort_loop(art, [x, y, np.array(1.0, np.float32)], LR, threads)


def torch_mlp(weights: list[np.ndarray]):
    import torch
    layers = []
    for i in range(0, len(weights), 2):
        lin = torch.nn.Linear(*weights[i].shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(weights[i].T.copy()))
            lin.bias.copy_(torch.from_numpy(weights[i + 1]))
        layers += [lin, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def make_torch(threads: int | None = None, sizes=SIZES, batch: int = BATCH):
    import torch
    if threads:
        torch.set_num_threads(threads)
    net = torch_mlp(build_model(sizes).get_weights())
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    lossf = torch.nn.CrossEntropyLoss()
    x, y = data(sizes, batch)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        opt.zero_grad()
        loss = lossf(net(xt), yt)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def run(quick: bool = False) -> dict:
    rounds, warmup, calls = (4, 1, 10) if quick else (15, 3, 40)
    from ortrain.engine import default_threads
    threads = default_threads()
    times, rss = compare_workers(HERE, implementations(), rounds, warmup, calls, threads=threads)
    params = sum(a * b + b for a, b in zip(SIZES[:-1], SIZES[1:]))
    flops = 6.0 * params * BATCH
    peak, at_shapes = sgemm_rate(), sgemm_rate(dense_training_gemms(SIZES, BATCH))
    sec = {n: spread(v) for n, v in times.items()}
    ours = sec["ortrain"]["median"]
    floor = machine_floor(params, peak, threads)
    out = {
        "workload": "mlp", "title": "MLP 784-512-512-10, batch 128, Adam", "threads": threads, "params": params,
        "rounds": rounds, "calls_per_round": calls,
        "samples_per_s": {n: BATCH / s["median"] for n, s in sec.items()},
        "ms_per_step": {n: {k: 1e3 * s[k] for k in ("median", "p10", "p90")} for n, s in sec.items()},
        "sgemm_gflops": {"square_1024": peak / 1e9, "step_shapes": at_shapes / 1e9},
        "ortrain_gflops": flops / ours / 1e9,
        "fraction_of_sgemm": {"square_1024": flops / ours / peak, "step_shapes": flops / ours / at_shapes},
        # The runtime alone: what any loop over these graphs reaches, with nothing of ortrain's in it.
        "ort_loop_fraction_of_sgemm": flops / sec["ort_loop"]["median"] / peak,
        "ratios": loop_ratios(times),
        "floor": floor,
        "peak_rss_mb": rss,
        "notes": [] if "torch" in times else ["torch is not installed: the PyTorch loop was skipped"],
    }
    if "torch" in times:
        out["ratios"]["rss_ortrain_over_torch"] = rss["ortrain"] / rss["torch"]
        out["ratios"]["torch_over_ort_loop"] = paired_ratio(times["torch"], times["ort_loop"])
        floor["torch_over_floor"] = spread([t / floor["seconds"] for t in times["torch"]])
    return out


def machine_floor(params: int, peak: float, threads: int) -> dict:
    """A step of this MLP at numpy's rates: its GEMMs at ``peak`` FLOP/s and Adam's 28 bytes a
    weight at the best memory bandwidth numpy reaches on one or ``threads`` threads."""
    gemm_flops = sum(2.0 * m * k * n for m, k, n in dense_training_gemms(SIZES, BATCH))
    bandwidth = max(memory_bandwidth(params, 1), memory_bandwidth(params, threads))
    gemm_s, adam_s = gemm_flops / peak, 28.0 * params / bandwidth
    seconds = gemm_s + adam_s
    return {"seconds": seconds, "gemm_s": gemm_s, "adam_s": adam_s, "bandwidth_gbs": bandwidth / 1e9,
            "fraction_of_sgemm": 6.0 * params * BATCH / seconds / peak}


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
