"""The distributed executor's environments, on a real Ray runtime shared by the tests of this
module: JAX ids collect with the compiled loop's own step inside the workers (one worker gives the
compiled loop's bits), multi-agent ids (JaxMARL compiled, PettingZoo stepped) collect in workers,
and a worker compiles its step once however many batches it collects."""

from __future__ import annotations

import numpy as np
import pytest

from kitae.config import DistributedConfig
from kitae.distributed.executor import DistributedExecutor
from kitae.loops.executor import EXECUTORS
from kitae.runs import preset_agent
from tests._distributed import fingerprint as _fingerprint
from tests._distributed import ray_shared

__all__ = ["ray_shared"]  # the fixture, imported for the tests here


def test_one_worker_in_a_jax_environment_gives_the_compiled_loops_bits(ray_shared, tmp_path):
    """JAX ids collect with the compiled loop's own step, scanned in the worker: with one worker
    the run ends with the compiled loop's state, and the episodes it reports one by one add up,
    iteration by iteration, to the compiled loop's per-iteration means."""
    env_id, algo, steps = "gymnax:CartPole-v1", "ppo", 2048
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


def test_a_recurrent_agent_gives_the_host_loops_bits_with_one_worker(ray_shared, tmp_path):
    """The collection workers carry a recurrent agent's hidden state with the host loop's rule."""
    sets = ["update_cfg.max_buffer_size=16", "update_cfg.batch_size=32", "algo_params.sequence_length=8"]
    env_id, steps = "CartPoleNoVel-v1", 1024
    agent, env = preset_agent("ppo_lstm", env_id, steps=steps, n_envs=4, run_dir=tmp_path / "a", sets=sets)
    twin, twin_env = preset_agent("ppo_lstm", env_id, steps=steps, n_envs=4, run_dir=tmp_path / "b", sets=sets)
    twin_env.close()
    host = EXECUTORS["host"].run(agent, env, steps)
    env.close()
    distributed = DistributedExecutor(DistributedConfig(workers=1, gradient_workers=1)).run(twin, env_id, steps)
    assert len(host.update_steps[0]) == steps // 64
    assert _fingerprint(host) == _fingerprint(distributed)
    np.testing.assert_array_equal(host.episodes[0].return_, distributed.episodes[0].return_)


def test_envpool_ids_collect_in_workers_with_the_host_loops_bits(ray_shared, tmp_path):
    env_id, steps = "envpool:CartPole-v1", 2048
    agent, env = preset_agent("ppo", env_id, steps=steps, n_envs=8, run_dir=tmp_path / "a")
    twin, twin_env = preset_agent("ppo", env_id, steps=steps, n_envs=8, run_dir=tmp_path / "b")
    twin_env.close()
    host = EXECUTORS["host"].run(agent, env, steps)
    env.close()
    distributed = DistributedExecutor(DistributedConfig(workers=1, gradient_workers=1)).run(twin, env_id, steps)
    assert len(host.update_steps[0]) > 1
    assert _fingerprint(host) == _fingerprint(distributed)
