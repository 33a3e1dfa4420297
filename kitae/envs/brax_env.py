"""Brax environments as kitae ``JaxEnv``s (``"brax:inverted_pendulum"``).

``BraxEnv`` wraps a bare Brax environment (``brax.envs.get_environment``, none of Brax's own
wrappers) and does the bookkeeping that Brax's ``EpisodeWrapper`` and ``AutoResetWrapper`` do,
in the way kitae's compiled loop needs it:

- **termination** is Brax's ``done`` from the physics (a fallen pole, a flipped ant);
- **truncation** is kitae's own step counter reaching ``params.episode_length`` (Brax's
  ``EpisodeWrapper`` folds both into one ``done`` and tells them apart only through
  ``info["truncation"]``); a step that both terminates and reaches the limit is a termination;
- **auto-reset** draws a fresh initial state from the step's key (Brax's ``AutoResetWrapper``
  restarts every episode from the same cached first state, and overwrites ``obs`` with the
  reset observation, so the real final observation of an episode is lost): the final
  observation is ``JaxTimeStep.next_observation``, the reset one ``JaxTimeStep.observation``;
- **actions** are clipped to the actuators' control range (the action space), as the host
  loop's ``ClipAction`` does, so a Gaussian policy's raw samples can be stored.

Written here rather than taken from Brax because Brax's wrappers hide the final observation and
merge termination with truncation, which kitae's correctness rules forbid.

The backend is Brax's physics pipeline: ``generalized`` by default (Brax's own default for its
MuJoCo-model environments, and with ``spring`` the quickest to compile on a CPU here: docs/brax.md
has the measurements); ``positional``, ``spring`` and ``mjx`` can be asked for.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from kitae.envs.jax_env import JaxTimeStep
from kitae.envs.options import LIBRARY_REFUSALS, check_options, constructor_options, refused
from kitae.validation import check_positive_int, closest_names

DEFAULT_BACKEND = "generalized"
BACKENDS = ("generalized", "positional", "spring", "mjx")
DEFAULT_EPISODE_LENGTH = 1000


@struct.dataclass
class BraxParams:
    """Parameters of a ``BraxEnv`` (a pytree: ``episode_length`` is a leaf, so a jitted ``step``
    takes other lengths without compiling again).

    Attributes:
        episode_length: int scalar, steps after which an episode is truncated (>= 1).
    """

    episode_length: int = DEFAULT_EPISODE_LENGTH


@struct.dataclass
class BraxEnvState:
    """The state of one ``BraxEnv``.

    Attributes:
        brax_state: Brax's ``State`` (pipeline state, obs, reward, done, metrics, info).
        time: int32 scalar, steps taken in the running episode.
    """

    brax_state: Any
    time: jax.Array


def _import_brax_envs() -> Any:
    try:
        # mujoco's MJX (imported by brax) prints "Failed to import warp" when the optional NVIDIA
        # Warp is absent; kitae does not use it, so keep that line out of the user's output.
        with contextlib.redirect_stdout(io.StringIO()):
            from brax import envs
    except ImportError as error:
        raise ImportError(
            f"Brax environments need the brax package ({error}); install it with pip install 'kitae[brax]'"
        ) from None
    return envs


def brax_env_names() -> list[str]:
    """The names Brax's registry knows (``brax.envs.get_environment`` accepts them), sorted."""
    envs = _import_brax_envs()
    return sorted(envs._envs)  # Brax has no public listing; its registry dict is the source of truth


class BraxEnv:
    """A Brax environment as a kitae ``JaxEnv``.

    Args:
        name: a Brax registry name, e.g. ``"inverted_pendulum"``, ``"ant"`` (``brax_env_names()``).
        backend: Brax's physics pipeline: one of ``BACKENDS`` (default ``"generalized"``).
        episode_length: the default ``params.episode_length`` (time limit, >= 1).
        **env_kwargs: passed to the Brax environment's constructor: the named parameters of its
            class's ``__init__`` and of its bases' (``constructor_options``), e.g. ``ant``'s
            ``ctrl_cost_weight``, each of its default's type.

    Attributes:
        observation_space: ``Box(-inf, inf, (observation_size,), float32)``.
        action_space: ``Box(low, high, (action_size,), float32)`` from the actuators' control range.
        default_params: ``BraxParams(episode_length)``.

    Raises:
        ValueError: for an unknown name (listing the known ones), backend or episode length, an
            option the environment does not take (listing those it takes), or options its
            constructor refuses (with Brax's message).
        TypeError: for an option whose value has another type than its default.
    """

    def __init__(
        self, name: str, backend: str = DEFAULT_BACKEND, episode_length: int = DEFAULT_EPISODE_LENGTH, **env_kwargs: Any
    ) -> None:
        envs = _import_brax_envs()
        names = brax_env_names()
        if name not in names:
            raise ValueError(
                f"unknown Brax environment {name!r}{closest_names(name, names)}; available: {', '.join(names)}"
            )
        # named as the user gives them, in env_cfg.env_kwargs (--set env_kwargs.backend=...)
        if backend not in BACKENDS:
            raise ValueError(f"env_kwargs.backend={backend!r} is not allowed; allowed: {', '.join(BACKENDS)}")
        check_positive_int("env_kwargs.episode_length", episode_length)
        # Brax's registry holds the classes (get_environment calls them): their options are known
        # before the (slow) loading of the system, and so are refused before it
        learned = constructor_options(envs._envs[name])
        options = {**learned, "episode_length": DEFAULT_EPISODE_LENGTH} if learned else {}
        check_options(env_kwargs, options, f"Brax's {name!r}")
        if "n_frames" in env_kwargs:  # Brax takes 0 (a system that never moves: dt 0) or less
            check_positive_int("env_kwargs.n_frames", env_kwargs["n_frames"])
        self.name = name
        self.backend = backend
        with warnings.catch_warnings():
            # Brax's notice that it is unmaintained (in favour of MJX), raised each time a system
            # is loaded: docs/brax.md says it once; printed on every run, it says nothing the
            # user can act on.
            warnings.filterwarnings("ignore", message="Brax System, piplines and environments are not actively")
            try:
                self.env = envs.get_environment(name, backend=backend, **env_kwargs)
            except LIBRARY_REFUSALS as error:
                if not env_kwargs:
                    raise
                raise refused(env_kwargs, f"Brax's {name!r}", error) from error
        self.default_params = BraxParams(episode_length=episode_length)
        # Brax's observation_size runs a reset op by op (seconds); the shape alone is enough
        obs_shape = jax.eval_shape(self.env.reset, jax.random.PRNGKey(0)).obs
        if not hasattr(obs_shape, "shape") or len(obs_shape.shape) != 1:
            raise ValueError(f"Brax environment {name!r} has observations {obs_shape!r}; allowed: one flat vector")
        n_obs = int(obs_shape.shape[0])
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (n_obs,), np.float32)
        low, high = _control_range(self.env)
        self.action_space = gym.spaces.Box(low, high, low.shape, np.float32)
        self._low, self._high = low, high
        self._renderer: Any = None
        self._data: Any = None

    def reset(self, key: jax.Array, params: BraxParams) -> tuple[jax.Array, BraxEnvState]:
        """A fresh episode: ``(observation (obs_size,), state)``."""
        brax_state = self.env.reset(key)
        return brax_state.obs, BraxEnvState(brax_state=brax_state, time=jnp.zeros((), jnp.int32))

    def step(self, key: jax.Array, state: BraxEnvState, action: jax.Array, params: BraxParams) -> JaxTimeStep:
        """One step; an episode that ended is reset from ``key`` (see the module docstring).

        Args:
            key: a PRNG key (a raw ``(2,)`` uint32 key), the reset's (Brax's physics takes none).
            state: the ``BraxEnvState`` of one environment.
            action: ``(action_size,)``, clipped to the control range.
            params: the ``BraxParams`` (its ``episode_length``).

        Returns:
            A ``JaxTimeStep`` of one environment: ``observation`` (the new episode's where one
            ended) and ``next_observation`` ``(obs_size,)``, ``reward`` a float32 scalar,
            ``terminated`` and ``truncated`` bool scalars.
        """
        ts = self.step_without_reset(key, state, action, params)
        ended = jnp.logical_or(jnp.asarray(ts.terminated), jnp.asarray(ts.truncated))  # arrays: one agent
        reset_obs, reset_state = self.reset(key, params)
        chosen = jax.tree_util.tree_map(
            lambda fresh, old: jnp.where(ended, fresh, old), reset_state.brax_state, ts.state.brax_state
        )
        return ts._replace(
            observation=jnp.where(ended, reset_obs, ts.next_observation),
            state=BraxEnvState(brax_state=chosen, time=jnp.where(ended, 0, ts.state.time).astype(jnp.int32)),
        )

    def step_without_reset(
        self, key: jax.Array, state: BraxEnvState, action: jax.Array, params: BraxParams
    ) -> JaxTimeStep:
        """One step that keeps the state it reaches, even when the episode ends there (``step``
        resets it from ``key``; Brax's physics takes no key, so this one is unused): what a video
        draws. ``observation`` and ``next_observation`` are both the observation reached
        (``(obs_size,)``); ``state.time`` counts the step."""
        action = jnp.clip(jnp.asarray(action, jnp.float32), self._low, self._high)
        stepped = self.env.step(state.brax_state, action)
        time = state.time + 1
        terminated = jnp.asarray(stepped.done, jnp.float32) > 0.5
        truncated = jnp.logical_and(time >= params.episode_length, jnp.logical_not(terminated))
        return JaxTimeStep(
            observation=stepped.obs,
            state=BraxEnvState(brax_state=stepped, time=time.astype(jnp.int32)),
            reward=jnp.asarray(stepped.reward, jnp.float32),
            terminated=terminated,
            truncated=truncated,
            next_observation=stepped.obs,
        )

    @property
    def render_fps(self) -> float:
        """Steps per second of simulated time (``1 / dt``): the frame rate of a video of it."""
        return round(1.0 / float(self.env.dt), 3)  # dt is a float32: 1 / 0.05 gives 20.000001

    def render(self, state: BraxEnvState, width: int = 320, height: int = 240) -> np.ndarray:
        """``(height, width, 3)`` uint8: ``state`` (one environment's, not a batch) drawn by MuJoCo
        from the system's model, through Gymnasium's off-screen ``MujocoRenderer`` (its ``track``
        camera where the model has one, else a free camera).

        Gymnasium's renderer rather than ``brax.io.image``: ``mujoco.Renderer``, which Brax's
        uses, takes its OpenGL backend from ``MUJOCO_GL`` once, when ``mujoco`` is imported (by
        Brax, before kitae could choose one on a machine without a display:
        ``kitae.envs.make.render_offscreen``); Gymnasium's reads it when the renderer is made.
        """
        import mujoco
        from gymnasium.envs.mujoco.mujoco_rendering import MujocoRenderer

        model = getattr(self.env.sys, "mj_model", None)
        if model is None:
            raise ValueError(f"Brax environment {self.name!r} ({self.backend}) has no MuJoCo model to draw")
        if self._renderer is None or (self._renderer.width, self._renderer.height) != (width, height):
            self.close()
            self._data = mujoco.MjData(model)
            self._renderer = MujocoRenderer(model, self._data, width=width, height=height)
        pipeline = state.brax_state.pipeline_state
        self._data.qpos[:], self._data.qvel[:] = np.asarray(pipeline.q), np.asarray(pipeline.qd)
        if model.nmocap and hasattr(pipeline, "mocap_pos"):
            self._data.mocap_pos[:], self._data.mocap_quat[:] = pipeline.mocap_pos, pipeline.mocap_quat
        mujoco.mj_forward(model, self._data)
        return np.array(self._renderer.render("rgb_array"))

    def close(self) -> None:
        """Frees the renderer's OpenGL context (``render`` makes a new one when called again)."""
        if self._renderer is not None:
            self._renderer.close()
        self._renderer = None

    def __repr__(self) -> str:
        return f"BraxEnv({self.name!r}, backend={self.backend!r})"


def _control_range(env: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(low, high)`` float32 ``(action_size,)``: the actuators' ``ctrl_range`` (as Brax's own
    Gym wrapper reports it), or ``[-1, 1]`` where the system has none."""
    size = int(env.action_size)
    ctrl_range = getattr(getattr(getattr(env, "sys", None), "actuator", None), "ctrl_range", None)
    if ctrl_range is None:
        return -np.ones(size, np.float32), np.ones(size, np.float32)
    ctrl_range = np.asarray(ctrl_range, np.float32).reshape(size, 2)
    return ctrl_range[:, 0].copy(), ctrl_range[:, 1].copy()
