"""PettingZoo's Parallel API in the host loop: VecParallelEnv (in process and in worker
processes), check_env, the env ids, and shared-parameter PPO, DQN, SAC and TD3."""

from __future__ import annotations

import functools
import importlib.util
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from _parallel_envs import BoxActionParallelEnv, CountParallelEnv

from kitae.envs.parallel import SyncVecParallelEnv, UnsupportedParallelEnv, VecParallelEnv, check_parallel_env
from kitae.envs.subproc import SubProcVecParallelEnv
from kitae.loops.multi_agent import AgentEpisodes
from kitae.loops.train import check_env, process_termination

needs_mpe2 = pytest.mark.skipif(
    importlib.util.find_spec("mpe2") is None or importlib.util.find_spec("pettingzoo") is None,
    reason="needs the pettingzoo extra: pip install -e '.[pettingzoo]'",
)

TESTS = Path(__file__).resolve().parent
VEC_CLASSES = [SyncVecParallelEnv, SubProcVecParallelEnv]


def count_envs(*limits, **kwargs):
    return [functools.partial(CountParallelEnv, limit=limit, **kwargs) for limit in limits]


def alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (psutil, else /proc)."""
    try:
        import psutil

        return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except ImportError:  # pragma: no cover
        stat = Path(f"/proc/{pid}/stat")
        return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"
    except Exception:  # the process ended between the two calls
        return False


def assert_gone(pids, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    assert not [pid for pid in pids if alive(pid)], "worker processes are still alive"
    assert not [p for p in multiprocessing.active_children() if p.pid in pids]


# ---------------------------------------------------------------------------------------------
# VecParallelEnv: batching and autoreset (in process and in workers)
# ---------------------------------------------------------------------------------------------


def test_dict_observations_are_refused_when_the_vector_environment_is_made():
    """PettingZoo's action-mask convention (``Dict(observation=..., action_mask=...)``): each
    agent's observations cannot be stacked into one array; before, training failed inside JAX
    ("Error interpreting argument ... numpy.ndarray at path obs['a0']": an object array)."""
    env = CountParallelEnv()
    mask = gym.spaces.Box(0, 1, (3,), np.int8)
    env._obs_spaces = {a: gym.spaces.Dict(observation=space, action_mask=mask) for a, space in env._obs_spaces.items()}
    with pytest.raises(UnsupportedParallelEnv, match=r"observe Dict\(.*which is not allowed; allowed: an array space"):
        check_env(env)


@pytest.mark.parametrize("cls", VEC_CLASSES)
def test_vec_parallel_env_batches_by_agent_and_autoresets_same_step(cls):
    env = cls(count_envs(2, 3))
    try:
        assert env.num_envs == 2 and env.possible_agents == ["a0", "a1"] and env.num_agents == 2
        assert env.single_observation_space.shape == (2,) and env.single_action_space.n == 3
        obs, infos = env.reset(seed=7)
        assert list(obs) == ["a0", "a1"] and infos == {}
        np.testing.assert_array_equal(obs["a1"], [[0, 1], [0, 1]])
        assert obs["a0"].dtype == np.float32 and obs["a0"].shape == (2, 2)
        actions = {"a0": np.array([0, 1]), "a1": np.array([2, 0])}

        obs, rewards, terms, truncs, infos = env.step(actions)  # t = 1 in both copies
        np.testing.assert_array_equal(obs["a0"][:, 0], [1, 1])
        np.testing.assert_array_equal(rewards["a0"], [1.0, 1.0])
        np.testing.assert_array_equal(rewards["a1"], [2.0, 2.0])
        assert rewards["a0"].dtype == np.float64 and terms["a0"].dtype == bool
        assert "final_obs" not in infos

        obs, rewards, terms, truncs, infos = env.step(actions)  # copy 0 is truncated at t = 2
        np.testing.assert_array_equal(truncs["a0"], [True, False])
        np.testing.assert_array_equal(truncs["a1"], [True, False])
        np.testing.assert_array_equal(terms["a0"], [False, False])
        np.testing.assert_array_equal(infos["_final_obs"], [True, False])
        # the final observation of copy 0's episode 0, and the first of its episode 1
        np.testing.assert_array_equal(infos["final_obs"]["a0"][0], [2, 0])
        np.testing.assert_array_equal(infos["final_obs"]["a1"][0], [2, 1])
        np.testing.assert_array_equal(obs["a0"][0], [100, 0])
        # where no episode ended, final_obs is the observation itself
        np.testing.assert_array_equal(infos["final_obs"]["a0"][1], obs["a0"][1])
        np.testing.assert_array_equal(obs["a0"][1], [2, 0])

        obs, rewards, terms, truncs, infos = env.step(actions)
        np.testing.assert_array_equal(infos["_final_obs"], [False, True])
        np.testing.assert_array_equal(obs["a0"][:, 0], [101, 100])
    finally:
        env.close()
    assert env.closed


def test_sync_vec_parallel_env_seeds_each_copy_and_passes_actions():
    env = SyncVecParallelEnv(count_envs(3, 3))
    env.reset(seed=10)
    assert [copy.env.seeds for copy in env.copies] == [[10], [11]]
    env.step({"a0": np.array([1, 2]), "a1": np.array([0, 1])})
    assert env.copies[1].env.actions == [{"a0": 2, "a1": 1}]
    for _ in range(2):  # the autoreset after the truncation is not reseeded
        env.step({"a0": np.array([1, 2]), "a1": np.array([0, 1])})
    assert [copy.env.seeds for copy in env.copies] == [[10, None], [11, None]]
    env.close()
    assert all(copy.env.closed for copy in env.copies)


def test_box_actions_are_clipped_to_the_bounds():
    env = SyncVecParallelEnv([BoxActionParallelEnv])
    env.reset(seed=0)
    env.step({"a0": np.array([[-0.5, 2.0]]), "a1": np.array([[0.25, 0.75]])})
    sent = env.copies[0].env.actions[0]
    np.testing.assert_array_equal(sent["a0"], [0.0, 1.0])
    np.testing.assert_array_equal(sent["a1"], [0.25, 0.75])
    assert sent["a0"].dtype == np.float32
    env.close()


def test_subproc_and_sync_give_the_same_steps():
    fns = count_envs(2, 4, 3)
    envs = [SyncVecParallelEnv(fns), SubProcVecParallelEnv(fns)]
    try:
        rng = np.random.default_rng(0)
        outs = [env.reset(seed=3) for env in envs]
        for _ in range(9):
            actions = {a: rng.integers(0, 3, 3) for a in ("a0", "a1")}
            outs = [env.step(actions) for env in envs]
            for field_sync, field_proc in zip(*outs):
                for key in field_sync:
                    value_sync, value_proc = field_sync[key], field_proc[key]
                    if isinstance(value_sync, dict):
                        for agent in value_sync:
                            np.testing.assert_array_equal(value_sync[agent], value_proc[agent])
                    else:
                        np.testing.assert_array_equal(value_sync, value_proc)
    finally:
        for env in envs:
            env.close()


def test_step_rejects_bad_actions():
    env = SyncVecParallelEnv(count_envs(3, 3))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="keyed by the agents"):
        env.step({"a0": np.zeros(2, int)})
    with pytest.raises(ValueError, match="leading axis of 2 copies"):
        env.step({"a0": np.zeros(3, int), "a1": np.zeros(3, int)})
    env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


@pytest.mark.parametrize("bad", [[], [1]])
def test_vec_parallel_envs_reject_bad_env_fns(bad):
    for cls in VEC_CLASSES:
        with pytest.raises(ValueError, match="env_fns"):
            cls(bad)


def test_subproc_rejects_fork():
    with pytest.raises(ValueError, match="start_method='fork'.*spawn, forkserver"):
        SubProcVecParallelEnv(count_envs(3), start_method="fork")


# ---------------------------------------------------------------------------------------------
# Processes: close, a dead worker, a worker that raises, a parent that dies
# ---------------------------------------------------------------------------------------------


def test_subproc_close_leaves_no_process():
    env = SubProcVecParallelEnv(count_envs(3, 3, 3))
    pids = [p.pid for p in env.processes]
    assert all(alive(pid) for pid in pids)
    env.reset(seed=0)
    env.close()
    env.close()  # idempotent
    assert_gone(pids, timeout=1.0)
    assert all(p.exitcode == 0 for p in env.processes)  # they closed and exited on request


def test_subproc_worker_killed_raises_clear_error_and_shuts_the_others_down():
    env = SubProcVecParallelEnv(count_envs(5, 5, 5))
    pids = [p.pid for p in env.processes]
    env.reset(seed=0)
    os.kill(pids[1], signal.SIGKILL)
    env.processes[1].join(5)
    actions = {"a0": np.zeros(3, int), "a1": np.zeros(3, int)}
    with pytest.raises(
        RuntimeError, match=rf"worker 1 \(pid {pids[1]}\) died while stepping, exit code -9 \(killed by SIGKILL\)"
    ):
        env.step(actions)
    assert env.closed
    assert_gone(pids)
    env.close()  # nothing left to do, no error


def test_subproc_worker_exiting_midway_raises():
    env = SubProcVecParallelEnv([functools.partial(CountParallelEnv, exit_at=2), CountParallelEnv])
    pids = [p.pid for p in env.processes]
    env.reset(seed=0)
    actions = {"a0": np.zeros(2, int), "a1": np.zeros(2, int)}
    env.step(actions)
    with pytest.raises(RuntimeError, match="worker 0 .* exit code 3"):
        env.step(actions)
    assert_gone(pids)


def test_subproc_worker_exception_is_raised_with_its_traceback():
    env = SubProcVecParallelEnv([CountParallelEnv, functools.partial(CountParallelEnv, raise_at=1)])
    pids = [p.pid for p in env.processes]
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match=r"(?s)worker 1 .* raised while stepping.*CountParallelEnv: boom"):
        env.step({"a0": np.zeros(2, int), "a1": np.zeros(2, int)})
    assert_gone(pids)


def test_subproc_env_fn_that_fails_shuts_every_worker_down():
    def broken():
        raise OSError("no such environment")

    with pytest.raises(RuntimeError, match=r"(?s)worker 1 .* making its environment.*no such environment"):
        SubProcVecParallelEnv([CountParallelEnv, broken])
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("kitae-parallel-env")]


def test_an_unguarded_script_is_told_to_guard_its_entry_point(tmp_path):
    """A script that makes its environments at import time: each spawned worker imports it again,
    cannot start processes while bootstrapping, and exits 1 before it can report anything; the
    parent's error names the likely cause and the fix."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(TESTS)!r})
        from _parallel_envs import CountParallelEnv
        from kitae.envs.subproc import SubProcVecParallelEnv

        SubProcVecParallelEnv([CountParallelEnv])
        """)
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert "worker 0" in last and "died while making its environment, exit code 1" in last, done.stderr
    assert 'guard its entry point with `if __name__ == "__main__":`' in last, done.stderr


def test_workers_exit_when_the_parent_is_killed(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(f"""
        import functools, sys, time
        sys.path.insert(0, {str(TESTS)!r})
        from _parallel_envs import CountParallelEnv
        from kitae.envs.subproc import SubProcVecParallelEnv

        if __name__ == "__main__":
            env = SubProcVecParallelEnv([CountParallelEnv, CountParallelEnv])
            env.reset(seed=0)
            print(" ".join(str(p.pid) for p in env.processes), flush=True)
            time.sleep(60)
    """)
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
        parent.kill()  # SIGKILL: no atexit, no finalizer; the workers see their pipe close
        parent.wait(10)
        assert_gone(pids)
    finally:
        if parent.poll() is None:
            parent.kill()


# ---------------------------------------------------------------------------------------------
# What kitae refuses (for now): heterogeneous agents, agents that come and go, AEC environments
# ---------------------------------------------------------------------------------------------


def test_heterogeneous_spaces_are_refused():
    with pytest.raises(UnsupportedParallelEnv, match="agents differ in observation spaces: 'a1' has Box"):
        check_env(CountParallelEnv(hetero=True))
    with pytest.raises(UnsupportedParallelEnv, match=r"agents differ in observation spaces.*\(in worker 0"):
        SubProcVecParallelEnv([functools.partial(CountParallelEnv, hetero=True)])
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("kitae-parallel-env")]


@pytest.mark.parametrize("cls", VEC_CLASSES)
def test_agents_that_come_and_go_are_refused(cls):
    env = cls([functools.partial(CountParallelEnv, leave_at=2)])
    env.reset(seed=0)
    actions = {"a0": np.zeros(1, int), "a1": np.zeros(1, int)}
    env.step(actions)
    with pytest.raises(UnsupportedParallelEnv, match=r"agents \['a1'\] ended their episode while \['a0'\] go on"):
        env.step(actions)
    env.close()


def test_check_env_wraps_a_single_parallel_env_in_process():
    env = check_env(CountParallelEnv())
    assert isinstance(env, SyncVecParallelEnv) and env.num_envs == 1
    obs, _ = env.reset(seed=0)
    assert obs["a0"].shape == (1, 2)
    env.close()
    vec = SyncVecParallelEnv(count_envs(3))
    assert check_env(vec) is vec
    vec.close()


@needs_mpe2
def test_check_env_refuses_aec_environments_and_others():
    from mpe2 import simple_spread_v3

    aec = simple_spread_v3.env()
    with pytest.raises(TypeError, match="AEC environment.*parallel_env"):
        check_env(aec)
    aec.close()
    with pytest.raises(TypeError, match="ParallelEnv"):
        check_env(object())


@needs_mpe2
@pytest.mark.parametrize("cls", VEC_CLASSES)
def test_a_one_agent_parallel_env_is_refused_when_the_vector_env_is_made(cls):
    """mpe2's simple_v3 has one agent: accepted before, it failed deep in the first act step
    ("entry not a 2- or 3- tuple"). The multi-agent mode needs n_agents > 1."""
    from mpe2 import simple_v3

    match = r"'simple_v3' has one agent \['agent_0'\], which is not allowed; allowed: at least 2 agents"
    with pytest.raises(UnsupportedParallelEnv, match=match):
        cls([simple_v3.parallel_env] * 2)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("kitae-parallel-env")]


@needs_mpe2
def test_kitae_train_refuses_a_one_agent_pettingzoo_env_in_one_line(tmp_path, capsys, monkeypatch):
    from kitae.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["train", "ppo", "pettingzoo:mpe2.simple_v3", "--steps", "200"]) != 0
    assert not (tmp_path / "runs").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kitae: error: the ParallelEnv 'simple_v3' has one agent"), err


@needs_mpe2
def test_check_parallel_env_on_simple_spread():
    from mpe2 import simple_spread_v3

    env = simple_spread_v3.parallel_env(N=3)
    agents, observation_space, action_space = check_parallel_env(env)
    assert agents == ("agent_0", "agent_1", "agent_2")
    assert observation_space.shape == (18,) and action_space.n == 5
    env.close()


# ---------------------------------------------------------------------------------------------
# Episode statistics and process_termination with dicts
# ---------------------------------------------------------------------------------------------


def test_agent_episodes_team_return_is_the_sum_over_agents():
    episodes = AgentEpisodes(["a", "b"], 2)
    no = np.array([False, False])
    ended, team, per_agent = episodes.step({"a": [1.0, 2.0], "b": [10.0, 20.0]}, {"a": no, "b": no}, {"a": no, "b": no})
    assert team == [] and per_agent == {"a": [], "b": []} and not ended.any()
    end1 = np.array([False, True])
    ended, team, per_agent = episodes.step(
        {"a": [0.5, 1.0], "b": [0.0, -4.0]}, {"a": no, "b": no}, {"a": end1, "b": end1}
    )
    assert team == [(1, 2.0 + 20.0 + 1.0 - 4.0, 2)]
    assert per_agent == {"a": [3.0], "b": [16.0]}
    ended, team, per_agent = episodes.step({"a": [1.0, 1.0], "b": [1.0, 1.0]}, {"a": ~no, "b": ~no}, {"a": no, "b": no})
    assert team == [(0, 1.0 + 10.0 + 0.5 + 0.0 + 2.0, 3), (1, 2.0, 1)]
    assert per_agent == {"a": [2.5, 1.0], "b": [11.0, 1.0]}


def test_process_termination_with_dicts_keyed_by_agent():
    next_obs = {"a": np.array([[1.0], [2.0]]), "b": np.array([[3.0], [4.0]])}
    infos = {
        "final_obs": {"a": np.array([[1.0], [9.0]]), "b": np.array([[3.0], [8.0]])},
        "_final_obs": np.array([False, True]),
    }
    real = process_termination(10, next_obs, infos, None)
    np.testing.assert_array_equal(real["a"], [[1.0], [9.0]])
    np.testing.assert_array_equal(real["b"], [[3.0], [8.0]])
    np.testing.assert_array_equal(next_obs["a"], [[1.0], [2.0]])  # the next step starts from the reset
    assert process_termination(10, next_obs, {}, None) is next_obs


# ---------------------------------------------------------------------------------------------
# Environment ids
# ---------------------------------------------------------------------------------------------


@needs_mpe2
def test_make_vec_env_pettingzoo_ids():
    from kitae.envs.make import make_vec_env

    env = make_vec_env("pettingzoo:mpe2.simple_spread_v3", 2, env_kwargs={"N": 2, "max_cycles": 5})
    assert isinstance(env, SyncVecParallelEnv)
    assert env.num_envs == 2 and env.possible_agents == ["agent_0", "agent_1"]
    obs, _ = env.reset(seed=0)
    assert obs["agent_0"].shape == (2, 12)
    env.close()
    env = make_vec_env(
        "pettingzoo:mpe2.simple_spread_v3", 2, vectorization_mode="async", env_kwargs={"continuous_actions": True}
    )
    assert isinstance(env, SubProcVecParallelEnv) and env.single_action_space.shape == (5,)
    env.close()


@needs_mpe2
@pytest.mark.parametrize(
    "env_id, match",
    [
        (
            "pettingzoo:mpe2.simple_nothing_v1",
            r"unknown PettingZoo environment 'mpe2.simple_nothing_v1'.*simple_spread_v3",
        ),
        ("pettingzoo:os.path", r"unknown PettingZoo environment 'os.path'; allowed: 'pettingzoo:mpe2.<env>'"),
        ("pettingzoo:simple_spread_v3", r"'simple_spread_v3' is not allowed; allowed: 'pettingzoo:mpe2.<env>'"),
        ("pettingzoo:sisl.nothing_v0", r"unknown PettingZoo environment 'sisl.nothing_v0'.*pursuit_v5"),
        (
            "pettingzoo:classic.connect_four_v3",
            r"'classic.connect_four_v3' has no parallel_env \(an AEC-only environment\)",
        ),
        (
            "pettingzoo:classic.chess_v6",
            r"'classic.chess_v6' needs the package 'chess' "
            r"\(PettingZoo's extra: pip install 'pettingzoo\[classic\]==1.27.0'\)",
        ),
    ],
)
def test_make_vec_env_rejects_unknown_pettingzoo_ids(env_id, match):
    from kitae.envs.make import make_vec_env

    with pytest.raises(ValueError, match=match):
        make_vec_env(env_id, 1)


def test_make_vec_env_rejects_video_for_pettingzoo():
    from kitae.envs.make import make_vec_env

    with pytest.raises(ValueError, match="capture_video=True is not available for PettingZoo"):
        make_vec_env("pettingzoo:mpe2.simple_spread_v3", 1, capture_video=True, run_name="x")


# ---------------------------------------------------------------------------------------------
# Shared-parameter training: PPO, DQN, SAC, TD3 (smoke tests, a few updates each)
# ---------------------------------------------------------------------------------------------


def _config(algo, env, n_env_steps, seed=0, **update):
    import kitae.config as cfg
    from kitae.algos.collections import get_algorithm

    agent_cls, params_cls = get_algorithm(algo)
    params = {"ppo": {}, "dqn": {"start_step": 0}, "sac": {"start_step": 16}, "td3": {"start_step": 16}}[algo]
    config = cfg.AlgoConfig(
        seed=seed,
        algo_params=params_cls(**params),
        update_cfg=cfg.UpdateConfig(**update),
        train_cfg=cfg.TrainConfig(n_env_steps=n_env_steps),
        env_cfg=cfg.EnvConfig(
            task_name="pettingzoo:mpe2.simple_spread_v3",
            observation_space=env.single_observation_space,
            action_space=env.single_action_space,
            n_envs=env.num_envs,
            n_agents=env.num_agents,
        ),
    )
    return agent_cls, config


def _spread(n_envs=2, continuous=False, mode="sync"):
    from kitae.envs.make import make_vec_env

    return make_vec_env(
        "pettingzoo:mpe2.simple_spread_v3",
        n_envs,
        vectorization_mode=mode,
        env_kwargs={"N": 2, "max_cycles": 10, "continuous_actions": continuous},
    )


SMOKE = [
    ("ppo", False, {"max_buffer_size": 10, "batch_size": 20, "n_epochs": 2}),
    ("dqn", False, {"max_buffer_size": 100, "batch_size": 16, "n_epochs": 1}),
    ("sac", True, {"max_buffer_size": 100, "batch_size": 16, "n_epochs": 1}),
    ("td3", True, {"max_buffer_size": 100, "batch_size": 16, "n_epochs": 1}),
]


@needs_mpe2
@pytest.mark.parametrize("algo, continuous, update", SMOKE, ids=[s[0] for s in SMOKE])
def test_shared_parameter_training_smoke(algo, continuous, update, tmp_path):
    import jax
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboardX import SummaryWriter

    from kitae.loops.train import vectorized_train

    env = _spread(continuous=continuous)
    agent_cls, config = _config(algo, env, 60, **update)
    agent = agent_cls("smoke", config)
    assert agent.parallel
    before = jax.tree_util.tree_map(np.array, agent.state)
    writer = SummaryWriter(str(tmp_path / "logs"))
    stats = vectorized_train(0, agent, env, 60, agent.algo_type, writer=writer)
    writer.close()
    assert env.closed
    assert stats.env_steps == 60 and stats.n_updates >= 3
    # 2 copies of 10-step episodes: 6 episodes, each agent's return logged; team = sum over agents
    assert stats.episode_lengths == [10] * 6
    assert set(stats.agent_episode_returns) == {"agent_0", "agent_1"}
    team = np.sum([stats.agent_episode_returns[a] for a in ("agent_0", "agent_1")], axis=0)
    np.testing.assert_allclose(stats.episode_returns, team, rtol=1e-6)
    changed = jax.tree_util.tree_map(
        lambda a, b: not np.array_equal(a, b), before, jax.tree_util.tree_map(np.array, agent.state)
    )
    assert any(jax.tree_util.tree_leaves(changed)), "no parameter changed"
    tags = EventAccumulator(str(tmp_path / "logs")).Reload().Tags()["scalars"]
    assert {"charts/episodic_return", "charts/agent_0/episodic_return", "charts/agent_1/episodic_return"} <= set(tags)


def test_host_loop_stores_each_agents_own_transitions():
    """What the env received and returned for each agent in each copy is what the buffer holds:
    actions, observations, rewards, real final observations at the truncation, then the reset."""
    import kitae.config as cfg
    from kitae.algos.collections.ppo import PPO, PPOParams
    from kitae.loops.train import vectorized_train

    env = SyncVecParallelEnv([functools.partial(CountParallelEnv, limit=4)] * 3)
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=PPOParams(),
        update_cfg=cfg.UpdateConfig(max_buffer_size=10, batch_size=6),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig("count", env.single_observation_space, env.single_action_space, n_envs=3, n_agents=2),
    )
    agent = PPO("count", config)
    copies = env.copies
    stats = vectorized_train(0, agent, env, 30, agent.algo_type)  # one rollout of 10 vector steps, one update
    rows, size = agent.buffer._rows, 10  # the update emptied the buffer; its rows are still there
    assert (
        agent.n_updates == 1 and agent.buffer.size == 0 and stats.episode_returns == [4 * (1 + 2)] * 6
    )  # team = a0's 4 * 1 + a1's 4 * 2
    assert stats.agent_episode_returns == {"a0": [4.0] * 6, "a1": [8.0] * 6}
    for i, copy in enumerate(copies):
        for index, agent_name in enumerate(("a0", "a1")):
            assert [int(sent[agent_name]) for sent in copy.env.actions] == rows.action[agent_name][:size, i].tolist()
            np.testing.assert_array_equal(
                rows.observation[agent_name][:size, i, 0], [0, 1, 2, 3, 100, 101, 102, 103, 200, 201]
            )
            np.testing.assert_array_equal(
                rows.next_observation[agent_name][:size, i, 0], [1, 2, 3, 4, 101, 102, 103, 104, 201, 202]
            )
            assert (rows.observation[agent_name][:size, i, 1] == index).all()
            assert rows.reward[agent_name][:size, i].tolist() == [index + 1.0] * 10
            assert rows.truncated[agent_name][:size, i].tolist() == [False, False, False, True] * 2 + [False] * 2
            assert not rows.done[agent_name][:size, i].any()


@needs_mpe2
def test_shared_parameter_ppo_in_worker_processes_is_reproducible():
    from kitae.algos.collections.ppo import PPO
    from kitae.loops.train import vectorized_train

    fingerprints = []
    for mode in ("async", "sync"):
        env = _spread(mode=mode)
        _, config = _config("ppo", env, 40, max_buffer_size=10, batch_size=20)
        agent = PPO("repro", config)
        pids = [p.pid for p in getattr(env, "processes", [])]
        vectorized_train(3, agent, env, 40, agent.algo_type)
        assert_gone(pids)
        fingerprints.append([np.asarray(x).tobytes() for x in __import__("jax").tree_util.tree_leaves(agent.state)])
    assert fingerprints[0] == fingerprints[1]  # same seed: the same parameters, whichever vector env


@needs_mpe2
def test_vectorized_train_checks_n_agents():
    import kitae.config as cfg
    from kitae.algos.collections.ppo import PPO
    from kitae.loops.train import vectorized_train

    env = _spread()
    _, config = _config("ppo", env, 20, max_buffer_size=10, batch_size=20)
    single = PPO(
        "x",
        cfg.AlgoConfig(
            config.seed,
            config.algo_params,
            config.update_cfg,
            config.train_cfg,
            cfg.EnvConfig("x", env.single_observation_space, env.single_action_space, 2, 1),
        ),
    )
    with pytest.raises(ValueError, match=r"has 2 agents \['agent_0', 'agent_1'\] but env_cfg.n_agents=1"):
        vectorized_train(0, single, env, 20, single.algo_type)
    assert env.closed


@needs_mpe2
def test_multi_agent_replay_buffer_survives_a_checkpoint(tmp_path):
    import jax

    from kitae.loops.executor import executor_for
    from kitae.loops.state import apply_loop_state
    from kitae.loops.train import vectorized_train
    from kitae.runs.checkpoints import Checkpointer
    from kitae.runs.load import restore_payload

    env = _spread()
    agent_cls, config = _config("dqn", env, 40, max_buffer_size=100, batch_size=16)
    agent = agent_cls("ckpt", config)
    vectorized_train(0, agent, env, 40, agent.algo_type)
    assert isinstance(agent.buffer.state.data.observation, dict) and agent.buffer.size == 20
    with Checkpointer(tmp_path / "checkpoints") as checkpointer:
        checkpointer.save(40, agent)
    fresh = agent_cls("ckpt", config)
    payload, _ = restore_payload(fresh, None, executor_for(env), tmp_path / "checkpoints")
    apply_loop_state(fresh, payload.state)
    assert jax.tree_util.tree_structure(agent.buffer.state) == jax.tree_util.tree_structure(fresh.buffer.state)
    for saved, restored in ((agent.buffer.state, fresh.buffer.state), (agent.state, fresh.state)):
        for x, y in zip(jax.tree_util.tree_leaves(saved), jax.tree_util.tree_leaves(restored)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert fresh.buffer.n_transitions == 20 * 2 * 2


# ---------------------------------------------------------------------------------------------
# kitae train / eval with a pettingzoo: id
# ---------------------------------------------------------------------------------------------


@needs_mpe2
def test_kitae_train_and_eval_pettingzoo(tmp_path):
    from kitae.runs import RunSpec, eval_run, resume_run, train_run

    run_dir = tmp_path / "run"
    summary = train_run(
        RunSpec(
            "ppo",
            "pettingzoo:mpe2.simple_spread_v3",
            steps=256,
            n_envs=2,
            quiet=True,
            run_dir=str(run_dir),
            sets=["update_cfg.max_buffer_size=32", "update_cfg.batch_size=64", "update_cfg.n_epochs=1"],
        )
    )
    assert summary["steps"] == 256 and np.isfinite(summary["final_return"])
    config = (run_dir / "config.yaml").read_text()
    assert "n_agents: 3" in config and "task_name: pettingzoo:mpe2.simple_spread_v3" in config
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert rows and all(row["episodic_length"] == 25 for row in rows)
    result = eval_run(run_dir, episodes=3)
    assert len(result["returns"][0]) == 3 and np.isfinite(result["mean"][0])
    # --video films the team's episode (it was refused for PettingZoo ids): the one evaluated
    filmed = eval_run(run_dir, episodes=1, video=True, seed=5)
    assert Path(filmed["video"]).stat().st_size > 1000 and Path(filmed["video"]).parent == run_dir / "videos"
    from kitae.envs.make import EnvSpec
    from kitae.envs.pettingzoo_envs import parallel_env_maker
    from kitae.loops.evaluate import evaluate_host, play_episode
    from kitae.runs import load_agent

    agent, frames = load_agent(run_dir), []
    single = parallel_env_maker("mpe2.simple_spread_v3")(render_mode="rgb_array")
    played = play_episode(agent, single, 5, frames=frames)
    single.close()
    assert played == filmed["returns"][0][0] == evaluate_host(agent, EnvSpec.parse(summary["env"]), 1, 5)[0]
    assert len(frames) == 26 and frames[0].shape == (700, 700, 3)  # the reset and 25 steps
    resumed = resume_run(run_dir, steps=384, quiet=True)
    assert resumed["steps"] == 384 and resumed["resumed_from"] == 256


def test_vec_parallel_env_is_a_vec_parallel_env():
    assert issubclass(SubProcVecParallelEnv, VecParallelEnv) and issubclass(SyncVecParallelEnv, VecParallelEnv)
