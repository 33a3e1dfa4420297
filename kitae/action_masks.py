"""Action masks: one convention for every algorithm in kitae.

**The convention.** An environment that tells which actions are legal gives a ``Dict``
observation with an ``"action_mask"`` key (the PettingZoo classic convention):
``{"observation": ..., "action_mask": (n_actions,) 0/1}``, ``1`` (or ``True``) marking an allowed
action. Environments that put the mask in ``info["action_mask"]`` (Gymnasium's convention, e.g.
``Taxi-v4``) are wrapped with ``kitae.envs.wrappers.ActionMaskObservation``, which moves it into
the observation. The mask travels with the observation everywhere (buffers, the compiled loop,
next observations), so TD targets can use the mask of the NEXT observation.

* The ``"action_mask"`` key is never fed to an encoder (``encoder_factory`` skips it).
* PPO's categorical policy masks its logits: samples, log-probabilities, entropy and the greedy
  action are over the allowed actions only.
* DQN masks its argmax: the greedy action, the epsilon-greedy random action and the TD target's
  max (or Double DQN's argmax) over next actions are over the allowed actions only.
* SAC (continuous and discrete), TD3, DDPG and MPO refuse a mask with a clear error.

A row with no allowed action at all (PettingZoo's classic games give an all-zero mask in a
finished game's last observation) is treated as "every action allowed", so nothing becomes
``-inf`` or NaN; such rows only occur where the episode has ended, where the value is not used.

Every function here is pure ``jax.numpy``: it runs under ``jax.jit``, ``jax.vmap`` and inside
the compiled loop. The structure decision (is there a mask?) is static: it depends on whether the
observation is a dict holding the key, never on values.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp

ACTION_MASK_KEY = "action_mask"
"""The key of a ``Dict`` observation that holds the action mask, shape ``(n_actions,)``."""

__all__ = [
    "ACTION_MASK_KEY",
    "action_mask_space",
    "check_action_mask_space",
    "refuse_action_mask",
    "get_action_mask",
    "allowed_actions",
    "masked_argmax",
    "masked_max",
]


def action_mask_space(observation_space: gym.Space) -> gym.Space | None:
    """The space of the ``"action_mask"`` entry of a ``Dict`` observation space, or ``None``
    when the observations carry no mask."""
    if isinstance(observation_space, gym.spaces.Dict) and ACTION_MASK_KEY in observation_space.spaces:
        return observation_space.spaces[ACTION_MASK_KEY]
    return None


def check_action_mask_space(observation_space: gym.Space, action_space: gym.Space, algo: str) -> None:
    """Checks the mask of ``observation_space`` (if any) against ``action_space``.

    A mask must be a ``Box`` or ``MultiBinary`` of shape ``(n,)`` with ``n`` the number of actions
    of a ``Discrete(n)`` action space.

    Raises:
        ValueError: naming ``algo``, the mask's space and what is allowed.
    """
    space = action_mask_space(observation_space)
    if space is None:
        return
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(
            f"{algo}: observation_space[{ACTION_MASK_KEY!r}]={space} is not allowed with the action space "
            f"{action_space}; action masks apply to Discrete action spaces only"
        )
    n = int(action_space.n)
    if not isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)) or tuple(space.shape) != (n,):
        raise ValueError(
            f"{algo}: observation_space[{ACTION_MASK_KEY!r}]={space} is not allowed; allowed: a Box or "
            f"MultiBinary of shape ({n},), one 0/1 entry per action of {action_space}"
        )


def refuse_action_mask(observation_space: gym.Space, algo: str) -> None:
    """For algorithms that read no mask (SAC, discrete SAC included, TD3, DDPG, MPO): raises
    ``ValueError`` when the observations carry an ``"action_mask"``, naming ``algo`` and what
    supports masks."""
    space = action_mask_space(observation_space)
    if space is not None:
        raise ValueError(
            f"{algo} does not support action masks: observation_space has an {ACTION_MASK_KEY!r} entry "
            f"({space}); masks apply to discrete actions (PPO's categorical policy, DQN). Remove the "
            f"{ACTION_MASK_KEY!r} key from the observations to train {algo}."
        )


def get_action_mask(observations: Any) -> jax.Array | None:
    """The boolean mask of a batch of observations, ``(..., n_actions)``, or ``None``.

    ``observations`` is a dict holding ``"action_mask"`` (any 0/1 or bool dtype) or anything else
    (no mask). Works on traced values: only the structure is inspected.
    """
    if isinstance(observations, dict) and ACTION_MASK_KEY in observations:
        return jnp.asarray(observations[ACTION_MASK_KEY]).astype(bool)
    return None


def allowed_actions(mask: jax.Array) -> jax.Array:
    """``mask`` ``(..., n)`` as booleans, with rows that allow nothing turned into "all allowed"."""
    mask = jnp.asarray(mask).astype(bool)
    return jnp.logical_or(mask, jnp.logical_not(jnp.any(mask, axis=-1, keepdims=True)))


def _lowest(dtype: Any) -> float:
    return float(jnp.finfo(dtype).min)


def masked_argmax(values: jax.Array, mask: jax.Array | None) -> jax.Array:
    """``argmax`` over the last axis among allowed entries: values ``(..., n)``, mask
    broadcastable to it (``None``: no mask) -> ``int32`` ``(...)``. Ties go to the lowest index."""
    if mask is not None:
        values = jnp.where(allowed_actions(mask), values, _lowest(values.dtype))
    return jnp.argmax(values, axis=-1).astype(jnp.int32)


def masked_max(values: jax.Array, mask: jax.Array | None) -> jax.Array:
    """``max`` over the last axis among allowed entries: values ``(..., n)`` -> ``(...)``
    (``mask=None``: the plain max). Always finite for finite values."""
    if mask is not None:
        values = jnp.where(allowed_actions(mask), values, _lowest(values.dtype))
    return jnp.max(values, axis=-1)
