"""The examples a user copies run as written (short runs; ``examples/custom_dqn.py`` is checked
in ``tests/test_agents.py``). Brax's and EnvPool Pong's examples are left out for their compile
time (minutes on 2 cores); ``tests/test_brax.py`` and ``tests/test_envpool.py`` train the same
agents through ``kitae train``. Every example's command line answers ``--help`` and refuses a
mistake with argparse's usage and one line, without training."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))


def _call(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / args[0]), *args[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )


def _run(tmp_path: Path, *args: str) -> list[str]:
    result = _call(tmp_path, *args)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().splitlines()


def test_every_example_is_covered():
    assert len(SCRIPTS) == 7 and "functional_dqn.py" in SCRIPTS and "ppo_envpool_pong.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_example_answers_help(tmp_path, script):
    result = _call(tmp_path, script, "--help")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith(f"usage: {script} "), result.stdout
    summary = ast.get_docstring(ast.parse((EXAMPLES / script).read_text())).splitlines()[0]
    assert summary in result.stdout  # the docstring is the description
    assert "-h, --help" in result.stdout and not list(tmp_path.iterdir())  # nothing trained, nothing written


# A mistake in each example's command line: argparse's usage, then one line naming the argument,
# the value and what is allowed (or the flag argparse does not know), status 2, before anything trains.
ZERO = "N_ENV_STEPS 0 is not allowed; allowed: an int >= 1"
MISTAKES = [
    *((script, ["0"], ZERO) for script in SCRIPTS if script != "functional_dqn.py"),
    ("functional_dqn.py", ["--steps", "0"], "--steps 0 is not allowed; allowed: an int >= 1"),
    ("functional_dqn.py", ["--steps", "-5"], "--steps -5 is not allowed; allowed: an int >= 1"),
    ("functional_dqn.py", ["--seed", "x"], "argument --seed: invalid int value: 'x'"),
    ("custom_dqn.py", ["3000", "-1"], "SEED -1 is not allowed; allowed: an int >= 0"),
    ("ippo_jaxmarl_simple_spread.py", ["5000", "0"], "N_SEEDS 0 is not allowed; allowed: an int >= 1"),
    ("multi_agent_simple_spread.py", ["--help-me"], "unrecognized arguments: --help-me"),
    ("multi_discrete.py", ["2048", "1", "--steps", "5"], "unrecognized arguments: --steps 5"),
]  # fmt: skip


@pytest.mark.parametrize(("script", "args", "said"), MISTAKES, ids=[f"{m[0]} {' '.join(m[1])}" for m in MISTAKES])
def test_a_mistake_is_refused_before_anything_trains(tmp_path, script, args, said):
    result = _call(tmp_path, script, *args)
    assert result.returncode == 2 and result.stdout == "", result.stdout[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith(f"usage: {script} ") and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[-1].startswith(f"{script}: error: ") and said in lines[-1], result.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("network", ["haiku", "flax"])
def test_the_functional_dqn_example_prints_its_json_line(tmp_path, network):
    report = json.loads(_run(tmp_path, "functional_dqn.py", "--seed", "0", "--steps", "2000", "--network", network)[-1])
    assert report["network"] == network and report["steps"] == 2000
    assert report["episodes"] > 0 and report["gradient_steps"] > 0 and report["final_return"] > 0


def test_the_pettingzoo_example_trains_shared_parameters_in_process(tmp_path):
    lines = _run(tmp_path, "multi_agent_simple_spread.py", "2000", "--in-process", "--run-dir", "team")
    team = [i for i, line in enumerate(lines) if line.startswith("team return: first 100 episodes")]
    assert len(team) == 1 and "uniformly random policy" in lines[team[0]], lines
    assert [line.split(":")[0].strip() for line in lines[team[0] + 1 :]] == ["agent_0", "agent_1", "agent_2"]
    assert (tmp_path / "team" / "logs").is_dir() and not (tmp_path / "runs").exists()


def test_the_jaxmarl_example_trains_in_one_program(tmp_path):
    lines = _run(tmp_path, "ippo_jaxmarl_simple_spread.py", "4096", "2")
    assert any(line.startswith("compile ") and "over 2 seeds" in line for line in lines), lines
    assert [line.split(":")[0] for line in lines if line.startswith("seed ")] == ["seed 0", "seed 1"]


def test_the_multi_discrete_example_prints_its_json_line_and_refuses_a_second_run(tmp_path):
    report = json.loads(_run(tmp_path, "multi_discrete.py", "2048", "1")[-1])
    assert report["steps"] >= 2048 and report["seed"] == 1 and abs(report["random_return"] - 26 / 9) < 1e-9
    assert 0 <= report["final_return"] <= 8 and 0 <= report["eval_return"] <= 8
    assert (tmp_path / "runs" / "match-ppo-s1" / "summary.json").is_file()
    # the same command again: the run directory holds that run, which it keeps; one line says what to do
    summary = (tmp_path / "runs" / "match-ppo-s1" / "summary.json").read_text()
    again = _call(tmp_path, "multi_discrete.py", "2048", "1")
    assert again.returncode != 0 and "Traceback" not in again.stderr, again.stderr[-2000:]
    assert again.stderr.splitlines() == [again.stderr.strip()], again.stderr[-2000:]
    said = again.stderr.strip()
    assert said.startswith("multi_discrete.py: error: run directory 'runs/match-ppo-s1' already holds a run"), said
    assert "delete it" in said and "--run-dir" in said and "resume" in said, said
    assert (tmp_path / "runs" / "match-ppo-s1" / "summary.json").read_text() == summary
