"""Making environments from ids.

Ids are ``SOURCE:ID``; SOURCE is one of ``gymnasium`` (the default when there is no prefix),
``gymnax``, ``envpool``, ``pettingzoo``, ``brax``, ``jaxmarl``. This module builds the host-loop
sources; JAX sources run in the compiled loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

SOURCES = ("gymnasium", "gymnax", "envpool", "pettingzoo", "brax", "jaxmarl")
HOST_SOURCES = ("gymnasium", "envpool")


def parse_env_id(env_id: str) -> tuple[str, str]:
    """Splits ``"SOURCE:ID"`` into ``(source, id)``; no prefix means ``gymnasium``.

    Raises:
        ValueError: for an unknown source or an empty id.
    """
    if not isinstance(env_id, str) or not env_id.strip():
        raise ValueError(f"env_id={env_id!r} is not allowed; allowed: 'SOURCE:ID' with SOURCE in {SOURCES}")
    source, sep, name = env_id.partition(":")
    if not sep:
        source, name = "gymnasium", env_id
    if source not in SOURCES:
        raise ValueError(f"unknown environment source {source!r} in {env_id!r}; allowed sources: {', '.join(SOURCES)}")
    if not name:
        raise ValueError(f"env_id={env_id!r} has no environment name after {source!r}:")
    return source, name


def stack_frames(env: gym.Env, frame_stack: int) -> gym.Env:
    """``FrameStackObservation(env, frame_stack)`` with the stack axis moved last.

    Observations ``(*S)`` become ``(*S, frame_stack)`` for ``S = (H, W)`` or ``(D,)``, and
    ``(H, W, C * frame_stack)`` for ``S = (H, W, C)`` (frames in order, oldest first; the channels
    of frame ``i`` at ``i * C .. (i + 1) * C - 1``). The first observation of an episode fills the
    stack (``padding_type="reset"``), as Atari frame stacking does.

    Raises:
        ValueError: for observation spaces other than ``Box`` of 1 to 3 dims.
    """
    space = env.observation_space
    if not isinstance(space, gym.spaces.Box) or not 1 <= len(space.shape) <= 3:
        raise ValueError(f"frame_stack needs a Box observation space of 1 to 3 dims; got {space}")
    env = gym.wrappers.FrameStackObservation(env, frame_stack, padding_type="reset")
    rank = len(space.shape)

    def last(x: np.ndarray) -> np.ndarray:
        if rank == 3:  # (k, H, W, C) -> (H, W, k, C) -> (H, W, k * C): each frame's channels together
            x = np.moveaxis(np.asarray(x), 0, 2)
            return np.ascontiguousarray(x).reshape(*x.shape[:2], -1)
        return np.ascontiguousarray(np.moveaxis(np.asarray(x), 0, -1))  # (k, *S) -> (*S, k)

    def last_of_space(box: gym.spaces.Box) -> gym.spaces.Box:
        return gym.spaces.Box(last(box.low), last(box.high), dtype=box.dtype)

    return gym.wrappers.TransformObservation(env, last, last_of_space(env.observation_space))


def _gymnasium_thunk(name: str, index: int, capture_video: bool, video_dir: Path | None,
                     env_kwargs: dict[str, Any], frame_stack: int | None = None) -> Callable[[], gym.Env]:
    def thunk() -> gym.Env:
        if capture_video and index == 0:
            env = gym.make(name, render_mode="rgb_array", **env_kwargs)
            env = gym.wrappers.RecordVideo(env, str(video_dir), disable_logger=True)
        else:
            env = gym.make(name, **env_kwargs)
        if frame_stack is not None and frame_stack > 1:
            env = stack_frames(env, frame_stack)
        return env

    return thunk


def make_vec_env(
    env_id: str,
    n_envs: int,
    capture_video: bool = False,
    run_name: str | None = None,
    *,
    vectorization_mode: str = "sync",
    env_kwargs: dict[str, Any] | None = None,
    frame_stack: int | None = None,
    seed: int = 0,
) -> gym.vector.VectorEnv:
    """Makes a Gymnasium vector environment that kitae's host loop can train in.

    The environments reset in ``AutoresetMode.SAME_STEP`` (the real final observation of each
    episode is in ``infos["final_obs"]``). Continuous (``Box``)
    actions are clipped to the action space's bounds before they reach the environment, so a
    Gaussian policy's raw samples can be stored for its log-probabilities.

    ``envpool:ID`` ids give a ``kitae.envs.envpool_env.EnvPoolVectorEnv`` (EnvPool's pool with the
    same semantics; Atari tasks get 84x84 grayscale frames stacked 4 deep, laid out ``(84, 84, 4)``
    uint8, episodic life and clipped rewards unless ``env_kwargs`` says otherwise).

    Args:
        env_id: ``"CartPole-v1"``, ``"gymnasium:CartPole-v1"`` or ``"envpool:Pong-v5"``.
        n_envs: number of environments (>= 1).
        capture_video: record videos of environment 0 to ``runs/<run_name>/videos``.
        run_name: the run's name (needed with ``capture_video``).
        vectorization_mode: ``"sync"`` (one process, fastest for cheap environments) or
            ``"async"`` (one process per environment).
        env_kwargs: keyword arguments for ``gymnasium.make``, or EnvPool options
            (``envpool.make_spec(ID).config``) for ``envpool:`` ids.
        frame_stack: Gymnasium ids only: stack the last ``frame_stack`` observations
            (``FrameStackObservation``) with the stack axis last, so images ``(H, W)`` become
            ``(H, W, frame_stack)`` and ``(H, W, C)`` become ``(H, W, C * frame_stack)`` (what
            ``NatureCNN`` reads); ``None`` or 1: no stacking. EnvPool stacks frames itself
            (``env_kwargs={"stack_num": k}``).
        seed: EnvPool ids only: the seed the pool is made with (``reset(seed=...)`` remakes it
            with another).

    Returns:
        A ``gymnasium.vector.VectorEnv`` with ``num_envs == n_envs``; ``single_observation_space``
        and ``single_action_space`` are what ``EnvConfig`` wants.
    """
    source, name = parse_env_id(env_id)
    if source not in HOST_SOURCES:
        raise ValueError(
            f"make_vec_env builds host-loop environments ({', '.join(HOST_SOURCES)}); "
            f"{env_id!r} comes from {source!r}"
        )
    if not isinstance(n_envs, int) or isinstance(n_envs, bool) or n_envs < 1:
        raise ValueError(f"n_envs={n_envs!r} is not allowed; allowed: an int >= 1")
    if vectorization_mode not in ("sync", "async"):
        raise ValueError(f"vectorization_mode={vectorization_mode!r} is not allowed; allowed: 'sync', 'async'")
    if capture_video and not run_name:
        raise ValueError("capture_video=True needs a run_name: videos go to runs/<run_name>/videos")
    if frame_stack is not None and (not isinstance(frame_stack, int) or isinstance(frame_stack, bool)
                                    or frame_stack < 1):
        raise ValueError(f"frame_stack={frame_stack!r} is not allowed; allowed: None or an int >= 1")
    if source == "envpool":
        if capture_video:
            raise ValueError("capture_video=True is not available for envpool: ids; allowed: capture_video=False")
        if frame_stack not in (None, 1):
            raise ValueError(
                f"frame_stack={frame_stack!r} is not allowed for envpool: ids; EnvPool stacks frames itself: "
                "pass env_kwargs={'stack_num': k}"
            )
        from kitae.envs.envpool_env import make_envpool_env

        return make_envpool_env(name, n_envs, seed=seed, env_kwargs=env_kwargs)
    if name not in gym.registry:
        raise ValueError(f"unknown Gymnasium environment {name!r}; see gymnasium.pprint_registry() for the ids")
    video_dir = Path("runs") / run_name / "videos" if capture_video else None
    thunks = [_gymnasium_thunk(name, i, capture_video, video_dir, dict(env_kwargs or {}), frame_stack)
              for i in range(n_envs)]
    vector_cls = gym.vector.SyncVectorEnv if vectorization_mode == "sync" else gym.vector.AsyncVectorEnv
    env = vector_cls(thunks, autoreset_mode=AutoresetMode.SAME_STEP)
    if isinstance(env.single_action_space, gym.spaces.Box):
        single_space, batched_space = env.single_action_space, env.action_space
        env = gym.wrappers.vector.ClipAction(env)
        # ClipAction reports Box(-inf, inf); keep the real bounds for agents that scale their actions
        env.single_action_space, env.action_space = single_space, batched_space
    return env
