"""Vector environments over PettingZoo ``ParallelEnv`` copies, in one process or in several.

A ``ParallelEnv`` (PettingZoo's Parallel API) steps every agent at once with dicts keyed by agent.
kitae trains it in the host loop with one set of parameters shared by every agent (the parallel
mode of ``ExperiencePipeline`` and ``explore_general_factory``), so a vector environment of ``N``
copies hands over, for ``A`` agents:

* observations ``{agent: (N, *obs_shape)}``;
* actions ``{agent: (N, *action_shape)}`` (what ``agent.explore`` returns);
* rewards ``{agent: (N,)}`` float64, terminations and truncations ``{agent: (N,)}`` bool;
* ``infos["final_obs"]`` ``{agent: (N, *obs_shape)}`` and ``infos["_final_obs"]`` ``(N,)`` bool,
  present when an episode ended in this step (see below).

Autoreset follows Gymnasium's ``SAME_STEP`` mode, like kitae's Gymnasium vector environments:
when the episode of a copy ends (every agent terminated or truncated), the copy is reset in the
same step and the returned observation is the first of the next episode; the episode's real final
observation is in ``infos["final_obs"]`` (rows where ``infos["_final_obs"]`` is False hold the
returned observation itself, so ``infos["final_obs"]`` is always the real next observation). No
transition pairs an episode's end with the next one's start.

For now kitae's parallel mode needs at least 2 agents (``n_agents > 1``: a one-agent
environment is a single-agent task), every agent with the same observation and action spaces
(one network serves all) and the same agents for the whole episode. ``VecParallelEnv`` refuses
the others with a clear error: one agent or agents whose spaces differ when made, agents that
come and go (one agent done while others go on, or a reset without every possible agent) when it
happens.

This module imports neither JAX nor PettingZoo: worker processes of ``SubProcVecParallelEnv``
(``kitae.envs.subproc``) import it, and must not start JAX threads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

__all__ = [
    "VecParallelEnv",
    "SyncVecParallelEnv",
    "ParallelEnvCopy",
    "UnsupportedParallelEnv",
    "check_parallel_env",
    "is_parallel_env",
]


class UnsupportedParallelEnv(ValueError):
    """A ``ParallelEnv`` that kitae's parallel mode cannot train (yet): agents whose spaces differ,
    or agents that come and go."""


def is_parallel_env(env: Any) -> bool:
    """Whether ``env`` follows PettingZoo's Parallel API (``possible_agents``, ``reset``, ``step``,
    ``observation_space(agent)``, ``action_space(agent)``) and is not an AEC environment."""
    try:
        from pettingzoo.utils.env import ParallelEnv
    except ImportError:  # PettingZoo not installed: the Parallel API by its attributes
        ParallelEnv = None
    if ParallelEnv is not None and isinstance(env, ParallelEnv):
        return True
    if isinstance(env, gym.Env) or hasattr(env, "agent_iter"):
        return False
    return all(hasattr(env, name) for name in ("possible_agents", "reset", "step", "observation_space", "action_space"))


def check_parallel_env(env: Any) -> tuple[tuple[str, ...], gym.Space, gym.Space]:
    """Checks that kitae's shared-parameter mode can train ``env``, a PettingZoo ``ParallelEnv``.

    Returns:
        ``(agents, observation_space, action_space)``: the possible agents in order and the spaces
        of one agent (the same for all).

    Raises:
        TypeError: for an object that is not a ``ParallelEnv`` (an AEC environment included).
        ValueError: for no agents; ``UnsupportedParallelEnv`` (a ``ValueError``) for one agent
            (the multi-agent mode needs ``n_agents > 1``), agents whose observation or action
            spaces differ, or observations that are not one array (a ``Dict`` space).
    """
    if hasattr(env, "agent_iter") and hasattr(env, "last"):
        raise TypeError(
            f"env={env!r} is a PettingZoo AEC environment; kitae trains the Parallel API: use the module's "
            "parallel_env() or pettingzoo.utils.conversions.aec_to_parallel(env)"
        )
    if not is_parallel_env(env):
        raise TypeError(
            f"env={env!r} is not allowed; allowed: a PettingZoo ParallelEnv (possible_agents, reset, step, "
            "observation_space(agent), action_space(agent))"
        )
    agents = tuple(env.possible_agents)
    if not agents:
        raise ValueError(f"the ParallelEnv {env!r} has no possible_agents; kitae needs at least 2 agents")
    if len(agents) == 1:
        name = getattr(env, "metadata", {}).get("name") or type(env).__name__
        raise UnsupportedParallelEnv(
            f"the ParallelEnv {name!r} has one agent {list(agents)}, which is not allowed; allowed: at least 2 agents "
            "(kitae's multi-agent mode needs n_agents > 1; train a one-agent task as a Gymnasium environment)"
        )
    first = agents[0]
    observation_space, action_space = env.observation_space(first), env.action_space(first)
    for agent in agents[1:]:
        for kind, space, reference in (
            ("observation", env.observation_space(agent), observation_space),
            ("action", env.action_space(agent), action_space),
        ):
            if space != reference:
                raise UnsupportedParallelEnv(
                    f"agents differ in {kind} spaces: {agent!r} has {space!r} but {first!r} has {reference!r}; "
                    "kitae's parallel mode shares one set of parameters between agents and needs identical "
                    "observation and action spaces (heterogeneous agents are not supported yet)"
                )
    if getattr(observation_space, "dtype", None) is None:  # Dict, Tuple, Text...: not one array per agent
        raise UnsupportedParallelEnv(
            f"the ParallelEnv's agents observe {observation_space!r}, which is not allowed; allowed: an array space "
            "(Box, Discrete, MultiDiscrete, MultiBinary): kitae's parallel mode stacks each agent's observations "
            "into one array (Dict observations, PettingZoo's action-mask convention included, are not supported "
            "yet in multi-agent environments)"
        )
    return agents, observation_space, action_space


def _agents_come_and_go(index: int, what: str) -> UnsupportedParallelEnv:
    return UnsupportedParallelEnv(
        f"copy {index} of the ParallelEnv: {what}; kitae's parallel mode needs the same agents for the whole "
        "episode (environments whose agents come and go are not supported yet)"
    )


class ParallelEnvCopy:
    """One copy of a ``ParallelEnv`` with kitae's autoreset: what a ``VecParallelEnv`` runs per copy
    (in the same process, or in a worker process of ``SubProcVecParallelEnv``).

    Observations of the ``A`` agents are returned stacked in the order of ``possible_agents``:
    ``(A, *obs_shape)``; rewards ``(A,)`` float64; terminations and truncations ``(A,)`` bool.

    Args:
        env: the ``ParallelEnv`` (checked with ``check_parallel_env``).
        index: the copy's index in its vector environment (for error messages).
        clip_actions: clip ``Box`` actions to the space's bounds before they reach the environment
            (so a Gaussian policy's raw samples can be stored for their log-probabilities).
        autoreset: reset when an episode ends (``False``: ``step`` returns the final observations
            and the copy stays at the episode's end, as one filmed episode wants).
    """

    def __init__(self, env: Any, index: int = 0, clip_actions: bool = True, autoreset: bool = True) -> None:
        self.agents, self.observation_space, self.action_space = check_parallel_env(env)
        self.env = env
        self.index = index
        self.autoreset = autoreset
        space = self.action_space
        self._clip = False
        self._low: np.ndarray | None = None
        self._high: np.ndarray | None = None
        if clip_actions and isinstance(space, gym.spaces.Box):
            self._clip = True
            self._low, self._high = np.asarray(space.low), np.asarray(space.high)
        dtype = getattr(self.observation_space, "dtype", None)
        self._obs_dtype = np.dtype(dtype) if dtype is not None else None

    def describe(self) -> tuple[tuple[str, ...], gym.Space, gym.Space]:
        """``(agents, observation_space, action_space)``."""
        return self.agents, self.observation_space, self.action_space

    def _stack_observations(self, observations: dict, what: str) -> np.ndarray:
        if not isinstance(observations, dict) or set(observations) != set(self.agents):
            keys = sorted(map(str, observations)) if isinstance(observations, dict) else type(observations).__name__
            raise _agents_come_and_go(
                self.index, f"{what} returned observations for {keys} but the possible agents are {list(self.agents)}"
            )
        return np.stack([np.asarray(observations[agent], dtype=self._obs_dtype) for agent in self.agents])

    def reset(self, seed: int | None = None, options: dict | None = None) -> np.ndarray:
        """Resets the copy; returns the observations ``(A, *obs_shape)``."""
        observations, _ = self.env.reset(seed=seed, options=options)
        agents = tuple(getattr(self.env, "agents", self.agents))
        if set(agents) != set(self.agents):
            raise _agents_come_and_go(
                self.index, f"after reset the agents are {list(agents)} but the possible agents are {list(self.agents)}"
            )
        return self._stack_observations(observations, "reset")

    def _action(self, action: Any) -> Any:
        if self._clip:
            return np.clip(np.asarray(action), self._low, self._high).astype(self.action_space.dtype, copy=False)
        return action

    def step(self, actions: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Steps with one action per agent (in the order of ``agents``), resetting when the episode ends.

        Returns:
            ``(observations (A, ...), rewards (A,), terminations (A,), truncations (A,), final)``
            where ``final`` is ``None`` or, when the episode ended in this step, its final
            observations ``(A, ...)`` (``observations`` is then the first of the next episode;
            without ``autoreset``, the final ones too).

        Raises:
            UnsupportedParallelEnv: when some agents end their episode while others go on, or the
                environment leaves an agent out of its returned dicts.
        """
        observations, rewards, terminations, truncations, _ = self.env.step(
            {agent: self._action(action) for agent, action in zip(self.agents, actions)}
        )
        for name, values in (("rewards", rewards), ("terminations", terminations), ("truncations", truncations)):
            if set(values) != set(self.agents):
                raise _agents_come_and_go(
                    self.index,
                    f"step returned {name} for {sorted(map(str, values))} but the agents are {list(self.agents)}",
                )
        stacked = self._stack_observations(observations, "step")
        reward = np.array([rewards[agent] for agent in self.agents], dtype=np.float64)
        terminated = np.array([bool(terminations[agent]) for agent in self.agents])
        truncated = np.array([bool(truncations[agent]) for agent in self.agents])
        ended = terminated | truncated
        if not ended.any():
            return stacked, reward, terminated, truncated, None
        if not ended.all():
            done = [agent for agent, e in zip(self.agents, ended) if e]
            going = [agent for agent, e in zip(self.agents, ended) if not e]
            raise _agents_come_and_go(self.index, f"agents {done} ended their episode while {going} go on")
        return (self.reset() if self.autoreset else stacked), reward, terminated, truncated, stacked

    def close(self) -> None:
        """Closes the environment."""
        self.env.close()


def _split_agents(batch: np.ndarray, agents: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``(N, A, ...)`` -> ``{agent: (N, ...)}`` (one contiguous copy, then views)."""
    by_agent = np.ascontiguousarray(np.swapaxes(batch, 0, 1))
    return {agent: by_agent[i] for i, agent in enumerate(agents)}


class VecParallelEnv:
    """``N`` copies of a PettingZoo ``ParallelEnv`` stepped together, batched by agent (base class).

    See the module docstring for the layout and the autoreset. Subclasses run the copies
    (``SyncVecParallelEnv`` in this process, ``kitae.envs.subproc.SubProcVecParallelEnv`` in worker
    processes) by implementing ``_reset_copies``, ``_step_copies`` and ``_close_copies``.

    Attributes:
        num_envs: ``N``, the number of copies.
        possible_agents / agents: the agents, in the order of the first copy's ``possible_agents``.
        num_agents: ``A``.
        single_observation_space / single_action_space: the spaces of ONE agent in ONE copy (what
            ``kitae.config.EnvConfig`` wants; the same for every agent).
        observation_spaces / action_spaces: ``{agent: space}``.
        metadata: ``{"autoreset_mode": AutoresetMode.SAME_STEP}``.
        closed: whether ``close`` ran.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def _init_layout(self, num_envs: int, descriptions: Sequence[tuple[tuple[str, ...], gym.Space, gym.Space]]) -> None:
        agents, observation_space, action_space = descriptions[0]
        for index, (other_agents, other_observation, other_action) in enumerate(descriptions[1:], start=1):
            if other_agents != agents or other_observation != observation_space or other_action != action_space:
                raise ValueError(
                    f"copy {index} of the ParallelEnv differs from copy 0 (agents {list(other_agents)} vs "
                    f"{list(agents)}, spaces {other_observation!r}/{other_action!r} vs {observation_space!r}/"
                    f"{action_space!r}); every copy must be the same environment"
                )
        self.num_envs = num_envs
        self.possible_agents = list(agents)
        self.agents = list(agents)
        self.num_agents = len(agents)
        self.single_observation_space = observation_space
        self.single_action_space = action_space
        self.observation_spaces = dict.fromkeys(agents, observation_space)
        self.action_spaces = dict.fromkeys(agents, action_space)
        self.closed = False
        self._agent_tuple = tuple(agents)

    # -- what subclasses implement --------------------------------------------------------------

    def _reset_copies(self, seeds: list[int | None], options: dict | None) -> list[np.ndarray]:
        raise NotImplementedError

    def _step_copies(self, actions: list[list[Any]]) -> list[tuple]:
        raise NotImplementedError

    def _close_copies(self) -> None:
        raise NotImplementedError

    # -- the Gymnasium-like vector API ----------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    def reset(
        self, *, seed: int | Sequence[int] | None = None, options: dict | None = None
    ) -> tuple[dict[str, np.ndarray], dict]:
        """Resets every copy; copy ``i`` is seeded ``seed + i`` (or ``seed[i]`` for a list).

        Returns:
            ``(observations {agent: (N, *obs_shape)}, {})``.
        """
        self._check_open()
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            seeds = [int(seed) + i for i in range(self.num_envs)]
        elif isinstance(seed, Sequence) and not isinstance(seed, str):
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"seed={seed!r} is not allowed; allowed: an int, None or {self.num_envs} seeds")
        else:
            raise ValueError(f"seed={seed!r} is not allowed; allowed: an int, None or {self.num_envs} seeds")
        observations = self._reset_copies(seeds, options)
        return _split_agents(np.stack(observations), self._agent_tuple), {}

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Steps every copy with ``actions`` ``{agent: (N, *action_shape)}``.

        Returns:
            ``(observations, rewards, terminations, truncations, infos)``, each of the first four
            a dict keyed by agent of arrays with a leading ``N``; ``infos`` has ``final_obs`` and
            ``_final_obs`` when an episode ended (module docstring).

        Raises:
            ValueError: for actions not keyed by exactly the agents or not batched over ``N``.
        """
        self._check_open()
        if not isinstance(actions, dict) or set(actions) != set(self._agent_tuple):
            given = sorted(map(str, actions)) if isinstance(actions, dict) else type(actions).__name__
            raise ValueError(
                f"actions={given} is not allowed; allowed: a dict keyed by the agents {self.possible_agents}"
            )
        batched = [np.asarray(actions[agent]) for agent in self._agent_tuple]
        for agent, batch in zip(self._agent_tuple, batched):
            if batch.ndim == 0 or batch.shape[0] != self.num_envs:
                raise ValueError(
                    f"actions[{agent!r}] has shape {batch.shape}; allowed: a leading axis of {self.num_envs} copies"
                )
        results = self._step_copies([[batch[i] for batch in batched] for i in range(self.num_envs)])
        observations, rewards, terminations, truncations, finals = zip(*results)
        stacked = np.stack(observations)
        infos: dict[str, Any] = {}
        ended = np.array([final is not None for final in finals])
        if ended.any():
            final = stacked.copy()
            for i in np.flatnonzero(ended):
                final[i] = finals[i]
            infos = {"final_obs": _split_agents(final, self._agent_tuple), "_final_obs": ended}
        return (
            _split_agents(stacked, self._agent_tuple),
            _split_agents(np.stack(rewards), self._agent_tuple),
            _split_agents(np.stack(terminations), self._agent_tuple),
            _split_agents(np.stack(truncations), self._agent_tuple),
            infos,
        )

    def close(self) -> None:
        """Closes every copy (idempotent)."""
        if getattr(self, "closed", True):
            return
        self.closed = True
        self._close_copies()

    def __enter__(self) -> VecParallelEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        agents = getattr(self, "possible_agents", "?")
        return f"{type(self).__name__}(num_envs={getattr(self, 'num_envs', '?')}, agents={agents})"


class SyncVecParallelEnv(VecParallelEnv):
    """``N`` copies of a ``ParallelEnv`` stepped one after the other in this process.

    The fastest choice for cheap environments (no inter-process messages); ``check_env`` wraps a
    single ``ParallelEnv`` in one of these.

    Args:
        env_fns: ``N >= 1`` callables, each making one copy of the same environment.
        clip_actions: clip ``Box`` actions to the action space's bounds.

    Raises:
        ValueError / TypeError: as ``check_parallel_env``, or if the copies differ.
    """

    def __init__(self, env_fns: Sequence[Callable[[], Any]], *, clip_actions: bool = True) -> None:
        env_fns = list(env_fns)
        if not env_fns or not all(callable(fn) for fn in env_fns):
            raise ValueError(
                f"env_fns={env_fns!r} is not allowed; allowed: a non-empty list of callables making a ParallelEnv"
            )
        self.copies: list[ParallelEnvCopy] = []
        try:
            for index, fn in enumerate(env_fns):
                self.copies.append(ParallelEnvCopy(fn(), index, clip_actions))
            self._init_layout(len(env_fns), [copy.describe() for copy in self.copies])
        except BaseException:
            for copy in self.copies:
                copy.close()
            raise

    def _reset_copies(self, seeds: list[int | None], options: dict | None) -> list[np.ndarray]:
        return [copy.reset(seed, options) for copy, seed in zip(self.copies, seeds)]

    def _step_copies(self, actions: list[list[Any]]) -> list[tuple]:
        return [copy.step(action) for copy, action in zip(self.copies, actions)]

    def _close_copies(self) -> None:
        for copy in self.copies:
            copy.close()
