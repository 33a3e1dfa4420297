"""Minibatch epochs as one ``jax.lax.scan``: shuffle, cut into minibatches, one update step each.

``on_policy_update`` is the whole on-policy update (process the rollout, then ``n_epochs`` epochs
of minibatches), written once: ``OnPolicyAgent``'s update (``kitae.base``) and the functional
agents (``kitae.functional``) run it. ``UpdateHooks`` are the pure functions an agent runs around
it (running statistics of the rollout: PPO's normalisation, RND-PPO's intrinsic rewards);
``with_update_hooks`` composes them, and the distributed executor, which runs the update one
gradient step at a time, runs the same hooks around its steps. Also importable as
``kitae.loops.update`` (the path seed 001 documents).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from kitae.modules.pytree import AgentPyTree


def rebuild_experience(experience_type: type, leaves: Any) -> Any:
    """Builds ``experience_type`` from a sequence of fields (NamedTuple classes, ``tuple``, ``list``)."""
    if hasattr(experience_type, "_make"):
        return experience_type._make(leaves)
    return experience_type(leaves)


def batchify(experience: Any, batch_size: int) -> Any:
    """Cuts every leaf ``(N, ...)`` into ``(N // batch_size, batch_size, ...)`` minibatches.

    The last ``N % batch_size`` rows are dropped (shuffle before calling, so each epoch drops
    different rows).

    Raises:
        ValueError: if ``batch_size`` is larger than ``N``.
    """
    sizes = {x.shape[0] for x in jax.tree_util.tree_leaves(experience)}
    if len(sizes) != 1:
        raise ValueError(f"every leaf of the experience must have the same leading size, got {sorted(sizes)}")
    n = sizes.pop()
    if batch_size > n:
        raise ValueError(f"batch_size={batch_size} is larger than the {n} transitions available")
    n_batches = n // batch_size
    return jax.tree_util.tree_map(
        lambda x: x[: n_batches * batch_size].reshape(n_batches, batch_size, *x.shape[1:]), experience
    )


def update_epoch(
    key: jax.Array,
    state: AgentPyTree,
    experience: NamedTuple,
    batchify_fn: Callable,
    update_batch_fn: Callable[[AgentPyTree, jax.Array, NamedTuple], tuple[AgentPyTree, dict[str, jax.Array]]],
    *,
    experience_type: type[NamedTuple],
    batch_size: int,
) -> tuple[AgentPyTree, dict[str, jax.Array]]:
    """Updates a state in a single epoch.

    Shuffles the experience (leaves ``(N, ...)``), cuts it into minibatches with
    ``batchify_fn(experience, batch_size)`` (leaves ``(N // batch_size, batch_size, ...)``, e.g.
    ``kitae.loops.update.batchify``), and scans ``update_batch_fn(state, key, minibatch)`` over
    them with ``jax.lax.scan``, so the compiled program holds one update step whatever the number
    of minibatches.

    Args:
        key: a PRNG key for the shuffle and the update steps.
        state: the agent's state.
        experience: processed trajectories, a tuple of arrays with a common leading size ``N``.
        batchify_fn: cuts the shuffled experience into minibatches.
        update_batch_fn: one gradient step on one minibatch, ``(state, key, batch) -> (state, info)``.
        experience_type: the tuple type each minibatch is rebuilt as (a NamedTuple class or
            ``tuple``).
        batch_size: transitions per minibatch (static).

    Returns:
        The updated state and the mean over minibatches of each entry of ``info``.
    """
    step_keys, batches = epoch_minibatches(key, experience, batch_size, batchify_fn)

    def step(carry: AgentPyTree, inputs: tuple[jax.Array, Any]) -> tuple[AgentPyTree, dict]:
        step_key, batch = inputs
        batch = rebuild_experience(experience_type, list(batch))
        return update_batch_fn(carry, step_key, batch)

    state, infos = jax.lax.scan(step, state, (step_keys, tuple(batches)))
    return state, jax.tree_util.tree_map(lambda x: jnp.mean(x, axis=0), infos)


def epoch_minibatches(
    key: jax.Array, experience: Any, batch_size: int, batchify_fn: Callable = batchify
) -> tuple[jax.Array, Any]:
    """The minibatches of one epoch and the key of each gradient step on them: the epoch's rule,
    written once (``update_epoch`` scans over it; the distributed executor deals its minibatches
    to gradient workers one by one).

    ``(shuffle_key, steps_key) = split(key)``; the experience (leaves ``(N, ...)``) is permuted
    with ``shuffle_key`` and cut by ``batchify_fn``.

    Returns:
        ``(step_keys (n_batches, 2), batches)``: ``batches`` has leaves
        ``(n_batches, batch_size, ...)`` in the experience's structure.
    """
    shuffle_key, steps_key = jax.random.split(key)
    n = jax.tree_util.tree_leaves(experience)[0].shape[0]
    permutation = jax.random.permutation(shuffle_key, n)
    shuffled = jax.tree_util.tree_map(lambda x: jnp.take(x, permutation, axis=0), experience)
    batches = batchify_fn(shuffled, batch_size)
    n_batches = jax.tree_util.tree_leaves(batches)[0].shape[0]
    return jax.random.split(steps_key, n_batches), batches


def mean_over_steps(infos: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The mean of each entry of a scan's stacked infos over its leading (step) axis: each leaf
    ``(n_steps, ...)`` becomes ``(...)`` (a scalar for a scalar info)."""
    return jax.tree_util.tree_map(lambda x: jnp.mean(x, axis=0), infos)


def process_rollout(pipeline: Any, state: Any, key: jax.Array, rollout: Any, n_epochs: int) -> tuple[Any, jax.Array]:
    """The first part of an on-policy update (pure): ``(process_key, epochs_key) = split(key)``;
    the rollout (leaves ``(T, E, ...)``) goes through ``pipeline.run(state, process_key, ...)``
    (an ``ExperiencePipeline``).

    Returns:
        ``(processed, epoch_keys)``: the processed experience (leaves ``(N, ...)``) and one key per
        epoch ``(n_epochs, 2)`` (each epoch's minibatches: ``epoch_minibatches``).
    """
    process_key, epochs_key = jax.random.split(key)
    return pipeline.run(state, process_key, rollout), jax.random.split(epochs_key, n_epochs)


class UpdateHooks(NamedTuple):
    """What an on-policy agent does to its state around the update's processing and epochs: pure
    functions of the state and the rollout (leaves ``(T, E, ...)``), each ``(state, rollout) ->
    state``, or ``None`` for nothing.

    Attributes:
        prepare: before processing (the update's processing and epochs see its state).
        finish: after the last gradient step.

    Every executor runs them at the same two points: the fused update (``with_update_hooks``) and
    the distributed executor's update made gradient step by gradient step
    (``kitae.distributed.AgentAlgorithm.prepare_update`` / ``finish_update``).
    """

    prepare: Callable[[Any, Any], Any] | None = None
    finish: Callable[[Any, Any], Any] | None = None


def with_update_hooks(hooks: UpdateHooks, update_fn: Callable) -> Callable:
    """``update_fn(state, key, rollout) -> (state, info)`` with ``hooks.prepare`` before it and
    ``hooks.finish`` after it (pure and jit-able); ``update_fn`` itself when both are ``None``."""
    if hooks.prepare is None and hooks.finish is None:
        return update_fn
    prepare, finish = hooks

    def hooked_update_fn(state: Any, key: jax.Array, rollout: Any) -> tuple[Any, dict[str, jax.Array]]:
        if prepare is not None:
            state = prepare(state, rollout)
        state, info = update_fn(state, key, rollout)
        if finish is not None:
            state = finish(state, rollout)
        return state, info

    return hooked_update_fn


def on_policy_update(
    pipeline: Any,
    update_step_fn: Callable,
    state: Any,
    key: jax.Array,
    rollout: Any,
    *,
    n_epochs: int,
    batch_size: int,
) -> tuple[Any, dict[str, jax.Array]]:
    """One whole on-policy update: ``process_rollout``, then ``n_epochs`` epochs of shuffled
    minibatches of ``batch_size`` rows (``update_epoch``), all one ``jax.lax.scan``.

    Args:
        pipeline: the ``ExperiencePipeline`` of the agent's processing.
        update_step_fn: one gradient step ``(state, key, minibatch) -> (state, info)``.
        state: the agent's state pytree (its leaves' shapes are kept).
        key: a PRNG key (a raw ``(2,)`` uint32 key).
        rollout: leaves ``(T, E, ...)``.
        n_epochs, batch_size: static.

    Returns:
        ``(state, info)``, info the mean of each entry over every gradient step.
    """
    processed, epoch_keys = process_rollout(pipeline, state, key, rollout, n_epochs)

    def one_epoch(state: Any, epoch_key: jax.Array) -> tuple[Any, dict]:
        return update_epoch(
            epoch_key,
            state,
            processed,
            batchify,
            update_step_fn,
            experience_type=type(processed),
            batch_size=batch_size,
        )

    state, infos = jax.lax.scan(one_epoch, state, epoch_keys)
    return state, mean_over_steps(infos)
