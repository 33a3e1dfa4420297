"""The command line: `kitae train` end to end, and one clear line for every bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kitae.cli import main
from kitae.config import AlgoConfig
from kitae.rundir import read_metrics


def _bad(capsys, argv: list[str], *expected: str) -> str:
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("kitae: error:")
    assert "Traceback" not in err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def test_train_writes_the_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "kitae.cli", "train", "ppo", "gymnax:CartPole-v1", "--steps", "4096",
         "--run-dir", str(run_dir), "--quiet", "--set", "update_cfg.learning_rate=1e-3"],
        capture_output=True, text=True, timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    for field in ("algo", "env", "seed", "steps", "wall_seconds", "compile_seconds", "sps", "final_return",
                  "peak_rss_mb", "state_fingerprint"):
        assert field in summary, field
    assert summary["algo"] == "ppo" and summary["env"] == "gymnax:CartPole-v1" and summary["steps"] >= 4096
    config = AlgoConfig.from_yaml(run_dir / "config.yaml")
    assert config.update_cfg.learning_rate == 1e-3 and config.train_cfg.n_env_steps == 4096
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows and all({"step", "episodic_return"} <= set(row) for row in rows)
    assert (run_dir / "curve.png").stat().st_size > 1000
    assert any((run_dir / "logs").iterdir())


def test_unknown_algorithm(capsys):
    _bad(capsys, ["train", "a2c", "CartPole-v1"], "unknown algorithm 'a2c'", "ppo")


def test_unknown_environment(capsys):
    _bad(capsys, ["train", "ppo", "NotAnEnv-v0", "--steps", "100"], "NotAnEnv-v0")
    _bad(capsys, ["train", "ppo", "gymnax:NotAnEnv-v0", "--steps", "100"], "unknown gymnax environment")
    _bad(capsys, ["train", "ppo", "atari:Pong-v5"], "unknown environment source 'atari'")


def test_space_the_algorithm_cannot_handle(capsys):
    _bad(capsys, ["train", "dqn", "gymnax:Pendulum-v1", "--steps", "100"], "DQN", "Box")


def test_malformed_yaml(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("update_cfg: {learning_rate: [1,\n")
    _bad(capsys, ["train", "ppo", "--config", str(bad)], "malformed YAML")
    _bad(capsys, ["train", "ppo", "--config", str(tmp_path / "missing.yaml")], "does not exist")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump({"optimizer": "adam"}))
    _bad(capsys, ["train", "ppo", "--config", str(unknown)], "unknown key 'optimizer'")


def test_unknown_set_key_and_wrong_type(capsys):
    _bad(capsys, ["train", "ppo", "--set", "update_cfg.lr=1e-3"], "unknown --set key 'update_cfg.lr'")
    _bad(capsys, ["train", "ppo", "--set", "novalue"], "KEY=VALUE")
    _bad(capsys, ["train", "ppo", "--set", "update_cfg.n_epochs=many"], "update_cfg.n_epochs")
    _bad(capsys, ["train", "ppo", "--set", "update_cfg.learning_rate=-1"], "update_cfg.learning_rate")


def test_zero_steps(capsys):
    _bad(capsys, ["train", "ppo", "--steps", "0"], "steps")
    _bad(capsys, ["train", "ppo", "--steps", "ten"], "'ten' is not an int")


def test_existing_run_directory_is_left_untouched(capsys, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    _bad(capsys, ["train", "ppo", "--steps", "100", "--run-dir", str(run_dir)], "already exists")
    assert [p.name for p in run_dir.iterdir()] == ["summary.json"]
    assert (run_dir / "summary.json").read_text() == "{}"


@pytest.mark.parametrize("command", [["train", "--help"], ["--help"]])
def test_help_says_what_and_shows_an_example(capsys, command):
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "train" in out
    if command[0] == "train":
        assert "examples:" in out and "kitae train dqn CartPole-v1" in out


def test_presets_and_overrides_resolve_in_order(tmp_path):
    from kitae.presets import resolve

    base = resolve("ppo", "gymnax:CartPole-v1")
    assert base["n_envs"] == 4 and base["update_cfg"]["learning_rate"] == "lin_2.5e-4"
    gym_preset = resolve("ppo", "CartPole-v1")
    assert gym_preset["n_envs"] == 8 and gym_preset["update_cfg"]["n_epochs"] == 20
    file = tmp_path / "c.yaml"
    file.write_text(yaml.safe_dump({"n_envs": 2, "update_cfg": {"n_epochs": 3}}))
    resolved = resolve("ppo", "CartPole-v1", config_file=str(file), overrides={"n_envs": 6},
                       sets=["update_cfg.n_epochs=5", "algo_params.gamma=0.9"])
    assert resolved["n_envs"] == 6
    assert resolved["update_cfg"]["n_epochs"] == 5 and resolved["update_cfg"]["batch_size"] == 256
    assert resolved["algo_params"]["gamma"] == 0.9
    assert Path(file).exists()
