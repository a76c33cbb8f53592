"""Reference implementations and small builders shared by the tests (numpy only)."""

from __future__ import annotations

import numpy as np

import ortrain as ot
from ortrain import engine
from ortrain.graph import GraphBuilder
from ortrain.graph.forward import ParamSpec, forward_from_builder


def param_model(values: np.ndarray):
    """A ForwardGraph whose prediction is a trainable parameter ``P`` (plus a zero input ``x``).

    The gradient of the loss with respect to ``P`` is then exactly dL/dprediction.
    """
    gb = GraphBuilder()
    shape = values.shape
    gb.add_input("x", np.float32, (None,) + shape[1:])
    gb.add_input("P", np.float32, shape)
    gb.op("Add", ["x", "P"], outputs=["pred"])
    gb.add_output("pred", np.float32, (None,) + shape[1:])
    return forward_from_builder(gb, [ParamSpec("P", shape, np.dtype(np.float32), "trainable")],
                                {"P": values.astype(np.float32)})


def open_session(art):
    return engine.TrainingSession(art.training, art.eval, art.checkpoint, art.optimizer_graph)


def loss_and_grad(loss, pred: np.ndarray, y: np.ndarray, weight=None, weighting=None):
    """(loss, dL/dpred) computed by ortrain's training graph."""
    fg = param_model(pred)
    art = ot.artifacts.build(fg, loss=loss, optimizer="sgd", weighting=weighting)
    sess = open_session(art)
    feeds = [np.zeros_like(pred, dtype=np.float32), y]
    if weighting is not None:
        feeds.append(weight.astype(np.float32))
    feeds.append(np.array(1.0, np.float32))
    fetches = sess.train_step(feeds)
    value = float(fetches[1].numpy())
    grad = sess.grad_view("P").copy()
    sess.free()
    return value, grad


def softmax(z, axis=-1):
    e = np.exp(z - z.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


class NumpyAdam:
    """torch.optim.Adam / AdamW written out (decoupled decay applied first, as AdamW does)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.p = [np.array(a, np.float64) for a in params]
        self.m = [np.zeros_like(a) for a in self.p]
        self.v = [np.zeros_like(a) for a in self.p]
        self.lr, self.b1, self.b2, self.eps, self.wd, self.t = lr, betas[0], betas[1], eps, weight_decay, 0

    def step(self, grads):
        self.t += 1
        for i, g in enumerate(grads):
            self.p[i] *= 1 - self.lr * self.wd
            self.m[i] = self.b1 * self.m[i] + (1 - self.b1) * g
            self.v[i] = self.b2 * self.v[i] + (1 - self.b2) * g * g
            mhat = self.m[i] / (1 - self.b1 ** self.t)
            vhat = self.v[i] / (1 - self.b2 ** self.t)
            self.p[i] -= self.lr * mhat / (np.sqrt(vhat) + self.eps)


def linear_mse_grads(x, y, w, b, weight=None):
    """Gradients of mean((x @ w + b - y)^2 [* weight]) for a linear model, in float64."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    d = x @ w + b - y
    gp = 2 * d / d.size
    if weight is not None:
        gp = gp * weight
    return x.T @ gp, gp.sum(axis=0)


def dense_model(n_in, n_out, loss="mse", optimizer=None, seed=0, activation=None):
    model = ot.Sequential([ot.layers.Dense(n_out, activation=activation)], input_shape=(n_in,), seed=seed)
    model.compile(optimizer=optimizer or ot.optim.SGD(lr=0.1), loss=loss)
    return model


def gradient_probe(params):
    """An Adam for ``capture_step`` that leaves ``params`` where they are (lr 0) and keeps the last
    gradient as its first moment (beta1 0: ``m = 0 * m + 1 * g``, exact): read it with
    :func:`probed_grads`."""
    return ot.optim.Adam(params, lr=0.0, betas=(0.0, 0.999))


def probed_grads(opt) -> list[np.ndarray]:
    """The gradients of the last captured step, one per param of :func:`gradient_probe`."""
    moments = opt.state()["moments"]
    return [moments[p.name]["m"] for p in opt.params]


def torch_steps(torch, net, opt, loss_fn, batches) -> list[float]:
    """A plain PyTorch training loop over numpy ``(x, y)`` batches; the loss of each step."""
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = loss_fn(net(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def forks_that_hang(tmp_path, setup: str, busy: str, in_child: str, forks: int = 16) -> str:
    """Run a script that ``setup``s, calls ``busy`` in a loop on a thread, and forks ``forks`` times,
    each child running ``in_child`` then exiting; the script prints how many children did not end
    within 5 s (they are killed). Returns its output, ``"hung 0"`` when none hung."""
    import subprocess
    import sys
    import textwrap
    script = tmp_path / "fork_while_busy.py"
    script.write_text(textwrap.dedent(setup) + textwrap.dedent(f"""
        import os, signal, threading, time
        stop = []
        def loop():
            while not stop:
                {busy}
        t = threading.Thread(target=loop)
        t.start()
        hung = 0
        for _ in range({forks}):
            time.sleep(0.01)
            pid = os.fork()
            if pid == 0:
                {in_child}
                os._exit(0)
            for _ in range(100):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    break
                time.sleep(0.05)
            else:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                hung += 1
        stop.append(1)
        t.join()
        print("hung", hung)
        """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.returncode, run.stdout, run.stderr[-2000:])
    return run.stdout.strip()


def then_interrupted(fn):
    """``fn``, then a KeyboardInterrupt: a Ctrl-C that Python raises once the runtime's call returned."""
    def wrapped(*args, **kwargs):
        fn(*args, **kwargs)
        raise KeyboardInterrupt
    return wrapped


def interrupted_first(fn, calls: list):
    """``fn`` whose first call a second Ctrl-C stops before it starts; ``calls`` counts the calls."""
    def wrapped(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt("a second Ctrl-C")
        return fn(*args, **kwargs)
    return wrapped
