"""``train_cfg.eval_episodes``: each checkpoint's deterministic policy evaluated as ``kitae eval``
does, in both loops, into ``metrics.jsonl``, TensorBoard and ``summary.json``."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from kitae.cli import main
from kitae.config import TrainConfig
from kitae.runs import eval_run
from kitae.runs.rundir import read_metrics


@pytest.mark.parametrize(
    ("algo", "env_id", "steps", "period"),
    [("dqn", "CartPole-v1", 1024, 512), ("ppo", "gymnax:CartPole-v1", 4096, 2048)],
    ids=["host", "compiled"],
)
def test_every_checkpoint_is_evaluated_as_kitae_eval_would(tmp_path, capsys, algo, env_id, steps, period):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    argv = ["train", algo, env_id, "--steps", str(steps), "--seeds", "2", "--run-dir", str(run_dir), "--quiet",
            "--set", f"train_cfg.save_frequency={period}", "--set", "train_cfg.eval_episodes=3"]  # fmt: skip
    assert main(argv) == 0
    rows = [row for row in read_metrics(run_dir / "metrics.jsonl") if "eval_return" in row]
    checkpoints = sorted(int(p.name) for p in (run_dir / "checkpoints").rglob("*") if p.name.isdigit())
    assert sorted({row["step"] for row in rows}) == sorted(set(checkpoints))  # one evaluation per checkpoint
    assert {row["seed"] for row in rows} == {0, 1} and {row["eval_episodes"] for row in rows} == {3}
    summary = json.loads((run_dir / "summary.json").read_text())
    line = capsys.readouterr().out.splitlines()[0]  # the command's line names the last and the best evaluations
    assert f"evaluation {summary['eval_return'][0]:.1f}, {summary['eval_return'][1]:.1f} (best " in line, line
    evaluated = eval_run(run_dir, episodes=3)  # the newest checkpoint, as `kitae eval RUN_DIR --episodes 3`
    assert summary["eval_return"] == evaluated["mean"] and summary["eval_step"] == [max(checkpoints)] * 2
    # the best evaluation's checkpoint is kept and named: per seed in the host loop (a folder each),
    # by the mean over the seeds of one checkpoint in the compiled loop; of equal ones the first
    by_step = {}
    for row in rows:
        by_step.setdefault(row["step"], {})[row["seed"]] = row["eval_return"]
    if algo == "dqn":
        best = [max(sorted(by_step), key=lambda step, s=seed: by_step[step][s]) for seed in (0, 1)]
    else:
        best = [max(sorted(by_step), key=lambda step: np.mean(list(by_step[step].values())))] * 2
    assert summary["best_eval_step"] == best
    assert summary["best_eval_return"] == [by_step[step][seed] for seed, step in zip((0, 1), best)]
    values = [f"{by_step[step][seed]:.1f}" for seed, step in zip((0, 1), best)]
    if best[0] == best[1]:
        assert f"(best {values[0]}, {values[1]} at step {best[0]:,})" in line, line
    else:
        assert f"(best {values[0]} at step {best[0]:,}, {values[1]} at step {best[1]:,})" in line, line
    again = eval_run(run_dir, episodes=3, checkpoint="best")  # `kitae eval RUN_DIR --episodes 3 --checkpoint best`
    assert again["step"] == best and again["mean"] == summary["best_eval_return"]
    events = EventAccumulator(str(run_dir / "logs"))
    events.Reload()
    first_seed = [row for row in rows if row["seed"] == 0]
    scalars = events.Scalars("eval/episodic_return")
    assert [e.step for e in scalars] == [row["step"] for row in first_seed]
    np.testing.assert_allclose([e.value for e in scalars], [row["eval_return"] for row in first_seed], rtol=1e-6)


@pytest.fixture(scope="module")
def unevaluated_run(tmp_path_factory):
    """A run of 256 steps trained with the default ``train_cfg`` (one checkpoint, not evaluated)
    and its ``summary.json`` as training wrote it."""
    run_dir = tmp_path_factory.mktemp("unevaluated") / "run"
    assert main(["train", "dqn", "CartPole-v1", "--steps", "256", "--run-dir", str(run_dir), "--quiet"]) == 0
    return run_dir, json.loads((run_dir / "summary.json").read_text())


def test_no_evaluation_by_default_and_a_bad_count_is_refused(unevaluated_run):
    assert TrainConfig().eval_episodes == 0
    with pytest.raises(ValueError, match=r"train_cfg.eval_episodes=-1 is not allowed; allowed: 0 \(no evaluation\)"):
        TrainConfig(eval_episodes=-1)
    run_dir, summary = unevaluated_run
    assert not any("eval_return" in row for row in read_metrics(run_dir / "metrics.jsonl"))
    assert "eval_return" not in summary and "best_eval_step" not in summary


@pytest.mark.parametrize(
    ("checkpoint", "message"),
    [
        ("best", r"checkpoint 'best': no checkpoint in .*checkpoints was evaluated \(checkpoints there: 256\); "
                 r"a run evaluates its checkpoints with --set train_cfg.eval_episodes=N"),
        ("128", r"no checkpoint of step 128 in .*checkpoints; its checkpoints: 256"),
        ("last", r"checkpoint 'last' is not allowed; allowed: 'best', 'newest' or a step \(256\)"),
    ],
)  # fmt: skip
def test_a_checkpoint_that_is_not_there_is_refused_in_one_line(unevaluated_run, capsys, checkpoint, message):
    import re

    run_dir, _ = unevaluated_run
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "1", "--checkpoint", checkpoint]) == 2
    err = capsys.readouterr().err.strip()
    assert re.fullmatch(f"kitae: error: {message}", err), err
    assert main(["eval", str(run_dir), "--episodes", "1", "--checkpoint", "newest"]) == 0  # the default, named
    assert "checkpoint step 256" in capsys.readouterr().out


@pytest.mark.parametrize("env_id", ["gymnax:CartPole-v1", "jaxmarl:MPE_simple_spread_v3"])
def test_an_evaluation_of_given_parameters_compiles_once_per_agent(env_id):
    from kitae.envs.make import EnvSpec
    from kitae.loops.evaluate import evaluate_jax
    from kitae.runs import preset_agent

    agent, env = preset_agent("ppo", env_id, run_dir="unused")
    spec = EnvSpec.parse(env_id)
    mine = evaluate_jax(agent, spec, 4)

    def halved(tree):  # the floating leaves (a step counter keeps its int dtype)
        return jax.tree_util.tree_map(lambda x: x * 0.5 if jax.numpy.issubdtype(x.dtype, np.floating) else x, tree)

    given = evaluate_jax(agent, spec, 4, params=halved(agent.acting_params(agent.state)))
    # one compiled evaluation, the parameters an argument (JaxMARL's compiled at every call before)
    (evaluation,) = agent._kitae_evaluation.values()
    assert evaluation._cache_size() == 1
    np.testing.assert_array_equal(evaluate_jax(agent, spec, 4), mine)
    agent.state = halved(agent.state)
    np.testing.assert_array_equal(evaluate_jax(agent, spec, 4), given)  # the same as the state's own


def test_a_compiled_sweep_evaluates_each_combination_with_its_own_agent(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    argv = ["sweep", "ppo", "gymnax:CartPole-v1", "--grid", "update_cfg.learning_rate=1e-3,3e-3", "--steps", "4096",
            "--sweep-dir", str(sweep_dir), "--quiet", "--set", "train_cfg.eval_episodes=2"]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    for name in ("learning_rate=0.001", "learning_rate=0.003"):
        run_dir = sweep_dir / name
        rows = [row for row in read_metrics(run_dir / "metrics.jsonl") if "eval_return" in row]
        assert [row["step"] for row in rows] == [4096]
        summary = json.loads((run_dir / "summary.json").read_text())
        # a sweep's run lists its seeds' values (here one), as its final_return does
        assert summary["eval_return"] == eval_run(run_dir, episodes=2)["mean"] == [rows[0]["eval_return"]]
        assert summary["best_eval_step"] == [4096] and summary["best_eval_return"] == [rows[0]["eval_return"]]


def test_a_copy_with_another_config_compiles_its_own_evaluation():
    import dataclasses

    from kitae.envs.make import EnvSpec
    from kitae.loops.collect import compiled_steps
    from kitae.loops.evaluate import evaluate_jax
    from kitae.runs import preset_agent

    agent, _ = preset_agent("ppo", "gymnax:CartPole-v1", run_dir="unused")
    evaluate_jax(agent, EnvSpec.parse("gymnax:CartPole-v1"), 2)
    compiled_steps(agent)
    params = dataclasses.replace(agent.config.algo_params, observation_clip=1.0)  # acting reads it
    clone = agent.with_config(dataclasses.replace(agent.config, algo_params=params))
    assert "_kitae_evaluation" not in clone.__dict__ and "_compiled_steps" not in clone.__dict__
    assert "_kitae_evaluation" in agent.__dict__ and "_compiled_steps" in agent.__dict__


def test_evaluations_are_plotted_as_the_mean_over_seeds_at_each_step():
    from kitae.runs.plotting import evaluations_from_metrics

    rows = [
        {"step": 512, "seed": 0, "episodic_return": 20.0, "episodic_length": 20.0, "episodes": 1},  # training
        {"step": 1024, "seed": 1, "eval_return": 30.0, "eval_return_std": 0.0, "eval_episodes": 2},
        {"step": 1024, "seed": 0, "eval_return": 10.0, "eval_return_std": 0.0, "eval_episodes": 2},
        {"step": 512, "seed": 0, "eval_return": 5.0, "eval_return_std": 0.0, "eval_episodes": 2},
        {"step": 2048, "seed": 0, "eval_return": None, "eval_return_std": None, "eval_episodes": 2},  # not finite
    ]
    steps, returns = evaluations_from_metrics(rows)
    np.testing.assert_array_equal(steps, [512, 1024])
    np.testing.assert_array_equal(returns, [5.0, 20.0])
    assert [len(a) for a in evaluations_from_metrics(rows[:1])] == [0, 0]


def test_the_checkpoint_a_stop_writes_is_not_evaluated(tmp_path):
    """Ctrl-C saves a checkpoint and exits as soon as it is written: that checkpoint is not
    evaluated (an evaluation of many episodes would hold the stop up); the run's other checkpoints
    are."""
    import signal
    import subprocess
    import sys
    import time

    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "kitae.cli", "train", "ppo", "gymnax:CartPole-v1", "--steps", "20000000",
               "--set", "train_cfg.save_frequency=20480", "--set", "train_cfg.eval_episodes=2",
               "--run-dir", str(run_dir), "--quiet"]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any("eval_return" in row for row in _rows(run_dir / "metrics.jsonl")):  # training and evaluating
        assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()
        time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    from kitae.runs.checkpoints import Checkpointer

    checkpointer = Checkpointer(run_dir / "checkpoints")
    newest = checkpointer.latest_step()
    evaluated = {row["step"] for row in _rows(run_dir / "metrics.jsonl") if "eval_return" in row}
    assert evaluated and newest not in evaluated and "eval_return" not in checkpointer.read_meta(newest)
    assert checkpointer.best_step() in evaluated  # the periodic ones were


def _rows(path):
    return read_metrics(path) if path.exists() else []
