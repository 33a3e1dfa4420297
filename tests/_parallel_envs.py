"""Small PettingZoo-style ParallelEnvs for the tests (numpy and Gymnasium only: worker processes
of SubProcVecParallelEnv import this module, and must stay light)."""

from __future__ import annotations

import os
import sys

import gymnasium as gym
import numpy as np


class CountParallelEnv:
    """Two agents ``a0``, ``a1``. Agent ``i`` observes ``[episode * 100 + t, i]`` and gets reward
    ``i + 1`` each step; the episode is truncated at ``t == limit``, or terminated at
    ``t == terminal_at``.

    Options that break kitae's assumptions, for the rejection tests: ``leave_at`` (agent ``a1``
    alone terminates there: agents come and go), ``hetero`` (``a1`` observes a larger space),
    ``raise_at`` (``step`` raises there), ``exit_at`` (the process exits with code 3 there).
    """

    metadata = {"name": "count_parallel_v0"}

    def __init__(
        self,
        limit: int = 5,
        terminal_at: int | None = None,
        leave_at: int | None = None,
        hetero: bool = False,
        raise_at: int | None = None,
        exit_at: int | None = None,
        n_actions: int = 3,
    ) -> None:
        self.possible_agents = ["a0", "a1"]
        self.agents: list[str] = []
        self.limit, self.terminal_at, self.leave_at = limit, terminal_at, leave_at
        self.raise_at, self.exit_at = raise_at, exit_at
        self._obs_spaces = {a: gym.spaces.Box(-1e6, 1e6, (2,), np.float32) for a in self.possible_agents}
        if hetero:
            self._obs_spaces["a1"] = gym.spaces.Box(-1e6, 1e6, (3,), np.float32)
        self._action_space = gym.spaces.Discrete(n_actions)
        self.episode, self.t = -1, 0
        self.seeds: list[int | None] = []
        self.actions: list[dict] = []
        self.closed = False

    def observation_space(self, agent: str) -> gym.Space:
        return self._obs_spaces[agent]

    def action_space(self, agent: str) -> gym.Space:
        return self._action_space

    def _obs(self) -> dict:
        return {a: np.array([self.episode * 100 + self.t, i], np.float32) for i, a in enumerate(self.agents)}

    def reset(self, seed=None, options=None):
        self.seeds.append(seed)
        self.agents = list(self.possible_agents)
        self.episode += 1
        self.t = 0
        return self._obs(), {a: {} for a in self.agents}

    def step(self, actions):
        self.actions.append(dict(actions))
        self.t += 1
        if self.raise_at is not None and self.t == self.raise_at:
            raise RuntimeError("CountParallelEnv: boom")
        if self.exit_at is not None and self.t == self.exit_at:
            sys.stdout.flush()
            os._exit(3)
        obs = self._obs()
        rewards = {a: float(i + 1) for i, a in enumerate(self.agents)}
        terminated = self.terminal_at is not None and self.t == self.terminal_at
        truncated = self.t == self.limit
        terms = dict.fromkeys(self.agents, terminated)
        truncs = dict.fromkeys(self.agents, truncated and not terminated)
        if self.leave_at is not None and self.t == self.leave_at:
            terms["a1"] = True
        infos = {a: {} for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos

    def close(self) -> None:
        self.closed = True


class BoxActionParallelEnv(CountParallelEnv):
    """``CountParallelEnv`` with ``Box(0, 1, (2,))`` actions; records the actions it gets."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._action_space = gym.spaces.Box(0.0, 1.0, (2,), np.float32)
