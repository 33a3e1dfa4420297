"""``train_cfg.stop_return``: a run stops, with a checkpoint, once every seed's return reached a
target (the mean of its last 10 training episodes, or its latest evaluation), and ends as a finished
run: ``summary.json`` written, exit status 0, the stop recorded in ``stopped_early``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kitae.cli import main
from kitae.config import AlgoConfig, TrainConfig
from kitae.loops.callbacks import Callback
from kitae.loops.result import Episodes, recent_return
from kitae.runs.callbacks import StopAtReturn
from kitae.runs.load import load_agent
from kitae.runs.resolve import preset_agent
from kitae.runs.rundir import final_return_from_rows, read_metrics


def _rows(returns, counts, seed_index=0, first_step=0):
    n = len(returns)
    steps = np.arange(first_step + 1, first_step + n + 1, dtype=np.int64)
    return Episodes(steps, np.asarray(returns, float), np.ones(n), np.asarray(counts, np.int64), None, seed_index)


def test_the_recent_return_takes_whole_rows_from_the_end_until_they_hold_the_episodes():
    # rows of 1, 5 and 6 episodes: the last two hold 11 >= 10, the first is not read
    assert recent_return([10.0, 20.0, 30.0], [1, 5, 6]) == pytest.approx((280.0 / 11, 11))
    assert recent_return([10.0, 20.0, 30.0], [1, 5, 6], last=6) == (30.0, 6)
    assert recent_return([10.0, 20.0], [1, 1]) == (15.0, 2)  # fewer than 10: all of them
    mean, count = recent_return([], [])
    assert math.isnan(mean) and count == 0
    # the summary's final return reads metrics rows by the same rule
    rows = [{"seed": 0, "episodic_return": r, "episodes": n} for r, n in [(10.0, 1), (20.0, 5), (30.0, 6)]]
    rows.insert(1, {"seed": 1, "episodic_return": 1e9})
    assert final_return_from_rows(rows, 0) == pytest.approx(280.0 / 11)


@pytest.mark.parametrize(("value", "error"), [(math.nan, ValueError), (math.inf, ValueError), ("475", TypeError)])
def test_a_target_that_is_not_a_finite_number_is_refused(value, error):
    with pytest.raises(error, match=r"train_cfg\.stop_return"):
        TrainConfig(stop_return=value)


def test_the_target_round_trips_through_yaml(tmp_path):
    agent, env = preset_agent("ppo", "CartPole-v1", sets=["train_cfg.stop_return=475"])
    env.close()
    agent.config.to_yaml(tmp_path / "config.yaml")
    assert AlgoConfig.from_yaml(tmp_path / "config.yaml").train_cfg.stop_return == 475.0
    assert TrainConfig().stop_return is None


def test_every_seed_must_reach_the_target_over_ten_episodes():
    stop = StopAtReturn(100.0, n_seeds=2)
    stop.on_episodes(_rows([500.0] * 9, [1] * 9))
    assert not stop.should_stop()  # nine episodes: not yet a return
    stop.on_episodes(_rows([500.0], [1], first_step=9))
    stop.on_episodes(_rows([99.0] * 10, [1] * 10, seed_index=1))
    assert not stop.should_stop() and stop.returns() == [500.0, 99.0]
    stop.on_episodes(_rows([110.0], [1], seed_index=1, first_step=10))  # (9 * 99 + 110) / 10 = 100.1
    assert stop.should_stop()
    assert stop.reached == {"step": 11, "returns": [500.0, pytest.approx(100.1)]}
    stop.on_episodes(_rows([0.0] * 10, [1] * 10, first_step=20))
    assert stop.should_stop() and stop.reached["step"] == 11  # once stopped, stays stopped


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_a_host_run_stops_at_the_target_with_a_checkpoint_and_its_line(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", "--run-dir", str(run_dir), "--quiet", "--set", "train_cfg.stop_return=60"]
    assert main(argv) == 0
    summary = _summary(run_dir)
    (early,) = summary["stopped_early"]
    assert early["by"] == "train_cfg.stop_return" and early["target"] == 60.0 and early["seeds"] == [0]
    assert early["step"] == early["reached_at"] == summary["steps"] < 100_000
    # the return it stopped on is the summary's final return, and at least the target
    assert early["returns"] == [summary["final_return"]] and summary["final_return"] >= 60.0
    rows = read_metrics(run_dir / "metrics.jsonl")
    before = [r for r in rows if r["step"] < early["step"]]
    assert final_return_from_rows(before, 0) < 60.0  # it had not reached it one episode earlier
    assert load_agent(run_dir).env_step == summary["steps"]  # the newest checkpoint is where it stopped
    line = capsys.readouterr().out.splitlines()[0]
    assert f"{summary['steps']:,} steps (stopped early, at step {summary['steps']:,}: reached " in line
    assert "train_cfg.stop_return=60), final return" in line


def test_seeds_trained_together_stop_when_every_one_has_reached_it(tmp_path):
    run_dir = tmp_path / "run"
    argv = ["train", "ppo", "gymnax:CartPole-v1", "--seeds", "2", "--run-dir", str(run_dir), "--quiet",
            "--set", "train_cfg.stop_return=150"]  # fmt: skip
    assert main(argv) == 0
    summary = _summary(run_dir)
    (early,) = summary["stopped_early"]
    assert early["seeds"] == [0, 1] and summary["steps"] == early["step"] < 500_000
    assert min(early["returns"]) >= 150.0 and early["returns"] == pytest.approx(summary["final_return"])
    assert load_agent(run_dir).env_step == summary["steps"]


def test_with_evaluations_the_latest_one_decides(tmp_path):
    run_dir = tmp_path / "run"
    argv = ["train", "ppo", "CartPole-v1", "--run-dir", str(run_dir), "--quiet", "--set", "train_cfg.stop_return=150",
            "--set", "train_cfg.eval_episodes=3", "--set", "train_cfg.save_frequency=2048"]  # fmt: skip
    assert main(argv) == 0
    summary = _summary(run_dir)
    (early,) = summary["stopped_early"]
    evaluations = [r for r in read_metrics(run_dir / "metrics.jsonl") if "eval_return" in r]
    reached = [r for r in evaluations if r["step"] == early["reached_at"]]
    assert reached and reached[0]["eval_return"] == early["returns"][0] >= 150.0
    assert all(r["eval_return"] < 150.0 for r in evaluations if r["step"] < early["reached_at"])
    # stopped at the next step after that evaluation's checkpoint
    assert early["reached_at"] < early["step"] == summary["steps"] <= early["reached_at"] + 8


def test_a_compiled_sweep_stops_when_every_combination_has_reached_it(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    argv = ["sweep", "ppo", "gymnax:CartPole-v1", "--grid", "update_cfg.learning_rate=1e-3,2.5e-3", "--seeds", "2",
            "--set", "train_cfg.stop_return=100", "--sweep-dir", str(sweep_dir), "--quiet"]  # fmt: skip
    assert main(argv) == 0
    for name in ("learning_rate=0.001", "learning_rate=0.0025"):
        summary = _summary(sweep_dir / name)
        (early,) = summary["stopped_early"]
        assert summary["steps"] == early["step"] < 500_000 and early["reached_at"] <= early["step"]
        assert min(early["returns"]) >= 100.0
    # the sweep's table and sweep.json say where each combination stopped
    report = json.loads((sweep_dir / "sweep.json").read_text())
    assert [c["stopped_early_at"] for c in report["combinations"]] == [[summary["steps"]]] * 2
    table = (sweep_dir / "table.txt").read_text()
    assert table.count(f"stopped early (step {summary['steps']:,})") == 2, table


def test_kitae_tune_refuses_it_in_one_line(capsys):
    assert main(["tune", "ppo", "gymnax:CartPole-v1", "--trials", "2", "--set", "train_cfg.stop_return=400"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kitae: error: train_cfg.stop_return=400 is not allowed in kitae tune") and "\n" not in err


class _StopAfter(Callback):
    """Stops the run once it has seen ``steps`` environment steps of progress."""

    def __init__(self, steps):
        self.steps, self.seen = steps, 0

    def on_progress(self, progress):
        self.seen = progress.step

    def should_stop(self):
        return self.seen >= self.steps


def test_a_callback_that_stops_the_run_ends_it_as_a_finished_one(tmp_path):
    agent, env = preset_agent("ppo", "CartPole-v1", run_dir=tmp_path / "run")
    agent.train(env, 50_000, callbacks=[_StopAfter(4096)])
    summary = _summary(tmp_path / "run")
    (early,) = summary["stopped_early"]
    assert early == {"seeds": [0], "step": summary["steps"], "by": "callback"}
    assert 4096 <= summary["steps"] < 50_000 and agent.env_step == summary["steps"]
