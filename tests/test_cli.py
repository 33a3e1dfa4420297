"""The command line: `kitae train` end to end, and one clear line for every bad input."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

import kitae
from kitae.cli import main
from kitae.config import AlgoConfig
from kitae.envs.make import EnvSpec
from kitae.runs import RunError
from kitae.runs.rundir import read_metrics


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
        [
            sys.executable,
            "-m",
            "kitae.cli",
            "train",
            "ppo",
            "gymnax:CartPole-v1",
            "--steps",
            "4096",
            "--run-dir",
            str(run_dir),
            "--quiet",
            "--set",
            "update_cfg.learning_rate=1e-3",
        ],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    for field in (
        "algo",
        "env",
        "seed",
        "steps",
        "wall_seconds",
        "compile_seconds",
        "sps",
        "final_return",
        "peak_rss_mb",
        "state_fingerprint",
    ):
        assert field in summary, field
    assert summary["algo"] == "ppo" and summary["env"] == "gymnax:CartPole-v1" and summary["steps"] >= 4096
    # what made the run, so that fingerprints are compared only where they should agree
    assert summary["versions"]["kitae"] == kitae.__version__ and summary["versions"]["jax"] == jax.__version__
    assert summary["versions"]["python"] == platform.python_version()
    assert summary["machine"]["backend"] == "cpu" and summary["machine"]["cpu"]
    # the suite's XLA flags (tests/conftest.py), inherited by the command, with the one the command adds
    assert "--xla_cpu_max_isa=AVX" in summary["machine"]["xla_flags"]
    config = AlgoConfig.from_yaml(run_dir / "config.yaml")
    assert config.update_cfg.learning_rate == 1e-3 and config.train_cfg.n_env_steps == 4096
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert rows and all({"step", "episodic_return"} <= set(row) for row in rows)
    assert (run_dir / "curve.png").stat().st_size > 1000
    assert any((run_dir / "logs").iterdir())


def test_unknown_algorithm(capsys):
    _bad(capsys, ["train", "a3c", "CartPole-v1"], "unknown algorithm 'a3c'", "ppo")


def test_unknown_environment(capsys):
    _bad(capsys, ["train", "ppo", "NotAnEnv-v0", "--steps", "100"], "NotAnEnv-v0")
    _bad(capsys, ["train", "ppo", "gymnax:NotAnEnv-v0", "--steps", "100"], "unknown gymnax environment")
    _bad(capsys, ["train", "ppo", "atari:Pong-v5"], "unknown environment source 'atari'")
    _bad(capsys, ["train", "ppo", "Brax:ant"], "source 'Brax' in 'Brax:ant'; did you mean 'brax'?; allowed sources: ")
    _bad(capsys, ["train", "ppo", "gymnax:"], "no environment name after 'gymnax':; allowed: 'gymnax:NAME'")
    _bad(capsys, ["train", "ppo", " "], "allowed: 'SOURCE:ID' with SOURCE one of gymnasium, gymnax, envpool, ")
    # Gymnasium's Atari ids (ale-py is not installed): the EnvPool id that trains the game
    _bad(
        capsys,
        ["train", "ppo", "ALE/Pong-v5"],
        "'ALE/Pong-v5'; Atari games train through EnvPool here: envpool:Pong-v5",
    )
    _bad(capsys, ["train", "dqn", "BreakoutNoFrameskip-v4"], "through EnvPool here: envpool:Breakout-v5")
    # a near miss names the id meant
    _bad(
        capsys, ["train", "ppo", "CartPol-v1"], "unknown Gymnasium environment 'CartPol-v1'; did you mean 'CartPole-v1'"
    )
    _bad(
        capsys,
        ["train", "ppo", "gymnax:CartPol-v1"],
        "unknown gymnax environment 'CartPol-v1'; did you mean 'CartPole-v1'",
    )
    # kitae's own gymnax ids are suggested and listed too
    _bad(
        capsys,
        ["train", "ppo_lstm", "gymnax:CartPoleNoVel-v2"],
        "unknown gymnax environment 'CartPoleNoVel-v2'; did you mean 'CartPoleNoVel-v1'",
    )
    _bad(capsys, ["train", "dqn", "gymnax:BitFlip-v0"], "kitae adds: CartPoleNoVel-v1, BitFlipping-v0")


def test_make_vec_env_points_a_jax_id_to_make_jax_env():
    from kitae.envs.make import make_vec_env

    with pytest.raises(
        ValueError, match=r"make_jax_env\('gymnax:CartPole-v1', n_envs\) builds it for the compiled loop"
    ):
        make_vec_env("gymnax:CartPole-v1", 2)


def test_space_the_algorithm_cannot_handle(capsys):
    _bad(capsys, ["train", "dqn", "gymnax:Pendulum-v1", "--steps", "100"], "DQN", "Box")


def test_malformed_yaml(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("update_cfg: {learning_rate: [1,\n")
    _bad(capsys, ["train", "ppo", "--config", str(bad)], "malformed YAML")
    _bad(capsys, ["train", "ppo", "--config", str(tmp_path / "missing.yaml")], "does not exist")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text(yaml.safe_dump({"optimizer": "adam"}))
    _bad(capsys, ["train", "ppo", "--config", str(unknown)], "unknown key 'optimizer' in")
    flat = tmp_path / "flat.yaml"
    flat.write_text(yaml.safe_dump({"gamma": 0.9}))
    _bad(
        capsys,
        ["train", "ppo", "--config", str(flat)],
        "flat.yaml; did you mean 'algo_params.gamma'?",
    )
    misspelt = tmp_path / "misspelt.yaml"
    misspelt.write_text(yaml.safe_dump({"update_cfg": {"learnin_rate": 1e-3}}))
    _bad(capsys, ["train", "ppo", "--config", str(misspelt)], "did you mean update_cfg.learning_rate?")


def test_unknown_set_key_and_wrong_type(capsys):
    _bad(capsys, ["train", "ppo", "--set", "update_cfg.lr=1e-3"], "unknown --set key 'update_cfg.lr'; allowed keys")
    # A near miss is named: the field under another section, or a misspelling.
    _bad(
        capsys,
        ["train", "ppo", "--set", "learning_rate=1e-3"],
        "unknown --set key 'learning_rate'; did you mean 'update_cfg.learning_rate'?",
    )
    _bad(capsys, ["train", "ppo", "--set", "algo_params.gama=0.9"], "did you mean 'algo_params.gamma'?")
    _bad(capsys, ["train", "dqn", "--set", "algo_params.batch_size=32"], "did you mean 'update_cfg.batch_size'?")
    # config.yaml keeps the environment's arguments under env_cfg; --set takes them as env_kwargs.NAME
    _bad(
        capsys,
        ["config", "td3", "pettingzoo:mpe2.simple_spread_v3", "--set", "env_cfg.env_kwargs.continuous_actions=true"],
        "unknown --set key 'env_cfg.env_kwargs.continuous_actions'; did you mean 'env_kwargs.continuous_actions'?",
    )
    _bad(capsys, ["train", "ppo", "--set", "novalue"], "KEY=VALUE")
    _bad(capsys, ["train", "ppo", "--set", "update_cfg.n_epochs=many"], "update_cfg.n_epochs")
    _bad(capsys, ["train", "ppo", "--set", "update_cfg.learning_rate=-1"], "update_cfg.learning_rate")


def test_steps_out_of_range(capsys):
    allowed = "allowed: an int >= 1 and <= 2,147,483,647"
    _bad(capsys, ["train", "ppo", "--steps", "0"], "--steps 0 is not allowed", allowed)
    # past int32 the flag is named, not the config field it sets (train_cfg.n_env_steps)
    line = _bad(capsys, ["train", "ppo", "--steps", "3000000000"], "--steps 3000000000 is not allowed", allowed)
    assert "n_env_steps" not in line
    _bad(capsys, ["config", "ppo", "--steps", "3000000000"], "--steps 3000000000 is not allowed")
    whole = "allowed: a whole number of environment steps (100000, 1e6, 1_000_000)"
    for text in ("ten", "1.5", "1e-3", "nan", "inf"):
        _bad(capsys, ["train", "ppo", "--steps", text], f"argument --steps: {text!r} is not allowed", whole)
    _bad(capsys, ["sweep", "ppo", "--grid", "update_cfg.learning_rate=1e-3", "--steps", "1.5"], whole)
    _bad(capsys, ["resume", "nowhere", "--steps", "1.5"], whole)
    _bad(capsys, ["train", "ppo", "--steps", "1e20"], "--steps 100000000000000000000 is not allowed", allowed)


def test_steps_in_scientific_notation_or_with_underscores(capsys):
    """``--steps 1e6`` (how rl-zoo's files and papers write budgets) was refused as not an int."""
    for text, steps in (("2e4", 20_000), ("1.5e3", 1_500), ("1_000", 1_000), ("4096", 4_096)):
        assert main(["config", "ppo", "CartPole-v1", "--steps", text]) == 0
        assert f"n_env_steps: {steps}\n" in capsys.readouterr().out


def test_existing_run_directory_is_left_untouched(capsys, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text("{}")
    _bad(capsys, ["train", "ppo", "--steps", "100", "--run-dir", str(run_dir)], "already exists")
    assert [p.name for p in run_dir.iterdir()] == ["summary.json"]
    assert (run_dir / "summary.json").read_text() == "{}"


def test_what_the_file_system_refuses_is_one_line(capsys, tmp_path):
    """A run directory under a file, a plot into a folder that cannot be written: one line and
    exit status 1, not a traceback from ``pathlib``."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["train", "dqn", "CartPole-v1", "--steps", "64", "--run-dir", str(blocker / "run")]) == 1
    assert capsys.readouterr().err == f"kitae: error: Not a directory: '{blocker / 'run'}'\n"
    run_dir = tmp_path / "run"
    argv = ["train", "dqn", "CartPole-v1", "--steps", "64", "--set", "algo_params.start_step=32"]
    assert main([*argv, "--run-dir", str(run_dir), "--quiet"]) == 0
    capsys.readouterr()
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o500)
    if os.access(read_only, os.W_OK):  # root writes anywhere but in sysfs
        read_only = Path("/sys")
    assert main(["plot", str(run_dir), "-o", str(read_only / "curves.png")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kitae: error: ") and err.count("\n") == 1 and str(read_only) in err, err


def test_runs_started_in_the_same_second_each_claim_their_own_default_directory(capsys, tmp_path, monkeypatch):
    """The default run directory is named by the second a run starts: a second run of the same
    algorithm, environment and seed started then (``kitae train ... &`` with other ``--set``) takes
    ``<name>-2`` instead of writing into the first one's (which crashed one of them, and left a
    config.yaml of one run beside the checkpoints of another)."""
    import kitae.runs.resolve

    taken = tmp_path / "runs" / "dqn-CartPole-v1-s0-20261129-105511"
    monkeypatch.setattr(kitae.runs.resolve, "default_run_dir", lambda *args: taken)
    taken.mkdir(parents=True)
    (taken / "config.yaml").write_text("another run's\n")
    assert main(["train", "dqn", "CartPole-v1", "--steps", "64", "--set", "algo_params.start_step=32", "--quiet"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith(f"-> {taken}-2")
    assert (taken / "config.yaml").read_text() == "another run's\n" and [p.name for p in taken.iterdir()] == [
        "config.yaml"
    ]
    assert (tmp_path / "runs" / f"{taken.name}-2" / "summary.json").is_file()


def test_claim_new_run_dir_never_gives_one_folder_twice(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    from kitae.runs.rundir import claim_new_run_dir

    with ThreadPoolExecutor(8) as pool:
        claimed = list(pool.map(lambda _: claim_new_run_dir(tmp_path / "runs" / "a"), range(16)))
    assert sorted(p.name for p in claimed) == sorted(["a"] + [f"a-{n}" for n in range(2, 17)])


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"kitae {kitae.__version__} (jax {jax.__version__}, jaxlib {metadata.version('jaxlib')}, "
        f"Python {platform.python_version()})"
    )


def test_no_command_is_one_line_naming_the_commands(capsys):
    """It printed the whole help (about 30 lines) to stdout and exited 2."""
    assert main([]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == (
        "kitae: error: a command is needed; allowed: train, sweep, tune, resume, eval, plot, config "
        "(kitae --help tells more)\n"
    )


@pytest.mark.parametrize("command", [["train", "--help"], ["--help"]])
def test_help_says_what_and_shows_an_example(capsys, command):
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "train" in out
    if command[0] == "train":
        assert "examples:" in out and "kitae train dqn CartPole-v1" in out


def test_presets_and_overrides_resolve_in_order(tmp_path):
    from kitae.algos.collections.ppo import PPOParams
    from kitae.runs.presets import resolve

    base = resolve("ppo", PPOParams, EnvSpec.parse("gymnax:CartPole-v1"))
    assert base["n_envs"] == 4 and base["update_cfg"]["learning_rate"] == "lin_2.5e-4"
    gym_preset = resolve("ppo", PPOParams, EnvSpec.parse("CartPole-v1"))
    assert gym_preset["n_envs"] == 8 and gym_preset["update_cfg"]["n_epochs"] == 20
    file = tmp_path / "c.yaml"
    file.write_text(yaml.safe_dump({"n_envs": 2, "update_cfg": {"n_epochs": 3}}))
    resolved = resolve(
        "ppo",
        PPOParams,
        EnvSpec.parse("CartPole-v1"),
        config_file=str(file),
        overrides={"n_envs": 6},
        sets=["update_cfg.n_epochs=5", "algo_params.gamma=0.9"],
    )
    assert resolved["n_envs"] == 6
    assert resolved["update_cfg"]["n_epochs"] == 5 and resolved["update_cfg"]["batch_size"] == 256
    assert resolved["algo_params"]["gamma"] == 0.9
    assert Path(file).exists()


def test_rl_zoos_lunar_lander_and_acrobot_presets_resolve_and_lunar_lander_trains(capsys, tmp_path):
    """LunarLander-v3 (Box2D, the box2d extra): rl-zoo's tuned PPO and DQN settings, resolved from
    the presets and trained for a few hundred steps (what they learn: benchmarks/bench_zoo.py)."""
    pytest.importorskip("Box2D", reason="the box2d extra is not installed")
    from kitae.algos.collections.dqn import DQNParams
    from kitae.algos.collections.ppo import PPOParams
    from kitae.runs.presets import resolve

    ppo = resolve("ppo", PPOParams, EnvSpec.parse("LunarLander-v3"))
    assert ppo["n_envs"] == 16 and ppo["n_env_steps"] == 1_000_000 and ppo["algo_params"]["gamma"] == 0.999
    assert ppo["update_cfg"] == {"learning_rate": 3e-4, "max_grad_norm": 0.5, "max_buffer_size": 1024,
                                 "batch_size": 64, "n_epochs": 4}  # fmt: skip
    dqn = resolve("dqn", DQNParams, EnvSpec.parse("LunarLander-v3"))
    assert dqn["algo_params"]["target_update_interval"] == 250 and dqn["update_cfg"]["learning_rate"] == 6.3e-4
    for env_id in ("Acrobot-v1", "gymnax:Acrobot-v1"):  # rl-zoo's Acrobot settings, in both loops
        acrobot = resolve("ppo", PPOParams, EnvSpec.parse(env_id))
        assert acrobot["n_envs"] == 16 and acrobot["algo_params"]["gae_lambda"] == 0.94
        assert acrobot["algo_params"]["normalize_observations"] and acrobot["update_cfg"]["max_buffer_size"] == 256
        assert resolve("dqn", DQNParams, EnvSpec.parse(env_id))["update_cfg"]["batch_size"] == 128
    run_dir = tmp_path / "lunar"
    assert main(["train", "dqn", "LunarLander-v3", "--steps", "300", "--run-dir", str(run_dir), "--quiet"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 300 and summary["env"] == "gymnasium:LunarLander-v3"
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["algo_params"]["hidden"] == [256, 256] and config["update_cfg"]["batch_size"] == 128


@pytest.mark.parametrize(
    ("message", "extra"),
    [
        ("Box2D is not installed, you can install it by run ...", "box2d"),
        ('MuJoCo is not installed, run `pip install "gymnasium[mujoco]"`', "mujoco"),  # gymnasium 1.3's words
    ],
)
def test_an_environment_whose_package_is_missing_fails_in_one_line(capsys, tmp_path, message, extra):
    """Gymnasium's LunarLander without Box2D printed gymnasium's DependencyNotInstalled as a
    traceback; an environment that needs a missing package is now one line naming it, and the
    extra of kitae's that installs it."""
    import gymnasium as gym

    class NeedsAPackage(gym.Env):
        def __init__(self):
            raise gym.error.DependencyNotInstalled(message)

    name = f"KitaeTestNeeds{extra.capitalize()}-v0"
    gym.register(name, entry_point=NeedsAPackage)
    code = main(["train", "ppo", name, "--steps", "64", "--run-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and not (tmp_path / "r").exists()
    assert err.startswith(f"kitae: error: gymnasium:{name} needs a package that is not installed")
    assert f"pip install 'kitae[{extra}]'" in err and message in err


CORRIDOR = """
import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 0
        return np.eye(4, dtype=np.float32)[self.position], {}

    def step(self, action):
        self.position = max(0, min(3, self.position + (1 if action == 1 else -1)))
        done = self.position == 3
        return np.eye(4, dtype=np.float32)[self.position], float(done), done, False, {}


gym.register("KitaeTestCorridor-v0", entry_point=Corridor, max_episode_steps=20)
"""


def test_import_registers_a_users_own_environment_for_every_command(capsys, tmp_path):
    """``--import MODULE`` (rl-zoo's ``--gym-packages``): a module or ``.py`` file that registers the
    user's Gymnasium environments, imported before the id is resolved; the ``kitae`` script finds
    a module in the current directory, as ``python -m`` does."""
    (tmp_path / "kitae_test_corridor.py").write_text(CORRIDOR)
    run_dir = tmp_path / "corridor"
    train = ["train", "ppo", "KitaeTestCorridor-v0", "--steps", "512", "--run-dir", str(run_dir), "--quiet"]
    assert main(train) == 2  # not registered yet: the message says how
    err = capsys.readouterr().err
    assert "unknown Gymnasium environment 'KitaeTestCorridor-v0'" in err and "kitae's --import MODULE" in err
    assert main([*train, "--import", str(tmp_path / "kitae_test_corridor.py")]) == 0
    assert json.loads((run_dir / "summary.json").read_text())["env"] == "gymnasium:KitaeTestCorridor-v0"
    kitae = Path(sys.executable).parent / "kitae"  # the console script: .venv/bin first on its sys.path
    done = subprocess.run([str(kitae), "eval", str(run_dir), "--episodes", "2", "--import", "kitae_test_corridor"],
                          capture_output=True, text=True, timeout=240)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "gymnasium:KitaeTestCorridor-v0: return" in done.stdout
    (tmp_path / "kitae_test_raises.py").write_text("raise RuntimeError('broken on purpose')\n")
    capsys.readouterr()
    for name, message in [
        ("kitae_test_missing", "--import kitae_test_missing: No module named 'kitae_test_missing' (looked for in"),
        ("missing.py", "--import missing.py: no such file"),
        ("kitae_test_raises", "--import kitae_test_raises failed: RuntimeError: broken on purpose"),
    ]:
        assert main(["eval", str(run_dir), "--import", name]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"kitae: error: {message}") and err.count("\n") == 1, err


def test_the_guides_agent_registered_trains_resumes_and_evaluates_from_the_command_line(capsys, tmp_path):
    """``register_algorithm`` in the module ``--import`` names makes a custom agent a ``kitae train``
    algorithm: its params class's defaults, ``--set`` for the rest, and ``kitae resume`` and ``eval``
    rebuild it from the run's config.yaml (they refused a custom agent's run before)."""
    from kitae.algos.collections import BUILT_IN, get_algorithm

    example = str(Path(__file__).resolve().parents[1] / "examples" / "custom_dqn.py")
    run_dir = tmp_path / "guide"
    sets = [
        "--set",
        "algo_params.exploration=0.1",
        "--set",
        "algo_params.gamma=0.99",
        "--set",
        "algo_params.skip_steps=1",
    ]
    train = [
        "train",
        "custom_dqn",
        "CartPole-v1",
        "--steps",
        "600",
        "--n-envs",
        "4",
        "--run-dir",
        str(run_dir),
        "--quiet",
    ]
    assert main([*train, "--import", example]) == 2  # a field without a default must be given
    # every field without a default named at once
    expected = "DQNParams is missing the fields algo_params.exploration, algo_params.gamma, algo_params.skip_steps"
    assert expected in capsys.readouterr().err
    assert main([*train, *sets, "--import", example, "--set", "train_cfg.save_frequency=300"]) == 0
    agent_cls, params_cls = get_algorithm("custom_dqn")
    assert agent_cls.__module__ == "custom_dqn" and "custom_dqn" not in BUILT_IN
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["algo_params_class"] == "custom_dqn:DQNParams" and config["algo_params"]["exploration"] == 0.1
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2", "--import", example]) == 0
    assert "gymnasium:CartPole-v1: return" in capsys.readouterr().out
    assert main(["resume", str(run_dir), "--steps", "1000", "--quiet", "--import", example]) == 0
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 1000


def test_the_help_lists_kitaes_own_algorithms(capsys):
    from kitae.algos.collections import BUILT_IN
    from kitae.cli import ALGORITHM_NAMES

    assert ALGORITHM_NAMES == BUILT_IN
    assert main(["train", "--help"]) == 0
    assert "a2c, ddpg, dqn, mpo, ppo, ppo_lstm, rnd_ppo, sac, td3, or a name an --import" in " ".join(
        capsys.readouterr().out.split()
    )


def test_register_algorithm_refuses_what_it_cannot_register(restored_registries):
    from dataclasses import dataclass

    from kitae.algos.collections import register_algorithm
    from kitae.algos.collections.dqn import DQN, DQNParams

    @dataclass
    class OtherParams:
        gamma: float = 0.99

    for args, message in [
        (("My-Agent", DQN, DQNParams), "name='My-Agent' is not allowed; allowed: lower-case letters"),
        (("dqn", DQN, DQNParams), "name='dqn' is kitae's own algorithm"),
        (
            ("mine", dict, DQNParams),
            "agent_cls=<class 'dict'> is not allowed; allowed: a subclass of kitae.base.BaseAgent",
        ),
        (("mine", DQN, dict), "params_cls=<class 'dict'> is not allowed; allowed: a dataclass"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            register_algorithm(*args)
    register_algorithm("kitae_test_mine", DQN, OtherParams)
    register_algorithm("kitae_test_mine", DQN, OtherParams)  # the same pair again: nothing changes
    with pytest.raises(ValueError, match="name='kitae_test_mine' is registered already, for kitae.algos"):
        register_algorithm("kitae_test_mine", DQN, DQNParams)


def test_steps_override_a_config_files_train_cfg_budget(tmp_path):
    """--steps (merged after the file) wins over a file's train_cfg.n_env_steps; a file that gives
    the budget twice, differently, is refused."""
    from kitae.algos.collections.ppo import PPOParams
    from kitae.runs.presets import resolve

    file = tmp_path / "c.yaml"
    file.write_text(yaml.safe_dump({"train_cfg": {"n_env_steps": 100_000, "log_frequency": 500}}))
    spec = EnvSpec.parse("gymnax:CartPole-v1")
    assert resolve("ppo", PPOParams, spec, config_file=str(file))["n_env_steps"] == 100_000
    resolved = resolve("ppo", PPOParams, spec, config_file=str(file), overrides={"n_env_steps": 2048})
    assert resolved["n_env_steps"] == 2048 and resolved["train_cfg"] == {"log_frequency": 500}
    file.write_text(yaml.safe_dump({"n_env_steps": 10, "train_cfg": {"n_env_steps": 20}}))
    with pytest.raises(ValueError, match="n_env_steps=10 and train_cfg.n_env_steps=20"):
        resolve("ppo", PPOParams, spec, config_file=str(file))


# ---------------------------------------------------------------------------------------------
# resume, eval, plot
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A finished compiled run with checkpoints at 2048 and 4096 steps (made once, copied per test)."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    assert (
        main(
            [
                "train",
                "ppo",
                "gymnax:CartPole-v1",
                "--steps",
                "4096",
                "--run-dir",
                str(run_dir),
                "--quiet",
                "--set",
                "update_cfg.learning_rate=1e-3",
                "--set",
                "train_cfg.save_frequency=2048",
            ]
        )
        == 0
    )
    return run_dir


@pytest.fixture
def run_copy(trained_run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(trained_run, copy)
    return copy


def _snapshot(run_dir: Path) -> dict:
    import hashlib

    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def test_eval_reports_mean_and_std_and_records_a_video(capsys, run_copy):
    """The summary's return was checked to lie in CartPole's range and its std to be >= 0: a std
    always 0 passed. Now both are the mean and std of the episodes' returns, which ``eval_run``
    (the same seed, 0, and episodes) gives back, and those returns are not all equal."""
    from kitae.runs.evaluation import eval_run

    assert main(["eval", str(run_copy), "--episodes", "7", "--video"]) == 0
    out = capsys.readouterr().out
    assert "gymnax:CartPole-v1: return" in out and "over 7 episodes" in out and "checkpoint step 4,096" in out
    summary = json.loads((run_copy / "summary.json").read_text())
    assert summary["eval_episodes"] == 7 and summary["eval_step"] == 4096
    returns = eval_run(run_copy, episodes=7, seed=0)["returns"][0]  # rewrites the summary: read above
    assert len(returns) == 7 and all(8 <= r <= 500 for r in returns)
    assert len(set(returns)) > 1, returns  # a std of 0 would not be told from one never computed
    assert summary["eval_return"] == pytest.approx(np.mean(returns), rel=1e-6)
    assert summary["eval_return_std"] == pytest.approx(np.std(returns), rel=1e-6)
    assert f"return {np.mean(returns):.2f} +- {np.std(returns):.2f} over 7 episodes" in out
    assert summary["state_fingerprint"]  # the training summary is kept
    videos = list((run_copy / "videos").glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 1000


def test_a_minatar_run_is_filmed_by_gymnaxs_visualizer(capsys, tmp_path):
    """gymnax ids without a Gymnasium twin were refused; those gymnax's visualizer draws (MinAtar,
    Catch, the mazes...) are filmed from their states: the reset's frame and one per step."""
    from moviepy import VideoFileClip

    from kitae.envs.jax_env import GymnaxEnv
    from kitae.loops.evaluate import play_episode
    from kitae.runs.load import load_agent

    run_dir = tmp_path / "breakout"
    assert main(["train", "ppo", "gymnax:Breakout-MinAtar", "--steps", "256", "--run-dir", str(run_dir), "--quiet",
                 "--set", "update_cfg.max_buffer_size=16", "--set", "update_cfg.batch_size=32"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "1", "--video", "--seed", "3"]) == 0
    video = run_dir / "videos" / "eval-step256-episode-0.mp4"
    assert capsys.readouterr().out.strip().endswith(f"video: {video}")
    frames: list = []
    play_episode(load_agent(run_dir), GymnaxEnv("Breakout-MinAtar"), seed=3, frames=frames)
    clip = VideoFileClip(str(video))
    assert clip.fps == 10 and clip.size == [600, 500] and clip.n_frames == len(frames) >= 2
    clip.close()


@pytest.mark.parametrize("env_id", ["jaxmarl:coin_game", "envpool:CheetahRun-v1", "gymnax:SimpleBandit-bsuite"])
def test_a_video_of_an_environment_that_cannot_be_filmed_is_refused_by_name(env_id, tmp_path):
    from kitae.envs.make import EnvSpec
    from kitae.runs.evaluation import record_video

    with pytest.raises(RunError, match=rf"--video: {env_id} cannot be filmed; allowed: Gymnasium, PettingZoo and Brax"):
        record_video(None, EnvSpec.parse(env_id), tmp_path, "x")
    assert not list(tmp_path.iterdir())


def test_a_video_of_an_environment_that_does_not_render_is_refused_by_name(tmp_path):
    """BitFlipping has no render_mode (it printed Gymnasium's warning and a TypeError's text); an
    environment that takes the mode but draws nothing is refused at its first frame."""
    import gymnasium as gym
    import numpy as np

    from kitae.envs.make import EnvSpec
    from kitae.runs import preset_agent
    from kitae.runs.evaluation import record_video

    with pytest.raises(RunError, match=r"--video: gymnasium:BitFlipping-v0 does not render frames"):
        record_video(None, EnvSpec.parse("BitFlipping-v0"), tmp_path, "x")

    class Blank(gym.Env):
        metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
        observation_space = gym.spaces.Box(-1.0, 1.0, (4,))
        action_space = gym.spaces.Discrete(2)

        def __init__(self, render_mode=None):
            self.render_mode, self.t = render_mode, 0

        def reset(self, *, seed=None, options=None):
            self.t = 0
            return np.zeros(4, np.float32), {}

        def step(self, action):
            self.t += 1
            return np.zeros(4, np.float32), 1.0, self.t >= 2, False, {}

        def render(self):
            return None

    gym.register("KitaeTestBlank-v0", entry_point=Blank)
    agent, env = preset_agent("ppo", "CartPole-v1", steps=256, run_dir=tmp_path / "r")
    env.close()
    with pytest.raises(RunError, match=r"KitaeTestBlank-v0 does not render frames .*returned no frame"):
        record_video(agent, EnvSpec.parse("KitaeTestBlank-v0"), tmp_path / "videos", "x")
    assert not (tmp_path / "videos").exists()


def test_a_mujoco_environment_is_filmed_without_a_display_or_refused_in_one_line(capsys, tmp_path, monkeypatch):
    """Gymnasium's MuJoCo environments draw through OpenGL, by default GLFW, which needs a display:
    ``kitae eval --video`` printed MuJoCo's FatalError as a traceback. Without ``DISPLAY`` kitae now
    picks EGL (or OSMesa); a backend that cannot draw here is one line naming it."""
    from kitae.envs.make import offscreen_gl

    if offscreen_gl() is None:
        pytest.skip("this machine has neither an EGL nor an OSMesa library to draw MuJoCo off screen")
    run_dir = tmp_path / "pendulum"
    assert main(["train", "td3", "InvertedPendulum-v5", "--steps", "300", "--run-dir", str(run_dir), "--quiet",
                 "--set", "algo_params.start_step=100"]) == 0  # fmt: skip
    capsys.readouterr()
    for name in ("DISPLAY", "WAYLAND_DISPLAY", "MUJOCO_GL"):
        monkeypatch.delenv(name, raising=False)
    assert main(["eval", str(run_dir), "--episodes", "1", "--video"]) == 0
    video = run_dir / "videos" / "eval-step300-episode-0.mp4"
    assert capsys.readouterr().out.strip().endswith(f"video: {video}") and video.stat().st_size > 1000
    video.unlink()
    monkeypatch.setenv("MUJOCO_GL", "glfw")  # the default, which needs a display
    assert main(["eval", str(run_dir), "--episodes", "1", "--video"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kitae: error: --video: gymnasium:InvertedPendulum-v5 could not draw a frame here")
    assert "(MUJOCO_GL=glfw;" in err and "\n" not in err and not video.exists()


def test_a_reader_that_closes_the_pipe_early_ends_the_command_quietly(run_copy):
    """``kitae eval RUN_DIR | head -0``: the reader is gone before the command prints; it ends with
    the status of a process SIGPIPE ended (141), without an error line (it said "kitae: error:
    Broken pipe" with status 1)."""
    command = [sys.executable, "-m", "kitae.cli", "eval", str(run_copy), "--episodes", "1"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process.stdout.close()  # before the interpreter has even started: the command prints later
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141 and err == "", err


@pytest.mark.parametrize("damaged", ['{"steps": 10', "[1, 2]"], ids=["truncated", "a list"])
def test_eval_leaves_a_damaged_summary_as_it_is_and_says_so(capsys, run_copy, damaged):
    """A list gave an AttributeError traceback; a truncated file was silently replaced by one
    holding the evaluation's fields alone (the run's steps, final return and fingerprint lost)."""
    (run_copy / "summary.json").write_text(damaged)
    assert main(["eval", str(run_copy), "--episodes", "1"]) == 0
    captured = capsys.readouterr()
    assert "over 1 episode" in captured.out
    assert captured.err.startswith("kitae: warning:") and "summary.json is not a JSON object" in captured.err
    assert len(captured.err.strip().splitlines()) == 1, captured.err
    assert (run_copy / "summary.json").read_text() == damaged


def test_an_evaluation_adds_its_figures_after_the_run_has_written_its_summary(tmp_path):
    """``kitae eval`` on a run that is ending read summary.json, then the run wrote its own, then
    the evaluation replaced it with the old one plus its figures: the run's summary was lost. The
    two writers now take turns (``summary_lock``, a ``flock`` on config.yaml): an evaluation that
    finds the lock held waits, then adds its figures to the summary the run wrote."""
    import fcntl
    import threading

    from kitae.runs.rundir import add_to_summary, write_summary

    (tmp_path / "config.yaml").write_text("seed: 0\n")
    write_summary(tmp_path, steps=512)  # the summary so far (an earlier segment's, or none)
    with open(tmp_path / "config.yaml") as held:  # the run, writing its final summary
        fcntl.flock(held, fcntl.LOCK_EX)
        evaluation = threading.Thread(target=add_to_summary, args=(tmp_path,), kwargs={"eval_return": 7.0})
        evaluation.start()
        evaluation.join(timeout=0.5)
        assert evaluation.is_alive()  # waiting for the run's write, not reading the old summary
        write_summary(tmp_path, steps=1024, final_return=500.0)
    evaluation.join(timeout=10)
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "steps": 1024,
        "final_return": 500.0,
        "eval_return": 7.0,
    }
    (tmp_path / "config.yaml").unlink()  # no config.yaml (a damaged run): no lock to take, the figures still go in
    assert add_to_summary(tmp_path, eval_step=1024)["eval_step"] == 1024


def test_eval_of_one_episode_says_one_episode(capsys, run_copy):
    assert main(["eval", str(run_copy), "--episodes", "1"]) == 0
    assert "over 1 episode (deterministic policy" in capsys.readouterr().out


def test_eval_of_a_run_of_several_seeds_reports_each_seed_and_films_the_first(capsys, tmp_path):
    run_dir = tmp_path / "two"
    assert main(["train", "ppo", "gymnax:CartPole-v1", "--steps", "1024", "--seeds", "2", "--seed", "5",
                 "--run-dir", str(run_dir), "--quiet"]) == 0  # fmt: skip
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2", "--video"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split(":")[1] for line in lines[:2]] == ["CartPole-v1 seed 5", "CartPole-v1 seed 6"], lines
    assert all("over 2 episodes (deterministic policy, checkpoint step 1,024)" in line for line in lines[:2])
    assert lines[2].startswith("video (seed 5): ") and len(lines) == 3, lines
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["eval_return"]) == len(summary["eval_return_std"]) == 2 and summary["eval_episodes"] == 2
    assert len(list((run_dir / "videos").glob("*.mp4"))) == 1


def test_plot_puts_several_runs_on_one_figure(capsys, run_copy, trained_run, tmp_path):
    out = tmp_path / "both.png"
    assert main(["plot", str(trained_run), str(run_copy), "-o", str(out)]) == 0
    assert out.stat().st_size > 10_000 and capsys.readouterr().out.strip() == str(out)


def test_plot_of_a_run_that_lost_its_config_reads_its_metrics(capsys, run_copy, trained_run, tmp_path):
    """The curves are all in metrics.jsonl: a run whose config.yaml was deleted still plots (one
    warning line), alone or beside a whole run; without metrics.jsonl either it is refused."""
    (run_copy / "config.yaml").unlink()
    out = tmp_path / "lost.png"
    assert main(["plot", str(run_copy), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert out.stat().st_size > 10_000 and captured.out.strip() == str(out)
    warning = [line for line in captured.err.splitlines() if line.strip()]
    assert len(warning) == 1 and warning[0].startswith("kitae: warning:") and "no config.yaml" in warning[0], warning
    assert main(["plot", str(trained_run), str(run_copy), "-o", str(tmp_path / "both.png")]) == 0
    capsys.readouterr()
    (run_copy / "metrics.jsonl").unlink()
    _bad(capsys, ["plot", str(run_copy)], "it has no config.yaml")


def test_plot_smooths_each_seed_over_window_episodes(capsys, trained_run, tmp_path):
    import numpy as np

    from kitae.runs.plotting import _smooth

    steps, returns, grid = np.array([10.0, 20.0, 30.0]), np.array([1.0, 3.0, 5.0]), np.array([10.0, 15.0, 20.0, 30.0])
    assert _smooth(steps, returns, grid, window=1).tolist() == [1.0, 2.0, 3.0, 5.0]  # each episode, interpolated
    assert _smooth(steps, returns, grid, window=2).tolist() == [1.0, 1.5, 2.0, 4.0]  # (3 + 5) / 2 at step 30
    assert _smooth(steps, returns, grid, window=10).tolist() == [1.0, 1.5, 2.0, 3.0]  # all three so far
    images = {}
    for window in ("1", "100"):
        out = tmp_path / f"w{window}.png"
        assert main(["plot", str(trained_run), "-o", str(out), "--window", window]) == 0
        images[window] = out.read_bytes()
    assert images["1"] != images["100"]


def test_a_runs_config_yaml_trains_the_same_run_again(capsys, trained_run, tmp_path):
    """``kitae train ALGO ENV --config RUN_DIR/config.yaml`` trains with that run's whole config:
    the same config.yaml and, one seed deciding a run, the same bits; another ALGO is refused.
    Into a directory that holds only that config.yaml (a sweep's combination not started): a
    directory whose config.yaml is another run's is refused."""
    again = tmp_path / "again"
    again.mkdir()
    config = trained_run / "config.yaml"
    (again / "config.yaml").write_text(config.read_text())
    argv = ["train", "ppo", "gymnax:CartPole-v1", "--config", str(config), "--run-dir", str(again), "--quiet"]
    _bad(capsys, [*argv, "--steps", "2048"], "already exists and is not empty")
    assert [p.name for p in again.iterdir()] == ["config.yaml"]
    assert main(argv) == 0
    assert (again / "config.yaml").read_text() == config.read_text()
    first = json.loads((trained_run / "summary.json").read_text())
    assert json.loads((again / "summary.json").read_text())["state_fingerprint"] == first["state_fingerprint"]
    _bad(capsys, ["train", "dqn", "gymnax:CartPole-v1", "--config", str(config)], "algo_params_class PPOParams")
    custom = tmp_path / "custom.yaml"  # a custom agent's run: its params class named with its module
    custom.write_text(
        config.read_text().replace("algo_params_class: PPOParams", "algo_params_class: my_agents:PPOParams")
    )
    _bad(capsys, ["train", "ppo", "gymnax:CartPole-v1", "--config", str(custom)], "custom agent's run", "--import")


def test_resume_of_a_finished_run_says_so_and_changes_nothing(capsys, run_copy):
    before = _snapshot(run_copy)
    _bad(capsys, ["resume", str(run_copy)], "already reached step 4,096 of 4,096", "--steps")
    _bad(capsys, ["resume", str(run_copy), "--steps", "3000"], "already reached step 4,096")
    _bad(capsys, ["resume", str(run_copy), "--steps", "0"], "--steps 0 is not allowed")
    _bad(
        capsys,
        ["resume", str(run_copy), "--steps", "3000000000"],
        "--steps 3000000000 is not allowed",
        "<= 2,147,483,647",
    )
    assert _snapshot(run_copy) == before


@pytest.mark.parametrize("evaluated", [False, True])
def test_resume_of_a_run_stopped_at_its_end_before_its_summary_writes_it(capsys, run_copy, evaluated):
    """A run killed after its last checkpoint, while it wrote its summary (as a host sweep's
    combination could be), has trained every step: ``kitae resume`` once refused it as "already
    reached"; now it writes the summary the run would have written, trains nothing, and is then
    refused as any finished run is. ``kitae eval`` in between (which writes its fields into a new
    ``summary.json``) does not make it look finished (it was then refused as "already reached")."""
    summary = json.loads((run_copy / "summary.json").read_text())
    (run_copy / "summary.json").unlink()
    (run_copy / "curve.png").unlink(missing_ok=True)
    if evaluated:
        assert main(["eval", str(run_copy), "--episodes", "1"]) == 0
        assert "eval_return" in json.loads((run_copy / "summary.json").read_text())
        capsys.readouterr()
    checkpoints = sorted(p.name for p in (run_copy / "checkpoints").iterdir())
    assert main(["resume", str(run_copy)]) == 0
    captured = capsys.readouterr()
    assert f"finishing {run_copy}: it reached step 4,096 of 4,096" in captured.err, captured.err
    assert ": 4,096 steps, final return" in captured.out and "nothing left to train" in captured.out, captured.out
    again = json.loads((run_copy / "summary.json").read_text())
    assert again["steps"] == 4096 and "resumed_from" not in again
    assert again["state_fingerprint"] == summary["state_fingerprint"]
    assert again["final_return"] == summary["final_return"] and (run_copy / "curve.png").exists()
    assert sorted(p.name for p in (run_copy / "checkpoints").iterdir()) == checkpoints
    _bad(capsys, ["resume", str(run_copy)], "already reached step 4,096 of 4,096", "--steps")


def test_bad_run_directories(capsys, run_copy, tmp_path):
    for command in (["resume"], ["eval"], ["plot"]):
        _bad(capsys, [*command, str(tmp_path / "missing")], "does not exist")
        # tmp_path holds run_copy: a folder of runs (a sweep that lost its plan) names one
        _bad(capsys, [*command, str(tmp_path)], "not a kitae run directory", f"e.g. {str(run_copy)!r}")
        _bad(capsys, [*command, str(run_copy / "checkpoints")], "it has no config.yaml")
    (run_copy / "config.yaml").write_text("seed: [1,\n")
    before = _snapshot(run_copy)
    for command in (["resume"], ["eval"], ["plot"]):
        _bad(capsys, [*command, str(run_copy)], "config.yaml", "unusable")
    assert _snapshot(run_copy) == before


def test_missing_and_damaged_checkpoints(capsys, run_copy, tmp_path):
    """A run with no checkpoint cannot be resumed; the line gives the command that starts it again:
    into a new directory, or into its own where that holds only its config.yaml."""
    import shutil

    shutil.rmtree(run_copy / "checkpoints")
    again = f"kitae train ppo gymnax:CartPole-v1 --config {run_copy}/config.yaml --run-dir NEW_DIR"
    _bad(capsys, ["resume", str(run_copy), "--steps", "8192"], "no checkpoint in", "before its first checkpoint", again)
    # eval does not say the run stopped (it may be training still) nor print resume's command
    _bad(capsys, ["eval", str(run_copy)], "no checkpoint in", "nothing to load yet", "kitae resume RUN_DIR says how")
    only = tmp_path / "only"
    only.mkdir()
    shutil.copy(run_copy / "config.yaml", only / "config.yaml")
    line = _bad(capsys, ["resume", str(only)], f"--config {only}/config.yaml --run-dir {only}")
    assert line.endswith(f"--run-dir {only}"), line  # one seed: no "[--seeds K]" placeholder


def test_damaged_checkpoints_fall_back_or_fail_cleanly(capsys, run_copy):
    def damage(step: int) -> None:
        for path in (run_copy / "checkpoints" / str(step)).rglob("*"):
            if path.is_file() and path.parent.name == "d":
                path.write_bytes(path.read_bytes()[:10])

    damage(4096)
    assert main(["eval", str(run_copy), "--episodes", "2"]) == 0
    captured = capsys.readouterr()
    warning = [line for line in captured.err.splitlines() if line.strip()]
    assert len(warning) == 1 and warning[0].startswith("kitae: warning: checkpoint step 4096"), captured.err
    assert "using checkpoint step 2048" in warning[0] and "checkpoint step 2,048" in captured.out
    damage(2048)
    before = _snapshot(run_copy)
    _bad(capsys, ["resume", str(run_copy), "--steps", "8192"], "no readable checkpoint", "step 4096", "step 2048")
    assert _snapshot(run_copy) == before


def test_bad_eval_and_plot_arguments(capsys, run_copy, tmp_path):
    before = _snapshot(run_copy)
    _bad(capsys, ["eval", str(run_copy), "--episodes", "0"], "--episodes 0 is not allowed")
    _bad(capsys, ["eval", str(run_copy), "--episodes", "-3"], "--episodes -3 is not allowed")
    _bad(capsys, ["eval", str(run_copy), "--episodes", "many"], "'many' is not an int")
    # Gymnasium's reset raised on a negative seed: a traceback before
    _bad(capsys, ["eval", str(run_copy), "--seed", "-1"], "-1 is not allowed; allowed: an int in [0, 2**32)")
    _bad(capsys, ["eval", str(run_copy), "--seed", str(2**32)], "allowed: an int in [0, 2**32)")
    _bad(capsys, ["plot", str(run_copy), "-o", str(tmp_path / "curve.txt")], ".png")
    _bad(capsys, ["plot", str(run_copy), "-o", str(tmp_path / "nowhere" / "c.png")], "does not exist")
    _bad(capsys, ["plot", str(run_copy), "--window", "0"], "--window 0 is not allowed; allowed: an int >= 1")
    _bad(capsys, ["plot"], "RUN_DIR")
    _bad(capsys, ["resume"], "RUN_DIR")
    (run_copy / "metrics.jsonl").write_text("")
    _bad(capsys, ["plot", str(run_copy)], "no finished episodes")
    assert {k: v for k, v in _snapshot(run_copy).items() if k != "metrics.jsonl"} == {
        k: v for k, v in before.items() if k != "metrics.jsonl"
    }


@pytest.mark.parametrize(
    "command,example",
    [
        (["resume", "--help"], "kitae resume runs/ppo --steps 1000000"),
        (["eval", "--help"], "kitae eval runs/ppo --episodes 100 --video"),
        (["plot", "--help"], "kitae plot runs/ppo-a runs/ppo-b -o compare.png"),
        (["config", "--help"], "kitae train dqn CartPole-v1 --config dqn.yaml"),
    ],
)
def test_every_command_has_help_with_an_example(capsys, command, example):
    assert main(command) == 0
    out = capsys.readouterr().out
    assert "examples:" in out and example in out


def test_a_run_in_which_no_episode_ended_writes_strict_json(capsys, tmp_path):
    """100 steps of Pendulum (episodes of 200): no final return. ``summary.json`` and the printed
    line say ``null`` (JSON has no NaN; strict readers refuse Python's default ``NaN``)."""
    run_dir = tmp_path / "run"
    argv = ["train", "sac", "Pendulum-v1", "--steps", "100", "--run-dir", str(run_dir), "--quiet"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert "final return - (no episode ended)" in out[0], out
    strict = {"parse_constant": lambda name: pytest.fail(f"{name} in strict JSON")}
    assert json.loads(out[1], **strict)["final_return"] is None
    assert json.loads((run_dir / "summary.json").read_text(), **strict)["final_return"] is None


def test_json_safe_writes_non_finite_floats_as_null():
    import numpy as np

    from kitae.runs.rundir import json_safe

    value = {"a": float("nan"), "b": [1.5, float("inf"), np.float32(-np.inf)], "c": np.asarray([2.0, np.nan]), "d": 3}
    assert json_safe(value) == {"a": None, "b": [1.5, None, None], "c": [2.0, None], "d": 3}
    assert np.isnan(np.asarray(json_safe([float("nan")]), float)).all()  # read back as nan


def test_kitaes_own_warnings_print_in_one_line(capsys):
    """A warning raised in kitae's code (EnvPool ids train in the host loop) prints as one
    ``kitae: warning:`` line on the command line; other libraries' keep Python's display."""
    import kitae.cli
    import kitae.runs.resolve

    seen = []
    show = kitae.cli._warnings_in_one_line(lambda *args: seen.append(args))
    show(UserWarning("envpool: environments train in the host loop"), UserWarning, kitae.runs.resolve.__file__, 137)
    assert capsys.readouterr().err == "kitae: warning: envpool: environments train in the host loop\n"
    show(UserWarning("elsewhere"), UserWarning, json.__file__, 1)
    assert len(seen) == 1 and capsys.readouterr().err == ""


def test_a_run_named_in_a_script_the_font_lacks_plots_without_warnings(tmp_path):
    """A run directory named "my run 日本" printed one matplotlib "Glyph ... missing from font"
    warning per character, as kitae's own, also with --quiet."""
    import warnings

    import numpy as np

    from kitae.runs.plotting import plot_curves

    curves = {0: (np.asarray([10.0, 20.0, 30.0]), np.asarray([1.0, 2.0, 3.0]))}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plot_curves({"ppo CartPole-v1": curves}, tmp_path / "curve.png", title="my run 日本")
    assert (tmp_path / "curve.png").stat().st_size > 0
