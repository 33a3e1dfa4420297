"""Multi-agent bookkeeping for both loops: episode statistics per agent and for the team, and
evaluation of team returns in JAX environments.

An episode's TEAM return is the SUM over agents of their returns in the episode (the usual team
score of cooperative environments); every agent's own return is kept and logged too.

* Host loop (``kitae.loops.host``, ``env_cfg.n_agents > 1`` with a
  ``kitae.envs.parallel.VecParallelEnv``, PettingZoo's Parallel API): ``AgentEpisodes``.
* Compiled loop (``kitae.loops.compiled``, ``kitae.envs.jaxmarl_env.VecJaxMARLEnv``):
  ``env_agents`` tells a multi-agent environment from a single-agent one;
  ``track_team_episodes`` counts episodes (the team's ends when every agent's does);
  ``evaluate_team_returns`` scores a policy with the same bookkeeping (``kitae eval``, through
  ``team_returns_program``; ``benchmarks/bench_jaxmarl.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kitae.loops.collect import next_memory
from kitae.loops.episodes import track_episodes
from kitae.validation import check_positive_int


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

    def step(
        self, rewards: dict[str, Any], terminations: dict[str, Any], truncations: dict[str, Any]
    ) -> tuple[np.ndarray, list[tuple[int, float, int]], dict[str, list[float]]]:
        """Adds one vector step.

        Args:
            rewards: ``{agent: (N,)}`` each agent's reward in each copy.
            terminations: ``{agent: (N,)}`` bool, whether its episode terminated.
            truncations: ``{agent: (N,)}`` bool, whether its episode was cut.

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


def env_agents(env: Any) -> tuple[str, ...] | None:
    """The agent names of a multi-agent JAX environment (its ``agents``), ``None`` for a
    single-agent one."""
    agents = getattr(env, "agents", None)
    return None if agents is None else tuple(agents)


def track_team_episodes(returns: dict[str, jax.Array], lengths: jax.Array, ts: Any) -> tuple:
    """``track_episodes`` for a multi-agent step ``ts`` (fields dicts keyed by agent, leaves ``(E,)``).

    The team's episode ends where it ends for every agent; each agent's return runs until then.

    Args:
        returns: ``{agent: (E,)}`` running returns before the step.
        lengths: ``(E,)`` running lengths before the step.
        ts: a ``JaxTimeStep`` whose ``reward``, ``terminated`` and ``truncated`` are
            ``{agent: (E,)}``.

    Returns:
        ``(returns, lengths, team_returns, episode_lengths, ended, agent_returns)``: the running
        returns ``{agent: (E,)}`` and lengths ``(E,)`` after the step (zero where the episode
        ended), the finished episodes' team returns ``(E,)`` (the agents' returns added up) and
        lengths ``(E,)``, the team's ``ended`` flags ``(E,)``, and each agent's finished return
        ``{agent: (E,)}`` (meaningful where ``ended``).
    """
    agents = list(returns)
    ended = jnp.all(jnp.stack([jnp.logical_or(ts.terminated[a], ts.truncated[a]) for a in agents]), axis=0)
    running, agent_returns = {}, {}
    running_length = episode_length = lengths
    for a in agents:
        running[a], running_length, agent_returns[a], episode_length = track_episodes(
            jnp, returns[a], lengths, ts.reward[a], ended
        )
    team_returns = sum(agent_returns[a] for a in agents)
    return running, running_length, team_returns, episode_length, ended, agent_returns


def evaluate_team_returns(
    env: Any,
    act: Callable[..., Any],
    key: jax.Array,
    episodes: int = 1,
    max_steps: int = 100_000,
    memory: Any = None,
) -> np.ndarray:
    """Team returns of the first ``episodes`` episodes of each of ``env.num_envs`` environments.

    Runs in one compiled ``jax.lax.while_loop`` until every environment has finished
    ``episodes`` episodes (or ``max_steps`` vector steps), counting episodes with
    ``track_team_episodes``; the episodes an environment finishes past ``episodes`` are not
    counted.

    Args:
        env: a multi-agent vectorized JAX environment (``VecJaxMARLEnv``).
        act: ``act(key, observations) -> actions``, dicts keyed by agent, leaves ``(E, ...)``; with
            ``memory``: ``act(key, observations, memory) -> (actions, hidden)``.
        key: PRNG key for the resets, the steps and ``act``.
        episodes: episodes per environment (>= 1).
        max_steps: vector steps at most (>= 1); episodes unfinished then count as NaN.
        memory: a recurrent agent's ``kitae.loops.collect.Memory`` (``initial_memory(agent, E,
            agents)``), carried from step to step with ``next_memory``; ``None`` otherwise.

    Returns:
        ``(E, episodes)`` float array of team returns.

    Raises:
        ValueError: for ``episodes`` or ``max_steps`` < 1, or an environment without agents.
    """
    run = team_returns_program(env, act, episodes, max_steps, memory)
    return np.asarray(jax.jit(run)(key), dtype=np.float64)


def team_returns_program(
    env: Any, act: Callable[..., Any], episodes: int = 1, max_steps: int = 100_000, memory: Any = None
) -> Callable[[jax.Array], jax.Array]:
    """``evaluate_team_returns``'s computation, not compiled: ``run(key) -> (E, episodes)`` team
    returns, a pure function of the key to trace inside a program of one's own (``kitae eval``'s
    evaluation traces it with the parameters ``act`` closes over as an argument, so it compiles
    once per agent).

    Args: as for ``evaluate_team_returns``.

    Raises:
        ValueError: as ``evaluate_team_returns``.
    """
    agents = env_agents(env)
    if agents is None:
        raise ValueError(f"env={env!r} is not allowed; allowed: a multi-agent JAX environment (with agents)")
    for name, value in (("episodes", episodes), ("max_steps", max_steps)):
        check_positive_int(name, value)
    n_envs = env.num_envs

    def run(key: jax.Array) -> jax.Array:
        key, reset_key = jax.random.split(key)
        observation, env_state = env.reset(reset_key)
        carry = (
            jnp.zeros((), jnp.int32),
            key,
            observation,
            env_state,
            memory,
            {a: jnp.zeros((n_envs,), jnp.float32) for a in agents},
            jnp.zeros((n_envs,), jnp.int32),
            jnp.full((n_envs, episodes), jnp.nan, jnp.float32),
            jnp.zeros((n_envs,), jnp.int32),
        )

        def cond(carry: tuple) -> jax.Array:
            return jnp.logical_and(carry[0] < max_steps, jnp.any(carry[-1] < episodes))

        def body(carry: tuple) -> tuple:
            t, key, observation, env_state, memory, returns, lengths, table, done = carry
            key, act_key, step_key = jax.random.split(key, 3)
            if memory is None:
                actions, hidden = act(act_key, observation), None
            else:
                actions, hidden = act(act_key, observation, memory)
            ts = env.step(step_key, env_state, actions)
            returns, lengths, team, _, ended, _ = track_team_episodes(returns, lengths, ts)
            memory = next_memory(memory, hidden, ended)
            rows, slot = jnp.arange(n_envs), jnp.minimum(done, episodes - 1)
            keep = jnp.logical_and(ended, done < episodes)
            table = table.at[rows, slot].set(jnp.where(keep, team, table[rows, slot]))
            done = done + keep.astype(jnp.int32)
            return t + 1, key, ts.observation, ts.state, memory, returns, lengths, table, done

        return jax.lax.while_loop(cond, body, carry)[7]

    return run
