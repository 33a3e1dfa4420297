"""JaxMARL multi-agent environments in the compiled loop: the adapter, parameter-shared PPO (IPPO)
and DQN runs, determinism, seeds vmapped against single runs, the command line, bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kitae.envs import jaxmarl_env

try:  # through kitae, which keeps jaxmarl's import from touching the test's output streams
    jaxmarl_env._import_jaxmarl()
except ImportError:
    pytest.skip("the jaxmarl extra is not installed", allow_module_level=True)

import kitae.config as cfg
from kitae.algos.collections.dqn import DQN, DQNParams
from kitae.algos.collections.ppo import PPO, PPOParams
from kitae.envs.jaxmarl_env import JaxMARLEnv, VecJaxMARLEnv, make_jaxmarl_env
from kitae.envs.make import make_jax_env
from kitae.loops.compiled import compiled_train
from kitae.loops.multi_agent import evaluate_team_returns, track_team_episodes

pytestmark = pytest.mark.timeout(180)  # a hung compilation fails instead of stalling the run

SPREAD = "MPE_simple_spread_v3"
AGENTS = ("agent_0", "agent_1", "agent_2")


def _leaves_equal(a, b) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb))


def _leaves_close(a, b, **tol) -> bool:
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    return len(la) == len(lb) and all(np.allclose(x, y, **tol) for x, y in zip(la, lb))


def _config(
    env, algo_params, *, seed=0, max_buffer_size=8, batch_size=48, n_epochs=2, n_env_steps=10_000, n_agents=None
):
    return cfg.AlgoConfig(
        seed=seed,
        algo_params=algo_params,
        update_cfg=cfg.UpdateConfig(
            learning_rate=1e-3, max_buffer_size=max_buffer_size, batch_size=batch_size, n_epochs=n_epochs
        ),
        train_cfg=cfg.TrainConfig(n_env_steps=n_env_steps),
        env_cfg=cfg.EnvConfig(
            task_name=f"jaxmarl:{SPREAD}",
            observation_space=env.single_observation_space,
            action_space=env.single_action_space,
            n_envs=env.num_envs,
            n_agents=env.n_agents if n_agents is None else n_agents,
        ),
    )


# ---------------------------------------------------------------------------------------------
# The adapter
# ---------------------------------------------------------------------------------------------


def test_adapter_spaces_and_dict_shapes():
    env = make_jax_env(f"jaxmarl:{SPREAD}", 4)
    assert isinstance(env, VecJaxMARLEnv)
    assert env.agents == AGENTS and env.n_agents == 3 and env.num_envs == 4
    assert env.single_observation_space.shape == (18,) and env.single_observation_space.dtype == np.float32
    assert env.single_action_space.n == 5
    obs, state = jax.jit(env.reset)(jax.random.PRNGKey(0))
    assert set(obs) == set(AGENTS) and all(obs[a].shape == (4, 18) and obs[a].dtype == jnp.float32 for a in AGENTS)
    actions = {a: jnp.zeros((4,), jnp.int32) for a in AGENTS}
    ts = jax.jit(env.step)(jax.random.PRNGKey(1), state, actions)
    for field in (ts.observation, ts.next_observation):
        assert set(field) == set(AGENTS) and all(field[a].shape == (4, 18) for a in AGENTS)
    for field, dtype in ((ts.reward, jnp.float32), (ts.terminated, bool), (ts.truncated, bool)):
        assert set(field) == set(AGENTS) and all(field[a].shape == (4,) and field[a].dtype == dtype for a in AGENTS)


def test_adapter_resets_at_the_time_limit_with_the_real_final_observation_and_truncation():
    max_steps = 3
    env = JaxMARLEnv(SPREAD, max_steps=max_steps)
    assert env.episode_end == "truncation"
    _, state = env.reset(jax.random.PRNGKey(0))
    step = jax.jit(env.step)
    step_env, reset = jax.jit(env.env.step_env), jax.jit(env.env.reset)
    actions = {a: jnp.int32(i + 1) for i, a in enumerate(AGENTS)}
    lengths = []
    t = 0
    for k in range(2 * (max_steps + 2)):
        key = jax.random.PRNGKey(100 + k)
        ts = step(key, state, actions)
        t += 1
        # what the adapter must have done: JaxMARL's step without reset, then a reset if over
        step_key, reset_key = jax.random.split(key)
        obs_step, _, rewards, dones, _ = step_env(step_key, state, actions)
        for a in AGENTS:
            np.testing.assert_array_equal(ts.next_observation[a], obs_step[a])
            np.testing.assert_array_equal(ts.reward[a], rewards[a])
            assert not bool(ts.terminated[a])
            assert bool(ts.truncated[a]) == bool(dones["__all__"])
        if bool(dones["__all__"]):
            obs_reset, state_reset = reset(reset_key)
            for a in AGENTS:
                np.testing.assert_array_equal(ts.observation[a], obs_reset[a])
                assert not np.array_equal(ts.observation[a], ts.next_observation[a])
            assert _leaves_equal(ts.state, state_reset)
            lengths.append(t)
            t = 0
        else:
            for a in AGENTS:
                np.testing.assert_array_equal(ts.observation[a], ts.next_observation[a])
        state = ts.state
    # JaxMARL's MPE marks an episode done on the step that starts at step count max_steps, so an
    # episode has max_steps + 1 transitions; two whole episodes fit in the loop above.
    assert lengths == [max_steps + 1, max_steps + 1]


def test_a_step_without_reset_keeps_the_state_the_episode_ends_in():
    """What a video draws: ``step``'s fields with its step key, and the reached state where it resets."""
    env = JaxMARLEnv(SPREAD, max_steps=3)
    _, state = env.reset(jax.random.PRNGKey(0))
    step, without = jax.jit(env.step), jax.jit(env.step_without_reset)
    actions = {a: jnp.int32(i + 1) for i, a in enumerate(AGENTS)}
    for k in range(4):  # an episode has max_steps + 1 transitions
        key = jax.random.PRNGKey(100 + k)
        ts, kept = step(key, state, actions), without(jax.random.split(key)[0], state, actions)
        for field in ("reward", "terminated", "truncated", "next_observation"):
            assert _leaves_equal(getattr(ts, field), getattr(kept, field)), field
        assert _leaves_equal(kept.observation, kept.next_observation) and int(kept.state.step) == k + 1
        if k < 3:
            assert _leaves_equal(ts.state, kept.state)
        state = ts.state
    assert all(bool(kept.truncated[a]) for a in AGENTS) and int(ts.state.step) == 0  # step reset


@pytest.mark.filterwarnings("ignore:JAXopt is no longer maintained")  # imported with coin_game
def test_an_mpe_state_is_drawn_as_an_rgb_frame():
    env = JaxMARLEnv(SPREAD)
    _, state = env.reset(jax.random.PRNGKey(0))
    moved = env.step_without_reset(jax.random.PRNGKey(1), state, {a: jnp.int32(1) for a in AGENTS}).state
    try:
        first, second = env.render(state), env.render(moved)
    finally:
        env.close()
    assert first.shape == second.shape == (500, 500, 3) and first.dtype == np.uint8
    assert first.std() > 5 and not np.array_equal(first, second)  # a drawing; the agents moved, the step too
    assert env.render_fps == pytest.approx(10.0)  # MPE's dt is 0.1 s
    with pytest.raises(ValueError, match="cannot be drawn; allowed: the MPE_"):
        JaxMARLEnv("coin_game", episode_end="termination").render(state)


def test_adapter_clips_continuous_actions_to_the_box():
    env = JaxMARLEnv(SPREAD, action_type="Continuous")
    assert env.action_space.shape == (5,)
    np.testing.assert_array_equal(env.action_space.low, 0.0)
    np.testing.assert_array_equal(env.action_space.high, 1.0)
    _, state = env.reset(jax.random.PRNGKey(0))
    wild = {a: jnp.array([-3.0, 2.0, 5.0, -1.0, 0.5]) for a in AGENTS}
    clipped = {a: jnp.array([0.0, 1.0, 1.0, 0.0, 0.5]) for a in AGENTS}
    got = env.step(jax.random.PRNGKey(1), state, wild)
    want = env.step(jax.random.PRNGKey(1), state, clipped)
    assert _leaves_equal(got, want)


def test_termination_mode_sets_terminated_not_truncated():
    env = JaxMARLEnv(SPREAD, episode_end="termination", max_steps=1)
    _, state = env.reset(jax.random.PRNGKey(0))
    actions = {a: jnp.int32(0) for a in AGENTS}
    flags = []
    for k in range(2):
        ts = env.step(jax.random.PRNGKey(k), state, actions)
        flags.append(([bool(ts.terminated[a]) for a in AGENTS], [bool(ts.truncated[a]) for a in AGENTS]))
        state = ts.state
    assert flags == [([False] * 3, [False] * 3), ([True] * 3, [False] * 3)]


def test_bad_inputs_are_refused_with_clear_errors():
    with pytest.raises(ValueError, match=r"unknown JaxMARL environment 'NotAnEnv'; registered: .*MPE_simple_spread_v3"):
        make_jax_env("jaxmarl:NotAnEnv", 2)
    with pytest.raises(ValueError, match=r"'MPE_simple_spread'; did you mean 'MPE_simple_spread_v3'"):
        make_jax_env("jaxmarl:MPE_simple_spread", 2)
    # the speaker and the listener observe and act differently: no shared parameters possible
    with pytest.raises(ValueError, match=r"differ in their observation spaces.*allowed: every agent with the same"):
        JaxMARLEnv("MPE_simple_speaker_listener_v4")
    with pytest.raises(ValueError, match=r"^env_kwargs.episode_end='end' is not allowed; allowed: 'truncation', "):
        JaxMARLEnv(SPREAD, episode_end="end")
    with pytest.raises(ValueError, match=r"n_envs=0 is not allowed"):
        make_jaxmarl_env(SPREAD, 0)
    with pytest.raises(ValueError, match=r"^env_kwargs.episode_end=None is not allowed for 'switch_riddle'.*VALUE\)$"):
        JaxMARLEnv("switch_riddle")
    with pytest.raises(ValueError, match=r"env_kwargs=\['max_steps'\] are not allowed with an environment object"):
        JaxMARLEnv(JaxMARLEnv(SPREAD).env, max_steps=3)


def test_importing_jaxmarl_leaves_the_callers_streams_alone():
    # jaxmarl 0.2.0 prints on import and resets sys.stdout/sys.stderr to the process's originals
    code = (
        "import contextlib, io, sys\n"
        "out, err = io.StringIO(), io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
        "    from kitae.envs.jaxmarl_env import registered_envs\n"
        "    names = registered_envs()\n"
        "    assert sys.stdout is out and sys.stderr is err\n"
        "assert 'MPE_simple_spread_v3' in names\n"
        "print(repr(out.getvalue()))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout == "''\n"


def test_team_episode_tracking_by_hand():
    from kitae.envs.jax_env import JaxTimeStep

    returns = {"a": jnp.array([1.0, 2.0]), "b": jnp.array([0.5, 0.0])}
    lengths = jnp.array([3, 4], jnp.int32)
    ts = JaxTimeStep(
        observation=None,
        state=None,
        next_observation=None,
        reward={"a": jnp.array([1.0, 1.0]), "b": jnp.array([2.0, 2.0])},
        terminated={"a": jnp.array([False, False]), "b": jnp.array([False, True])},
        truncated={"a": jnp.array([True, False]), "b": jnp.array([True, False])},
    )
    running, running_length, team, episode_length, ended, per_agent = track_team_episodes(returns, lengths, ts)
    np.testing.assert_array_equal(ended, [True, False])  # env 1: only agent b ended, not the team
    np.testing.assert_allclose(team, [1 + 1 + 0.5 + 2, 2 + 1 + 0 + 2])
    np.testing.assert_allclose(per_agent["a"], [2.0, 3.0])
    np.testing.assert_allclose(per_agent["b"], [2.5, 2.0])
    np.testing.assert_allclose(running["a"], [0.0, 3.0])
    np.testing.assert_allclose(running["b"], [0.0, 2.0])
    np.testing.assert_array_equal(running_length, [0, 5])
    np.testing.assert_array_equal(episode_length, [4, 5])


def test_evaluate_team_returns_matches_stepping_by_hand():
    env = make_jaxmarl_env(SPREAD, 2, max_steps=4)  # episodes of 5 transitions

    def act(key, observation):
        return {a: jnp.full((2,), i + 1, jnp.int32) for i, a in enumerate(AGENTS)}

    key = jax.random.PRNGKey(7)
    table = evaluate_team_returns(env, act, key, episodes=2)
    assert table.shape == (2, 2)
    # the same steps by hand: the same key splits, rewards of all agents added up per episode
    key, reset_key = jax.random.split(key)
    observation, state = env.reset(reset_key)
    step = jax.jit(env.step)
    expected, totals = [[], []], np.zeros(2)
    for _ in range(10):
        key, act_key, step_key = jax.random.split(key, 3)
        ts = step(step_key, state, act(act_key, observation))
        totals += sum(np.asarray(ts.reward[a]) for a in AGENTS)
        for e in range(2):
            if bool(ts.truncated["agent_0"][e]):
                expected[e].append(totals[e])
                totals[e] = 0.0
        observation, state = ts.observation, ts.state
    np.testing.assert_allclose(table, expected, rtol=1e-5)
    with pytest.raises(ValueError, match="episodes=0 is not allowed"):
        evaluate_team_returns(env, act, key, episodes=0)


# ---------------------------------------------------------------------------------------------
# Compiled runs of parameter-shared agents
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def spread():
    return make_jax_env(f"jaxmarl:{SPREAD}", 4)


IPPO_STEPS = 4 * 8 * 6  # 6 rollouts of 8 vector steps in 4 environments


@pytest.fixture(scope="module")
def ippo_runs(spread):
    """IPPO runs of seeds 0 and 3, seed 0 again, and seeds [0, 3] vmapped in one program.

    The single-seed runs share one training program (the seed only changes its input), so after
    the first they load it from the session's compilation cache: 2 compilations, not 4.
    """
    runs = {}
    for name, seed in (("0", 0), ("3", 3), ("0 again", 0)):
        agent = PPO("ippo", _config(spread, PPOParams(), seed=seed), run_dir="unused")
        runs[name] = (agent, compiled_train(agent, spread, IPPO_STEPS))
    agent = PPO("ippo", _config(spread, PPOParams()), run_dir="unused")
    runs["batched"] = (agent, compiled_train(agent, spread, IPPO_STEPS, seeds=[0, 3]))
    return runs


@pytest.mark.slow
def test_ippo_compiled_run_trains_with_team_and_agent_statistics(ippo_runs):
    agent, result = ippo_runs["0"]
    assert agent.parallel and agent.env_step == IPPO_STEPS and agent.n_updates == 6
    before = PPO("ippo", agent.config, run_dir="unused").state
    m = result.metrics
    assert m.env_step.tolist() == [32 * (i + 1) for i in range(6)] and m.updated.all()
    assert set(m.info) >= {"loss_policy", "loss_value", "entropy"}
    assert np.all(np.isfinite(m.info["loss_total"]))
    # MPE episodes are 26 transitions long (max_steps 25): 48 steps per env -> one whole episode each
    assert m.episodes.sum() == 4 and np.all(m.length_sum[m.episodes > 0] == 26 * m.episodes[m.episodes > 0])
    assert set(m.agent_return_sum) == set(AGENTS)
    np.testing.assert_allclose(m.return_sum, sum(m.agent_return_sum[a] for a in AGENTS), rtol=1e-5, atol=1e-4)
    assert np.all(m.return_sum[m.episodes > 0] < 0)  # simple_spread rewards are distances: negative
    agent_returns = result.final_agent_returns()
    assert set(agent_returns) == set(AGENTS)
    assert result.final_return() == pytest.approx(sum(agent_returns.values()), rel=1e-5)
    assert not _leaves_equal(before.actor_critic.params, agent.state.actor_critic.params)
    # the rollout buffer holds dicts keyed by agent, (T, E) per agent
    data = result.state.buffer.data
    assert set(data.reward) == set(AGENTS) and data.observation["agent_0"].shape == (8, 4, 18)


@pytest.mark.slow
def test_same_seed_twice_gives_identical_parameters_and_vmapped_seeds_match_single_runs(ippo_runs):
    runs = {name: result for name, (_, result) in ippo_runs.items()}
    assert _leaves_equal(runs["0"].state.agent_state, runs["0 again"].state.agent_state)
    assert not _leaves_close(  # not even at the tolerance below
        runs["0"].state.agent_state.actor_critic.params, runs["3"].state.agent_state.actor_critic.params, atol=5e-3
    )
    batched = runs["batched"]
    assert batched.metrics.return_sum.shape == (2, 6)
    for i, name in enumerate(("0", "3")):
        per_seed = jax.tree_util.tree_map(lambda x, i=i: x[i], batched.state.agent_state)
        # The vmapped program rounds differently from the single one, and Adam moves a weight by
        # about the learning rate (1e-3) per step however small its gradient is: where rounding
        # flips a near-zero gradient's sign, that weight drifts by up to 2e-3 a step (24 steps
        # here). Compiled at XLA's backend level 0 (the suite's) a few weights drift by ~1e-3;
        # seeds 0 and 3 differ by more (checked above).
        assert _leaves_close(per_seed, runs[name].state.agent_state, rtol=1e-4, atol=5e-3)
        np.testing.assert_allclose(batched.metrics.return_sum[i], runs[name].metrics.return_sum, rtol=1e-4)
        for a in AGENTS:
            np.testing.assert_allclose(
                batched.metrics.agent_return_sum[a][i], runs[name].metrics.agent_return_sum[a], rtol=1e-4
            )


@pytest.mark.slow
def test_a_checkpointed_run_resumes_to_the_bits_of_an_uninterrupted_one(ippo_runs, spread, tmp_path):
    config = _config(spread, PPOParams(), seed=0)
    first = PPO("ippo", config, run_dir=tmp_path / "run")
    first.train(spread, IPPO_STEPS // 2)  # checkpoints at the end, with the environments
    # a fresh agent restores the loop state (dicts keyed by agent: buffer, observations,
    # returns; the environment state) and trains on
    again = PPO("ippo", config, run_dir=tmp_path / "run")
    resumed = again.resume(spread, IPPO_STEPS)
    assert resumed.start_step == IPPO_STEPS // 2 and resumed.env_steps == IPPO_STEPS
    whole = ippo_runs["0"][1]
    assert _leaves_equal(again.state, whole.state.agent_state)
    assert _leaves_equal(resumed.state.env, whole.state.env)
    np.testing.assert_array_equal(resumed.metrics.return_sum, whole.metrics.return_sum[3:])


@pytest.mark.slow
def test_dqn_compiled_run_on_discrete_mpe(spread):
    params = DQNParams(start_step=64, skip_steps=16, target_update_interval=10, exploration_fraction=0.5)
    config = _config(spread, params, max_buffer_size=64, batch_size=32, n_epochs=2, n_env_steps=320)
    agent = DQN("dqn", config, run_dir="unused")
    before = agent.state
    result = compiled_train(agent, spread, 320)
    steps, updated = result.metrics.env_step, result.metrics.updated
    assert steps[0] == 16 and steps[-1] == 320  # 4 vector steps of 4 envs per iteration
    np.testing.assert_array_equal(updated, steps >= 64)
    assert np.all(np.isfinite(result.metrics.info["loss_qvalue"]))
    assert result.metrics.episodes.sum() == 4 * (80 // 26)
    assert not _leaves_equal(before, agent.state)
    assert set(result.state.buffer.data.action) == set(AGENTS)


def test_agent_count_must_match_the_environment(spread):
    with pytest.raises(ValueError, match=r"the environment has 3 agent\(s\) but env_cfg.n_agents=1"):
        compiled_train(
            PPO("ippo", _config(spread, PPOParams(), batch_size=32, n_agents=1), run_dir="unused"), spread, 64
        )


# ---------------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_kitae_train_ppo_on_simple_spread(tmp_path, capsys):
    from kitae.cli import main

    run_dir = tmp_path / "run"
    argv = [
        "train",
        "ppo",
        f"jaxmarl:{SPREAD}",
        "--steps",
        "128",
        "--n-envs",
        "2",
        "--run-dir",
        str(run_dir),
        "--quiet",
        "--set",
        "update_cfg.max_buffer_size=32",
        "--set",
        "update_cfg.batch_size=48",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 128 and np.isfinite(summary["final_return"])
    config = cfg.AlgoConfig.from_yaml(run_dir / "config.yaml")
    assert config.env_cfg.n_agents == 3 and config.env_cfg.task_name == f"jaxmarl:{SPREAD}"
    # the checkpoint (dicts keyed by agent in the loop state) restores for evaluation
    assert main(["eval", str(run_dir), "--episodes", "3"]) == 0, capsys.readouterr().err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_episodes"] == 3 and summary["eval_return"] < 0
    # --video films the team's episode, drawn by JaxMARL's MPE visualizer: the reset and 26 steps
    assert main(["eval", str(run_dir), "--episodes", "1", "--video"]) == 0, capsys.readouterr().err
    video = run_dir / "videos" / "eval-step128-episode-0.mp4"
    assert capsys.readouterr().out.strip().endswith(f"video: {video}")
    from moviepy import VideoFileClip

    clip = VideoFileClip(str(video))
    assert clip.fps == 10 and clip.size == [500, 500] and clip.n_frames == 25 + 2
    clip.close()
    assert main(["train", "ppo", "jaxmarl:NotAnEnv", "--quiet", "--run-dir", str(tmp_path / "x")]) == 2
    assert "unknown JaxMARL environment 'NotAnEnv'" in capsys.readouterr().err
