"""The host loop: a Python loop over Gymnasium vector environments and PettingZoo parallel ones.

Each vector step makes one compiled call to act, one to store the transition, and, when the agent
says so, one compiled call that runs the whole update. Termination and truncation are kept apart:
Gymnasium vector environments must reset in ``SAME_STEP`` mode, so that a transition's next
observation is the real final observation of an episode (``infos["final_obs"]``) and no
transition pairs the end of one episode with the start of the next.

Multi-agent: with ``env_cfg.n_agents > 1`` the environment is a ``kitae.envs.parallel.VecParallelEnv``
(copies of a PettingZoo ``ParallelEnv``, in this process or in ``SubProcVecParallelEnv`` workers);
observations, actions, rewards and the buffer's fields are dicts keyed by agent, and the agents
share one set of parameters (``kitae.loops.multi_agent``).

Step units: ``n_env_steps`` and ``start_step`` count environment transitions summed over all
environments (a step of ``N`` copies of a multi-agent environment is ``N`` steps, whatever the
number of agents).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from kitae.buffer import Experience
from kitae.compilation_cache import use_compilation_cache
from kitae.envs.parallel import SyncVecParallelEnv, VecParallelEnv, is_parallel_env
from kitae.envs.subproc import SubProcVecParallelEnv
from kitae.loops.episodes import track_episodes
from kitae.loops.multi_agent import AgentEpisodes, log_agent_episodes, step_fields
from kitae.types import AlgoType

if TYPE_CHECKING:  # pragma: no cover
    from tensorboardX import SummaryWriter

    from kitae.base import IAgent

__all__ = ["TrainStats", "check_env", "process_termination", "vectorized_train", "SubProcVecParallelEnv"]

EnvLike = Any
"""A Gymnasium ``Env`` or ``VectorEnv``, a PettingZoo ``ParallelEnv``, or a
``kitae.envs.parallel.VecParallelEnv`` (``SyncVecParallelEnv``, ``SubProcVecParallelEnv``)."""


@dataclasses.dataclass
class TrainStats:
    """What a training run saw.

    Attributes:
        episode_returns: the return of every finished episode, in order of completion.
        episode_lengths: their lengths.
        episode_steps: the global step at which each finished.
        global_step: environment transitions done when training stopped.
        wall_seconds: wall-clock duration of the loop.
        n_updates: updates made.
        compile_seconds: duration of the first explore call and the first update, which trace
            and compile them (the rest of the loop runs compiled code).
        agent_episode_returns: multi-agent environments: ``{agent: [return of each finished
            episode]}``, in the order of ``episode_returns``, which then holds the team's returns
            (the sum over agents).
    """

    episode_returns: list[float] = dataclasses.field(default_factory=list)
    episode_lengths: list[int] = dataclasses.field(default_factory=list)
    episode_steps: list[int] = dataclasses.field(default_factory=list)
    global_step: int = 0
    wall_seconds: float = 0.0
    n_updates: int = 0
    compile_seconds: float = 0.0
    agent_episode_returns: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def mean_return(self, last: int = 10) -> float:
        """Mean return of the last ``last`` finished episodes (nan if none finished)."""
        returns = self.episode_returns[-last:]
        return float(np.mean(returns)) if returns else float("nan")


def check_env(env: EnvLike) -> EnvLike:
    """Checks if environment can be used for training.

    A single Gymnasium ``Env`` becomes a vector environment of one; a vector environment must
    reset in ``AutoresetMode.SAME_STEP`` (what ``kitae.envs.make.make_vec_env`` builds). A single
    PettingZoo ``ParallelEnv`` becomes a ``SyncVecParallelEnv`` of one copy (in this process); a
    ``VecParallelEnv`` (``SyncVecParallelEnv``, ``SubProcVecParallelEnv``) is returned as it is.

    Args:
        env (EnvLike): An environment.

    Returns:
        The original environment or a compatible one.

    Raises:
        TypeError: for an object that is not a Gymnasium environment or a PettingZoo ``ParallelEnv``
            (an AEC environment included).
        ValueError: for a vector environment in another autoreset mode; for a ``ParallelEnv``
            whose agents differ in spaces (``kitae.envs.parallel.UnsupportedParallelEnv``).
    """
    if isinstance(env, VecParallelEnv):
        return env
    if not isinstance(env, (gym.Env, gym.vector.VectorEnv)) and (is_parallel_env(env) or hasattr(env, "agent_iter")):
        single = env
        return SyncVecParallelEnv([lambda: single])
    if isinstance(env, gym.vector.VectorEnv):
        mode = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        if mode != AutoresetMode.SAME_STEP:
            raise ValueError(
                f"the vector environment resets in autoreset_mode={mode}; kitae needs "
                "AutoresetMode.SAME_STEP so that episode ends keep their real final observation: build it "
                "with kitae.envs.make.make_vec_env(...) or gym.make_vec(..., vector_kwargs="
                "{'autoreset_mode': gym.vector.AutoresetMode.SAME_STEP})"
            )
        return env
    if isinstance(env, gym.Env):
        single = env
        return gym.vector.SyncVectorEnv([lambda: single], autoreset_mode=AutoresetMode.SAME_STEP)
    raise TypeError(
        f"env={env!r} is not allowed; allowed: a gymnasium.Env or gymnasium.vector.VectorEnv "
        "(make one with kitae.envs.make.make_vec_env), a PettingZoo ParallelEnv, or a "
        "kitae.envs.parallel.VecParallelEnv (SyncVecParallelEnv, SubProcVecParallelEnv)"
    )


def episode_statistics(infos: dict) -> list[tuple[int, float, int]]:
    """The episodes a ``RecordEpisodeStatistics`` wrapper reported in ``infos``:
    ``(env_index, return, length)`` for each."""
    if "episode" not in infos:
        return []
    mask = infos.get("_episode", np.ones(len(infos["episode"]["r"]), dtype=bool))
    return [
        (int(i), float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i]))
        for i in np.flatnonzero(mask)
    ]


def process_termination(
    global_step: int,
    next_observations: np.ndarray,
    infos: dict,
    writer: "SummaryWriter | None",
    *,
    episodes: list[tuple[int, float, int]] | None = None,
) -> np.ndarray:
    """Processes the termination part of the loop.

    Where an episode ended in this step, the vector environment has already reset that
    environment and ``next_observations`` holds the first observation of the next episode;
    the episode's real final observation is in ``infos["final_obs"]``. This returns the
    observations to store as ``next_observation`` (final observations where episodes ended), and
    logs each finished episode's return and length to the writer.

    Multi-agent environments (``VecParallelEnv``) hand over dicts keyed by agent:
    ``next_observations`` ``{agent: (E, ...)}``, ``infos["final_obs"]`` ``{agent: (E, ...)}``; the
    result is then a dict too.

    Args:
        global_step (int): The current environment step.
        next_observations (Array): The observations resulting from the last actions, ``(E, ...)``.
        infos (dict): The info resulting from the last actions.
        writer (SummaryWriter): A writer to log metrics (``charts/episodic_return``,
            ``charts/episodic_length``), or ``None``.
        episodes: the episodes that ended in this step as ``(env_index, return, length)``
            (the host loop tracks them with ``kitae.loops.episodes.track_episodes``); if ``None``,
            they are read from ``infos["episode"]`` where a wrapper recorded them.

    Returns:
        The next observations to store in the buffer, ``(E, ...)``.
    """
    real_next = next_observations
    if "_final_obs" in infos and np.any(infos["_final_obs"]):
        finals = infos["final_obs"]
        if isinstance(finals, dict):  # kitae.envs.parallel: {agent: (E, ...)}, every row the real next one
            real_next = finals
        else:  # Gymnasium: one final observation per ended environment
            ended = np.flatnonzero(infos["_final_obs"])
            real_next = _with_final_observations(next_observations, [finals[i] for i in ended], ended)
    if writer is not None:
        for _, episodic_return, length in (episode_statistics(infos) if episodes is None else episodes):
            writer.add_scalar("charts/episodic_return", episodic_return, global_step)
            writer.add_scalar("charts/episodic_length", length, global_step)
    return real_next


def _with_final_observations(observations: Any, finals: list, rows: np.ndarray) -> Any:
    """A copy of the batch ``observations`` (``(E, ...)``, or a dict of them for ``Dict`` spaces,
    nested) with row ``rows[j]`` replaced by the single observation ``finals[j]``."""
    if isinstance(observations, dict):
        return {
            key: _with_final_observations(value, [final[key] for final in finals], rows)
            for key, value in observations.items()
        }
    out = np.array(observations, copy=True)
    for row, final in zip(rows, finals):
        out[row] = final
    return out


class _LossLog:
    """Writes ``losses/<name>`` once every ``log_frequency`` environment steps: the mean of each
    entry over the updates since the last point (one ``add_scalar`` per loss and update would cost
    an off-policy agent more than acting does)."""

    def __init__(self, writer: "SummaryWriter | None", log_frequency: int) -> None:
        self.writer, self.log_frequency = writer, log_frequency
        self.sums: dict[str, float] = {}
        self.count = 0

    def add(self, info: dict[str, float], global_step: int, per_step: int) -> None:
        if self.writer is None:
            return
        for name, value in info.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        self.count += 1
        if global_step // self.log_frequency > (global_step - per_step) // self.log_frequency:
            self.flush(global_step)

    def flush(self, global_step: int) -> None:
        if self.writer is not None and self.count:
            for name, total in self.sums.items():
                self.writer.add_scalar(f"losses/{name}", total / self.count, global_step)
        self.sums, self.count = {}, 0


def _make_experience(experience_type: type, **fields: Any) -> Any:
    return experience_type(**{name: fields[name] for name in experience_type._fields})


def vectorized_train(
    seed: int,
    agent: "IAgent",
    env: EnvLike,
    n_env_steps: int,
    algo_type: AlgoType,
    *,
    start_step: int = 1,
    checkpointer: Any = None,
    writer: "SummaryWriter | None" = None,
    progress_fn: Callable[[int, TrainStats], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    use_cache: bool = True,
) -> TrainStats:
    """Trains an agent in a vectorized environment.

    Important: ``env.close()`` is called at the end of the training.

    Each vector step: ``agent.explore(obs)``, ``env.step``, the real next observations from
    ``process_termination``, one ``Experience`` added to ``agent.buffer``, and
    ``agent.update(agent.buffer)`` whenever ``agent.should_update(step, agent.buffer)``.

    Multi-agent (``agent.config.env_cfg.n_agents > 1``, a PettingZoo ``ParallelEnv`` or a
    ``VecParallelEnv`` of ``n_agents`` agents): every field of the ``Experience`` is a dict keyed by
    agent, the agents share the agent's parameters, ``charts/episodic_return`` and
    ``stats.episode_returns`` are the team's returns (the sum over agents) and each agent's go to
    ``charts/<agent>/episodic_return`` and ``stats.agent_episode_returns``.

    Args:
        seed (int): An int for reproducibility (seeds the environment's reset).
        agent (IAgent): An agent to train.
        env (EnvLike): An environment to train in (see ``check_env``).
        n_env_steps (int): The number of steps to do in the environment: transitions summed over
            all environments, rounded up to whole vector steps.
        algo_type (AlgoType): The type of algorithm (must match ``agent.algo_type``).
        start_step (int): The starting step in the environment (1 for a new run; the step after
            the checkpoint when resuming). Steps ``start_step .. start_step + n_env_steps - 1``
            are done.
        checkpointer: optional, with ``save(step, agent)``; called every
            ``agent.config.train_cfg.save_frequency`` steps (if not -1) and at the end.
        writer (SummaryWriter): optional TensorBoard writer; x axis = environment steps.
        progress_fn: optional ``progress_fn(global_step, stats)``, called about twice a second,
            before each checkpoint and at the end (progress display, live metrics).
        should_stop: optional, checked after every vector step; when it returns True (Ctrl-C or
            SIGTERM caught by the caller) training stops there, saving a checkpoint as at the end.
            ``stats.global_step`` then tells where it stopped.
        use_cache: enable JAX's persistent compilation cache (``kitae.compilation_cache``), so a
            second run of the same configuration loads its explore and update programs from disk.

    Returns:
        A ``TrainStats`` with every finished episode's return and length.
    """
    if not isinstance(algo_type, AlgoType):
        raise TypeError(f"algo_type={algo_type!r} is not allowed; allowed: a kitae.types.AlgoType")
    if getattr(agent, "algo_type", algo_type) is not algo_type:
        raise ValueError(f"algo_type={algo_type} does not match the agent's {agent.algo_type}")
    if not isinstance(n_env_steps, int) or n_env_steps < 1:
        raise ValueError(f"n_env_steps={n_env_steps!r} is not allowed; allowed: an int >= 1")
    if not isinstance(start_step, int) or start_step < 1:
        raise ValueError(f"start_step={start_step!r} is not allowed; allowed: an int >= 1")

    env = check_env(env)
    if use_cache:
        use_compilation_cache()
    stats = TrainStats(global_step=start_step - 1)
    try:
        n_envs = env.num_envs
        if n_envs != agent.config.env_cfg.n_envs:
            raise ValueError(
                f"the environment has {n_envs} sub-environments but env_cfg.n_envs="
                f"{agent.config.env_cfg.n_envs}; they must match"
            )
        parallel = isinstance(env, VecParallelEnv)
        n_agents = agent.config.env_cfg.n_agents
        if parallel and env.num_agents != n_agents:
            raise ValueError(
                f"the multi-agent environment has {env.num_agents} agents {env.possible_agents} but env_cfg.n_agents="
                f"{n_agents}; they must match (n_agents > 1 turns on the shared-parameter mode; a PettingZoo "
                "environment of one agent is not supported)"
            )
        if not parallel and n_agents > 1:
            raise ValueError(
                f"env_cfg.n_agents={n_agents} asks for the multi-agent mode but the environment is "
                f"{type(env).__name__}; allowed: a PettingZoo ParallelEnv or a kitae.envs.parallel.VecParallelEnv"
            )
        save_frequency = agent.config.train_cfg.save_frequency
        losses = _LossLog(writer, agent.config.train_cfg.log_frequency)
        experience_type = getattr(agent, "experience_type", Experience)
        end_step = start_step - 1 + n_env_steps
        global_step = start_step - 1
        observations, _ = env.reset(seed=seed)
        running_returns = np.zeros(n_envs, dtype=np.float64)
        running_lengths = np.zeros(n_envs, dtype=np.int64)
        agent_episodes = AgentEpisodes(env.possible_agents, n_envs) if parallel else None
        start_time = last_log_time = time.perf_counter()
        last_log_step = global_step

        last_progress_time = start_time
        while global_step < end_step:
            agent.env_step = global_step
            first_call = global_step == start_step - 1
            call_start = time.perf_counter()
            actions, log_probs = agent.explore(observations)
            if parallel:
                actions = {name: np.asarray(value) for name, value in actions.items()}
            else:
                actions = np.asarray(actions)
            if first_call:
                stats.compile_seconds += time.perf_counter() - call_start
            next_observations, rewards, terminations, truncations, infos = env.step(actions)
            global_step += n_envs

            if parallel:
                _, finished, per_agent = agent_episodes.step(rewards, terminations, truncations)
                real_next = process_termination(global_step, next_observations, infos, writer, episodes=finished)
                log_agent_episodes(writer, per_agent, global_step, stats.agent_episode_returns)
                fields = step_fields(rewards, terminations, truncations, log_probs)
            else:
                ended = np.logical_or(terminations, truncations)
                running_returns, running_lengths, finished_returns, finished_lengths = track_episodes(
                    np, running_returns, running_lengths, np.asarray(rewards, dtype=np.float64), ended
                )
                finished = [(int(i), float(finished_returns[i]), int(finished_lengths[i])) for i in np.flatnonzero(ended)]
                real_next = process_termination(global_step, next_observations, infos, writer, episodes=finished)
                fields = {
                    "reward": np.asarray(rewards, dtype=np.float32),
                    "done": np.asarray(terminations, dtype=bool),
                    "log_prob": np.asarray(log_probs, dtype=np.float32),
                    "truncated": np.asarray(truncations, dtype=bool),
                }
            for _, episodic_return, length in finished:
                stats.episode_returns.append(episodic_return)
                stats.episode_lengths.append(length)
                stats.episode_steps.append(global_step)

            agent.buffer.add(_make_experience(
                experience_type, observation=observations, action=actions, next_observation=real_next, **fields
            ))
            observations = next_observations

            if agent.should_update(global_step, agent.buffer):
                call_start = time.perf_counter()
                info = agent.update(agent.buffer)
                if stats.n_updates == 0:
                    stats.compile_seconds += time.perf_counter() - call_start
                stats.n_updates += 1
                losses.add(info, global_step, n_envs)

            stopping = should_stop is not None and global_step < end_step and bool(should_stop())
            if checkpointer is not None and save_frequency != -1 and (
                global_step // save_frequency > (global_step - n_envs) // save_frequency
            ) and not stopping:
                agent.env_step = global_step
                if progress_fn is not None:  # the metrics a checkpoint has seen are written first
                    stats.global_step, stats.wall_seconds = global_step, time.perf_counter() - start_time
                    progress_fn(global_step, stats)
                checkpointer.save(global_step, agent)
            if stopping:
                break

            now = time.perf_counter()
            if progress_fn is not None and now - last_progress_time >= 0.5:
                stats.global_step, stats.wall_seconds = global_step, now - start_time
                progress_fn(global_step, stats)
                last_progress_time = now
            if writer is not None and now - last_log_time >= 5.0:
                writer.add_scalar("charts/SPS", (global_step - last_log_step) / (now - last_log_time), global_step)
                last_log_time, last_log_step = now, global_step

        agent.env_step = stats.global_step = global_step
        losses.flush(global_step)
        stats.wall_seconds = time.perf_counter() - start_time
        if writer is not None and stats.wall_seconds > 0:
            writer.add_scalar("charts/SPS", (global_step - start_step + 1) / stats.wall_seconds, global_step)
        if progress_fn is not None:
            progress_fn(global_step, stats)
        if checkpointer is not None:
            checkpointer.save(global_step, agent)
    finally:
        env.close()
    return stats
