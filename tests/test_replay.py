"""Replay (``kitae.replay``): the sum tree, prioritized sampling and its weights, n-step
transitions and hindsight relabelling against hand-computed values; the agents' updates that
write priorities back; the replay options refused where they cannot work."""

from __future__ import annotations

import json
import math
import shutil

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kitae.config as cfg
from kitae.buffer import BufferState, Experience, buffer_add, buffer_init
from kitae.cli import main
from kitae.envs.goals import bit_flipping_reward
from kitae.replay import prioritized as per
from kitae.replay import sum_tree as st
from kitae.replay.sampling import episode_bounds, n_step_transitions, relabel_goals, sample_transitions
from kitae.timesteps import bootstrap_discounts
from tests._small import small

pytestmark = pytest.mark.timeout(240)


# ---------------------------------------------------------------------------------------------
# The sum tree
# ---------------------------------------------------------------------------------------------


def _sums_hold(tree: st.SumTree) -> bool:
    nodes = np.asarray(tree.nodes)
    p = tree.leaves_offset
    return all(nodes[i] == nodes[2 * i] + nodes[2 * i + 1] for i in range(1, p))


def test_the_sum_tree_holds_its_sums_under_jit_and_updates_in_place():
    tree = st.sum_tree_init(5)
    assert tree.nodes.shape == (16,) and tree.leaves_offset == 8 and tree.depth == 3
    set_fn = jax.jit(st.sum_tree_set, donate_argnums=0)
    tree = set_fn(tree, jnp.arange(5), jnp.array([1.0, 2.0, 3.0, 4.0, 0.5]))
    np.testing.assert_array_equal(st.sum_tree_leaves(tree, 5), [1.0, 2.0, 3.0, 4.0, 0.5])
    assert float(st.sum_tree_total(tree)) == 10.5 and _sums_hold(tree)
    old = tree
    tree = set_fn(tree, jnp.array([1, 4, 1]), jnp.array([7.0, 0.0, 7.0]))  # a repeated index, same value
    assert old.nodes.is_deleted()  # donated: the update wrote into the same buffer
    np.testing.assert_array_equal(st.sum_tree_leaves(tree, 5), [1.0, 7.0, 3.0, 4.0, 0.0])
    assert float(st.sum_tree_total(tree)) == 15.0 and _sums_hold(tree)
    rng = np.random.default_rng(0)
    for _ in range(20):  # many updates: every internal node is still exactly its children's sum
        tree = set_fn(tree, jnp.asarray(rng.integers(0, 5, 3)), jnp.asarray(rng.uniform(0, 2, 3), jnp.float32))
        assert _sums_hold(tree)


def test_the_sum_tree_samples_in_proportion_to_the_priorities():
    priorities = np.array([1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 0.5], np.float32)
    tree = st.sum_tree_set(st.sum_tree_init(7), jnp.arange(7), jnp.asarray(priorities))
    draws = np.concatenate(
        [
            np.asarray(jax.jit(st.sum_tree_sample, static_argnums=2)(tree, jax.random.PRNGKey(i), 256))
            for i in range(200)
        ]
    )
    counts = np.bincount(draws, minlength=8)
    assert counts[2] == counts[5] == counts[7] == 0  # priority 0 and the padding leaf: never drawn
    expected = priorities / priorities.sum() * len(draws)
    chi2 = float(np.sum((counts[:7][priorities > 0] - expected[priorities > 0]) ** 2 / expected[priorities > 0]))
    assert chi2 < 20.5  # 4 degrees of freedom: p = 0.0004 (stratified draws give far less)
    np.testing.assert_allclose(counts[:7] / len(draws), priorities / priorities.sum(), atol=0.005)


def test_one_item_of_a_stratified_batch_per_segment():
    tree = st.sum_tree_set(st.sum_tree_init(4), jnp.arange(4), jnp.array([1.0, 1.0, 1.0, 1.0]))
    # 4 equal segments of the total 4 and equal priorities: one draw of each item, in order
    np.testing.assert_array_equal(st.sum_tree_sample(tree, jax.random.PRNGKey(3), 4), [0, 1, 2, 3])


# ---------------------------------------------------------------------------------------------
# Prioritized replay's pieces, by hand
# ---------------------------------------------------------------------------------------------


def test_priorities_weights_and_beta_by_hand():
    priorities = per.priorities_init(4)
    priorities = per.add_at_max_priority(priorities, jnp.array([0, 1]))  # max priority 1 at the start
    np.testing.assert_array_equal(st.sum_tree_leaves(priorities.tree, 4), [1.0, 1.0, 0.0, 0.0])
    # |td| + eps to the alpha: (3 + 1)^0.5 = 2 and (0 + 1)^0.5 = 1; the max priority becomes 2
    priorities = per.update_priorities(priorities, jnp.array([0, 1]), jnp.array([-3.0, 0.0]), 0.5, 1.0)
    np.testing.assert_allclose(st.sum_tree_leaves(priorities.tree, 4), [2.0, 1.0, 0.0, 0.0])
    assert float(priorities.max_priority) == 2.0 and int(priorities.steps) == 1
    priorities = per.add_at_max_priority(priorities, jnp.array([2]))
    np.testing.assert_allclose(st.sum_tree_leaves(priorities.tree, 4), [2.0, 1.0, 2.0, 0.0])
    # P = (2, 1, 2) / 5; with N = 3 and beta = 0.5: w = (3 P)^-0.5 = (1.2, 0.6, 1.2)^-0.5, over the max
    for fn in (per.importance_weights, jax.jit(per.importance_weights)):
        w = fn(jnp.array([0.4, 0.2, 0.4]), 3, 0.5)
        want = np.array([1.2, 0.6, 1.2]) ** -0.5
        np.testing.assert_allclose(w, want / want.max(), rtol=1e-6)
    _, probabilities = per.sample_prioritized(priorities, jax.random.PRNGKey(0), 5)
    assert np.all(np.isclose(probabilities, 0.4) | np.isclose(probabilities, 0.2))
    # beta: 0.4 -> 1 linearly over 100 steps, then 1
    np.testing.assert_allclose([per.annealed_beta(0.4, s, 100) for s in (0, 50, 100, 500)], [0.4, 0.7, 1.0, 1.0])


def test_a_prioritized_buffer_writes_new_rows_at_the_max_priority():
    example = Experience(
        jnp.zeros((2, 3)), jnp.zeros(2, jnp.int32), jnp.zeros(2), jnp.zeros(2, bool), jnp.zeros((2, 3)), jnp.zeros(2)
    )
    state = buffer_init(example, capacity=3, prioritized=True)
    assert state.priorities.tree.nodes.shape == (16,)  # 3 rows x 2 envs = 6 items -> 8 leaves
    state = buffer_add(state, example)
    state = state._replace(
        priorities=per.update_priorities(state.priorities, jnp.array([0]), jnp.array([3.0]), 1.0, 1.0)
    )
    state = jax.jit(buffer_add)(state, example)
    np.testing.assert_allclose(st.sum_tree_leaves(state.priorities.tree, 6), [4.0, 1.0, 4.0, 4.0, 0.0, 0.0])
    assert buffer_init(example, capacity=3).priorities is None


def test_bootstrap_discounts_by_hand():
    for fn in (bootstrap_discounts, jax.jit(bootstrap_discounts)):
        np.testing.assert_allclose(fn(0.9, jnp.array([False, True])), [0.9, 0.0])
        np.testing.assert_allclose(
            fn(0.9, jnp.array([False, True, False]), jnp.array([1, 3, 3])), [0.9, 0.0, 0.729], rtol=1e-6
        )
    np.testing.assert_allclose(
        jax.vmap(bootstrap_discounts, in_axes=(0, None, None))(
            jnp.array([0.5, 1.0]), jnp.array([False]), jnp.array([2])
        ),
        [[0.25], [1.0]],
    )


# ---------------------------------------------------------------------------------------------
# n-step transitions, by hand
# ---------------------------------------------------------------------------------------------


def _ring(rewards, done, truncated, *, position, size):
    """A buffer of ``C`` rows x 2 envs: observation = 10 * row + env, next_observation = that + 1000."""
    rewards = np.asarray(rewards, np.float32)
    capacity, n_envs = rewards.shape
    obs = (10 * np.arange(capacity)[:, None] + np.arange(n_envs)[None]).astype(np.float32)[..., None]
    data = Experience(
        observation=jnp.asarray(obs),
        action=jnp.zeros((capacity, n_envs), jnp.int32),
        reward=jnp.asarray(rewards),
        done=jnp.asarray(done, bool),
        next_observation=jnp.asarray(obs + 1000.0),
        log_prob=jnp.zeros((capacity, n_envs)),
        truncated=jnp.asarray(truncated, bool),
    )
    return BufferState(data, jnp.asarray(position, jnp.int32), jnp.asarray(size, jnp.int32))


def test_n_step_returns_cut_at_termination_and_truncation_by_hand():
    # 6 rows, env 0 terminates at row 2, env 1 is truncated at row 1; rewards r = row + 1 (env 0), 10 (env 1)
    rewards = np.stack([np.arange(1, 7), np.full(6, 10.0)], axis=1)
    done = np.zeros((6, 2), bool)
    done[2, 0] = True
    truncated = np.zeros((6, 2), bool)
    truncated[1, 1] = True
    buffer = _ring(rewards, done, truncated, position=0, size=6)
    rows, envs = jnp.array([0, 1, 3, 0, 1, 2]), jnp.array([0, 0, 0, 1, 1, 1])
    for fn in (n_step_transitions, jax.jit(n_step_transitions, static_argnums=3)):
        experience, n_steps = fn(buffer, rows, envs, 3, 0.5)
        # env 0 from row 0: 1 + 0.5 * 2 + 0.25 * 3, stops at the termination in row 2 (done, no bootstrap)
        # env 0 from row 1: 2 + 0.5 * 3 (row 2 terminated); from row 3: 4 + 0.5 * 5 + 0.25 * 6
        # env 1 from row 0: 10 + 0.5 * 10 (row 1 truncated: bootstrap from its final observation)
        # env 1 from row 1: 10 (truncated at once); from row 2: 10 + 5 + 2.5
        np.testing.assert_allclose(experience.reward, [2.75, 3.5, 8.0, 15.0, 10.0, 17.5])
        np.testing.assert_array_equal(n_steps, [3, 2, 3, 2, 1, 3])
        np.testing.assert_array_equal(experience.done, [True, True, False, False, False, False])
        np.testing.assert_array_equal(experience.truncated, [False, False, False, True, True, False])
        # the bootstrap observation is the last step's next observation; the observation the first step's
        np.testing.assert_array_equal(experience.next_observation[:, 0], [1020, 1020, 1050, 1011, 1011, 1041])
        np.testing.assert_array_equal(experience.observation[:, 0], [0, 10, 30, 1, 11, 21])


def test_n_step_returns_wrap_around_the_ring_and_stop_at_the_newest_row():
    # 4 rows, full, position 2: the oldest row is 2, then 3, 0, 1 (the newest)
    rewards = np.stack([np.array([1.0, 2.0, 3.0, 4.0]), np.array([5.0, 6.0, 7.0, 8.0])], axis=1)
    buffer = _ring(rewards, np.zeros((4, 2)), np.zeros((4, 2)), position=2, size=4)
    experience, n_steps = n_step_transitions(buffer, jnp.array([3, 0, 1, 3]), jnp.array([0, 0, 0, 1]), 3, 0.5)
    # row 3 -> 0 -> 1 (wraps): 4 + 0.5 * 1 + 0.25 * 2; row 0 -> 1, then the newest row ends it: 1 + 0.5 * 2
    # row 1 is the newest: 2 alone; env 1 from row 3: 8 + 0.5 * 5 + 0.25 * 6 (its own column)
    np.testing.assert_allclose(experience.reward, [5.0, 2.0, 2.0, 12.0])
    np.testing.assert_array_equal(n_steps, [3, 2, 1, 3])
    np.testing.assert_array_equal(experience.next_observation[:, 0], [1010, 1010, 1010, 1011])
    # a buffer that is not full ends at row size - 1
    partial = _ring(rewards, np.zeros((4, 2)), np.zeros((4, 2)), position=2, size=2)
    experience, n_steps = n_step_transitions(partial, jnp.array([0, 1]), jnp.array([0, 0]), 3, 0.5)
    np.testing.assert_allclose(experience.reward, [2.0, 2.0])
    np.testing.assert_array_equal(n_steps, [2, 1])


def test_n_step_sampling_through_the_agents_config_matches_the_hand_values():
    rewards = np.stack([np.arange(1, 7), np.full(6, 10.0)], axis=1)
    buffer = _ring(rewards, np.zeros((6, 2)), np.zeros((6, 2)), position=0, size=6)
    replay = cfg.ReplayConfig(n_step=2)
    sample = sample_transitions(buffer, jax.random.PRNGKey(0), 64, replay, gamma=0.5)
    rows, envs = np.asarray(sample.indices) // 2, np.asarray(sample.indices) % 2
    next_rewards = np.where(rows + 1 < 6, rewards[np.minimum(rows + 1, 5), envs], 0.0)
    np.testing.assert_allclose(sample.experience.reward, rewards[rows, envs] + 0.5 * next_rewards)
    np.testing.assert_array_equal(sample.experience.n_steps, np.where(rows + 1 < 6, 2, 1))
    assert sample.experience.weight is None


# ---------------------------------------------------------------------------------------------
# Hindsight relabelling
# ---------------------------------------------------------------------------------------------


def _goal_buffer():
    """Two envs x 8 rows of 2-bit goal observations: env 0 has episodes rows 0-2 (terminated at 2)
    and 3-7 (running); env 1 one episode truncated at row 4, then rows 5-7. achieved = row index
    coded on the goal vector (row, env)."""
    capacity, n_envs = 8, 2
    achieved = np.stack(np.meshgrid(np.arange(capacity), np.arange(n_envs), indexing="ij"), -1).astype(np.float32)
    observation = {
        "observation": jnp.asarray(achieved),
        "achieved_goal": jnp.asarray(achieved),
        "desired_goal": jnp.full((capacity, n_envs, 2), -1.0),
    }
    next_observation = {**observation, "achieved_goal": jnp.asarray(achieved + np.array([100.0, 0.0]))}
    done = np.zeros((capacity, n_envs), bool)
    done[2, 0] = True
    truncated = np.zeros((capacity, n_envs), bool)
    truncated[4, 1] = True
    data = Experience(
        observation=observation,
        action=jnp.zeros((capacity, n_envs), jnp.int32),
        reward=jnp.full((capacity, n_envs), -1.0),
        done=jnp.asarray(done),
        next_observation=next_observation,
        log_prob=jnp.zeros((capacity, n_envs)),
        truncated=jnp.asarray(truncated),
    )
    return BufferState(data, jnp.asarray(0, jnp.int32), jnp.asarray(capacity, jnp.int32))


def test_episode_bounds_by_hand():
    buffer = _goal_buffer()
    rows, envs = jnp.array([0, 2, 3, 6, 0, 4, 5]), jnp.array([0, 0, 0, 0, 1, 1, 1])
    before, after = episode_bounds(buffer, rows, envs, horizon=16)
    np.testing.assert_array_equal(before, [0, 2, 0, 3, 0, 4, 0])
    np.testing.assert_array_equal(after, [2, 0, 4, 1, 4, 0, 2])  # row 7 is the newest: env 0's episode goes on
    before, after = episode_bounds(buffer, rows, envs, horizon=2)  # the horizon bounds the search
    np.testing.assert_array_equal(after, [1, 0, 1, 1, 1, 0, 1])


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_relabelled_goals_come_from_the_episode_and_rewards_from_compute_reward(strategy):
    buffer = _goal_buffer()
    rows = jnp.asarray(np.tile([0, 1, 3, 4, 6, 0, 2, 5], 64))
    envs = jnp.asarray(np.tile([0, 0, 0, 0, 0, 1, 1, 1], 64))
    experience = jax.tree_util.tree_map(lambda x: x[rows, envs], buffer.data)
    calls = []

    def reward_fn(achieved, desired):  # bit flipping's rule on these goal vectors
        calls.append(achieved.shape)
        return bit_flipping_reward(achieved, desired)

    out = jax.jit(
        lambda e, k: relabel_goals(
            buffer, e, rows, envs, k, strategy=strategy, ratio=0.75, horizon=16, reward_fn=reward_fn
        )
    )(experience, jax.random.PRNGKey(0))
    goal = np.asarray(out.observation["desired_goal"])
    np.testing.assert_array_equal(goal, np.asarray(out.next_observation["desired_goal"]))
    relabelled = goal[:, 0] >= 0
    assert 0.6 < relabelled.mean() < 0.9  # about the ratio
    goal_rows, goal_envs = goal[relabelled, 0] - 100, goal[relabelled, 1]
    np.testing.assert_array_equal(goal_envs, np.asarray(envs)[relabelled])  # the same environment
    row, env = np.asarray(rows)[relabelled], np.asarray(envs)[relabelled]
    episode = {
        (0, 0): (0, 2),
        (0, 1): (0, 2),
        (0, 3): (3, 7),
        (0, 4): (3, 7),
        (0, 6): (3, 7),
        (1, 0): (0, 4),
        (1, 2): (0, 4),
        (1, 5): (5, 7),
    }
    low = np.array([episode[(e, r)][0] for e, r in zip(env, row)])
    high = np.array([episode[(e, r)][1] for e, r in zip(env, row)])
    if strategy == "future":
        assert np.all((goal_rows >= row) & (goal_rows <= high))
    elif strategy == "final":
        np.testing.assert_array_equal(goal_rows, high)
    else:
        assert np.all((goal_rows >= low) & (goal_rows <= high))
        assert np.any(goal_rows < row)  # earlier steps are drawn too
    # the reward is compute_reward(next achieved goal, new goal): 0 exactly where they are equal
    achieved = np.asarray(experience.next_observation["achieved_goal"])
    want = np.where(relabelled, -np.any(achieved != goal, axis=-1).astype(np.float32), -1.0)
    np.testing.assert_array_equal(out.reward, want)
    if strategy != "final":
        assert np.any(np.asarray(out.reward) == 0.0) and np.any(np.asarray(out.reward)[relabelled] == -1.0)
    np.testing.assert_array_equal(out.done, experience.done)  # termination as stored


# ---------------------------------------------------------------------------------------------
# Agents: priorities written back, runs in both loops, refusals
# ---------------------------------------------------------------------------------------------


def test_a_dqn_update_writes_the_sampled_transitions_priorities_back(tmp_path):
    from kitae.runs import preset_agent

    sets = [
        "replay.prioritized=true",
        "replay.priority_exponent=0.5",
        "update_cfg.n_epochs=1",
        "algo_params.start_step=0",
    ]
    agent, env = preset_agent("dqn", "CartPole-v1", steps=1000, n_envs=2, run_dir=tmp_path, sets=sets)
    obs, _ = env.reset(seed=0)
    for _ in range(40):
        actions = np.asarray([env.single_action_space.sample() for _ in range(2)])
        next_obs, reward, terminated, truncated, _ = env.step(actions)
        agent.buffer.add(Experience(obs, actions, reward, terminated, next_obs, np.zeros(2), truncated))
        obs = next_obs
    before = np.asarray(st.sum_tree_leaves(agent.buffer.state.priorities.tree, 80))
    np.testing.assert_array_equal(before, 1.0)  # every transition at the max priority, 1
    key = jax.random.PRNGKey(5)
    state, priorities, _ = jax.jit(agent.update_with_replay)(agent.state, key, agent.buffer.state)
    # the same step by hand: its sample, its TD errors, (|td| + eps)^0.5
    step_key = agent.gradient_step_keys(key)[0]
    batch, update_key, indices = agent.gradient_sample(agent.state, step_key, agent.buffer.state)
    _, info = agent.update_step_fn(agent.state, update_key, batch)
    after = np.asarray(st.sum_tree_leaves(priorities.tree, 80))
    want = (np.abs(np.asarray(info["td_error"])) + 1e-6) ** 0.5
    np.testing.assert_allclose(after[np.asarray(indices)], want, rtol=1e-6)
    untouched = np.setdiff1d(np.arange(80), np.asarray(indices))
    np.testing.assert_array_equal(after[untouched], 1.0)
    assert int(priorities.steps) == 1 and batch.weight is not None
    env.close()


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_prioritized_n_step_dqn_trains_deterministically_and_resumes_exactly_in_the_compiled_loop(tmp_path):
    args = ["train", "dqn", "gymnax:CartPole-v1", "--steps", "1024", "--quiet", "--set", "replay.prioritized=true"]
    args += [
        "--set",
        "replay.n_step=3",
        "--set",
        "algo_params.start_step=200",
        "--set",
        "train_cfg.save_frequency=512",
    ]
    whole, again, cut = tmp_path / "whole", tmp_path / "again", tmp_path / "cut"
    for run_dir in (whole, again):
        assert main([*args, "--run-dir", str(run_dir)]) == 0
    a, b = _summary(whole), _summary(again)
    assert a["state_fingerprint"] == b["state_fingerprint"]
    # the run as if stopped after its checkpoint at 512 steps: resuming it gives the whole run's bits
    shutil.copytree(whole, cut)
    for folder in (cut / "checkpoints").iterdir():
        if folder.name.isdigit() and int(folder.name) > 512:
            shutil.rmtree(folder)
    (cut / "summary.json").unlink()
    assert main(["resume", str(cut), "--quiet"]) == 0
    c = _summary(cut)
    assert c["resumed_from"] == 512 and c["state_fingerprint"] == a["state_fingerprint"]
    config = (cut / "config.yaml").read_text()
    assert "prioritized: true" in config and "n_step: 3" in config


@pytest.mark.parametrize("algo,env_id", [("sac", "Pendulum-v1"), ("td3", "Pendulum-v1"), ("sac", "CartPole-v1")])
def test_off_policy_agents_train_with_prioritized_n_step_replay_deterministically(tmp_path, algo, env_id):
    args = ["train", algo, env_id, "--steps", "400", "--quiet", "--set", "algo_params.start_step=200"]
    args += ["--set", "replay.prioritized=true", "--set", "replay.n_step=3", *small(algo)]
    for name in ("a", "b"):
        assert main([*args, "--run-dir", str(tmp_path / name)]) == 0
    assert _summary(tmp_path / "a")["state_fingerprint"] == _summary(tmp_path / "b")["state_fingerprint"]


def test_her_dqn_trains_on_bit_flipping_in_both_loops(tmp_path):
    for env_id in ("BitFlipping-v0", "gymnax:BitFlipping-v0"):
        run_dir = tmp_path / env_id.replace(":", "_")
        argv = ["train", "dqn", env_id, "--steps", "600", "--quiet", "--run-dir", str(run_dir)]
        argv += ["--set", "replay.her=future", "--set", "replay.her_horizon=16", "--set", "algo_params.start_step=200"]
        assert main(argv) == 0
        assert _summary(run_dir)["steps"] >= 600


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("priority_exponent", 1.5),
        ("importance_exponent", -0.1),
        ("priority_epsilon", 0.0),
        ("n_step", 0),
        ("her", "later"),
        ("her_ratio", 0.0),
        ("her_horizon", 0),
    ],
)
def test_bad_replay_fields_name_the_field_and_value(field, value):
    with pytest.raises(ValueError, match=rf"replay\.{field}=.* is not allowed; allowed: "):
        cfg.ReplayConfig(**{field: value})


def _config(algo_params, replay, observation_space, action_space, n_agents=1, distributed=None):
    return cfg.AlgoConfig(
        seed=0,
        algo_params=algo_params,
        update_cfg=cfg.UpdateConfig(max_buffer_size=100, batch_size=8),
        train_cfg=cfg.TrainConfig(),
        env_cfg=cfg.EnvConfig("CartPole-v1", observation_space, action_space, n_agents=n_agents),
        replay=replay,
        distributed=distributed,
    )


def test_replay_options_are_refused_where_they_cannot_work():
    from kitae.algos.collections.dqn import DQN, DQNParams
    from kitae.algos.collections.ppo import PPO, PPOParams
    from tests._agents import TinyDQN, TinyDQNParams

    cartpole = gym.make("CartPole-v1")
    spaces = (cartpole.observation_space, cartpole.action_space)
    with pytest.raises(ValueError, match="replay.prioritized=True is not allowed for PPO: it is on-policy"):
        PPO("ppo", _config(PPOParams(), cfg.ReplayConfig(prioritized=True), *spaces))
    with pytest.raises(ValueError, match=r"replay.n_step=3 is not allowed in a multi-agent environment \(n_agents=2\)"):
        DQN("dqn", _config(DQNParams(), cfg.ReplayConfig(n_step=3), *spaces, n_agents=2))
    with pytest.raises(
        ValueError, match=r"replay.prioritized=True is not allowed for TinyDQN: its update does not read"
    ):
        TinyDQN("tiny", _config(TinyDQNParams(), cfg.ReplayConfig(prioritized=True), *spaces))
    with pytest.raises(ValueError, match=r"replay.her is not allowed for CartPole-v1: its observations are Box"):
        DQN("dqn", _config(DQNParams(), cfg.ReplayConfig(her="future"), *spaces))
    with pytest.raises(ValueError, match="replay.prioritized=True is not allowed with distributed.gradient_workers=2"):
        _config(
            DQNParams(),
            cfg.ReplayConfig(prioritized=True),
            *spaces,
            distributed=cfg.DistributedConfig(gradient_workers=2),
        )
    with pytest.raises(ValueError, match=r"replay.n_step=3 is not allowed; allowed: 1 with replay.her"):
        cfg.ReplayConfig(her="future", n_step=3)
    assert math.isclose(cfg.ReplayConfig().priority_exponent, 0.6)


def test_the_command_line_refuses_a_bad_replay_setting_in_one_line(tmp_path, capsys):
    code = main(
        ["train", "ppo", "CartPole-v1", "--steps", "64", "--run-dir", str(tmp_path), "--set", "replay.n_step=3"]
    )
    err = capsys.readouterr().err.strip()
    assert code != 0 and "replay.n_step=3 is not allowed for PPO" in err and len(err.splitlines()) == 1
