"""Tests of kitae.config (validation, YAML round trip) and kitae.envs.spaces (space <-> dict)."""

from __future__ import annotations

import dataclasses
import re

import gymnasium as gym
import numpy as np
import pytest
import yaml

import kitae.config as cfg
from kitae.algos.collections.dqn import DQNParams
from kitae.algos.collections.ppo import PPOParams
from kitae.config import (
    AlgoConfig,
    AlgoParams,
    EnvConfig,
    TrainConfig,
    UpdateConfig,
    algo_params_class,
    params_class_name,
    register_algo_params,
)
from kitae.envs.spaces import space_from_dict, space_to_dict


@register_algo_params
@dataclasses.dataclass
class _ConfigTestParams(AlgoParams):
    gamma: float = 0.99
    clip_eps: float = 0.2
    n_steps: int = 5
    normalize: bool = True
    hidden: tuple = (64, 32)
    schedule: str = "linear"


@dataclasses.dataclass
class _UnregisteredParams:
    gamma: float = 0.9


def _env_cfg(**kwargs) -> EnvConfig:
    fields = dict(
        task_name="CartPole-v1",
        observation_space=gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
        action_space=gym.spaces.Discrete(2),
    )
    fields.update(kwargs)
    return EnvConfig(**fields)


def _config(**kwargs) -> AlgoConfig:
    fields = dict(
        seed=0,
        algo_params=_ConfigTestParams(),
        update_cfg=UpdateConfig(max_buffer_size=16, batch_size=8),
        train_cfg=TrainConfig(n_env_steps=1000),
        env_cfg=_env_cfg(),
    )
    fields.update(kwargs)
    return AlgoConfig(**fields)


def _rich_config() -> AlgoConfig:
    """A config with every kind of space kitae serialises, including non-uniform Box bounds."""
    observation_space = gym.spaces.Dict(
        {
            "image": gym.spaces.Box(0, 255, (2, 3), np.uint8),
            "state": gym.spaces.Box(
                low=np.array([-1.0, -2.5, -np.inf], np.float32),
                high=np.array([1.0, 0.1, np.inf], np.float32),
                dtype=np.float32,
            ),
            "mode": gym.spaces.Discrete(3, start=1),
        }
    )
    action_space = gym.spaces.Dict(
        {
            "move": gym.spaces.MultiDiscrete([3, 4, 2]),
            "fire": gym.spaces.Discrete(2),
            "aim": gym.spaces.Box(-0.5, 0.5, (2,), np.float32),
        }
    )
    return AlgoConfig(
        seed=12345,
        algo_params=_ConfigTestParams(gamma=0.95, n_steps=3, hidden=(128, 128, 64), schedule="cosine"),
        update_cfg=UpdateConfig(
            learning_rate=1e-3,
            learning_rate_annealing=True,
            max_grad_norm=None,
            max_buffer_size=32,
            batch_size=256,
            n_epochs=4,
            shared_encoder=True,
        ),
        train_cfg=TrainConfig(n_env_steps=50_000, save_frequency=5_000),
        env_cfg=EnvConfig("my-task", observation_space, action_space, n_envs=4, n_agents=2),
    )


# ---------------------------------------------------------------------------------------------
# Accepted values
# ---------------------------------------------------------------------------------------------


def test_defaults_are_valid():
    config = _config()
    assert config.update_cfg.learning_rate == pytest.approx(3e-4)
    assert config.train_cfg.save_frequency == -1
    assert config.env_cfg.n_envs == 1 and config.env_cfg.n_agents == 1


def test_int_learning_rate_is_widened_to_float():
    cfg = UpdateConfig(learning_rate=1)
    assert cfg.learning_rate == 1.0
    assert type(cfg.learning_rate) is float


def test_int_max_grad_norm_is_widened_and_none_accepted():
    assert type(UpdateConfig(max_grad_norm=2).max_grad_norm) is float
    assert UpdateConfig(max_grad_norm=None).max_grad_norm is None


def test_save_frequency_minus_one_and_positive_accepted():
    assert TrainConfig(save_frequency=-1).save_frequency == -1
    assert TrainConfig(save_frequency=1).save_frequency == 1


def test_seed_bounds_accepted():
    assert _config(seed=0).seed == 0
    assert _config(seed=2**32 - 1).seed == 2**32 - 1


def test_batch_size_equal_to_capacity_accepted():
    config = _config(
        update_cfg=UpdateConfig(max_buffer_size=4, batch_size=24),
        env_cfg=_env_cfg(n_envs=3, n_agents=2),
    )
    assert config.update_cfg.batch_size == 24


def test_algo_params_int_widened_to_float():
    config = _config(algo_params=_ConfigTestParams(gamma=1))
    assert type(config.algo_params.gamma) is float


# ---------------------------------------------------------------------------------------------
# Rejected values: each names the field
# ---------------------------------------------------------------------------------------------


def test_learning_rate_zero_rejected():
    with pytest.raises(ValueError, match=r"update_cfg\.learning_rate"):
        UpdateConfig(learning_rate=0)


def test_learning_rate_negative_rejected():
    with pytest.raises(ValueError, match=r"update_cfg\.learning_rate"):
        UpdateConfig(learning_rate=-1e-3)


def test_max_grad_norm_zero_rejected():
    with pytest.raises(ValueError, match=r"update_cfg\.max_grad_norm"):
        UpdateConfig(max_grad_norm=0.0)


def test_max_grad_norm_negative_rejected():
    with pytest.raises(ValueError, match=r"update_cfg\.max_grad_norm"):
        UpdateConfig(max_grad_norm=-0.5)


def test_max_buffer_size_zero_rejected():
    with pytest.raises(ValueError, match=r"update_cfg\.max_buffer_size"):
        UpdateConfig(max_buffer_size=0)


def test_batch_size_zero_rejected():
    with pytest.raises(ValueError, match=r"update_cfg\.batch_size"):
        UpdateConfig(batch_size=0)


def test_batch_size_larger_than_capacity_rejected():
    # capacity = max_buffer_size * n_envs * n_agents = 4 * 3 * 2 = 24
    with pytest.raises(ValueError, match=r"update_cfg\.batch_size=25.*= 24") as info:
        _config(
            update_cfg=UpdateConfig(max_buffer_size=4, batch_size=25),
            env_cfg=_env_cfg(n_envs=3, n_agents=2),
        )
    assert "capacity" in str(info.value)
    assert str(info.value).endswith("('rollout' in a preset, a config file or --set gives that capacity)")


def test_an_n_step_sum_longer_than_the_buffer_is_rejected_naming_both_fields():
    """``replay.n_step=200`` with ``update_cfg.max_buffer_size=100`` was accepted silently."""
    with pytest.raises(ValueError) as info:
        _config(update_cfg=UpdateConfig(max_buffer_size=100, batch_size=8), replay=cfg.ReplayConfig(n_step=200))
    assert str(info.value).startswith(
        "replay.n_step=200 is not allowed; allowed: at most update_cfg.max_buffer_size=100"
    ), info.value
    _config(update_cfg=UpdateConfig(max_buffer_size=100, batch_size=8), replay=cfg.ReplayConfig(n_step=100))


def test_n_epochs_zero_rejected():
    with pytest.raises(ValueError, match=r"update_cfg\.n_epochs"):
        UpdateConfig(n_epochs=0)


def test_n_envs_zero_rejected():
    with pytest.raises(ValueError, match=r"env_cfg\.n_envs"):
        _env_cfg(n_envs=0)


def test_n_agents_zero_rejected():
    with pytest.raises(ValueError, match=r"env_cfg\.n_agents"):
        _env_cfg(n_agents=0)


def test_n_env_steps_zero_rejected():
    with pytest.raises(ValueError, match=r"train_cfg\.n_env_steps"):
        TrainConfig(n_env_steps=0)


@pytest.mark.parametrize("keep", [0, -2])
def test_keep_checkpoints_other_than_minus_one_or_positive_rejected(keep):
    assert TrainConfig().keep_checkpoints == 3 and TrainConfig(keep_checkpoints=-1).keep_checkpoints == -1
    message = rf"train_cfg\.keep_checkpoints={keep} is not allowed; allowed: -1 \(keep every one\) or an int >= 1"
    with pytest.raises(ValueError, match=message):
        TrainConfig(keep_checkpoints=keep)


def test_save_frequency_zero_rejected():
    with pytest.raises(ValueError, match=r"train_cfg\.save_frequency"):
        TrainConfig(save_frequency=0)


def test_save_frequency_minus_two_rejected():
    with pytest.raises(ValueError, match=r"train_cfg\.save_frequency"):
        TrainConfig(save_frequency=-2)


def test_seed_negative_rejected():
    with pytest.raises(ValueError, match=r"seed=-1"):
        _config(seed=-1)


def test_seed_too_large_rejected():
    with pytest.raises(ValueError, match=r"seed=4294967296"):
        _config(seed=2**32)


def test_learning_rate_string_rejected():
    with pytest.raises(TypeError, match=r"update_cfg\.learning_rate"):
        UpdateConfig(learning_rate="fast")


def test_n_epochs_float_rejected():
    with pytest.raises(TypeError, match=r"update_cfg\.n_epochs"):
        UpdateConfig(n_epochs=2.5)


def test_n_envs_bool_rejected():
    with pytest.raises(TypeError, match=r"env_cfg\.n_envs"):
        _env_cfg(n_envs=True)


def test_learning_rate_annealing_int_rejected():
    with pytest.raises(TypeError, match=r"update_cfg\.learning_rate_annealing"):
        UpdateConfig(learning_rate_annealing=1)


def test_observation_space_string_rejected():
    with pytest.raises(TypeError, match=r"env_cfg\.observation_space"):
        _env_cfg(observation_space="Box")


def test_seed_float_rejected():
    with pytest.raises(TypeError, match=r"seed"):
        _config(seed=1.0)


def test_update_cfg_wrong_type_rejected():
    with pytest.raises(TypeError, match=r"update_cfg"):
        _config(update_cfg={"learning_rate": 1e-3})


def test_algo_params_dict_rejected():
    with pytest.raises(TypeError, match=r"algo_params"):
        _config(algo_params={"gamma": 0.99})


def test_algo_params_class_rejected():
    with pytest.raises(TypeError, match=r"algo_params"):
        _config(algo_params=_ConfigTestParams)


def test_algo_params_field_type_checked():
    with pytest.raises(TypeError, match=r"algo_params\.n_steps"):
        _config(algo_params=_ConfigTestParams(n_steps="5"))


# ---------------------------------------------------------------------------------------------
# from_dict / from_yaml errors
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "section, field, hint",
    [
        ("update_cfg", "learning_rat", "; did you mean update_cfg.learning_rate?"),
        ("train_cfg", "n_steps", "; did you mean train_cfg.n_env_steps?"),
        ("env_cfg", "n_env", "; did you mean env_cfg.n_envs?"),
        ("algo_params", "gama", "; did you mean algo_params.gamma?"),
        ("update_cfg", "optimizer", "; allowed fields"),
    ],
)
def test_from_dict_unknown_nested_field_named(section, field, hint):
    data = _config().to_dict()
    data[section][field] = 1
    with pytest.raises(ValueError, match=rf"unknown field {section}\.{field} in \w+{re.escape(hint)}"):
        AlgoConfig.from_dict(data)


def test_from_dict_unknown_top_level_field_named():
    data = _config().to_dict()
    data["sed"] = 3
    with pytest.raises(ValueError, match=r"unknown field sed in AlgoConfig; did you mean seed\?"):
        AlgoConfig.from_dict(data)


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: cfg.UpdateConfig(learnig_rate=1e-3),
            "unknown field learnig_rate in UpdateConfig; did you mean learning_rate?",
        ),
        (lambda: cfg.TrainConfig(n_env_step=10), "unknown field n_env_step in TrainConfig; did you mean n_env_steps?"),
        (lambda: cfg.ReplayConfig(nstep=3), "unknown field nstep in ReplayConfig; did you mean n_step?"),
        (lambda: cfg.DistributedConfig(worker=2), "unknown field worker in DistributedConfig; did you mean workers?"),
        (lambda: DQNParams(gama=0.9), "unknown field gama in DQNParams; did you mean gamma?"),
        (lambda: PPOParams(optimizer="sgd"), "unknown field optimizer in PPOParams; allowed fields: gamma,"),
    ],
)
def test_a_constructor_given_an_unknown_keyword_names_it_and_the_closest_field(make, message):
    """Python's own error said only "got an unexpected keyword argument 'learnig_rate'"."""
    with pytest.raises(TypeError) as raised:
        make()
    assert str(raised.value).startswith(message)


def test_constructors_keep_their_signatures_and_positional_arguments():
    import inspect

    assert list(inspect.signature(cfg.UpdateConfig).parameters)[:2] == ["learning_rate", "learning_rate_annealing"]
    assert cfg.UpdateConfig(1e-2).learning_rate == 1e-2 and DQNParams(0.9).gamma == 0.9
    assert dataclasses.replace(cfg.TrainConfig(n_env_steps=10), n_env_steps=20).n_env_steps == 20


def test_from_dict_missing_top_level_field_named():
    data = _config().to_dict()
    del data["train_cfg"]
    with pytest.raises(ValueError, match=r"missing the field train_cfg"):
        AlgoConfig.from_dict(data)


def test_from_dict_missing_nested_field_named():
    data = _config().to_dict()
    del data["env_cfg"]["task_name"]
    with pytest.raises(ValueError, match=r"missing the field env_cfg\.task_name"):
        AlgoConfig.from_dict(data)


def test_from_dict_missing_fields_with_defaults_use_defaults():
    data = _config().to_dict()
    del data["update_cfg"]["n_epochs"]
    del data["algo_params"]["gamma"]
    config = AlgoConfig.from_dict(data)
    assert config.update_cfg.n_epochs == UpdateConfig().n_epochs
    assert config.algo_params.gamma == _ConfigTestParams().gamma


def test_from_dict_invalid_nested_value_named():
    data = _config().to_dict()
    data["update_cfg"]["learning_rate"] = -1.0
    with pytest.raises(ValueError, match=r"update_cfg\.learning_rate"):
        AlgoConfig.from_dict(data)


def test_from_dict_section_not_a_mapping():
    data = _config().to_dict()
    data["train_cfg"] = [1, 2]
    with pytest.raises(TypeError, match=r"train_cfg"):
        AlgoConfig.from_dict(data)
    # env_cfg: its spaces are read first; ["ab"] was read as {"a": "b"} ("unknown field env_cfg.a")
    for section in (3, ["ab"]):
        data = {**_config().to_dict(), "env_cfg": section}
        with pytest.raises(TypeError, match=rf"^env_cfg must be a mapping of fields, got {re.escape(repr(section))}$"):
            AlgoConfig.from_dict(data)


def test_from_dict_missing_algo_params_class():
    data = _config().to_dict()
    del data["algo_params_class"]
    with pytest.raises(ValueError, match=r"algo_params_class"):
        AlgoConfig.from_dict(data)
    # ... unless the type is given
    assert AlgoConfig.from_dict(data, algo_params_type=_ConfigTestParams) == _config()


@pytest.mark.parametrize(
    "text",
    [
        "seed: [1, 2\nupdate_cfg: {",
        "seed: 1\n  bad_indent: 2\n",
        "- just\n- a list\n",
        "a scalar\n",
    ],
)
def test_from_yaml_malformed_text_rejected(text):
    with pytest.raises(ValueError, match=r"malformed YAML"):
        AlgoConfig.from_yaml(text)


def test_from_yaml_missing_file_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        AlgoConfig.from_yaml(str(tmp_path / "nope.yaml"))
    with pytest.raises(FileNotFoundError):
        AlgoConfig.from_yaml(tmp_path / "nope.yaml")


def test_from_yaml_unregistered_params_says_how_to_register(tmp_path):
    path = tmp_path / "config.yaml"
    _config(algo_params=_UnregisteredParams()).to_yaml(path)
    with pytest.raises(ValueError, match=r"_UnregisteredParams.*not registered") as info:
        AlgoConfig.from_yaml(path)
    assert "register_algo_params" in str(info.value)
    assert "algo_params_type" in str(info.value)
    # the explicit type works without registration
    loaded = AlgoConfig.from_yaml(path, algo_params_type=_UnregisteredParams)
    assert loaded.algo_params == _UnregisteredParams()


def test_algo_params_class_lookup():
    assert algo_params_class("_ConfigTestParams") is _ConfigTestParams
    with pytest.raises(ValueError, match=r"not registered"):
        algo_params_class("NoSuchParams")


@pytest.fixture(autouse=True)
def _registries(restored_registries):
    """The params classes a test here registers are gone after it (tests/conftest.py)."""


def _params_class(module: str, name: str = "DQNParams", register: bool = True) -> type:
    """A params dataclass called ``name`` as if defined in ``module`` (a user's file)."""
    cls = dataclasses.make_dataclass(name, [("gamma", float, 0.9), ("start_step", int, -1)])
    cls.__module__ = module
    return register_algo_params(cls) if register else cls


def test_a_users_params_class_named_like_a_builtin_reads_back_as_itself(tmp_path):
    """The custom-agent guide's ``DQNParams`` (start_step -1) was written as ``DQNParams`` and read
    back as kitae's DQNParams, which refused start_step=-1 (or, with allowed values, built the
    wrong class); registering it replaced kitae's own in the registry."""
    from kitae.algos.collections.dqn import DQNParams

    users = _params_class("my_agents")
    path = tmp_path / "config.yaml"
    _config(algo_params=users(gamma=0.5)).to_yaml(path)
    assert yaml.safe_load(path.read_text())["algo_params_class"] == "my_agents:DQNParams"
    loaded = AlgoConfig.from_yaml(path)
    assert type(loaded.algo_params) is users and loaded.algo_params == users(gamma=0.5, start_step=-1)
    assert algo_params_class("DQNParams") is DQNParams  # kitae's own is still kitae's
    assert params_class_name(DQNParams) == "DQNParams"


def test_an_unregistered_users_class_named_like_a_builtin_is_not_read_as_the_builtin(tmp_path):
    path = tmp_path / "config.yaml"
    _config(algo_params=_params_class("unregistered_module", register=False)()).to_yaml(path)
    with pytest.raises(ValueError, match=r"'unregistered_module:DQNParams' is not registered"):
        AlgoConfig.from_yaml(path)


def test_a_users_class_is_found_under_another_module_name_when_it_is_the_only_one():
    """A script's class is written as ``__main__:Name``; read where the script is imported as a
    module, its class is the registered one of that name, and the other way round (a plain
    ``Name``, what kitae wrote before, finds it too); another module's class of that name is not it."""
    users = _params_class("my_script", name="OnlyOneParams")
    assert algo_params_class("__main__:OnlyOneParams") is users
    assert algo_params_class("OnlyOneParams") is users
    with pytest.raises(ValueError, match=r"'my_package.other:OnlyOneParams' is not registered"):
        algo_params_class("my_package.other:OnlyOneParams")  # another module's class of that name
    script = _params_class("__main__", name="ScriptParams")
    assert algo_params_class("train:ScriptParams") is script  # the script, imported as ``train``
    _params_class("other_script", name="OnlyOneParams")
    with pytest.raises(ValueError, match=r"several registered classes are called 'OnlyOneParams'") as info:
        algo_params_class("__main__:OnlyOneParams")
    assert "my_script:OnlyOneParams" in str(info.value) and "other_script:OnlyOneParams" in str(info.value)
    assert algo_params_class("my_script:OnlyOneParams") is users  # the exact name still decides


def test_register_algo_params_rejects_non_dataclass():
    with pytest.raises(TypeError, match=r"dataclass"):
        register_algo_params(int)


def test_to_yaml_rejects_function_in_params():
    @dataclasses.dataclass
    class WithFunction:
        schedule: object = None

    config = _config(algo_params=WithFunction(schedule=lambda step: 0.1))
    with pytest.raises(TypeError, match=r"algo_params\.schedule"):
        config.to_yaml()


# ---------------------------------------------------------------------------------------------
# YAML round trip
# ---------------------------------------------------------------------------------------------


def _assert_same(a: AlgoConfig, b: AlgoConfig) -> None:
    assert a.to_dict() == b.to_dict()
    assert a.env_cfg.observation_space == b.env_cfg.observation_space
    assert a.env_cfg.action_space == b.env_cfg.action_space
    assert a.algo_params == b.algo_params
    assert type(a.algo_params) is type(b.algo_params)
    assert a == b


def test_yaml_round_trip_through_file(tmp_path):
    config = _rich_config()
    path = tmp_path / "config.yaml"
    text = config.to_yaml(path)
    assert path.read_text() == text
    loaded = AlgoConfig.from_yaml(path)
    _assert_same(config, loaded)
    # a str path works too
    _assert_same(config, AlgoConfig.from_yaml(str(path)))
    # spot checks of the rebuilt objects
    assert loaded.algo_params.hidden == (128, 128, 64)
    assert isinstance(loaded.algo_params.hidden, tuple)
    state = loaded.env_cfg.observation_space["state"]
    assert state.dtype == np.float32
    np.testing.assert_array_equal(state.low, np.array([-1.0, -2.5, -np.inf], np.float32))
    np.testing.assert_array_equal(state.high, np.array([1.0, 0.1, np.inf], np.float32))
    assert loaded.env_cfg.observation_space["image"].dtype == np.uint8
    assert loaded.env_cfg.observation_space["mode"].start == 1
    assert loaded.update_cfg.max_grad_norm is None


def test_yaml_round_trip_from_text():
    config = _rich_config()
    _assert_same(config, AlgoConfig.from_yaml(config.to_yaml()))


def test_yaml_round_trip_with_explicit_type(tmp_path):
    config = _rich_config()
    path = tmp_path / "config.yml"
    config.to_yaml(path)
    loaded = AlgoConfig.from_yaml(path, algo_params_type=_ConfigTestParams)
    _assert_same(config, loaded)


def test_yaml_text_is_safe_yaml():
    text = _rich_config().to_yaml()
    assert "!!python" not in text and "!python" not in text
    data = yaml.safe_load(text)
    assert data["algo_params_class"] == f"{_ConfigTestParams.__module__}:_ConfigTestParams"
    assert data["seed"] == 12345
    assert data["env_cfg"]["observation_space"]["type"] == "Dict"
    assert data["update_cfg"]["max_grad_norm"] is None


def test_round_trip_detects_a_change():
    """The equality used by the round-trip tests is not vacuous."""
    data = _rich_config().to_dict()
    data["env_cfg"]["observation_space"]["spaces"]["state"]["high"][1] = 0.2
    changed = AlgoConfig.from_dict(data)
    assert changed.env_cfg.observation_space != _rich_config().env_cfg.observation_space


# ---------------------------------------------------------------------------------------------
# Spaces <-> dicts
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
        gym.spaces.Box(
            low=np.array([[0.0, -1.0], [2.0, -np.inf]], np.float32),
            high=np.array([[1.0, 1.0], [3.0, np.inf]], np.float32),
        ),
        gym.spaces.Box(0, 255, (4, 4, 3), np.uint8),
        gym.spaces.Box(-2.0, 2.0, (), np.float64),
        gym.spaces.Discrete(5),
        gym.spaces.Discrete(4, start=-2),
        gym.spaces.Discrete(3, dtype=np.int32),
        gym.spaces.MultiDiscrete([2, 3, 4]),
        gym.spaces.MultiDiscrete([[2, 3], [4, 5]]),
        gym.spaces.MultiDiscrete([2, 3], start=[1, -1]),
        gym.spaces.MultiBinary(6),
        gym.spaces.MultiBinary([2, 3]),
        gym.spaces.Dict({"a": gym.spaces.Discrete(2), "b": gym.spaces.Box(0.0, 1.0, (2,))}),
        gym.spaces.Tuple([gym.spaces.Discrete(3), gym.spaces.Dict({"x": gym.spaces.MultiBinary(2)})]),
    ],
    ids=lambda s: type(s).__name__,
)
def test_space_round_trip(space):
    data = space_to_dict(space)
    assert yaml.safe_load(yaml.safe_dump(data)) == data  # plain YAML-safe values
    rebuilt = space_from_dict(yaml.safe_load(yaml.safe_dump(data)))
    assert type(rebuilt) is type(space)
    assert rebuilt == space
    assert rebuilt.dtype == space.dtype


def test_box_uniform_bounds_stored_as_scalars_nonuniform_as_lists():
    uniform = space_to_dict(gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32))
    assert uniform["low"] == -1.0 and uniform["high"] == 1.0
    assert uniform["shape"] == [2, 3] and uniform["dtype"] == "float32"
    mixed = space_to_dict(gym.spaces.Box(np.array([0.0, -1.0], np.float32), np.array([1.0, 1.0], np.float32)))
    assert mixed["low"] == [0.0, -1.0]
    assert mixed["high"] == 1.0


def test_space_to_dict_rejects_unknown_space():
    with pytest.raises(TypeError, match=r"cannot serialise space"):
        space_to_dict(gym.spaces.Text(5))


def test_space_from_dict_rejects_unknown_type():
    with pytest.raises(ValueError, match=r"unknown space type 'Sphere'"):
        space_from_dict({"type": "Sphere", "radius": 1})


@pytest.mark.parametrize("data", [{"low": 0.0}, [1, 2], "Box", None])
def test_space_from_dict_rejects_non_space_mapping(data):
    with pytest.raises(ValueError, match=r"'type' key"):
        space_from_dict(data)


@pytest.mark.parametrize(
    "data, key",
    [
        ({"type": "Box", "low": 0.0, "high": 1.0}, "shape"),
        ({"type": "Box", "shape": [2], "high": 1.0}, "low"),
        ({"type": "Discrete"}, "n"),
        ({"type": "MultiDiscrete"}, "nvec"),
        ({"type": "MultiBinary"}, "n"),
        ({"type": "Dict"}, "spaces"),
        ({"type": "Tuple"}, "spaces"),
    ],
)
def test_space_from_dict_missing_key(data, key):
    with pytest.raises(ValueError, match=rf"missing the key '{key}'"):
        space_from_dict(data)


def test_env_cfg_from_dict_rebuilds_spaces():
    cfg = _env_cfg(n_envs=3)
    rebuilt = EnvConfig.from_dict(cfg.to_dict())
    assert rebuilt == cfg
    assert isinstance(rebuilt.observation_space, gym.spaces.Box)


def test_log_frequency_zero_rejected():
    with pytest.raises(ValueError, match=r"train_cfg\.log_frequency.*0"):
        TrainConfig(log_frequency=0)


def test_yaml_has_no_anchors_where_two_fields_hold_one_value():
    """SAC's default ``policy_hidden`` and ``q_hidden`` are one tuple object: written with anchors
    (``&id001`` / ``*id001``), editing the first in config.yaml would change the second too."""
    from kitae.algos.collections.sac import SACParams
    from kitae.config import yaml_text

    shared = [256, 256]
    assert "&id001" in yaml.safe_dump({"a": shared, "b": shared})  # what safe_dump does
    assert yaml_text({"a": shared, "b": shared}) == "a:\n- 256\n- 256\nb:\n- 256\n- 256\n"

    params = SACParams()
    assert params.policy_hidden is params.q_hidden
    text = _config(algo_params=params).to_yaml()
    assert "&id" not in text and "*id" not in text
    edited = text.replace("policy_hidden:\n  - 256\n  - 256", "policy_hidden:\n  - 64\n  - 64")
    assert edited != text
    loaded = AlgoConfig.from_yaml(edited)
    assert tuple(loaded.algo_params.policy_hidden) == (64, 64) and tuple(loaded.algo_params.q_hidden) == (256, 256)
