"""Optimizers from an ``UpdateConfig``: Adam with optional gradient clipping and linear annealing."""

from __future__ import annotations

import optax

from kitae.config import AlgoConfig
from kitae.types import AlgoType


def n_gradient_steps(config: AlgoConfig, algo_type: AlgoType) -> int:
    """Gradient steps a run of ``config.train_cfg.n_env_steps`` makes (the annealing horizon).

    On-policy: updates = ``n_env_steps // (max_buffer_size * n_envs)``, each of ``n_epochs`` epochs
    of ``max_buffer_size * n_envs * n_agents // batch_size`` minibatches. Off-policy: one update
    of ``n_epochs`` steps every ``max(skip_steps, n_envs)`` transitions after ``start_step``.
    """
    u, e = config.update_cfg, config.env_cfg
    steps = config.train_cfg.n_env_steps
    if algo_type is AlgoType.ON_POLICY:
        rollout = u.max_buffer_size * e.n_envs
        minibatches = rollout * e.n_agents // u.batch_size
        return max(1, steps // rollout * u.n_epochs * minibatches)
    params = config.algo_params
    start = max(0, getattr(params, "start_step", 0))
    period = max(getattr(params, "skip_steps", 1), e.n_envs)
    return max(1, (steps - start) // period * u.n_epochs)


def optimizer_factory(
    learning_rate: float,
    *,
    max_grad_norm: float | None = None,
    annealing_steps: int | None = None,
) -> optax.GradientTransformation:
    """Adam, preceded by global-norm clipping when ``max_grad_norm`` is set.

    Args:
        learning_rate: the step size (> 0).
        max_grad_norm: clip gradients to this global norm, or ``None``.
        annealing_steps: if set, the learning rate decays linearly to 0 over this many updates.
    """
    lr = optax.linear_schedule(learning_rate, 0.0, annealing_steps) if annealing_steps else learning_rate
    adam = optax.adam(lr)
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), adam) if max_grad_norm else adam


def optimizer_from_config(config: AlgoConfig, algo_type: AlgoType,
                          learning_rate: float | None = None) -> optax.GradientTransformation:
    """``optimizer_factory`` with the ``UpdateConfig``'s learning rate, clipping and annealing.

    ``learning_rate`` overrides the config's (for algorithms with one rate per network).
    """
    u = config.update_cfg
    return optimizer_factory(
        u.learning_rate if learning_rate is None else learning_rate,
        max_grad_norm=u.max_grad_norm,
        annealing_steps=n_gradient_steps(config, algo_type) if u.learning_rate_annealing else None,
    )
