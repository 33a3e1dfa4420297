"""Config files and ``--set`` as a new user writes them: what YAML makes of a slip, rl-zoo's names,
another algorithm's fields, a field the run does not read. Each refusal is one line that says
what to write instead (``kitae config``: nothing is trained)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kitae.cli import main
from kitae.config import load_yaml, yaml_error_text


def _error(capsys, argv: list[str]) -> str:
    """``kitae config ARGV``'s one error line (exit status 2, nothing on stdout)."""
    assert main(["config", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kitae: error: "), captured.err
    return lines[0].removeprefix("kitae: error: ")


def _config(capsys, argv: list[str]) -> dict:
    assert main(["config", *argv]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def _file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "text, key, line",
    [
        # PyYAML kept the second section silently: learning_rate 1e-3 was lost
        ("update_cfg:\n  learning_rate: 1e-3\nupdate_cfg:\n  batch_size: 32\n", "update_cfg", 3),
        ("algo_params:\n  gamma: 0.9\n  clip_coef: 0.1\n  gamma: 0.8\n", "gamma", 4),
    ],
)
def test_a_key_given_twice_is_refused_with_its_line(capsys, tmp_path, text, key, line):
    with pytest.raises(yaml.YAMLError) as caught:
        load_yaml(text)
    assert yaml_error_text(caught.value).startswith(f"line {line}, column ")
    path = _file(tmp_path, text)
    assert _error(capsys, ["ppo", "--config", path]) == (
        f"malformed YAML in {path!r}, line {line}, column {3 if key == 'gamma' else 1}: found the key {key!r} "
        "twice (the second one would replace the first)"
    )


def test_a_merge_key_may_still_be_overridden():
    text = "base: &b {gamma: 0.9, tau: 0.1}\nrun:\n  <<: *b\n  gamma: 0.8\n"
    assert load_yaml(text)["run"] == {"gamma": 0.8, "tau": 0.1}


def test_malformed_yaml_is_one_line_with_where(capsys, tmp_path):
    path = _file(tmp_path, "update_cfg: {learning_rate: [1, 2}\n")
    message = _error(capsys, ["ppo", "--config", path])
    assert message.startswith(f"malformed YAML in {path!r}, line 1, column ")
    assert "\n" not in message and "^" not in message  # PyYAML's own text quoted the source over lines


@pytest.mark.parametrize(
    "item, hint",
    [
        ("update_cfg.max_grad_norm=None", "has type str; allowed: float or None (YAML writes None as null)"),
        ("algo_params.gamma=None", "allowed: float (None is not allowed here)"),
        ("algo_params.hidden_sizes=(64, 64)", "allowed: tuple (YAML writes a list as [64, 64])"),
        ("algo_params.hidden_sizes=64,32", "allowed: tuple (YAML writes a list as [64, 32])"),
        ("replay.her=no", "replay.her=False has type bool; allowed: str or None (YAML reads yes, no, on and off"),
        # rl-zoo spells an annealed rate lin_3e-4; anything else was read as "a float" and refused as a str
        (
            "update_cfg.learning_rate=linear_3e-4",
            "update_cfg.learning_rate='linear_3e-4' is not allowed; allowed: a float, or 'lin_<float>'",
        ),
    ],
)
def test_what_yaml_makes_of_a_python_or_shell_spelling_is_explained(capsys, item, hint):
    assert hint in _error(capsys, ["ppo", "--set", item])


def test_an_annealed_learning_rate_in_rl_zoo_spelling_is_taken(capsys):
    update = _config(capsys, ["ppo", "--set", "update_cfg.learning_rate=lin_3e-4"])["update_cfg"]
    assert update["learning_rate"] == 3e-4 and update["learning_rate_annealing"] is True


def test_a_dotted_key_in_a_file_says_how_a_file_nests_it(capsys, tmp_path):
    path = _file(tmp_path, "update_cfg.learning_rate: 1e-3\n")
    assert "; a file nests it: update_cfg: {learning_rate: ...}; allowed: " in _error(capsys, ["ppo", "--config", path])


@pytest.mark.parametrize(
    "algo, where, key, hint",
    [
        ("ppo", "file", "n_timesteps: 1e5", "did you mean 'n_env_steps' (rl-zoo's n_timesteps)?"),
        ("ppo", "file", "policy_kwargs: dict(net_arch=[64])", "did you mean 'algo_params.hidden_sizes'"),
        ("ppo", "set", "algo_params.ent_coef=0.1", "did you mean 'algo_params.entropy_coef' (rl-zoo's ent_coef)?"),
        ("sac", "set", "algo_params.ent_coef=0.1", "did you mean 'algo_params.alpha' (rl-zoo's ent_coef)?"),
        ("dqn", "set", "algo_params.train_freq=4", "did you mean 'algo_params.skip_steps' (rl-zoo's train_freq)?"),
        ("td3", "set", "algo_params.target_policy_noise=0.2", "'algo_params.policy_noise' (rl-zoo's"),
    ],
)
def test_rl_zoo_names_point_to_kitae_keys(capsys, tmp_path, algo, where, key, hint):
    argv = [algo, "--config", _file(tmp_path, key + "\n")] if where == "file" else [algo, "--set", key]
    assert hint in _error(capsys, argv)


def test_another_algorithms_params_are_named_as_its_own(capsys, tmp_path):
    """A PPO search's best.yaml given to DQN was refused field by field, with DQN's fields only."""
    path = _file(tmp_path, "algo_params: {clip_coef: 0.2, gae_lambda: 0.9}\nupdate_cfg: {learning_rate: 1e-3}\n")
    assert _error(capsys, ["dqn", "--config", path]) == (
        f"the algo_params of {path} (clip_coef, gae_lambda) are not fields of DQNParams but ppo's (also "
        "ppo_lstm's, rnd_ppo's): give ppo as ALGO, or drop them"
    )
    assert "; it is a field of td3's algo_params, not this algorithm's; allowed keys: " in _error(
        capsys, ["dqn", "--set", "algo_params.policy_noise=0.2"]
    )
    # a field no algorithm has keeps the params class's own refusal
    path = _file(tmp_path, "algo_params: {clip_coef: 0.2, bogus: 1}\n")
    assert "unknown field algo_params.bogus in PPOParams" in _error(capsys, ["ppo", "--config", path])


@pytest.mark.parametrize(
    "algo, where, key, hint",
    [
        ("ppo", "set", "algo_params.hidden=[32]", "; this algorithm's network sizes are 'algo_params.hidden_sizes'"),
        ("dqn", "set", "algo_params.hidden_sizes=[32]", "; this algorithm's network sizes are 'algo_params.hidden'"),
        ("sac", "set", "algo_params.hidden=[32]",
         "; this algorithm's network sizes are 'algo_params.policy_hidden' and 'algo_params.q_hidden'"),
        ("td3", "set", "algo_params.net_arch=[32]",
         "; this algorithm's network sizes are 'algo_params.actor_hidden' and 'algo_params.critic_hidden'"),
        ("dqn", "file", "algo_params: {hidden_sizes: [32]}",
         "algo_params.hidden_sizes in FILE is not a field of DQNParams; this algorithm's network sizes are "
         "'algo_params.hidden'"),
    ],
)  # fmt: skip
def test_another_algorithms_name_for_the_network_sizes_names_this_ones(capsys, tmp_path, algo, where, key, hint):
    """The networks' sizes are named per algorithm: PPO's ``hidden_sizes`` given to DQN was said to
    be "a field of a2c's algo_params", as if the file were another algorithm's."""
    path = _file(tmp_path, key + "\n")
    argv = [algo, "--config", path] if where == "file" else [algo, "--set", key]
    assert hint.replace("FILE", path) in _error(capsys, argv)


def test_algo_and_env_left_out_come_from_a_runs_config_yaml(capsys, tmp_path):
    """``kitae train --config RUN/config.yaml`` trained PPO on gymnax CartPole whatever the run was."""
    run_config = tmp_path / "config.yaml"
    assert main(["config", "dqn", "CartPole-v1", "--set", "algo_params.gamma=0.9"]) == 0
    run_config.write_text(capsys.readouterr().out)
    config = _config(capsys, ["--config", str(run_config)])
    assert config["algo_params_class"] == "DQNParams" and config["algo_params"]["gamma"] == 0.9
    assert config["env_cfg"]["task_name"] == "gymnasium:CartPole-v1"
    # ENV given: the run's config on another environment
    assert _config(capsys, ["dqn", "gymnax:CartPole-v1", "--config", str(run_config)])["env_cfg"]["task_name"] == (
        "gymnax:CartPole-v1"
    )
    # a preset section as --config names no algorithm: the defaults
    section = _file(tmp_path, "update_cfg: {learning_rate: 1e-3}\n")
    config = _config(capsys, ["--config", section])
    assert config["algo_params_class"] == "PPOParams" and config["env_cfg"]["task_name"] == "gymnax:CartPole-v1"


@pytest.mark.parametrize(
    "algo, item, why",
    [
        ("ppo", "algo_params.vtrace_rho_bar=0.5", "(read only with algo_params.advantage_estimator=vtrace)"),
        ("ppo", "algo_params.log_std_init=-1", "(read only for a Box action space, this run's is Discrete(2))"),
        ("dqn", "replay.priority_exponent=0.5", "(read only with replay.prioritized=true)"),
    ],
)
def test_a_set_the_run_does_not_read_is_refused(capsys, algo, item, why):
    """It was taken, written to config.yaml, and trained the same run as without it."""
    key = item.partition("=")[0]
    assert _error(capsys, [algo, "--set", item]) == (
        f"--set {item} would change nothing: this run does not read {key} {why}"
    )


def test_a_set_read_with_its_switch_or_from_a_file_is_taken(capsys, tmp_path):
    sets = ["--set", "algo_params.vtrace_rho_bar=0.5", "--set", "algo_params.advantage_estimator=vtrace"]
    assert _config(capsys, ["ppo", *sets])["algo_params"]["vtrace_rho_bar"] == 0.5
    # a file holds a whole config, read or not (a run's config.yaml holds every field)
    path = _file(tmp_path, "algo_params: {vtrace_rho_bar: 0.5}\n")
    assert _config(capsys, ["ppo", "--config", path])["algo_params"]["vtrace_rho_bar"] == 0.5
