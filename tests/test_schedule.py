"""One schedule for every executor: when updates happen, how long a run is, when checkpoints are due,
and the learning-rate horizon that follows from them."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

import kitae.config as cfg
from kitae.algos.collections.dqn import DQN, DQNParams
from kitae.algos.collections.ppo import PPO, PPOParams
from kitae.envs.make import make_jax_env, make_vec_env
from kitae.loops.compiled import CompiledExecutor
from kitae.loops.host import HostExecutor
from kitae.modules.optimizer import learning_rate
from kitae.schedule import Schedule, check_iteration_size
from kitae.types import AlgoType


def _schedule(
    skip: int,
    n_envs: int,
    start: int,
    batch: int = 8,
    agents: int = 1,
    on_policy: bool = False,
    rollout: int = 16,
    epochs: int = 1,
) -> Schedule:
    env = make_vec_env("CartPole-v1", 1)
    params = PPOParams() if on_policy else DQNParams(skip_steps=skip, start_step=start)
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=params,
        update_cfg=cfg.UpdateConfig(batch_size=batch, max_buffer_size=rollout, n_epochs=epochs),
        train_cfg=cfg.TrainConfig(n_env_steps=1000),
        env_cfg=cfg.EnvConfig("CartPole-v1", env.single_observation_space, env.single_action_space, n_envs, agents),
    )
    env.close()
    return Schedule.from_config(config, AlgoType.ON_POLICY if on_policy else AlgoType.OFF_POLICY)


def _enumerated_updates(schedule: Schedule, n_env_steps: int) -> list[int]:
    """The update steps of a run, checking ``update_due`` after every vector step."""
    steps, rows = [], 0
    for k in range(1, schedule.run_steps(n_env_steps) // schedule.n_envs + 1):
        rows += 1
        step = k * schedule.n_envs
        if schedule.update_due(step, rows):
            steps.append(step)
            if schedule.on_policy:
                rows = 0
    return steps


def test_the_issue_example_updates_once_per_skip_steps_in_every_loop():
    # skip_steps=12 with 8 environments: one update per vector step that crosses a multiple of 12
    schedule = _schedule(12, 8, 0)
    assert schedule.vector_steps_per_iteration == 1  # 8 does not divide 12
    assert _enumerated_updates(schedule, 96) == [16, 24, 40, 48, 64, 72, 88, 96]  # 8 updates in 96 = every 12
    assert schedule.n_updates(96) == 8


@pytest.mark.parametrize(
    "skip, n_envs, start, batch, agents",
    list(itertools.product([1, 3, 4, 12, 256], [1, 2, 8], [0, 7, 100], [1, 64], [1, 3])),
)
def test_n_updates_counts_what_the_loops_do(skip, n_envs, start, batch, agents):
    schedule = _schedule(skip, n_envs, start, batch=batch, agents=agents, rollout=512)
    for n in (1, 99, 1000, 1234):
        assert schedule.n_updates(n) == len(_enumerated_updates(schedule, n)), n


def test_iterations_are_whole_and_regular_when_n_envs_divides_skip_steps():
    schedule = _schedule(256, 4, 1000)
    assert schedule.vector_steps_per_iteration == 64 and schedule.steps_per_iteration == 256
    assert schedule.run_steps(100_000) == 100_096  # rounded up to whole iterations
    updates = _enumerated_updates(schedule, 2048)
    assert updates == [1024, 1280, 1536, 1792, 2048]  # every iteration end from start_step on
    assert all(step % schedule.steps_per_iteration == 0 for step in updates)


def test_a_run_longer_than_the_int32_counters_is_refused():
    """JAX's step counters are int32: a run past 2**31 - 1 steps would wrap them around."""
    schedule = _schedule(1, 4, 0, batch=16, on_policy=True, rollout=128, epochs=1)
    assert schedule.n_iterations(2**31 - 512) * 512 == 2**31 - 512
    with pytest.raises(ValueError, match=r"n_env_steps=2,147,483,647 is not allowed: in whole iterations of 512"):
        schedule.n_iterations(2**31 - 1)  # rounded up to 2**31
    with pytest.raises(ValueError, match=r"train_cfg.n_env_steps=2147483648 is not allowed; allowed: an int >= 1 and"):
        cfg.TrainConfig(n_env_steps=2**31)
    assert cfg.TrainConfig(n_env_steps=2**31 - 1).n_env_steps == cfg.MAX_ENV_STEPS


def test_an_iteration_longer_than_the_int32_counters_names_n_envs():
    """One iteration of 10**8 environments is past the int32 counters at any n_env_steps: the
    error named the user's n_env_steps (1,000) instead of n_envs."""
    schedule = _schedule(1, 10**8, 0, batch=16, on_policy=True, rollout=128, epochs=1)
    with pytest.raises(ValueError, match=r"^n_envs=100,000,000 is not allowed: one iteration \(128 vector steps of "):
        schedule.n_iterations(1000)
    with pytest.raises(ValueError, match=r"allowed: at most 16,777,215 environments here"):
        check_iteration_size(16_777_216, 128)
    check_iteration_size(16_777_215, 128)  # 2**31 - 128 steps: allowed


def test_on_policy_iterations_are_rollouts():
    schedule = _schedule(1, 4, 0, batch=16, on_policy=True, rollout=32, epochs=3)
    assert schedule.steps_per_iteration == 128
    assert schedule.gradient_steps_per_update == 3 * (32 * 4 // 16)
    assert _enumerated_updates(schedule, 500) == [128, 256, 384, 512]
    assert schedule.n_gradient_steps(500) == 4 * 24


def test_checkpoints_are_due_at_the_iteration_that_crosses_the_save_period():
    schedule = dataclasses.replace(_schedule(1, 1, 0, on_policy=True, rollout=128), save_frequency=1000)
    assert schedule.save_iterations(0, 20) == [8, 16]  # iteration 8 ends at 1024, 16 at 2048
    assert not schedule.save_due(1024, 1152) and schedule.save_due(896, 1024)
    assert dataclasses.replace(schedule, save_frequency=-1).save_iterations(0, 20) == []


def test_the_guide_fields_are_read_from_the_params_with_defaults():
    @dataclasses.dataclass
    class Bare:
        gamma: float = 0.9

    env = make_vec_env("CartPole-v1", 1)
    config = cfg.AlgoConfig(
        0,
        Bare(),
        cfg.UpdateConfig(batch_size=4),
        cfg.TrainConfig(n_env_steps=100),
        cfg.EnvConfig("CartPole-v1", env.single_observation_space, env.single_action_space, 2),
    )
    env.close()
    schedule = Schedule.from_config(config, AlgoType.OFF_POLICY)
    assert (schedule.start_step, schedule.skip_steps, schedule.vector_steps_per_iteration) == (0, 1, 1)


# ---------------------------------------------------------------------------------------------
# The acceptance: the host and the compiled loops follow the same schedule
# ---------------------------------------------------------------------------------------------


GRID = [  # (skip_steps, n_envs, start_step): regular and irregular iterations, start inside one
    (12, 8, 0),  # the issue's example: every 12 transitions, not every 8
    (1, 4, 0),
    (3, 1, 10),
    (8, 4, 20),
    (4, 8, 30),
    (5, 2, 7),
]


def _dqn_config(skip: int, n_envs: int, start: int, observation_space, action_space) -> cfg.AlgoConfig:
    return cfg.AlgoConfig(
        seed=0,
        algo_params=DQNParams(skip_steps=skip, start_step=start, hidden=(8,), target_update_interval=5),
        update_cfg=cfg.UpdateConfig(
            learning_rate=1e-2, learning_rate_annealing=True, batch_size=8, max_buffer_size=64, n_epochs=2
        ),
        train_cfg=cfg.TrainConfig(n_env_steps=200),
        env_cfg=cfg.EnvConfig("CartPole-v1", observation_space, action_space, n_envs),
    )


@pytest.mark.parametrize("skip, n_envs, start", GRID)
def test_host_and_compiled_loops_update_at_the_same_steps_with_the_same_learning_rate(skip, n_envs, start):
    host_env = make_vec_env("CartPole-v1", n_envs)
    config = _dqn_config(skip, n_envs, start, host_env.single_observation_space, host_env.single_action_space)
    host = HostExecutor().run(DQN("host", config, run_dir="unused"), host_env, 200)
    jax_env = make_jax_env("gymnax:CartPole-v1", n_envs)
    compiled = CompiledExecutor().run(DQN("compiled", config, run_dir="unused"), jax_env, 200)

    schedule = Schedule.from_config(config, AlgoType.OFF_POLICY)
    expected = _enumerated_updates(schedule, 200)
    assert host.env_steps == compiled.env_steps == schedule.run_steps(200)
    np.testing.assert_array_equal(host.update_steps[0], expected)
    np.testing.assert_array_equal(compiled.update_steps[0], expected)
    for result in (host, compiled):
        assert int(result.state.n_updates) == len(expected)
        assert int(result.state.agent_state.qvalue.step) == schedule.n_gradient_steps(200)  # the whole horizon
    host_lr = float(learning_rate(host.state.agent_state.qvalue.opt_state))
    compiled_lr = float(learning_rate(compiled.state.agent_state.qvalue.opt_state))
    horizon = schedule.n_gradient_steps(200)
    assert host_lr == compiled_lr == pytest.approx(1e-2 / horizon, rel=1e-5)  # the last rate: one step before 0


def test_the_learning_rate_horizon_is_the_number_of_gradient_steps():
    env = make_vec_env("CartPole-v1", 4)
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=PPOParams(),
        update_cfg=cfg.UpdateConfig(
            learning_rate=1e-3, learning_rate_annealing=True, batch_size=32, max_buffer_size=16, n_epochs=2
        ),
        train_cfg=cfg.TrainConfig(n_env_steps=200),
        env_cfg=cfg.EnvConfig("CartPole-v1", env.single_observation_space, env.single_action_space, 4),
    )
    result = HostExecutor().run(PPO("ppo", config, run_dir="unused"), env, 200)
    schedule = Schedule.from_config(config, AlgoType.ON_POLICY)
    assert result.env_steps == 256 and list(result.update_steps[0]) == [64, 128, 192, 256]
    assert int(result.state.agent_state.actor_critic.step) == schedule.n_gradient_steps(200) == 4 * 2 * 2
    assert float(learning_rate(result.state.agent_state.actor_critic.opt_state)) == pytest.approx(1e-3 / 16, rel=1e-5)


def test_a_constant_learning_rate_can_be_set_in_the_optimizer_state():
    import jax.numpy as jnp
    import optax

    from kitae.modules.optimizer import optimizer_factory, set_learning_rate

    params = {"w": jnp.ones(3)}
    optimizer = optimizer_factory(1e-3, max_grad_norm=1.0)
    state = set_learning_rate(optimizer.init(params), 1e-5)
    assert float(learning_rate(state)) == pytest.approx(1e-5)
    updates, state = optimizer.update({"w": jnp.ones(3)}, state, params)
    assert float(learning_rate(state)) == pytest.approx(1e-5)  # stays for the next updates
    assert float(jnp.max(jnp.abs(updates["w"]))) == pytest.approx(1e-5, rel=1e-3)  # Adam's first step: the rate
    with pytest.raises(ValueError, match="holds no learning rate"):
        set_learning_rate(optax.sgd(0.1).init(params), 1e-3)
