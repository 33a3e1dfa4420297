"""State-value modules: ``ValueHead`` (features -> values) and ``value_factory`` (obs -> values)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import gymnasium as gym
import jax

from kitae.modules.encoders import Activation, dense_init, encoder_factory


class ValueHead(nn.Module):
    """Features ``(..., F)`` -> values ``(...)`` (``Dense(1)`` with the last axis squeezed).

    Attributes:
        kernel_init_scale: orthogonal init scale of the dense layer (1.0, as in CleanRL PPO).
    """

    kernel_init_scale: float = 1.0

    @nn.compact
    def __call__(self, features: jax.Array) -> jax.Array:
        """features: ``(..., F)`` -> ``(...)``."""
        return nn.Dense(1, kernel_init=dense_init(self.kernel_init_scale))(features)[..., 0]


class Value(nn.Module):
    """``head(encoder(observations))``: observations -> state values ``(...)``.

    Attributes:
        encoder: maps observations ``(..., *obs_shape)`` (or a dict of them) to ``(..., F)``.
        head: a ``ValueHead``.
    """

    encoder: nn.Module
    head: nn.Module

    def __call__(self, observations: Any) -> jax.Array:
        """observations ``(..., *obs_shape)`` -> values ``(...)``."""
        return self.head(self.encoder(observations))


def value_factory(
    observation_space: gym.Space,
    *,
    hidden: Sequence[int] = (64, 64),
    activation: Activation = "tanh",
) -> Value:
    """Builds ``Value(encoder_factory(observation_space, hidden=hidden, activation=activation),
    ValueHead())``, mapping observations ``(..., *obs_shape)`` to values ``(...)``.

    Raises:
        ValueError: for observation spaces ``encoder_factory`` does not accept.
    """
    return Value(encoder_factory(observation_space, hidden=hidden, activation=activation), ValueHead())


__all__ = ["ValueHead", "Value", "value_factory"]
