"""Gymnasium wrappers for kitae's observation conventions (see ``docs/observations.md``).

* ``ActionMaskObservation``: moves ``info["action_mask"]`` (Gymnasium's convention, e.g.
  ``Taxi-v4``) into a ``Dict`` observation ``{"observation": obs, "action_mask": mask}`` (the
  PettingZoo classic convention that every kitae algorithm reads, ``kitae.action_masks``).
* ``frame_stack(env, n_frames)``: Gymnasium's ``FrameStackObservation`` with the frames laid out
  CHANNELS-LAST, as kitae's CNN encoders expect: ``(H, W, C)`` frames become ``(H, W, n * C)``.
* ``tuple_as_dict(env)``: a ``Tuple`` observation space (``Blackjack-v1``'s) read as a ``Dict``
  keyed ``"0"``, ``"1"``, ... (zero-padded, so that sorted keys keep the tuple's order), which
  every kitae algorithm encodes (one encoder per entry, concatenated).

All are applied per sub-environment; ``kitae.envs.make.make_vec_env`` takes the first two as
``wrappers=[ActionMaskObservation]`` and ``frame_stack=4``, and applies ``tuple_as_dict`` itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from kitae.action_masks import ACTION_MASK_KEY
from kitae.validation import check_positive_int

__all__ = ["ActionMaskObservation", "frame_stack", "tuple_as_dict"]


class ActionMaskObservation(gym.Wrapper):
    """Moves an environment's ``info["action_mask"]`` into its observation.

    The observation space becomes ``Dict({observation_key: env.observation_space,
    "action_mask": Box(0, 1, (n,), int8)})`` with ``n = env.action_space.n``; each ``reset`` and
    ``step`` returns ``{observation_key: obs, "action_mask": info["action_mask"] as int8}`` (the
    info is passed on unchanged). The mask of a step's observation is the mask of the state the
    environment is in after the step, i.e. the actions allowed NEXT.

    Args:
        env: an environment with a ``Discrete`` action space whose ``reset`` and ``step`` infos
            hold ``"action_mask"`` (shape ``(n,)``, 1 = allowed), such as ``Taxi-v4``.
        observation_key: the key of the original observation in the dict.

    Raises:
        ValueError: for a non-``Discrete`` action space, or an ``observation_key`` equal to
            ``"action_mask"``; on ``reset`` / ``step``, when the info has no ``"action_mask"`` or
            its shape is not ``(n,)``.
    """

    def __init__(self, env: gym.Env, observation_key: str = "observation") -> None:
        super().__init__(env)
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise ValueError(
                f"ActionMaskObservation: env.action_space={env.action_space} is not allowed; allowed: a "
                "Discrete action space (masks select among discrete actions)"
            )
        if observation_key == ACTION_MASK_KEY or not isinstance(observation_key, str):
            raise ValueError(
                f"ActionMaskObservation: observation_key={observation_key!r} is not allowed; allowed: a str "
                f"other than {ACTION_MASK_KEY!r}"
            )
        self.observation_key = observation_key
        self.n_actions = int(env.action_space.n)
        self.observation_space = gym.spaces.Dict(
            {
                observation_key: env.observation_space,
                ACTION_MASK_KEY: gym.spaces.Box(0, 1, (self.n_actions,), np.int8),
            }
        )

    def _observation(self, observation: Any, info: dict) -> dict[str, Any]:
        if ACTION_MASK_KEY not in info:
            raise ValueError(
                f"ActionMaskObservation: {self.env} returned an info without {ACTION_MASK_KEY!r} (keys: "
                f"{sorted(info)}); the wrapper needs info[{ACTION_MASK_KEY!r}] of shape ({self.n_actions},) "
                "at every reset and step"
            )
        mask = np.asarray(info[ACTION_MASK_KEY]).astype(np.int8)
        if mask.shape != (self.n_actions,):
            raise ValueError(
                f"ActionMaskObservation: info[{ACTION_MASK_KEY!r}] has shape {mask.shape}; allowed: "
                f"({self.n_actions},), one entry per action"
            )
        return {self.observation_key: observation, ACTION_MASK_KEY: mask}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        """``env.reset`` with the mask moved into the observation."""
        observation, info = self.env.reset(seed=seed, options=options)
        return self._observation(observation, info), info

    def step(self, action: Any) -> tuple[dict, Any, bool, bool, dict]:
        """``env.step`` with the mask moved into the observation: ``action`` a scalar int in
        ``[0, n)``; the observation is ``{observation_key: env's observation, "action_mask": (n,)
        int8}``."""
        observation, reward, terminated, truncated, info = self.env.step(action)
        return self._observation(observation, info), reward, terminated, truncated, info


def _channels_last(n_frames: int, frame_shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    """The map from ``FrameStackObservation``'s ``(n, *frame_shape)`` to kitae's layout."""
    if len(frame_shape) == 1:  # vectors (D,) -> (n * D,), oldest frame first
        return lambda x: np.reshape(x, (n_frames * frame_shape[0],))
    if len(frame_shape) == 2:  # grayscale (H, W) -> (H, W, n)
        return lambda x: np.moveaxis(x, 0, -1)
    height, width, channels = frame_shape  # (H, W, C) -> (H, W, n * C), channel f * C + c

    return lambda x: np.reshape(np.moveaxis(x, 0, -2), (height, width, n_frames * channels))


def frame_stack(env: gym.Env, n_frames: int) -> gym.Env:
    """Stacks the last ``n_frames`` observations of ``env``, channels-last.

    Gymnasium's ``FrameStackObservation(env, n_frames)`` (padding with the reset observation at the
    start of an episode) stacks on a NEW LEADING axis ``(n, *frame_shape)``; kitae's CNN encoders
    read channels-last images, so the stack is laid out as:

    * ``(H, W, C)`` frames -> ``(H, W, n * C)``, channel ``f * C + c`` being channel ``c`` of frame
      ``f`` (frame 0 the oldest);
    * ``(H, W)`` grayscale frames -> ``(H, W, n)``;
    * ``(D,)`` vectors -> ``(n * D,)``.

    The dtype is kept (``uint8`` frames stay ``uint8``: the network scales them). ``n_frames == 1``
    returns ``env`` unchanged.

    Raises:
        ValueError: for ``n_frames < 1`` or an observation space that is not a ``Box`` of 1 to 3 dims.
    """
    check_positive_int("frame_stack", n_frames)
    if n_frames == 1:
        return env
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or not 1 <= len(space.shape) <= 3:
        raise ValueError(
            f"frame_stack={n_frames} needs a Box observation space of shape (D,), (H, W) or (H, W, C); got {space}"
        )
    stacked: gym.Wrapper[Any, Any, Any, Any] = gym.wrappers.FrameStackObservation(env, n_frames)
    stacked_space = stacked.observation_space
    assert isinstance(stacked_space, gym.spaces.Box)  # Gymnasium stacks a Box into a Box
    to_layout = _channels_last(n_frames, tuple(space.shape))
    low, high = to_layout(stacked_space.low), to_layout(stacked_space.high)
    # Gymnasium types Box's dtype as a scalar type; it takes any np.dtype (it calls np.dtype(dtype))
    new_space = gym.spaces.Box(low, high, low.shape, space.dtype)  # type: ignore[arg-type]
    return gym.wrappers.TransformObservation(stacked, to_layout, new_space)


def _dict_space(space: gym.Space) -> gym.Space:
    """``space`` with every ``Tuple`` in it (nested too) a ``Dict`` keyed by the padded index."""
    if isinstance(space, gym.spaces.Tuple):
        width = len(str(len(space.spaces) - 1))
        return gym.spaces.Dict({f"{i:0{width}d}": _dict_space(s) for i, s in enumerate(space.spaces)})
    if isinstance(space, gym.spaces.Dict):
        return gym.spaces.Dict({k: _dict_space(s) for k, s in space.spaces.items()})
    return space


def _dict_observation(space: gym.Space, observation: Any) -> Any:
    """``observation`` of ``space`` laid out as ``_dict_space(space)`` says."""
    if isinstance(space, gym.spaces.Tuple):
        width = len(str(len(space.spaces) - 1))
        return {f"{i:0{width}d}": _dict_observation(s, o) for i, (s, o) in enumerate(zip(space.spaces, observation))}
    if isinstance(space, gym.spaces.Dict):
        return {k: _dict_observation(s, observation[k]) for k, s in space.spaces.items()}
    return observation


def _has_tuple(space: gym.Space) -> bool:
    if isinstance(space, gym.spaces.Tuple):
        return True
    return isinstance(space, gym.spaces.Dict) and any(_has_tuple(s) for s in space.spaces.values())


def tuple_as_dict(env: gym.Env) -> gym.Env:
    """``env`` with its ``Tuple`` observations (and those nested in a ``Dict``) as ``Dict`` ones:
    ``Tuple(Discrete(32), Discrete(11), Discrete(2))`` becomes ``Dict("0": Discrete(32), "1":
    Discrete(11), "2": Discrete(2))``, an observation ``(14, 10, 0)`` becomes ``{"0": 14, "1": 10,
    "2": 0}``; ten or more entries are keyed ``"00"``, ``"01"``, ... ``env`` itself when its space
    holds no ``Tuple``.

    Why a ``Dict``: kitae's encoders, buffers and checkpoints read observations as arrays or dicts
    of arrays (``kitae.modules.encoders.DictEncoder``: one encoder per key); a tuple read as a dict
    of its entries gets the same networks a tuple encoder would build, without a second path.
    """
    space = env.observation_space
    if not _has_tuple(space):
        return env
    return gym.wrappers.TransformObservation(env, lambda obs: _dict_observation(space, obs), _dict_space(space))
