"""The collection and update steps, written once for every executor.

The compiled loop traces these functions inside its program; the host loop calls them compiled
(``compiled_steps(agent)``, one XLA call each). Both therefore split the loop key the same way
(``kitae.loops.state``), build the same experience and make the same updates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from kitae.buffer import Experience

__all__ = ["act_step", "update_step", "make_experience", "compiled_steps", "CompiledSteps"]


def act_step(
    agent: Any, acting_params: Any, key: jax.Array, observation: Any, env_step: jax.Array, fold: int | None = None
) -> tuple[Any, Any, jax.Array]:
    """One act of a run: ``(key, act_key) = split(key)``, then ``agent.act`` with ``act_key``.

    Args:
        agent: the agent (its pure ``act``).
        acting_params: ``agent.acting_params(state)``.
        key: the loop key.
        observation: ``(E, *obs_shape)`` (dicts keyed by agent in multi-agent mode).
        env_step: environment steps so far, an int32 scalar.
        fold: acting with ``fold_in(act_key, fold)`` instead (a distributed collection worker's
            own share of the step, when several collect with the same loop key); the loop key
            advances the same.

    Returns:
        ``(actions, log_probs, next loop key)``; log-probabilities as float32.
    """
    key, act_key = jax.random.split(key)
    if fold is not None:
        act_key = jax.random.fold_in(act_key, fold)
    actions, log_probs = agent.act(acting_params, act_key, observation, env_step)
    log_probs = jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), log_probs)
    return actions, log_probs, key


def update_step(agent: Any, agent_state: Any, key: jax.Array, buffer_state: Any) -> tuple[Any, jax.Array, dict]:
    """One update of a run: ``(key, update_key) = split(key)``, then ``agent.update_fn`` on
    ``agent.update_data(buffer_state)``.

    Returns:
        ``(agent_state, next loop key, info)``: info holds the mean of each entry over the
        update's gradient steps.
    """
    key, update_key = jax.random.split(key)
    agent_state, info = agent.update_fn(agent_state, update_key, agent.update_data(buffer_state))
    return agent_state, key, info


def make_experience(
    experience_type: type[Any],
    *,
    observation: Any,
    action: Any,
    reward: Any,
    done: Any,
    next_observation: Any,
    log_prob: Any,
    truncated: Any,
) -> Any:
    """One vector step as the agent's experience type (its fields are a subset of
    ``kitae.buffer.Experience``'s, filled by name). ``done`` is termination; ``truncated`` a cut;
    ``next_observation`` the real next observation (the final one where an episode ended)."""
    fields = {
        "observation": observation,
        "action": action,
        "reward": reward,
        "done": done,
        "next_observation": next_observation,
        "log_prob": log_prob,
        "truncated": truncated,
    }
    if experience_type is Experience:
        return Experience(**fields)
    return experience_type(**{name: fields[name] for name in experience_type._fields})


class CompiledSteps(NamedTuple):
    """``act_step`` and ``update_step`` of one agent, each compiled as one XLA call (the host
    loop's)."""

    act: Callable[[Any, jax.Array, Any, Any], tuple[Any, Any, jax.Array]]
    update: Callable[[Any, jax.Array, Any], tuple[Any, jax.Array, dict]]


def compiled_steps(agent: Any) -> CompiledSteps:
    """The agent's compiled ``act_step`` and ``update_step`` (made once per agent and kept on it,
    so later runs of the same agent reuse the compiled programs)."""
    steps = agent.__dict__.get("_compiled_steps")
    if steps is None:
        steps = CompiledSteps(
            act=jax.jit(lambda params, key, obs, step: act_step(agent, params, key, obs, step)),
            update=jax.jit(lambda state, key, buffer: update_step(agent, state, key, buffer)),
        )
        agent.__dict__["_compiled_steps"] = steps
    return steps
