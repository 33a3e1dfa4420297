"""The distributed executor on a real Ray runtime (one local runtime shared by the tests of this
module; the process test starts and stops its own in a child process).

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


@pytest.mark.parametrize(("algo", "steps"), [("ppo", 2048), ("dqn", 1536)])
def test_one_worker_in_a_jax_environment_gives_the_compiled_loops_bits(ray_shared, tmp_path, algo, steps):
    """JAX ids collect with the compiled loop's own step, scanned in the worker: with one worker
    the run ends with the compiled loop's state, and the episodes it reports one by one add up,
    iteration by iteration, to the compiled loop's per-iteration means."""
    env_id = "gymnax:CartPole-v1"
    agent, env = preset_agent(algo, env_id, steps=steps, run_dir=tmp_path / "a")
    twin, _ = preset_agent(algo, env_id, steps=steps, run_dir=tmp_path / "b")
    compiled = EXECUTORS["compiled"].run(agent, env, steps)
    distributed = DistributedExecutor(DistributedConfig(workers=1, gradient_workers=1)).run(twin, env_id, steps)
    assert len(compiled.update_steps[0]) > 1
    np.testing.assert_array_equal(compiled.update_steps[0], distributed.update_steps[0])
    assert _fingerprint(compiled) == _fingerprint(distributed)
    per_iteration = agent.schedule.steps_per_iteration
    mine, theirs = distributed.episodes[0], compiled.episodes[0]
    iteration_end = -(-mine.step // per_iteration) * per_iteration
    for step, mean, count in zip(theirs.step, theirs.return_, theirs.count, strict=True):
        ended = iteration_end == step
        assert ended.sum() == count
        np.testing.assert_allclose(mine.return_[ended].sum(), mean * count, rtol=1e-6)


@pytest.mark.parametrize(
    ("env_id", "n_envs", "steps", "length"),
    # JaxMARL's MPE ends an episode when the step counter, checked before it is increased, reaches 25
    [("jaxmarl:MPE_simple_spread_v3", 4, 512, 26), ("pettingzoo:mpe2.simple_spread_v3", 4, 800, 25)],
)
def test_two_workers_collect_in_multi_agent_environments(ray_shared, tmp_path, env_id, n_envs, steps, length):
    """JaxMARL (compiled in the workers) and PettingZoo (stepped from Python) ids: a shared-parameter
    agent, each team's episode reported with every agent's return."""
    agent, _ = preset_agent("ppo", env_id, steps=steps, run_dir=tmp_path / "a", n_envs=n_envs)
    result = DistributedExecutor(DistributedConfig(workers=2, gradient_workers=1)).run(agent, env_id, steps)
    episodes = result.episodes[0]
    assert result.env_steps >= steps and len(episodes.return_) > 0
    assert episodes.agent_returns is not None and len(episodes.agent_returns) == 3  # simple_spread's agents
    team = sum(episodes.agent_returns.values())
    np.testing.assert_allclose(team, episodes.return_, rtol=1e-5)
    assert np.all(episodes.length == length)  # MPE episodes have a fixed length


@pytest.mark.parametrize("env_id", ["CartPole-v1", "gymnax:CartPole-v1"])
def test_a_collection_worker_compiles_its_step_once(tmp_path, env_id):
    """Acting weights arrive pickled with every batch asked for; the worker's compiled step (the
    host act, or the JAX rollout) compiles once, not once per batch (which also leaked a loaded
    executable per batch until the worker ran out of memory maps)."""
    import pickle

    import cloudpickle
    import jax

    from kitae.distributed import AgentAlgorithm
    from kitae.distributed.executor import default_agent_factory
    from kitae.distributed.workers import CollectionWorker

    agent, env = preset_agent("ppo", env_id, steps=1024, n_envs=8, run_dir=tmp_path / "a")
    if hasattr(env, "close"):
        env.close()
    worker = CollectionWorker(default_agent_factory(agent), env_id, 4, 1, 2)
    worker.reset(0, 0)
    weights, key = AgentAlgorithm(agent).get_weights(), jax.random.PRNGKey(0)
    for i in range(3):
        batch = worker.collect(pickle.loads(cloudpickle.dumps(weights)), key, i * 32, 4, 8, 0)
        key = jax.numpy.asarray(batch["key"])  # as the updater sends it
    compiled = worker.act if worker.jax_collector is None else worker.jax_collector._rollout
    assert compiled._cache_size() == 1
    assert jax.tree_util.tree_leaves(batch["rows"])[0].shape[:2] == (4, 4)


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
