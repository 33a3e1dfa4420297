"""Distributed runs on the one road (command line, Python, resume, eval) and their faults (a
killed worker replaced; out of replacements, a checkpoint and a stop), on a real Ray runtime shared
by the tests of this module."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time

import psutil
import pytest

from kitae.config import DistributedConfig
from kitae.distributed.executor import DistributedExecutor, WorkersLost
from kitae.loops.callbacks import Callback
from kitae.runs import preset_agent
from kitae.runs.rundir import state_fingerprint
from tests._distributed import Scalars, ray_shared
from tests._distributed import agents as _agents

__all__ = ["ray_shared"]  # the fixture, imported for the tests here


def test_the_command_line_trains_resumes_and_evaluates_a_distributed_run(ray_shared, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from kitae.cli import main
    from kitae.config import AlgoConfig

    run_dir = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", "--workers", "2", "--steps", "512", "--run-dir", str(run_dir), "--quiet"]
    assert main(argv) == 0
    config = AlgoConfig.from_yaml(run_dir / "config.yaml")
    assert config.distributed == DistributedConfig(workers=2)
    assert config.env_cfg.n_envs == 16  # two workers, each with the preset's 8 environments
    assert main(["resume", str(run_dir), "--steps", "1024", "--quiet"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 1024 and summary["resumed_from"] == 512
    assert summary["distributed"]["policy_lag_mean"] == summary["distributed"]["policy_lag_max"] == 0.0  # synchronous
    assert summary["distributed"]["restarts"] == 0 and summary["distributed"]["startup_seconds"] > 0
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    events = EventAccumulator(str(run_dir / "logs"))
    events.Reload()
    assert {"distributed/policy_lag", "distributed/collect_sps"} <= set(events.Tags()["scalars"])
    # the two workers' episodes in step order (worker 0's, then worker 1's, went back in steps)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [row["step"] for row in rows if "episodic_return" in row]
    assert len(steps) > 20 and steps == sorted(steps)
    points = [event.step for event in events.Scalars("charts/episodic_return")]
    assert points == sorted(points)
    capsys.readouterr()
    assert main(["train", "ppo", "CartPole-v1", "--gradient-workers", "2", "--run-dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--gradient-workers needs --workers N" in err


def test_the_python_road_trains_distributed_and_loads_back(ray_shared, tmp_path):
    from kitae.algos.collections.ppo import PPO

    agent, env = preset_agent("ppo", "CartPole-v1", steps=512, n_envs=8, run_dir=tmp_path / "py")
    env.close()
    result = agent.train_distributed("CartPole-v1", 512, workers=2)
    assert result.executor == "distributed" and agent.env_step == 512
    loaded = PPO.unserialize(tmp_path / "py")
    assert loaded.config.distributed == DistributedConfig(workers=2)
    assert state_fingerprint(loaded.state) == state_fingerprint(agent.state)


def test_train_distributed_collects_from_the_id_it_is_given_and_checks_its_spaces(ray_shared, tmp_path, monkeypatch):
    """``agent.train_distributed(env_id)`` once trained on the config's own id whatever it was
    given: ``Pendulum-v1`` for a CartPole agent trained CartPole. Now the given id is the run's
    (its summary and ``config.yaml`` say so), one whose spaces differ is refused before Ray starts,
    and an agent left distributed refuses an environment object in one line."""
    import yaml

    import kitae.distributed.executor as executor_module
    from kitae.envs.make import make_vec_env

    agent, env = preset_agent("ppo", "CartPole-v1", steps=512, n_envs=8, run_dir=tmp_path / "other")
    env.close()
    with pytest.raises(ValueError, match=r"observation_space"):
        agent.train_distributed("Pendulum-v1", 512, workers=2)
    assert not (tmp_path / "other" / "summary.json").exists()
    made = []  # copies made in this process to check spaces: one (resolve_agent's), not a second in the executor
    make_env = executor_module.make_env
    monkeypatch.setattr(executor_module, "make_env", lambda spec, n: made.append(spec.id) or make_env(spec, n))
    agent.train_distributed("gymnax:CartPole-v1", 512, workers=2)
    assert made == ["gymnax:CartPole-v1"] and agent.config.env_cfg.task_name == "gymnax:CartPole-v1"
    assert json.loads((tmp_path / "other" / "summary.json").read_text())["env"] == "gymnax:CartPole-v1"
    written = yaml.safe_load((tmp_path / "other" / "config.yaml").read_text())
    assert written["env_cfg"]["task_name"] == "gymnax:CartPole-v1"
    env = make_vec_env("CartPole-v1", 8)
    with pytest.raises(TypeError, match=r"allowed: an environment id or EnvSpec"):
        agent.train(env, 512)


class KillCollector(Callback):
    """Kills one collection worker's process (a ``ray::CollectionWorker`` descendant of this test
    process, whose runtime the module shares), once, at the first update after ``after``."""

    def __init__(self, after):
        self.after, self.done = after, False

    def on_scalars(self, step, scalars):
        if self.done or step < self.after:
            return
        workers = [p for p in psutil.Process().children(recursive=True) if p.name().startswith("ray::CollectionW")]
        assert workers, "no collection worker process found"
        min(workers, key=lambda p: p.pid).kill()
        self.done = True


def test_a_killed_collection_worker_is_replaced_and_the_run_finishes(ray_shared, tmp_path, capfd):
    agent, env, _ = _agents("ppo", 1536, tmp_path, sets=["update_cfg.n_epochs=2"])
    env.close()
    scalars = Scalars()
    killer = KillCollector(after=512)
    result = DistributedExecutor(DistributedConfig(workers=2)).run(
        agent, "CartPole-v1", 1536, callbacks=[killer, scalars]
    )
    assert killer.done and result.env_steps == 1536 and not result.stopped
    assert result.metrics["restarts"] == 1
    assert "died (" in capfd.readouterr().err
    assert any(row.get("distributed/restarts") == 1.0 for _, row in scalars.rows)
    assert len(result.update_steps[0]) == 1536 // agent.schedule.steps_per_iteration


def test_when_replacements_run_out_the_run_stops_with_a_checkpoint(ray_shared, tmp_path):
    agent, env, _ = _agents("ppo", 1536, tmp_path, sets=["update_cfg.n_epochs=2"])
    env.close()
    saved = []

    class Saved(Callback):
        def on_checkpoint(self, payload):
            saved.append(int(payload.state.env_step))

    # on the run road (agent.train, as kitae train): the error names the run directory, which the
    # command line's line names for `kitae resume` (it said RUN_DIR)
    agent.config = dataclasses.replace(agent.config, distributed=DistributedConfig(workers=2, max_restarts=0))
    with pytest.raises(WorkersLost, match="max_restarts=0") as raised:
        agent.train("CartPole-v1", 1536, callbacks=[KillCollector(after=512), Saved()])
    assert saved and 512 <= saved[-1] < 1536  # the state it had learned is in the last checkpoint
    assert raised.value.run_dir == str(agent.run_dir)
    assert max(int(p.name) for p in (agent.run_dir / "checkpoints").iterdir()) == saved[-1]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_stops_every_actor_and_saves_a_checkpoint(tmp_path, signum):
    """SIGINT or SIGTERM to ``kitae train --workers 2``: exit status 128 + the signal, a
    checkpoint, and every process of the run's own Ray runtime gone. SIGTERM exited 15 with Ray's
    crash dump and no checkpoint: ``ray.init`` had replaced the run's handler with its own."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "kitae.cli", "train", "ppo", "CartPole-v1", "--workers", "2"]
    child = subprocess.Popen(
        [*command, "--steps", "2000000", "--run-dir", str(run_dir), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        metrics = run_dir / "metrics.jsonl"
        while time.monotonic() < deadline and not (metrics.exists() and metrics.stat().st_size > 0):
            time.sleep(0.5)
        assert metrics.exists(), "the run never reported an episode"
        descendants = [p.pid for p in psutil.Process(child.pid).children(recursive=True)]
        assert len(descendants) >= 4  # the runtime and its actors
        child.send_signal(signum)
        _, err = child.communicate(timeout=180)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 128 + signum, err[-2000:]
    assert f"stopped by {signal.Signals(signum).name}" in err
    assert any((run_dir / "checkpoints").iterdir())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(psutil.pid_exists(pid) for pid in descendants):
        time.sleep(0.5)
    assert not [pid for pid in descendants if psutil.pid_exists(pid)]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["ppo", "gymnax:CartPole-v1", "--workers", "3", "--n-envs", "4"], "does not split over distributed.workers=3"),
        (["ppo", "CartPole-v1", "--workers", "3", "--n-envs", "8"], "does not split over distributed.workers=3"),
        (["ppo", "CartPole-v1", "--async"], "--async needs --workers N"),
    ],
)
def test_bad_distributed_runs_fail_in_one_line_before_anything_is_written(tmp_path, capsys, argv, expected):
    from kitae.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", *argv, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("kitae: error:") and expected in err
    assert not run_dir.exists()


def test_more_workers_than_the_memory_holds_are_refused_before_anything_starts(tmp_path, capsys, monkeypatch):
    """``--workers 100000`` made its 800,000 CartPoles here (to read their spaces), then would have
    started as many Ray workers, for minutes, until the machine ran out of memory. Each worker is
    a process of at least ``WORKER_MEMORY_GB``: a local runtime takes what the available memory
    holds, a cluster is not checked."""
    import kitae.distributed.runtime as runtime
    from kitae.cli import main
    from kitae.config import DistributedConfig
    from kitae.distributed.executor import DistributedExecutor

    available = runtime._available_memory_gb()  # the real /proc/meminfo
    assert available is not None and available > 0
    monkeypatch.setattr(runtime, "_available_memory_gb", lambda: 2.0)  # room for 5 workers of 0.4 GB
    run_dir = tmp_path / "run"
    start = time.monotonic()
    assert main(["train", "ppo", "CartPole-v1", "--workers", "100000", "--run-dir", str(run_dir)]) == 2
    assert time.monotonic() - start < 30  # refused before making the environments
    assert capsys.readouterr().err.strip() == (
        "kitae: error: --workers 100000 is not allowed on this machine: each Ray worker is a process of at least "
        "0.4 GB and 2.0 GB is available, room for 5; allowed: --workers at most 4 besides 1 gradient worker, or "
        "--address HOST:PORT of a Ray cluster"
    )
    assert not run_dir.exists()
    # sweeps and searches: the tasks that run at once
    sweep = ["sweep", "ppo", "CartPole-v1", "--grid", "update_cfg.learning_rate=1e-3,3e-4", "--workers", "6"]
    assert main([*sweep, "--sweep-dir", str(tmp_path / "sweep")]) == 2
    assert "--workers 6 is not allowed on this machine" in capsys.readouterr().err
    tune = ["tune", "ppo", "CartPole-v1", "--trials", "2", "--workers", "6", "--study-dir", str(tmp_path / "study")]
    assert main(tune) == 2
    assert "allowed: --workers at most 5, or --address" in capsys.readouterr().err
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "study").exists()
    # Python's road: the executor's own check, before Ray starts
    with pytest.raises(ValueError, match=r"distributed.workers=8 is not allowed on this machine.*at most 3 besides 2"):
        DistributedExecutor(DistributedConfig(workers=8, gradient_workers=2)).check("CartPole-v1", 8)
    DistributedExecutor(DistributedConfig(workers=8, address="127.0.0.1:1")).check("CartPole-v1", 8)
    DistributedExecutor(DistributedConfig(workers=4)).check("CartPole-v1", 8)


def test_a_diverging_distributed_run_stops_exits_3_and_keeps_its_last_finite_parameters(ray_shared, tmp_path, capsys):
    from kitae.cli import main
    from tests.test_divergence import DIVERGE, _check_diverged_run

    run_dir = tmp_path / "run"
    argv = ["train", "dqn", "CartPole-v1", "--workers", "1", "--steps", "4000", "--run-dir", str(run_dir), "--quiet"]
    assert main([*argv, *DIVERGE]) == 3
    _check_diverged_run(run_dir, capsys.readouterr().err, steps_at_most=1100)
