"""The compiled loop's program: a whole training run as pure functions of a ``LoopState``.

``make_loop_functions(agent, env)`` gives ``fresh`` (a new run's state from its seed), ``attach``
(a state without environments completed with them) and ``run`` (iterations as a
``jax.lax.scan``): pure functions of arrays, ready for ``jax.jit``, ``jax.vmap`` over seeds and
sharding. ``kitae.loops.compiled.CompiledExecutor`` compiles and drives them::

    for each iteration:                          # jax.lax.scan
        for each vector step of the iteration:       # jax.lax.scan
            act, env.step (vmapped), buffer_add, episode statistics
        update when the schedule says so (on-policy: every iteration)

Multi-agent environments (``kitae.envs.jaxmarl_env.VecJaxMARLEnv``, an ``agents`` attribute)
train a parameter-shared agent: observations, actions, rewards and flags are dicts keyed by agent
all the way into the buffer; an episode ends for the team when it ends for every agent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from kitae.buffer import buffer_add, buffer_init, buffer_reset, check_buffer_memory
from kitae.envs.jax_env import VecJaxEnv
from kitae.envs.spaces import check_env_spaces
from kitae.loops.collect import UpdateOutcome, act_step, initial_memory, make_experience, update_step
from kitae.loops.jax_collect import jax_vector_step, reset_env_carry
from kitae.loops.multi_agent import env_agents
from kitae.loops.state import LoopState, env_reset_key, mark_episodes_cut, strongly_typed

__all__ = ["IterationMetrics", "make_loop_functions", "make_variant_functions", "loop_state_shape", "check_buffers_fit"]


class IterationMetrics(NamedTuple):
    """Metrics of one iteration (stacked over iterations by the scan): JAX arrays in the loop, NumPy
    arrays once fetched to the host.

    Attributes:
        env_step: transitions done at the end of the iteration.
        return_sum: sum of the returns of the episodes that ended in the iteration (multi-agent:
            team returns, each the sum of the agents' returns).
        length_sum: sum of their lengths.
        episodes: how many ended.
        updated: whether the iteration updated the agent (an update that was not kept does not count).
        info: the update's info (zeros where no update was made; as computed, not finite values
            included, where one was made and not kept).
        agent_return_sum: multi-agent only: ``{agent: sum of that agent's returns over the same
            episodes}``; ``None`` for a single agent.
        diverged: whether the run has diverged by the end of the iteration (an update of this
            iteration or an earlier one had a non-finite loss or state; from then on no update is
            kept: the state stays the last finite one).
    """

    env_step: jax.Array | np.ndarray
    return_sum: jax.Array | np.ndarray
    length_sum: jax.Array | np.ndarray
    episodes: jax.Array | np.ndarray
    updated: jax.Array | np.ndarray
    info: dict[str, jax.Array | np.ndarray]
    agent_return_sum: dict[str, jax.Array | np.ndarray] | None = None
    diverged: jax.Array | np.ndarray | None = None


def _check_env(agent: Any, env: Any) -> tuple[str, ...] | None:
    if not isinstance(env, VecJaxEnv):
        raise TypeError(
            f"env={env!r} is not allowed in the compiled loop; allowed: a kitae.envs.jax_env.VecJaxEnv "
            "(kitae.envs.make.make_jax_env)"
        )
    if agent.config.env_cfg.n_envs != env.num_envs:
        raise ValueError(
            f"the environment has {env.num_envs} copies but env_cfg.n_envs={agent.config.env_cfg.n_envs}; "
            "they must match"
        )
    check_env_spaces(agent.config.env_cfg, env.single_observation_space, env.single_action_space)
    agents = env_agents(env)
    n_agents = 1 if agents is None else len(agents)
    if agent.config.env_cfg.n_agents != n_agents:
        raise ValueError(
            f"the environment has {n_agents} agent(s) but env_cfg.n_agents={agent.config.env_cfg.n_agents}; "
            "they must match"
        )
    return agents


def make_loop_functions(agent: Any, env: VecJaxEnv) -> tuple[Callable, Callable, Callable]:
    """Builds the pure functions of a compiled run.

    Returns:
        ``(fresh, attach, run)``:

        - ``fresh(seed) -> LoopState``: a new run's state from its seed alone (vmappable);
        - ``attach(state, seed) -> LoopState``: completes a state without an environment part
          (the agent facade's, a host checkpoint's): resets the environments (seeded from the seed
          and the step), allocates the buffer if it has none, and marks the buffer's newest row
          truncated if the run is past step 0;
        - ``run(state, n_iterations, first_index=0, *, length=None) -> (state, metrics)``: a
          ``jax.lax.scan`` of iterations (with ``length``, a loop over a traced number of
          iterations up to ``length``, so one program runs segments of any length).

        All are pure functions of arrays, ready for ``jax.jit``, ``jax.vmap`` (over seeds) and
        sharding.
    """
    agents = _check_env(agent, env)
    schedule = agent.schedule
    n_envs = env.num_envs
    steps_per_iteration = schedule.vector_steps_per_iteration
    capacity = agent.config.update_cfg.max_buffer_size
    experience_type = agent.experience_type

    def per_agent(make: Callable[[], Any]) -> Any:
        """``make()``, or ``{agent: make()}`` in a multi-agent environment."""
        return make() if agents is None else {a: make() for a in agents}

    def empty_buffer(agent_state: Any, agent_key: jax.Array, observation: Any) -> Any:
        memory = initial_memory(agent, n_envs, agents)
        actions, log_probs, _, _ = jax.eval_shape(
            lambda s, k, o: act_step(agent, agent.acting_params(s), k, o, jnp.zeros((), jnp.int32), memory=memory),
            agent_state,
            agent_key,
            observation,
        )
        example = make_experience(
            experience_type,
            observation=observation,
            action=jax.tree_util.tree_map(lambda a: jnp.zeros(a.shape, a.dtype), actions),
            reward=per_agent(lambda: jnp.zeros((n_envs,), jnp.float32)),
            done=per_agent(lambda: jnp.zeros((n_envs,), bool)),
            next_observation=observation,
            log_prob=jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape, jnp.float32), log_probs),
            truncated=per_agent(lambda: jnp.zeros((n_envs,), bool)),
            memory=memory,
        )
        return buffer_init(example, capacity, agent.config.replay.prioritized)

    def attach(state: LoopState, seed: jax.Array) -> LoopState:
        step = jnp.asarray(state.env_step, jnp.int32)
        carry = reset_env_carry(env, agents, env_reset_key(seed, step), initial_memory(agent, n_envs, agents))
        if state.buffer is None:
            buffer = empty_buffer(state.agent_state, state.agent_key, carry.observation)
        else:
            buffer = mark_episodes_cut(state.buffer, step > 0)
        diverged_step = jnp.full((), -1, jnp.int32) if state.diverged_step is None else state.diverged_step
        out = LoopState(
            state.agent_state,
            jnp.asarray(state.agent_key),
            buffer,
            step,
            jnp.asarray(state.n_updates, jnp.int32),
            carry,
            jnp.asarray(diverged_step, jnp.int32),
        )
        # strongly typed leaves: a fresh and a restored state trace, compile and compute the same program
        return strongly_typed(out)

    def fresh(seed: jax.Array) -> LoopState:
        agent_key, agent_state = agent.initial_state(seed)
        zero = jnp.zeros((), jnp.int32)
        return attach(LoopState(agent_state, agent_key, None, zero, zero), seed)

    def vector_step(carry: tuple, _: Any) -> tuple[tuple, None]:
        state, return_sum, length_sum, episodes, agent_return_sum = carry
        out = jax_vector_step(
            agent, env, agents, agent.acting_params(state.agent_state), state.agent_key, state.env, state.env_step
        )
        buffer = buffer_add(state.buffer, out.experience)
        if out.agent_returns is not None:
            ended_returns = {a: jnp.where(out.ended, r, 0.0) for a, r in out.agent_returns.items()}
            agent_return_sum = {a: agent_return_sum[a] + jnp.sum(r) for a, r in ended_returns.items()}
        return_sum = return_sum + jnp.sum(jnp.where(out.ended, out.episode_return, 0.0))
        length_sum = length_sum + jnp.sum(jnp.where(out.ended, out.episode_length, 0))
        episodes = episodes + jnp.sum(out.ended)
        state = state._replace(agent_key=out.agent_key, buffer=buffer, env_step=state.env_step + n_envs, env=out.env)
        return (state, return_sum, length_sum, episodes, agent_return_sum), None

    def iteration(state: LoopState, index: jax.Array) -> tuple[LoopState, IterationMetrics]:
        del index
        diverged_step = state.diverged_step
        assert diverged_step is not None  # attach() gives every compiled state one
        diverged = diverged_step >= 0
        zero = (
            jnp.zeros((), jnp.float32),
            jnp.zeros((), jnp.int32),
            jnp.zeros((), jnp.int32),
            None if agents is None else per_agent(lambda: jnp.zeros((), jnp.float32)),
        )
        (state, return_sum, length_sum, episodes, agent_return_sum), _ = jax.lax.scan(
            vector_step, (state, *zero), None, length=steps_per_iteration
        )
        assert state.buffer is not None  # attach() gives every compiled state a buffer
        active = jnp.logical_not(diverged)  # a diverged run keeps its last finite state
        if schedule.on_policy:  # an iteration is one rollout: it always ends with an update
            out = update_step(agent, state.agent_state, state.agent_key, state.buffer, active)
            buffer, made = buffer_reset(state.buffer), jnp.ones((), bool)
        else:
            made = jnp.asarray(schedule.update_due(state.env_step, state.buffer.size))
            skipped_info = jax.tree_util.tree_map(
                lambda x: jnp.zeros(x.shape, x.dtype),
                jax.eval_shape(
                    lambda s, k: update_step(agent, s, k, state.buffer).info, state.agent_state, state.agent_key
                ),
            )
            out = jax.lax.cond(
                made,
                lambda s, k, p: update_step(agent, s, k, state.buffer, active),
                lambda s, k, p: UpdateOutcome(s, k, skipped_info, p, jnp.ones((), bool)),
                state.agent_state,
                state.agent_key,
                state.buffer.priorities,
            )
            buffer = state.buffer._replace(priorities=out.priorities)
        updated = jnp.logical_and(made, jnp.logical_and(active, out.finite))
        diverges = jnp.logical_and(active, jnp.logical_and(made, jnp.logical_not(out.finite)))
        state = state._replace(
            agent_state=out.agent_state,
            agent_key=out.key,
            buffer=buffer,
            n_updates=state.n_updates + updated.astype(jnp.int32),
            diverged_step=jnp.where(diverges, state.env_step, diverged_step),
        )
        metrics = IterationMetrics(
            state.env_step,
            return_sum,
            length_sum,
            episodes,
            updated,
            out.info,
            agent_return_sum,
            jnp.logical_or(diverged, diverges),
        )
        return state, metrics

    def run(
        state: LoopState,
        n_iterations: int | jax.Array,
        first_index: int | jax.Array = 0,
        *,
        length: int | None = None,
    ) -> tuple[LoopState, IterationMetrics]:
        """Runs ``n_iterations`` iterations, numbered from ``first_index``.

        With ``length=None``, ``n_iterations`` is static (a Python int) and the metrics have a
        leading axis of ``n_iterations``. With a static ``length``, ``n_iterations`` may be traced
        (``<= length``): one compiled program then runs segments of any length up to ``length``,
        and the metrics have a leading axis of ``length`` (rows past ``n_iterations`` are zeros).
        Each iteration runs the same computation either way, so cutting a run into segments
        gives the same bits as one program. A state that has diverged (``state.diverged_step``)
        keeps no update.
        """
        # jitted, the iteration is traced once however often it is called with the same shapes:
        # the segments' rows need its metrics' shapes before the loop that runs it
        step = jax.jit(iteration)
        if length is None:
            return jax.lax.scan(step, state, first_index + jnp.arange(n_iterations, dtype=jnp.int32))
        index = jnp.asarray(first_index, jnp.int32)
        metrics_shape = jax.eval_shape(step, state, index)[1]
        rows = jax.tree_util.tree_map(lambda x: jnp.zeros((length, *x.shape), x.dtype), metrics_shape)

        def body(i: jax.Array, loop: tuple[LoopState, IterationMetrics]) -> tuple[LoopState, IterationMetrics]:
            state, rows = loop
            state, metrics = step(state, index + i)
            rows = jax.tree_util.tree_map(lambda r, x: r.at[i].set(x), rows, metrics)
            return state, rows

        return jax.lax.fori_loop(0, jnp.minimum(n_iterations, length), body, (state, rows))

    return fresh, attach, run


def _rebind(tree: Any, like: Any) -> Any:
    """``tree``'s leaves in ``like``'s structure: the same arrays, with the static parts (an
    optimizer, an apply function: made from a config) of ``like``."""
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), jax.tree_util.tree_leaves(tree))


def make_variant_functions(agent: Any, env: VecJaxEnv, keys: tuple[str, ...]) -> tuple[Callable, Callable, Callable]:
    """``make_loop_functions`` for an agent whose float hyperparameters ``keys`` are arguments:
    ``fresh(seed, values)``, ``attach(state, seed)`` and ``run(state, values, n_iterations,
    first_index=0, *, length=None)``, with ``values`` a ``{key: scalar}`` dict (traced
    in the program: ``jax.vmap`` over it trains several configurations in one program, as over
    seeds).

    Inside each function the agent is rebuilt from ``kitae.config.traced_config`` with the given
    values (``BaseAgent.with_config``). A state's static parts (a ``TrainState``'s optimizer, made
    from the learning rate) are made from the config too: ``fresh`` returns a state in the
    structure of ``agent``'s own, ``run`` returns one in the structure it was given, and both
    rebuild the traced agent's inside.

    Raises:
        ValueError: for a key that is not a float field of the config
            (``kitae.config.sweepable_keys``).
    """
    from kitae.config import traced_config

    traced_config(agent.config, dict.fromkeys(keys, 0.0))  # refuses unknown or non-float keys now
    base_fresh, attach, base_run = make_loop_functions(agent, env)
    if not keys:

        def plain_fresh(seed: jax.Array, values: dict) -> LoopState:
            return base_fresh(seed)

        def plain_run(state: LoopState, values: dict, *args: Any, **kwargs: Any) -> tuple[LoopState, Any]:
            return base_run(state, *args, **kwargs)

        return plain_fresh, attach, plain_run
    like = jax.eval_shape(lambda: agent.initial_state(jnp.zeros((), jnp.uint32))[1])

    def agent_of(values: dict[str, jax.Array]) -> Any:
        return agent.with_config(traced_config(agent.config, {k: values[k] for k in keys}))

    def fresh(seed: jax.Array, values: dict[str, jax.Array]) -> LoopState:
        state = make_loop_functions(agent_of(values), env)[0](seed)
        return state._replace(agent_state=_rebind(state.agent_state, like))

    def run(state: LoopState, values: dict[str, jax.Array], *args: Any, **kwargs: Any) -> tuple[LoopState, Any]:
        variant = agent_of(values)
        # Made in this trace, not under jax.eval_shape: a static part may hold a value computed
        # from a traced hyperparameter when it is made (optax.adam(lr) keeps -lr in its update
        # function's closure), which eval_shape's trace would leave behind, dead, in the program
        # (a custom agent's swept learning rate failed: "compiled for 50 inputs but called with
        # 49"). Only its structure is used; XLA drops the unused initialisation.
        own = variant.initial_state(jnp.zeros((), jnp.uint32))[1]
        run_fn = make_loop_functions(variant, env)[2]
        given = state.agent_state
        state, metrics = run_fn(state._replace(agent_state=_rebind(given, own)), *args, **kwargs)
        # returned in the structure it came in (a fresh state's, or a restored checkpoint's), so a
        # program's output is its next call's input
        return state._replace(agent_state=_rebind(state.agent_state, given)), metrics

    return fresh, attach, run


def loop_state_shape(agent: Any, env: VecJaxEnv, seeds: list[int] | None = None) -> LoopState:
    """The abstract ``LoopState`` (``jax.ShapeDtypeStruct`` leaves) of a compiled run of ``agent`` in
    ``env``, with a leading seed axis when ``seeds`` are given: what a checkpoint is restored into."""
    fresh, _, _ = make_loop_functions(agent, env)
    if seeds is None:
        return jax.eval_shape(fresh, jnp.asarray(agent.config.seed, jnp.uint32))
    return jax.eval_shape(jax.vmap(fresh), jnp.asarray(seeds, jnp.uint32))


def check_buffers_fit(agent: Any, shape: LoopState, copies: int) -> None:
    """Refuses a run whose buffers (``shape.buffer``: the abstract starting state's, ``copies``
    seeds or sweep rows of them along its leading axis) need more memory than is available,
    before the starting state is made (``kitae.buffer.check_buffer_memory``: the exact bytes,
    where ``BaseAgent.check_buffer_memory``, which ``kitae train`` and ``agent.train`` call before
    they write anything, counts a lower bound from the config's spaces)."""
    need = sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(shape.buffer))
    check_buffer_memory(need, agent.config.update_cfg.max_buffer_size, "update_cfg.max_buffer_size", copies)
