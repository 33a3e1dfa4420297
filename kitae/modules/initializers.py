"""Kernel initialisers whose programs cannot deadlock XLA:CPU.

``orthogonal(scale)`` is ``jax.nn.initializers.orthogonal(scale)``, value for value, with one
difference: under ``vmap`` (twin critics, or anything else that vmaps an initialisation) its QR
decompositions run one matrix after another instead of as one batched LAPACK call.

Why, and why by hand: jaxlib (0.10.2) runs a batched LAPACK call (``geqrf`` for a batch of
matrices) by splitting the batch into tasks on XLA:CPU's intra-op thread pool and waiting for
them from the pool thread that runs the call. When as many batched calls run at once as the pool
has threads (two independent vmapped layers on a 2-core machine: XLA runs independent operations
concurrently), every pool thread waits for tasks that no thread is left to run, and the program
never finishes. Seen here as a run's starting state hanging in ``block_until_ready`` with both
``tf_XLAEigen`` threads in ``jax::ParallelBatchMap`` under ``QrFactorization`` (a test of the
suite stopped by its timeout; very likely SAC on Brax once, BENCHMARKS.md). A program of four
vmapped 64 x 64 orthogonal initialisations hung in every try, ``--xla_cpu_multi_thread_eigen=false``
included; one QR per matrix (unbatched, or batched by ``lax.map``) ran 1,000 calls. No library
offers an initialiser that avoids it, so ``jax.custom_batching.custom_vmap`` gives this one its own
batching rule: a ``lax.map`` over the batch, each step jax's initialiser on one key. Each matrix
is the same LAPACK computation as in the batched call, so the values are the same bits
(``tests/test_modules.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["orthogonal"]

Initializer = Callable[..., jax.Array]
"""``init(key, shape, dtype=jnp.float32) -> (*shape)`` array, as flax's ``kernel_init`` takes."""


def orthogonal(scale: float = 1.0) -> Initializer:
    """``jax.nn.initializers.orthogonal(scale)`` (a ``(..., n)`` kernel with orthonormal rows or
    columns, times ``scale``) whose QR decompositions run one matrix at a time under ``vmap``.

    Returns ``init(key, shape, dtype=jnp.float32)``: ``key`` a PRNG key (a raw ``(2,)`` uint32 key
    or a typed one), ``shape`` at least 2-D; the result has ``shape`` and ``dtype``."""
    base = jax.nn.initializers.orthogonal(scale)

    def init(key: jax.Array, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
        shape = tuple(shape)

        @jax.custom_batching.custom_vmap
        def one(k: jax.Array) -> jax.Array:
            return base(k, shape, dtype)

        @one.def_vmap
        def _one_at_a_time(axis_size: int, in_batched: list[bool], k: jax.Array) -> tuple[jax.Array, bool]:
            del axis_size
            if not in_batched[0]:  # the key is shared across the batch: one matrix for all
                return one(k), False
            return jax.lax.map(one, k), True  # nested vmaps come back here: one matrix per step

        return one(key)

    return init
