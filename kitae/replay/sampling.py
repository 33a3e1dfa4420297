"""Sampling a replay buffer: uniform or prioritized transitions, n-step returns, hindsight goals.

``sample_transitions`` draws a minibatch of transitions from a ``kitae.buffer.BufferState``
(leaves ``(capacity, E, ...)``, item ``row * E + env``) as its ``ReplayConfig`` says, pure and
jit-able, so the host loop, the compiled loop and the distributed gradient workers sample alike:

* **which transitions**: uniform over the ``size * E`` stored ones, or in proportion to their
  priorities (``kitae.replay.prioritized``), with importance weights;
* **n-step returns**: from a sampled row, up to ``n`` rows of the same environment, in the ring
  buffer's order (wrapping around its end, never past the newest row): the discounted sum of their
  rewards, cut after a terminated step (no bootstrap: ``done``) or a truncated one (bootstrap from
  its real final observation); the transition's ``next_observation``, ``done``, ``truncated`` are
  those of its last step and ``n_steps`` how many were summed;
* **hindsight relabelling** (HER, Andrychowicz et al. 2017): a fraction of the transitions get a
  goal achieved in their own episode (``future``: at or after the transition, ``final``: at its
  end, ``episode``: anywhere in it) as ``desired_goal``, and the reward the environment's
  ``compute_reward`` gives for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from kitae.replay.prioritized import importance_weights, sample_prioritized

__all__ = ["ReplaySample", "sample_transitions", "gather", "n_step_transitions", "relabel_goals", "episode_bounds"]


class ReplaySample(NamedTuple):
    """A sampled minibatch.

    Attributes:
        experience: the transitions, the buffer's experience type with leaves ``(B, ...)``;
            ``n_steps`` and ``weight`` set where the type has those fields (n-step and
            prioritized replay).
        indices: the items sampled, ``(B,)`` int32 (``row * E + env``): where their new
            priorities go.
    """

    experience: Any
    indices: jax.Array


def gather(data: Any, rows: jax.Array, envs: jax.Array) -> Any:
    """The transitions at ``(rows[b], envs[b])``: leaves ``(capacity, E, ...)`` -> ``(B, ...)``."""
    return jax.tree_util.tree_map(lambda buf: buf[rows, envs], data)


def _rows_after(buffer_state: Any, rows: jax.Array) -> jax.Array:
    """How many rows from ``rows`` to the newest one, both included, ``(B,)``."""
    return (buffer_state.position - 1 - rows) % buffer_state.capacity + 1


def _rows_before(buffer_state: Any, rows: jax.Array) -> jax.Array:
    """How many stored rows come before ``rows`` (back to the oldest one), ``(B,)``."""
    full = buffer_state.size == buffer_state.capacity
    return jnp.where(full, (rows - buffer_state.position) % buffer_state.capacity, rows)


def _ended(data: Any, rows: jax.Array, envs: jax.Array) -> jax.Array:
    done = jnp.asarray(data.done[rows, envs], bool)
    truncated = getattr(data, "truncated", None)
    return done if truncated is None else jnp.logical_or(done, jnp.asarray(truncated[rows, envs], bool))


def n_step_transitions(
    buffer_state: Any, rows: jax.Array, envs: jax.Array, n: int, gamma: float | jax.Array
) -> tuple[Any, jax.Array]:
    """The ``n``-step transitions starting at ``(rows, envs)`` ``(B,)``.

    Returns:
        ``(experience, n_steps)``: the first step's transition with ``reward`` the discounted sum
        ``sum_k gamma^k r_k`` over its ``n_steps`` ``(B,)`` steps, and ``next_observation``,
        ``done`` (and ``truncated``) those of its last step.
    """
    data, capacity = buffer_state.data, buffer_state.capacity
    available = _rows_after(buffer_state, rows)
    first = gather(data, rows, envs)
    total = jnp.zeros(rows.shape, jnp.float32)
    last = jnp.zeros(rows.shape, jnp.int32)
    alive = jnp.ones(rows.shape, bool)
    for k in range(n):
        row_k = (rows + k) % capacity
        take = jnp.logical_and(alive, k < available)
        total = total + jnp.where(take, (gamma**k) * jnp.asarray(data.reward[row_k, envs], jnp.float32), 0.0)
        last = jnp.where(take, k, last)
        alive = jnp.logical_and(take, jnp.logical_not(_ended(data, row_k, envs)))
    last_rows = (rows + last) % capacity
    end = gather(data, last_rows, envs)
    replaced = {"reward": total, "next_observation": end.next_observation, "done": end.done}
    if getattr(first, "truncated", None) is not None:
        replaced["truncated"] = end.truncated
    return first._replace(**replaced), last + 1


def episode_bounds(buffer_state: Any, rows: jax.Array, envs: jax.Array, horizon: int) -> tuple[jax.Array, jax.Array]:
    """How far each transition's episode reaches, in rows, within ``horizon`` on each side.

    Returns:
        ``(before, after)`` ``(B,)`` int32: the episode's steps stored before the transition's row,
        and after it up to its last step (or the newest row, for an episode still running).
    """
    data, capacity = buffer_state.data, buffer_state.capacity
    after_available, before_available = _rows_after(buffer_state, rows), _rows_before(buffer_state, rows)
    after = jnp.zeros(rows.shape, jnp.int32)
    searching = jnp.logical_not(_ended(data, rows, envs))
    for k in range(1, horizon):
        inside = jnp.logical_and(searching, k < after_available)
        after = jnp.where(inside, k, after)
        searching = jnp.logical_and(inside, jnp.logical_not(_ended(data, (rows + k) % capacity, envs)))
    before = jnp.zeros(rows.shape, jnp.int32)
    searching = jnp.ones(rows.shape, bool)
    for k in range(1, horizon):
        previous = (rows - k) % capacity
        inside = jnp.logical_and(searching, k <= before_available)
        inside = jnp.logical_and(inside, jnp.logical_not(_ended(data, previous, envs)))  # not the last episode's end
        before = jnp.where(inside, k, before)
        searching = inside
    return before, after


def relabel_goals(
    buffer_state: Any,
    experience: Any,
    rows: jax.Array,
    envs: jax.Array,
    key: jax.Array,
    *,
    strategy: str,
    ratio: float,
    horizon: int,
    reward_fn: Callable[[jax.Array, jax.Array], jax.Array],
) -> Any:
    """Hindsight relabelling of sampled transitions ``experience`` (leaves ``(B, ...)``, ``Dict``
    observations with ``achieved_goal`` and ``desired_goal``) taken at ``(rows, envs)``.

    Each transition is relabelled with probability ``ratio``: its new goal is the
    ``next_observation["achieved_goal"]`` of a transition of its own episode chosen by
    ``strategy`` (``future``: uniform at or after it, ``final``: the episode's last, ``episode``:
    uniform in the episode), written as ``desired_goal`` of both observations, and its reward is
    ``reward_fn(next achieved goal, new goal)``. Termination is kept as stored.
    """
    relabel_key, offset_key = jax.random.split(key)
    before, after = episode_bounds(buffer_state, rows, envs, horizon)
    u = jax.random.uniform(offset_key, rows.shape)
    if strategy == "future":
        offsets = jnp.floor(u * (after + 1)).astype(jnp.int32)
    elif strategy == "final":
        offsets = after
    elif strategy == "episode":
        offsets = jnp.floor(u * (before + after + 1)).astype(jnp.int32) - before
    else:
        raise ValueError(f"replay.her={strategy!r} is not allowed; allowed: 'future', 'final', 'episode'")
    offsets = jnp.minimum(offsets, after)  # u < 1, but float rounding must not step past the episode
    goal_rows = (rows + offsets) % buffer_state.capacity
    new_goal = buffer_state.data.next_observation["achieved_goal"][goal_rows, envs]
    relabel = jax.random.uniform(relabel_key, rows.shape) < ratio

    def with_goal(observation: dict) -> dict:
        goal = jnp.where(relabel[:, None], new_goal, observation["desired_goal"])
        return {**observation, "desired_goal": goal.astype(observation["desired_goal"].dtype)}

    achieved = experience.next_observation["achieved_goal"]
    reward = jnp.where(relabel, jnp.asarray(reward_fn(achieved, new_goal), jnp.float32), experience.reward)
    return experience._replace(
        observation=with_goal(experience.observation),
        next_observation=with_goal(experience.next_observation),
        reward=reward.astype(jnp.asarray(experience.reward).dtype),
    )


def sample_transitions(
    buffer_state: Any,
    key: jax.Array,
    batch_size: int,
    replay: Any,
    *,
    gamma: float | jax.Array = 1.0,
    beta: float | jax.Array = 1.0,
    reward_fn: Callable[[jax.Array, jax.Array], jax.Array] | None = None,
) -> ReplaySample:
    """``batch_size`` transitions of ``buffer_state`` as ``replay`` (a ``kitae.config.ReplayConfig``)
    says: uniform or prioritized (importance weights with exponent ``beta``), one or
    ``replay.n_step`` steps (discounted by ``gamma``), relabelled with ``replay.her`` goals
    (rewards from ``reward_fn``). The buffer must hold at least one row.

    Args:
        buffer_state: the buffer, leaves ``(capacity, E, ...)`` (``priorities`` set when
            ``replay.prioritized``).
        key: a PRNG key, a raw ``(2,)`` uint32 key.
        batch_size: ``B``, the transitions drawn (with replacement).
        replay: a ``kitae.config.ReplayConfig``; its fields are static (read while tracing).
        gamma: the discount of n-step rewards, a float or a scalar ``()`` (unused when
            ``replay.n_step == 1``).
        beta: the exponent of the importance weights, a float or a scalar ``()`` (unused without
            ``replay.prioritized``).
        reward_fn: with ``replay.her``, ``reward_fn(achieved_goal (B, G), desired_goal (B, G))``
            giving the rewards ``(B,)`` of relabelled transitions; unused otherwise.

    Returns:
        A ``ReplaySample``: the experience with leaves ``(B, ...)`` and its ``indices`` ``(B,)``.
    """
    n_envs = buffer_state.n_envs
    index_key, her_key = jax.random.split(key)
    weights = None
    if replay.prioritized:
        indices, probabilities = sample_prioritized(buffer_state.priorities, index_key, batch_size)
        weights = importance_weights(probabilities, buffer_state.size * n_envs, beta)
    else:
        indices = jax.random.randint(index_key, (batch_size,), 0, jnp.maximum(buffer_state.size, 1) * n_envs)
    rows, envs = indices // n_envs, indices % n_envs
    n_steps = None
    if replay.n_step > 1:
        experience, n_steps = n_step_transitions(buffer_state, rows, envs, replay.n_step, gamma)
    else:
        experience = gather(buffer_state.data, rows, envs)
    if replay.her is not None:
        assert reward_fn is not None  # the agent checks this when it is made
        experience = relabel_goals(
            buffer_state,
            experience,
            rows,
            envs,
            her_key,
            strategy=replay.her,
            ratio=replay.her_ratio,
            horizon=replay.her_horizon,
            reward_fn=reward_fn,
        )
    fields = getattr(experience, "_fields", ())
    extra = {name: value for name, value in (("n_steps", n_steps), ("weight", weights)) if name in fields}
    return ReplaySample(experience._replace(**extra) if extra else experience, indices.astype(jnp.int32))
