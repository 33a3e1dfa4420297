"""The host loop: a Python loop over Gymnasium, EnvPool and PettingZoo vector environments.

Each vector step makes one compiled call to act (``kitae.loops.collect.act_step``), steps the
environments, stores one experience, and, when ``kitae.schedule`` says an update is due, makes
one compiled call that runs the whole update (``update_step``). Termination and truncation are
kept apart: vector environments must reset in ``SAME_STEP`` mode, so that a transition's next
observation is the real final observation of an episode (``infos["final_obs"]``) and no
transition pairs the end of one episode with the start of the next.

Multi-agent: with ``env_cfg.n_agents > 1`` the environment is a ``kitae.envs.parallel.VecParallelEnv``
(copies of a PettingZoo ``ParallelEnv``, in this process or in ``SubProcVecParallelEnv`` workers);
observations, actions, rewards and the buffer's fields are dicts keyed by agent, and the agents
share one set of parameters (``kitae.loops.multi_agent``).

The environments' state cannot be saved: a run that goes on from a checkpoint resets them
(seeded from the seed and the step) and marks the episodes that were running as truncated.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import gymnasium as gym
import jax
import numpy as np
from gymnasium.vector import AutoresetMode

from kitae.compilation_cache import use_compilation_cache
from kitae.envs.parallel import SyncVecParallelEnv, VecParallelEnv, is_parallel_env
from kitae.envs.spaces import check_env_spaces
from kitae.loops.callbacks import Callback, CallbackList, LossMeans, Progress, RunInfo
from kitae.loops.collect import CompiledAct, Memory, compiled_steps, initial_memory, make_experience, next_memory
from kitae.loops.episodes import track_episodes
from kitae.loops.multi_agent import AgentEpisodes
from kitae.loops.result import Divergence, Episodes, RunResult, concat_episodes
from kitae.loops.state import LoopState, Payload, mark_episodes_cut, payload_from_agent, reset_seed, strongly_typed
from kitae.validation import check_positive_int

__all__ = ["HostExecutor", "HostCollector", "check_env", "process_termination", "episode_statistics", "EnvLike"]

EnvLike = Any
"""A Gymnasium ``Env`` or ``VectorEnv``, a PettingZoo ``ParallelEnv``, or a
``kitae.envs.parallel.VecParallelEnv`` (``SyncVecParallelEnv``, ``SubProcVecParallelEnv``)."""


def check_env(env: EnvLike) -> EnvLike:
    """Checks if environment can be used for training.

    A single Gymnasium ``Env`` becomes a vector environment of one; a vector environment must
    reset in ``AutoresetMode.SAME_STEP`` (what ``kitae.envs.make.make_vec_env`` builds). A single
    PettingZoo ``ParallelEnv`` becomes a ``SyncVecParallelEnv`` of one copy (in this process); a
    ``VecParallelEnv`` (``SyncVecParallelEnv``, ``SubProcVecParallelEnv``) is returned as it is.
    An EnvPool pool is kitae's ``EnvPoolVectorEnv`` (``make_vec_env("envpool:TASK", n)``): one
    from ``envpool.make`` resets a step late and is refused, saying so.

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
        if mode != AutoresetMode.SAME_STEP and _is_envpool(env):  # it cannot be wrapped after the fact
            raise ValueError(
                f"the EnvPool pool {type(env).__name__} resets on the step after an episode ends, losing "
                "its real final observation; kitae needs AutoresetMode.SAME_STEP: make the pool with "
                "kitae.envs.make.make_vec_env('envpool:TASK', n_envs) (kitae.envs.envpool_env.EnvPoolVectorEnv)"
            )
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
        "(make one with kitae.envs.make.make_vec_env), a PettingZoo ParallelEnv, a "
        "kitae.envs.parallel.VecParallelEnv (SyncVecParallelEnv, SubProcVecParallelEnv), or a "
        "kitae.envs.jax_env.VecJaxEnv (kitae.envs.make.make_jax_env) for the compiled loop"
    )


def _is_envpool(env: Any) -> bool:
    """Whether ``env`` is a pool from ``envpool.make`` (its classes derive from EnvPool's; checked
    without importing EnvPool)."""
    return any(klass.__module__.startswith("envpool.") for klass in type(env).__mro__)


def episode_statistics(infos: dict) -> list[tuple[int, float, int]]:
    """The episodes a ``RecordEpisodeStatistics`` wrapper reported in ``infos``:
    ``(env_index, return, length)`` for each."""
    if "episode" not in infos:
        return []
    mask = infos.get("_episode", np.ones(len(infos["episode"]["r"]), dtype=bool))
    return [(int(i), float(infos["episode"]["r"][i]), int(infos["episode"]["l"][i])) for i in np.flatnonzero(mask)]


def process_termination(
    global_step: int,
    next_observations: np.ndarray | dict[str, Any],
    infos: dict,
    writer: Any,
    *,
    episodes: list[tuple[int, float, int]] | None = None,
) -> np.ndarray | dict[str, Any]:
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
        episodes: the episodes that ended in this step as ``(env_index, return, length)``; if
            ``None``, they are read from ``infos["episode"]`` where a wrapper recorded them.
            ``make_vec_env`` records none (``kitae.loops.episodes`` says why), so a loop of your
            own over it passes them (``kitae.loops.episodes.track_episodes`` keeps them from the
            rewards); with a writer and neither, an ended episode logs nothing and warns.

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
        if episodes is None and "episode" not in infos and real_next is not next_observations:
            # An episode ended and nothing says its return: make_vec_env records no statistics
            # (kitae.loops.episodes says why), so a loop of the user's own must pass them.
            warnings.warn(
                "process_termination: an episode ended but its return is unknown, so the writer logs "
                "nothing; pass episodes=[(env_index, return, length), ...] (kitae.loops.episodes."
                "track_episodes keeps them from the rewards)",
                stacklevel=2,
            )
        for _, episodic_return, length in episode_statistics(infos) if episodes is None else episodes:
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


def _check_layout(agent: Any, env: Any) -> bool:
    """Checks the environment against ``env_cfg`` (copies, spaces, agents); returns whether it is
    multi-agent."""
    n_envs = env.num_envs
    if n_envs != agent.config.env_cfg.n_envs:
        raise ValueError(
            f"the environment has {n_envs} sub-environments but env_cfg.n_envs="
            f"{agent.config.env_cfg.n_envs}; they must match"
        )
    check_env_spaces(agent.config.env_cfg, env.single_observation_space, env.single_action_space)
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
    return parallel


def _copy_ended(terminations: Any, truncations: Any) -> np.ndarray:
    """``(E,)``: the step ended the episode of each copy (terminated or truncated; in a
    multi-agent environment, every agent: the copy resets then, ``kitae.envs.parallel``)."""
    if isinstance(terminations, dict):
        return np.all([np.logical_or(terminations[a], truncations[a]) for a in terminations], axis=0)
    return np.logical_or(terminations, truncations)


class _Episodes:
    """Running episode returns and lengths of the host loop, single- or multi-agent."""

    def __init__(self, env: Any, parallel: bool) -> None:
        n = env.num_envs
        self.parallel = parallel
        self.agents = tuple(env.possible_agents) if parallel else None
        self.team = AgentEpisodes(env.possible_agents, n) if parallel else None
        self.returns = np.zeros(n, np.float64)
        self.lengths = np.zeros(n, np.int64)

    def step(self, rewards: Any, terminations: Any, truncations: Any, step: int) -> Episodes | None:
        """Adds one vector step; returns the episodes that ended in it (``None`` if none)."""
        if self.parallel:
            assert self.team is not None and self.agents is not None  # both made when parallel
            ended, team, per_agent = self.team.step(rewards, terminations, truncations)
            if not team:
                return None
            n = len(team)
            return Episodes(
                np.full(n, step),
                np.array([r for _, r, _ in team]),
                np.array([le for _, _, le in team]),
                np.ones(n, np.int64),
                {a: np.asarray(per_agent[a]) for a in self.agents},
            )
        ended = np.logical_or(terminations, truncations)
        self.returns, self.lengths, returns, lengths = track_episodes(
            np, self.returns, self.lengths, np.asarray(rewards, np.float64), ended
        )
        if not ended.any():
            return None
        rows = np.flatnonzero(ended)
        return Episodes(
            np.full(len(rows), step), returns[rows], lengths[rows].astype(np.float64), np.ones(len(rows), np.int64)
        )


def _fields(rewards: Any, terminations: Any, truncations: Any, parallel: bool) -> dict[str, Any]:
    """The stored reward (float32), done (termination) and truncated (bool) of one vector step."""
    if parallel:
        return {
            "reward": {a: np.asarray(v, np.float32) for a, v in rewards.items()},
            "done": {a: np.asarray(v, bool) for a, v in terminations.items()},
            "truncated": {a: np.asarray(v, bool) for a, v in truncations.items()},
        }
    return {
        "reward": np.asarray(rewards, np.float32),
        "done": np.asarray(terminations, bool),
        "truncated": np.asarray(truncations, bool),
    }


class HostCollector:
    """One vector step of collection in a host environment, written once: act, step the
    environments, put back the real final observations, track episodes, build the experience.
    The host loop makes one step at a time; a distributed collection worker makes an iteration's.

    Args:
        agent: the agent (its ``experience_type``).
        env: a checked vector environment (``check_env``).
        parallel: ``env`` is a ``VecParallelEnv`` (multi-agent).
    """

    def __init__(self, agent: Any, env: Any, parallel: bool) -> None:
        self.env, self.parallel, self.agent = env, parallel, agent
        self.experience_type = agent.experience_type
        self.tracker = _Episodes(env, parallel)
        self.observations: Any = None
        self.memory: Memory | None = None

    def reset(self, seed: int) -> None:
        """Resets the environments (sub-environment ``i`` seeded ``seed + i``); a recurrent
        agent's memory starts afresh (``kitae.loops.collect.initial_memory``)."""
        self.observations, _ = self.env.reset(seed=seed)
        self.memory = initial_memory(self.agent, self.env.num_envs, self.tracker.agents)

    def step(
        self, act: Any, acting: Any, key: jax.Array, env_step: int, next_step: int
    ) -> tuple[Any, Episodes | None, jax.Array]:
        """One vector step: ``act(acting, key, observations, env_step, memory) -> (actions,
        log_probs, key, hidden)`` (``kitae.loops.collect.act_step``, compiled), then the
        environments' step; a recurrent agent's memory goes on (``next_memory``).

        Args:
            act: ``compiled_steps(agent).act`` (a ``CompiledAct``) or a function like it.
            acting: ``agent.acting_params(state)``, or ``CompiledAct.prepare`` of it (flattened
                once, for many steps with the same parameters: the host loop's).
            key: the loop key, a raw ``(2,)`` uint32 key.
            env_step: transitions before this step (what acting reads).
            next_step: transitions after it (the step the episodes that end here are recorded at).

        Returns:
            ``(experience, episodes that ended or None, next loop key)``; the experience's leaves
            are ``(E, ...)`` numpy arrays (dicts keyed by agent in multi-agent mode).
        """
        observations = self.observations
        memory = self.memory
        if memory is None:
            actions, log_probs, key, hidden = act(acting, key, observations, np.asarray(env_step, np.int32))
        else:
            actions, log_probs, key, hidden = act(acting, key, observations, np.asarray(env_step, np.int32), memory)
        if self.parallel:
            actions = {name: np.asarray(value) for name, value in actions.items()}
        else:
            actions = np.asarray(actions)
        next_observations, rewards, terminations, truncations, infos = self.env.step(actions)
        real_next = process_termination(next_step, next_observations, infos, None)
        ended = self.tracker.step(rewards, terminations, truncations, next_step)
        experience = make_experience(
            self.experience_type,
            observation=observations,
            action=actions,
            next_observation=real_next,
            log_prob=log_probs,
            memory=None if memory is None else jax.device_get(memory),
            **_fields(rewards, terminations, truncations, self.parallel),
        )
        self.observations = next_observations
        if memory is not None:
            self.memory = next_memory(memory, hidden, _copy_ended(terminations, truncations))
        return experience, ended, key


class HostExecutor:
    """Runs an agent in a Python loop over a vector environment (see the module docstring)."""

    name = "host"
    batches_seeds = False  # one seed per run: kitae.runs trains several one after the other
    starting: str | None = None  # nothing to say before the first step

    def run(
        self,
        agent: Any,
        env: EnvLike,
        n_env_steps: int,
        *,
        start: LoopState | None = None,
        seeds: list[int] | None = None,
        callbacks: Any = (),
        use_cache: bool = True,
    ) -> RunResult:
        """Trains ``agent`` in ``env`` until ``n_env_steps`` environment steps in all.

        Important: ``env.close()`` is called at the end.

        Args:
            agent: a ``kitae.base.BaseAgent`` (any agent made from the four factories).
            env: see ``check_env``.
            n_env_steps: the run's total, counted from the start of training and rounded up to
                whole iterations (``agent.schedule.run_steps``).
            start: the ``LoopState`` to go on from (default: the agent's own state, key, buffer
                and counters). One whose ``env_step`` is past 0 resets the environments (seeded
                from the seed and the step) and marks the buffer's newest row truncated.
            seeds: ``[seed]``: the seed of the environments' reset (default ``config.seed``).
                The host loop trains one seed per call.
            callbacks: ``kitae.loops.callbacks.Callback`` objects.
            use_cache: enable JAX's persistent compilation cache (``kitae.compilation_cache``).

        Returns:
            A ``RunResult``; its ``state`` is the final ``LoopState`` (the agent itself is not
            changed: ``kitae.loops.state.apply_loop_state`` sets it).
        """
        check_positive_int("n_env_steps", n_env_steps)
        seeds = [agent.config.seed] if seeds is None else list(seeds)
        if len(seeds) != 1:
            raise ValueError(
                f"seeds={seeds} is not allowed here; the host loop trains one seed per run (kitae.runs trains "
                "several one after the other)"
            )
        callbacks = callbacks if isinstance(callbacks, Callback) else CallbackList(callbacks)
        env = check_env(env)
        try:
            return self._run(agent, env, n_env_steps, start, seeds[0], callbacks, use_cache)
        finally:
            env.close()

    def _run(
        self,
        agent: Any,
        env: Any,
        n_env_steps: int,
        start: LoopState | None,
        seed: int,
        callbacks: Callback,
        use_cache: bool,
    ) -> RunResult:
        parallel = _check_layout(agent, env)
        if use_cache:
            use_compilation_cache()
        schedule = agent.schedule
        state = payload_from_agent(agent).state if start is None else start
        if state.env is not None:
            raise ValueError("the host loop goes on from a state without an environment part (a host checkpoint)")
        first = int(np.asarray(state.env_step))
        end = schedule.run_steps(n_env_steps)
        if first >= end:
            raise ValueError(f"the run is already at step {first:,}; n_env_steps={n_env_steps:,} asks for no more")
        steps = compiled_steps(agent)
        buffer = agent.make_buffer()  # a host holder of the loop state's buffer
        buffer.state = mark_episodes_cut(state.buffer) if first > 0 else state.buffer
        agent_state, key = strongly_typed(state.agent_state), jax.numpy.asarray(state.agent_key)
        n_updates = int(np.asarray(state.n_updates))
        acting = CompiledAct.prepare(agent.acting_params(agent_state))  # flattened once per update
        n_envs, per_iteration = env.num_envs, schedule.steps_per_iteration
        losses = LossMeans(agent.config.train_cfg.log_frequency, first)
        collector = HostCollector(agent, env, parallel)
        found: list[Episodes] = []
        update_steps: list[int] = []

        def payload(step: int) -> Payload:
            logged = losses.flush(step)  # the loss points do not depend on where a run was cut
            if logged is not None:
                callbacks.on_losses(*logged, None)
            loop_state = LoopState(
                agent_state, key, buffer.state, np.asarray(step, np.int32), np.asarray(n_updates, np.int32)
            )
            return Payload(loop_state, {"executor": self.name, "seeds": None, "env_saved": False})

        callbacks.on_start(RunInfo(self.name, [seed], first, end, agent))
        collector.reset(reset_seed(seed, first))
        env_step, compile_seconds, stopped = first, 0.0, False
        divergence: Divergence | None = None
        begin = last_progress = time.perf_counter()
        latest_return = None
        while env_step < end:
            t0 = time.perf_counter()
            experience, ended, key = collector.step(steps.act, acting, key, env_step, env_step + n_envs)
            if env_step == first:  # the first act compiles (the environment's step is counted too)
                compile_seconds += time.perf_counter() - t0
            env_step += n_envs
            if ended is not None:
                found.append(ended)
                latest_return = float(np.mean(ended.return_))
                callbacks.on_episodes(ended)
            buffer.add(experience)

            if schedule.update_due(env_step, buffer.size):
                t0 = time.perf_counter()
                out = steps.update(agent_state, key, buffer.state)
                info, finite = jax.device_get((out.info, out.finite))  # one transfer
                info = {name: float(value) for name, value in info.items()}
                if not update_steps:
                    compile_seconds += time.perf_counter() - t0
                if not finite:  # not kept: the run stops with its last finite state
                    divergence = Divergence(env_step, info)
                    stopped = True
                    break
                agent_state, key = out.agent_state, out.key
                buffer.set_priorities(out.priorities)
                if schedule.on_policy:
                    buffer.reset()
                acting = CompiledAct.prepare(agent.acting_params(agent_state))  # flattened once per update
                n_updates += 1
                update_steps.append(env_step)
                logged = losses.add(env_step, info)
                if logged is not None:
                    callbacks.on_losses(*logged, None)

            stopping = env_step < end and callbacks.should_stop()
            due = env_step % per_iteration == 0 and schedule.save_due(env_step - per_iteration, env_step)
            if due and env_step < end and not stopping:  # the end and a stop save below
                callbacks.on_checkpoint(payload(env_step))
            now = time.perf_counter()
            if stopping or now - last_progress >= 0.5:
                elapsed = max(now - begin - compile_seconds, 1e-9)
                callbacks.on_progress(Progress(env_step, (env_step - first) / elapsed, latest_return))
                last_progress = now
            if stopping:
                stopped = True
                break

        train_seconds = max(time.perf_counter() - begin - compile_seconds, 0.0)
        callbacks.on_progress(Progress(env_step, (env_step - first) / max(train_seconds, 1e-9), latest_return))
        final = payload(env_step)
        callbacks.on_checkpoint(final)
        result = RunResult(
            executor=self.name,
            seeds=[seed],
            state=final.state,
            episodes=[concat_episodes(found, agents=collector.tracker.agents)],
            update_steps=[np.asarray(update_steps, np.int64)],
            start_step=first,
            env_steps=env_step,
            compile_seconds=compile_seconds,
            train_seconds=train_seconds,
            stopped=stopped,
            diverged=[divergence],
        )
        callbacks.on_end(result)
        return result
