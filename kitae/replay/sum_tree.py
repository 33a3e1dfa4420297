"""A sum tree in preallocated JAX arrays: the index of proportional prioritized replay.

Written by hand rather than taken from flashbax (``flashbax.buffers.sum_tree``, the maintained JAX
replay library): both were timed on this CPU at capacity 100k and batch 256, alternating
(``benchmarks/probe_sum_tree.py``; BENCHMARKS.md has the figures): as fast as each other, but
flashbax propagates each update by adding the leaf's change to its ancestors, so its sums drift
from its leaves with every update, where this one recomputes each ancestor from its two children
and stays exact; and it keeps kitae free of one more dependency.

Layout: ``nodes`` has ``2 P`` entries for ``P`` the power of two at or above the capacity ``N``;
the root is ``nodes[1]``, node ``i``'s children are ``2 i`` and ``2 i + 1``, and leaf ``j`` (the
priority of item ``j``) is ``nodes[P + j]``. Leaves ``N .. P - 1`` stay 0: never sampled.
Every function is pure and jit-able; the tree's shape is static.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from kitae.validation import check_positive_int

__all__ = ["SumTree", "sum_tree_init", "sum_tree_set", "sum_tree_total", "sum_tree_sample", "sum_tree_leaves"]


class SumTree(NamedTuple):
    """A sum tree over ``N`` non-negative priorities (a pytree).

    Attributes:
        nodes: ``(2 P,)`` float32: ``nodes[1]`` the total, ``nodes[P + j]`` item ``j``'s priority.
    """

    nodes: jax.Array

    @property
    def leaves_offset(self) -> int:
        """``P``: the index of leaf 0 in ``nodes`` (static)."""
        return self.nodes.shape[0] // 2

    @property
    def depth(self) -> int:
        """Levels below the root, ``log2 P`` (static)."""
        return self.leaves_offset.bit_length() - 1


def sum_tree_init(capacity: int) -> SumTree:
    """A tree over ``capacity`` items, every priority 0."""
    check_positive_int("capacity", capacity)
    p = 1 << max(capacity - 1, 0).bit_length()
    return SumTree(jnp.zeros((2 * p,), jnp.float32))


def sum_tree_leaves(tree: SumTree, capacity: int) -> jax.Array:
    """The ``capacity`` items' priorities, ``(capacity,)``."""
    p = tree.leaves_offset
    return tree.nodes[p : p + capacity]


def sum_tree_total(tree: SumTree) -> jax.Array:
    """The sum of every priority, a float32 scalar."""
    return tree.nodes[1]


def sum_tree_set(tree: SumTree, indices: jax.Array, priorities: jax.Array) -> SumTree:
    """Sets items ``indices`` ``(B,)`` to ``priorities`` ``(B,)`` (>= 0) and the sums above them.

    Only the ``depth`` ancestors of each updated leaf are recomputed (``B log P`` nodes), each
    from its two children. An index given twice must come with the same priority (as a batch's
    TD errors do for an item sampled twice).
    """
    p = tree.leaves_offset
    nodes = tree.nodes.at[p + indices].set(jnp.asarray(priorities, jnp.float32))

    def level(_: int, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        nodes, node = carry
        node = node // 2
        return nodes.at[node].set(nodes[2 * node] + nodes[2 * node + 1]), node

    # a loop, not unrolled: XLA then writes each level in place (the unrolled levels copied the
    # array, twice as slow at capacity 100k: benchmarks/probe_sum_tree.py)
    nodes, _ = jax.lax.fori_loop(0, tree.depth, level, (nodes, p + indices))
    return SumTree(nodes)


def sum_tree_sample(tree: SumTree, key: jax.Array, batch_size: int) -> jax.Array:
    """``batch_size`` items drawn in proportion to their priorities, stratified (Schaul et al.
    2016): the total is cut into ``batch_size`` equal segments and one value is drawn uniformly in
    each, then found by descending the tree. Returns indices ``(batch_size,)`` int32; an item of
    priority 0 is never drawn (the tree must hold a positive total)."""
    total = sum_tree_total(tree)
    values = (jnp.arange(batch_size) + jax.random.uniform(key, (batch_size,))) * (total / batch_size)
    values = jnp.minimum(values, total * (1.0 - 1e-7))  # the top segment's end is not a value

    def level(_: int, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        values, node = carry
        left = 2 * node
        left_sum = tree.nodes[left]
        # rounding can put a value just past the left sum with nothing on the right: it stays left
        right = jnp.logical_and(values >= left_sum, tree.nodes[left + 1] > 0)
        return jnp.where(right, values - left_sum, values), left + right

    _, node = jax.lax.fori_loop(0, tree.depth, level, (values, jnp.ones((batch_size,), jnp.int32)))
    return node - tree.leaves_offset
