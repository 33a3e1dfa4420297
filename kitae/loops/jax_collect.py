"""Collection in a JAX environment, written once: one vector step (act, step the environments,
track episodes, build the experience) as a pure function of arrays.

The compiled loop (``kitae.loops.program``) scans ``jax_vector_step`` inside its program and adds
each step to its buffer; a distributed collection worker (``kitae.distributed.workers``) scans an
iteration of it in one compiled call (``JaxCollector``) and sends the stacked experience to the
updater. Both therefore act, step and count episodes the same way.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kitae.loops.collect import Memory, act_step, initial_memory, make_experience, next_memory
from kitae.loops.episodes import track_episodes
from kitae.loops.multi_agent import env_agents, track_team_episodes
from kitae.loops.result import Episodes
from kitae.loops.state import EnvCarry, strongly_typed

__all__ = ["JaxStep", "jax_vector_step", "reset_env_carry", "JaxCollector"]


class JaxStep(NamedTuple):
    """One vector step in a JAX environment of ``E`` copies.

    Attributes:
        experience: the agent's experience type, leaves ``(E, ...)`` (dicts keyed by agent in
            multi-agent environments).
        env: the ``EnvCarry`` after the step.
        agent_key: the next loop key.
        ended: ``(E,)`` bool: an episode (the team's, multi-agent) ended at this step.
        episode_return: ``(E,)`` the ended episodes' returns (the team's: the sum over agents);
            meaningful where ``ended``.
        episode_length: ``(E,)`` their lengths.
        agent_returns: multi-agent: ``{agent: (E,)}`` each agent's return of the ended episodes;
            ``None`` for one agent.
    """

    experience: Any
    env: EnvCarry
    agent_key: jax.Array
    ended: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array
    agent_returns: dict[str, jax.Array] | None


def reset_env_carry(env: Any, agents: tuple[str, ...] | None, key: jax.Array, memory: Memory | None = None) -> EnvCarry:
    """Resets ``env`` with ``split(key)[1]``; the carry's environment key is ``split(key)[0]``,
    running returns and lengths start at zero; ``memory``: a recurrent agent's
    (``kitae.loops.collect.initial_memory``).

    ``key`` is a raw ``(2,)`` uint32 PRNG key; the carry's observations are ``(E, *obs_shape)``,
    its returns ``(E,)`` float32 (``{agent: (E,)}`` with ``agents``) and lengths ``(E,)`` int32."""
    env_key, reset_key = jax.random.split(key)
    observation, env_state = env.reset(reset_key)
    n = env.num_envs
    zeros = jnp.zeros((n,), jnp.float32)
    return EnvCarry(
        key=env_key,
        state=env_state,
        observation=observation,
        episode_return=zeros if agents is None else dict.fromkeys(agents, zeros),
        episode_length=jnp.zeros((n,), jnp.int32),
        memory=memory,
    )


def jax_vector_step(
    agent: Any,
    env: Any,
    agents: tuple[str, ...] | None,
    acting_params: Any,
    agent_key: jax.Array,
    carry: EnvCarry,
    env_step: jax.Array,
    fold: int | None = None,
) -> JaxStep:
    """One vector step: ``act_step`` (the loop key's split, ``fold``: a distributed worker's share),
    the environments' step with ``split(carry.key)[1]``, episode tracking and the experience.

    Args:
        agent: the agent (its pure ``act`` and ``experience_type``).
        env: a ``kitae.envs.jax_env.VecJaxEnv`` of ``E`` copies.
        agents: ``env_agents(env)`` (``None`` for a single-agent environment).
        acting_params: ``agent.acting_params(state)``.
        agent_key: the loop key, a raw ``(2,)`` uint32 key.
        carry: the environments' ``EnvCarry`` (observations ``(E, *obs_shape)``).
        env_step: int32 scalar ``()``, the run's transitions before this step (what acting reads).
        fold: ``act_step``'s ``fold`` (a distributed worker's share of the step).

    Returns:
        A ``JaxStep``.
    """
    actions, log_probs, agent_key, hidden = act_step(
        agent, acting_params, agent_key, carry.observation, env_step, fold, carry.memory
    )
    env_key, step_key = jax.random.split(carry.key)
    ts = env.step(step_key, carry.state, actions)
    experience = make_experience(
        agent.experience_type,
        observation=carry.observation,
        action=actions,
        reward=ts.reward,
        done=ts.terminated,
        next_observation=ts.next_observation,
        log_prob=log_probs,
        truncated=ts.truncated,
        memory=carry.memory,
    )
    agent_returns = None
    if agents is None:
        ended = jnp.logical_or(ts.terminated, ts.truncated)
        running_return, running_length, episode_return, episode_length = track_episodes(
            jnp, carry.episode_return, carry.episode_length, ts.reward, ended
        )
    else:
        running_return, running_length, episode_return, episode_length, ended, agent_returns = track_team_episodes(
            carry.episode_return, carry.episode_length, ts
        )
    memory = next_memory(carry.memory, hidden, ended)
    env_carry = EnvCarry(env_key, ts.state, ts.observation, running_return, running_length, memory)
    return JaxStep(experience, env_carry, agent_key, ended, episode_return, episode_length, agent_returns)


class JaxCollector:
    """Collects whole iterations in a JAX environment, each one compiled call (a ``jax.lax.scan``
    of ``jax_vector_step``): what a distributed collection worker runs for gymnax, Brax and
    JaxMARL ids. The environments' state stays on this worker between calls.

    Args:
        agent: the agent.
        env: a ``kitae.envs.jax_env.VecJaxEnv`` (this worker's ``E`` copies).
        fold: ``act_step``'s ``fold`` (a worker's share of each act key when several collect).
    """

    def __init__(self, agent: Any, env: Any, fold: int | None = None) -> None:
        self.env, self.agents = env, env_agents(env)
        self.carry: EnvCarry | None = None
        agents = self.agents

        def rollout(
            acting: Any, key: jax.Array, carry: EnvCarry, env_step: jax.Array, stride: jax.Array, n_steps: int
        ) -> tuple[jax.Array, EnvCarry, tuple]:
            def body(c: tuple[jax.Array, EnvCarry], t: jax.Array) -> tuple[tuple[jax.Array, EnvCarry], tuple]:
                out = jax_vector_step(agent, env, agents, acting, c[0], c[1], env_step + t * stride, fold)
                return (out.agent_key, out.env), (
                    out.experience,
                    out.ended,
                    out.episode_return,
                    out.episode_length,
                    out.agent_returns,
                )

            (key, carry), steps = jax.lax.scan(body, (key, carry), jnp.arange(n_steps, dtype=jnp.int32))
            return key, carry, steps

        self._rollout = jax.jit(rollout, static_argnums=(5,))
        memory = initial_memory(agent, env.num_envs, agents)
        self._reset = jax.jit(lambda key: reset_env_carry(env, agents, key, memory))

    def reset(self, key: jax.Array) -> None:
        """Resets the environments from ``key``, a raw ``(2,)`` uint32 key (``reset_env_carry``);
        strongly typed leaves, so the first rollout compiles the same program as the later ones."""
        self.carry = strongly_typed(self._reset(key))

    def collect(
        self, acting: Any, key: jax.Array, env_step: int, n_steps: int, stride: int
    ) -> tuple[Any, list[tuple[int, Episodes]], jax.Array]:
        """Collects ``n_steps`` vector steps from the loop key ``key``.

        Args:
            acting: ``agent.acting_params(state)``.
            key: the loop key, a raw ``(2,)`` uint32 key.
            env_step: the run's transitions before the first step.
            n_steps: vector steps to collect (static: a new value compiles a new program).
            stride: the transitions one vector step counts (every worker's environments).

        Returns:
            ``(rows, episodes, next loop key)``: ``rows``, the experience with leaves
            ``(n_steps, E, ...)`` as numpy arrays; ``episodes``, ``[(t, Episodes)]`` for each step
            ``t`` in which episodes ended (one row per episode, recorded at the step after ``t``).
        """
        if self.carry is None:
            raise RuntimeError("JaxCollector.collect before reset")
        key, self.carry, steps = self._rollout(
            acting, key, self.carry, jnp.asarray(env_step, jnp.int32), jnp.asarray(stride, jnp.int32), n_steps
        )
        experience, ended, episode_return, episode_length, returns_by_agent = jax.device_get(steps)
        episodes = []
        for t in np.flatnonzero(ended.any(axis=1)):
            rows = np.flatnonzero(ended[t])
            agent_returns = None
            if returns_by_agent is not None:
                agent_returns = {a: r[t, rows].astype(np.float64) for a, r in returns_by_agent.items()}
            episodes.append(
                (
                    int(t),
                    Episodes(
                        np.full(len(rows), env_step + (t + 1) * stride),
                        episode_return[t, rows].astype(np.float64),
                        episode_length[t, rows].astype(np.float64),
                        np.ones(len(rows), np.int64),
                        agent_returns,
                    ),
                )
            )
        return experience, episodes, key
