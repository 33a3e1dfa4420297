"""Proportional prioritized replay (Schaul et al. 2016, "Prioritized Experience Replay"), pure.

A buffer of ``capacity`` rows of ``E`` environments holds ``N = capacity * E`` transitions; item
``row * E + env`` is the transition in ``row`` of environment ``env``. ``Priorities`` keeps their
priorities ``p_i^alpha`` in a ``SumTree``; sampling draws item ``i`` with probability ``P(i) =
p_i^alpha / sum_j p_j^alpha`` (stratified), and the update that learns from it hands back
``|TD error|`` to make its new priority. Every function is pure and jit-able.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from kitae.replay.sum_tree import SumTree, sum_tree_init, sum_tree_sample, sum_tree_set, sum_tree_total

__all__ = [
    "Priorities",
    "priorities_init",
    "add_at_max_priority",
    "sample_prioritized",
    "importance_weights",
    "update_priorities",
    "annealed_beta",
]


class Priorities(NamedTuple):
    """The priorities of a buffer's items (a pytree, part of ``kitae.buffer.BufferState``).

    Attributes:
        tree: a ``SumTree`` over ``N`` items of ``p_i^alpha`` (0 for an item never written).
        max_priority: the largest ``p_i^alpha`` seen, float32 scalar (1 at the start): what new
            transitions get, so each is sampled at least once soon.
        steps: the gradient steps that sampled from it so far, int32 scalar (``beta``'s clock).
    """

    tree: SumTree
    max_priority: jax.Array
    steps: jax.Array


def priorities_init(n_items: int) -> Priorities:
    """Priorities of ``n_items`` items, all 0 (nothing written yet)."""
    return Priorities(sum_tree_init(n_items), jnp.ones((), jnp.float32), jnp.zeros((), jnp.int32))


def add_at_max_priority(priorities: Priorities, indices: jax.Array) -> Priorities:
    """Items ``indices`` ``(E,)`` (a row just written) get the largest priority seen."""
    values = jnp.broadcast_to(priorities.max_priority, indices.shape)
    return priorities._replace(tree=sum_tree_set(priorities.tree, indices, values))


def sample_prioritized(priorities: Priorities, key: jax.Array, batch_size: int) -> tuple[jax.Array, jax.Array]:
    """``batch_size`` items drawn in proportion to their priorities (``sum_tree_sample``).

    Returns:
        ``(indices (B,) int32, probabilities (B,) float32)``: the items and ``P(i)``.
    """
    tree = priorities.tree
    indices = sum_tree_sample(tree, key, batch_size)
    return indices, tree.nodes[tree.leaves_offset + indices] / sum_tree_total(tree)


def importance_weights(probabilities: jax.Array, n_items: jax.Array, beta: jax.Array | float) -> jax.Array:
    """``w_i = (N P(i))^-beta / max_j w_j`` over the batch (the paper's normalisation: weights only
    scale the loss down), ``(B,)``; ``n_items`` the items stored (``N``)."""
    weights = jnp.power(jnp.asarray(n_items, jnp.float32) * probabilities, -jnp.asarray(beta, jnp.float32))
    return weights / jnp.max(weights)


def update_priorities(
    priorities: Priorities, indices: jax.Array, td_errors: jax.Array, alpha: float, epsilon: float
) -> Priorities:
    """Sets items ``indices`` ``(B,)`` to ``(|td_errors| + epsilon)^alpha``, raises the largest
    priority seen, and counts one gradient step."""
    values = jnp.power(jnp.abs(jax.lax.stop_gradient(td_errors)).astype(jnp.float32) + epsilon, alpha)
    return Priorities(
        sum_tree_set(priorities.tree, indices, values),
        jnp.maximum(priorities.max_priority, jnp.max(values)),
        priorities.steps + 1,
    )


def annealed_beta(beta0: float, steps: jax.Array, horizon: int) -> jax.Array:
    """``beta`` after ``steps`` gradient steps: ``beta0`` rising linearly to 1 at ``horizon``
    steps (the run's gradient steps, ``kitae.schedule``), then 1.

    Args:
        beta0: the exponent at step 0, in ``[0, 1]``.
        steps: gradient steps so far, an integer scalar ``()`` (possibly traced).
        horizon: the step at which ``beta`` reaches 1 (a value below 1 counts as 1).

    Returns:
        ``beta``, a float32 scalar ``()``.
    """
    fraction = jnp.minimum(jnp.asarray(steps, jnp.float32) / max(horizon, 1), 1.0)
    return beta0 + (1.0 - beta0) * fraction
