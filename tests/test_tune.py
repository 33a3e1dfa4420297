"""Tuning: ``kitae tune`` searches float hyperparameters with Optuna (TPE, median pruning), trials
of a JAX environment in batches vmapped in one program, host trials one at a time; the study
lives in SQLite so a killed search continues; the best configuration is a config file that
``kitae train --config`` takes; diverged trials are pruned; bad input is refused first."""

from __future__ import annotations

import contextlib
import csv
import os
import signal
import sqlite3
import subprocess
import sys
import time
from types import SimpleNamespace

import numpy as np
import optuna
import pytest
import yaml

from kitae.cli import main
from kitae.envs.make import EnvSpec
from kitae.loops.result import Episodes
from kitae.runs.errors import RunError
from kitae.runs.rundir import read_run_config
from kitae.runs.signals import StopRequest
from kitae.runs.tune import REPORTS, _open_study, _Reporter, parse_space

pytestmark = pytest.mark.timeout(300)

LR = "update_cfg.learning_rate"


def _trials(study_dir):
    with open(study_dir / "trials.csv") as file:
        return list(csv.DictReader(file))


def _study(study_dir):
    return optuna.load_study(study_name="kitae", storage=f"sqlite:///{study_dir / 'study.db'}")


def _count_read_only(path, query):
    """One count from a study file another process writes (read-only: never makes its tables)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return db.execute(query).fetchone()[0]
    except sqlite3.Error:  # not made yet
        return 0


FINISHED = "SELECT COUNT(*) FROM trials WHERE state IN ('COMPLETE', 'PRUNED')"
# running trials whose values are chosen (a trial is made RUNNING before ``ask`` picks its values)
TRAINING = (
    "SELECT COUNT(*) FROM trials t WHERE state = 'RUNNING' "
    "AND EXISTS (SELECT 1 FROM trial_params p WHERE p.trial_id = t.trial_id)"
)


def test_space_items_parse_and_bad_ones_are_refused():
    assert parse_space([f"{LR}=1e-4:1e-2:log", "algo_params.gamma=0.9:0.99"]) == {
        LR: (1e-4, 1e-2, True),
        "algo_params.gamma": (0.9, 0.99, False),
    }
    for item, message in [
        (f"{LR}=1e-4", "is not KEY=LOW:HIGH"),
        (f"{LR}=1e-4:1e-2:exp", "is not KEY=LOW:HIGH"),
        (f"{LR}=a:b", "LOW and HIGH must be numbers"),
        (f"{LR}=1e-2:1e-4", "allowed: LOW < HIGH"),
        (f"{LR}=0:1e-2:log", "allowed: 0 < LOW < HIGH"),
    ]:
        with pytest.raises(RunError, match=message):
            parse_space([item])
    with pytest.raises(RunError, match="given twice"):
        parse_space([f"{LR}=1e-4:1e-3", f"{LR}=1e-3:1e-2"])


@pytest.mark.parametrize(
    ("space", "message"),
    [
        ("update_cfg.batch_size=32:64", "update_cfg.batch_size cannot be searched: not a float field"),
        ("algo_params.vtrace_rho_bar=0.5:1", "algo_params.vtrace_rho_bar cannot be searched: a float field this run "
         "does not read (read only with algo_params.advantage_estimator=vtrace); allowed: algo_params.clip_coef"),
        ("replay.her_ratio=0.1:0.9", "replay.her_ratio cannot be searched: a float field this run does not read "
         "(read only with replay.her=future or final or episode)"),
        ("algo_params.clip_cof=0.1:0.3", "not a field of the config; did you mean 'algo_params.clip_coef'?"),
        ("update_cfg.learning_rate=-1:1", "update_cfg.learning_rate=-1.0 is not allowed; allowed: a finite float > 0"),
    ],
)  # fmt: skip
def test_what_cannot_be_searched_is_refused_before_the_study_is_made(tmp_path, capsys, space, message):
    study_dir = tmp_path / "study"
    code = main(["tune", "ppo", "gymnax:CartPole-v1", "--trials", "2", "--space", space, "--study-dir", str(study_dir)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
    assert not study_dir.exists()


def test_a_study_dir_that_holds_no_study_or_a_damaged_one_is_refused_in_one_line(tmp_path, capsys):
    """A run's directory took a study beside its checkpoints; a damaged study.db was a traceback of
    SQLAlchemy's. Both are refused, and left as they were."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text("{}")
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "study.db").write_text("hello")
    for study_dir, message in (
        (run, "already exists and holds no study (study.db); choose another --study-dir"),
        (damaged, "study.db is not a study kitae tune can open (file is not a database)"),
    ):
        before = {p.name: p.read_bytes() for p in study_dir.iterdir()}
        code = main(["tune", "ppo", "gymnax:CartPole-v1", "--trials", "1", "--study-dir", str(study_dir)])
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
        assert {p.name: p.read_bytes() for p in study_dir.iterdir()} == before


def test_the_reporter_reports_intermediate_returns_and_prunes_as_the_median_pruner_says():
    study = optuna.create_study(
        direction="maximize", pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0)
    )
    good = study.ask()
    for step in (100, 200):
        good.report(200.0, step)
    study.tell(good, 200.0)
    trials = [study.ask(), study.ask()]
    reporter = _Reporter(trials, seeds=2, total=100 * REPORTS)  # rows 0, 1: trial 0; rows 2, 3: trial 1
    returns = {0: 300.0, 1: 340.0, 2: 10.0, 3: 30.0}
    for row, value in returns.items():
        reporter.on_episodes(Episodes(np.array([90]), np.array([value]), np.array([value]), np.array([2]), None, row))
    from kitae.loops.callbacks import Progress

    reporter.on_progress(Progress(100, 1.0))
    assert trials[0].storage.get_trial(trials[0]._trial_id).intermediate_values == {100: 320.0}
    assert reporter.pruned == {1} and not reporter.should_stop()  # 20 < the median 200: pruned
    assert reporter.score(0) == pytest.approx(320.0) and reporter.score(1) == pytest.approx(20.0)


def test_a_compiled_search_writes_the_best_config_that_kitae_train_takes(tmp_path, capsys):
    study_dir = tmp_path / "study"
    code = main(
        ["tune", "ppo", "gymnax:CartPole-v1", "--trials", "2", "--batch", "2", "--steps", "4096",
         "--space", f"{LR}=1e-4:3e-3:log", "--space", "algo_params.clip_coef=0.1:0.3",
         "--study-dir", str(study_dir), "--quiet"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "2/2 trials finished" in out and "best trial" in out
    trials = _trials(study_dir)
    assert [t["number"] for t in trials] == ["0", "1"] and {t["state"] for t in trials} <= {"COMPLETE", "PRUNED"}
    study = _study(study_dir)
    best = study.best_trial
    assert 1e-4 <= best.params[LR] <= 3e-3 and 0.1 <= best.params["algo_params.clip_coef"] <= 0.3
    best_yaml = yaml.safe_load((study_dir / "best.yaml").read_text())
    assert best_yaml["update_cfg"]["learning_rate"] == best.params[LR] and best_yaml["n_env_steps"] == 4096
    run_dir = tmp_path / "best"
    code = main(["train", "ppo", "gymnax:CartPole-v1", "--config", str(study_dir / "best.yaml"),
                 "--run-dir", str(run_dir), "--quiet"])  # fmt: skip
    assert code == 0
    config = read_run_config(run_dir)
    assert config.update_cfg.learning_rate == best.params[LR]
    assert config.algo_params.clip_coef == best.params["algo_params.clip_coef"]
    # the study directory given where a run directory goes: what to do with it, with its command
    capsys.readouterr()
    assert main(["eval", str(study_dir)]) == 2
    err = capsys.readouterr().err
    assert "is a kitae tune study" in err and "not a run directory" in err, err
    assert f"kitae tune ppo gymnax:CartPole-v1 --steps 4096 --study-dir {study_dir} --trials N" in err, err
    assert f"kitae train ppo gymnax:CartPole-v1 --config {study_dir / 'best.yaml'}" in err, err


def test_a_search_killed_mid_way_continues_the_same_study(tmp_path):
    study_dir = tmp_path / "study"
    command = [sys.executable, "-m", "kitae.cli", "tune", "ppo", "gymnax:CartPole-v1", "--trials", "4",
               "--batch", "2", "--steps", "16384", "--space", f"{LR}=1e-4:3e-3:log", "--study-dir", str(study_dir),
               "--quiet"]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:  # the first batch finished: kill it while the second trains
            db = study_dir / "study.db"
            if _count_read_only(db, FINISHED) >= 2 and _count_read_only(db, TRAINING) == 2:
                break
            assert process.poll() is None, process.communicate()
            time.sleep(0.2)
        else:
            pytest.fail("the first batch did not finish in time")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    before = {t.number: (t.params, t.value, t.state) for t in _study(study_dir).get_trials() if t.state.is_finished()}
    assert len(before) >= 2
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=250)
    assert result.returncode == 0, result.stderr
    assert "4/4 trials finished" in result.stdout
    trials = _study(study_dir).get_trials()
    for number, kept in before.items():  # what the killed search finished is kept as it was
        assert (trials[number].params, trials[number].value, trials[number].state) == kept
    finished = [t for t in trials if t.state in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)]
    assert len(finished) == 4
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]  # killed while running
    assert len(failed) == 2
    for trial in failed:  # asked again with the same values
        assert any(t.params == trial.params and t.number > trial.number for t in finished)


def test_a_trial_killed_before_its_values_were_chosen_is_failed_and_not_asked_again(tmp_path):
    """A search killed inside ``study.ask`` leaves a RUNNING trial with some values missing: it
    never trained, so reopening fails it without enqueueing a half-fixed trial; a trial with all
    its values is failed and asked again with them."""
    space = {LR: (1e-4, 3e-3, True), "algo_params.clip_coef": (0.1, 0.3, False)}
    run = SimpleNamespace(algo="ppo", env=EnvSpec.parse("gymnax:CartPole-v1"), total=4096,
                          config=SimpleNamespace(seed=0, train_cfg=SimpleNamespace(eval_episodes=0)))  # fmt: skip
    study = _open_study(tmp_path, run, space, 1)
    float_ = optuna.distributions.FloatDistribution
    whole = study.ask({k: float_(lo, hi, log=log) for k, (lo, hi, log) in space.items()})
    partial = study.ask({LR: float_(1e-4, 3e-3, log=True)})
    study = _open_study(tmp_path, run, space, 1)  # the next start
    trials = study.get_trials()
    assert [t.state for t in trials[:2]] == [optuna.trial.TrialState.FAIL] * 2
    assert [t.number for t in trials] == [whole.number, partial.number, 2]
    assert trials[2].state == optuna.trial.TrialState.WAITING
    assert trials[2].system_attrs["fixed_params"] == whole.params


def test_a_search_started_again_draws_new_values(tmp_path):
    """The sampler of a search started again is seeded past the trials the study holds: its first
    values are not those the first start drew (a sampler seeded as before would ask the finished
    trials' values again, and TPE's random start would repeat itself)."""
    space = {LR: (1e-4, 3e-3, True)}
    run = SimpleNamespace(algo="ppo", env=EnvSpec.parse("gymnax:CartPole-v1"), total=4096,
                          config=SimpleNamespace(seed=0, train_cfg=SimpleNamespace(eval_episodes=0)))  # fmt: skip
    distributions = {LR: optuna.distributions.FloatDistribution(1e-4, 3e-3, log=True)}
    study = _open_study(tmp_path, run, space, 1)
    for value in (100.0, 200.0):
        study.tell(study.ask(distributions), value)
    first = [t.params[LR] for t in study.get_trials()]
    again = _open_study(tmp_path, run, space, 1).ask(distributions).params[LR]
    assert again not in first
    (tmp_path / "other").mkdir()
    fresh = _open_study(tmp_path / "other", run, space, 1).ask(distributions).params[LR]
    assert fresh == first[0]  # a new study still starts from the run's seed


def test_a_search_of_other_environment_arguments_is_another_search(tmp_path):
    space = {LR: (1e-4, 3e-3, True)}
    config = SimpleNamespace(seed=0, train_cfg=SimpleNamespace(eval_episodes=0))
    catch = EnvSpec.parse("gymnax:Catch-bsuite")
    _open_study(tmp_path, SimpleNamespace(algo="ppo", env=catch.with_kwargs({"rows": 6}), total=4096, config=config),
                space, 1)  # fmt: skip
    with pytest.raises(RunError) as info:
        _open_study(tmp_path, SimpleNamespace(algo="ppo", env=catch, total=4096, config=config), space, 1)
    assert "holds a study of another search (env_kwargs: the study's rows=6, this command's none)" in str(info.value)


def test_another_search_is_refused_naming_each_field_its_stored_value_and_the_new_one(tmp_path):
    """The refusal dumped the stored study as a Python dict and never showed the new value."""
    space = {LR: (1e-4, 3e-3, True)}
    config = SimpleNamespace(seed=0, train_cfg=SimpleNamespace(eval_episodes=0))
    env = EnvSpec.parse("gymnax:CartPole-v1")
    _open_study(tmp_path, SimpleNamespace(algo="ppo", env=env, total=4096, config=config), space, 1)
    other = {LR: (1e-4, 1e-2, True), "algo_params.gamma": (0.9, 0.99, False)}
    with pytest.raises(RunError) as info:
        _open_study(tmp_path, SimpleNamespace(algo="ppo", env=env, total=8192, config=config), other, 2)
    message = str(info.value)
    assert "{" not in message and len(message.splitlines()) == 1, message
    assert (
        "holds a study of another search (seeds: the study's 1, this command's 2; space: the study's "
        "update_cfg.learning_rate=0.0001:0.003:log, this command's update_cfg.learning_rate=0.0001:0.01:log, "
        "algo_params.gamma=0.9:0.99; steps: the study's 4096, this command's 8192); give the same command"
    ) in message


def test_a_study_with_more_finished_trials_than_asked_is_refused_plainly(tmp_path):
    """The same study run again with a smaller --trials printed "4/2 trials finished"."""
    space = {LR: (1e-4, 3e-3, True)}
    run = SimpleNamespace(algo="ppo", env=EnvSpec.parse("gymnax:CartPole-v1"), total=4096,
                          config=SimpleNamespace(seed=0, train_cfg=SimpleNamespace(eval_episodes=0)))  # fmt: skip
    study = _open_study(tmp_path, run, space, 1, 3)
    distributions = {LR: optuna.distributions.FloatDistribution(1e-4, 3e-3, log=True)}
    for value in (1.0, 2.0, 3.0):
        study.tell(study.ask(distributions), value)
    assert len(_open_study(tmp_path, run, space, 1, 3).get_trials()) == 3  # as many as asked: no refusal
    study.ask(distributions)  # a killed search's trial: the refusal leaves it as it is
    with pytest.raises(RunError) as info:
        _open_study(tmp_path, run, space, 1, 2)
    assert [t.state for t in _study(tmp_path).get_trials()][-1] == optuna.trial.TrialState.RUNNING
    assert str(info.value) == (
        f"{tmp_path} already holds 3 finished trials, more than --trials 2: nothing to run; its best is in "
        f"{tmp_path / 'best.yaml'} (pass --trials N with N > 3 to run more)"
    )


def test_diverging_trials_are_pruned_in_the_host_loop(tmp_path, capsys):
    study_dir = tmp_path / "study"
    code = main(
        ["tune", "dqn", "CartPole-v1", "--trials", "1", "--steps", "1000", "--space", f"{LR}=1e11:1e12:log",
         "--set", "update_cfg.max_grad_norm=null", "--set", "algo_params.start_step=200",
         "--study-dir", str(study_dir), "--quiet"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and "1/1 trials finished (1 pruned, 1 diverged)" in out and "no trial completed" in out
    (trial,) = _trials(study_dir)
    assert trial["state"] == "PRUNED" and trial["diverged"] == "True"
    assert not (study_dir / "best.yaml").exists()


class _StopAtFirstReport(StopRequest):
    """``stop_on_signals``'s request, as if a signal (Ctrl-C: SIGINT) came as the trial first
    reported its progress."""

    signum = signal.SIGINT

    def on_progress(self, progress):
        self.signal = self.signal or self.signum


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_host_search_marks_its_interrupted_trial_failed_and_asks_it_again(
    tmp_path, capsys, monkeypatch, signum
):
    """After Ctrl-C, trials.csv listed the interrupted trial as RUNNING until the command was
    started again: it is failed before the command ends, and the next start asks it again with its
    values, as it asks a killed search's. The exit status is 128 + the signal's number (SIGTERM
    gave 130, SIGINT's, as every stop did)."""
    study_dir = tmp_path / "study"
    command = ["tune", "dqn", "CartPole-v1", "--trials", "1", "--steps", "400", "--set", "algo_params.start_step=200",
               "--study-dir", str(study_dir), "--quiet"]  # fmt: skip

    @contextlib.contextmanager
    def stop_at_first_report(*args):
        request = _StopAtFirstReport()
        request.signum = signum
        yield request

    with monkeypatch.context() as patch:
        patch.setattr("kitae.runs.tune.stop_on_signals", stop_at_first_report)
        assert main(command) == 128 + signum
    assert f"tune stopped by {signal.Signals(signum).name}: 0/1 trials finished" in capsys.readouterr().err
    (trial,) = _trials(study_dir)
    assert trial["state"] == "FAIL" and trial["number"] == "0"
    assert main(command) == 0
    trials = _trials(study_dir)
    assert [(t["number"], t["state"]) for t in trials] == [("0", "FAIL"), ("1", "COMPLETE")]
    assert trials[1][LR] == trials[0][LR]


def test_a_host_search_runs_its_trials_one_after_another_or_on_ray_workers(tmp_path, capsys):
    """A host-loop search trains its trials one after another, or with ``--workers 2`` two at a
    time in Ray tasks (a runtime the search starts and stops): the same values asked (TPE's first
    trials are drawn at random from its seed) train to the same scores. Here the trials are scored
    by evaluating their final policy (``train_cfg.eval_episodes``), as ``kitae eval`` would: the
    best one's score is ``kitae eval``'s figure for a run of its ``best.yaml``."""
    trials = {}
    for mode, extra in (("sequential", []), ("ray", ["--workers", "2"])):
        study_dir = tmp_path / mode
        code = main(
            ["tune", "dqn", "CartPole-v1", "--trials", "2", "--steps", "800", "--set", "algo_params.start_step=200",
             "--set", "train_cfg.eval_episodes=2", "--study-dir", str(study_dir), "--quiet", *extra]
        )  # fmt: skip
        out = capsys.readouterr().out
        assert code == 0 and "2/2 trials finished" in out and "best trial" in out and "evaluation return" in out, out
        assert yaml.safe_load((study_dir / "best.yaml").read_text())["n_env_steps"] == 800
        trials[mode] = sorted(_trials(study_dir), key=lambda t: t["number"])
        assert {t["state"] for t in trials[mode]} == {"COMPLETE"}
        for trial in trials[mode]:  # the score is the evaluation; the training return is kept beside it
            evaluated, finals = yaml.safe_load(trial["eval_returns"]), yaml.safe_load(trial["final_returns"])
            assert len(evaluated) == len(finals) == 1 and float(trial["value"]) == evaluated[0]
    assert trials["ray"] == trials["sequential"]
    best = max(trials["sequential"], key=lambda t: float(t["value"]))
    run_dir = tmp_path / "best"
    assert main(["train", "dqn", "CartPole-v1", "--config", str(tmp_path / "sequential" / "best.yaml"),
                 "--run-dir", str(run_dir), "--quiet"]) == 0  # fmt: skip
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    summary = yaml.safe_load((run_dir / "summary.json").read_text())
    assert summary["eval_return"] == float(best["value"])
    assert [summary["final_return"]] == yaml.safe_load(best["final_returns"])


def test_a_compiled_search_can_score_its_trials_by_evaluation(tmp_path, capsys):
    study_dir = tmp_path / "study"
    command = ["tune", "ppo", "gymnax:CartPole-v1", "--trials", "2", "--batch", "2", "--steps", "4096", "--seeds", "2",
               "--space", f"{LR}=1e-4:3e-3:log", "--study-dir", str(study_dir), "--quiet"]  # fmt: skip
    assert main([*command, "--set", "train_cfg.eval_episodes=2"]) == 0
    assert "best trial" in capsys.readouterr().out
    trials = _trials(study_dir)
    assert {t["state"] for t in trials} == {"COMPLETE"}
    for trial in trials:
        evaluated = yaml.safe_load(trial["eval_returns"])
        assert len(evaluated) == 2 and float(trial["value"]) == pytest.approx(np.mean(evaluated), rel=1e-12)
    assert (study_dir / "best.yaml").read_text().startswith("# kitae tune: the best trial (")
    assert ", evaluation return " in (study_dir / "best.yaml").read_text().splitlines()[0]
    # a search scored otherwise is another search: not continued in this study
    assert main(command) == 2
    assert (
        "holds a study of another search (eval_episodes: the study's 2, this command's none)" in capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("env_id", "flags", "message"),
    [
        ("gymnax:CartPole-v1", ["--workers", "2"], "is a JAX environment, whose trials train --batch at a time"),
        ("CartPole-v1", ["--address", "127.0.0.1:6379"], "--address is for --workers: give --workers N too"),
    ],
)
def test_ray_workers_are_refused_where_they_do_not_apply(tmp_path, capsys, env_id, flags, message):
    code = main(["tune", "dqn", env_id, "--trials", "2", "--study-dir", str(tmp_path / "study"), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "study").exists()
