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
counters) is a pytree, so a run can be cut into segments and checkpointed between them.

Step units: ``n_env_steps`` counts environment transitions summed over all environments.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kitae.buffer import BufferState, Experience, buffer_add, buffer_init, buffer_reset, buffer_rollout
from kitae.envs.jax_env import VecJaxEnv
from kitae.loops.episodes import track_episodes
from kitae.types import AlgoType

_CACHE_ENABLED = False


def enable_compilation_cache(directory: str | Path | None = None) -> Path:
    """Turns on JAX's persistent compilation cache in a user-level folder.

    The folder is ``directory``, else ``$KITAE_CACHE_DIR``, else ``$XDG_CACHE_HOME/kitae/jax``
    (``~/.cache/kitae/jax``). A second run of the same configuration then loads its program from
    disk instead of compiling it. Set ``KITAE_NO_COMPILATION_CACHE=1`` to leave it off.
    """
    global _CACHE_ENABLED
    if directory is None:
        directory = os.environ.get("KITAE_CACHE_DIR") or (
            Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kitae" / "jax"
        )
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _CACHE_ENABLED = True
    return path


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
    episode_return: jax.Array  # (E,) return of each environment's running episode
    episode_length: jax.Array  # (E,)


class IterationMetrics(NamedTuple):
    """Metrics of one iteration (stacked over iterations by the scan).

    Attributes:
        env_step: transitions done at the end of the iteration.
        return_sum: sum of the returns of the episodes that ended in the iteration.
        length_sum: sum of their lengths.
        episodes: how many ended.
        updated: whether the iteration updated the agent.
        info: the update's info (zeros where it did not update).
    """

    env_step: jax.Array
    return_sum: jax.Array
    length_sum: jax.Array
    episodes: jax.Array
    updated: jax.Array
    info: dict[str, jax.Array]


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
        env_steps: transitions per seed.
    """

    state: LoopState
    metrics: IterationMetrics
    seeds: list[int]
    compile_seconds: float
    train_seconds: float
    env_steps: int

    @property
    def sps(self) -> float:
        """Environment transitions per second of training, summed over seeds."""
        return self.env_steps * len(self.seeds) / self.train_seconds if self.train_seconds else float("nan")

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
    """Builds the pure ``init(seed) -> LoopState`` and ``run(state, n_iterations) -> (state, metrics)``.

    ``run`` is a ``jax.lax.scan`` of iterations; both are pure functions of arrays, ready for
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
            action=jnp.zeros(actions.shape, actions.dtype),
            reward=jnp.zeros((n_envs,), jnp.float32),
            done=jnp.zeros((n_envs,), bool),
            next_observation=observation,
            log_prob=jnp.zeros(log_probs.shape, jnp.float32),
            truncated=jnp.zeros((n_envs,), bool),
        )
        return LoopState(
            agent_state=agent_state,
            agent_key=agent_key,
            env_key=env_key,
            buffer=buffer_init(example, capacity),
            env_state=env_state,
            observation=observation,
            env_step=jnp.zeros((), jnp.int32),
            episode_return=jnp.zeros((n_envs,), jnp.float32),
            episode_length=jnp.zeros((n_envs,), jnp.int32),
        )

    def vector_step(carry: tuple[LoopState, jax.Array, jax.Array, jax.Array], _: Any):
        state, return_sum, length_sum, episodes = carry
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
            log_prob=jnp.asarray(log_probs, jnp.float32),
            truncated=ts.truncated,
        ))
        ended = jnp.logical_or(ts.terminated, ts.truncated)
        running_return, running_length, episode_return, episode_length = track_episodes(
            jnp, state.episode_return, state.episode_length, ts.reward, ended
        )
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
        return (state, return_sum, length_sum, episodes), None

    def iteration(state: LoopState, index: jax.Array) -> tuple[LoopState, IterationMetrics]:
        zero = (jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
        (state, return_sum, length_sum, episodes), _ = jax.lax.scan(
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
        return state, IterationMetrics(state.env_step, return_sum, length_sum, episodes, updated, info)

    def run(state: LoopState, n_iterations: int, first_index: int | jax.Array = 0) -> tuple[LoopState, IterationMetrics]:
        indices = first_index + jnp.arange(n_iterations)
        return jax.lax.scan(iteration, state, indices)

    return init, run


def _n_agents(buffer: BufferState) -> int:
    observation = buffer.data.observation
    return len(observation) if isinstance(observation, dict) else 1


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
) -> CompiledRun:
    """Trains ``agent`` in a JAX environment as one compiled program.

    Args:
        agent: a ``BaseAgent`` (any agent made from the four factories).
        env: a ``VecJaxEnv`` with ``num_envs == agent.config.env_cfg.n_envs``.
        n_env_steps: transitions per seed, summed over environments (rounded up to whole
            iterations: rollouts for on-policy agents).
        seeds: train these seeds together (``jax.vmap``, one program); default
            ``[agent.config.seed]`` without a seed axis. The agent's attributes are set to the
            final state only for a single seed.
        shard: with several devices and a number of seeds divisible by their count, shard the
            seed axis across devices (``jax.sharding``).
        log_every: report progress through a host callback every this many iterations (0: never).
        log_fn: ``log_fn(env_step, return_sum, episodes)`` called from inside the program.
        use_cache: enable JAX's persistent compilation cache (``enable_compilation_cache``).

    Returns:
        A ``CompiledRun`` with the final state, per-iteration metrics, compile and train seconds.
    """
    if not isinstance(n_env_steps, int) or isinstance(n_env_steps, bool) or n_env_steps < 1:
        raise ValueError(f"n_env_steps={n_env_steps!r} is not allowed; allowed: an int >= 1")
    if use_cache and not _CACHE_ENABLED and not os.environ.get("KITAE_NO_COMPILATION_CACHE"):
        enable_compilation_cache()
    init, run = make_loop_functions(agent, env, log_every=log_every, log_fn=log_fn)
    n_iterations = n_iterations_for(agent, env, n_env_steps)
    batched = seeds is not None
    seeds = list(seeds) if batched else [agent.config.seed]
    for seed in seeds:
        if not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise ValueError(f"seed={seed!r} is not allowed; allowed: an int in [0, 2**32)")

    def program(seed_array: jax.Array) -> tuple[LoopState, IterationMetrics]:
        if batched:
            return jax.vmap(lambda s: run(init(s), n_iterations))(seed_array)
        return run(init(seed_array), n_iterations)

    seed_array = jnp.asarray(seeds if batched else seeds[0], dtype=jnp.uint32)
    if batched and shard and jax.device_count() > 1 and len(seeds) % jax.device_count() == 0:
        mesh = jax.sharding.Mesh(np.array(jax.devices()), ("seeds",))
        seed_array = jax.device_put(seed_array, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("seeds")))

    start = time.perf_counter()
    compiled = jax.jit(program).lower(seed_array).compile()
    compile_seconds = time.perf_counter() - start
    start = time.perf_counter()
    final_state, metrics = compiled(seed_array)
    jax.block_until_ready(final_state)
    train_seconds = time.perf_counter() - start

    result = CompiledRun(
        state=final_state,
        metrics=jax.tree_util.tree_map(np.asarray, metrics),
        seeds=seeds,
        compile_seconds=compile_seconds,
        train_seconds=train_seconds,
        env_steps=int(n_iterations * _iteration_layout(agent, env.num_envs)[0] * env.num_envs),
    )
    if not batched:
        agent.state = final_state.agent_state
        agent.key = final_state.agent_key
        agent.env_step = int(final_state.env_step)
        agent.n_updates += int(np.sum(result.metrics.updated))
    return result


def log_compiled_metrics(writer: Any, result: CompiledRun, seed_index: int = 0) -> None:
    """Writes a compiled run's metrics to a TensorBoard writer, x axis = environment steps:
    ``charts/episodic_return`` and ``charts/episodic_length`` (means over the episodes that ended
    in each iteration), ``losses/<name>`` for each update, ``charts/SPS`` and
    ``charts/compile_seconds``."""
    m = jax.tree_util.tree_map(lambda x: x[seed_index] if result.batched else x, result.metrics)
    for i in range(len(m.env_step)):
        step = int(m.env_step[i])
        if m.episodes[i] > 0:
            writer.add_scalar("charts/episodic_return", float(m.return_sum[i] / m.episodes[i]), step)
            writer.add_scalar("charts/episodic_length", float(m.length_sum[i] / m.episodes[i]), step)
        if m.updated[i]:
            for name, values in m.info.items():
                writer.add_scalar(f"losses/{name}", float(values[i]), step)
    last = int(m.env_step[-1]) if len(m.env_step) else 0
    writer.add_scalar("charts/SPS", result.sps / len(result.seeds), last)
    writer.add_scalar("charts/compile_seconds", result.compile_seconds, last)
