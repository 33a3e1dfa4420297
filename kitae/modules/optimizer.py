"""Optimizers from an ``UpdateConfig``: Adam with optional gradient clipping and linear annealing.

The learning rate is a visible hyperparameter of the optimizer state
(``optax.inject_hyperparams``): ``learning_rate(opt_state)`` reads the rate the last update
used, and the annealing horizon is the number of gradient steps the run really makes
(``kitae.schedule.Schedule.n_gradient_steps``), so an annealed rate reaches 0 at the run's end in
every executor.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from kitae.config import AlgoConfig
from kitae.schedule import Schedule
from kitae.types import AlgoType


def n_gradient_steps(config: AlgoConfig, algo_type: AlgoType) -> int:
    """Gradient steps a run of ``config.train_cfg.n_env_steps`` makes (the annealing horizon):
    ``Schedule.from_config(config, algo_type).n_gradient_steps(n_env_steps)``."""
    return Schedule.from_config(config, algo_type).n_gradient_steps(config.train_cfg.n_env_steps)


OPTIMIZERS = ("adam", "rmsprop")
"""The optimizers ``optimizer_factory`` makes."""


def optimizer_factory(
    learning_rate: float | optax.Schedule,
    *,
    max_grad_norm: float | None = None,
    annealing_steps: int | None = None,
    optimizer: str = "adam",
    rms_decay: float = 0.99,
    rms_eps: float = 1e-5,
) -> optax.GradientTransformation:
    """Adam (or RMSprop), preceded by global-norm clipping when ``max_grad_norm`` is set.

    Args:
        learning_rate: the step size (> 0), or an optax schedule ``count -> rate`` (not with
            ``annealing_steps``).
        max_grad_norm: clip gradients to this global norm, or ``None``.
        annealing_steps: if set, the learning rate decays linearly to 0 over this many updates.
        optimizer: ``"adam"`` (optax's defaults) or ``"rmsprop"``: PyTorch's RMSprop, as
            Stable-Baselines3's A2C uses it (``v <- decay * v + (1 - decay) * g**2`` from 0,
            step ``lr * g / (sqrt(v) + eps)``: ``optax.rmsprop`` with ``eps_in_sqrt=False``).
        rms_decay, rms_eps: RMSprop's ``decay`` (PyTorch's ``alpha``) and ``eps``.

    Returns:
        An optax transformation whose state holds the current rate (``learning_rate(state)``).

    Raises:
        ValueError: for an unknown ``optimizer``.
    """
    lr = optax.linear_schedule(learning_rate, 0.0, annealing_steps) if annealing_steps else learning_rate
    if optimizer == "adam":
        tx = optax.inject_hyperparams(optax.adam)(learning_rate=lr)
    elif optimizer == "rmsprop":
        tx = optax.inject_hyperparams(optax.rmsprop, static_args=("eps_in_sqrt",))(
            learning_rate=lr, decay=rms_decay, eps=rms_eps, eps_in_sqrt=False
        )
    else:
        raise ValueError(f"optimizer={optimizer!r} is not allowed; allowed: one of {', '.join(OPTIMIZERS)}")
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), tx) if max_grad_norm else tx


def optimizer_from_config(
    config: AlgoConfig, algo_type: AlgoType, learning_rate: float | None = None
) -> optax.GradientTransformation:
    """``optimizer_factory`` with the ``UpdateConfig``'s learning rate, clipping and annealing.

    ``learning_rate`` overrides the config's (for algorithms with one rate per network).
    """
    u = config.update_cfg
    return optimizer_factory(
        u.learning_rate if learning_rate is None else learning_rate,
        max_grad_norm=u.max_grad_norm,
        annealing_steps=n_gradient_steps(config, algo_type) if u.learning_rate_annealing else None,
    )


def _injected(x: Any) -> bool:
    """An ``optax.inject_hyperparams`` state holding a learning rate."""
    return isinstance(x, tuple) and hasattr(x, "hyperparams") and "learning_rate" in x.hyperparams


def learning_rate(opt_state: Any) -> jax.Array:
    """The learning rate of the last update (the initial rate before any) of an optimizer state
    made by ``optimizer_factory``, a float32 scalar.

    Raises:
        ValueError: for an optimizer state without an injected learning rate.
    """
    for state in jax.tree_util.tree_leaves(opt_state, is_leaf=_injected):
        if _injected(state):
            return state.hyperparams["learning_rate"]
    raise ValueError("this optimizer state holds no learning rate; make the optimizer with optimizer_factory")


def set_learning_rate(opt_state: Any, value: float) -> Any:
    """``opt_state`` with every injected learning rate set to ``value`` (same dtype). A constant
    rate stays there for the next updates; an annealed one is recomputed by its schedule at each.

    Raises:
        ValueError: for an optimizer state without an injected learning rate.
    """
    learning_rate(opt_state)  # raises when there is none

    def set_rate(x: Any) -> Any:
        if not _injected(x):
            return x
        rate = x.hyperparams["learning_rate"]
        return x._replace(hyperparams={**x.hyperparams, "learning_rate": jnp.asarray(value, rate.dtype)})

    return jax.tree_util.tree_map(set_rate, opt_state, is_leaf=_injected)
