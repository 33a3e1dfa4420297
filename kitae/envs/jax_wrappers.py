"""Wrappers for environments written in JAX (``kitae.envs.jax_env.JaxEnv``).

``JaxTransformObservation`` is the JAX counterpart of Gymnasium's ``TransformObservation``: a pure
function applied to every observation an environment hands out (after ``reset``, after ``step``,
and to the real final observation ``next_observation``). It turns a ``Box`` environment into a
``Dict`` one, adds an ``"action_mask"``, rescales, ... and the result still runs in the compiled
loop (``make_jax_env``'s ``VecJaxEnv`` vmaps it like any ``JaxEnv``).

Example (CartPole with a dict observation and a mask that forbids pushing left)::

    import gymnasium as gym
    import jax.numpy as jnp
    import numpy as np
    from kitae.envs.jax_env import GymnaxEnv, VecJaxEnv
    from kitae.envs.jax_wrappers import JaxTransformObservation

    base = GymnaxEnv("CartPole-v1")
    space = gym.spaces.Dict({
        "observation": base.observation_space,
        "action_mask": gym.spaces.Box(0, 1, (2,), np.int8),
    })
    env = JaxTransformObservation(
        base, lambda obs: {"observation": obs, "action_mask": jnp.array([0, 1], jnp.int8)}, space)
    vec_env = VecJaxEnv(env, n_envs=4)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import jax

from kitae.envs.jax_env import JaxEnv, JaxTimeStep

__all__ = ["JaxTransformObservation"]


class JaxTransformObservation:
    """Applies ``fn`` to every observation of a ``JaxEnv``.

    Args:
        env: the ``JaxEnv`` to wrap.
        fn: a pure, jit-able function of ONE environment's observation (it is vmapped with the
            environment), returning the new observation (an array or a dict of arrays).
        observation_space: the Gymnasium space of ``fn``'s output for one environment.

    Raises:
        ValueError: when ``fn`` is not callable or ``observation_space`` is not a Gymnasium space.
    """

    def __init__(self, env: JaxEnv, fn: Callable[[Any], Any], observation_space: gym.Space) -> None:
        if not callable(fn):
            raise ValueError(f"JaxTransformObservation: fn={fn!r} is not allowed; allowed: a callable obs -> obs")
        if not isinstance(observation_space, gym.Space):
            raise ValueError(
                f"JaxTransformObservation: observation_space={observation_space!r} is not allowed; allowed: a "
                "gymnasium.spaces.Space describing fn's output"
            )
        self.env = env
        self.fn = fn
        self.observation_space = observation_space
        self.action_space = env.action_space
        self.default_params = env.default_params

    def reset(self, key: jax.Array, params: Any) -> tuple[Any, Any]:
        """``env.reset`` with ``fn`` applied to the observation: ``key`` a raw ``(2,)`` uint32 PRNG
        key, ``params`` the wrapped environment's; returns ``(fn(observation), state)`` of ONE
        environment (``fn``'s output shape, ``observation_space``)."""
        observation, state = self.env.reset(key, params)
        return self.fn(observation), state

    def step(self, key: jax.Array, state: Any, action: Any, params: Any) -> JaxTimeStep:
        """``env.step`` with ``fn`` applied to ``observation`` and ``next_observation``: ``key`` a
        raw ``(2,)`` uint32 PRNG key, ``state`` the wrapped environment's state pytree, ``action``
        one environment's (a scalar for a discrete space, else ``(*action_shape)``), ``params`` the
        wrapped environment's; the other fields of the ``JaxTimeStep`` (scalar ``reward``,
        ``terminated``, ``truncated``) are the wrapped step's."""
        ts = self.env.step(key, state, action, params)
        return ts._replace(observation=self.fn(ts.observation), next_observation=self.fn(ts.next_observation))

    def __repr__(self) -> str:
        return f"JaxTransformObservation({self.env!r})"
