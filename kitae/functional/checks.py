"""What a functional agent checks of its inputs (``kitae.functional.base``): the learning rate,
the network's outputs, and the ``data`` of ``update`` (its keys, the shapes of its observations
and actions while traced, the values of a concrete ``action``) and ``predict``'s ``evaluation``.

Shapes are static, so they are checked while ``jax.jit`` traces, at no cost; values exist only
outside ``jit`` / ``vmap`` and are checked there (``check_action_values``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from kitae.buffer import Experience
from kitae.envs.spaces import element_shape

__all__ = [
    "check_learning_rate",
    "dummy_observation",
    "probe_observation",
    "shape_text",
    "check_output_shape",
    "data_fields",
    "check_data_observations",
    "action_values_allowed",
    "check_action_values",
    "check_evaluation",
    "off_policy_experience",
    "update_key",
    "PROBE_BATCH",
    "OFF_POLICY_DATA_KEYS",
    "BOX_TOLERANCE",
]


def check_learning_rate(learning_rate: Any) -> None:
    """Checks ``learning_rate``: a float > 0 or a schedule (a callable ``count -> rate``).

    Raises:
        TypeError: for another type (``"1e-3"``, ``True``), as the configs do.
        ValueError: for a number that is not > 0.
    """
    allowed = "a float > 0 or an optax schedule (count -> rate)"
    if callable(learning_rate):
        return
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)):
        raise TypeError(f"learning_rate={learning_rate!r} has type {type(learning_rate).__name__}; allowed: {allowed}")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate={learning_rate!r} is not allowed; allowed: {allowed}")


def dummy_observation(observation_space: gym.Space, batch: int = 1) -> Any:
    """A batch of ``batch`` zero observations ``(batch, *shape)`` (dicts of them for ``Dict``
    spaces)."""
    return jax.tree_util.tree_map(
        lambda space: jnp.zeros((batch, *space.shape), space.dtype if space.dtype is not None else jnp.float32),
        observation_space,
        is_leaf=lambda x: isinstance(x, gym.Space) and not isinstance(x, gym.spaces.Dict),
    )


PROBE_BATCH = 7
"""The batch of zero observations on which ``init_params`` checks the shapes of a network's
outputs (``jax.eval_shape``: nothing is computed). Neither 1 nor a usual layer width, so that the
batch axis is not mistaken for another axis of the same size (a critic's ``(B, 1)`` for an
ensemble's ``(k, B)``, a ``(B, n)`` output for ``(k, B)``)."""


def probe_observation(observation_space: gym.Space) -> Any:
    """``PROBE_BATCH`` zero observations, the input of the shape checks (``jax.eval_shape``)."""
    return dummy_observation(observation_space, PROBE_BATCH)


def shape_text(output: Any) -> str:
    """How the shape errors name an output: ``"shape (B, n)"`` for an array, ``"a tuple, not an
    array"`` for anything else."""
    shape = getattr(output, "shape", None)
    if isinstance(shape, tuple):
        return f"shape {shape}"
    return f"a {type(output).__name__}, not an array"


def check_output_shape(output: Any, required: tuple[int, ...], what: str, allowed: str) -> None:
    """Raises ``TypeError`` unless ``output`` (a ``jax.eval_shape`` leaf, computed on
    ``PROBE_BATCH`` observations) is an array of shape ``required``.

    The message names ``what`` (e.g. ``"DQN's network (Q-values)"``), the shape found, the shape
    required for this batch and ``allowed`` (the rule, e.g. ``"(B, n_actions) for Discrete(2)"``).
    """
    if getattr(output, "shape", None) == tuple(required):
        return
    raise TypeError(
        f"{what} returned {shape_text(output)} for a batch of B={PROBE_BATCH} observations, which is not "
        f"allowed; required: shape {tuple(required)}, that is {allowed}"
    )


def data_fields(data: Mapping[str, Any], keys: tuple[str, ...], algo: str) -> tuple[Any, ...]:
    """The arrays of ``data`` under ``keys``, in that order.

    Raises:
        KeyError: naming the missing keys and the ones ``update`` reads.
    """
    if not isinstance(data, Mapping):
        raise TypeError(f"data={type(data).__name__} is not allowed; allowed: a mapping with keys {list(keys)}")
    missing = [k for k in keys if k not in data]
    if missing:
        raise KeyError(f"{algo}.update: data lacks {missing}; it reads {list(keys)}")
    return tuple(data[k] for k in keys)


OFF_POLICY_DATA_KEYS = ("obs", "action", "reward", "terminated", "next_obs")
"""What an off-policy agent's ``update`` reads from ``data`` (DQN, SAC, TD3), leaves ``(B, ...)``:
``obs`` and ``next_obs`` ``(B, *obs_shape)`` (``next_obs`` the real next observation, also where
an episode was truncated), ``action`` ``(B,)`` or ``(B, d)`` in the environment's units,
``reward`` ``(B,)``, ``terminated`` ``(B,)`` (bootstrapping stops only there). Optionally
``key``: the PRNG key of the update (default ``fold_in(PRNGKey(seed), OptimState.count)``)."""


def check_data_observations(observation_space: gym.Space, data: Mapping[str, Any], axes: str, algo: str) -> None:
    """Checks ``data["obs"]`` and ``data["next_obs"]`` against ``observation_space``: ``obs``
    ``(*leading, *obs_shape)`` with as many leading axes as ``axes`` names (``"B"``: a batch;
    ``"T, E"``: a rollout), ``next_obs`` of ``obs``'s shape. Shapes are static: checked while
    traced, at no cost, before the network sees them (otherwise Haiku's "'mlp/~/linear_0/w' with
    retrieved shape (4, 32) does not match shape=[5, 32]" from inside the user's network).
    A space of another kind than ``Box``, ``Discrete``, ``MultiBinary``, ``MultiDiscrete`` is not
    checked.

    Raises:
        ValueError: naming the key, the shape found and the shape required.
    """
    shape = element_shape(observation_space)
    if shape is None:
        return
    n_leading = len(axes.split(","))
    found = tuple(jnp.shape(data["obs"]))
    if len(found) != n_leading + len(shape) or found[n_leading:] != shape:
        required = f"({axes}{''.join(f', {n}' for n in shape)})"
        raise ValueError(
            f"{algo}.update: data['obs'] has shape {found}, which is not allowed; required: {required} for the "
            f"environment's observation space {observation_space}"
        )
    next_found = tuple(jnp.shape(data["next_obs"]))
    if next_found != found:
        raise ValueError(
            f"{algo}.update: data['next_obs'] has shape {next_found}, which is not allowed; required: {found}, "
            "data['obs']'s shape"
        )


def action_values_allowed(action_space: gym.Space) -> str | None:
    """What ``check_action_values`` allows for ``action_space``, in words (``None``: not checked)."""
    if isinstance(action_space, gym.spaces.Discrete):
        start = int(action_space.start)
        return f"integers in [{start}, {start + int(action_space.n)})"
    if isinstance(action_space, gym.spaces.MultiDiscrete):
        return "integers in [start, start + nvec) per component"
    if isinstance(action_space, gym.spaces.MultiBinary):
        return "integers 0 or 1"
    if isinstance(action_space, gym.spaces.Box):
        return "finite values in [low, high]"
    return None


BOX_TOLERANCE = 1e-5
"""How far (relative to the box's width, and at least this much absolutely) a ``Box`` action may
lie outside ``[low, high]`` and still be taken: the agents' own actions are scaled from
``[-1, 1]`` in float32, whose rounding can land one ulp past a bound."""


def check_action_values(action_space: gym.Space, action: Any, algo: str, bounds: bool = True) -> None:
    """Checks the values of a concrete ``data["action"]`` against ``action_space``: integers in
    ``[start, start + n)`` for a ``Discrete`` (per component for ``MultiDiscrete``, 0 or 1 for
    ``MultiBinary``); for a ``Box`` (when ``bounds``), finite values in ``[low, high]`` (up to
    ``BOX_TOLERANCE``). A float ``1.0`` is an integer; ``1.7`` is not.

    Values exist only outside ``jax.jit`` / ``jax.vmap``: a traced ``action`` is not checked (its
    shape is, while traced: ``off_policy_experience``). Otherwise the collection would read ``7`` on
    ``Discrete(2)`` as a NaN loss, ``-1`` as the last action and ``1.7`` as ``1``, silently.

    Raises:
        ValueError: one line naming ``data['action']``, the first value refused, the space and what
            is allowed.
    """
    allowed = action_values_allowed(action_space)
    if allowed is None or isinstance(action, jax.core.Tracer):
        return
    if isinstance(action_space, gym.spaces.Box) and not bounds:
        return
    try:
        values = np.asarray(action)
    except (TypeError, ValueError):  # a ragged list: its shape is refused elsewhere
        return
    if values.dtype == object or not (np.issubdtype(values.dtype, np.number) or values.dtype == np.bool_):
        raise ValueError(
            f"{algo}.update: data['action'] has dtype {values.dtype}, which is not allowed for {action_space}; "
            f"allowed: {allowed}"
        )
    if isinstance(action_space, gym.spaces.Box):
        low = np.broadcast_to(np.asarray(action_space.low, np.float64), action_space.shape)
        high = np.broadcast_to(np.asarray(action_space.high, np.float64), action_space.shape)
        tol = BOX_TOLERANCE * np.maximum(1.0, np.where(np.isfinite(high - low), high - low, 1.0))
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(values) | (values < low - tol) | (values > high + tol)
    else:
        if isinstance(action_space, gym.spaces.Discrete):
            low, high = np.asarray(int(action_space.start)), np.asarray(int(action_space.start) + int(action_space.n))
        elif isinstance(action_space, gym.spaces.MultiDiscrete):
            low = np.asarray(action_space.start, np.int64)
            low, high = low, low + np.asarray(action_space.nvec, np.int64)
        else:  # MultiBinary
            low, high = np.asarray(0), np.asarray(2)
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(values) | (values != np.floor(values)) | (values < low) | (values >= high)
    if np.any(bad):
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        value = values[index]  # a NumPy scalar: printed in its own precision (1.7, not 1.7000000476837158)
        where = "" if values.ndim == 0 else f" (at index {index[0] if len(index) == 1 else index})"
        raise ValueError(
            f"{algo}.update: data['action'] holds {value!s}{where}, outside {action_space}; allowed: {allowed}"
        )


def check_evaluation(evaluation: Any) -> None:
    """Refuses an ``evaluation`` that cannot be static: it picks the program (greedy or
    exploring), so it is a Python bool, never a traced or array value.

    Raises:
        TypeError: for a JAX or NumPy array (a tracer included: ``jax.jit(agent.predict)`` traces
            every argument), saying how to jit ``predict``.
    """
    if isinstance(evaluation, (jax.Array, np.ndarray)):
        found = (
            f"a traced value ({type(evaluation).__name__})"
            if isinstance(evaluation, jax.core.Tracer)
            else f"an array ({type(evaluation).__name__})"
        )
        raise TypeError(
            f"evaluation is {found}, which is not allowed; allowed: a Python bool (static: it picks the program). "
            "To jit predict, call agent.jit() or use jax.jit(agent.predict, static_argnames='evaluation')"
        )


def off_policy_experience(
    data: Mapping[str, Any],
    algo: str,
    action_space: gym.Space | None = None,
    observation_space: gym.Space | None = None,
) -> Experience:
    """``data`` (``OFF_POLICY_DATA_KEYS``) as the collection's ``Experience``.

    Only shapes are checked here (they are static: checked while traced, at no cost, under
    ``jax.jit`` too); the values of ``action`` are checked by ``CollectionAgent.update`` where they
    are concrete (``check_action_values``).

    Raises:
        ValueError: naming the key, for ``obs`` not ``(B, *obs_shape)`` of ``observation_space`` or
            ``next_obs`` not of ``obs``'s shape, ``reward`` or ``terminated`` not ``(B,)``, or
            ``action`` not ``(B,)`` for a ``Discrete`` / ``(B, *shape)`` for a ``Box``
            ``action_space``, where ``B`` is ``obs``'s leading axis.
    """
    obs, action, reward, terminated, next_obs = data_fields(data, OFF_POLICY_DATA_KEYS, algo)
    if observation_space is not None:
        check_data_observations(observation_space, data, "B", algo)
    leaves = jax.tree_util.tree_leaves(obs)
    batch = jnp.shape(leaves[0])[0] if leaves and jnp.ndim(leaves[0]) else None
    if batch is not None:
        required: dict[str, tuple[int, ...]] = {"reward": (batch,), "terminated": (batch,)}
        if isinstance(action_space, gym.spaces.Discrete):
            required["action"] = (batch,)
        elif isinstance(action_space, gym.spaces.Box):
            required["action"] = (batch, *action_space.shape)
        for name, shape in required.items():
            found = tuple(jnp.shape(data[name]))
            if found != shape:
                space = f" for {action_space}" if name == "action" else ""
                raise ValueError(
                    f"{algo}.update: data[{name!r}] has shape {found}, which is not allowed; required: {shape}{space} "
                    f"(B={batch}, from data['obs'])"
                )
    return Experience(
        observation=obs,
        action=action,
        reward=reward,
        done=terminated,
        next_observation=next_obs,
        log_prob=None,
        truncated=None,
    )


def update_key(data: Mapping[str, Any], seed: int, count: jax.Array) -> jax.Array:
    """``data["key"]``, or ``fold_in(PRNGKey(seed), count)``: a pure function of explicit state.
    ``count``: the optimizer's int32 scalar step count; returns a raw ``(2,)`` uint32 PRNG key (or
    ``data["key"]`` as given)."""
    return data["key"] if "key" in data else jax.random.fold_in(jax.random.PRNGKey(seed), count)
