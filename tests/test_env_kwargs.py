"""``env_cfg.env_kwargs``: the keyword arguments a run's environments are made with, set with
``--set env_kwargs.NAME=VALUE`` (or a preset's or config file's ``env_kwargs:``), kept in
``config.yaml``, and used for every environment of the run: training, evaluation, resuming,
training again from its config."""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import pytest
import yaml

import kitae.config as cfg
from kitae.cli import main
from kitae.envs.make import EnvSpec, make_jax_env, make_vec_env
from kitae.runs import eval_run
from kitae.runs.resolve import preset_agent

BOX, DISCRETE = gym.spaces.Box(-1.0, 1.0, (2,)), gym.spaces.Discrete(2)


@pytest.mark.parametrize(
    ("env_kwargs", "error", "match"),
    [
        ("continuous", TypeError, r"env_cfg\.env_kwargs='continuous' has type str"),
        ({"1x": 1}, ValueError, r"env_cfg\.env_kwargs='1x' is not allowed; allowed: keyword names"),
        ({"size": (3, 4)}, ValueError, r"env_cfg\.env_kwargs\.size=\(3, 4\) is not allowed; allowed: a bool"),
        ({"f": print}, ValueError, r"env_cfg\.env_kwargs\.f=.* is not allowed"),
        ({"m": {1: "a"}}, ValueError, r"env_cfg\.env_kwargs\.m="),
    ],
)
def test_arguments_that_config_yaml_cannot_hold_are_refused(env_kwargs, error, match):
    with pytest.raises(error, match=match):
        cfg.EnvConfig("x", BOX, DISCRETE, env_kwargs=env_kwargs)


def test_arguments_round_trip_through_config_yaml(tmp_path):
    kwargs = {"continuous": True, "desc": ["SFFF", "FHFH"], "options": {"a": 1.5, "b": None}}
    agent, env = preset_agent("ppo", "CartPole-v1")
    env.close()
    config = dataclasses.replace(agent.config, env_cfg=dataclasses.replace(agent.config.env_cfg, env_kwargs=kwargs))
    config.to_yaml(tmp_path / "config.yaml")
    assert cfg.AlgoConfig.from_yaml(tmp_path / "config.yaml").env_cfg.env_kwargs == kwargs
    # none: no key at all, as config.yaml files written before the field
    assert "env_kwargs" not in yaml.safe_load(agent.config.to_yaml())["env_cfg"]


def test_a_spec_carries_its_arguments_and_explicit_ones_win():
    spec = EnvSpec.parse("FrozenLake-v1").with_kwargs({"map_name": "8x8", "is_slippery": False})
    assert spec == EnvSpec.parse("FrozenLake-v1").with_kwargs({"is_slippery": False, "map_name": "8x8"})
    assert spec.id == "gymnasium:FrozenLake-v1" and spec.env_kwargs == {"is_slippery": False, "map_name": "8x8"}
    assert make_vec_env(spec, 1).single_observation_space == gym.spaces.Discrete(64)
    assert make_vec_env(spec, 1, env_kwargs={"map_name": "4x4"}).single_observation_space == gym.spaces.Discrete(16)
    catch = EnvSpec.parse("gymnax:Catch-bsuite").with_kwargs({"rows": 6, "columns": 4})
    assert make_jax_env(catch, 2).single_observation_space.shape == (6, 4)


def test_set_reaches_every_source_and_names_the_key_when_wrong():
    agent, env = preset_agent("ppo", "pettingzoo:mpe2.simple_spread_v3", sets=["env_kwargs.N=2"])
    assert env.num_agents == 2 and agent.config.env_cfg.n_agents == 2 and agent.config.env_cfg.env_kwargs == {"N": 2}
    env.close()
    agent, env = preset_agent("ppo", "gymnax:Catch-bsuite", sets=["env_kwargs.rows=6", "env_kwargs.columns=4"])
    assert agent.config.env_cfg.observation_space.shape == (6, 4)
    with pytest.raises(ValueError, match=r"unknown --set key 'env_kwargs\.1x'.*env_kwargs\.NAME"):
        preset_agent("ppo", "CartPole-v1", sets=["env_kwargs.1x=2"])


def test_a_wrong_argument_is_one_line_from_the_command_line(capsys):
    assert main(["train", "ppo", "CartPole-v1", "--set", "env_kwargs.bogus=1", "--steps", "64", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kitae: error: ") and "'bogus'" in err and "\n" not in err


def test_a_run_evaluates_resumes_and_trains_again_with_its_arguments(tmp_path):
    """LunarLander-v3 with ``continuous=True`` has a ``Box`` action space: an evaluation, a resumed
    run or a run trained again from its config.yaml that made the default (discrete) environment
    would be refused for its spaces, or fail on the first continuous action."""
    run = tmp_path / "run"
    argv = ["train", "ppo", "LunarLander-v3", "--set", "env_kwargs.continuous=true", "--n-envs", "2",
            "--steps", "256", "--set", "update_cfg.max_buffer_size=64", "--set", "update_cfg.batch_size=32",
            "--quiet"]  # fmt: skip
    assert main([*argv, "--run-dir", str(run)]) == 0
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["env_cfg"]["env_kwargs"] == {"continuous": True}
    assert config["env_cfg"]["action_space"]["type"] == "Box"
    assert len(eval_run(run, episodes=1)["returns"][0]) == 1
    assert main(["resume", str(run), "--steps", "384", "--quiet"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 384
    # kitae train --config RUN/config.yaml: the same arguments, so the same bits as the run's first 256 steps
    again = tmp_path / "again"
    first = tmp_path / "first"
    assert main([*argv, "--run-dir", str(first)]) == 0
    assert main(["train", "ppo", "LunarLander-v3", "--config", str(first / "config.yaml"), "--run-dir", str(again),
                 "--quiet"]) == 0  # fmt: skip
    summaries = [json.loads((d / "summary.json").read_text()) for d in (first, again)]
    assert summaries[0]["state_fingerprint"] == summaries[1]["state_fingerprint"]


def test_the_best_config_of_a_search_keeps_the_arguments(tmp_path):
    from kitae.runs.presets import load_config_file
    from kitae.runs.tune import best_config_yaml

    agent, env = preset_agent("ppo", "gymnax:Catch-bsuite", sets=["env_kwargs.rows=6", "env_kwargs.columns=4"])
    (tmp_path / "best.yaml").write_text(best_config_yaml(agent.config, 3, 1.0))
    assert load_config_file(tmp_path / "best.yaml")["env_kwargs"] == {"rows": 6, "columns": 4}


def test_specs_with_list_arguments_are_equal_and_hashable():
    first, second = (EnvSpec.parse("FrozenLake-v1").with_kwargs({"desc": ["SF", "FG"]}) for _ in range(2))
    assert first == second and {first: 1}[second] == 1
    assert first != EnvSpec.parse("FrozenLake-v1")
