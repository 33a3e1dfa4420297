"""A user-written training loop around kitae's functional DQN (seed 002's stateless API).

kitae runs no loop here: this script resets the environment, calls ``predict``, steps, stores the
transition in its own replay buffer and calls ``update``; the agent is pure functions over the
parameters, policy state and optimizer state the script holds. The network is Haiku's or Flax's
(``--network``).

Settings: rl-baselines3-zoo's DQN for CartPole-v1 with the changes ``benchmarks/bench_dqn.py``
explains (l2 loss, final epsilon 0.01, learning rate 1e-3 annealed to 0): 128 gradient steps every
256 transitions after 1,000 random ones, batch 64, target copy every 128 gradient steps, epsilon
1.0 -> 0.01 over 8,000 steps, a [256, 256] ReLU MLP. One-step targets from its own buffer: the
3-step returns the collection's CartPole presets now add are not part of this loop.

Run::

    .venv/bin/python examples/functional_dqn.py [--seed SEED] [--steps N] [--network {haiku,flax}]

(default seed 0, 100,000 steps, Haiku). It prints one JSON line: the mean return of the last 10
episodes (``null`` if no episode ended), the first step it reached 475 and the wall time.
"""

from __future__ import annotations

import argparse
import json
import time

import flax.linen as nn
import gymnasium as gym
import haiku as hk
import jax
import numpy as np
import optax

from kitae.functional import DQN

START, TRAIN_EVERY, GRADIENT_STEPS, BATCH, BUFFER = 1_000, 256, 128, 64, 100_000


def haiku_network(action_space: gym.spaces.Discrete) -> hk.Transformed:
    """Q-values ``(B, n)`` from observations ``(B, 4)``: Haiku."""
    return hk.without_apply_rng(hk.transform(lambda x: hk.nets.MLP([256, 256, int(action_space.n)])(x)))


class FlaxQ(nn.Module):
    """Q-values ``(B, n)`` from observations ``(B, 4)``: Flax."""

    n: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for size in (256, 256):
            x = nn.relu(nn.Dense(size)(x))
        return nn.Dense(self.n)(x)


def flax_network(action_space: gym.spaces.Discrete) -> nn.Module:
    return FlaxQ(int(action_space.n))


class Replay:
    """A ring buffer of transitions in numpy arrays, sampled uniformly."""

    def __init__(self, capacity: int, obs_shape: tuple[int, ...], seed: int) -> None:
        self.obs = np.zeros((capacity, *obs_shape), np.float32)
        self.next_obs = np.zeros((capacity, *obs_shape), np.float32)
        self.action = np.zeros(capacity, np.int32)
        self.reward = np.zeros(capacity, np.float32)
        self.terminated = np.zeros(capacity, bool)
        self.capacity, self.size, self.index = capacity, 0, 0
        self.rng = np.random.default_rng(seed)

    def add(self, obs: np.ndarray, action: int, reward: float, terminated: bool, next_obs: np.ndarray) -> None:
        i = self.index
        self.obs[i], self.action[i], self.reward[i], self.terminated[i], self.next_obs[i] = (
            obs,
            action,
            reward,
            terminated,
            next_obs,
        )
        self.index, self.size = (i + 1) % self.capacity, min(self.size + 1, self.capacity)

    def sample(self, n: int) -> dict[str, np.ndarray]:
        rows = self.rng.integers(0, self.size, n)
        return {
            "obs": self.obs[rows],
            "action": self.action[rows],
            "reward": self.reward[rows],
            "terminated": self.terminated[rows],
            "next_obs": self.next_obs[rows],
        }


def train(seed: int, steps: int, network: str = "haiku") -> dict:
    """Trains on CartPole-v1 for ``steps`` transitions; returns the summary it prints."""
    env = gym.make("CartPole-v1")
    gradient_steps = (steps - START) // TRAIN_EVERY * GRADIENT_STEPS
    agent = DQN(
        haiku_network if network == "haiku" else flax_network,
        env,
        learning_rate=optax.linear_schedule(1e-3, 0.0, max(gradient_steps, 1)),
        discount_factor=0.99,
        epsilon_schedule=optax.linear_schedule(1.0, 0.01, 8_000),
        target_update_interval=128,
        loss="l2",
        max_grad_norm=10.0,
    )
    agent.jit()
    key = jax.random.PRNGKey(seed)
    key, params_key, policy_key, optimizer_key = jax.random.split(key, 4)
    params = agent.init_params(params_key)
    policy_state = agent.init_policy(policy_key)
    optimizer_state = agent.init_optimizer(params, optimizer_key)
    replay = Replay(BUFFER, env.observation_space.shape, seed)

    start = time.perf_counter()
    obs, _ = env.reset(seed=seed)
    episode_return, returns, first_solved = 0.0, [], None
    for step in range(1, steps + 1):
        key, act_key = jax.random.split(key)
        output, policy_state = agent.predict(params, policy_state, obs[None], act_key, evaluation=False)
        action = int(output.actions[0])
        next_obs, reward, terminated, truncated, _ = env.step(action)
        replay.add(obs, action, float(reward), bool(terminated), next_obs)  # next_obs: the real one
        episode_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            returns.append(episode_return)
            if first_solved is None and len(returns) >= 10 and np.mean(returns[-10:]) >= 475:
                first_solved = step
            episode_return = 0.0
            obs, _ = env.reset()
        if step > START and step % TRAIN_EVERY == 0:
            for _ in range(GRADIENT_STEPS):
                _, params, optimizer_state = agent.update(params, optimizer_state, replay.sample(BATCH))
    env.close()
    return {
        "seed": seed,
        "network": network,
        "steps": steps,
        "final_return": float(np.mean(returns[-10:])) if returns else None,
        "first_step_at_475": first_solved,
        "episodes": len(returns),
        "gradient_steps": int(optimizer_state.count),
        "wall_seconds": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="default: %(default)s")
    parser.add_argument("--steps", type=int, default=100_000, help="default: %(default)s")
    parser.add_argument("--network", choices=["haiku", "flax"], default="haiku", help="default: %(default)s")
    args = parser.parse_args()
    for label, value, least in (("--steps", args.steps, 1), ("--seed", args.seed, 0)):
        if value < least:
            parser.error(f"{label} {value} is not allowed; allowed: an int >= {least}")
    print(json.dumps(train(args.seed, args.steps, args.network)))


if __name__ == "__main__":
    main()
