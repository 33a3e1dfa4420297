"""Action-value (Q) modules and ``qvalue_factory``.

* Discrete actions: ``DiscreteQValue`` maps observations ``(..., *obs_shape)`` to Q-values
  ``(..., n_actions)`` (DQN style).
* Continuous actions: ``ContinuousQValue`` maps ``(observations, actions (..., D))`` to Q ``(...)``
  (SAC / TD3 / DDPG style), concatenating the preprocessed observation and the action; actions
  ``(N, B, D)`` score N actions per observation ``(B, ...)`` with one encoding of each (MPO).
* ``n_critics > 1``: an ensemble of independent critics stacked on a new leading axis,
  built with ``nn.vmap`` (``variable_axes={"params": 0}``, ``split_rngs={"params": True}``);
  outputs ``(n_critics, ...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp

from kitae.modules.encoders import MLP, Activation, dense_init, encoder_factory


class DiscreteQValue(nn.Module):
    """Observations -> Q-values of every discrete action: ``Dense(n_actions)(encoder(obs))``.

    Attributes:
        encoder: maps observations ``(..., *obs_shape)`` (or a dict of them) to ``(..., F)``.
        n_actions: number of discrete actions.
    """

    encoder: nn.Module
    n_actions: int

    @nn.compact
    def __call__(self, observations: Any) -> jax.Array:
        """observations -> ``(..., n_actions)``."""
        features = self.encoder(observations)
        return nn.Dense(self.n_actions, kernel_init=dense_init(1.0))(features)


class ContinuousQValue(nn.Module):
    """``(observations, actions) -> Q``: ``Dense(1)(MLP(concat(encoder(obs), action)))``.

    Attributes:
        encoder: preprocesses observations into ``(..., F)`` (identity for vectors, one-hot for
            discrete observations, NatureCNN for images).
        hidden: hidden sizes of the MLP applied after concatenation.
        activation: activation of that MLP.
    """

    encoder: nn.Module
    hidden: Sequence[int] = (256, 256)
    activation: Activation = "relu"

    @nn.compact
    def __call__(self, observations: Any, actions: jax.Array) -> jax.Array:
        """observations ``(..., *obs_shape)``, actions ``(..., D)`` -> ``(...)``. Actions with more
        leading axes than the observations, ``(N, B, D)`` for observations ``(B, *obs_shape)`` (N
        actions per observation, MPO's samples), give ``(N, B)``: each observation is encoded once
        and its features broadcast over the N actions (an image's CNN runs B times, not N * B)."""
        features = self.encoder(observations)
        actions = jnp.asarray(actions, features.dtype)
        if actions.ndim > features.ndim:
            features = jnp.broadcast_to(features, (*actions.shape[:-1], features.shape[-1]))
        x = jnp.concatenate([features, actions], axis=-1)
        x = MLP(self.hidden, self.activation)(x)
        return nn.Dense(1, kernel_init=dense_init(1.0))(x)[..., 0]


def _ensemble(module_cls: type[nn.Module], n_critics: int) -> type[nn.Module]:
    """``nn.vmap`` of ``module_cls`` over ``n_critics`` independent parameter sets; inputs are
    broadcast and outputs stacked on a new leading axis."""
    return nn.vmap(
        module_cls,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=None,
        out_axes=0,
        axis_size=n_critics,
    )


def _accepted() -> str:
    return (
        "accepted action spaces: Discrete -> obs -> Q (..., n_actions); Box with shape (D,) -> (obs, action) -> Q (...)"
    )


def qvalue_factory(
    observation_space: gym.Space,
    action_space: gym.Space,
    *,
    hidden: Sequence[int] = (256, 256),
    n_critics: int = 1,
    activation: Activation = "relu",
) -> nn.Module:
    """Builds a Q-value module.

    Default hidden sizes are ``(256, 256)`` with ReLU (the usual SAC / TD3 critic).

    * ``Discrete(n)`` actions -> ``DiscreteQValue(encoder_factory(observation_space, hidden=hidden,
      activation=activation), n)``: observations ``(..., *obs_shape)`` -> ``(..., n)``.
    * ``Box`` actions of shape ``(D,)`` -> ``ContinuousQValue(encoder_factory(observation_space,
      hidden=()), hidden, activation)``: ``(observations, actions (..., D))`` -> ``(...)``. Vector
      observations enter the MLP raw, concatenated with the action (image observations go through
      ``NatureCNN`` first).
    * ``n_critics > 1``: an ensemble of ``n_critics`` independent critics (``nn.vmap`` with
      ``variable_axes={"params": 0}``, ``split_rngs={"params": True}``); every parameter gets a
      leading ``n_critics`` axis and outputs are ``(n_critics, ...)`` (``(n_critics, ..., n)`` for
      discrete actions). With ``n_critics == 1`` there is no extra axis.

    Raises:
        ValueError: for other action spaces (naming the space and what is accepted), for
            ``n_critics < 1``, or for observation spaces ``encoder_factory`` rejects.
    """
    if n_critics < 1:
        raise ValueError(f"n_critics must be >= 1, got {n_critics}.")
    cls: type[nn.Module]
    kwargs: dict[str, Any]
    if isinstance(action_space, gym.spaces.Discrete):
        encoder = encoder_factory(observation_space, hidden=hidden, activation=activation)
        cls, kwargs = DiscreteQValue, dict(encoder=encoder, n_actions=int(action_space.n))
    elif isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
        encoder = encoder_factory(observation_space, hidden=(), activation=activation)
        cls, kwargs = ContinuousQValue, dict(encoder=encoder, hidden=tuple(hidden), activation=activation)
    else:
        raise ValueError(f"Unsupported action space {action_space}; {_accepted()}.")
    if n_critics > 1:
        cls = _ensemble(cls, n_critics)
    return cls(**kwargs)


__all__ = ["DiscreteQValue", "ContinuousQValue", "qvalue_factory"]
