"""The executor seam: one protocol, picked in one place, with the same callbacks, payloads and
results from every executor."""

from __future__ import annotations

import numpy as np
import pytest
from _agents import TinyA2C, TinyA2CParams, TinyDQN, TinyDQNParams, make_config

from kitae.envs.make import EnvSpec, make_jax_env, make_vec_env
from kitae.loops.callbacks import Callback
from kitae.loops.compiled import CompiledExecutor
from kitae.loops.executor import EXECUTORS, executor_for
from kitae.loops.host import HostExecutor


class Recorder(Callback):
    """Records what an executor reports."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.episodes = 0
        self.checkpoints: list[int] = []
        self.loss_steps: list[int] = []

    def on_start(self, info) -> None:
        self.calls.append("start")
        self.info = info

    def on_episodes(self, episodes) -> None:
        self.episodes += int(episodes.count.sum())

    def on_losses(self, step, losses, seed_index) -> None:
        self.loss_steps.append(step)

    def on_checkpoint(self, payload) -> None:
        self.checkpoints.append(int(np.max(np.asarray(payload.state.env_step))))
        self.payload = payload

    def on_end(self, result) -> None:
        self.calls.append("end")
        self.result = result


def test_one_place_picks_the_executor():
    assert executor_for(make_jax_env("gymnax:CartPole-v1", 2)) is EXECUTORS["compiled"]
    assert executor_for(make_vec_env("CartPole-v1", 2)) is EXECUTORS["host"]
    assert executor_for("gymnax:CartPole-v1") is EXECUTORS["compiled"]
    assert executor_for(EnvSpec.parse("brax:ant")) is EXECUTORS["compiled"]
    assert executor_for("CartPole-v1") is executor_for("envpool:Pong-v5") is EXECUTORS["host"]
    assert EXECUTORS["compiled"].batches_seeds and not EXECUTORS["host"].batches_seeds
    for executor in EXECUTORS.values():
        assert callable(executor.run) and callable(executor.restore_target) and callable(executor.evaluate)


@pytest.mark.parametrize("loop", ["host", "compiled"])
def test_both_executors_report_through_the_same_callbacks(loop):
    env = make_jax_env("gymnax:CartPole-v1", 4) if loop == "compiled" else make_vec_env("CartPole-v1", 4)
    config = make_config(env, TinyA2CParams(), max_buffer_size=16, batch_size=32, n_epochs=1, n_env_steps=640)
    config.train_cfg.save_frequency = 128
    config.train_cfg.log_frequency = 128
    recorder = Recorder()
    executor = CompiledExecutor() if loop == "compiled" else HostExecutor()
    result = executor.run(TinyA2C("x", config, run_dir="unused"), env, 640, callbacks=[recorder])
    assert recorder.calls == ["start", "end"] and recorder.result is result
    assert recorder.info.start_step == 0 and recorder.info.end_step == 640
    assert recorder.checkpoints == [128, 256, 384, 512, 640]  # every 128 steps (iteration ends) and the end
    assert recorder.loss_steps == [128, 256, 384, 512, 640]  # every log_frequency steps and at checkpoints
    assert recorder.payload.meta["executor"] == loop and recorder.payload.meta["env_saved"] == (loop == "compiled")
    assert (recorder.payload.state.env is None) == (loop == "host")
    assert recorder.episodes == int(result.episodes[0].count.sum()) > 0
    assert list(result.update_steps[0]) == [64 * k for k in range(1, 11)]
    assert result.executor == loop and result.env_steps == 640 and int(result.state.n_updates) == 10


@pytest.mark.parametrize("loop", ["host", "compiled"])
def test_a_second_train_call_goes_on_from_the_agents_state(loop, tmp_path):
    env = make_jax_env("gymnax:CartPole-v1", 2) if loop == "compiled" else make_vec_env("CartPole-v1", 2)
    config = make_config(
        env,
        TinyDQNParams(start_step=16, skip_steps=4),
        max_buffer_size=64,
        batch_size=8,
        n_env_steps=96,
        task_name="gymnax:CartPole-v1" if loop == "compiled" else "CartPole-v1",
    )
    agent = TinyDQN("x", config, run_dir=tmp_path / "run")
    first = agent.train(env, 48)
    if loop == "host":
        env = make_vec_env("CartPole-v1", 2)  # the host loop closed it
    second = agent.train(env, 48)
    assert (first.start_step, first.env_steps, second.start_step, second.env_steps) == (0, 48, 48, 96)
    assert agent.env_step == 96 and agent.n_updates == len(first.update_steps[0]) + len(second.update_steps[0])
    assert list(second.update_steps[0]) == list(range(52, 97, 4))  # the schedule goes on where it was
    assert sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()) == [48, 96]


@pytest.mark.parametrize("loop", ["host", "compiled"])
def test_an_environment_of_other_spaces_is_refused_before_anything_runs(loop, tmp_path):
    """Both executors check the environment's spaces against ``env_cfg`` (one rule,
    ``kitae.envs.spaces.check_env_spaces``), instead of failing inside the networks."""
    make = (lambda i: make_jax_env(f"gymnax:{i}", 2)) if loop == "compiled" else (lambda i: make_vec_env(i, 2))
    config = make_config(make("CartPole-v1"), TinyA2CParams(), max_buffer_size=16, batch_size=32, n_env_steps=64)
    executor = CompiledExecutor() if loop == "compiled" else HostExecutor()
    wrong = make("Acrobot-v1")  # observations (6,), three actions
    message = "observation space does not match env_cfg.observation_space.*shape \\(6,\\) where \\(4,\\) was expected"
    with pytest.raises(ValueError, match=message):
        executor.run(TinyA2C("x", config, run_dir=tmp_path / "run"), wrong, 64)


def test_space_mismatch_names_what_differs_and_ignores_bounds():
    import gymnasium as gym

    from kitae.envs.spaces import space_mismatch

    box = gym.spaces.Box(-1.0, 1.0, (4,))
    assert space_mismatch(box, gym.spaces.Box(-5.0, 5.0, (4,), np.float64)) is None  # bounds and dtype: not checked
    assert space_mismatch(box, gym.spaces.Box(-1.0, 1.0, (3,))) == "shape (3,) where (4,) was expected"
    assert space_mismatch(box, gym.spaces.Discrete(4)) == "Discrete where Box was expected"
    assert space_mismatch(gym.spaces.Discrete(2), gym.spaces.Discrete(3)) == (
        "Discrete(3, start=0) where Discrete(2, start=0) was expected"
    )
    assert space_mismatch(gym.spaces.MultiDiscrete([2, 3]), gym.spaces.MultiDiscrete([2, 4])) == (
        "nvec [2, 4] where [2, 3] was expected"
    )
    nested = gym.spaces.Dict({"a": box, "b": gym.spaces.Tuple([gym.spaces.Discrete(2), box])})
    assert space_mismatch(nested, nested) is None
    other = gym.spaces.Dict({"a": box, "b": gym.spaces.Tuple([gym.spaces.Discrete(2), gym.spaces.Box(0, 1, (5,))])})
    assert space_mismatch(nested, other) == "shape (5,) where (4,) was expected at ['b'][1]"
    assert space_mismatch(nested, gym.spaces.Dict({"a": box})) == "keys ['a'] where ['a', 'b'] were expected"
    # the same task from two sources declares other bounds: one agent trains in both
    gymnasium_env, gymnax_env = make_vec_env("CartPole-v1", 1), make_jax_env("gymnax:CartPole-v1", 1)
    assert space_mismatch(gymnasium_env.single_observation_space, gymnax_env.single_observation_space) is None
    gymnasium_env.close()


def test_the_writer_logs_one_sps_point_per_step_at_a_runs_end():
    """A run whose last progress report wrote ``charts/SPS`` at its last step got a second point
    there from ``on_end`` (the audit's 3-seed compiled run: 18,618 and 18,222 at step 100,352)."""
    from kitae.loops.callbacks import Progress, WriterLogger
    from kitae.loops.result import RunResult

    class Points:  # what WriterLogger takes: anything with add_scalar(tag, value, step)
        def __init__(self) -> None:
            self.points: list[tuple[str, float, int]] = []

        def add_scalar(self, tag: str, value: float, step: int) -> None:
            self.points.append((tag, value, step))

    def result(env_steps: int) -> RunResult:
        return RunResult("compiled", [0, 1], None, [], [], 0, env_steps, compile_seconds=1.0, train_seconds=2.0)

    for last_progress, end, expected in ((1_000, 1_000, [1_000]), (1_000, 1_512, [1_000, 1_512])):
        writer = Points()
        logger = WriterLogger(writer, sps_every_seconds=0.0)
        logger.on_progress(Progress(0, 0.0, None))  # starts the clock
        logger.on_progress(Progress(last_progress, 500.0, None))
        logger.on_end(result(end))
        assert [step for tag, _, step in writer.points if tag == "charts/SPS"] == expected
        assert writer.points[-1] == ("charts/compile_seconds", 1.0, end)
    assert writer.points[1] == ("charts/SPS", 1_512 * 2 / 2.0 / 2, 1_512)  # the run's, per seed
