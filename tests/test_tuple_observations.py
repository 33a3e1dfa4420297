"""``Tuple`` observation spaces (Gymnasium's ``Blackjack-v1``) are read as ``Dict`` ones keyed by
their padded index (``kitae.envs.wrappers.tuple_as_dict``), so every algorithm trains on them."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from kitae.cli import main
from kitae.envs.make import make_vec_env
from kitae.envs.wrappers import tuple_as_dict
from kitae.runs import eval_run


class _Nested(gym.Env):
    """Observations ``{"cards": (a, b, ..., 11 entries), "pos": Box(2)}``: a tuple inside a dict."""

    observation_space = gym.spaces.Dict(
        {
            "cards": gym.spaces.Tuple([gym.spaces.Discrete(3)] * 11),
            "pos": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),
        }
    )
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        return {"cards": tuple(i % 3 for i in range(11)), "pos": np.zeros(2, np.float32)}, {}

    def step(self, action):
        return self.reset()[0], 0.0, True, False, {}


def test_blackjack_reads_as_a_dict_of_its_entries():
    env = tuple_as_dict(gym.make("Blackjack-v1"))
    assert env.observation_space == gym.spaces.Dict(
        {"0": gym.spaces.Discrete(32), "1": gym.spaces.Discrete(11), "2": gym.spaces.Discrete(2)}
    )
    raw, _ = gym.make("Blackjack-v1").reset(seed=3)
    observation, _ = env.reset(seed=3)
    assert observation == {"0": raw[0], "1": raw[1], "2": raw[2]}
    assert env.observation_space.contains(observation)


def test_nested_tuples_are_converted_and_eleven_entries_keep_their_order_when_sorted():
    env = tuple_as_dict(_Nested())
    cards = env.observation_space["cards"]
    assert list(cards.spaces) == [f"{i:02d}" for i in range(11)] == sorted(cards.spaces)
    observation, _ = env.reset()
    assert [observation["cards"][k] for k in sorted(observation["cards"])] == [i % 3 for i in range(11)]
    assert env.observation_space.contains(observation)
    plain = gym.make("CartPole-v1")
    assert tuple_as_dict(plain) is plain  # nothing to convert: the environment itself


def test_make_vec_env_converts_them_and_a_run_trains_evaluates_and_records_the_space(tmp_path):
    env = make_vec_env("Blackjack-v1", 3)
    assert isinstance(env.single_observation_space, gym.spaces.Dict)
    observations, _ = env.reset(seed=0)
    assert sorted(observations) == ["0", "1", "2"] and observations["0"].shape == (3,)
    env.close()
    run = tmp_path / "run"
    assert main(["train", "ppo", "Blackjack-v1", "--steps", "1024", "--run-dir", str(run), "--quiet"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 1024 and -1.5 <= summary["final_return"] <= 1.5
    returns = eval_run(run, episodes=20)["returns"][0]
    assert len(returns) == 20 and set(np.unique(returns)) <= {-1.0, 0.0, 1.0, 1.5}
    # filmed too: the filming environment reads its Tuple observations as Dict ones, and the
    # episode player batches every entry (before: "Array.__contains__: unsupported operand type")
    video = eval_run(run, episodes=1, video=True)["video"]
    assert video is not None and video.endswith(".mp4") and (run / "videos").is_dir()


@pytest.mark.parametrize("algo", ["dqn", "sac"])
def test_off_policy_agents_train_on_them(tmp_path, algo):
    assert main(["train", algo, "Blackjack-v1", "--steps", "600", "--run-dir", str(tmp_path / algo), "--quiet",
                 "--set", "algo_params.start_step=200"]) == 0  # fmt: skip
