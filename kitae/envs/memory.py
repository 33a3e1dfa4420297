"""Environments that need memory: CartPole with the velocities hidden.

``CartPoleNoVel-v1`` (rl-zoo's name) is Gymnasium's CartPole-v1 whose observation keeps only the
cart position and the pole angle, ``(x, theta)``: the velocities ``(x_dot, theta_dot)`` are gone,
so a policy that sees one observation cannot tell which way the pole is falling; a recurrent policy
recovers them from consecutive observations. Episodes are cut at 500 steps, as CartPole-v1's.

- Gymnasium: ``gym.make("CartPoleNoVel-v1")`` once ``kitae.envs.memory`` is imported
  (``kitae.envs.make`` imports it, so ``make_vec_env("CartPoleNoVel-v1", n)`` and
  ``kitae train ppo_lstm CartPoleNoVel-v1`` find it).
- gymnax: ``make_jax_env("gymnax:CartPoleNoVel-v1", n)``, gymnax's CartPole-v1 with the same
  observation (``gymnax_cartpole_no_velocity``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["NAME", "POSITION_INDICES", "CartPoleNoVelocity", "register", "gymnax_cartpole_no_velocity"]

NAME = "CartPoleNoVel-v1"
POSITION_INDICES = (0, 2)
"""The entries of CartPole's observation ``(x, x_dot, theta, theta_dot)`` that are kept."""


def _space(full: gym.spaces.Box) -> gym.spaces.Box:
    index = list(POSITION_INDICES)
    return gym.spaces.Box(full.low[index].astype(np.float32), full.high[index].astype(np.float32), dtype=np.float32)


class CartPoleNoVelocity(gym.ObservationWrapper):
    """CartPole's observation without the velocities: ``(x, theta)``, float32 ``(2,)``."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        assert isinstance(env.observation_space, gym.spaces.Box)  # CartPole's Box(4,)
        self.observation_space = _space(env.observation_space)

    def observation(self, observation: Any) -> np.ndarray:
        """CartPole's ``(4,)`` observation ``(x, x_dot, theta, theta_dot)`` as ``(x, theta)``,
        ``(2,)`` float32."""
        return np.asarray(observation, np.float32)[list(POSITION_INDICES)]


def _make(**kwargs: Any) -> gym.Env:
    # CartPole-v1's own TimeLimit (500 steps) stays inside; the id itself declares none
    return CartPoleNoVelocity(gym.make("CartPole-v1", **kwargs))


def register() -> None:
    """Registers ``CartPoleNoVel-v1`` with Gymnasium (once)."""
    if NAME not in gym.registry:
        gym.register(NAME, entry_point=_make)


def gymnax_cartpole_no_velocity(**env_kwargs: Any) -> Any:
    """gymnax's CartPole-v1 with the observation ``(x, theta)``: a ``kitae.envs.jax_env.JaxEnv``."""
    import jax.numpy as jnp

    from kitae.envs.jax_env import GymnaxEnv
    from kitae.envs.jax_wrappers import JaxTransformObservation

    base = GymnaxEnv("CartPole-v1", **env_kwargs)
    assert isinstance(base.observation_space, gym.spaces.Box)
    index = jnp.asarray(POSITION_INDICES)
    return JaxTransformObservation(base, lambda observation: observation[index], _space(base.observation_space))


register()
