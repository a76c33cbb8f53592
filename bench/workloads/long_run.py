"""(c) over a longer run: the MLP of (c) at batch 32, 1,500 Adam steps on random batches; the
time of a step at the end over one at the start, and PyTorch's time over ortrain's at the end.

Adam's moments of units whose gradient stopped (dead ReLUs) decay step by step into subnormal
floats, which the processor computes many times slower. ortrain flushes them to zero while its
sessions compute (``ortrain.engine.denormals``); a PyTorch eager loop does not by default. The
raw loop opens its sessions with ortrain's session options, which ask the runtime to flush, and
the runtime then flushes on its process's main thread for good. Each implementation runs its
1,500 steps alone, one after the other, in its own process.
"""

from __future__ import annotations

import numpy as np

from bench.common import Worker, implementations
from bench.workloads.mlp import LR, SIZES, build_model, ort_loop, torch_mlp

BATCH, STEPS, EDGE, BATCHES, WARMUP = 32, 1500, 100, 64, 20
HERE = "bench.workloads.long_run"


def batches():
    """``BATCHES`` random batches, cycled: new data every step, none drawn inside the timing."""
    rng = np.random.default_rng(0)
    return [(rng.random((BATCH, SIZES[0]), dtype=np.float32), rng.integers(0, SIZES[-1], BATCH).astype(np.int64))
            for _ in range(BATCHES)]


def _cycling(step_on):
    data, at = batches(), [0]

    def step():
        x, y = data[at[0] % BATCHES]
        at[0] += 1
        return step_on(x, y)
    return step


def make_ortrain():
    import ortrain as ot
    tr = ot.Trainer(build_model(), batch_size=BATCH)
    return _cycling(tr.step)


def make_ort_loop():
    import ortrain as ot
    model = build_model()
    art = ot.artifacts.build(model, loss=model.loss, optimizer=model.optimizer)
    data, at = batches(), [0]
    one = np.array(1.0, np.float32)
    feeds = [data[0][0], data[0][1], one]
    step_on = ort_loop(art, feeds, LR)

    def step():
        x, y = data[at[0] % BATCHES]
        at[0] += 1
        feeds[0], feeds[1] = x, y  # ort_loop's step reads the list it was given
        return step_on()
    return step


def make_torch():
    import torch
    net = torch_mlp(build_model().get_weights())
    opt = torch.optim.Adam(net.parameters(), lr=LR)

    def step_on(x, y):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        return loss.item()
    return _cycling(step_on)


def run(quick: bool = False) -> dict:
    steps = 600 if quick else STEPS
    workers = {n: Worker(f"{HERE}:make_{n}") for n in implementations()}
    ms = {}
    try:
        for name, w in workers.items():
            w.time(WARMUP)
            first = w.time(EDGE)
            w.time(steps - WARMUP - 2 * EDGE)
            last = w.time(EDGE)
            ms[name] = {"first": 1e3 * first, "last": 1e3 * last}
    finally:
        for w in workers.values():
            w.close()
    out = {"workload": "long_run", "title": f"MLP 784-512-512-10, batch {BATCH}, {steps} Adam steps",
           "steps": steps, "ms_per_step": ms,
           "last_over_first": {n: m["last"] / m["first"] for n, m in ms.items()}}
    if "torch" in ms:
        out["torch_over_ortrain_at_end"] = ms["torch"]["last"] / ms["ortrain"]["last"]
    return out


if __name__ == "__main__":
    import json
    import sys
    print(json.dumps(run(quick="--quick" in sys.argv), indent=1))
