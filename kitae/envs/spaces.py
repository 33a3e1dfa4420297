"""Gymnasium spaces to plain dicts and back, so configs can be written as YAML without pickle."""

from __future__ import annotations

from collections.abc import Mapping
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


def space_mismatch(expected: gym.Space, actual: gym.Space, where: str = "") -> str | None:
    """Where ``actual`` differs from ``expected`` in what an agent's networks are built for, or
    ``None`` when they agree: the kind of space, a ``Box``'s shape, a ``Discrete``'s ``n`` and
    ``start``, a ``MultiDiscrete``'s ``nvec``, a ``MultiBinary``'s ``n``, a ``Dict``'s keys and a
    ``Tuple``'s length, recursively. Bounds and dtypes are not compared: the same task from two
    sources (``CartPole-v1`` and ``gymnax:CartPole-v1``) declares other bounds for the same
    observations, and one agent trains in both.

    Args:
        expected: the space the agent was built for.
        actual: the environment's space.
        where: the path of the sub-space being compared (for the message), ``""`` at the top.

    Returns:
        One line naming the first difference, or ``None``.
    """
    at = f" at {where}" if where else ""
    if type(expected) is not type(actual):
        return f"{type(actual).__name__} where {type(expected).__name__} was expected{at}"
    return _same_kind_mismatch(expected, actual, where, at)


def _same_kind_mismatch(expected: Any, actual: Any, where: str, at: str) -> str | None:
    """``space_mismatch`` for two spaces of the same class."""
    if isinstance(expected, gym.spaces.Box) and expected.shape != actual.shape:
        return f"shape {actual.shape} where {expected.shape} was expected{at}"
    if isinstance(expected, gym.spaces.Discrete) and (expected.n, expected.start) != (actual.n, actual.start):
        given, wanted = f"Discrete({actual.n}, start={actual.start})", f"Discrete({expected.n}, start={expected.start})"
        return f"{given} where {wanted} was expected{at}"
    if isinstance(expected, gym.spaces.MultiDiscrete) and not np.array_equal(expected.nvec, actual.nvec):
        return f"nvec {actual.nvec.tolist()} where {expected.nvec.tolist()} was expected{at}"
    if isinstance(expected, gym.spaces.MultiBinary) and expected.shape != actual.shape:
        return f"MultiBinary{actual.shape} where MultiBinary{expected.shape} was expected{at}"
    if isinstance(expected, gym.spaces.Dict):
        if sorted(expected.spaces) != sorted(actual.spaces):
            return f"keys {sorted(actual.spaces)} where {sorted(expected.spaces)} were expected{at}"
        for key in expected.spaces:
            found = space_mismatch(expected[key], actual[key], f"{where}[{key!r}]")
            if found:
                return found
    if isinstance(expected, gym.spaces.Tuple):
        if len(expected.spaces) != len(actual.spaces):
            return f"{len(actual.spaces)} spaces where {len(expected.spaces)} were expected{at}"
        for i, (e, a) in enumerate(zip(expected.spaces, actual.spaces)):
            found = space_mismatch(e, a, f"{where}[{i}]")
            if found:
                return found
    return None


def check_env_spaces(env_cfg: Any, observation_space: gym.Space, action_space: gym.Space) -> None:
    """Checks an environment's (one copy's, one agent's) spaces against the ``EnvConfig`` an agent
    was built from (``space_mismatch``).

    Raises:
        ValueError: naming the space, what differs, and what to do.
    """
    for name, expected, actual in (
        ("observation", env_cfg.observation_space, observation_space),
        ("action", env_cfg.action_space, action_space),
    ):
        found = space_mismatch(expected, actual)
        if found:
            raise ValueError(
                f"the environment's {name} space does not match env_cfg.{name}_space, which the agent was "
                f"built for: {found}; build the agent's config from this environment's single_{name}_space"
            )


def observation_mismatch(space: gym.Space, observation: Any, where: str = "") -> str | None:
    """Where ``observation`` (one observation, or a batch of them along one leading axis) does not
    fit ``space``, or ``None`` when it does: a ``Box``'s (or ``MultiBinary``'s, ``MultiDiscrete``'s)
    trailing shape, a ``Discrete``'s scalar per observation, a ``Dict``'s keys and a ``Tuple``'s
    length, recursively. Only shapes are read (``np.shape``: arrays, tracers, nested lists), never
    values, so it costs microseconds and works on traced observations.

    Args:
        space: the space of one observation.
        observation: one observation (a ``Box``'s ``(*shape)``, a ``Discrete``'s scalar) or a batch
            ``(N, *shape)`` (``(N,)`` for ``Discrete``); a dict or tuple of such for ``Dict`` and
            ``Tuple`` spaces.
        where: the path of the sub-observation being compared (for the message), ``""`` at the top.

    Returns:
        One line naming the first misfit (the shape found and those allowed), or ``None``.
    """
    at = f" at {where}" if where else ""
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(observation, Mapping):
            return f"a {type(observation).__name__} where a dict with keys {sorted(space.spaces)} was expected{at}"
        if sorted(observation) != sorted(space.spaces):
            return f"keys {sorted(observation)} where {sorted(space.spaces)} were expected{at}"
        for key in space.spaces:
            found = observation_mismatch(space[key], observation[key], f"{where}[{key!r}]")
            if found:
                return found
        return None
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(observation, (tuple, list)) or len(observation) != len(space.spaces):
            return f"a {type(observation).__name__} where a tuple of {len(space.spaces)} was expected{at}"
        for i, (sub_space, sub) in enumerate(zip(space.spaces, observation)):
            found = observation_mismatch(sub_space, sub, f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(space, gym.spaces.Discrete):
        expected: tuple[int, ...] = ()
    elif isinstance(space, gym.spaces.MultiDiscrete):
        expected = tuple(np.shape(space.nvec))
    elif isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary)):
        expected = tuple(space.shape)
    else:
        return None
    try:
        shape = tuple(np.shape(observation))
    except ValueError:  # a ragged nested list
        return f"a ragged {type(observation).__name__} where arrays of shape {expected} were expected{at}"
    if len(shape) in (len(expected), len(expected) + 1) and shape[len(shape) - len(expected) :] == expected:
        return None
    batch = "(N, " + ", ".join(str(n) for n in expected) + ")" if expected else "(N,)"
    return f"shape {shape} where {expected} (one observation) or {batch} (a batch) was expected{at}"


def check_observation(
    space: gym.Space, observation: Any, parallel: bool, space_name: str = "env_cfg.observation_space"
) -> None:
    """Checks what is handed to an agent's ``explore`` / ``select_action`` against the observation
    space it was built for (``observation_mismatch``); in multi-agent mode (``parallel``) the
    observation is a dict keyed by agent, each entry checked against the one agent's space.
    ``space_name`` is what the message calls the space. ``observation``: one observation
    ``(*obs_shape)`` or a batch ``(N, *obs_shape)`` (``{agent: ...}`` of those when ``parallel``);
    only its shapes are read.

    Raises:
        ValueError: naming what differs and the space.
    """
    if parallel and isinstance(observation, Mapping):
        found = next(
            (f for name, obs in observation.items() if (f := observation_mismatch(space, obs, f"[{name!r}]"))),
            None,
        )
    else:
        found = observation_mismatch(space, observation)
    if found:
        raise ValueError(f"the observation does not fit {space_name}, which the agent was built for: {found}")


def element_shape(space: gym.Space) -> tuple[int, ...] | None:
    """The shape of one element of ``space`` as an array (one observation, one action): ``()``
    for a ``Discrete``, the shape of a ``Box``, ``MultiBinary`` or ``MultiDiscrete`` (its
    ``nvec``'s); ``None`` for a space that is not one array (``Dict``, ``Tuple``, ...)."""
    if isinstance(space, gym.spaces.Discrete):
        return ()
    if isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete)):
        return tuple(int(n) for n in space.shape)
    return None
