"""The distributed executor on a real Ray runtime (one local runtime shared by the tests of this
module; the process test starts and stops its own in a child process).

Same agent, same result: synchronous mode with one collection worker and one gradient worker
ends with the host loop's state, bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest

from kitae.config import DistributedConfig
from kitae.distributed.executor import DistributedExecutor
from kitae.loops.executor import EXECUTORS
from kitae.runs import preset_agent
from tests._distributed import Scalars, ray_shared
from tests._distributed import agents as _agents
from tests._distributed import fingerprint as _fingerprint

__all__ = ["ray_shared"]  # the fixture, imported for the tests here


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


NORMALIZED = ["algo_params.normalize_observations=true", "algo_params.normalize_rewards=true"]


def _statistics_counts(result):
    state = result.state.agent_state
    return float(state.observation_statistics.count), float(state.return_statistics.count)


def test_two_collection_workers_give_the_same_bits_twice(ray_shared, tmp_path):
    config = DistributedConfig(workers=2, gradient_workers=2)
    agent, env, twin = _agents("ppo", 1024, tmp_path, sets=["update_cfg.n_epochs=4", *NORMALIZED])
    env.close()
    first = DistributedExecutor(config).run(agent, "CartPole-v1", 1024)
    second = DistributedExecutor(config).run(twin, "CartPole-v1", 1024)
    assert _fingerprint(first) == _fingerprint(second)
    assert len(first.update_steps[0]) == 1024 // agent.schedule.steps_per_iteration
    # the update made step by step by two gradient workers runs PPO's statistics hooks: every
    # transition counted once (they stayed at 0 when the executor skipped them)
    assert _statistics_counts(first) == (1024.0, 1024.0)


def test_asynchronous_modes_train_and_report_their_lags(ray_shared, tmp_path):
    agent, env, _ = _agents("ppo", 1536, tmp_path, sets=["update_cfg.n_epochs=4", *NORMALIZED])
    env.close()
    scalars = Scalars()
    config = DistributedConfig(workers=2, gradient_workers=2, async_collection=True, async_gradients=True)
    result = DistributedExecutor(config).run(agent, "CartPole-v1", 1536, callbacks=[scalars])
    assert result.env_steps == 1536 and len(result.update_steps[0]) == 1536 // agent.schedule.steps_per_iteration
    assert _statistics_counts(result) == (1536.0, 1536.0)  # the hooks run with asynchronous gradients too
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
    with pytest.raises(ValueError, match="unknown field distributed.threads in DistributedConfig; allowed fields"):
        DistributedConfig.from_dict({"workers": 2, "threads": 3})
    with pytest.raises(
        ValueError, match=r"distributed.worker in DistributedConfig; did you mean distributed.workers\?"
    ):
        DistributedConfig.from_dict({"worker": 2})


@pytest.mark.parametrize(
    ("algo", "sets", "message"),
    [
        ("ppo", ["update_cfg.batch_size=2"], "a divisor of update_cfg.batch_size=2 "),
        ("ppo", [], "a divisor of update_cfg.batch_size=256 "),
        ("dqn", ["update_cfg.batch_size=64"], "a divisor of update_cfg.batch_size=64 "),
        (
            "ppo_lstm",
            ["update_cfg.max_buffer_size=96", "update_cfg.batch_size=96", "algo_params.sequence_length=6"],
            "a divisor of the 16 sequences",
        ),
    ],
)
def test_gradient_workers_must_split_every_minibatch_in_equal_parts(tmp_path, capsys, algo, sets, message):
    """Three gradient workers on a minibatch of two rows gave worker 0 an empty part, whose mean
    loss is NaN: the run was reported as diverged (exit 3). 256 rows over three were averaged as
    equal parts (85, 85, 86). Both are refused when the config is made, in one line."""
    from kitae.cli import main

    flags = [f"--set={s}" for s in sets]
    code = main(["train", algo, "CartPole-v1", "--workers", "2", "--gradient-workers", "3", *flags,
                 "--steps", "512", "--run-dir", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()
    assert "distributed.gradient_workers=3 is not allowed; allowed: " + message in err


def _closed_port():
    import socket

    with socket.socket() as sock:  # a port this machine just gave out and nothing listens on now
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_address_where_no_cluster_answers_is_refused_at_once_in_one_line(tmp_path, capsys):
    """``--address 127.0.0.1:1`` waited over five minutes in ``ray.init``, printing Ray's GCS client
    retries, and left a run directory of a run that never started."""
    import socket

    from kitae.cli import main
    from kitae.distributed.runtime import check_reachable

    port = _closed_port()
    clock = time.perf_counter()
    code = main(["train", "ppo", "CartPole-v1", "--workers", "2", "--address", f"127.0.0.1:{port}",
                 "--steps", "512", "--run-dir", str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and time.perf_counter() - clock < 10 and not (tmp_path / "run").exists()
    assert err == (
        f"kitae: error: distributed.address='127.0.0.1:{port}': no Ray cluster answers there (Connection refused, "
        "10 s); allowed: the HOST:PORT of a running cluster's head (`ray start --head` prints it), or no address "
        "to start a local runtime\n"
    )
    with socket.socket() as listening:  # accepts, then says nothing: not a Ray head either
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        silent = f"127.0.0.1:{listening.getsockname()[1]}"
        with pytest.raises(ConnectionError, match=r"a server answers but no gRPC handshake in 0.5 s: not a Ray head"):
            check_reachable(silent, timeout=0.5)
    check_reachable(None)


@pytest.fixture
def http_port():
    """The port of an HTTP server on 127.0.0.1 (as the dashboard's 8265 is), for the test's length."""
    import http.server
    import threading

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # the tests read kitae's stderr alone
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _not_ray(port: int, seconds: int) -> str:
    return (
        f"kitae: error: distributed.address='127.0.0.1:{port}': no Ray cluster answers there (a server answers but "
        f"no gRPC handshake in {seconds} s: not a Ray head); allowed: the HOST:PORT of a running cluster's head "
        "(`ray start --head` prints it), or no address to start a local runtime\n"
    )


def test_an_address_where_a_server_that_is_not_ray_answers_is_refused_in_one_line(tmp_path, capsys, http_port):
    """``--address`` given an HTTP server's port (the dashboard's 8265 for the head's 6379) waited
    in ``ray.init`` without end (10 minutes seen), Ray's GCS client printing its retries, and left a
    run directory of a run that never started. A real head passes: tests/test_ray_cluster.py."""
    from kitae.cli import main

    clock = time.perf_counter()
    code = main(["train", "ppo", "CartPole-v1", "--workers", "2", "--address", f"127.0.0.1:{http_port}",
                 "--steps", "512", "--run-dir", str(tmp_path / "run")])  # fmt: skip
    assert code == 1 and time.perf_counter() - clock < 15 and not (tmp_path / "run").exists()
    assert capsys.readouterr().err == _not_ray(http_port, 10)


@pytest.mark.parametrize(
    "command",
    [
        ["sweep", "ppo", "CartPole-v1", "--grid", "update_cfg.learning_rate=1e-3,3e-4", "--sweep-dir"],
        ["tune", "ppo", "CartPole-v1", "--trials", "2", "--study-dir"],
    ],
    ids=["sweep", "tune"],
)
def test_sweep_and_tune_refuse_an_address_that_is_not_a_ray_head_before_writing(
    tmp_path, capsys, monkeypatch, http_port, command
):
    """``kitae sweep/tune --workers --address`` wrote the sweep's plan and each combination's
    config.yaml (a study its study.db) before Ray was asked, then waited without end."""
    from kitae.cli import main
    from kitae.distributed import runtime

    monkeypatch.setattr(runtime, "CONNECT_TIMEOUT", 1.0)  # the default's 10 s is the train test's
    code = main([*command, str(tmp_path / "out"), "--steps", "512", "--workers", "2",
                 "--address", f"127.0.0.1:{http_port}"])  # fmt: skip
    assert code == 1 and not (tmp_path / "out").exists()
    assert capsys.readouterr().err == _not_ray(http_port, 1)


def test_bad_runs_are_rejected_before_anything_starts(tmp_path):
    agent, env = preset_agent("ppo", "CartPole-v1", steps=1024, run_dir=tmp_path / "a")
    executor = DistributedExecutor(DistributedConfig(workers=3))
    with pytest.raises(ValueError, match="does not split over distributed.workers=3"):
        executor.run(agent, "CartPole-v1", 1024)
    with pytest.raises(TypeError, match="environment id"):
        DistributedExecutor(DistributedConfig()).run(agent, env, 1024)
    with pytest.raises(TypeError, match="DistributedConfig"):
        DistributedExecutor({"workers": 2})
    # an id of other spaces than the config's: the rule of every executor, before Ray starts
    message = "observation space does not match env_cfg.observation_space.*shape \\(6,\\) where \\(4,\\)"
    with pytest.raises(ValueError, match=message):
        DistributedExecutor(DistributedConfig(workers=2)).run(agent, "gymnax:Acrobot-v1", 1024)
    env.close()


def test_the_configs_own_id_is_not_made_again_to_check_its_spaces(monkeypatch, tmp_path):
    """The space check makes a copy in the driver only for an id other than the config's (which
    gave env_cfg its spaces; a copy would import Brax or JaxMARL into the driver for nothing)."""
    import kitae.distributed.executor as executor_module
    from kitae.envs.make import EnvSpec

    agent, env = preset_agent("ppo", "CartPole-v1", steps=1024, run_dir=tmp_path / "a")
    env.close()
    made = []
    monkeypatch.setattr(executor_module, "make_env", lambda spec, n: made.append(spec.id) or env)
    executor_module.check_spaces(agent.config.env_cfg, EnvSpec.parse("CartPole-v1"))
    assert made == []
    executor_module.check_spaces(agent.config.env_cfg, EnvSpec.parse("gymnax:CartPole-v1"))  # same spaces, another id
    assert made == ["gymnax:CartPole-v1"]


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


def test_a_runtime_starts_in_a_process_that_imported_ray_first_and_leaves_its_settings_as_they_were(tmp_path):
    """Ray reads its RAY_* variables when it is imported: a process that imported Ray first (a
    user's `import ray`) held the authentication mode it read then, so its driver sent no token
    to the runtime kitae started, which wanted one ("Authentication token is missing", after 20 s
    of retries). Found by the suite itself, once a test module imported Ray at collection. And in a
    process where JAX runs, starting the runtime warns of nothing; its workers read objects of a
    class from a folder the process put on sys.path (a custom agent given to the distributed
    executor: "No module named ..." in every worker) and make a Gymnasium id the process
    registered itself ("unknown Gymnasium environment" in every worker)."""
    source = tmp_path / "src"  # not the working directory (tmp_path here), which Ray's workers have
    source.mkdir()
    (source / "users_module.py").write_text(
        "import gymnasium as gym\n\n"
        "class Thing:\n    answer = 42\n\n"
        "class Env(gym.Env):\n"
        "    observation_space = gym.spaces.Discrete(3)\n    action_space = gym.spaces.Discrete(2)\n"
        "    def reset(self, *, seed=None, options=None):\n        return 2, {}\n"
    )
    script = textwrap.dedent(
        f"""
        import json, os, sys
        import jax
        import ray
        import ray._private.ray_constants as constants
        from kitae.distributed.runtime import ray_runtime

        jax.numpy.zeros(1).block_until_ready()  # JAX's threads run, as when a run resumes
        sys.path.insert(0, {str(source)!r})  # as a notebook's sys.path.append("../src")
        import users_module
        import gymnasium as gym

        gym.register("UsersEnv-v0", entry_point=users_module.Env)  # the driver's own id

        def answer(thing):
            return thing.answer + gym.make("UsersEnv-v0").reset()[0]

        names = ("RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
        before = [os.environ.get(name) for name in names], constants.ENABLE_RAY_CLUSTER
        for _ in range(2):
            with ray_runtime(num_cpus=1) as r:
                nodes = len(r.nodes())
                answered = r.get(r.remote(answer).remote(users_module.Thing()))
        after = [os.environ.get(name) for name in names], constants.ENABLE_RAY_CLUSTER
        print(json.dumps({{"nodes": nodes, "before": before, "after": after, "answer": answered}}))
        """
    )
    # a fresh process's environment: what earlier runtimes of this worker set is not there
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    # Ray starts its processes with a preexec_fn, which runs the fork hooks: JAX's warned of a
    # deadlock the exec'd child cannot have (kitae resume --workers printed it)
    assert "os.fork() was called" not in done.stderr, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["nodes"] == 1 and report["answer"] == 44
    # the settings of a runtime that serves this machine only last as long as the runtime: a later
    # `ray.init` or `ray start` of the user's is not bound to them
    assert report["after"] == report["before"] == [[None, None], True]
