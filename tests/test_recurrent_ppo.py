"""Recurrent PPO (``ppo_lstm``) and the hidden state through the executors.

The reset rule is pinned with values in the host loop's step, the compiled loop's step (each
single- and multi-agent, one hidden state per agent) and ``acting_step``: where an episode ends at
step t, the hidden state the core reads at step t + 1 is the initial one (and at step t itself,
the carried one). The update re-runs the core over stored sequences exactly as stepping it one
step at a time would; training is deterministic for a seed; a compiled run cut by a checkpoint and
resumed gives the bits of an uninterrupted one.
"""

from __future__ import annotations

import json

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kitae.algos.collections.recurrent_ppo import (
    RecurrentPPO,
    RecurrentPPOBatch,
    RecurrentPPOParams,
    sequence_outputs,
)
from kitae.cli import main
from kitae.distributed import AgentAlgorithm
from kitae.envs.make import EnvSpec, make_jax_env
from kitae.loops.collect import compiled_steps
from kitae.loops.executor import EXECUTORS
from kitae.loops.host import HostCollector
from kitae.loops.jax_collect import JaxCollector
from kitae.loops.state import env_reset_key
from kitae.runs import preset_agent
from kitae.runs.presets import load_preset
from kitae.runs.rundir import state_fingerprint

SETS = ["update_cfg.max_buffer_size=16", "update_cfg.batch_size=32", "algo_params.sequence_length=8"]


def _agent(tmp_path, env_id="CartPoleNoVel-v1", n_envs=4, sets=(), name="a"):
    return preset_agent("ppo_lstm", env_id, steps=512, n_envs=n_envs, run_dir=tmp_path / name, sets=[*SETS, *sets])


def _fresh_hidden(agent, acting, observation):
    """The hidden state the core gives from the initial state on ``observation`` (no key involved;
    multi-agent: observations and states are dicts keyed by agent)."""
    if isinstance(observation, dict):
        n = next(iter(observation.values())).shape[0]
        hidden = {a: agent.initial_hidden(n) for a in observation}
        start = dict.fromkeys(observation, jnp.zeros(n, bool))
    else:
        n = observation.shape[0]
        hidden, start = agent.initial_hidden(n), jnp.zeros(n, bool)
    _, _, hidden = agent.act_recurrent(acting, jax.random.PRNGKey(0), observation, hidden, start, 0)
    return hidden


def _rows(tree, rows):
    return [np.asarray(leaf)[rows] for leaf in jax.tree_util.tree_leaves(tree)]


def _check_reset_rule(agent, acting, step):
    """Steps with ``step() -> (observation acted on, experience flags, hidden after acting)`` until
    an episode has ended, then pins the rule on the next step."""
    ended_rows, previous_ended = None, None
    for _ in range(400):
        observation, ended, hidden = step()
        if ended_rows is not None and previous_ended is not None:
            fresh = _fresh_hidden(agent, acting, observation)
            for got, want in zip(_rows(hidden, ended_rows), _rows(fresh, ended_rows), strict=True):
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
            running = np.flatnonzero(~previous_ended)
            if running.size:  # rows that did not end carried their memory on
                assert not all(
                    np.allclose(g, w) for g, w in zip(_rows(hidden, running), _rows(fresh, running), strict=True)
                )
            return
        if ended.any():
            ended_rows, previous_ended = np.flatnonzero(ended), ended
    pytest.fail("no episode ended")


def _copy_ended(experience):
    """``(E,)``: the copy's episode ended (multi-agent: every agent's)."""
    done, truncated = experience.done, experience.truncated
    if isinstance(done, dict):
        return np.all([np.logical_or(done[a], truncated[a]) for a in done], axis=0)
    return np.logical_or(done, truncated)


def _check_start_flags(memory, ended):
    """The next observation starts an episode where the step ended one (multi-agent: for every
    agent, each with its own hidden state)."""
    if isinstance(memory.start, dict):
        assert set(memory.hidden) == set(memory.start)
        for flags in memory.start.values():
            assert np.array_equal(np.asarray(flags), ended)
    else:
        assert np.array_equal(np.asarray(memory.start), ended)


@pytest.mark.parametrize(
    ("env_id", "n_envs"), [("CartPoleNoVel-v1", 4), ("pettingzoo:mpe2.simple_spread_v3", 2)], ids=["gym", "pettingzoo"]
)
def test_the_host_loop_starts_the_next_step_from_the_initial_state(tmp_path, env_id, n_envs):
    agent, env = _agent(tmp_path, env_id, n_envs=n_envs)
    collector = HostCollector(agent, env, agent.parallel)
    collector.reset(0)
    act, acting = compiled_steps(agent).act, agent.acting_params(agent.state)
    state = {"key": jax.random.PRNGKey(1), "t": 0}

    def step():
        observation = collector.observations
        experience, _, state["key"] = collector.step(act, acting, state["key"], state["t"], state["t"] + n_envs)
        state["t"] += n_envs
        ended = _copy_ended(experience)
        _check_start_flags(collector.memory, ended)
        return observation, ended, collector.memory.hidden

    _check_reset_rule(agent, acting, step)
    env.close()


@pytest.mark.parametrize(
    ("env_id", "n_envs"),
    [("gymnax:CartPoleNoVel-v1", 4), ("jaxmarl:MPE_simple_spread_v3", 2)],
    ids=["gymnax", "jaxmarl"],
)
def test_the_compiled_loop_starts_the_next_step_from_the_initial_state(tmp_path, env_id, n_envs):
    agent, _ = _agent(tmp_path, env_id, n_envs=n_envs)
    collector = JaxCollector(agent, make_jax_env(env_id, n_envs))
    collector.reset(env_reset_key(0, 0))
    acting = agent.acting_params(agent.state)
    state = {"key": jax.random.PRNGKey(1), "t": 0}

    def step():
        assert collector.carry is not None
        observation = collector.carry.observation
        rows, _, state["key"] = collector.collect(acting, state["key"], state["t"], 1, n_envs)
        state["t"] += n_envs
        ended = _copy_ended(jax.tree_util.tree_map(lambda x: x[0], rows))
        _check_start_flags(collector.carry.memory, ended)
        return jax.tree_util.tree_map(np.asarray, observation), ended, collector.carry.memory.hidden

    _check_reset_rule(agent, acting, step)


def test_acting_step_resets_where_done_says_the_previous_episode_ended(tmp_path):
    agent, env = _agent(tmp_path)
    algorithm = AgentAlgorithm(agent)
    observation, _ = env.reset(seed=0)
    _, _, rhs, _ = algorithm.acting_step(observation, None, np.ones(4))
    _, _, rhs, _ = algorithm.acting_step(observation, rhs, np.zeros(4))  # a memory that is not the initial one
    done = np.array([1.0, 0.0, 0.0, 1.0])
    action, clipped, after, other = algorithm.acting_step(observation, rhs, done, deterministic=True)
    fresh = _fresh_hidden(agent, agent.acting_params(agent.state), observation)
    for got, want in zip(_rows(after, [0, 3]), _rows(fresh, [0, 3]), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert not np.allclose(_rows(after, [1])[0], _rows(fresh, [1])[0])
    assert action.shape == (4,) and other["log_prob"].shape == (4,) and other["value"].shape == (4,)
    # the value is the critic's after the same step (from the initial state where done holds)
    acting, start = agent.acting_params(agent.state), jnp.asarray(done, bool)
    ac = acting.actor_critic
    _, _, values = ac.apply_fn(ac.params, rhs, jnp.asarray(observation), start, method="step")
    np.testing.assert_allclose(other["value"], values, rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="needs hidden and start"):
        agent.act_extras(acting, observation)
    assert jax.tree_util.tree_map(np.shape, after) == jax.tree_util.tree_map(np.shape, agent.initial_hidden(4))
    # a done without one flag per row: named, not numpy's reshape error
    with pytest.raises(ValueError, match=r"^done of shape \(3,\) is not allowed; allowed: \(4,\), one flag per row"):
        algorithm.acting_step(observation, rhs, np.ones(3))
    env.close()


@pytest.mark.parametrize(("shared", "core"), [(True, "gru"), (False, "gru"), (False, "lstm")])
def test_the_update_over_sequences_equals_stepping_the_core(tmp_path, shared, core):
    """Loss inputs (log-probabilities, entropies, values) from ``sequence_outputs`` (encoders and
    heads over all rows at once, the cores scanned) equal those of the network stepped one step at
    a time from the stored state, resetting at the stored starts."""
    agent, env = _agent(tmp_path, sets=[f"algo_params.shared_core={shared}", f"algo_params.core={core}"])
    collector = HostCollector(agent, env, False)
    collector.reset(0)
    act, acting = compiled_steps(agent).act, agent.acting_params(agent.state)
    key, rows = jax.random.PRNGKey(2), []
    for t in range(16):
        experience, _, key = collector.step(act, acting, key, 4 * t, 4 * t + 4)
        rows.append(experience)
    rollout = jax.tree_util.tree_map(lambda *xs: np.stack(xs), *rows)  # (T, E, ...)
    processed, _ = agent.process_rollout(agent.state, jax.random.PRNGKey(3), rollout)
    assert processed.observation.shape == (4 * 16 // 8, 8, 2)  # whole sequences of 8 steps
    assert bool(processed.start.any())
    ac = agent.state.actor_critic
    log_probs, entropies, values = jax.jit(lambda b: sequence_outputs(ac, ac.params, b))(processed)
    for s in range(processed.observation.shape[0]):
        hidden = jax.tree_util.tree_map(lambda h, s=s: h[s][None], processed.hidden)
        for t in range(8):
            hidden, dist, value = ac.apply_fn(
                ac.params, hidden, processed.observation[s, t][None], processed.start[s, t][None], method="step"
            )
            np.testing.assert_allclose(values[s, t], value[0], rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(log_probs[s, t], dist.log_prob(processed.action[s, t][None])[0], rtol=1e-5)
            np.testing.assert_allclose(entropies[s, t], dist.entropy()[0], rtol=1e-5)
    # the processed values are the acting-time network's (the same parameters): V(obs) of step 0
    np.testing.assert_allclose(values, processed.value, rtol=1e-5, atol=1e-6)
    assert isinstance(processed, RecurrentPPOBatch)
    env.close()


def test_recurrent_training_is_deterministic_for_a_seed(tmp_path):
    """Only two runs of one seed were compared: a seed that changed nothing, or a run that did not
    train, passed. Now a run of another seed gives other bits, and the trained state is not the
    freshly built one."""
    prints = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        agent, env = preset_agent(
            "ppo_lstm", "CartPoleNoVel-v1", steps=512, n_envs=4, seed=seed, run_dir=tmp_path / name, sets=SETS
        )
        fresh, structure = state_fingerprint(agent.state), jax.tree_util.tree_structure(agent.state)
        result = EXECUTORS["host"].run(agent, env, 512)
        assert jax.tree_util.tree_structure(result.state.agent_state) == structure  # bits compared, not shapes
        prints.append(state_fingerprint(result.state.agent_state))
        assert prints[-1] != fresh
        env.close()
    assert prints[0] == prints[1] != prints[2]


def test_a_resumed_compiled_recurrent_run_gives_the_bits_of_an_uninterrupted_one(tmp_path):
    common = ["ppo_lstm", "gymnax:CartPoleNoVel-v1", "--quiet", "--n-envs", "4"]
    # a constant learning rate: an annealed one would reach zero at the first run's own end
    constant = ["update_cfg.learning_rate=0.001", "update_cfg.learning_rate_annealing=false"]
    # with PPO's running statistics on: they are part of the state the checkpoint carries
    constant += ["algo_params.normalize_observations=true", "algo_params.normalize_rewards=true"]
    common += [arg for s in [*SETS, *constant] for arg in ("--set", s)]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["train", *common, "--steps", "1024", "--run-dir", str(whole)]) == 0
    assert main(["train", *common, "--steps", "512", "--run-dir", str(cut)]) == 0
    assert main(["resume", str(cut), "--steps", "1024", "--quiet"]) == 0
    a, b = (json.loads((d / "summary.json").read_text()) for d in (whole, cut))
    assert a["steps"] == b["steps"] == 1024
    assert a["state_fingerprint"] == b["state_fingerprint"]


@pytest.mark.parametrize("core", ["lstm", "gru"])
def test_a_host_recurrent_run_resumes(tmp_path, core):
    """The host loop's checkpoint holds the buffer with its stored hidden states: an LSTM's is the
    pair (c, h), saved as paths ``hidden[0]`` / ``hidden[1]`` and read back as a dict ``{0: c,
    1: h}`` until the tuple was rebuilt: the resume failed inside Flax's LSTM with a traceback."""
    common = ["ppo_lstm", "CartPoleNoVel-v1", "--quiet", "--n-envs", "4", "--set", f"algo_params.core={core}"]
    common += [arg for s in SETS for arg in ("--set", s)]
    run_dir = tmp_path / "run"
    assert main(["train", *common, "--steps", "256", "--run-dir", str(run_dir)]) == 0
    assert main(["resume", str(run_dir), "--steps", "512", "--quiet"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 512 and summary["resumed_from"] == 256


def test_normalisation_keeps_ppos_running_statistics_and_acting_reads_them(tmp_path):
    """With ``normalize_observations`` and ``normalize_rewards``, PPO's hooks merge every rollout
    into the state's statistics (2 rollouts of 16 steps x 4 environments: 128 rows each), and
    acting reads ``clip((obs - mean) / sqrt(var + 1e-8), -clip, clip)``: the agent acting on raw
    observations equals one without normalisation acting on the normalised ones."""
    on = ["algo_params.normalize_observations=true", "algo_params.normalize_rewards=true"]
    agent, env = _agent(tmp_path, sets=on)
    state = EXECUTORS["host"].run(agent, env, 128).state.agent_state
    env.close()
    assert float(state.observation_statistics.count) == 128 and float(state.return_statistics.count) == 128
    mean, var = np.asarray(state.observation_statistics.mean), np.asarray(state.observation_statistics.var)
    assert mean.shape == (2,) and np.all(var != 1.0) and float(state.return_statistics.var) > 0
    off = ["algo_params.normalize_observations=false", "algo_params.normalize_rewards=false"]
    plain, plain_env = _agent(tmp_path, name="plain", sets=off)
    plain_env.close()
    observation = np.array([[0.5, -0.02], [1.0, 0.1], [-2.0, 0.0], [0.0, 0.3]], np.float32)
    clip = agent.config.algo_params.observation_clip
    normalised = np.clip((observation - mean) / np.sqrt(var + 1e-8), -clip, clip)
    hidden, start, key = agent.initial_hidden(4), jnp.array([True, False, False, True]), jax.random.PRNGKey(5)
    acting = agent.acting_params(state)
    got = agent.act_recurrent(acting, key, observation, hidden, start, 0)
    want = plain.act_recurrent(acting, key, jnp.asarray(normalised), hidden, start, 0)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("sets", "match"),
    [
        (["algo_params.sequence_length=5"], "sequence_length=5 does not divide"),
        (["algo_params.sequence_length=16", "update_cfg.batch_size=40"], "batch_size=40 is not a multiple"),
        (["algo_params.core=rnn"], "algo_params.core"),
        (["algo_params.core_size=0"], "algo_params.core_size"),
    ],
)
def test_bad_recurrent_configs_are_refused_clearly(tmp_path, sets, match):
    with pytest.raises(ValueError, match=match):
        _agent(tmp_path, sets=sets)


@pytest.mark.parametrize(
    "action_space",
    [gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32), gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3)))],
    ids=["box-2d", "tuple"],
)
def test_an_action_space_recurrent_ppo_cannot_act_in_is_refused_naming_it(action_space):
    """Not ``PPO cannot act in ...``: the error names the algorithm the user made."""
    from kitae.config import AlgoConfig, EnvConfig, TrainConfig, UpdateConfig

    config = AlgoConfig(
        seed=0,
        algo_params=RecurrentPPOParams(),
        update_cfg=UpdateConfig(max_buffer_size=16, batch_size=32),
        train_cfg=TrainConfig(n_env_steps=64),
        env_cfg=EnvConfig("x", gym.spaces.Box(-1.0, 1.0, (3,), np.float32), action_space, n_envs=4),
    )
    with pytest.raises(ValueError, match=r"^recurrent PPO \(ppo_lstm\) cannot act in the action space") as error:
        RecurrentPPO("refused", config, run_dir="unused")
    assert "recurrent PPO (ppo_lstm) accepts Discrete(n)" in str(error.value)


def test_observation_normalisation_without_a_box_space_is_refused_clearly(tmp_path):
    with pytest.raises(ValueError, match=r"normalize_observations=True needs a Box observation space, got Discrete"):
        _agent(tmp_path, env_id="Taxi-v4", sets=["algo_params.normalize_observations=true"])


def test_a_recurrent_agent_does_not_act_without_its_hidden_state(tmp_path):
    agent, env = _agent(tmp_path)
    with pytest.raises(TypeError, match="act_recurrent"):
        agent.act(agent.state, jax.random.PRNGKey(0), np.zeros((4, 2), np.float32), 0)
    with pytest.raises(TypeError, match="RecurrentPPOParams"):
        RecurrentPPO("x", make_vec_env_config(env))
    env.close()


def make_vec_env_config(env):
    from kitae.algos.collections.ppo import PPOParams
    from kitae.config import AlgoConfig, EnvConfig, TrainConfig, UpdateConfig

    return AlgoConfig(
        seed=0,
        algo_params=PPOParams(),
        update_cfg=UpdateConfig(max_buffer_size=16, batch_size=32),
        train_cfg=TrainConfig(n_env_steps=64),
        env_cfg=EnvConfig("x", env.single_observation_space, env.single_action_space, n_envs=4),
    )


def test_the_params_round_trip_through_yaml(tmp_path):
    agent, env = _agent(tmp_path, sets=["algo_params.core=gru", "algo_params.shared_core=false"])
    from kitae.config import AlgoConfig

    path = tmp_path / "config.yaml"
    agent.config.to_yaml(path)
    loaded = AlgoConfig.from_yaml(path)
    assert isinstance(loaded.algo_params, RecurrentPPOParams)
    assert loaded.algo_params == agent.config.algo_params
    env.close()


# The network's own keys: the recurrent preset's core and heads, the feed-forward baseline's MLP.
NETWORK_KEYS = {"core", "core_size", "hidden_sizes", "head_sizes", "shared_core", "activation", "sequence_length"}


@pytest.mark.parametrize("env_id", ["CartPoleNoVel-v1", "gymnax:CartPoleNoVel-v1"])
def test_the_feed_forward_baseline_preset_has_the_recurrent_presets_ppo_settings(env_id):
    """``ppo`` on CartPole without velocities is the baseline of issue 12's benchmark ("on the same
    settings": speed and learning, benchmarks/bench_recurrent.py): every setting but the network is
    ``ppo_lstm``'s, so a change to one preset that the other lacks fails here."""
    ff, recurrent = (load_preset(algo, EnvSpec.parse(env_id)) for algo in ("ppo", "ppo_lstm"))
    assert {k: v for k, v in ff.items() if k != "algo_params"} == {
        k: v for k, v in recurrent.items() if k != "algo_params"
    }
    ff_params = {k: v for k, v in ff["algo_params"].items() if k not in NETWORK_KEYS}
    recurrent_params = {k: v for k, v in recurrent["algo_params"].items() if k not in NETWORK_KEYS}
    assert ff_params == recurrent_params
    # the preset BENCHMARKS.md's speed figure (2.15x) was measured with: one shared core, 10 epochs
    assert recurrent["algo_params"]["shared_core"] is True and recurrent["update_cfg"]["n_epochs"] == 10


def test_the_filmed_episode_is_the_evaluated_one_with_the_hidden_state_carried(tmp_path):
    """``kitae eval --video`` of a recurrent run refused ("RecurrentPPO acts with a hidden state"):
    the video played ``select_action``. It now plays ``play_episode``, the deterministic policy
    with the memory ``evaluate_host`` carries: the same return on the same seed."""
    import gymnasium as gym

    from kitae.loops.evaluate import evaluate_host, play_episode

    agent, env = _agent(tmp_path)
    agent.train(env)
    spec = EnvSpec.parse("CartPoleNoVel-v1")
    for seed in (3, 4):
        single = gym.make("CartPoleNoVel-v1")
        assert play_episode(agent, single, seed) == evaluate_host(agent, spec, 1, seed)[0]
        single.close()
    assert main(["eval", str(tmp_path / "a"), "--episodes", "1", "--video"]) == 0
    videos = list((tmp_path / "a" / "videos").glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 1000
