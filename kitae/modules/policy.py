"""Policy heads (features -> distributions) and ``policy_factory`` (observations -> distributions).

Heads take features ``(..., F)`` and return a distribution from ``kitae.distributions`` whose batch
shape is ``(...)``, or, for ``DeterministicHead``, an action array ``(..., action_dim)``.

Continuous heads other than ``NormalHead`` produce actions in ``[-1, 1]``; map them to a ``Box``'s
bounds with ``scale_action`` (and back with ``unscale_action``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from kitae.distributions import Categorical, DiagNormal, MultiCategorical, TanhNormal, multi_categorical_valid
from kitae.modules.encoders import Activation, dense_init, encoder_factory


class CategoricalHead(nn.Module):
    """Features ``(..., F)`` -> ``Categorical`` over ``n_actions`` (batch shape ``(...)``).

    Attributes:
        n_actions: number of discrete actions.
        kernel_init_scale: orthogonal init scale of the logits layer (0.01, as in CleanRL PPO).
    """

    n_actions: int
    kernel_init_scale: float = 0.01

    @nn.compact
    def __call__(self, features: jax.Array, mask: jax.Array | None = None) -> Categorical:
        """features: ``(..., F)``; mask: optional bool ``(..., n_actions)``, True = allowed."""
        logits = nn.Dense(self.n_actions, kernel_init=dense_init(self.kernel_init_scale))(features)
        return Categorical(logits, mask)


class MultiCategoricalHead(nn.Module):
    """Features ``(..., F)`` -> ``MultiCategorical`` over components of ``nvec`` classes (a
    ``MultiDiscrete(nvec)`` action; ``MultiBinary(K)``: ``nvec = (2,) * K``), batch shape ``(...)``.

    Attributes:
        nvec: classes per component (each >= 1).
        kernel_init_scale: orthogonal init scale of the logits layer (0.01, as ``CategoricalHead``).
    """

    nvec: tuple[int, ...]
    kernel_init_scale: float = 0.01

    @nn.compact
    def __call__(self, features: jax.Array) -> MultiCategorical:
        """features: ``(..., F)``; logits ``(..., K, max(nvec))``, the classes a component lacks masked."""
        k, n = len(self.nvec), max(self.nvec)
        logits = nn.Dense(k * n, kernel_init=dense_init(self.kernel_init_scale))(features)
        return MultiCategorical(logits.reshape(*logits.shape[:-1], k, n), multi_categorical_valid(self.nvec))


def multi_discrete_nvec(action_space: gym.Space) -> tuple[int, ...] | None:
    """Classes per component of a one-dimensional ``MultiDiscrete`` or ``MultiBinary`` action
    space (``MultiBinary``: 2 each), else ``None``."""
    if isinstance(action_space, gym.spaces.MultiDiscrete) and len(action_space.shape) == 1:
        return tuple(int(n) for n in action_space.nvec)
    if isinstance(action_space, gym.spaces.MultiBinary) and len(action_space.shape) == 1:
        return (2,) * int(action_space.shape[0])
    return None


class NormalHead(nn.Module):
    """Features ``(..., F)`` -> ``DiagNormal`` over ``action_dim`` (batch shape ``(...)``).

    Attributes:
        action_dim: size of the action vector.
        state_dependent_std: if True the log-std is a second dense output of the features; if
            False it is a learned parameter vector ``log_std`` of shape ``(action_dim,)`` shared
            by all states.
        log_std_init: initial log-std (the bias of the log-std layer when state dependent).
        kernel_init_scale: orthogonal init scale of the mean layer (0.01, as in CleanRL PPO).
    """

    action_dim: int
    state_dependent_std: bool = False
    log_std_init: float = 0.0
    kernel_init_scale: float = 0.01

    @nn.compact
    def __call__(self, features: jax.Array) -> DiagNormal:
        """features: ``(..., F)`` -> ``DiagNormal`` with loc and scale ``(..., action_dim)``."""
        loc = nn.Dense(self.action_dim, kernel_init=dense_init(self.kernel_init_scale), name="loc")(features)
        if self.state_dependent_std:
            log_std = nn.Dense(
                self.action_dim,
                kernel_init=dense_init(self.kernel_init_scale),
                bias_init=nn.initializers.constant(self.log_std_init),
                name="log_std",
            )(features)
        else:
            log_std = self.param("log_std", nn.initializers.constant(self.log_std_init), (self.action_dim,))
            log_std = jnp.broadcast_to(log_std, loc.shape)
        return DiagNormal(loc, jnp.exp(log_std))


class TanhNormalHead(nn.Module):
    """Features ``(..., F)`` -> ``TanhNormal`` over ``action_dim`` (actions in ``(-1, 1)``).

    The std is state dependent; the raw log-std is squashed into ``[log_std_min, log_std_max]``
    with ``log_std_min + 0.5 * (log_std_max - log_std_min) * (tanh(raw) + 1)`` (as in CleanRL SAC).

    Attributes:
        action_dim: size of the action vector.
        log_std_min: smallest log-std.
        log_std_max: largest log-std.
    """

    action_dim: int
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    @nn.compact
    def __call__(self, features: jax.Array) -> TanhNormal:
        """features: ``(..., F)`` -> ``TanhNormal`` with loc and scale ``(..., action_dim)``."""
        loc = nn.Dense(self.action_dim, name="loc")(features)
        raw = jnp.tanh(nn.Dense(self.action_dim, name="log_std")(features))
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (raw + 1.0)
        return TanhNormal(loc, jnp.exp(log_std))


class DeterministicHead(nn.Module):
    """Features ``(..., F)`` -> action ``tanh(Dense(features))`` in ``[-1, 1]``, ``(..., action_dim)``.

    Attributes:
        action_dim: size of the action vector.
    """

    action_dim: int

    @nn.compact
    def __call__(self, features: jax.Array) -> jax.Array:
        """features: ``(..., F)`` -> ``(..., action_dim)`` in ``[-1, 1]``."""
        return jnp.tanh(nn.Dense(self.action_dim)(features))


class Policy(nn.Module):
    """``head(encoder(observations))``: an encoder and a policy head as one module.

    Attributes:
        encoder: maps observations ``(..., *obs_shape)`` (or a dict of them) to ``(..., F)``.
        head: one of the heads above.
    """

    encoder: nn.Module
    head: nn.Module

    def __call__(self, observations: Any, mask: jax.Array | None = None) -> Any:
        """observations -> the head's output (a distribution with batch shape ``(...)`` or, for a
        deterministic head, ``(..., action_dim)``). ``mask`` (``(..., n_actions)``, True = allowed)
        is only accepted by categorical policies."""
        features = self.encoder(observations)
        if mask is None:
            return self.head(features)
        if not isinstance(self.head, CategoricalHead):
            raise ValueError(
                f"An action mask is only supported by categorical policies, not {type(self.head).__name__}."
            )
        return self.head(features, mask)


_BOX_KINDS = ("normal", "tanh_normal", "deterministic")


def _accepted() -> str:
    return (
        "accepted action spaces: Discrete or a one-dimensional MultiDiscrete / MultiBinary (kind None or "
        "'categorical'), Box with shape (D,) "
        f"(kind None -> 'normal', or one of {_BOX_KINDS}; 'tanh_normal' and 'deterministic' need finite bounds)"
    )


def policy_factory(
    observation_space: gym.Space,
    action_space: gym.Space,
    *,
    hidden: Sequence[int] = (64, 64),
    kind: str | None = None,
    activation: Activation = "tanh",
) -> Policy:
    """Builds ``Policy(encoder_factory(observation_space, hidden=hidden, activation=activation), head)``.

    * ``Discrete(n)`` actions -> ``CategoricalHead(n)`` (``kind`` None or ``"categorical"``).
      Samples lie in ``[0, n)``: add ``action_space.start`` if it is not 0.
    * one-dimensional ``MultiDiscrete(nvec)`` / ``MultiBinary(K)`` actions ->
      ``MultiCategoricalHead(nvec)`` (``kind`` None or ``"categorical"``); samples ``(..., K)``,
      component ``k`` in ``[0, nvec[k])`` (add ``action_space.start`` if it is not 0).
    * ``Box`` actions of shape ``(D,)`` -> ``kind``:
      ``None`` / ``"normal"`` -> ``NormalHead(D)`` (unbounded samples);
      ``"tanh_normal"`` -> ``TanhNormalHead(D)`` (samples in ``(-1, 1)``);
      ``"deterministic"`` -> ``DeterministicHead(D)`` (actions in ``[-1, 1]``).
      Use ``scale_action`` to map ``[-1, 1]`` actions to the space's bounds.

    Raises:
        ValueError: for other action spaces, a ``kind`` that does not fit the space, or bounded
            kinds on a ``Box`` with infinite bounds; the message names the space and what is accepted.
    """
    encoder = encoder_factory(observation_space, hidden=hidden, activation=activation)
    if isinstance(action_space, gym.spaces.Discrete):
        if kind not in (None, "categorical"):
            raise ValueError(f"kind={kind!r} does not fit action space {action_space}; {_accepted()}.")
        return Policy(encoder, CategoricalHead(int(action_space.n)))
    nvec = multi_discrete_nvec(action_space)
    if nvec is not None:
        if kind not in (None, "categorical"):
            raise ValueError(f"kind={kind!r} does not fit action space {action_space}; {_accepted()}.")
        return Policy(encoder, MultiCategoricalHead(nvec))
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        kind = "normal" if kind is None else kind
        action_dim = int(action_space.shape[0])
        if kind == "normal":
            return Policy(encoder, NormalHead(action_dim))
        if kind in ("tanh_normal", "deterministic"):
            if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
                raise ValueError(
                    f"kind={kind!r} outputs actions in [-1, 1] and needs finite bounds, but action space "
                    f"{action_space} is unbounded; {_accepted()}."
                )
            head = TanhNormalHead(action_dim) if kind == "tanh_normal" else DeterministicHead(action_dim)
            return Policy(encoder, head)
        raise ValueError(f"kind={kind!r} does not fit action space {action_space}; {_accepted()}.")
    raise ValueError(f"Unsupported action space {action_space}; {_accepted()}.")


def scale_action(action: jax.Array, low: jax.Array | np.ndarray, high: jax.Array | np.ndarray) -> jax.Array:
    """Maps ``action`` in ``[-1, 1]`` to ``[low, high]``: ``low + (action + 1) * (high - low) / 2``.

    Shapes: ``action (..., D)``, ``low`` and ``high`` broadcastable (typically ``(D,)``; NumPy bounds
    are fine)."""
    return (action + 1.0) * 0.5 * (high - low) + low  # the action first: its type is the result's


def unscale_action(action: jax.Array, low: jax.Array | np.ndarray, high: jax.Array | np.ndarray) -> jax.Array:
    """Inverse of ``scale_action``: maps ``action`` in ``[low, high]`` to ``[-1, 1]``,
    ``2 * (action - low) / (high - low) - 1``. Shapes as in ``scale_action``: ``action (..., D)``,
    ``low`` and ``high`` broadcastable (typically ``(D,)``); the result has ``action``'s shape."""
    return 2.0 * (action - low) / (high - low) - 1.0


__all__ = [
    "CategoricalHead",
    "MultiCategoricalHead",
    "multi_discrete_nvec",
    "NormalHead",
    "TanhNormalHead",
    "DeterministicHead",
    "Policy",
    "policy_factory",
    "scale_action",
    "unscale_action",
]
