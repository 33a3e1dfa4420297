"""Episode bookkeeping and evaluation for multi-agent JAX environments (dicts keyed by agent).

The compiled loop (``kitae.loops.compiled``) uses ``env_agents`` to tell a multi-agent
environment (``kitae.envs.jaxmarl_env.VecJaxMARLEnv``) from a single-agent one, and
``track_team_episodes`` to count episodes: an episode ends for the team when it ends for every
agent, its TEAM return is the sum of the agents' returns, and each agent's own return is kept too.
``evaluate_team_returns`` scores a policy with the same bookkeeping (``kitae eval`` and
``benchmarks/bench_jaxmarl.py``).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from kitae.loops.episodes import track_episodes


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


def evaluate_team_returns(env: Any, act: Callable[[jax.Array, dict], dict], key: jax.Array,
                          episodes: int = 1, max_steps: int = 100_000) -> np.ndarray:
    """Team returns of the first ``episodes`` episodes of each of ``env.num_envs`` environments.

    Runs in one compiled ``jax.lax.while_loop`` until every environment has finished
    ``episodes`` episodes (or ``max_steps`` vector steps), counting episodes with
    ``track_team_episodes``; the episodes an environment finishes past ``episodes`` are not
    counted.

    Args:
        env: a multi-agent vectorized JAX environment (``VecJaxMARLEnv``).
        act: ``act(key, observations) -> actions``, dicts keyed by agent, leaves ``(E, ...)``.
        key: PRNG key for the resets, the steps and ``act``.
        episodes: episodes per environment (>= 1).
        max_steps: vector steps at most (>= 1); episodes unfinished then count as NaN.

    Returns:
        ``(E, episodes)`` float array of team returns.

    Raises:
        ValueError: for ``episodes`` or ``max_steps`` < 1, or an environment without agents.
    """
    agents = env_agents(env)
    if agents is None:
        raise ValueError(f"env={env!r} is not allowed; allowed: a multi-agent JAX environment (with agents)")
    for name, value in (("episodes", episodes), ("max_steps", max_steps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} is not allowed; allowed: an int >= 1")
    n_envs = env.num_envs

    def run(key: jax.Array) -> jax.Array:
        key, reset_key = jax.random.split(key)
        observation, env_state = env.reset(reset_key)
        carry = (
            jnp.zeros((), jnp.int32), key, observation, env_state,
            {a: jnp.zeros((n_envs,), jnp.float32) for a in agents}, jnp.zeros((n_envs,), jnp.int32),
            jnp.full((n_envs, episodes), jnp.nan, jnp.float32), jnp.zeros((n_envs,), jnp.int32),
        )

        def cond(carry: tuple) -> jax.Array:
            return jnp.logical_and(carry[0] < max_steps, jnp.any(carry[-1] < episodes))

        def body(carry: tuple) -> tuple:
            t, key, observation, env_state, returns, lengths, table, done = carry
            key, act_key, step_key = jax.random.split(key, 3)
            ts = env.step(step_key, env_state, act(act_key, observation))
            returns, lengths, team, _, ended, _ = track_team_episodes(returns, lengths, ts)
            rows, slot = jnp.arange(n_envs), jnp.minimum(done, episodes - 1)
            keep = jnp.logical_and(ended, done < episodes)
            table = table.at[rows, slot].set(jnp.where(keep, team, table[rows, slot]))
            return t + 1, key, ts.observation, ts.state, returns, lengths, table, done + keep.astype(jnp.int32)

        return jax.lax.while_loop(cond, body, carry)[6]

    return np.asarray(jax.jit(run)(key), dtype=np.float64)
