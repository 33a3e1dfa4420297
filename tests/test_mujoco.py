"""Gymnasium's MuJoCo tasks: the PPO and SAC presets every one of them gets, and a short run on a
real one.

What the presets learn is a benchmark (``benchmarks/bench_zoo.py Hopper-v5``, BENCHMARKS.md).
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import yaml

from kitae.algos.collections import PPO
from kitae.cli import main
from kitae.envs.make import EnvSpec
from kitae.runs.presets import PRESETS_DIR, load_preset

pytest.importorskip("mujoco")  # the mujoco extra; make install has it

PRESETS = {
    # CleanRL's ppo_continuous_action settings
    "ppo": {
        "n_envs": 1,
        "n_env_steps": 1_000_000,
        "algo_params": {
            "gamma": 0.99,
            "gae_lambda": 0.95,
            "clip_coef": 0.2,
            "clip_value_loss": True,
            "entropy_coef": 0.0,
            "value_coef": 0.5,
            "normalize_observations": True,
            "normalize_rewards": True,
        },
        "update_cfg": {
            "learning_rate": "lin_3.0e-4",
            "max_grad_norm": 0.5,
            "max_buffer_size": 2048,
            "batch_size": 64,
            "n_epochs": 10,
        },
    },
    # rl-zoo's: SB3's defaults, learning after 10,000 random steps
    "sac": {
        "n_envs": 1,
        "n_env_steps": 1_000_000,
        "algo_params": {"gamma": 0.99, "tau": 0.005, "start_step": 10_000, "autotune": True},
        "update_cfg": {"learning_rate": 3e-4, "max_buffer_size": 1_000_000, "batch_size": 256, "n_epochs": 1},
    },
}


def _mujoco_sections(algo: str, source: str) -> list[str]:
    sections = yaml.safe_load((PRESETS_DIR / f"{algo}.yaml").read_text())
    return [k for k in sections if k.startswith(f"{source}:") and k.endswith("-v5")]


@pytest.mark.parametrize("algo", sorted(PRESETS))
def test_every_mujoco_task_of_gymnasium_has_the_preset_and_no_other_id_does(algo):
    """The preset names every MuJoCo task Gymnasium registers at v5, and EnvPool's ports of them,
    each an id that exists, and each gets the preset's settings over the default section (a typo
    in an id would leave its task on the default's settings without a word)."""
    registered = sorted(
        name
        for name, spec in gym.registry.items()
        if name.endswith("-v5") and "mujoco" in str(spec.entry_point) and "/" not in name
    )
    assert sorted(k.removeprefix("gymnasium:") for k in _mujoco_sections(algo, "gymnasium")) == registered
    ported = [k for k in _mujoco_sections(algo, "envpool") if k.removeprefix("envpool:") in registered]  # not Atari
    assert sorted(k.removeprefix("envpool:") for k in ported) == registered
    assert "Hopper-v5" in registered and "HalfCheetah-v5" in registered
    envpool = pytest.importorskip("envpool")
    assert set(registered) <= set(envpool.list_all_envs())
    for section in _mujoco_sections(algo, "gymnasium") + ported:
        preset = load_preset(algo, EnvSpec.parse(section))
        for key, value in PRESETS[algo].items():
            assert (preset[key] if not isinstance(value, dict) else {k: preset[key][k] for k in value}) == value


def test_a_mujoco_run_trains_with_the_preset_and_evaluates(tmp_path):
    """``kitae train ppo Hopper-v5`` on the real environment: the preset's config reaches the run
    (a bare id is Gymnasium's), the normalisation statistics count every step, and the run
    evaluates."""
    run_dir = tmp_path / "hopper"
    argv = ["train", "ppo", "Hopper-v5", "--steps", "256", "--run-dir", str(run_dir), "--quiet"]
    argv += ["--set", "update_cfg.max_buffer_size=128"]  # two updates in 256 steps
    assert main(argv) == 0
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["env_cfg"]["n_envs"] == 1
    assert config["algo_params"]["normalize_observations"] and config["algo_params"]["normalize_rewards"]
    assert config["update_cfg"]["n_epochs"] == 10 and config["update_cfg"]["batch_size"] == 64
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["env"] == "gymnasium:Hopper-v5" and summary["steps"] == 256
    state = PPO.unserialize(run_dir).state
    assert float(state.observation_statistics.count) == 256  # every observation went into the statistics
    assert float(state.return_statistics.count) == 256
    assert main(["eval", str(run_dir), "--episodes", "1"]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_episodes"] == 1 and np.isfinite(summary["eval_return"])
