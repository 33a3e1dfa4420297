"""PPO on your own environment with a ``MultiDiscrete`` action space: several choices per step.

``Match`` is a contextual task written for this example: each step shows, one-hot, a target
class for each of ``K`` components (``nvec`` classes each) and pays the fraction of components the
action gets right; an episode is 8 steps, so a policy that reads its observations returns 8 and a
random one ``8 * mean(1 / nvec)`` (2.89 for ``nvec = (3, 2, 4)``). kitae's PPO (and A2C, RND-PPO,
recurrent PPO) acts in ``MultiDiscrete(nvec)`` and ``MultiBinary(K)`` spaces with one independent
categorical per component: the log-probability of an action is the sum of its components'.

Run::

    .venv/bin/python examples/multi_discrete.py [N_ENV_STEPS] [SEED] [--run-dir DIR]

(default 50,000 steps, seed 0). It registers ``Match-v0`` with Gymnasium, trains PPO from the
command line's preset resolution (``preset_agent``: the run directory, by default
``runs/match-ppo-s<SEED>``, is the usual one) and prints one JSON line: the final return (the mean
of the last 10 episodes), the random policy's and the evaluation of the trained policy. A run
directory that already holds a run is refused: delete it or give another ``--run-dir``.
"""

from __future__ import annotations

import argparse
import json

import gymnasium as gym
import numpy as np

NVEC = (3, 2, 4)
EPISODE_LENGTH = 8


class Match(gym.Env):
    """Observation: the targets, one-hot per component, ``(sum(nvec),)`` float32; action:
    ``MultiDiscrete(nvec)``; reward: the fraction of components whose class is the target's.
    Targets are drawn anew every step; an episode is truncated after ``EPISODE_LENGTH`` steps."""

    def __init__(self, nvec: tuple[int, ...] = NVEC) -> None:
        self.nvec = np.asarray(nvec, np.int64)
        self.action_space = gym.spaces.MultiDiscrete(self.nvec)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (int(self.nvec.sum()),), np.float32)
        self._offsets = np.concatenate([[0], np.cumsum(self.nvec)[:-1]])
        self._target = np.zeros(len(self.nvec), np.int64)
        self._t = 0

    def _observation(self) -> np.ndarray:
        observation = np.zeros(int(self.nvec.sum()), np.float32)
        observation[self._offsets + self._target] = 1.0
        return observation

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        self._target = self.np_random.integers(0, self.nvec)
        return self._observation(), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        action = np.asarray(action)
        if action.shape != self.nvec.shape or not self.action_space.contains(action.astype(np.int64)):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        reward = float(np.mean(action == self._target))
        self._t += 1
        self._target = self.np_random.integers(0, self.nvec)
        return self._observation(), reward, False, self._t >= EPISODE_LENGTH, {}


def register() -> None:
    """Registers ``Match-v0`` (``MultiDiscrete(NVEC)``) with Gymnasium, once."""
    if "Match-v0" not in gym.registry:
        gym.register("Match-v0", entry_point=Match)


register()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "steps", nargs="?", type=int, default=50_000, metavar="N_ENV_STEPS", help="default: %(default)s"
    )
    parser.add_argument("seed", nargs="?", type=int, default=0, metavar="SEED", help="default: %(default)s")
    parser.add_argument("--run-dir", metavar="DIR", help="default: runs/match-ppo-s<SEED>")
    args = parser.parse_args()
    for label, value, least in (("N_ENV_STEPS", args.steps, 1), ("SEED", args.seed, 0)):
        if value < least:
            parser.error(f"{label} {value} is not allowed; allowed: an int >= {least}")

    from kitae.envs.make import EnvSpec
    from kitae.loops.evaluate import evaluate_host
    from kitae.runs import RunError, preset_agent

    steps, seed = args.steps, args.seed
    run_dir = args.run_dir or f"runs/match-ppo-s{seed}"
    agent, env = preset_agent("ppo", "Match-v0", steps=steps, seed=seed, run_dir=run_dir)
    try:
        result = agent.train(env)
    except RunError as error:  # the run directory holds a run already
        parser.exit(2, f"{parser.prog}: error: {error}; from this script: delete it or give another --run-dir\n")
    print(
        json.dumps(
            {
                "steps": result.env_steps,
                "seed": seed,
                "final_return": result.final_return(),
                "random_return": EPISODE_LENGTH * float(np.mean(1.0 / np.asarray(NVEC))),
                "eval_return": float(np.mean(evaluate_host(agent, EnvSpec.parse("Match-v0"), 20, seed))),
                "train_seconds": round(result.train_seconds, 1),
            }
        )
    )
