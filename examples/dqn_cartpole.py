"""DQN on a cart-pole simulated in numpy: a Trainer you step yourself, a replay buffer,
a target network (a Snapshot moved by Polyak averaging) and a per-action loss mask.

    python examples/dqn_cartpole.py                 # about 300 episodes
    python examples/dqn_cartpole.py --episodes 5    # a quick check

Only the Q-value of the action taken has a target, so the trainer uses ``loss_mask=2``
(one weight per output): the other action's error is multiplied by 0 and contributes no
gradient at all.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import ortrain as ot


class CartPole:
    """The classic cart-pole balancing task (Barto, Sutton and Anderson, 1983), Euler-integrated."""

    gravity, cart_mass, pole_mass, half_length, force, dt = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    max_angle, max_position, max_steps = 12 * 2 * math.pi / 360, 2.4, 500

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def reset(self) -> np.ndarray:
        self.state = self.rng.uniform(-0.05, 0.05, 4)
        self.steps = 0
        return self.state.astype(np.float32)

    def step(self, action: int):
        x, x_dot, theta, theta_dot = self.state
        force = self.force if action == 1 else -self.force
        total = self.cart_mass + self.pole_mass
        cos, sin = math.cos(theta), math.sin(theta)
        temp = (force + self.pole_mass * self.half_length * theta_dot ** 2 * sin) / total
        theta_acc = (self.gravity * sin - cos * temp) / (
            self.half_length * (4.0 / 3.0 - self.pole_mass * cos ** 2 / total))
        x_acc = temp - self.pole_mass * self.half_length * theta_acc * cos / total
        self.state = np.array([x + self.dt * x_dot, x_dot + self.dt * x_acc,
                               theta + self.dt * theta_dot, theta_dot + self.dt * theta_acc])
        self.steps += 1
        failed = abs(self.state[0]) > self.max_position or abs(self.state[2]) > self.max_angle
        return self.state.astype(np.float32), 1.0, failed, self.steps >= self.max_steps


class Replay:
    """A ring buffer of transitions."""

    def __init__(self, capacity: int, rng: np.random.Generator):
        self.s = np.zeros((capacity, 4), np.float32)
        self.a = np.zeros(capacity, np.int64)
        self.r = np.zeros(capacity, np.float32)
        self.s2 = np.zeros((capacity, 4), np.float32)
        self.done = np.zeros(capacity, np.float32)
        self.size, self.pos, self.rng = 0, 0, rng

    def add(self, s, a, r, s2, done):
        i = self.pos
        self.s[i], self.a[i], self.r[i], self.s2[i], self.done[i] = s, a, r, s2, done
        self.pos = (i + 1) % len(self.r)
        self.size = min(self.size + 1, len(self.r))

    def sample(self, n: int):
        idx = self.rng.integers(0, self.size, n)
        return self.s[idx], self.a[idx], self.r[idx], self.s2[idx], self.done[idx]


def q_network(seed: int) -> ot.Model:
    model = ot.Sequential([ot.layers.Dense(64, activation="relu"), ot.layers.Dense(64, activation="relu"),
                           ot.layers.Dense(2)], input_shape=(4,), seed=seed)
    model.compile(optimizer=ot.optim.Adam(lr=1e-3), loss="mse")
    return model


def train(episodes: int = 300, batch_size: int = 64, gamma: float = 0.99, tau: float = 0.01, seed: int = 0,
          verbose: bool = True) -> list[float]:
    rng = np.random.default_rng(seed)
    ot.set_seed(seed)
    env, replay = CartPole(rng), Replay(50_000, rng)
    returns = []
    with ot.Trainer(q_network(seed), batch_size=batch_size, loss_mask=2) as tr:
        target = tr.snapshot()
        rows = np.arange(batch_size)
        for episode in range(episodes):
            epsilon = max(0.05, 1.0 - episode / (0.6 * max(episodes, 1)))
            s, total, done = env.reset(), 0.0, False
            while not done:
                if rng.random() < epsilon:
                    a = int(rng.integers(0, 2))
                else:
                    a = int(np.argmax(tr.predict(s[None])[0]))
                s2, r, failed, truncated = env.step(a)
                replay.add(s, a, r, s2, float(failed))
                s, total, done = s2, total + r, failed or truncated
                if replay.size >= 1000:
                    bs, ba, br, bs2, bdone = replay.sample(batch_size)
                    y = np.zeros((batch_size, 2), np.float32)
                    y[rows, ba] = br + gamma * (1 - bdone) * target.predict(bs2).max(axis=1)
                    mask = np.zeros((batch_size, 2), np.float32)
                    mask[rows, ba] = 1.0  # only the action taken has a target
                    tr.step(bs, y, sample_weight=mask)
                    tr.update_target(target, tau=tau)
            returns.append(total)
            if verbose and (episode + 1) % 20 == 0:
                print(f"episode {episode + 1:4d}  return {total:5.0f}  mean of last 20 "
                      f"{np.mean(returns[-20:]):6.1f}  epsilon {epsilon:.2f}  steps {tr.n_steps}")
        target.free()
    return returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    returns = train(args.episodes, seed=args.seed)
    print(f"episodes: {len(returns)}  best return: {max(returns):.0f}  "
          f"mean of the last {min(20, len(returns))}: {np.mean(returns[-20:]):.1f}")


if __name__ == "__main__":
    main()
