"""The update step split in two, so gradients can be computed in one place and applied in another.

Every built-in algorithm writes ``compute_gradients(state, key, batch) -> (grads, info)`` and
``apply_gradients(state, grads) -> state`` as separate pure functions; its update step is their
composition. Distributed training computes gradients on workers and applies them on an updater.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

ComputeGradientsFn = Callable[[Any, jax.Array, tuple], tuple[Any, dict[str, jax.Array]]]
ApplyGradientsFn = Callable[[Any, Any], Any]


def update_step_from_gradients(
    compute_gradients_fn: ComputeGradientsFn, apply_gradients_fn: ApplyGradientsFn
) -> Callable:
    """Composes the two halves into ``update_step_fn(state, key, batch) -> (state, info)``."""

    def update_step_fn(state: Any, key: jax.Array, batch: tuple) -> tuple[Any, dict[str, jax.Array]]:
        grads, info = compute_gradients_fn(state, key, batch)
        return apply_gradients_fn(state, grads), info

    return update_step_fn
