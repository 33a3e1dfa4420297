"""EnvPool environments (``envpool:ID``) and image observations: the SAME_STEP adapter on
CartPole (final observations, termination vs truncation, shapes and dtypes, seeds), Atari
observations and the NatureCNN they get, frame stacking for Gymnasium image environments, smoke
runs of PPO on Pong and DQN on CartPole through EnvPool, and the inputs that are refused."""

from __future__ import annotations

import json

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("envpool", reason="envpool is an optional extra: pip install -e '.[envpool]'")

import kitae.config as cfg
from kitae.envs.envpool_env import ATARI_DEFAULTS, EnvPoolVectorEnv, evaluation_kwargs, is_atari
from kitae.envs.make import make_vec_env
from kitae.loops.train import check_env
from kitae.modules.encoders import NatureCNN, encoder_factory

pytestmark = pytest.mark.timeout(120)  # a hung pool or compilation fails instead of stalling the run

CARTPOLE_THETA_LIMIT = 12 * 2 * np.pi / 360  # CartPole ends when |theta| > 12 degrees or |x| > 2.4
CARTPOLE_X_LIMIT = 2.4


def balance(obs: np.ndarray) -> np.ndarray:
    """A linear state-feedback controller that keeps CartPole up for its 500 steps:
    push right when ``x + 2 x' + 20 theta + 4 theta' > 0`` (per environment, ``(E, 4) -> (E,)``)."""
    x, x_dot, theta, theta_dot = obs.T
    return (x + 2 * x_dot + 20 * theta + 4 * theta_dot > 0).astype(np.int32)


def _tree_equal(a, b) -> bool:
    return all(
        np.array_equal(np.asarray(x), np.asarray(y))
        for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
    )


# ---------------------------------------------------------------------------------------------
# The adapter on CartPole
# ---------------------------------------------------------------------------------------------


def test_cartpole_spaces_dtypes_and_same_step_mode():
    env = make_vec_env("envpool:CartPole-v1", 3)
    try:
        assert isinstance(env, EnvPoolVectorEnv) and env.num_envs == 3
        assert env.metadata["autoreset_mode"] == gym.vector.AutoresetMode.SAME_STEP
        assert check_env(env) is env
        assert env.single_observation_space.shape == (4,)
        assert env.single_action_space == gym.spaces.Discrete(2)
        assert env.observation_space.shape == (3, 4)
        obs, infos = env.reset(seed=0)
        assert obs.shape == (3, 4) and obs.dtype == env.single_observation_space.dtype
        np.testing.assert_array_equal(infos["env_id"], [0, 1, 2])
        obs, rewards, terminated, truncated, infos = env.step(np.zeros(3, np.int64))
        assert obs.shape == (3, 4)
        assert rewards.shape == (3,) and terminated.shape == (3,) and truncated.shape == (3,)
        assert terminated.dtype == bool and truncated.dtype == bool
        np.testing.assert_array_equal(rewards, [1.0, 1.0, 1.0])
        np.testing.assert_array_equal(infos["elapsed_step"], [1, 1, 1])
        assert "final_obs" not in infos  # no episode ended yet
    finally:
        env.close()


def test_check_env_refuses_envpools_own_pool_and_names_kitaes():
    import envpool

    pool = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=2)
    try:
        with pytest.raises(ValueError, match=r"EnvPool pool .*make_vec_env\('envpool:TASK'"):
            check_env(pool)
    finally:
        pool.close()


def test_termination_gives_the_final_observation_and_resets_in_the_same_step():
    env = make_vec_env("envpool:CartPole-v1", 2)
    try:
        obs, _ = env.reset(seed=1)
        for _ in range(1, 100):  # pushing left all the time: the pole falls within a few dozen steps
            previous = obs
            obs, rewards, terminated, truncated, infos = env.step(np.zeros(2, np.int32))
            if terminated.any():
                break
        else:
            pytest.fail("CartPole did not terminate while pushed left for 100 steps")
        i = int(np.flatnonzero(terminated)[0])
        assert not truncated[i] and rewards[i] == 1.0
        assert infos["_final_obs"][i]
        final = infos["final_obs"][i]
        # the real final observation is out of bounds and follows the previous one ...
        assert abs(final[2]) > CARTPOLE_THETA_LIMIT or abs(final[0]) > CARTPOLE_X_LIMIT
        assert np.all(np.abs(final - previous[i]) < 0.5)
        # ... while the returned observation is the first of a new episode (CartPole starts in +-0.05)
        assert np.all(np.abs(obs[i]) <= 0.05)
        # the next step acts in the new episode (EnvPool alone would spend it on the reset: reward 0)
        obs2, rewards2, terminated2, _, infos2 = env.step(np.ones(2, np.int32))
        assert infos2["elapsed_step"][i] == 1 and rewards2[i] == 1.0 and not terminated2[i]
        assert np.all(np.abs(obs2[i] - obs[i]) < 0.5)
    finally:
        env.close()


def test_truncation_at_the_500_step_limit_is_not_termination():
    env = make_vec_env("envpool:CartPole-v1", 2)
    try:
        obs, _ = env.reset(seed=0)
        for t in range(1, 501):
            previous = obs
            obs, rewards, terminated, truncated, infos = env.step(balance(obs))
            if t < 500:
                assert not terminated.any() and not truncated.any(), f"episode ended early, step {t}"
        np.testing.assert_array_equal(truncated, [True, True])
        np.testing.assert_array_equal(terminated, [False, False])
        np.testing.assert_array_equal(infos["elapsed_step"], [500, 500])
        np.testing.assert_array_equal(infos["_final_obs"], [True, True])
        final = infos["final_obs"]
        assert np.all(np.abs(final[:, 2]) < CARTPOLE_THETA_LIMIT)  # the pole was still up
        assert np.all(np.abs(final - previous) < 0.5)
        assert np.all(np.abs(obs) <= 0.05)  # new episodes
    finally:
        env.close()


def test_same_seed_same_episodes_and_reset_seed_remakes_the_pool():
    def rollout(env, seed):
        obs, _ = env.reset(seed=seed)
        out = [obs]
        for _ in range(30):
            obs, *_ = env.step(np.zeros(2, np.int32))
            out.append(obs)
        return np.stack(out)

    env = make_vec_env("envpool:CartPole-v1", 2)
    try:
        a = rollout(env, 5)
        b = rollout(env, 5)  # the same env, used: reset(seed=5) remakes the pool
        c = rollout(env, 6)
        big = rollout(env, 2**32 - 1)  # resume draws 32-bit seeds; EnvPool's are C++ ints: folded into range
        assert np.array_equal(big, rollout(env, 2**32 - 1))
    finally:
        env.close()
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a[0, 0], a[0, 1])  # environment i runs with seed + i


# ---------------------------------------------------------------------------------------------
# Atari observations and the NatureCNN
# ---------------------------------------------------------------------------------------------


def test_atari_observations_are_channels_last_uint8_and_get_the_nature_cnn():
    assert is_atari("Pong-v5") and not is_atari("CartPole-v1")
    assert evaluation_kwargs("Pong-v5") == {"episodic_life": False, "reward_clip": False}
    env = make_vec_env("envpool:Pong-v5", 2)
    try:
        space = env.single_observation_space
        assert space.shape == (84, 84, 4) and space.dtype == np.uint8
        assert env.env_kwargs == ATARI_DEFAULTS
        assert env.single_action_space == gym.spaces.Discrete(6)
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, 84, 84, 4) and obs.dtype == np.uint8 and obs.flags.c_contiguous
        # at reset the stack holds the same frame four times
        np.testing.assert_array_equal(obs[..., 0], obs[..., 3])
        obs, rewards, terminated, truncated, _ = env.step(np.zeros(2, np.int32))
        assert obs.shape == (2, 84, 84, 4) and obs.dtype == np.uint8
    finally:
        env.close()

    encoder = encoder_factory(space)
    assert isinstance(encoder, NatureCNN)
    params = encoder.init(jax.random.PRNGKey(0), jnp.zeros((1, 84, 84, 4), jnp.float32))
    from_uint8 = encoder.apply(params, obs)
    from_float = encoder.apply(params, obs.astype(np.float32) / 255.0)
    assert from_uint8.shape == (2, 512)
    np.testing.assert_allclose(np.asarray(from_uint8), np.asarray(from_float), rtol=1e-5, atol=1e-6)


def test_channels_first_atari_observations_are_refused_by_the_encoder_with_a_hint():
    env = EnvPoolVectorEnv("Pong-v5", 1, channels_last=False)
    try:
        assert env.single_observation_space.shape == (4, 84, 84)
        with pytest.raises(ValueError, match=r"channels-first.*\(84, 84, 4\)"):
            encoder_factory(env.single_observation_space)
    finally:
        env.close()


def test_atari_options_are_overridable():
    env = make_vec_env("envpool:Pong-v5", 1, env_kwargs={"stack_num": 2, "img_height": 64, "img_width": 48})
    try:
        assert env.single_observation_space.shape == (64, 48, 2)
        assert env.env_kwargs["episodic_life"] is True and env.env_kwargs["stack_num"] == 2
        obs, _ = env.reset()
        assert obs.shape == (1, 64, 48, 2)
    finally:
        env.close()


# ---------------------------------------------------------------------------------------------
# Frame stacking for Gymnasium image environments
# ---------------------------------------------------------------------------------------------


class CounterImageEnv(gym.Env):
    """Frames of shape ``shape`` (uint8) filled with the step count ``t`` (0 at reset)."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, shape=(40, 40)):
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.t = 0

    def _frame(self):
        return np.full(self.observation_space.shape, self.t, np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._frame(), {}

    def step(self, action):
        self.t += 1
        return self._frame(), 1.0, self.t == 5, False, {}


gym.register("kitae-test/CounterImage-v0", entry_point=CounterImageEnv)


@pytest.mark.parametrize("shape, stacked", [((40, 40), (40, 40, 3)), ((40, 40, 2), (40, 40, 6))])
def test_frame_stack_puts_the_stack_last_oldest_first(shape, stacked):
    env = make_vec_env("kitae-test/CounterImage-v0", 2, frame_stack=3, env_kwargs={"shape": shape})
    try:
        assert env.single_observation_space.shape == stacked
        assert env.single_observation_space.dtype == np.uint8
        obs, _ = env.reset(seed=0)
        assert obs.shape == (2, *stacked)
        np.testing.assert_array_equal(obs, 0)  # the first frame fills the stack
        for _ in range(2):
            obs, *_ = env.step(np.zeros(2, np.int64))
        channels = 1 if len(shape) == 2 else shape[2]
        frames = obs[0].reshape(40, 40, 3, channels)  # frame i's channels at i * C .. (i + 1) * C - 1
        np.testing.assert_array_equal(frames[0, 0, :, 0], [0, 1, 2])
        for _ in range(3):
            obs, _, terminated, _, infos = env.step(np.zeros(2, np.int64))
        assert terminated.all()  # t == 5: final stack (3, 4, 5), new episode (0, 0, 0)
        np.testing.assert_array_equal(infos["final_obs"][0].reshape(40, 40, 3, channels)[0, 0, :, 0], [3, 4, 5])
        np.testing.assert_array_equal(obs, 0)
    finally:
        env.close()
    assert isinstance(encoder_factory(env.single_observation_space), NatureCNN)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "4"])
def test_bad_frame_stack_values_are_refused(bad):
    with pytest.raises(ValueError, match=r"frame_stack=.*allowed: an int >= 1"):
        make_vec_env("CartPole-v1", 1, frame_stack=bad)


def test_frame_stack_is_refused_for_envpool_ids():
    with pytest.raises(ValueError, match=r"stack_num"):
        make_vec_env("envpool:Pong-v5", 1, frame_stack=4)


# ---------------------------------------------------------------------------------------------
# Refused inputs
# ---------------------------------------------------------------------------------------------


def test_unknown_envpool_id_names_it_and_close_ids():
    with pytest.raises(ValueError, match=r"unknown EnvPool environment 'Pongg-v5'.*'Pong-v5'"):
        make_vec_env("envpool:Pongg-v5", 2)


def test_a_mistyped_envpool_id_is_one_line_on_the_command_line(capsys, monkeypatch):
    """The host-loop warning came before the error: two lines for a typo."""
    from kitae.cli import main
    from kitae.runs import resolve

    monkeypatch.setattr(resolve, "_WARNED_HOST_ONLY", set())  # as in a fresh process
    assert main(["train", "ppo", "envpool:Pongg-v5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kitae: error: unknown EnvPool environment 'Pongg-v5'") and err.count("\n") == 1, err


def test_empty_envpool_id_is_refused():
    with pytest.raises(ValueError, match=r"no environment name after 'envpool'"):
        make_vec_env("envpool:", 2)


def test_unknown_and_reserved_envpool_options_are_refused():
    with pytest.raises(ValueError, match=r"\['stack_numm'\] are not options of EnvPool's 'Pong-v5'.*stack_num"):
        make_vec_env("envpool:Pong-v5", 1, env_kwargs={"stack_numm": 4})
    with pytest.raises(ValueError, match=r"\['seed'\] are set by kitae"):
        make_vec_env("envpool:CartPole-v1", 1, env_kwargs={"seed": 3})


def test_bad_n_envs_video_seed_and_actions_are_refused():
    with pytest.raises(ValueError, match=r"n_envs=0 is not allowed"):
        make_vec_env("envpool:CartPole-v1", 0)
    with pytest.raises(ValueError, match=r"capture_video=True is not available for envpool"):
        make_vec_env("envpool:CartPole-v1", 1, capture_video=True, run_name="x")
    with pytest.raises(ValueError, match=r"seed=-1 is not allowed"):
        EnvPoolVectorEnv("CartPole-v1", 1, seed=-1)
    env = make_vec_env("envpool:CartPole-v1", 2)
    try:
        env.reset()
        with pytest.raises(ValueError, match=r"actions of shape \(3,\) are not allowed; allowed: shape \(2, ...\)"):
            env.step(np.zeros(3, np.int32))
        with pytest.raises(ValueError, match=r"options=.* is not allowed"):
            env.reset(options={"reset_mask": [True, False]})
    finally:
        env.close()


def test_one_envpool_environment_keeps_its_final_state_and_draws_it():
    """``EnvPoolEnv``, what a video plays: the step that ends an episode returns its real final
    observation (no reset in the same step), and ``render`` draws the screen."""
    from kitae.envs.envpool_env import EnvPoolEnv

    env = EnvPoolEnv("CartPole-v1")
    vector = EnvPoolVectorEnv("CartPole-v1", 1, seed=4)
    try:
        obs, _ = env.reset(seed=4)
        np.testing.assert_array_equal(obs, vector.reset(seed=4)[0][0])  # the same episode as the vector env's
        assert env.render().shape == (400, 600, 3) and env.metadata["render_fps"] == 30
        for _ in range(200):  # always push right: the pole falls
            obs, reward, terminated, truncated, _ = env.step(1)
            vec_obs, _, vec_terminated, _, infos = vector.step(np.ones(1, np.int32))
            assert reward == 1.0 and not truncated and terminated == bool(vec_terminated[0])
            if terminated:
                break
            np.testing.assert_array_equal(obs, vec_obs[0])
        np.testing.assert_array_equal(obs, infos["final_obs"][0])  # the final observation, not a reset's
        assert abs(obs[2]) > 0.2  # the pole's angle past CartPole's limit (12 degrees)
    finally:
        env.close()
        vector.close()
    pong = EnvPoolEnv("Pong-v5", render_mode=None)
    assert pong.reset(seed=0)[0].shape == (84, 84, 4) and pong.render() is None
    assert pong.metadata["render_fps"] == 15  # 60 frames per second over Atari's frame skip of 4
    pong.close()
    with pytest.raises(ValueError, match=r"render_mode='human' is not allowed; allowed: None or 'rgb_array'"):
        EnvPoolEnv("CartPole-v1", render_mode="human")


# ---------------------------------------------------------------------------------------------
# Agents training through EnvPool
# ---------------------------------------------------------------------------------------------


def test_dqn_trains_a_few_updates_on_envpool_cartpole_and_same_seed_same_parameters():
    from kitae.algos.collections.dqn import DQN, DQNParams

    def run(seed, name):
        env = make_vec_env("envpool:CartPole-v1", 2)
        config = cfg.AlgoConfig(
            seed=seed,
            algo_params=DQNParams(start_step=100, skip_steps=50, target_update_interval=10, hidden=(32,)),
            update_cfg=cfg.UpdateConfig(
                learning_rate=1e-3, max_grad_norm=None, max_buffer_size=500, batch_size=32, n_epochs=2
            ),
            train_cfg=cfg.TrainConfig(n_env_steps=400),
            env_cfg=cfg.EnvConfig(
                task_name="envpool:CartPole-v1",
                observation_space=env.single_observation_space,
                action_space=env.single_action_space,
                n_envs=2,
            ),
        )
        agent = DQN(f"dqn-envpool-{seed}", config, run_dir=f"runs/dqn-envpool-{name}")
        before = agent.state.qvalue.params
        stats = agent.train(env, 400)
        return agent, before, stats

    agent, before, stats = run(4, "a")
    assert stats.env_steps == 400 and stats.n_updates == (400 - 100) // 50 + 1
    assert len(stats.episode_returns) > 0 and all(r >= 8 for r in stats.episode_returns)
    assert sum(stats.episode_lengths) <= 400
    assert not _tree_equal(before, agent.state.qvalue.params)
    again, _, _ = run(4, "b")
    assert _tree_equal(agent.state, again.state)


@pytest.mark.slow  # compiles and runs the NatureCNN update (about 4 s)
def test_kitae_train_ppo_on_envpool_pong_runs_a_few_updates_in_the_host_loop(tmp_path, monkeypatch):
    from kitae.runs import RunSpec, resolve, train_run

    # the warning is given once per process: as if no EnvPool run came before in this one
    monkeypatch.setattr(resolve, "_WARNED_HOST_ONLY", set())
    sets = ["update_cfg.max_buffer_size=16", "update_cfg.batch_size=16", "update_cfg.n_epochs=1"]
    with pytest.warns(UserWarning, match=r"envpool: environments train in the host loop"):
        summary = train_run(
            RunSpec("ppo", "envpool:Pong-v5", steps=64, n_envs=2, sets=sets, run_dir=str(tmp_path / "pong"), quiet=True)
        )
    assert summary["steps"] == 64 and summary["env"] == "envpool:Pong-v5"
    config = cfg.AlgoConfig.from_yaml(tmp_path / "pong" / "config.yaml")
    # the Atari preset: CleanRL's settings with a shared NatureCNN (rollout shrunk by --set)
    assert config.update_cfg.shared_encoder is True and config.algo_params.clip_coef == 0.1
    assert config.update_cfg.learning_rate == 2.5e-4 and config.update_cfg.learning_rate_annealing is True
    assert config.env_cfg.observation_space.shape == (84, 84, 4)
    assert config.env_cfg.observation_space.dtype == np.uint8

    from kitae.runs import load_agent

    agent = load_agent(tmp_path / "pong")
    assert int(agent.state.actor_critic.step) == 4  # 64 steps = 2 rollouts of 16 x 2, each 1 epoch of 2 minibatches
    params = agent.state.actor_critic.params["params"]
    assert "encoder" in params and params["encoder"]["Conv_0"]["kernel"].shape == (8, 8, 4, 32)
    assert json.loads((tmp_path / "pong" / "summary.json").read_text())["sps"] > 0

    # --video films a whole game in EnvPool itself (the agent reads its preprocessed frames), from
    # the screen: the reset's frame and one per agent step, at 60 / frame_skip frames per second
    from moviepy import VideoFileClip

    from kitae.runs import eval_run

    filmed = eval_run(tmp_path / "pong", episodes=1, video=True, seed=1)
    assert -21 <= filmed["mean"][0] <= 21 and filmed["mean"][0] == int(filmed["mean"][0])  # a whole game, raw points
    clip = VideoFileClip(filmed["video"])
    assert clip.fps == 15 and clip.size == [160, 210] and clip.n_frames > 21 * 10  # a game of 21 points at least
    clip.close()
