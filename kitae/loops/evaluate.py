"""Evaluation: episodes of the deterministic policy (``agent.act(..., deterministic=True)``; a
recurrent agent's ``act_recurrent``, carrying its memory with the collection rule of
``kitae.loops.collect``), or with ``explore_step=N`` of the policy as it explores at environment
step ``N`` (``deterministic=False``: sampled actions, DQN's epsilon at that step, TD3's noise).

Each executor evaluates in its own kind of environment: ``evaluate_host`` steps Gymnasium,
EnvPool and PettingZoo vector environments from Python, ``evaluate_jax`` runs every episode of a
JAX environment together in one compiled loop.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from kitae.compilation_cache import use_compilation_cache
from kitae.envs.make import EnvSpec, make_jax_env, make_vec_env
from kitae.loops.collect import Memory, initial_memory, next_memory
from kitae.loops.multi_agent import env_agents, team_returns_program
from kitae.validation import check_positive_int

__all__ = ["evaluate_host", "evaluate_jax", "play_episode", "EvaluatesBySource"]


def _policy_step(
    agent: Any, params: Any, key: jax.Array, obs: Any, memory: Memory | None, explore_step: jax.Array | None
) -> tuple[Any, Any]:
    """``(actions, hidden)`` of the deterministic policy, or with ``explore_step`` (an int32
    scalar) of the exploring one at that step (``hidden`` ``None`` for a feed-forward agent)."""
    deterministic = explore_step is None
    step = jnp.zeros((), jnp.int32) if explore_step is None else explore_step
    if memory is None:
        return agent.act(params, key, obs, step, deterministic)[0], None
    actions, _, hidden = agent.act_recurrent(params, key, obs, memory.hidden, memory.start, step, deterministic)
    return actions, hidden


def _compiled(agent: Any, key: tuple, make: Any) -> Any:
    """``make()`` compiled once per ``(agent, key)``, kept on the agent (the function takes the
    parameters as an argument): a run that evaluates at every checkpoint
    (``train_cfg.eval_episodes``) compiles its evaluation once, not once per checkpoint."""
    table = getattr(agent, "__dict__", {}).setdefault("_kitae_evaluation", {})
    if key not in table:
        table[key] = make()
    return table[key]


def _acting(agent: Any, explore_step: int | None) -> Any:
    """``(params, key, observations, memory) -> (actions, hidden)``, compiled: the deterministic
    policy, or the exploring one at ``explore_step`` (an argument of the program: one compile)."""
    stochastic = explore_step is not None
    act = _compiled(
        agent,
        ("act", stochastic),
        lambda: jax.jit(lambda params, key, obs, memory, step: _policy_step(agent, params, key, obs, memory, step)),
    )
    step = jnp.asarray(explore_step, jnp.int32) if stochastic else None
    return lambda params, key, obs, memory: act(params, key, obs, memory, step)


def _check_explore_step(explore_step: int | None) -> None:
    if explore_step is not None and (
        not isinstance(explore_step, (int, np.integer)) or isinstance(explore_step, bool) or explore_step < 0
    ):
        raise ValueError(f"explore_step={explore_step!r} is not allowed; allowed: None or an int >= 0")


def evaluate_host(
    agent: Any, spec: EnvSpec, episodes: int, seed: int = 0, params: Any = None, explore_step: int | None = None
) -> np.ndarray:
    """Raw returns of ``episodes`` episodes, run as vector environments of up to 64, environment
    ``i`` seeded ``seed + i`` and counted for its first episode only; for PettingZoo environments,
    the team's return (the sum over agents); EnvPool Atari: whole games with unclipped rewards.

    Args:
        agent: the agent (its pure ``act``; a recurrent agent carries its hidden state).
        spec: the host environment (``kitae.envs.make.EnvSpec``: Gymnasium, EnvPool, PettingZoo).
        episodes: episodes to play (>= 1).
        seed: environment ``i`` is seeded ``seed + i``; acting keys split from ``PRNGKey(seed)``.
        params: the acting parameters to evaluate (default: ``agent.acting_params(agent.state)``).
        explore_step: ``None``, the deterministic policy; an environment step, the policy as it
            explores there.

    Returns:
        ``(episodes,)`` float64.
    """
    check_positive_int("episodes", episodes)
    _check_explore_step(explore_step)
    env_kwargs = None
    if spec.source == "envpool":
        from kitae.envs.envpool_env import evaluation_kwargs

        env_kwargs = evaluation_kwargs(spec.name)
    act = _acting(agent, explore_step)
    params = agent.acting_params(agent.state) if params is None else params
    key = jax.random.PRNGKey(seed)
    returns: list[float] = []
    while len(returns) < episodes:
        n = min(64, episodes - len(returns))
        env = make_vec_env(spec, n, env_kwargs=env_kwargs)
        try:
            observations, _ = env.reset(seed=seed + len(returns))
            totals, done = np.zeros(n), np.zeros(n, bool)
            memory = initial_memory(agent, n, tuple(env.possible_agents) if hasattr(env, "possible_agents") else None)
            while not done.all():
                key, act_key = jax.random.split(key)
                actions, hidden = act(params, act_key, observations, memory)
                if isinstance(actions, dict):  # PettingZoo: the team's reward; all agents end together
                    observations, rewards, terminations, truncations, _ = env.step(
                        {name: np.asarray(a) for name, a in actions.items()}
                    )
                    rewards = np.sum(list(rewards.values()), axis=0)
                    terminations = np.any(list(terminations.values()), axis=0)
                    truncations = np.any(list(truncations.values()), axis=0)
                else:
                    observations, rewards, terminations, truncations, _ = env.step(np.asarray(actions))
                totals += np.where(done, 0.0, rewards)
                ended = np.logical_or(terminations, truncations)
                done |= ended
                memory = next_memory(memory, hidden, ended)
        finally:
            env.close()
        returns.extend(totals.tolist())
    return np.asarray(returns)


def play_episode(
    agent: Any,
    env: Any,
    seed: int = 0,
    params: Any = None,
    frames: list | None = None,
    explore_step: int | None = None,
) -> float:
    """Plays one episode of the deterministic policy (with ``explore_step``, of the exploring one,
    as ``evaluate_host``) on one environment (not a vector one), as ``evaluate_host`` acts (a
    recurrent agent carries its hidden state): what ``kitae eval --video`` films.

    Args:
        agent: the agent (its pure ``act``).
        env: a ``gymnasium.Env`` (``Box`` actions clipped to the space), a PettingZoo
            ``ParallelEnv`` (stepped by ``kitae.envs.parallel.ParallelEnvCopy``, as in training;
            the return is the team's, the sum over agents), reset with ``seed``; or one JAX
            environment with ``step_without_reset`` and ``render(state)`` (a
            ``kitae.envs.brax_env.BraxEnv``, a ``kitae.envs.jaxmarl_env.JaxMARLEnv``: the team's
            return), reset from ``PRNGKey(seed)`` and stepped compiled.
        seed: the environment's reset seed; acting keys split from ``PRNGKey(seed)``.
        params: the acting parameters (default: ``agent.acting_params(agent.state)``).
        frames: if a list, ``env.render()``'s frame (a JAX environment's ``env.render(state)``)
            after the reset and after every step is appended to it (an environment made with
            ``render_mode="rgb_array"``).
        explore_step: as for ``evaluate_host``.

    Returns:
        The episode's raw return.
    """
    import gymnasium as gym

    from kitae.envs.parallel import ParallelEnvCopy, is_parallel_env

    _check_explore_step(explore_step)
    act = _acting(agent, explore_step)
    params = agent.acting_params(agent.state) if params is None else params
    key = jax.random.PRNGKey(seed)
    if hasattr(env, "step_without_reset"):
        return _play_jax_episode(agent, act, params, env, key, frames)
    copy = ParallelEnvCopy(env, autoreset=False) if is_parallel_env(env) else None
    memory = initial_memory(agent, 1, copy.agents if copy is not None else None)
    observation = copy.reset(seed=seed) if copy is not None else env.reset(seed=seed)[0]
    total, done = 0.0, False
    while not done:
        if frames is not None:
            frames.append(env.render())
        key, act_key = jax.random.split(key)
        if copy is not None:  # stacked (A, ...) -> the vector environments' {agent: (1, ...)}
            batch = {agent_name: observation[i][None] for i, agent_name in enumerate(copy.agents)}
            actions, hidden = act(params, act_key, batch, memory)
            observation, rewards, terminated, truncated, _ = copy.step([np.asarray(actions[a])[0] for a in copy.agents])
            total += float(np.sum(rewards))
            done = bool(np.any(terminated) or np.any(truncated))
        else:
            # a leading axis on every leaf: a Dict observation (a Tuple one read as Dict) is a dict
            batch = jax.tree_util.tree_map(lambda x: np.asarray(x)[None], observation)
            actions, hidden = act(params, act_key, batch, memory)
            action = np.asarray(actions)[0]
            if isinstance(env.action_space, gym.spaces.Box):
                action = np.clip(action, env.action_space.low, env.action_space.high)
            observation, reward, ended, cut, _ = env.step(action)
            total += float(reward)
            done = bool(ended or cut)
        memory = next_memory(memory, hidden, np.asarray([done]))
    if frames is not None:
        frames.append(env.render())
    return total


def _play_jax_episode(agent: Any, act: Any, params: Any, env: Any, key: jax.Array, frames: list | None) -> float:
    """``play_episode`` in one JAX environment: its reset and steps compiled, the loop in Python
    (a video draws every state), until the episode ends (the state it ends in is kept). In a
    multi-agent one (``env.agents``) every agent acts on its ``(1, ...)`` row, the return is the
    team's and the episode ends when any agent's does (JaxMARL's agents end together)."""
    step = jax.jit(env.step_without_reset)
    agents = getattr(env, "agents", None)
    key, reset_key = jax.random.split(key)
    observation, state = jax.jit(env.reset)(reset_key, env.default_params)
    memory = initial_memory(agent, 1, agents)
    total, done = 0.0, False
    while not done:
        if frames is not None:
            frames.append(env.render(state))
        key, act_key, step_key = jax.random.split(key, 3)
        rows = jax.tree_util.tree_map(lambda x: x[None], observation)
        actions, hidden = act(params, act_key, rows, memory)
        ts = step(step_key, state, jax.tree_util.tree_map(lambda x: x[0], actions), env.default_params)
        observation, state = ts.observation, ts.state
        total += float(sum(np.sum(r) for r in jax.tree_util.tree_leaves(ts.reward)))
        done = any(bool(f) for f in jax.tree_util.tree_leaves((ts.terminated, ts.truncated)))
        memory = next_memory(memory, hidden, np.asarray([done]))
    if frames is not None:
        frames.append(env.render(state))
    return total


def evaluate_jax(
    agent: Any, spec: EnvSpec, episodes: int, seed: int = 0, params: Any = None, explore_step: int | None = None
) -> np.ndarray:
    """Raw returns of ``episodes`` episodes of a JAX environment, one per copy, all run together
    in one compiled loop that stops when every copy has finished its first episode; multi-agent
    (JaxMARL): the team's return.

    Args:
        agent: the agent (its pure ``act``; a recurrent agent carries its hidden state).
        spec: the JAX environment (``kitae.envs.make.EnvSpec``: gymnax, Brax, JaxMARL).
        episodes: episodes to play, one per copy (>= 1).
        seed: the environments and acting keys derive from ``PRNGKey(seed)``.
        params: the acting parameters to evaluate (default: ``agent.acting_params(agent.state)``).
        explore_step: as for ``evaluate_host``.

    Returns:
        ``(episodes,)`` float64.
    """
    check_positive_int("episodes", episodes)
    _check_explore_step(explore_step)
    params = agent.acting_params(agent.state) if params is None else params
    stochastic = explore_step is not None
    evaluate = _compiled(
        agent, ("jax", spec.id, episodes, stochastic), lambda: _jax_evaluation(agent, spec, episodes, stochastic)
    )
    step = jnp.asarray(explore_step if stochastic else 0, jnp.int32)
    return np.asarray(evaluate(params, jax.random.PRNGKey(seed), step), dtype=np.float64)


def _jax_evaluation(agent: Any, spec: EnvSpec, episodes: int, stochastic: bool) -> Any:
    """``(params, key, step) -> returns (episodes,)``: ``evaluate_jax``'s episodes, compiled
    (JaxMARL's multi-agent episodes with ``team_returns_program``'s bookkeeping, as
    ``evaluate_team_returns``); ``stochastic``: the policy explores as at environment step ``step``."""
    env = make_jax_env(spec, episodes)
    agents = env_agents(env)
    if agents is not None:
        memory = initial_memory(agent, episodes, agents)

        def team_returns(params: Any, key: jax.Array, step: jax.Array) -> Any:
            def act(key: jax.Array, observation: Any, memory: Memory | None = None) -> Any:
                actions, hidden = _policy_step(agent, params, key, observation, memory, step if stochastic else None)
                return actions if memory is None else (actions, hidden)

            return team_returns_program(env, act, memory=memory)(key)[:, 0]

        return jax.jit(team_returns)
    limit = int(getattr(env.params, "max_steps_in_episode", getattr(env.params, "episode_length", 100_000))) + 1

    def evaluate(params: Any, key: jax.Array, step: jax.Array) -> jax.Array:
        key, reset_key = jax.random.split(key)
        observation, env_state = env.reset(reset_key)

        def cond(carry: tuple) -> jax.Array:
            t, *_, done = carry
            return jnp.logical_and(t < limit, jnp.logical_not(jnp.all(done)))

        def body(carry: tuple) -> tuple:
            t, key, observation, env_state, memory, returns, done = carry
            key, act_key, step_key = jax.random.split(key, 3)
            actions, hidden = _policy_step(agent, params, act_key, observation, memory, step if stochastic else None)
            ts = env.step(step_key, env_state, actions)
            returns = returns + jnp.where(done, 0.0, ts.reward)
            ended = jnp.logical_or(ts.terminated, ts.truncated)
            done = jnp.logical_or(done, ended)
            return t + 1, key, ts.observation, ts.state, next_memory(memory, hidden, ended), returns, done

        memory = initial_memory(agent, episodes)
        zeros = (jnp.zeros(episodes, jnp.float32), jnp.zeros(episodes, bool))
        return jax.lax.while_loop(cond, body, (0, key, observation, env_state, memory, *zeros))[5]

    return jax.jit(evaluate)


class EvaluatesBySource:
    """Every executor's ``evaluate``: ``evaluate_jax`` for a JAX environment, else
    ``evaluate_host`` (the distributed executor evaluates in its own process as the loop that runs
    the environment alone would)."""

    def evaluate(
        self,
        agent: Any,
        spec: EnvSpec,
        episodes: int,
        seed: int = 0,
        params: Any = None,
        explore_step: int | None = None,
    ) -> np.ndarray:
        """Raw returns of ``episodes`` episodes, ``(episodes,)``: see ``evaluate_host``. JAX's
        persistent compilation cache is on here as in the loops (``kitae.compilation_cache``), so a
        second evaluation of the same run loads its programs instead of compiling them."""
        use_compilation_cache()
        evaluate = evaluate_jax if spec.is_jax else evaluate_host
        return evaluate(agent, spec, episodes, seed, params, explore_step)
