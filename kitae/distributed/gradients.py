"""What the updater needs to make an update one gradient step at a time: the steps, in the fused
update's order, and the mean of several workers' gradients."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from kitae.config import AlgoConfig

__all__ = ["gradient_plan", "average_gradients"]


def gradient_plan(config: AlgoConfig, on_policy: bool) -> list[tuple[int, int]]:
    """The gradient steps of one update, in the fused update's order: on-policy ``(epoch,
    minibatch)`` for ``n_epochs`` epochs of ``rollout transitions // batch_size`` minibatches;
    off-policy ``(step, 0)`` for ``n_epochs`` steps."""
    u = config.update_cfg
    if on_policy:
        e = config.env_cfg
        n_batches = (u.max_buffer_size * e.n_envs * e.n_agents) // u.batch_size
        return [(epoch, j) for epoch in range(u.n_epochs) for j in range(n_batches)]
    return [(i, 0) for i in range(u.n_epochs)]


def average_gradients(trees: list[Any], weights: list[float]) -> Any:
    """The weighted mean of gradient trees (host arrays), computed in float64 and cast back to each
    leaf's dtype (integer leaves of update deltas are rounded); one tree is returned as it is."""
    if len(trees) == 1:
        return trees[0]
    total = float(sum(weights))

    def mean(*xs: Any) -> Any:
        dtype = np.asarray(xs[0]).dtype
        value = sum(np.asarray(x, np.float64) * (w / total) for x, w in zip(xs, weights))
        return np.rint(value).astype(dtype) if dtype.kind in "iub" else np.asarray(value, dtype)

    return jax.tree_util.tree_map(mean, *trees)
