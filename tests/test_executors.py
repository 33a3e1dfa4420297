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
