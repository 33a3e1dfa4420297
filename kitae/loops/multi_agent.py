"""The multi-agent pieces of the host loop: episode statistics per agent and for the team, and the
conversion of one step of dicts keyed by agent into the arrays the buffer stores.

The host loop (``kitae.loops.train.vectorized_train``) uses them when ``env_cfg.n_agents > 1`` and
the environment is a ``kitae.envs.parallel.VecParallelEnv`` (PettingZoo's Parallel API). The
team's return is the SUM over agents of their returns in the episode (the usual team score of
cooperative environments); every agent's own return is logged too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from kitae.loops.episodes import track_episodes

if TYPE_CHECKING:  # pragma: no cover
    from tensorboardX import SummaryWriter


class AgentEpisodes:
    """Running returns of each agent and of the team, and the lengths, in ``N`` copies.

    Args:
        agents: the agents, in order.
        n_envs: ``N``.
    """

    def __init__(self, agents: list[str], n_envs: int) -> None:
        self.agents = list(agents)
        self.team_returns = np.zeros(n_envs, dtype=np.float64)
        self.lengths = np.zeros(n_envs, dtype=np.int64)
        self.agent_returns = {agent: np.zeros(n_envs, dtype=np.float64) for agent in self.agents}

    def step(self, rewards: dict[str, Any], terminations: dict[str, Any], truncations: dict[str, Any]
             ) -> tuple[np.ndarray, list[tuple[int, float, int]], dict[str, list[float]]]:
        """Adds one vector step.

        Args:
            rewards / terminations / truncations: ``{agent: (N,)}``.

        Returns:
            ``(ended, team, per_agent)``: ``ended (N,)`` bool (the copy's episode ended: a
            ``VecParallelEnv`` ends every agent's episode together); ``team``, one
            ``(env_index, team return, length)`` per ended episode; ``per_agent``, ``{agent: [return
            of each ended episode, in the order of team]}``.
        """
        rewards = {agent: np.asarray(rewards[agent], dtype=np.float64) for agent in self.agents}
        ended = np.zeros(self.lengths.shape, dtype=bool)
        for agent in self.agents:
            ended |= np.asarray(terminations[agent], dtype=bool) | np.asarray(truncations[agent], dtype=bool)
        team_reward = np.sum([rewards[agent] for agent in self.agents], axis=0)
        self.team_returns, self.lengths, team_returns, lengths = track_episodes(
            np, self.team_returns, self.lengths, team_reward, ended
        )
        indices = np.flatnonzero(ended)
        per_agent = {}
        for agent in self.agents:
            finished = self.agent_returns[agent] + rewards[agent]
            self.agent_returns[agent] = np.where(ended, 0.0, finished)
            per_agent[agent] = [float(finished[i]) for i in indices]
        team = [(int(i), float(team_returns[i]), int(lengths[i])) for i in indices]
        return ended, team, per_agent


def log_agent_episodes(writer: "SummaryWriter | None", per_agent: dict[str, list[float]], global_step: int,
                       returns: dict[str, list[float]]) -> None:
    """Appends each agent's finished returns to ``returns`` and writes them to
    ``charts/<agent>/episodic_return`` (the team's go to ``charts/episodic_return``)."""
    for agent, values in per_agent.items():
        if not values:
            continue
        returns.setdefault(agent, []).extend(values)
        if writer is not None:
            for value in values:
                writer.add_scalar(f"charts/{agent}/episodic_return", value, global_step)


def step_fields(rewards: dict, terminations: dict, truncations: dict, log_probs: dict) -> dict[str, dict]:
    """The buffer's ``reward`` (float32), ``done`` and ``truncated`` (bool) and ``log_prob``
    (float32) fields of one step, dicts keyed by agent of ``(N,)`` arrays."""
    return {
        "reward": {agent: np.asarray(value, dtype=np.float32) for agent, value in rewards.items()},
        "done": {agent: np.asarray(value, dtype=bool) for agent, value in terminations.items()},
        "truncated": {agent: np.asarray(value, dtype=bool) for agent, value in truncations.items()},
        "log_prob": {agent: np.asarray(value, dtype=np.float32) for agent, value in log_probs.items()},
    }
