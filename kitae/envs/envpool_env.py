"""EnvPool environments (``envpool:ID``) as Gymnasium vector environments with kitae's semantics.

EnvPool (C++ environments stepped by a thread pool) resets a finished environment on the step
AFTER the one that ended its episode (``AutoresetMode.NEXT_STEP``: that step ignores its action
and returns the first observation of the next episode with reward 0). kitae's host loop wants
``AutoresetMode.SAME_STEP``: the step that ends an episode already returns the next episode's first
observation, with the real final one in ``infos["final_obs"]``, so that no transition pairs the
end of one episode with the start of the next. ``EnvPoolVectorEnv`` gives EnvPool these semantics:
after a step where some environments ended, it resets exactly those (``reset(env_ids)``, a partial
reset that EnvPool runs in sync mode) in the same call. Termination and truncation are EnvPool's
own (``terminated``, ``truncated``; e.g. CartPole-v1 truncates at 500 steps, Atari at 27 000
agent steps = 108 000 frames).

Images: EnvPool's Atari observations are channels-first ``(stack, H, W)`` uint8; kitae lays
images out channels-last (``NatureCNN`` takes ``(..., H, W, C)``), so the adapter transposes them
to ``(H, W, stack)`` (``channels_last=True``, the default). They stay uint8 (4x smaller buffers);
``NatureCNN`` scales integer images by 1/255.

Atari defaults (``ATARI_DEFAULTS``, applied to EnvPool's Atari tasks, each overridable through
``env_kwargs``): 84x84 grayscale frames, a stack of 4, frame skip 4 (max-pooled over the last two
frames), up to 30 no-op actions at reset, episodic life (losing a life ends the episode for the
agent, the game goes on) and rewards clipped to their sign: the settings of the usual PPO / DQN
Atari runs (CleanRL's ``ppo_atari_envpool``, rl-zoo's ``AtariWrapper``). With episodic life, the
returns that the loop records are per life; with reward clipping, clipped. Evaluation
(``evaluation_kwargs``) turns both off, so ``kitae eval`` reports real game scores.

Seeds: EnvPool fixes its seeds when the pool is made (environment ``i`` gets ``seed + i``);
``reset(seed=s)`` on a pool that was made with another seed or has already run rebuilds the pool
with seed ``s``, so one seed decides the run.
"""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from kitae.envs.options import check_options
from kitae.validation import check_positive_int, closest_names

ATARI_DEFAULTS: dict[str, Any] = {
    "img_height": 84,
    "img_width": 84,
    "gray_scale": True,
    "stack_num": 4,
    "frame_skip": 4,
    "noop_max": 30,
    "episodic_life": True,
    "reward_clip": True,
}
"""EnvPool options kitae uses for Atari tasks unless ``env_kwargs`` says otherwise."""

ATARI_EVALUATION: dict[str, Any] = {"episodic_life": False, "reward_clip": False}
"""What evaluation changes for Atari tasks: whole games, raw scores."""

_RESERVED = ("num_envs", "batch_size", "seed", "max_num_players", "base_path", "gym_reset_return_info")


def _envpool() -> Any:
    try:
        import envpool
    except ImportError:  # pragma: no cover - depends on the installation
        raise ImportError("envpool:ID environments need the envpool package: pip install 'kitae[envpool]'") from None
    return envpool


def envpool_ids() -> list[str]:
    """Every task id EnvPool knows (``"CartPole-v1"``, ``"Pong-v5"``, ...)."""
    return sorted(_envpool().list_all_envs())


def check_envpool_id(name: str) -> None:
    """Raises ``ValueError`` naming ``name`` and the closest EnvPool ids when EnvPool lacks it."""
    ids = envpool_ids()
    if name not in ids:
        hint = closest_names(name, ids, n=5)
        raise ValueError(
            f"unknown EnvPool environment {name!r}{hint} (envpool.list_all_envs() lists the {len(ids)} ids)"
        )


def _config(name: str) -> dict[str, Any]:
    """The options of ``name`` with their defaults (``envpool.make_spec(name).config``)."""
    return dict(_envpool().make_spec(name).config._asdict())


def _config_keys(name: str) -> set[str]:
    return set(_config(name))


def is_atari(name: str) -> bool:
    """Whether ``name`` is one of EnvPool's Atari tasks (its options include episodic life and
    frame stacking)."""
    return {"episodic_life", "stack_num", "noop_max"} <= _config_keys(name)


def default_kwargs(name: str) -> dict[str, Any]:
    """The EnvPool options kitae adds for ``name``: ``ATARI_DEFAULTS`` for Atari, else none."""
    return dict(ATARI_DEFAULTS) if is_atari(name) else {}


def evaluation_kwargs(name: str) -> dict[str, Any]:
    """Options for evaluating on ``name``: ``ATARI_EVALUATION`` for Atari (whole games, raw
    scores), else none. The observations keep their layout, so a trained agent reads them."""
    return dict(ATARI_EVALUATION) if is_atari(name) else {}


def _check_kwargs(name: str, kwargs: dict[str, Any]) -> None:
    reserved = sorted(set(kwargs) & set(_RESERVED))
    if reserved:
        raise ValueError(
            f"env_kwargs {reserved} are set by kitae (num_envs from n_envs, seed from the run's seed, "
            f"batch_size = num_envs, one player, EnvPool's own assets and reset infos); remove them"
        )
    options = {key: default for key, default in _config(name).items() if key not in _RESERVED}
    check_options(kwargs, options, f"EnvPool's {name!r}")


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """An EnvPool pool presented as a Gymnasium ``VectorEnv`` that resets in ``SAME_STEP`` mode.

    ``step(actions)`` with actions ``(E, ...)`` returns ``(obs, rewards, terminated, truncated,
    infos)``: ``obs`` ``(E, *obs_shape)`` (the first observation of the next episode where one
    ended), ``rewards`` ``(E,)`` float, ``terminated`` / ``truncated`` ``(E,)`` bool, and where an
    episode ended ``infos["final_obs"]`` ``(E, *obs_shape)`` with its real final observation and the
    mask ``infos["_final_obs"]`` ``(E,)`` bool; EnvPool's own infos (``env_id``, ``elapsed_step``,
    Atari's ``lives`` and unclipped ``reward``, ...) are passed on.

    Args:
        name: EnvPool task id (``"CartPole-v1"``, ``"Pong-v5"``).
        num_envs: number of environments (>= 1), stepped together (EnvPool's sync mode).
        seed: seed of environment 0 (environment ``i`` gets ``seed + i``).
        channels_last: lay 3-D channels-first image observations ``(C, H, W)`` out as
            ``(H, W, C)``.
        num_threads: EnvPool's worker threads (0: one per environment, up to the CPU count).
        env_kwargs: EnvPool options of the task (``envpool.make_spec(name).config``); for Atari
            they go over ``ATARI_DEFAULTS``.
        render_mode: ``None`` or ``"rgb_array"``: the pool draws frames (``EnvPoolEnv.render``).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(
        self,
        name: str,
        num_envs: int,
        seed: int = 0,
        *,
        channels_last: bool = True,
        num_threads: int = 0,
        env_kwargs: dict[str, Any] | None = None,
        render_mode: str | None = None,
    ) -> None:
        check_positive_int("num_envs", num_envs)
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed={seed!r} is not allowed; allowed: an int >= 0")
        if not isinstance(num_threads, int) or isinstance(num_threads, bool) or num_threads < 0:
            raise ValueError(f"num_threads={num_threads!r} is not allowed; allowed: an int >= 0")
        check_envpool_id(name)
        env_kwargs = dict(env_kwargs or {})
        _check_kwargs(name, env_kwargs)
        self.name = name
        self.num_envs = num_envs
        self.env_kwargs = {**default_kwargs(name), **env_kwargs}
        self.num_threads = num_threads
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode={render_mode!r} is not allowed; allowed: None or 'rgb_array'")
        self.render_mode = render_mode
        self._seed = int(seed)
        self._used = False
        self._pool = self._make_pool(self._seed)

        space = self._pool.observation_space
        self.single_action_space = self._pool.action_space
        self._transpose = bool(
            channels_last
            and isinstance(space, gym.spaces.Box)
            and len(space.shape) == 3
            and space.shape[0] < min(space.shape[1:])
        )
        if self._transpose:
            space = gym.spaces.Box(
                np.transpose(space.low, (1, 2, 0)), np.transpose(space.high, (1, 2, 0)), dtype=space.dtype
            )
        self.single_observation_space = space
        self.observation_space = gym.vector.utils.batch_space(space, num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, num_envs)
        self._action_dtype = self.single_action_space.dtype

    def _make_pool(self, seed: int) -> Any:
        # EnvPool's seed is a C++ int and environment i takes seed + i: larger seeds (kitae's resume
        # draws 32-bit ones) are folded into range, deterministically
        limit = 2**31 - self.num_envs
        with warnings.catch_warnings():  # EnvPool's float64 Box bounds: Gymnasium warns about float32
            warnings.filterwarnings("ignore", message=".*precision lowered by casting")
            pool = _envpool().make_gymnasium(
                self.name,
                num_envs=self.num_envs,
                batch_size=self.num_envs,
                seed=seed % limit,
                # env_kwargs' num_threads (--set env_kwargs.num_threads=N) over the argument's
                **{"num_threads": self.num_threads, **self.env_kwargs},
                **({"render_mode": self.render_mode} if self.render_mode else {}),
            )
            _ = pool.observation_space, pool.action_space  # made (and cached) here, where the warning is off
        return pool

    def _layout(self, obs: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.transpose(obs, (0, 2, 3, 1))) if self._transpose else np.asarray(obs)

    @property
    def seed_value(self) -> int:
        """The seed the pool was made with (environment ``i`` runs with ``seed_value + i``)."""
        return self._seed

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Resets every environment; returns ``(obs (E, *obs_shape), infos)``.

        ``seed``: rebuilds the pool with this seed unless it is fresh and already has it (EnvPool
        seeds a pool once, when it is made). ``options`` are not supported (``ValueError``)."""
        if options:
            raise ValueError(f"options={options!r} is not allowed; EnvPoolVectorEnv.reset takes none")
        if seed is not None:
            if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
                raise ValueError(f"seed={seed!r} is not allowed; allowed: an int >= 0 or None")
            if self._used or int(seed) != self._seed:
                self._pool.close()
                self._seed = int(seed)
                self._pool = self._make_pool(self._seed)
        self._used = True
        obs, infos = self._pool.reset()
        return self._layout(obs), dict(infos)

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        """One step of every environment, resetting those whose episode ended (see the class).

        Args:
            actions: ``(E, *action_shape)`` (``(E,)`` for a discrete space), one per environment.

        Returns:
            ``(obs (E, *obs_shape), rewards (E,), terminated (E,) bool, truncated (E,) bool,
            infos)``; where an episode ended, ``obs`` holds the next episode's first observation
            and ``infos["final_obs"]`` ``(E, *obs_shape)`` the final one (``infos["_final_obs"]``
            ``(E,)`` says where).

        Raises:
            ValueError: when ``actions`` does not have ``E`` rows.
        """
        self._used = True
        actions = np.asarray(actions, dtype=self._action_dtype)
        if actions.shape[:1] != (self.num_envs,):
            raise ValueError(
                f"actions of shape {actions.shape} are not allowed; allowed: shape ({self.num_envs}, ...) "
                "with one action per environment"
            )
        obs, rewards, terminated, truncated, infos = self._pool.step(actions)
        infos = dict(infos)
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        obs = self._layout(obs)
        ended = np.logical_or(terminated, truncated)
        if ended.any():
            env_ids = np.flatnonzero(ended).astype(np.int32)
            first_obs, reset_infos = self._pool.reset(env_ids)
            final_obs = obs
            obs = obs.copy()
            obs[np.asarray(reset_infos["env_id"])] = self._layout(first_obs)
            infos["final_obs"] = final_obs
            infos["_final_obs"] = ended
        return obs, np.asarray(rewards), terminated, truncated, infos

    def close_extras(self, **kwargs: Any) -> None:
        """Closes the pool (its threads stop)."""
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.close()
            self._pool = None


class EnvPoolEnv(gym.Env):
    """One EnvPool environment as a Gymnasium ``Env`` that draws its frames: what ``kitae eval
    --video`` plays (``kitae.loops.evaluate.play_episode``) for EnvPool's Atari ids.

    Observations are laid out as ``EnvPoolVectorEnv``'s (Atari: ``(84, 84, stack)`` uint8), so an
    agent trained on the vector environment acts on them. A step that ends the episode keeps the
    state it reached (the pool is stepped directly, without the vector environment's reset in the
    same step), so ``render()`` draws the last frame; call ``reset`` to start the next episode.

    Args:
        name: EnvPool task id (``"Pong-v5"``).
        env_kwargs: EnvPool options, over ``ATARI_DEFAULTS`` for Atari (``evaluation_kwargs``:
            whole games, raw scores).
        render_mode: ``"rgb_array"`` (``render()`` returns the screen, ``(210, 160, 3)`` uint8
            for Atari) or ``None``.

    Attributes:
        metadata: ``render_modes`` and ``render_fps``: Atari's 60 frames per second over its
            ``frame_skip`` (one frame per agent step, at the game's speed); 30 otherwise.
    """

    def __init__(
        self, name: str, *, env_kwargs: dict[str, Any] | None = None, render_mode: str | None = "rgb_array"
    ) -> None:
        self._vector = EnvPoolVectorEnv(name, 1, env_kwargs=env_kwargs, render_mode=render_mode)
        self.render_mode = render_mode
        self.observation_space = self._vector.single_observation_space
        self.action_space = self._vector.single_action_space
        frame_skip = int(self._vector.env_kwargs.get("frame_skip", 0)) if is_atari(name) else 0
        self.metadata = {"render_modes": ["rgb_array"], "render_fps": 60 / frame_skip if frame_skip else 30}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """A new episode (the pool made again with ``seed`` where it is given): ``(obs, info)``."""
        super().reset(seed=seed)
        obs, infos = self._vector.reset(seed=seed, options=options)
        return obs[0], _first(infos)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """``(obs, reward, terminated, truncated, info)`` of one step; the state is kept where the
        episode ends (EnvPool resets a finished environment at the step after)."""
        self._vector._used = True
        actions = np.asarray(action, dtype=self._vector._action_dtype)[None]
        obs, reward, terminated, truncated, infos = self._vector._pool.step(actions)
        return (
            self._vector._layout(obs)[0],
            float(np.asarray(reward)[0]),
            bool(np.asarray(terminated)[0]),
            bool(np.asarray(truncated)[0]),
            _first(infos),
        )

    def render(self) -> np.ndarray | None:
        """The environment's screen, ``(H, W, 3)`` uint8, or ``None`` without ``render_mode``."""
        if self.render_mode is None:
            return None
        return np.asarray(self._vector._pool.render())[0]

    def close(self) -> None:
        """Closes the pool."""
        self._vector.close()


def _first(infos: Any) -> dict:
    """EnvPool's batched infos, the first environment's values."""
    return {key: np.asarray(value)[0] for key, value in dict(infos).items() if np.ndim(value) >= 1}


def make_envpool_env(
    name: str, n_envs: int, *, seed: int = 0, env_kwargs: dict[str, Any] | None = None, channels_last: bool = True
) -> EnvPoolVectorEnv:
    """``EnvPoolVectorEnv(name, n_envs, seed, channels_last=..., env_kwargs=...)``; the builder behind
    ``make_vec_env("envpool:ID", n_envs)``."""
    return EnvPoolVectorEnv(name, n_envs, seed, channels_last=channels_last, env_kwargs=env_kwargs)


__all__ = [
    "ATARI_DEFAULTS",
    "ATARI_EVALUATION",
    "EnvPoolEnv",
    "EnvPoolVectorEnv",
    "check_envpool_id",
    "default_kwargs",
    "envpool_ids",
    "evaluation_kwargs",
    "is_atari",
    "make_envpool_env",
]
