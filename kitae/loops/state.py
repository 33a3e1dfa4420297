"""What a run carries from step to step, and what a checkpoint holds: one ``LoopState`` for every executor.

``LoopState`` is a pytree of arrays: the agent's state and key, the buffer, the counters, and
(where the executor can save it) the environment. A checkpoint is a ``Payload``: a ``LoopState``
and a little JSON metadata. The host loop's environments are Python objects that cannot be
saved, so its payloads have no environment part; the compiled loop's have one. Any executor
starts from any payload: one without an environment resets the environments (seeded from the
seed and the step) and marks the episodes that were running as cut (truncated) at that step.

Key discipline, the same in every executor: before each vector step the loop key is split into
(next loop key, key of this step's ``act``); an update due at the end of a step splits it into
(next loop key, key of the update). The same seed and config therefore give the same keys in
every executor.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kitae.buffer import BufferState

__all__ = [
    "EnvCarry",
    "LoopState",
    "Payload",
    "payload_from_agent",
    "apply_loop_state",
    "mark_episodes_cut",
    "pick_seed",
    "reset_seed",
    "env_reset_key",
    "strongly_typed",
]


class EnvCarry(NamedTuple):
    """The environment part of a compiled run's state (a pytree).

    Attributes:
        key: the PRNG key of the environment steps.
        state: the environments' state, batched ``(E, ...)``.
        observation: the observations to act on next, ``(E, *obs_shape)`` (dicts keyed by agent
            in multi-agent environments).
        episode_return: each environment's running return ``(E,)`` (``{agent: (E,)}``).
        episode_length: each environment's running episode length ``(E,)``.
        memory: a recurrent agent's ``kitae.loops.collect.Memory`` (hidden state and episode
            starts, ``(E, ...)``): saved with the environments, so a resume acts on from the same
            hidden state; ``None`` for a feed-forward agent.
    """

    key: jax.Array
    state: Any
    observation: Any
    episode_return: Any
    episode_length: jax.Array
    memory: Any = None


class LoopState(NamedTuple):
    """Everything a run carries from one step to the next (a pytree; leaves carry a leading seed
    axis when seeds train together in one program).

    Attributes:
        agent_state: the agent's ``AgentPyTree``.
        agent_key: the loop key, split for every act and every update.
        buffer: the ``BufferState`` (``None`` before the host loop's first step).
        env_step: int32, environment transitions so far, summed over environments.
        n_updates: int32, updates made so far.
        env: an ``EnvCarry`` (compiled loop), or ``None`` (host loop: its environments cannot be
            saved).
        diverged_step: compiled loop: int32, the environment step at which the run's update
            diverged (its losses or new state not finite; from then on no update is kept), -1
            while it has not. Part of the state, so that a checkpoint holds it and a resumed
            run of several seeds keeps a diverged seed where it stopped. ``None`` in the host
            loop (a run that diverges stops there), and in checkpoints older than the field.
    """

    agent_state: Any
    agent_key: jax.Array
    buffer: BufferState | None
    env_step: jax.Array | np.ndarray
    n_updates: jax.Array | np.ndarray
    env: EnvCarry | None = None
    diverged_step: jax.Array | np.ndarray | None = None


class Payload(NamedTuple):
    """A checkpoint's content: the loop state and its JSON metadata.

    ``meta`` holds ``executor`` (``"host"``, ``"compiled"`` or ``"distributed"``), ``seeds`` (the seeds of the
    state's leading axis, or ``None``) and ``env_saved`` (whether ``state.env`` is there).
    """

    state: LoopState
    meta: dict


def payload_from_agent(agent: Any, executor: str = "host", *, shapes: bool = False) -> Payload:
    """The payload of an agent facade's state: parameters, optimizer and target parameters, key,
    buffer and counters (no environment). ``shapes``: the agent's key and state as
    ``jax.ShapeDtypeStruct`` leaves (``BaseAgent.first_state_shape``), without computing them."""
    buffer = getattr(agent, "buffer", None)
    if shapes and hasattr(agent, "first_state_shape"):
        key, agent_state = agent.first_state_shape()
    else:
        key, agent_state = jnp.asarray(agent.key), agent.state
    state = LoopState(
        agent_state=agent_state,
        agent_key=key,
        buffer=None if buffer is None else buffer.state,
        env_step=jnp.asarray(int(agent.env_step), jnp.int32),
        n_updates=jnp.asarray(int(getattr(agent, "n_updates", 0)), jnp.int32),
    )
    return Payload(state, {"executor": executor, "seeds": None, "env_saved": False})


def strongly_typed(tree: Any) -> Any:
    """Every leaf as a strongly typed array (a Python scalar, such as a fresh ``TrainState``'s step
    counter, or a weakly typed array is not): a state a run starts from then has the types of the
    state it carries after an update or a restore, and compiled functions trace once."""

    def typed(x: Any) -> Any:
        x = jnp.asarray(x)
        return x.astype(x.dtype) if getattr(x, "weak_type", False) else x

    return jax.tree_util.tree_map(typed, tree)


def pick_seed(tree: Any, seed_index: int) -> Any:
    """Row ``seed_index`` of every leaf (one seed of a batched state)."""
    return jax.tree_util.tree_map(lambda x: x[seed_index], tree)


def apply_loop_state(agent: Any, state: LoopState, seed_index: int | None = None) -> Any:
    """Sets the agent facade's state, key, counters and buffer from a loop state (row
    ``seed_index`` of a batched one). Returns the agent.

    ``state``: a ``LoopState`` pytree of one seed (``agent_key`` ``(2,)``, ``env_step`` and
    ``n_updates`` scalars), or of seeds trained together (every leaf with a leading seed axis,
    ``(n_seeds, ...)``) with ``seed_index`` the row to take."""
    if seed_index is not None:
        state = pick_seed(state, seed_index)
    agent.state = state.agent_state
    agent.key = state.agent_key
    agent._key_block, agent._key_index = np.zeros((0, 2), np.uint32), 0
    agent.env_step = int(np.asarray(state.env_step))
    agent.n_updates = int(np.asarray(state.n_updates))
    buffer = getattr(agent, "buffer", None)
    if buffer is not None and state.buffer is not None:
        buffer.state = state.buffer
    return agent


def mark_episodes_cut(buffer: BufferState | None, cut: Any = True) -> BufferState | None:
    """The buffer with its newest row marked truncated (every environment, every agent) where
    ``cut`` holds (a bool, possibly a traced array).

    Used when a run goes on without its environments' state (a host-loop resume): the episodes
    that were running end there, as truncated episodes (bootstrap from the stored real next
    observation; nothing carried into the next, unrelated, transition). A buffer without a
    ``truncated`` field is returned as it is; an empty one is unchanged. Pure: runs eagerly (host
    loop) and traced (compiled loop).
    """
    if buffer is None or getattr(buffer.data, "truncated", None) is None:
        return buffer
    last = (buffer.position - 1) % buffer.capacity
    cut = jnp.logical_and(jnp.asarray(cut), buffer.size > 0)
    truncated = jax.tree_util.tree_map(
        lambda x: jnp.asarray(x).at[last].set(jnp.logical_or(jnp.asarray(x)[last], cut)), buffer.data.truncated
    )
    return buffer._replace(data=buffer.data._replace(truncated=truncated))


def reset_seed(seed: int, step: int) -> int:
    """The seed of the environments' reset when a run goes on at ``step`` without their state
    (``seed`` itself at step 0)."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0]) if step else seed


def env_reset_key(seed: Any, step: Any) -> jax.Array:
    """The key a JAX environment is reset from when a run starts or goes on at ``step`` without
    the environments' state: ``fold_in(PRNGKey(seed), 1)``, folded with ``step`` past step 0
    (``seed`` and ``step`` may be traced, scalars). Returns a raw ``(2,)`` uint32 key."""
    base = jax.random.fold_in(jax.random.PRNGKey(seed), 1)
    step = jnp.asarray(step, jnp.int32)
    return jnp.where(step == 0, base, jax.random.fold_in(base, step))
