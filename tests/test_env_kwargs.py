"""``env_cfg.env_kwargs``: the keyword arguments a run's environments are made with, set with
``--set env_kwargs.NAME=VALUE`` (or a preset's or config file's ``env_kwargs:``), kept in
``config.yaml``, and used for every environment of the run: training, evaluation, resuming,
training again from its config."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import gymnasium as gym
import numpy as np
import pytest
import yaml

import kitae.config as cfg
from kitae.cli import main
from kitae.envs import options
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


@pytest.mark.parametrize(
    ("env_id", "kwarg", "words"),
    [
        ("CartPole-v1", "bogus=1", "Gymnasium's 'CartPole-v1' refused it (TypeError: "),
        ("pettingzoo:mpe2.simple_spread_v3", "bogus=1", "PettingZoo's 'mpe2.simple_spread_v3' refused it"),
        # before: only "'str' object cannot be interpreted as an integer", naming no option
        ("pettingzoo:mpe2.simple_spread_v3", "N=abc", "cannot be interpreted as an integer"),
    ],
)
def test_a_wrong_argument_is_one_line_naming_it_from_the_command_line(capsys, env_id, kwarg, words):
    assert main(["train", "ppo", env_id, "--set", f"env_kwargs.{kwarg}", "--steps", "64", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    name, value = kwarg.split("=")
    shown = repr(int(value)) if value.isdigit() else repr(value)
    assert err.startswith(f"kitae: error: env_kwargs.{name}={shown} is not allowed: "), err
    assert words in err and "\n" not in err


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


# -- the options of JaxMARL, Brax and EnvPool environments (kitae.envs.options) ------------------

needs = {
    name: pytest.mark.skipif(importlib.util.find_spec(name) is None, reason=f"{name} is an optional extra")
    for name in ("jaxmarl", "brax", "envpool")
}


def one_error_line(capsys, argv):
    """``kitae ARGV``'s exit code is 2 and its stderr one ``kitae: error:`` line: that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in err if not line.startswith("kitae: warning:")]
    assert len(errors) == 1 and errors[0].startswith("kitae: error: "), err
    return errors[0]


class Base:
    def __init__(self, size: int = 2, name: str = "b") -> None:
        self.size, self.name = size, name


class Middle(Base):
    def __init__(self, rate=0.5, mode=None, flag=False, **kwargs):
        self.noise = kwargs.pop("noise", 0) if "noise" in kwargs else kwargs.get("noise")
        super().__init__(**kwargs)


class Closed(Middle):
    def __init__(self, rate=0.1):  # no **kwargs: nothing reaches Middle from here
        super().__init__(rate=rate)


class Open:
    def __init__(self, *args, **kwargs):
        self.kwargs = kwargs


def test_constructor_options_follow_the_mro_while_kwargs_go_on():
    assert options.constructor_options(Middle) == {
        "rate": 0.5, "mode": None, "flag": False, "noise": options.NO_DEFAULT, "size": 2, "name": "b"
    }  # fmt: skip
    assert options.constructor_options(Closed) == {"rate": 0.1}
    assert options.constructor_options(Open) == {}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"sise": 3}, ValueError, r"env_kwargs \['sise'\] are not options of M; allowed: flag, mode, name, noise, "
         r"rate, size; did you mean 'size'"),
        ({"size": 2.0}, TypeError, r"env_kwargs\.size=2\.0 is not allowed; allowed: an int \(the type of its default"),
        ({"size": True}, TypeError, r"env_kwargs\.size=True is not allowed; allowed: an int"),
        ({"flag": 1}, TypeError, r"env_kwargs\.flag=1 is not allowed; allowed: a bool"),
        ({"rate": "fast"}, TypeError, r"env_kwargs\.rate='fast' is not allowed; allowed: a float or an int"),
        ({"name": 3}, TypeError, r"env_kwargs\.name=3 is not allowed; allowed: a str"),
        ({"name": "c"}, ValueError, r"env_kwargs\.name='c' is not allowed; allowed: 'alpha' or 'beta'$"),
        ({"name": "Alpha"}, ValueError, r"allowed: 'alpha' or 'beta'; did you mean 'alpha'\?"),
    ],
)  # fmt: skip
def test_check_options_refuses_unknown_names_other_types_and_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        options.check_options(kwargs, options.constructor_options(Middle), "M", choices={"name": ("alpha", "beta")})


def test_check_options_takes_what_the_defaults_allow():
    known = options.constructor_options(Middle)
    options.check_options({"rate": 1, "size": np.int64(3), "flag": True, "mode": [1], "noise": "x"}, known, "M")
    options.check_options({"anything": 1}, {}, "M")  # nothing learned: nothing refused


def test_refused_names_the_options_and_the_library_words():
    error = options.refused({"a": 1}, "L's 'e'", NotImplementedError("no a=1"))
    assert str(error) == "env_kwargs.a=1 is not allowed: L's 'e' refused it (NotImplementedError: no a=1)"
    error = options.refused({"a": 1, "b": "x"}, "L's 'e'", AssertionError("a > b"))
    assert (
        str(error) == "env_kwargs.a=1, env_kwargs.b='x' are not allowed: L's 'e' refused them (AssertionError: a > b)"
    )


SPREAD = "jaxmarl:MPE_simple_spread_v3"


@needs["jaxmarl"]
def test_a_jaxmarl_action_type_it_refuses_is_one_line_naming_what_is_allowed(capsys):
    argv = ["train", "ppo", SPREAD, "--set", "env_kwargs.action_type=continuous", "--steps", "100", "--quiet"]
    assert one_error_line(capsys, argv) == (
        "kitae: error: env_kwargs.action_type='continuous' is not allowed; allowed: 'Discrete' or 'Continuous'; "
        "did you mean 'Continuous'?"
    )
    with pytest.raises(ValueError, match=r"env_kwargs\.action_type='continuous' is not allowed"):
        make_jax_env(SPREAD, 2, action_type="continuous")


@needs["jaxmarl"]
def test_an_unknown_jaxmarl_option_is_refused(capsys):
    line = one_error_line(capsys, ["config", "ppo", SPREAD, "--set", "env_kwargs.foo=1"])
    assert "env_kwargs ['foo'] are not options of JaxMARL's 'MPE_simple_spread_v3'; allowed: " in line
    assert "max_steps" in line and "episode_end" in line
    with pytest.raises(ValueError, match=r"\['max_step'\] are not options of JaxMARL.*did you mean 'max_steps'"):
        make_jax_env(SPREAD, 2, max_step=10)


@needs["jaxmarl"]
def test_a_jaxmarl_option_of_another_type_is_refused_before_compiling(capsys):
    line = one_error_line(capsys, ["config", "ppo", SPREAD, "--set", "env_kwargs.max_steps=abc"])
    assert line.startswith("kitae: error: env_kwargs.max_steps='abc' is not allowed; allowed: an int")
    with pytest.raises(TypeError, match=r"env_kwargs\.dt='fast' is not allowed; allowed: a float or an int"):
        make_jax_env(SPREAD, 2, dt="fast")


@needs["jaxmarl"]
def test_a_value_the_jaxmarl_constructor_refuses_is_a_value_error_with_its_words():
    with pytest.raises(ValueError, match=r"env_kwargs\.local_ratio=2\.0 is not allowed: JaxMARL's "
                       r"'MPE_simple_spread_v3' refused it \(AssertionError: local_ratio must be between"):  # fmt: skip
        make_jax_env(SPREAD, 2, local_ratio=2.0)


@needs["jaxmarl"]
def test_the_jaxmarl_options_it_takes_still_work():
    env = make_jax_env(SPREAD, 2, action_type="Continuous", max_steps=10, dt=1, local_ratio=0.2)
    assert isinstance(env.single_action_space, gym.spaces.Box) and env.env.env.max_steps == 10
    assert make_jax_env(SPREAD, 2, num_agents=2, episode_end="termination").n_agents == 2


@needs["brax"]
def test_an_unknown_brax_option_is_refused_listing_the_allowed_ones(capsys):
    line = one_error_line(capsys, ["config", "ppo", "brax:ant", "--set", "env_kwargs.not_a_kwarg=0.1"])
    assert line.startswith("kitae: error: env_kwargs ['not_a_kwarg'] are not options of Brax's 'ant'; allowed: ")
    assert "ctrl_cost_weight" in line and "episode_length" in line and "backend" in line
    with pytest.raises(ValueError, match=r"\['ctrl_cost_weigth'\].*did you mean 'ctrl_cost_weight'"):
        make_jax_env("brax:ant", 1, ctrl_cost_weigth=0.1)


@needs["brax"]
def test_a_brax_option_of_another_type_is_refused(capsys):
    line = one_error_line(capsys, ["config", "ppo", "brax:ant", "--set", "env_kwargs.ctrl_cost_weight=abc"])
    assert line.startswith("kitae: error: env_kwargs.ctrl_cost_weight='abc' is not allowed; allowed: a float or an int")
    with pytest.raises(TypeError, match=r"env_kwargs\.n_frames=True is not allowed; allowed: an int"):
        make_jax_env("brax:inverted_pendulum", 1, n_frames=True)  # a base's option: PipelineEnv's


@needs["brax"]
def test_a_value_the_brax_constructor_refuses_is_a_value_error_with_its_words():
    with pytest.raises(ValueError, match=r"env_kwargs\.sys=1 is not allowed: Brax's 'inverted_pendulum' refused "
                       r"it \(TypeError: .*multiple values for keyword argument 'sys'"):  # fmt: skip
        make_jax_env("brax:inverted_pendulum", 1, sys=1)


@needs["brax"]
def test_the_brax_options_it_takes_still_work():
    env = make_jax_env("brax:inverted_pendulum", 1, backend="spring", episode_length=50, n_frames=2, debug=False)
    assert env.env.backend == "spring" and env.env.env._n_frames == 2


@needs["envpool"]
def test_an_envpool_option_of_another_type_is_refused(capsys):
    line = one_error_line(capsys, ["config", "ppo", "envpool:Pong-v5", "--set", "env_kwargs.stack_num=abc"])
    assert line == (
        "kitae: error: env_kwargs.stack_num='abc' is not allowed; allowed: an int (the type of its default, 4, "
        "in EnvPool's 'Pong-v5')"
    )
    with pytest.raises(TypeError, match=r"env_kwargs\.stack_num=2\.5 is not allowed; allowed: an int"):
        make_vec_env("envpool:Pong-v5", 1, env_kwargs={"stack_num": 2.5})
    with pytest.raises(TypeError, match=r"env_kwargs\.episodic_life=1 is not allowed; allowed: a bool"):
        make_vec_env("envpool:Pong-v5", 1, env_kwargs={"episodic_life": 1})


@needs["envpool"]
def test_an_unknown_envpool_option_names_the_closest(capsys):
    line = one_error_line(capsys, ["config", "ppo", "envpool:Pong-v5", "--set", "env_kwargs.stack_numm=2"])
    assert "env_kwargs ['stack_numm'] are not options of EnvPool's 'Pong-v5'; allowed: " in line
    assert line.endswith("did you mean 'stack_num'?")


@needs["envpool"]
def test_the_envpool_options_it_takes_still_work():
    env = make_vec_env("envpool:CartPole-v1", 2, env_kwargs={"reward_threshold": 400, "max_episode_steps": 100})
    assert env.env_kwargs == {"reward_threshold": 400, "max_episode_steps": 100}
    env.close()
    # num_threads, an option EnvPool lists, was also passed by kitae: "got multiple values" (one line)
    env = make_vec_env("envpool:CartPole-v1", 2, env_kwargs={"num_threads": 1})
    assert env.env_kwargs == {"num_threads": 1} and env.reset(seed=0)[0].shape == (2, 4)
    env.close()


@pytest.mark.parametrize(
    "env_id, option, message",
    [
        # Python's "CartPole.__init__() got an unexpected keyword argument 'foo'" named neither
        ("gymnax:CartPole-v1", "foo=1", "env_kwargs ['foo'] are not options of gymnax's 'CartPole-v1': it takes none"),
        ("gymnax:Catch-bsuite", "row=6", "env_kwargs ['row'] are not options of gymnax's 'Catch-bsuite'; allowed: "
         "columns, rows; did you mean 'rows'?"),
        ("gymnax:Catch-bsuite", "rows=6.5", "env_kwargs.rows=6.5 is not allowed; allowed: an int"),
    ],
)  # fmt: skip
def test_a_gymnax_option_its_constructor_does_not_take_is_refused_in_one_line(capsys, env_id, option, message):
    assert main(["config", "ppo", env_id, "--set", f"env_kwargs.{option}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kitae: error: {message}") and len(err.splitlines()) == 1, err
    with pytest.raises((ValueError, TypeError), match=r"env_kwargs"):
        name, _, value = option.partition("=")
        make_jax_env(env_id, 1, **{name: yaml.safe_load(value)})
