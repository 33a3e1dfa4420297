"""Gymnasium spaces to plain dicts and back, so configs can be written as YAML without pickle."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

_ACCEPTED = "Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple"


def _array_or_scalar(values: np.ndarray) -> Any:
    """Stores a bound as a scalar when all its entries are equal, else as a nested list."""
    flat = np.asarray(values).ravel()
    if flat.size and np.all(flat == flat[0]):
        value = flat[0].item()
    else:
        value = np.asarray(values).tolist()
    return value


def space_to_dict(space: gym.Space) -> dict[str, Any]:
    """Describes a gymnasium space as a dict of plain Python values (YAML-safe).

    Raises:
        TypeError: if the space is of a kind kitae does not serialise.
    """
    if isinstance(space, gym.spaces.Box):
        return {
            "type": "Box",
            "low": _array_or_scalar(space.low),
            "high": _array_or_scalar(space.high),
            "shape": list(space.shape),
            "dtype": np.dtype(space.dtype).name,
        }
    if isinstance(space, gym.spaces.Discrete):
        return {
            "type": "Discrete",
            "n": int(space.n),
            "start": int(space.start),
            "dtype": np.dtype(space.dtype).name,
        }
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {
            "type": "MultiDiscrete",
            "nvec": np.asarray(space.nvec).tolist(),
            "start": np.asarray(space.start).tolist(),
            "dtype": np.dtype(space.dtype).name,
        }
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {k: space_to_dict(s) for k, s in space.spaces.items()}}
    if isinstance(space, gym.spaces.Tuple):
        return {"type": "Tuple", "spaces": [space_to_dict(s) for s in space.spaces]}
    raise TypeError(f"cannot serialise space {space!r}: accepted spaces are {_ACCEPTED}")


def space_from_dict(data: dict[str, Any]) -> gym.Space:
    """Rebuilds a gymnasium space from ``space_to_dict``'s output.

    Raises:
        ValueError: if ``data`` does not describe a known space.
    """
    if not isinstance(data, dict) or "type" not in data:
        raise ValueError(f"a space must be a mapping with a 'type' key ({_ACCEPTED}), got {data!r}")
    kind = data["type"]
    try:
        if kind == "Box":
            shape = tuple(data["shape"])
            dtype = np.dtype(data.get("dtype", "float32"))
            low = np.broadcast_to(np.asarray(data["low"], dtype=dtype), shape)
            high = np.broadcast_to(np.asarray(data["high"], dtype=dtype), shape)
            return gym.spaces.Box(low=low, high=high, shape=shape, dtype=dtype)
        if kind == "Discrete":
            return gym.spaces.Discrete(
                int(data["n"]), start=int(data.get("start", 0)), dtype=np.dtype(data.get("dtype", "int64"))
            )
        if kind == "MultiDiscrete":
            return gym.spaces.MultiDiscrete(
                data["nvec"], start=data.get("start"), dtype=np.dtype(data.get("dtype", "int64"))
            )
        if kind == "MultiBinary":
            return gym.spaces.MultiBinary(data["n"])
        if kind == "Dict":
            return gym.spaces.Dict({k: space_from_dict(v) for k, v in data["spaces"].items()})
        if kind == "Tuple":
            return gym.spaces.Tuple([space_from_dict(v) for v in data["spaces"]])
    except KeyError as missing:
        raise ValueError(f"space of type {kind!r} is missing the key {missing}") from None
    raise ValueError(f"unknown space type {kind!r}: accepted types are {_ACCEPTED}")
