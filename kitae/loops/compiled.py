"""The compiled loop: a whole training run as one XLA program, for environments written in JAX.

The same agent that trains in the host loop trains here: its ``explore`` (traced through
``BaseAgent.explore_with``), its pure ``update_fn`` and the pure buffer functions of
``kitae.buffer`` run inside one ``jax.lax.scan`` inside one ``jax.jit``:

    for each iteration:                       # jax.lax.scan
        for each vector step of the iteration:    # jax.lax.scan
            explore, env.step (vmapped), buffer_add, episode statistics
        update (on-policy: the rollout; off-policy: when past start_step and the buffer holds a batch)

An on-policy iteration is one rollout of ``max_buffer_size`` vector steps; an off-policy iteration
is ``max(1, skip_steps // n_envs)`` vector steps. Several seeds train together with ``jax.vmap``
(one program, one compile), and their axis can be sharded across devices.

The run state (``LoopState``: agent state and key, buffer, environment state, observations,
counters) is a pytree, so a run can be cut into segments and checkpointed between them: with a
checkpointer, ``compiled_train`` runs ONE compiled program whose iteration count is an argument
(``run(state, n, first_index, length=L)``) segment after segment, saving the loop state between
segments; the bits are those of the run in one piece. ``LoopStart`` resumes from a restored state.

Multi-agent environments (``kitae.envs.jaxmarl_env.VecJaxMARLEnv``, an ``agents`` attribute)
train a parameter-shared agent (``EnvConfig.n_agents > 1``, parallel mode): observations,
actions, rewards and flags are dicts keyed by agent all the way into the buffer. An episode ends
for the team when it ends for every agent; ``IterationMetrics.return_sum`` then sums the team's
return (the agents' returns added up) and ``agent_return_sum`` each agent's own.

Step units: ``n_env_steps`` counts environment transitions summed over all environments (one
transition of an environment moves all its agents).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kitae.compilation_cache import use_compilation_cache
from kitae.buffer import BufferState, Experience, buffer_add, buffer_init, buffer_reset, buffer_rollout
from kitae.buffer import _n_agents as _n_agents_of
from kitae.envs.jax_env import VecJaxEnv
from kitae.loops.episodes import track_episodes
from kitae.loops.multi_agent import env_agents, track_team_episodes
from kitae.types import AlgoType

class LoopState(NamedTuple):
    """Everything a compiled run carries from one iteration to the next (a pytree).

    Leaves carry a leading seed axis when seeds train together.
    """

    agent_state: Any
    agent_key: jax.Array
    env_key: jax.Array
    buffer: BufferState
    env_state: Any
    observation: Any
    env_step: jax.Array  # int32: transitions so far, summed over environments
    episode_return: Any  # (E,) return of each environment's running episode ({agent: (E,)} multi-agent)
    episode_length: jax.Array  # (E,)


class IterationMetrics(NamedTuple):
    """Metrics of one iteration (stacked over iterations by the scan).

    Attributes:
        env_step: transitions done at the end of the iteration.
        return_sum: sum of the returns of the episodes that ended in the iteration (multi-agent:
            team returns, each the sum of the agents' returns).
        length_sum: sum of their lengths.
        episodes: how many ended.
        updated: whether the iteration updated the agent.
        info: the update's info (zeros where it did not update).
        agent_return_sum: multi-agent only: ``{agent: sum of that agent's returns over the same
            episodes}``; ``None`` for a single agent.
    """

    env_step: jax.Array
    return_sum: jax.Array
    length_sum: jax.Array
    episodes: jax.Array
    updated: jax.Array
    info: dict[str, jax.Array]
    agent_return_sum: dict[str, jax.Array] | None = None


@dataclasses.dataclass
class CompiledRun:
    """The result of ``compiled_train``.

    Attributes:
        state: the final ``LoopState`` (leading seed axis when ``seeds`` were given).
        metrics: ``IterationMetrics`` as numpy arrays ``(n_iterations,)`` (``(K, n_iterations)``
            for K seeds).
        seeds: the seeds trained.
        compile_seconds: time spent tracing and compiling (or loading from the cache).
        train_seconds: time spent running the compiled program.
        env_steps: transitions per seed at the end (counted from the start of the run, also when
            it was resumed).
        start_step: transitions per seed when this call started (0 unless resumed).
        first_iteration: index of the first iteration this call ran (0 unless resumed);
            ``metrics`` hold the iterations from there on.
        stopped: the run was stopped early (``should_stop``) at ``env_steps``.
    """

    state: LoopState
    metrics: IterationMetrics
    seeds: list[int]
    compile_seconds: float
    train_seconds: float
    env_steps: int
    start_step: int = 0
    first_iteration: int = 0
    stopped: bool = False

    @property
    def sps(self) -> float:
        """Environment transitions per second of training (this call's), summed over seeds."""
        done = self.env_steps - self.start_step
        return done * len(self.seeds) / self.train_seconds if self.train_seconds else float("nan")

    def episode_curve(self, seed_index: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, mean return of the episodes that ended in each iteration)`` for one seed,
        iterations without a finished episode left out."""
        m = jax.tree_util.tree_map(lambda x: x[seed_index] if self.batched else x, self.metrics)
        mask = m.episodes > 0
        return m.env_step[mask], m.return_sum[mask] / m.episodes[mask]

    def final_return(self, seed_index: int = 0, last: int = 10) -> float:
        """Mean return of (about) the last ``last`` finished episodes of one seed, computed from the
        per-iteration sums: whole iterations are taken from the end until ``last`` episodes."""
        m = jax.tree_util.tree_map(lambda x: x[seed_index] if self.batched else x, self.metrics)
        total, count = 0.0, 0
        for r, n in zip(m.return_sum[::-1], m.episodes[::-1]):
            if n > 0:
                total, count = total + float(r), count + int(n)
            if count >= last:
                break
        return total / count if count else float("nan")

    def final_agent_returns(self, seed_index: int = 0, last: int = 10) -> dict[str, float]:
        """Multi-agent runs: ``{agent: mean return of that agent}`` over the same episodes as
        ``final_return`` (whose team return is their sum)."""
        if self.metrics.agent_return_sum is None:
            raise ValueError("final_agent_returns is for multi-agent runs; this run has a single agent")
        m = jax.tree_util.tree_map(lambda x: x[seed_index] if self.batched else x, self.metrics)
        totals, count = {agent: 0.0 for agent in m.agent_return_sum}, 0
        for i in range(len(m.episodes) - 1, -1, -1):
            if m.episodes[i] > 0:
                count += int(m.episodes[i])
                for agent, sums in m.agent_return_sum.items():
                    totals[agent] += float(sums[i])
            if count >= last:
                break
        return {agent: (total / count if count else float("nan")) for agent, total in totals.items()}

    @property
    def batched(self) -> bool:
        return np.ndim(self.metrics.env_step) == 2


def _iteration_layout(agent: Any, n_envs: int) -> tuple[int, bool]:
    """``(vector steps per iteration, on_policy)``."""
    on_policy = agent.algo_type is AlgoType.ON_POLICY
    if on_policy:
        return agent.config.update_cfg.max_buffer_size, True
    skip_steps = max(1, getattr(agent.config.algo_params, "skip_steps", 1))
    return max(1, skip_steps // n_envs), False


def n_iterations_for(agent: Any, env: VecJaxEnv, n_env_steps: int) -> int:
    """Iterations a run of ``n_env_steps`` transitions takes (rounded up to whole iterations)."""
    steps_per_iteration, _ = _iteration_layout(agent, env.num_envs)
    per_iteration = steps_per_iteration * env.num_envs
    return -(-n_env_steps // per_iteration)


def make_loop_functions(agent: Any, env: VecJaxEnv, *, log_every: int = 0,
                        log_fn: Callable | None = None) -> tuple[Callable, Callable]:
    """Builds the pure ``init(seed) -> LoopState`` and
    ``run(state, n_iterations, first_index=0, *, length=None) -> (state, metrics)``.

    ``run`` is a ``jax.lax.scan`` of iterations (with ``length``, a loop over a traced number of
    iterations, so that one program runs segments of any length); both are pure functions of arrays, ready for
    ``jax.jit``, ``jax.vmap`` (over seeds) and sharding. With ``log_every > 0``, every
    ``log_every`` iterations a host callback ``log_fn(env_step, return_sum, episodes)`` reports
    progress from inside the program.
    """
    config = agent.config
    n_envs = env.num_envs
    if config.env_cfg.n_envs != n_envs:
        raise ValueError(
            f"the environment has {n_envs} copies but env_cfg.n_envs={config.env_cfg.n_envs}; they must match"
        )
    steps_per_iteration, on_policy = _iteration_layout(agent, n_envs)
    capacity = config.update_cfg.max_buffer_size
    batch_size = config.update_cfg.batch_size
    start_step = getattr(config.algo_params, "start_step", 0)
    experience_type = getattr(agent, "experience_type", Experience)
    update_fn = agent.update_fn
    agents = env_agents(env)
    n_agents = 1 if agents is None else len(agents)
    if config.env_cfg.n_agents != n_agents:
        raise ValueError(
            f"the environment has {n_agents} agent(s) but env_cfg.n_agents={config.env_cfg.n_agents}; they must match"
        )

    def per_agent(make: Callable[[], Any]) -> Any:
        """``make()``, or ``{agent: make()}`` in a multi-agent environment."""
        return make() if agents is None else {a: make() for a in agents}

    def make_experience(**fields: Any) -> Any:
        return experience_type(**{name: fields[name] for name in experience_type._fields})

    def init(seed: jax.Array) -> LoopState:
        agent_key, agent_state = agent.initial_state(seed)
        env_key, reset_key = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), 1))
        observation, env_state = env.reset(reset_key)
        actions, log_probs, _ = jax.eval_shape(
            lambda s, k, o: agent.explore_with(s, k, o, jnp.zeros((), jnp.int32)), agent_state, agent_key, observation
        )
        example = make_experience(
            observation=observation,
            action=jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), actions),
            reward=per_agent(lambda: jnp.zeros((n_envs,), jnp.float32)),
            done=per_agent(lambda: jnp.zeros((n_envs,), bool)),
            next_observation=observation,
            log_prob=jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, jnp.float32), log_probs),
            truncated=per_agent(lambda: jnp.zeros((n_envs,), bool)),
        )
        return LoopState(
            agent_state=agent_state,
            agent_key=agent_key,
            env_key=env_key,
            buffer=buffer_init(example, capacity),
            env_state=env_state,
            observation=observation,
            env_step=jnp.zeros((), jnp.int32),
            episode_return=per_agent(lambda: jnp.zeros((n_envs,), jnp.float32)),
            episode_length=jnp.zeros((n_envs,), jnp.int32),
        )

    def vector_step(carry: tuple[LoopState, jax.Array, jax.Array, jax.Array, Any], _: Any):
        state, return_sum, length_sum, episodes, agent_return_sum = carry
        actions, log_probs, agent_key = agent.explore_with(
            state.agent_state, state.agent_key, state.observation, state.env_step
        )
        env_key, step_key = jax.random.split(state.env_key)
        ts = env.step(step_key, state.env_state, actions)
        buffer = buffer_add(state.buffer, make_experience(
            observation=state.observation,
            action=actions,
            reward=ts.reward,
            done=ts.terminated,
            next_observation=ts.next_observation,
            log_prob=jax.tree_util.tree_map(lambda x: jnp.asarray(x, jnp.float32), log_probs),
            truncated=ts.truncated,
        ))
        if agents is None:
            ended = jnp.logical_or(ts.terminated, ts.truncated)
            running_return, running_length, episode_return, episode_length = track_episodes(
                jnp, state.episode_return, state.episode_length, ts.reward, ended
            )
        else:
            running_return, running_length, episode_return, episode_length, ended, per_agent_return = (
                track_team_episodes(state.episode_return, state.episode_length, ts)
            )
            agent_return_sum = {
                a: agent_return_sum[a] + jnp.sum(jnp.where(ended, per_agent_return[a], 0.0)) for a in agents
            }
        return_sum = return_sum + jnp.sum(jnp.where(ended, episode_return, 0.0))
        length_sum = length_sum + jnp.sum(jnp.where(ended, episode_length, 0))
        episodes = episodes + jnp.sum(ended)
        state = state._replace(
            agent_key=agent_key,
            env_key=env_key,
            buffer=buffer,
            env_state=ts.state,
            observation=ts.observation,
            env_step=state.env_step + n_envs,
            episode_return=running_return,
            episode_length=running_length,
        )
        return (state, return_sum, length_sum, episodes, agent_return_sum), None

    def iteration(state: LoopState, index: jax.Array) -> tuple[LoopState, IterationMetrics]:
        zero = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32),
                None if agents is None else per_agent(lambda: jnp.zeros((), jnp.float32)))
        (state, return_sum, length_sum, episodes, agent_return_sum), _ = jax.lax.scan(
            vector_step, (state, *zero), None, length=steps_per_iteration
        )
        agent_key, update_key = jax.random.split(state.agent_key)
        if on_policy:
            agent_state, info = update_fn(state.agent_state, update_key, buffer_rollout(state.buffer))
            buffer = buffer_reset(state.buffer)
            updated = jnp.ones((), bool)
        else:
            info_shape = jax.eval_shape(update_fn, state.agent_state, update_key, state.buffer)[1]
            updated = jnp.logical_and(
                state.env_step >= start_step, state.buffer.size * n_envs * _n_agents(state.buffer) >= batch_size
            )
            agent_state, info = jax.lax.cond(
                updated,
                lambda s: update_fn(s, update_key, state.buffer),
                lambda s: (s, jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, x.dtype), info_shape)),
                state.agent_state,
            )
            buffer = state.buffer
        state = state._replace(agent_state=agent_state, agent_key=agent_key, buffer=buffer)
        if log_every > 0 and log_fn is not None:
            jax.lax.cond(
                (index + 1) % log_every == 0,
                lambda: jax.debug.callback(log_fn, state.env_step, return_sum, episodes),
                lambda: None,
            )
        return state, IterationMetrics(state.env_step, return_sum, length_sum, episodes, updated, info,
                                       agent_return_sum)

    def run(state: LoopState, n_iterations: int | jax.Array, first_index: int | jax.Array = 0, *,
            length: int | None = None) -> tuple[LoopState, IterationMetrics]:
        """Runs ``n_iterations`` iterations, numbered from ``first_index``.

        With ``length=None``, ``n_iterations`` is static (a Python int) and the metrics have a
        leading axis of ``n_iterations``. With a static ``length``, ``n_iterations`` may be traced
        (``<= length``): one compiled program then runs segments of any length up to ``length``,
        and the metrics have a leading axis of ``length`` (rows past ``n_iterations`` are zeros).
        Each iteration runs the same computation either way, so cutting a run into segments
        gives the same bits as one program.
        """
        if length is None:
            indices = first_index + jnp.arange(n_iterations)
            return jax.lax.scan(iteration, state, indices)
        index = jnp.asarray(first_index, jnp.int32)
        metrics_shape = jax.eval_shape(iteration, state, index)[1]
        rows = jax.tree_util.tree_map(lambda x: jnp.zeros((length, *x.shape), x.dtype), metrics_shape)

        def body(i: jax.Array, carry: tuple[LoopState, IterationMetrics]) -> tuple[LoopState, IterationMetrics]:
            state, rows = carry
            state, metrics = iteration(state, index + i)
            rows = jax.tree_util.tree_map(lambda r, x: r.at[i].set(x), rows, metrics)
            return state, rows

        return jax.lax.fori_loop(0, jnp.minimum(n_iterations, length), body, (state, rows))

    return init, run


def _n_agents(buffer: BufferState) -> int:
    return _n_agents_of(buffer.data)


class LoopStart(NamedTuple):
    """Where a resumed compiled run starts: a ``LoopState`` restored from a checkpoint (leading
    seed axis when seeds train together), the index of its next iteration, and the updates made
    so far."""

    state: LoopState
    iteration: int
    n_updates: int = 0


def loop_state_shape(agent: Any, env: VecJaxEnv, seeds: list[int] | None = None) -> LoopState:
    """The abstract ``LoopState`` (``jax.ShapeDtypeStruct`` leaves) of a run of ``agent`` in
    ``env``, with a leading seed axis when ``seeds`` are given: the target a checkpoint's loop
    state is restored into."""
    init, _ = make_loop_functions(agent, env)
    if seeds is None:
        return jax.eval_shape(init, jnp.asarray(agent.config.seed, jnp.uint32))
    return jax.eval_shape(jax.vmap(init), jnp.asarray(seeds, jnp.uint32))


def segment_plan(first: int, total: int, steps_per_iteration: int, save_frequency: int,
                 max_length: int) -> list[tuple[int, int, bool]]:
    """Cuts iterations ``first .. total - 1`` into segments of at most ``max_length``.

    A segment ends where the run crosses a multiple of ``save_frequency`` environment steps
    (iteration ``k`` ends at ``(k + 1) * steps_per_iteration`` steps), as the host loop's
    checkpoints do, and at the end.

    Returns:
        ``[(first iteration, iterations, save after it), ...]``.
    """
    plan, start = [], first
    while start < total:
        end = min(start + max_length, total)
        save = end == total
        if save_frequency != -1:
            next_multiple = (start * steps_per_iteration // save_frequency + 1) * save_frequency
            boundary = -(-next_multiple // steps_per_iteration)  # first iteration end at or past it
            if boundary <= end:
                end, save = boundary, True
        plan.append((start, end - start, save))
        start = end
    return plan


def compiled_train(
    agent: Any,
    env: VecJaxEnv,
    n_env_steps: int,
    *,
    seeds: list[int] | None = None,
    shard: bool = True,
    log_every: int = 0,
    log_fn: Callable | None = None,
    use_cache: bool = True,
    checkpointer: Any = None,
    segment_iterations: int | None = None,
    should_stop: Callable[[], bool] | None = None,
    on_segment: Callable[[IterationMetrics, LoopState], None] | None = None,
    start: LoopStart | None = None,
) -> CompiledRun:
    """Trains ``agent`` in a JAX environment as one compiled program.

    Without checkpointing, the whole run is one call of one program. With a ``checkpointer``
    (or ``segment_iterations``, ``should_stop``, ``on_segment`` or ``start``) the run is cut into
    segments of whole iterations, all run by ONE compiled program (``run(..., length=L)``, whose
    iteration count is an argument), and between segments the host may save the ``LoopState``,
    report progress or stop. The bits are those of the single program: each iteration runs the
    same computation on the same carried state and keys.

    Args:
        agent: a ``BaseAgent`` (any agent made from the four factories).
        env: a ``VecJaxEnv`` with ``num_envs == agent.config.env_cfg.n_envs``.
        n_env_steps: transitions per seed, summed over environments, counted from the start of the
            run also when resuming (rounded up to whole iterations: rollouts for on-policy agents).
        seeds: train these seeds together (``jax.vmap``, one program); default
            ``[agent.config.seed]`` without a seed axis. The agent's attributes are set to the
            final state only for a single seed.
        shard: with several devices and a number of seeds divisible by their count, shard the
            seed axis across devices (``jax.sharding``).
        log_every: report progress through a host callback every this many iterations (0: never).
        log_fn: ``log_fn(env_step, return_sum, episodes)`` called from inside the program.
        use_cache: enable JAX's persistent compilation cache (``kitae.compilation_cache``).
        checkpointer: a ``kitae.checkpoint.Checkpointer``; saves the loop state every
            ``agent.config.train_cfg.save_frequency`` steps (if not -1), at the end, and when stopped.
        segment_iterations: the longest segment, in iterations (default: the save period, at
            most a twentieth of the run).
        should_stop: checked after every segment; when it returns True the run saves (with a
            checkpointer) and returns early with ``stopped=True``.
        on_segment: ``on_segment(metrics, state)`` after every segment, before any save, with
            that segment's metrics (numpy, ``(n,)`` or ``(K, n)``) and the loop state.
        start: resume from a restored ``LoopStart`` instead of initialising from the seeds.

    Returns:
        A ``CompiledRun`` with the final state, per-iteration metrics, compile and train seconds.
    """
    if not isinstance(n_env_steps, int) or isinstance(n_env_steps, bool) or n_env_steps < 1:
        raise ValueError(f"n_env_steps={n_env_steps!r} is not allowed; allowed: an int >= 1")
    if use_cache:
        use_compilation_cache()
    segmented = any(x is not None for x in (checkpointer, segment_iterations, should_stop, on_segment, start))
    init, run = make_loop_functions(agent, env, log_every=0 if segmented else log_every, log_fn=log_fn)
    n_iterations = n_iterations_for(agent, env, n_env_steps)
    batched = seeds is not None
    seeds = list(seeds) if batched else [agent.config.seed]
    for seed in seeds:
        if not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ValueError(f"seed={seed!r} is not allowed; allowed: an int in [0, 2**32)")
    steps_per_iteration = _iteration_layout(agent, env.num_envs)[0] * env.num_envs

    seed_array = jnp.asarray(seeds if batched else seeds[0], dtype=jnp.uint32)
    sharding = None
    if batched and shard and jax.device_count() > 1 and len(seeds) % jax.device_count() == 0:
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("seeds",))
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("seeds"))
        seed_array = jax.device_put(seed_array, sharding)

    # The initial state is made by its own small program and handed to the training program, in
    # one piece or in segments: both then compute the same bits (a vmapped init fused into the
    # training program may round differently).
    if not segmented:
        def program(state: LoopState) -> tuple[LoopState, IterationMetrics]:
            if batched:
                return jax.vmap(lambda s: run(s, n_iterations))(state)
            return run(state, n_iterations)

        start_time = time.perf_counter()
        state = jax.jit(_strongly_typed(jax.vmap(init) if batched else init))(seed_array)
        compiled = jax.jit(program).lower(state).compile()
        compile_seconds = time.perf_counter() - start_time
        start_time = time.perf_counter()
        final_state, metrics = compiled(state)
        jax.block_until_ready(final_state)
        train_seconds = time.perf_counter() - start_time
        metrics = jax.tree_util.tree_map(np.asarray, metrics)
        first, stopped, n_updates = 0, False, agent.n_updates + int(np.sum(metrics.updated))
        done = n_iterations
    else:
        first = 0 if start is None else int(start.iteration)
        if first > n_iterations:
            raise ValueError(
                f"the run is already at iteration {first} (step {first * steps_per_iteration}); "
                f"n_env_steps={n_env_steps} needs only {n_iterations}"
            )
        save_frequency = agent.config.train_cfg.save_frequency if checkpointer is not None else -1
        if segment_iterations is None:
            segment_iterations = max(1, -(-n_iterations // 20))
            if save_frequency != -1:
                segment_iterations = min(segment_iterations, max(1, -(-save_frequency // steps_per_iteration)))
        if not isinstance(segment_iterations, int) or segment_iterations < 1:
            raise ValueError(f"segment_iterations={segment_iterations!r} is not allowed; allowed: an int >= 1")
        length = segment_iterations

        def segment(state: LoopState, n: jax.Array, index: jax.Array) -> tuple[LoopState, IterationMetrics]:
            if batched:
                return jax.vmap(lambda s: run(s, n, index, length=length))(state)
            return run(state, n, index, length=length)

        start_time = time.perf_counter()
        if start is None:
            state = jax.jit(_strongly_typed(jax.vmap(init) if batched else init))(seed_array)
        else:
            state = start.state if sharding is None else jax.device_put(start.state, sharding)
            expected = first * steps_per_iteration
            if int(np.max(np.asarray(state.env_step))) != expected:
                raise ValueError(
                    f"the loop state is at step {int(np.max(np.asarray(state.env_step)))}, but iteration "
                    f"{first} starts at step {expected}"
                )
        compiled = jax.jit(segment).lower(state, jnp.int32(0), jnp.int32(0)).compile()
        compile_seconds = time.perf_counter() - start_time
        n_updates = agent.n_updates if start is None else int(start.n_updates)
        chunks, train_seconds, stopped, done = [], 0.0, False, first
        for index, n, save in segment_plan(first, n_iterations, steps_per_iteration, save_frequency, length):
            start_time = time.perf_counter()
            state, rows = compiled(state, jnp.int32(n), jnp.int32(index))
            rows = jax.tree_util.tree_map(lambda x: np.asarray(x)[:, :n] if batched else np.asarray(x)[:n], rows)
            train_seconds += time.perf_counter() - start_time
            chunks.append(rows)
            done = index + n
            n_updates += int(np.sum(rows.updated[0] if batched else rows.updated))
            if not batched:
                _set_agent(agent, state, n_updates)
            if on_segment is not None:
                on_segment(rows, state)
            stopped = should_stop is not None and bool(should_stop()) and done < n_iterations
            if checkpointer is not None and (save or stopped):
                checkpointer.save(done * steps_per_iteration, agent, loop_state=state, iteration=done,
                                  seeds=seeds if batched else None, extra={"n_updates": n_updates})
            if stopped:
                break
        final_state = state
        if chunks:
            metrics = jax.tree_util.tree_map(lambda *xs: np.concatenate(xs, axis=1 if batched else 0), *chunks)
        else:  # nothing left to run
            shapes = jax.eval_shape(segment, state, jnp.int32(0), jnp.int32(0))[1]
            metrics = jax.tree_util.tree_map(
                lambda x: np.zeros((*x.shape[:-1], 0) if batched else (0,), x.dtype), shapes)

    result = CompiledRun(
        state=final_state,
        metrics=metrics,
        seeds=seeds,
        compile_seconds=compile_seconds,
        train_seconds=train_seconds,
        env_steps=int(done * steps_per_iteration),
        start_step=int(first * steps_per_iteration),
        first_iteration=first,
        stopped=stopped,
    )
    if not batched:
        _set_agent(agent, final_state, n_updates)
    return result


def _strongly_typed(init: Callable) -> Callable:
    """``init`` whose weakly typed leaves (Python scalars turned arrays) are made strongly typed,
    as arrays restored from a checkpoint are: a fresh and a resumed run then trace, compile and
    compute the same program."""

    def typed(seed: jax.Array) -> LoopState:
        return jax.tree_util.tree_map(lambda x: x.astype(x.dtype) if getattr(x, "weak_type", False) else x, init(seed))

    return typed


def _set_agent(agent: Any, state: LoopState, n_updates: int) -> None:
    agent.state = state.agent_state
    agent.key = state.agent_key
    agent.env_step = int(state.env_step)
    agent.n_updates = n_updates


def log_iteration_metrics(writer: Any, metrics: IterationMetrics, seed_index: int | None = None) -> None:
    """Writes per-iteration metrics to a TensorBoard writer, x axis = environment steps:
    ``charts/episodic_return`` and ``charts/episodic_length`` (means over the episodes that ended
    in each iteration; multi-agent: the team's return, and each agent's as
    ``charts/episodic_return/<agent>``) and ``losses/<name>`` for each update. ``seed_index`` picks one seed of
    batched metrics ``(K, n)``."""
    m = metrics if seed_index is None else jax.tree_util.tree_map(lambda x: x[seed_index], metrics)
    for i in range(len(m.env_step)):
        step = int(m.env_step[i])
        if m.episodes[i] > 0:
            writer.add_scalar("charts/episodic_return", float(m.return_sum[i] / m.episodes[i]), step)
            writer.add_scalar("charts/episodic_length", float(m.length_sum[i] / m.episodes[i]), step)
            for agent, sums in (m.agent_return_sum or {}).items():
                writer.add_scalar(f"charts/episodic_return/{agent}", float(sums[i] / m.episodes[i]), step)
        if m.updated[i]:
            for name, values in m.info.items():
                writer.add_scalar(f"losses/{name}", float(values[i]), step)


def log_compiled_metrics(writer: Any, result: CompiledRun, seed_index: int = 0) -> None:
    """Writes a compiled run's metrics to a TensorBoard writer, x axis = environment steps:
    ``charts/episodic_return``, ``charts/episodic_length``, ``losses/<name>``
    (``log_iteration_metrics``), ``charts/SPS`` and ``charts/compile_seconds``."""
    log_iteration_metrics(writer, result.metrics, seed_index if result.batched else None)
    log_run_speed(writer, result)


def log_run_speed(writer: Any, result: CompiledRun) -> None:
    """Writes ``charts/SPS`` (per seed) and ``charts/compile_seconds`` at the run's last step."""
    writer.add_scalar("charts/SPS", result.sps / len(result.seeds), result.env_steps)
    writer.add_scalar("charts/compile_seconds", result.compile_seconds, result.env_steps)
