"""Environments written in JAX: one interface, adapters, and a vectorized wrapper.

A ``JaxEnv`` is pure: ``reset(key, params) -> (obs, state)`` and
``step(key, state, action, params) -> JaxTimeStep``. ``step`` resets an environment whose episode
ended and hands back the episode's real final observation in ``JaxTimeStep.next_observation``,
so a transition never pairs the end of one episode with the start of the next; ``terminated``
and ``truncated`` are kept apart. ``VecJaxEnv`` vmaps an environment over ``n_envs`` copies.

Any object with these methods and a ``observation_space`` / ``action_space`` (Gymnasium spaces of
ONE environment) and ``default_params`` trains in kitae's compiled loop; ``GymnaxEnv`` adapts
gymnax 1.x, ``kitae.envs.brax_env`` Brax and ``kitae.envs.jaxmarl_env`` JaxMARL. The three adapters
also have ``step_without_reset(key, state, action, params)`` (the state an episode ends in kept)
and ``render(state)`` (an RGB frame), with which ``kitae eval --video`` plays and films one of them
(``kitae.loops.evaluate.play_episode``); training needs neither.
``kitae.envs.make.make_jax_env("gymnax:CartPole-v1", n_envs)`` builds one from an id.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from kitae.envs.options import LIBRARY_REFUSALS, check_options, refused
from kitae.validation import check_positive_int, closest_names


class JaxTimeStep(NamedTuple):
    """What ``JaxEnv.step`` returns, for one environment (or batched ``(E, ...)`` by ``VecJaxEnv``).

    Attributes:
        observation: the observation to act on next: the first of a new episode where one ended.
        state: the environment state after the step (after the reset where an episode ended).
        reward: float32 scalar (``{agent: scalar}`` in a multi-agent environment, as are
            ``terminated`` and ``truncated``).
        terminated: bool: the episode reached a terminal state (do not bootstrap).
        truncated: bool: the episode was cut by a time limit (bootstrap from next_observation).
        next_observation: the real next observation of this transition (the final observation
            where an episode ended).
    """

    observation: Any
    state: Any
    reward: jax.Array | dict[str, jax.Array]
    terminated: jax.Array | dict[str, jax.Array]
    truncated: jax.Array | dict[str, jax.Array]
    next_observation: Any


class JaxEnv(Protocol):
    """The interface of a single environment written in JAX."""

    # read-only properties: an environment may declare narrower spaces (BraxEnv's are Boxes)
    @property
    def observation_space(self) -> gym.Space:
        """The Gymnasium space of ONE environment's observation (a ``Box`` of shape ``obs_shape``,
        or a ``Dict`` of such)."""

    @property
    def action_space(self) -> gym.Space:
        """The Gymnasium space of ONE environment's action (``Discrete``: a scalar; ``Box``: shape
        ``action_shape``)."""

    default_params: Any

    def reset(self, key: jax.Array, params: Any) -> tuple[Any, Any]:
        """Starts an episode of one environment.

        Args:
            key: a PRNG key (a raw ``(2,)`` uint32 key).
            params: the environment's parameters (``default_params`` unless given).

        Returns:
            ``(observation, state)``: the first observation, ``(*obs_shape)`` (or a dict of such
            arrays), and the environment's state pytree.
        """

    def step(self, key: jax.Array, state: Any, action: Any, params: Any) -> JaxTimeStep:
        """One step of one environment; where the episode ends there, the environment is reset
        from ``key`` and the final observation is kept in ``next_observation``.

        Args:
            key: a PRNG key (a raw ``(2,)`` uint32 key).
            state: the state pytree ``reset`` or the previous ``step`` returned.
            action: one action, an element of ``action_space`` (a scalar for ``Discrete``, else
                ``(*action_shape)``).
            params: the environment's parameters.

        Returns:
            A ``JaxTimeStep``: ``observation`` and ``next_observation`` ``(*obs_shape)``,
            ``reward`` a float32 scalar, ``terminated`` and ``truncated`` bool scalars.
        """


def check_gymnax_id(name: str, also: Sequence[str] = ()) -> None:
    """Refuses a ``name`` that is neither in ``gymnax.registered_envs`` nor in ``also`` (the ids
    ``kitae.envs.make`` adds: ``CartPoleNoVel-v1``, ...), with the closest names and the lists.

    Raises:
        ValueError: for an unknown id.
    """
    for module in ("seaborn", "matplotlib.pyplot"):  # gymnax imports them to render only
        _import_lazily(module)
    import gymnax

    if name in gymnax.registered_envs or name in also:
        return
    hint = closest_names(name, [*gymnax.registered_envs, *also])
    added = f"; kitae adds: {', '.join(also)}" if also else ""
    raise ValueError(
        f"unknown gymnax environment {name!r}{hint}; registered: {', '.join(gymnax.registered_envs)}{added}"
    )


def _import_lazily(name: str) -> None:
    """Puts a stand-in for module ``name`` in ``sys.modules`` that imports the real module on its
    first attribute use, unless it is imported already or not installed.

    gymnax imports seaborn and matplotlib's pyplot at module level for its renderers only
    (``gymnax.environments.misc``, ``bsuite.catch``): about 1.3 s of a cold ``kitae train``
    (seaborn pulls pandas and scipy.stats; pyplot 0.35 s) that no training uses.
    (``importlib.util.LazyLoader`` does not help: the ``import`` statement reads the module's
    ``__spec__``, which loads it.)
    """
    import importlib.machinery
    import importlib.util
    import sys
    import types

    if name in sys.modules:
        return
    parent, _, _ = name.rpartition(".")
    if parent:  # found in the parent's folders: find_spec would import the parent (or its stand-in)
        module = sys.modules.get(parent)
        parent_spec = module.__spec__ if module is not None else importlib.util.find_spec(parent)
        locations = getattr(parent_spec, "submodule_search_locations", None)
        spec = importlib.machinery.PathFinder.find_spec(name, locations) if locations else None
    else:
        spec = importlib.util.find_spec(name)
    if spec is None:
        return

    class ImportedOnUse(types.ModuleType):
        def __getattr__(self, attr: str) -> Any:  # only for attributes the stand-in lacks
            if sys.modules.get(name) is self:
                del sys.modules[name]
            return getattr(importlib.import_module(name), attr)

    stand_in = ImportedOnUse(name)
    stand_in.__spec__ = spec
    sys.modules[name] = stand_in


def _check_gymnax_options(name: str, env_kwargs: dict[str, Any]) -> None:
    """Refuses options gymnax's constructor of ``name`` does not name (``CartPole-v1`` takes none:
    Python's "unexpected keyword argument 'foo'" named neither ``env_kwargs`` nor what is allowed)
    or values of another type than their defaults (``kitae.envs.options.check_options``)."""
    from gymnax.registration import _registry  # gymnax's registry of constructors: no public accessor

    factory = _registry[name]
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # no signature to read: gymnax's own call decides
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):  # it takes any name
        return
    options = {p.name: p.default for p in parameters if p.kind in _NAMED_KINDS}
    if not options:
        raise ValueError(f"env_kwargs {sorted(env_kwargs)} are not options of gymnax's {name!r}: it takes none")
    check_options(env_kwargs, options, f"gymnax's {name!r}")


_NAMED_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


class GymnaxEnv:
    """Adapts a gymnax 1.x environment to ``JaxEnv``.

    gymnax's ``step`` auto-resets and returns ``(obs, state, reward, terminated, truncated, info)``
    with the pre-reset observation in ``info["final_observation"]``.

    Args:
        name: a gymnax id, e.g. ``"CartPole-v1"`` (``gymnax.registered_envs`` lists them).
        **env_kwargs: passed to ``gymnax.make``.
    """

    def __init__(self, name: str, **env_kwargs: Any) -> None:
        check_gymnax_id(name)
        import gymnax
        from gymnax.environments.spaces import gymnax_space_to_gym_space

        self.name = name
        if env_kwargs:
            _check_gymnax_options(name, env_kwargs)
        try:
            self.env, self.default_params = gymnax.make(name, **env_kwargs)
        except LIBRARY_REFUSALS as error:
            if not env_kwargs:
                raise
            raise refused(env_kwargs, f"gymnax's {name!r}", error) from error
        self.observation_space = _float32_box(
            gymnax_space_to_gym_space(self.env.observation_space(self.default_params))
        )
        self.action_space = gymnax_space_to_gym_space(self.env.action_space(self.default_params))
        self._visualizer: Any = None

    def reset(self, key: jax.Array, params: Any) -> tuple[Any, Any]:
        """gymnax's ``reset``: ``(observation (*obs_shape), state)`` of one environment, from ``key``
        (a raw ``(2,)`` uint32 PRNG key) and gymnax's ``params``."""
        return self.env.reset(key, params)

    def step(self, key: jax.Array, state: Any, action: Any, params: Any) -> JaxTimeStep:
        """gymnax's auto-resetting ``step`` of one environment as a ``JaxTimeStep``.

        Args:
            key: a PRNG key (a raw ``(2,)`` uint32 key): the step's and, where the episode ends,
                the reset's.
            state: gymnax's state pytree.
            action: one action (a scalar for a discrete space, else ``(*action_shape)``).
            params: gymnax's environment parameters.

        Returns:
            ``observation`` and ``next_observation`` (gymnax's ``info["final_observation"]``)
            ``(*obs_shape)``, ``reward`` a float32 scalar, ``terminated`` and ``truncated`` bool
            scalars (a step that does both counts as terminated only).
        """
        obs, new_state, reward, terminated, truncated, info = self.env.step(key, state, action, params)
        return _gymnax_timestep(obs, new_state, reward, terminated, truncated, info["final_observation"])

    def step_without_reset(self, key: jax.Array, state: Any, action: Any, params: Any) -> JaxTimeStep:
        """One step that keeps the state it reaches, even where the episode ends there (``step``
        resets it): what a video draws. The physics gets the key ``step`` gives it (the first of
        ``split(key)``); ``observation`` and ``next_observation`` are both the observation reached.

        Args:
            key: a PRNG key (a raw ``(2,)`` uint32 key).
            state: gymnax's state pytree of one environment.
            action: one action (a scalar for a discrete space, else ``(*action_shape)``).
            params: gymnax's environment parameters.

        Returns:
            A ``JaxTimeStep`` of one environment: observations ``(*obs_shape)``, ``reward`` a
            float32 scalar, ``terminated`` and ``truncated`` bool scalars.
        """
        step_key, _ = jax.random.split(key)
        obs, new_state, reward, terminated, _ = self.env.step_env(step_key, state, action, params)
        return _gymnax_timestep(obs, new_state, reward, terminated, self.env.is_truncated(new_state, params), obs)

    @property
    def filmable(self) -> bool:
        """Whether ``render`` draws this environment: gymnax's visualizer knows it (``GYMNAX_DRAWN``)."""
        return self.name in GYMNAX_DRAWN

    @property
    def render_fps(self) -> float:
        """The frame rate of gymnax's own animations: 20 for classic control, 10 for the others."""
        return 20.0 if self.name in GYMNAX_CLASSIC else 10.0

    def render(self, state: Any) -> np.ndarray:
        """``(500, 600, 3)`` uint8: one environment's ``state`` (not a batch) drawn by gymnax's own
        ``Visualizer`` (matplotlib; MinAtar's channels as colours, a maze, ...), titled with the
        number of states drawn since ``close``.

        Raises:
            ValueError: for an environment gymnax's visualizer does not draw.
        """
        if not self.filmable:
            raise ValueError(f"gymnax environment {self.name!r} cannot be drawn; allowed: {', '.join(GYMNAX_DRAWN)}")
        if self._visualizer is None:
            from gymnax.visualize import Visualizer

            self._visualizer = Visualizer(self.env, self.default_params, [state])
            self._visualizer.init()
        else:
            self._visualizer.state_seq.append(state)
        self._visualizer.update(len(self._visualizer.state_seq) - 1)
        canvas = self._visualizer.fig.canvas
        canvas.draw()
        return np.asarray(canvas.buffer_rgba())[..., :3].copy()

    def close(self) -> None:
        """Closes the figure ``render`` draws on (made again when ``render`` is called again)."""
        if self._visualizer is not None:
            import matplotlib.pyplot as plt

            plt.close(self._visualizer.fig)
        self._visualizer = None

    def __repr__(self) -> str:
        return f"GymnaxEnv({self.name!r})"


def _gymnax_timestep(
    obs: Any, state: Any, reward: Any, terminated: Any, truncated: Any, next_observation: Any
) -> JaxTimeStep:
    """gymnax's step values as a ``JaxTimeStep``: a float32 reward, and a step that both terminates
    and reaches the time limit counted as a termination only."""
    return JaxTimeStep(
        observation=obs,
        state=state,
        reward=jnp.asarray(reward, jnp.float32),
        terminated=jnp.asarray(terminated, bool),
        truncated=jnp.logical_and(jnp.asarray(truncated, bool), jnp.logical_not(terminated)),
        next_observation=next_observation,
    )


GYMNAX_CLASSIC = ("Acrobot-v1", "CartPole-v1", "Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0")
GYMNAX_DRAWN = (
    *GYMNAX_CLASSIC,
    "Catch-bsuite",
    "Asterix-MinAtar",
    "Breakout-MinAtar",
    "Freeway-MinAtar",
    "Seaquest-MinAtar",
    "SpaceInvaders-MinAtar",
    "Pong-misc",
    "PointRobot-misc",
    "MetaMaze-misc",
    "FourRooms-misc",
)
"""The gymnax ids whose states ``gymnax.visualize.Visualizer`` draws (its own lists, gymnax 1.0.1)."""


def _float32_box(space: gym.Space) -> gym.Space:
    """gymnax reports some observation bounds in float64; keep observations float32."""
    if isinstance(space, gym.spaces.Box) and space.dtype != np.float32 and np.issubdtype(space.dtype, np.floating):
        return gym.spaces.Box(space.low.astype(np.float32), space.high.astype(np.float32), space.shape, np.float32)
    return space


class VecJaxEnv:
    """``n_envs`` copies of a ``JaxEnv``, stepped together with ``jax.vmap``.

    Args:
        env: the single environment.
        n_envs: number of copies (>= 1).
        params: environment parameters (default: ``env.default_params``).

    Attributes:
        single_observation_space, single_action_space: the spaces of one copy.
    """

    def __init__(self, env: JaxEnv, n_envs: int, params: Any = None) -> None:
        check_positive_int("n_envs", n_envs)
        self.env = env
        self.num_envs = n_envs
        self.params = env.default_params if params is None else params
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space

    def reset(self, key: jax.Array) -> tuple[Any, Any]:
        """Resets every copy: observations ``(E, *obs_shape)`` and a batched state."""
        keys = jax.random.split(key, self.num_envs)
        return jax.vmap(self.env.reset, in_axes=(0, None))(keys, self.params)

    def step(self, key: jax.Array, state: Any, actions: Any) -> JaxTimeStep:
        """Steps every copy with ``actions`` ``(E, ...)``; every field of the result is ``(E, ...)``."""
        keys = jax.random.split(key, self.num_envs)
        return jax.vmap(self.env.step, in_axes=(0, 0, 0, None))(keys, state, actions, self.params)

    def close(self) -> None:
        """Nothing to release (for symmetry with Gymnasium vector environments)."""

    def __repr__(self) -> str:
        return f"VecJaxEnv({self.env!r}, n_envs={self.num_envs})"
