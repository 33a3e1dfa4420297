"""`kitae config`: the config `kitae train` would train with, printed as a config file."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kitae.cli import main
from kitae.runs import RunSpec
from kitae.runs.resolve import config_text, resolve_train


def _resolved_yaml(spec: RunSpec) -> str:
    run, env = resolve_train(spec)
    env.close()
    return run.config.to_yaml()


def _config(capsys, argv: list[str]) -> tuple[list[str], str]:
    """``kitae config ARGV``'s comment lines and the YAML after them."""
    assert main(["config", *argv]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines(keepends=True)
    comments = [line.rstrip("\n") for line in lines if line.startswith("#")]
    assert lines[: len(comments)] == [c + "\n" for c in comments]  # the comments come first, then YAML only
    return comments, "".join(lines[len(comments) :])


CASES = [
    (["ppo", "CartPole-v1", "--steps", "512", "--seed", "3", "--set", "update_cfg.learning_rate=1e-3"], {}),
    (["sac", "gymnax:Pendulum-v1", "--n-envs", "2"], {}),
    (["ppo", "LunarLander-v3", "--set", "env_kwargs.continuous=true"], {}),
    (["dqn", "gymnax:CartPole-v1", "--set", "train_cfg.save_frequency=5000"], {}),
    (["ppo", "CartPole-v1", "--workers", "2", "--async"], {"workers": 2, "async_mode": True}),
]


@pytest.mark.parametrize(("argv", "distributed"), CASES, ids=[" ".join(argv[:3]) for argv, _ in CASES])
def test_it_prints_the_config_train_resolves_and_the_file_gives_it_back(capsys, tmp_path, argv, distributed):
    """The YAML is what ``kitae train`` with the same arguments writes to config.yaml, byte for
    byte; saved and given to ``--config`` alone, it resolves to the same config again."""
    algo, env = argv[:2]
    flags = argv[2:]
    spec = RunSpec(
        algo,
        env,
        steps=int(flags[flags.index("--steps") + 1]) if "--steps" in flags else None,
        seed=int(flags[flags.index("--seed") + 1]) if "--seed" in flags else None,
        n_envs=int(flags[flags.index("--n-envs") + 1]) if "--n-envs" in flags else None,
        sets=[flags[i + 1] for i, flag in enumerate(flags) if flag == "--set"],
        **distributed,
    )
    comments, text = _config(capsys, argv)
    expected = _resolved_yaml(spec)
    assert text == expected
    assert config_text(spec).endswith(expected)

    saved = tmp_path / "config.yaml"
    saved.write_text("".join(c + "\n" for c in comments) + text)
    assert _resolved_yaml(RunSpec(algo, env, config_file=str(saved))) == expected
    # and it reads as a file people edit: no anchors, every value where it is
    assert "&id" not in text and "*id" not in text
    assert yaml.safe_load(saved.read_text()) == yaml.safe_load(expected)


def test_the_comments_say_where_the_values_come_from_and_which_executor_trains(capsys):
    comments, _ = _config(capsys, ["ppo", "CartPole-v1", "--steps", "512", "--set", "update_cfg.learning_rate=1e-3"])
    said = " ".join(c.lstrip("# ") for c in comments)
    assert "`kitae train ppo gymnasium:CartPole-v1 --steps 512 --set update_cfg.learning_rate=1e-3`" in said
    assert "kitae/presets/ppo.yaml: default and its gymnasium:CartPole-v1 section, then the flags" in said
    assert "these gymnasium ids: Acrobot-v1," in said and "LunarLander-v3" in said
    assert "Trains in the host loop" in said
    assert "kitae train ppo gymnasium:CartPole-v1 --config FILE.yaml" in said
    assert all(len(c) <= 100 for c in comments), comments

    comments, _ = _config(capsys, ["td3", "MountainCarContinuous-v0"])
    said = " ".join(c.lstrip("# ") for c in comments)
    assert "kitae/presets/td3.yaml: default (no gymnasium:MountainCarContinuous-v0 section)." in said
    assert "these gymnasium ids: Pendulum-v1; and 1 id of gymnax." in said

    comments, _ = _config(capsys, ["sac", "gymnax:Pendulum-v1"])
    assert "Trains in the compiled loop" in " ".join(comments)


def test_a_config_file_given_is_named_and_its_values_kept(capsys, tmp_path):
    section = tmp_path / "mine.yaml"
    section.write_text("n_envs: 4\nupdate_cfg: {learning_rate: 3.0e-4, batch_size: 64}\n")
    comments, text = _config(capsys, ["ppo", "CartPole-v1", "--config", str(section)])
    assert f"then {section}." in " ".join(c.lstrip("# ") for c in comments)
    config = yaml.safe_load(text)
    assert config["env_cfg"]["n_envs"] == 4 and config["update_cfg"]["learning_rate"] == 3.0e-4


def test_a_config_file_writes_floats_as_python_does(capsys, tmp_path):
    """``learning_rate: 3e-4`` (how rl-zoo's files, papers and Python write it) was read by PyYAML,
    which follows YAML 1.1, as the string '3e-4' and refused: "has type str; allowed: float". The
    budget may be written 2e4 too, as ``--steps`` takes it; a fraction is still refused."""
    from math import inf

    from kitae.cli import main
    from kitae.config import AlgoConfig, load_yaml
    from kitae.runs.presets import parse_value

    section = tmp_path / "mine.yaml"
    section.write_text("n_env_steps: 2e4\nupdate_cfg: {learning_rate: 3e-4, max_grad_norm: 1E-1}\n")
    _, text = _config(capsys, ["ppo", "CartPole-v1", "--config", str(section)])
    config = yaml.safe_load(text)
    assert config["update_cfg"]["learning_rate"] == 3e-4 and config["update_cfg"]["max_grad_norm"] == 0.1
    assert config["train_cfg"]["n_env_steps"] == 20_000
    assert (
        AlgoConfig.from_yaml(text.replace("learning_rate: 0.0003", "learning_rate: 1e-4")).update_cfg.learning_rate
        == 1e-4
    )
    floats = "[1e6, -2.5E-3, 1_000, 3, .5, -.5, 1.0e+2, inf, -inf, .inf, 0x1f, 1e, e5, info, '1e6']"
    assert load_yaml(floats) == [1e6, -2.5e-3, 1000, 3, 0.5, -0.5, 100.0, inf, -inf, inf, 31, "1e", "e5", "info", "1e6"]
    # --set values are read the same way (a file's `inf` was the string 'inf', --set's a float)
    assert [parse_value(v) for v in ("3e-4", "inf", "-.5", "[64, 64]", "null", "lin_3e-4")] == [
        3e-4,
        inf,
        -0.5,
        [64, 64],
        None,
        "lin_3e-4",
    ]
    section.write_text("n_env_steps: 1.5\n")
    assert main(["config", "ppo", "CartPole-v1", "--config", str(section)]) == 2
    assert "n_env_steps=1.5 has type float; allowed: int" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["ppo", "Foo-v1"], "unknown Gymnasium environment 'Foo-v1'"),
        (["xyz", "CartPole-v1"], "unknown algorithm 'xyz'"),
        (["ppo", "CartPole-v1", "--set", "learning_rate=1e-3"], "did you mean 'update_cfg.learning_rate'?"),
        (["ppo", "CartPole-v1", "--steps", "0"], "--steps 0 is not allowed"),
        (["ppo", "CartPole-v1", "--async"], "--async needs --workers N"),
        # whole iterations of 512 steps take it past the int32 step counters: refused, as by train
        (["ppo", "gymnax:CartPole-v1", "--steps", "2147483647"], "in whole iterations of 512 steps it is 2,147,"),
        # one iteration of 10**8 environments is past them at any --steps: refused naming n_envs, before a
        # host source made its environments (minutes, then out of memory)
        (["ppo", "CartPole-v1", "--n-envs", "100000000"], "n_envs=100,000,000 is not allowed: one iteration (32 "),
        # an algorithm's own rule, checked when its agent is made: config printed it, train refused it
        (["a2c", "CartPole-v1", "--set", "update_cfg.n_epochs=2"], "update_cfg.n_epochs=2 is not allowed for A2C"),
        # an infinite learning rate trained and diverged; 1e300, inf in float32, printed numpy's warnings
        (
            ["ppo", "CartPole-v1", "--set", "update_cfg.learning_rate=inf"],
            "update_cfg.learning_rate=inf is not allowed",
        ),
        (["ppo", "CartPole-v1", "--set", "update_cfg.learning_rate=1e300"], "learning_rate=1e+300 is not allowed"),
        (["ppo", "CartPole-v1", "--gradient-workers", "0"], "--gradient-workers needs --workers N"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(capsys, tmp_path, argv, expected):
    assert main(["config", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("kitae: error:") and expected in lines[0], captured.err
    assert not any(tmp_path.iterdir())  # the test's working directory: no runs/ or anything else


@pytest.mark.parametrize(
    "text, message",
    [
        ("update_cfg: 3\n", "update_cfg must be a mapping of fields, got 3"),  # was "'int' object is not iterable"
        ("distributed: 3\n", "distributed must be a mapping of fields, got 3"),
        ("train_cfg: [1]\n", "train_cfg must be a mapping of fields, got [1]"),
    ],
)
def test_a_config_file_section_that_is_not_a_mapping_is_named(capsys, tmp_path, text, message):
    (tmp_path / "c.yaml").write_text(text)
    assert main(["config", "ppo", "CartPole-v1", "--config", str(tmp_path / "c.yaml")]) == 2
    assert capsys.readouterr().err == f"kitae: error: {message}\n"


@pytest.mark.parametrize("command", ["train", "sweep", "tune"])
def test_seeds_past_the_seed_range_are_refused_before_anything_is_written(capsys, tmp_path, command):
    """``--seed 4294967295 --seeds 2`` was refused at the second seed's agent, naming a seed the user
    never typed, after the run (sweep, study) directory was written."""
    extra = {"train": [], "sweep": ["--grid", "update_cfg.learning_rate=1e-3,2e-3"], "tune": ["--trials", "1"]}
    env_id = "CartPole-v1" if command == "train" else "gymnax:CartPole-v1"
    argv = [command, "ppo", env_id, "--steps", "2048", "--seed", "4294967295", "--seeds", "2", *extra[command]]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "kitae: error: --seeds 2 from seed 4294967295 is not allowed: its last seed would be 4294967296; allowed: "
        "seed + seeds - 1 < 2**32 (--seed at most 4294967294)\n"
    )
    assert not any(tmp_path.iterdir())


def test_a_run_directory_given_as_config_file_names_its_config_yaml(capsys, tmp_path):
    """It said the directory "does not exist"."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text("seed: 0\n")
    assert main(["config", "ppo", "CartPole-v1", "--config", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"kitae: error: config file {str(tmp_path / 'run')!r} is a directory; allowed: a YAML file; a run "
        f"directory's is {str(tmp_path / 'run' / 'config.yaml')!r}\n"
    )


def test_a_custom_agent_without_a_preset_file_and_its_import(capsys):
    """``examples/custom_dqn.py`` registers ``custom_dqn``: no preset file, kitae's defaults, and
    the commands the comments show carry ``--import`` (kept whole on a line)."""
    example = str(Path(__file__).resolve().parents[1] / "examples" / "custom_dqn.py")
    sets = ["algo_params.exploration=0.1", "algo_params.gamma=0.99", "algo_params.skip_steps=1"]
    comments, text = _config(capsys, ["custom_dqn", "CartPole-v1", "--import", example, *(f"--set={s}" for s in sets)])
    said = " ".join(c.lstrip("# ") for c in comments)
    assert "Values from no preset file for custom_dqn (kitae's defaults), then the flags." in said
    assert f"--import {example}`, as it writes it" in said
    assert said.endswith(f"kitae train custom_dqn gymnasium:CartPole-v1 --config FILE.yaml --import {example}")
    assert any(c.startswith("#   --import ") or f"--import {example}" in c for c in comments)  # flag and path together
    assert "algo_params_class: custom_dqn:DQNParams" in text
