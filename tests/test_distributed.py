"""The distributed executor on a real Ray runtime (one local runtime shared by the tests here;
the process test starts and stops its own in a child process).

Same agent, same result: synchronous mode with one collection worker and one gradient worker
ends with the host loop's state, bit for bit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from kitae.config import DistributedConfig
from kitae.distributed.executor import DistributedExecutor
from kitae.distributed.runtime import ray_runtime
from kitae.loops.callbacks import Callback
from kitae.loops.executor import EXECUTORS
from kitae.runs import preset_agent
from kitae.runs.rundir import state_fingerprint


@pytest.fixture(scope="module")
def ray_shared():
    with ray_runtime(num_cpus=2) as ray:
        yield ray


def _agents(algo, steps, tmp_path, sets=()):
    agent, env = preset_agent(algo, "CartPole-v1", steps=steps, run_dir=tmp_path / "a", sets=list(sets))
    twin, twin_env = preset_agent(algo, "CartPole-v1", steps=steps, run_dir=tmp_path / "b", sets=list(sets))
    twin_env.close()
    return agent, env, twin


def _fingerprint(result):
    return state_fingerprint(result.state.agent_state)


class Scalars(Callback):
    def __init__(self):
        self.rows = []

    def on_scalars(self, step, scalars):
        self.rows.append((step, scalars))


@pytest.mark.parametrize(("algo", "steps"), [("ppo", 2048), ("dqn", 1536)])
def test_one_worker_each_gives_the_host_loops_bits(ray_shared, tmp_path, algo, steps):
    agent, env, twin = _agents(algo, steps, tmp_path)
    host = EXECUTORS["host"].run(agent, env, steps)
    distributed = DistributedExecutor(DistributedConfig(workers=1, gradient_workers=1)).run(twin, "CartPole-v1", steps)
    assert len(host.update_steps[0]) > 1
    np.testing.assert_array_equal(host.update_steps[0], distributed.update_steps[0])
    assert _fingerprint(host) == _fingerprint(distributed)
    assert distributed.env_steps == host.env_steps == steps
    np.testing.assert_array_equal(host.episodes[0].return_, distributed.episodes[0].return_)


def test_two_collection_workers_give_the_same_bits_twice(ray_shared, tmp_path):
    config = DistributedConfig(workers=2, gradient_workers=2)
    agent, env, twin = _agents("ppo", 1024, tmp_path, sets=["update_cfg.n_epochs=4"])
    env.close()
    first = DistributedExecutor(config).run(agent, "CartPole-v1", 1024)
    second = DistributedExecutor(config).run(twin, "CartPole-v1", 1024)
    assert _fingerprint(first) == _fingerprint(second)
    assert len(first.update_steps[0]) == 1024 // agent.schedule.steps_per_iteration


def test_asynchronous_modes_train_and_report_their_lags(ray_shared, tmp_path):
    agent, env, _ = _agents("ppo", 1536, tmp_path, sets=["update_cfg.n_epochs=4"])
    env.close()
    scalars = Scalars()
    config = DistributedConfig(workers=2, gradient_workers=2, async_collection=True, async_gradients=True)
    result = DistributedExecutor(config).run(agent, "CartPole-v1", 1536, callbacks=[scalars])
    assert result.env_steps == 1536 and len(result.update_steps[0]) == 1536 // agent.schedule.steps_per_iteration
    names = set().union(*(row for _, row in scalars.rows))
    assert {"distributed/policy_lag", "distributed/gradient_lag", "distributed/collect_sps"} <= names
    lags = [row["distributed/policy_lag"] for _, row in scalars.rows]
    assert min(lags) >= 0 and max(lags) > 0  # asynchronous workers collect with older weights
    assert all(np.isfinite(r["distributed/gradient_lag"]) for _, r in scalars.rows)


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"workers": 0}, "distributed.workers"),
        ({"gradient_workers": True}, "distributed.gradient_workers"),
        ({"max_restarts": -1}, "distributed.max_restarts"),
        ({"async_collection": 1}, "distributed.async_collection"),
        ({"address": "nowhere"}, "distributed.address"),
    ],
)
def test_bad_layouts_are_rejected_clearly(fields, match):
    with pytest.raises(ValueError, match=match):
        DistributedConfig(**fields)


def test_config_round_trips_and_rejects_unknown_fields():
    config = DistributedConfig(workers=4, gradient_workers=2, async_collection=True, address="127.0.0.1:6379")
    assert DistributedConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="unknown fields"):
        DistributedConfig.from_dict({"workers": 2, "threads": 3})


def test_bad_runs_are_rejected_before_anything_starts(tmp_path):
    agent, env = preset_agent("ppo", "CartPole-v1", steps=1024, run_dir=tmp_path / "a")
    executor = DistributedExecutor(DistributedConfig(workers=3))
    with pytest.raises(ValueError, match="does not split over distributed.workers=3"):
        executor.run(agent, "CartPole-v1", 1024)
    with pytest.raises(TypeError, match="environment id"):
        DistributedExecutor(DistributedConfig()).run(agent, env, 1024)
    with pytest.raises(TypeError, match="DistributedConfig"):
        DistributedExecutor({"workers": 2})
    env.close()


def test_no_ray_process_outlives_a_run_that_started_its_runtime(tmp_path):
    """A child process trains with a runtime of its own; every process of that runtime (the
    child's descendants while it trains) is gone once the run ends."""
    script = textwrap.dedent(
        f"""
        import json, psutil
        from kitae.config import DistributedConfig
        from kitae.distributed.executor import DistributedExecutor
        from kitae.loops.callbacks import Callback
        from kitae.runs import preset_agent

        class Descendants(Callback):
            pids = set()
            def on_progress(self, progress):  # while the runtime and its actors are up
                Descendants.pids |= {{p.pid for p in psutil.Process().children(recursive=True)}}

        agent, env = preset_agent("ppo", "CartPole-v1", steps=512, run_dir={str(tmp_path / "r")!r})
        env.close()
        executor = DistributedExecutor(DistributedConfig(workers=2))
        result = executor.run(agent, "CartPole-v1", 512, callbacks=[Descendants()])
        print(json.dumps({{"steps": result.env_steps, "pids": sorted(Descendants.pids)}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["steps"] == 512
    assert len(report["pids"]) >= 4  # GCS, raylet, two collection workers, a gradient worker...
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(psutil.pid_exists(pid) for pid in report["pids"]):
        time.sleep(0.5)
    left = [pid for pid in report["pids"] if psutil.pid_exists(pid)]
    assert not left, [psutil.Process(pid).name() for pid in left if psutil.pid_exists(pid)]


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
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    events = EventAccumulator(str(run_dir / "logs"))
    events.Reload()
    assert {"distributed/policy_lag", "distributed/collect_sps"} <= set(events.Tags()["scalars"])
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


class KillCollector(Callback):
    """Kills collection worker 0's process once, at the first update after ``after``."""

    def __init__(self, executor_run, after):
        self.after, self.done, self.run = after, False, executor_run

    def on_scalars(self, step, scalars):
        if not self.done and step >= self.after:
            import os
            import signal

            run = self.run()
            os.kill(run.ray.get(run.collectors[0].pid.remote()), signal.SIGKILL)
            self.done = True


def test_a_killed_collection_worker_is_replaced_and_the_run_finishes(ray_shared, tmp_path, capfd, monkeypatch):
    import kitae.distributed.executor as executor_module

    runs = []
    original = executor_module._Run.__init__

    def remember(self, *args, **kwargs):
        original(self, *args, **kwargs)
        runs.append(self)

    monkeypatch.setattr(executor_module._Run, "__init__", remember)
    agent, env, _ = _agents("ppo", 1536, tmp_path, sets=["update_cfg.n_epochs=2"])
    env.close()
    scalars = Scalars()
    killer = KillCollector(lambda: runs[-1], after=512)
    result = DistributedExecutor(DistributedConfig(workers=2)).run(
        agent, "CartPole-v1", 1536, callbacks=[killer, scalars]
    )
    assert killer.done and result.env_steps == 1536 and not result.stopped
    assert result.metrics["restarts"] == 1
    assert "collection worker 0 died" in capfd.readouterr().err
    assert any(row.get("distributed/restarts") == 1.0 for _, row in scalars.rows)
    assert len(result.update_steps[0]) == 1536 // agent.schedule.steps_per_iteration


def test_when_replacements_run_out_the_run_stops_with_a_checkpoint(ray_shared, tmp_path, monkeypatch):
    import kitae.distributed.executor as executor_module
    from kitae.distributed.executor import WorkersLost

    runs = []
    original = executor_module._Run.__init__

    def remember(self, *args, **kwargs):
        original(self, *args, **kwargs)
        runs.append(self)

    monkeypatch.setattr(executor_module._Run, "__init__", remember)
    agent, env, _ = _agents("ppo", 1536, tmp_path, sets=["update_cfg.n_epochs=2"])
    env.close()
    saved = []

    class Saved(Callback):
        def on_checkpoint(self, payload):
            saved.append(int(payload.state.env_step))

    killer = KillCollector(lambda: runs[-1], after=512)
    with pytest.raises(WorkersLost, match="max_restarts=0"):
        DistributedExecutor(DistributedConfig(workers=2, max_restarts=0)).run(
            agent, "CartPole-v1", 1536, callbacks=[killer, Saved()]
        )
    assert saved and 512 <= saved[-1] < 1536  # the state it had learned is in the last checkpoint
