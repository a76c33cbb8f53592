"""A custom loss with ``ot.capture_step``: advantage actor-critic (A2C) on cart-poles simulated in numpy.

    python examples/capture_custom_loss.py            # 300 updates: mean return from ~20 to 200-400 (it swings)
    python examples/capture_custom_loss.py --quick    # 20 updates, a smoke test

The loss is written with ``ag`` ops: the policy-gradient term ``-mean(log pi(a|s) * advantage)``,
half the critic's squared error and an entropy bonus. ``capture_step`` records it once; every
update then runs the recorded forward, backward and Adam graphs, clips the gradients to a
global norm of 0.5 and reports that norm. The learning rate follows a warm-up-then-cosine
schedule, set on the optimizer before each call. ``ot.capture`` records the acting pass.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import ortrain as ot
from ortrain import ag


class CartPoles:
    """``n`` cart-poles (Barto, Sutton and Anderson, 1983) stepped together; a pole that falls restarts."""

    def __init__(self, n: int, rng: np.random.Generator, max_steps: int = 500):
        self.n, self.rng, self.max_steps = n, rng, max_steps
        self.state = rng.uniform(-0.05, 0.05, (n, 4))
        self.t = np.zeros(n, np.int64)

    def step(self, action: np.ndarray):
        x, x_dot, theta, theta_dot = self.state.T
        force = np.where(action == 1, 10.0, -10.0)
        cos, sin = np.cos(theta), np.sin(theta)
        # cart 1 kg, pole 0.1 kg with half-length 0.5 m, g = 9.8, Euler steps of 20 ms
        temp = (force + 0.05 * theta_dot ** 2 * sin) / 1.1
        theta_acc = (9.8 * sin - cos * temp) / (0.5 * (4.0 / 3.0 - 0.1 * cos ** 2 / 1.1))
        x_acc = temp - 0.05 * theta_acc * cos / 1.1
        self.state = np.stack([x + 0.02 * x_dot, x_dot + 0.02 * x_acc,
                               theta + 0.02 * theta_dot, theta_dot + 0.02 * theta_acc], axis=1)
        self.t += 1
        # Reaching max_steps also ends an episode without bootstrapping: a small bias that keeps this short.
        done = (np.abs(self.state[:, 0]) > 2.4) | (np.abs(self.state[:, 2]) > 12 * math.pi / 180) | \
            (self.t >= self.max_steps)
        lengths = self.t[done].tolist()
        self.state[done] = self.rng.uniform(-0.05, 0.05, (int(done.sum()), 4))
        self.t[done] = 0
        return self.state.astype(np.float32), done, lengths


def dense(name: str, n_in: int, n_out: int, rng: np.random.Generator, gain: float = 1.0):
    w = rng.standard_normal((n_out, n_in)) * gain / math.sqrt(n_in)
    return ag.param(w, name=f"{name}.weight"), ag.param(np.zeros(n_out), name=f"{name}.bias")


def advantages_and_returns(values: np.ndarray, done: np.ndarray, gamma: float, lam: float):
    """Generalised advantage estimation with a reward of 1 per step; ``values`` has one more row
    than ``done`` (the critic's value of the states after the last step, to bootstrap from)."""
    not_done = 1.0 - done.astype(np.float32)
    adv = np.zeros(done.shape, np.float32)
    running = np.zeros(done.shape[1], np.float32)
    for t in reversed(range(len(done))):
        delta = 1.0 + gamma * values[t + 1] * not_done[t] - values[t]
        running = delta + gamma * lam * not_done[t] * running
        adv[t] = running
    return adv.reshape(-1), (adv + values[:-1]).reshape(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="20 updates, for a smoke test")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    updates = 20 if args.quick else args.updates
    n_envs, n_steps, gamma, lam = 16, 32, 0.99, 0.95
    rng = np.random.default_rng(args.seed)

    # A small last actor layer starts the policy near 50/50, so early episodes explore both actions.
    actor = [*dense("actor.0", 4, 64, rng), *dense("actor.1", 64, 2, rng, gain=0.01)]
    critic = [*dense("critic.0", 4, 64, rng), *dense("critic.1", 64, 1, rng)]

    def heads(obs):
        h = ag.tanh(ag.linear(obs, actor[0], actor[1]))
        logits = ag.linear(h, actor[2], actor[3])
        value = ag.linear(ag.tanh(ag.linear(obs, critic[0], critic[1])), critic[2], critic[3])
        return ag.log_softmax(logits), ag.reshape(value, (-1,))

    def a2c_loss(obs, actions, advantages, returns):
        log_pi, value = heads(obs)
        log_pi_taken = ag.sum(log_pi * actions, axis=1)      # actions are one-hot rows
        policy_loss = -ag.mean(log_pi_taken * advantages)
        entropy = -ag.mean(ag.sum(ag.exp(log_pi) * log_pi, axis=1))
        critic_loss = ag.mse_loss(value, returns)
        loss = policy_loss + 0.5 * critic_loss - 0.01 * entropy
        return {"loss": loss, "policy": policy_loss, "critic": critic_loss, "entropy": entropy}

    schedule = ot.optim.schedules.warmup_cosine(3e-3, warmup_steps=max(updates // 10, 1), total_steps=updates,
                                                final_lr=3e-4)
    opt = ot.optim.Adam(actor + critic, lr=schedule(0))
    train = ot.capture_step(a2c_loss, optimizer=opt, max_grad_norm=0.5)

    def policy(obs):
        log_pi, value = heads(obs)
        return {"log_pi": log_pi, "value": value}

    act = ot.capture(policy)  # reads the weights train() is updating; no backward, no update

    envs = CartPoles(n_envs, rng)
    obs = envs.state.astype(np.float32)
    finished: list[int] = []
    for update in range(updates):
        rows = {k: [] for k in ("obs", "action", "value", "done")}
        for _ in range(n_steps):
            out = act(obs=obs)
            p = np.exp(out["log_pi"])
            action = (rng.random(n_envs) < p[:, 1]).astype(np.int64)
            rows["obs"].append(obs)
            rows["action"].append(action)
            rows["value"].append(out["value"])
            obs, done, lengths = envs.step(action)
            rows["done"].append(done)
            finished += lengths
        values = np.stack(rows["value"] + [act(obs=obs)["value"]])
        adv, returns = advantages_and_returns(values, np.stack(rows["done"]), gamma, lam)
        opt.lr = schedule(opt.step)
        out = train(obs=np.concatenate(rows["obs"]),
                    actions=np.eye(2, dtype=np.float32)[np.concatenate(rows["action"])],
                    advantages=(adv - adv.mean()) / (adv.std() + 1e-8), returns=returns)
        if (update + 1) % max(updates // 10, 1) == 0 or update + 1 == updates:
            recent = np.mean(finished[-20:]) if finished else float("nan")
            print(f"update {update + 1:4d}  loss {float(out['loss']):8.4f}  grad_norm {float(out['grad_norm']):7.3f}  "
                  f"entropy {float(out['entropy']):.3f}  lr {opt.lr:.2e}  mean return (last 20) {recent:6.1f}")
    train.free()
    act.free()
    print(f"updates: {updates}  steps: {updates * n_steps * n_envs}  episodes finished: {len(finished)}  "
          f"mean return of the last 20: {np.mean(finished[-20:]):.1f}")


if __name__ == "__main__":
    main()
