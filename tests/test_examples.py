"""The examples a user copies run as written (short runs; ``examples/custom_dqn.py`` is checked
in ``tests/test_agents.py``). Brax's and EnvPool Pong's examples are left out for their compile
time (minutes on 2 cores); ``tests/test_brax.py`` and ``tests/test_envpool.py`` train the same
agents through ``kitae train``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(tmp_path: Path, *args: str) -> list[str]:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / args[0]), *args[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().splitlines()


@pytest.mark.parametrize("network", ["haiku", "flax"])
def test_the_functional_dqn_example_prints_its_json_line(tmp_path, network):
    report = json.loads(_run(tmp_path, "functional_dqn.py", "--seed", "0", "--steps", "2000", "--network", network)[-1])
    assert report["network"] == network and report["steps"] == 2000
    assert report["episodes"] > 0 and report["gradient_steps"] > 0 and report["final_return"] > 0


def test_the_pettingzoo_example_trains_shared_parameters_in_process(tmp_path):
    lines = _run(tmp_path, "multi_agent_simple_spread.py", "2000", "--in-process")
    team = [i for i, line in enumerate(lines) if line.startswith("team return: first 100 episodes")]
    assert len(team) == 1 and "uniformly random policy" in lines[team[0]], lines
    assert [line.split(":")[0].strip() for line in lines[team[0] + 1 :]] == ["agent_0", "agent_1", "agent_2"]
    assert (tmp_path / "runs" / "example-simple-spread" / "logs").is_dir()


def test_the_jaxmarl_example_trains_in_one_program(tmp_path):
    lines = _run(tmp_path, "ippo_jaxmarl_simple_spread.py", "4096", "2")
    assert any(line.startswith("compile ") and "over 2 seeds" in line for line in lines), lines
    assert [line.split(":")[0] for line in lines if line.startswith("seed ")] == ["seed 0", "seed 1"]


def test_the_multi_discrete_example_prints_its_json_line(tmp_path):
    report = json.loads(_run(tmp_path, "multi_discrete.py", "2048", "1")[-1])
    assert report["steps"] >= 2048 and report["seed"] == 1 and abs(report["random_return"] - 26 / 9) < 1e-9
    assert 0 <= report["final_return"] <= 8 and 0 <= report["eval_return"] <= 8
    assert (tmp_path / "runs" / "match-ppo-s1" / "summary.json").is_file()
