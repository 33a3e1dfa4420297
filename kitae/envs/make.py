"""Making environments from ids: the one place an environment id is read.

Ids are ``SOURCE:ID``; SOURCE is one of ``gymnasium`` (the default when there is no prefix),
``gymnax``, ``envpool``, ``pettingzoo``, ``brax``, ``jaxmarl``. ``EnvSpec.parse(env_id)`` reads an
id once; ``make_env(spec, n_envs)`` builds it: a Gymnasium-style vector environment for the host
sources (``make_vec_env``), a ``kitae.envs.jax_env.VecJaxEnv`` for the JAX sources
(``make_jax_env``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from kitae.envs import goals, memory
from kitae.envs.options import LIBRARY_REFUSALS, refused
from kitae.envs.wrappers import tuple_as_dict
from kitae.validation import check_positive_int, closest_names

SOURCES = ("gymnasium", "gymnax", "envpool", "pettingzoo", "brax", "jaxmarl")
HOST_SOURCES = ("gymnasium", "envpool", "pettingzoo")
"""Sources whose environments are Python objects (stepped by the host loop)."""
JAX_SOURCES = ("gymnax", "brax", "jaxmarl")
"""Sources whose environments are written in JAX (stepped inside the compiled loop)."""


def parse_env_id(env_id: str) -> tuple[str, str]:
    """Splits ``"SOURCE:ID"`` into ``(source, id)``; no prefix means ``gymnasium``.

    Raises:
        ValueError: for an unknown source or an empty id.
    """
    if not isinstance(env_id, str) or not env_id.strip():
        raise ValueError(
            f"env_id={env_id!r} is not allowed; allowed: 'SOURCE:ID' with SOURCE one of {', '.join(SOURCES)} "
            "(none: gymnasium)"
        )
    source, sep, name = env_id.partition(":")
    if not sep:
        source, name = "gymnasium", env_id
    if source not in SOURCES:
        raise ValueError(
            f"unknown environment source {source!r} in {env_id!r}{closest_names(source, SOURCES)}; "
            f"allowed sources: {', '.join(SOURCES)}"
        )
    if not name:
        raise ValueError(
            f"env_id={env_id!r} has no environment name after {source!r}:; allowed: '{source}:NAME' (a NAME the "
            "source does not know is answered with the names it has)"
        )
    return source, name


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """An environment id, read once, and the keyword arguments its environments are made with.

    Attributes:
        source: one of ``SOURCES``.
        name: the id within its source, e.g. ``"CartPole-v1"``.
        kwargs: ``((name, value), ...)``: keyword arguments of the environment's constructor
            (``EnvConfig.env_kwargs``: ``gymnasium.make``'s, a PettingZoo module's
            ``parallel_env``'s, EnvPool's options, ``gymnax.make``'s, ``BraxEnv``'s, JaxMARL's),
            given to every environment made from this spec; sorted, so that equal specs are equal.
    """

    source: str
    name: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    def with_kwargs(self, kwargs: dict[str, Any] | None) -> EnvSpec:
        """This spec with ``kwargs`` (``EnvConfig.env_kwargs``) in place of its own."""
        return dataclasses.replace(self, kwargs=tuple(sorted((kwargs or {}).items())))

    @property
    def env_kwargs(self) -> dict[str, Any]:
        """``kwargs`` as a dict."""
        return dict(self.kwargs)

    def __hash__(self) -> int:  # a value may be a list (plain YAML data): hashed by its text
        return hash((self.source, self.name, repr(self.kwargs)))

    @classmethod
    def parse(cls, env_id: str | EnvSpec) -> EnvSpec:
        """``EnvSpec.parse("gymnax:CartPole-v1")``; an ``EnvSpec`` is returned as it is.

        Raises:
            ValueError: for an unknown source or an empty id.
        """
        if isinstance(env_id, EnvSpec):
            return env_id
        return cls(*parse_env_id(env_id))

    @property
    def id(self) -> str:
        """The normalised id ``"SOURCE:ID"`` (what run directories record)."""
        return f"{self.source}:{self.name}"

    @property
    def is_jax(self) -> bool:
        """Whether the environment is written in JAX (a ``VecJaxEnv``, for the compiled loop)."""
        return self.source in JAX_SOURCES

    def __str__(self) -> str:
        return self.id


def make_env(spec: str | EnvSpec, n_envs: int) -> Any:
    """``n_envs`` copies of the environment ``spec`` names, made with its ``kwargs``:
    ``make_jax_env`` for JAX sources, ``make_vec_env`` for the others."""
    spec = EnvSpec.parse(spec)
    if spec.is_jax:
        return make_jax_env(spec, n_envs)
    return make_vec_env(spec, n_envs)


def make_jax_env(env_id: str | EnvSpec, n_envs: int, **env_kwargs: Any) -> Any:
    """Makes ``n_envs`` copies of a JAX environment from an id ``"gymnax:CartPole-v1"``: a
    ``kitae.envs.jax_env.VecJaxEnv``.

    ``"gymnax:CartPoleNoVel-v1"`` is kitae's CartPole without velocities (``kitae.envs.memory``),
    ``"gymnax:BitFlipping-v0"`` kitae's bit flipping (``kitae.envs.goals``, ``n_bits`` in ``env_kwargs``);
    ``"brax:inverted_pendulum"`` builds a ``kitae.envs.brax_env.BraxEnv`` (``env_kwargs``:
    ``backend``, ``episode_length`` and the Brax environment's own arguments);
    ``"jaxmarl:MPE_simple_spread_v3"`` a ``kitae.envs.jaxmarl_env.VecJaxMARLEnv``. ``env_kwargs``
    go over those of an ``EnvSpec`` ``env_id``.

    Raises:
        ValueError: for an id whose source is not a JAX source.
        ImportError: for a source whose optional extra is not installed.
    """
    from kitae.envs.jax_env import GymnaxEnv, VecJaxEnv, check_gymnax_id

    spec = EnvSpec.parse(env_id)
    env_kwargs = {**spec.env_kwargs, **env_kwargs}
    if spec.source == "gymnax":
        check_gymnax_id(spec.name, also=(memory.NAME, goals.NAME))
    if spec.source == "gymnax" and spec.name == memory.NAME:  # kitae's CartPole without velocities
        return VecJaxEnv(memory.gymnax_cartpole_no_velocity(**env_kwargs), n_envs)
    if spec.source == "gymnax" and spec.name == goals.NAME:  # kitae's bit flipping, in JAX
        return VecJaxEnv(goals.JaxBitFlipping(**env_kwargs), n_envs)
    if spec.source == "gymnax":
        return VecJaxEnv(GymnaxEnv(spec.name, **env_kwargs), n_envs)
    if spec.source == "brax":
        from kitae.envs.brax_env import BraxEnv

        return VecJaxEnv(BraxEnv(spec.name, **env_kwargs), n_envs)
    if spec.source == "jaxmarl":  # multi-agent
        from kitae.envs.jaxmarl_env import make_jaxmarl_env

        return make_jaxmarl_env(spec.name, n_envs, **env_kwargs)
    raise ValueError(
        f"{spec.id!r} is not a JAX environment kitae can build; JAX sources here: {', '.join(JAX_SOURCES)}"
    )


OFFSCREEN_MODES = ("rgb_array", "depth_array")
"""Gymnasium render modes that return frames (``rgb_array``, ``rgb_array_list``, ...): no window,
so ``make_vec_env`` makes such environments after ``render_offscreen``. ``"human"`` opens a window
and is left as it is."""
EXTRA_OF_PACKAGE = {"Box2D": "box2d", "MuJoCo": "mujoco"}
"""kitae's extra for a package named in Gymnasium's ``DependencyNotInstalled`` message."""


def render_offscreen() -> None:
    """Lets pygame, Gymnasium's renderer for ``rgb_array`` frames, draw without a display or a
    sound card: SDL's ``dummy`` video and audio drivers, unless the process already names others;
    and MuJoCo's renderer draw without a display: ``MUJOCO_GL`` set to ``offscreen_gl()`` on a
    Linux machine with no ``DISPLAY`` (or ``WAYLAND_DISPLAY``), unless the process names one.

    Without them, on a headless machine pygame's start prints a dozen ALSA and
    ``XDG_RUNTIME_DIR`` errors to stderr, for frames it renders off-screen anyway. Called before a
    rendering environment is made (videos, ``render_mode="rgb_array"``); it sets process
    environment variables (``setdefault``: a user's own choice is kept).
    """
    import os
    import sys

    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        # MuJoCo (Gymnasium's MuJoCo environments, Brax's models) draws through OpenGL, by
        # default through GLFW, which needs a display: without one the first frame fails with
        # "an OpenGL platform library has not been loaded". EGL (Mesa's, in software where there
        # is no GPU) and OSMesa draw off screen; Gymnasium reads the choice when it draws.
        backend = offscreen_gl()
        if backend is not None:
            os.environ.setdefault("MUJOCO_GL", backend)


def offscreen_gl() -> str | None:
    """The ``MUJOCO_GL`` backend that draws without a display here: ``"egl"`` where the system
    has an EGL library, else ``"osmesa"`` where it has OSMesa, else ``None`` (left unset: a
    backend whose library is missing breaks ``import mujoco`` itself, not only drawing)."""
    import ctypes.util

    if ctypes.util.find_library("EGL") is not None:
        return "egl"
    if ctypes.util.find_library("OSMesa") is not None:
        return "osmesa"
    return None


def _atari_hint(name: str) -> str:
    """For a Gymnasium Atari id (``ALE/Pong-v5``, ``PongNoFrameskip-v4``; ale-py is not a kitae
    dependency): the EnvPool id that trains the game here, with Atari's usual preprocessing."""
    import re

    match = re.fullmatch(r"(?:ALE/)?([A-Z][A-Za-z]*?)(?:NoFrameskip)?-v[0-9]+", name)
    if match is None or not (name.startswith("ALE/") or "NoFrameskip" in name):
        return ""
    return f"; Atari games train through EnvPool here: envpool:{match.group(1)}-v5 (pip install 'kitae[envpool]')"


def _gymnasium_thunk(
    name: str,
    index: int,
    capture_video: bool,
    video_dir: Path | None,
    env_kwargs: dict[str, Any],
    wrap: Callable[[gym.Env], gym.Env] | None = None,
) -> Callable[[], gym.Env]:
    def thunk() -> gym.Env:
        if (capture_video and index == 0) or str(env_kwargs.get("render_mode")).startswith(OFFSCREEN_MODES):
            render_offscreen()  # in the process that makes the environment (a worker, with async)
        try:
            if capture_video and index == 0:
                env = gym.make(name, render_mode="rgb_array", **env_kwargs)
                env = gym.wrappers.RecordVideo(env, str(video_dir), disable_logger=True)
            else:
                env = gym.make(name, **env_kwargs)
        except gym.error.DependencyNotInstalled as error:  # Box2D, MuJoCo, ALE...: an ImportError to the runs layer
            extra = next((e for k, e in EXTRA_OF_PACKAGE.items() if k in str(error)), None)
            hint = f" (kitae's {extra} extra: pip install 'kitae[{extra}]')" if extra else ""
            raise ImportError(f"gymnasium:{name} needs a package that is not installed{hint}: {error}") from None
        except LIBRARY_REFUSALS as error:  # the constructor's words name neither env_kwargs nor the option
            if not env_kwargs:
                raise
            raise refused(env_kwargs, f"Gymnasium's {name!r}", error) from error
        return tuple_as_dict(env if wrap is None else wrap(env))  # Tuple observations read as Dict ones

    return thunk


def _wrap_fn(wrappers: tuple, n_frames: int) -> Callable[[gym.Env], gym.Env]:
    from kitae.envs.wrappers import frame_stack

    def wrap(env: gym.Env) -> gym.Env:
        for wrapper in wrappers:
            env = wrapper(env)
        return frame_stack(env, n_frames)

    return wrap


def make_vec_env(
    env_id: str | EnvSpec,
    n_envs: int,
    capture_video: bool = False,
    run_name: str | None = None,
    *,
    vectorization_mode: str = "sync",
    env_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
    frame_stack: int = 1,
    seed: int = 0,
) -> Any:
    """Makes a Gymnasium vector environment that kitae's host loop can train in.

    A ``pettingzoo:<module path>`` id (``pettingzoo:mpe2.simple_spread_v3``, see
    ``kitae.envs.pettingzoo_envs``) gives ``n_envs`` copies of the PettingZoo ``ParallelEnv``
    instead, as a ``kitae.envs.parallel.VecParallelEnv`` (``"sync"``: ``SyncVecParallelEnv``,
    ``"async"``: ``SubProcVecParallelEnv``) with dicts keyed by agent; its ``num_agents`` is
    ``EnvConfig.n_agents``.

    The environments reset in ``AutoresetMode.SAME_STEP`` (the real final observation of each
    episode is in ``infos["final_obs"]``). Continuous (``Box``)
    actions are clipped to the action space's bounds before they reach the environment, so a
    Gaussian policy's raw samples can be stored for its log-probabilities.

    ``envpool:ID`` ids give a ``kitae.envs.envpool_env.EnvPoolVectorEnv`` (EnvPool's pool with the
    same semantics; Atari tasks get 84x84 grayscale frames stacked 4 deep, laid out ``(84, 84, 4)``
    uint8, episodic life and clipped rewards unless ``env_kwargs`` says otherwise).

    Args:
        env_id: ``"CartPole-v1"``, ``"gymnasium:CartPole-v1"``, ``"envpool:Pong-v5"`` or
            ``"pettingzoo:mpe2.simple_spread_v3"``.
        n_envs: number of environments (>= 1).
        capture_video: record videos of environment 0 to ``runs/<run_name>/videos``.
        run_name: the run's name (needed with ``capture_video``).
        vectorization_mode: ``"sync"`` (one process, fastest for cheap environments) or
            ``"async"`` (one process per environment).
        env_kwargs: keyword arguments for ``gymnasium.make`` (for PettingZoo, for the module's
            ``parallel_env``, e.g. ``{"continuous_actions": True}``; for ``envpool:`` ids, EnvPool
            options, ``envpool.make_spec(ID).config``), over those of an ``EnvSpec`` ``env_id``.
        wrappers: callables ``env -> env`` applied in order to each sub-environment, e.g.
            ``[kitae.envs.wrappers.ActionMaskObservation]`` for ``Taxi-v4``'s action masks.
        frame_stack: stack this many frames per observation, channels-last
            (``kitae.envs.wrappers.frame_stack``: ``(H, W, C)`` -> ``(H, W, n * C)``), after
            ``wrappers``; 1 (the default) stacks nothing. Gymnasium ids only (EnvPool stacks frames
            itself: ``env_kwargs={"stack_num": k}``).
        seed: EnvPool ids only: the seed the pool is made with (``reset(seed=...)`` remakes it
            with another).

    Returns:
        A ``gymnasium.vector.VectorEnv`` with ``num_envs == n_envs``; ``single_observation_space``
        and ``single_action_space`` are what ``EnvConfig`` wants.
    """
    spec = EnvSpec.parse(env_id)
    source, name = spec.source, spec.name
    env_kwargs = {**spec.env_kwargs, **(env_kwargs or {})}
    if source not in HOST_SOURCES:
        raise ValueError(
            f"make_vec_env builds host-loop environments ({', '.join(HOST_SOURCES)}); {spec.id!r} comes from "
            f"{source!r}: make_jax_env({spec.id!r}, n_envs) builds it for the compiled loop"
        )
    check_positive_int("n_envs", n_envs)
    if vectorization_mode not in ("sync", "async"):
        raise ValueError(f"vectorization_mode={vectorization_mode!r} is not allowed; allowed: 'sync', 'async'")
    if capture_video and not run_name:
        raise ValueError("capture_video=True needs a run_name: videos go to runs/<run_name>/videos")
    if source == "pettingzoo":
        if capture_video:
            raise ValueError(f"capture_video=True is not available for PettingZoo environments ({spec.id!r})")
        if tuple(wrappers) or frame_stack != 1:
            raise ValueError(f"wrappers and frame_stack are for Gymnasium ids, not PettingZoo ones ({spec.id!r})")
        from kitae.envs.pettingzoo_envs import make_parallel_vec_env

        return make_parallel_vec_env(name, n_envs, vectorization_mode=vectorization_mode, env_kwargs=env_kwargs)
    if source == "envpool":
        if capture_video:
            raise ValueError("capture_video=True is not available for envpool: ids; allowed: capture_video=False")
        if frame_stack != 1 or tuple(wrappers):
            raise ValueError(
                f"frame_stack={frame_stack!r} and wrappers are not allowed for envpool: ids; EnvPool stacks "
                "frames itself: pass env_kwargs={'stack_num': k}"
            )
        from kitae.envs.envpool_env import make_envpool_env

        return make_envpool_env(name, n_envs, seed=seed, env_kwargs=env_kwargs)
    if name not in gym.registry:
        hint = _atari_hint(name) or closest_names(name, gym.registry)
        raise ValueError(
            f"unknown Gymnasium environment {name!r}{hint} (gymnasium.pprint_registry() lists the ids; an id your "
            "own module registers needs that module imported first: kitae's --import MODULE)"
        )
    check_positive_int("frame_stack", frame_stack)
    wrappers = tuple(wrappers)
    for wrapper in wrappers:
        if not callable(wrapper):
            raise ValueError(f"wrappers contains {wrapper!r}; allowed: callables env -> env")
    wrap = _wrap_fn(wrappers, frame_stack) if wrappers or frame_stack > 1 else None
    video_dir = None
    if capture_video:
        assert run_name  # checked above
        video_dir = Path("runs") / run_name / "videos"
    thunks = [_gymnasium_thunk(name, i, capture_video, video_dir, dict(env_kwargs or {}), wrap) for i in range(n_envs)]
    vector_cls = gym.vector.SyncVectorEnv if vectorization_mode == "sync" else gym.vector.AsyncVectorEnv
    env: gym.vector.VectorEnv = vector_cls(thunks, autoreset_mode=AutoresetMode.SAME_STEP)
    if isinstance(env.single_action_space, gym.spaces.Box):
        single_space, batched_space = env.single_action_space, env.action_space
        env = gym.wrappers.vector.ClipAction(env)
        # ClipAction reports Box(-inf, inf); keep the real bounds for agents that scale their actions
        env.single_action_space, env.action_space = single_space, batched_space
    return env
