"""Hyperparameter search: ``kitae tune ALGO ENV --trials N``, with Optuna as rl-zoo uses it.

Why this module is long: a search has three drivers that share its study, scoring and report
(trials in one compiled program, one after another, in Ray tasks); split, each piece would reach
into the others' state.

Trials are sampled by Optuna's TPE sampler (seeded by the run's seed) over a search space of float
fields (``--space KEY=LOW:HIGH[:log]``; a default per algorithm, ``DEFAULT_SPACES``), scored by the
mean over their seeds of the final training return (the mean of the last 10 episodes) or, with
``--set train_cfg.eval_episodes=N``, of their final policy evaluated as ``kitae eval`` does
(deterministic, N episodes; rl-zoo scores its trials so), and pruned by Optuna's median pruner on
intermediate training returns (reported 20 times per trial). ``trials.csv`` lists each trial's
final returns and evaluations per seed. A trial
whose update diverges (a non-finite loss or state, ``kitae.loops.collect.update_step``) is pruned
and marked ``diverged``.

In a JAX environment, ``--batch`` trials (x ``--seeds``) train together in ONE compiled program:
their sampled values are traced and vmapped like seeds (``kitae.loops.program.make_variant_functions``);
a batch stops early when all its trials are pruned. In the host loop, trials train one after another
and a pruned trial stops at once, or with ``workers=N`` (``kitae tune ... --workers N``) N at a
time in Ray tasks, on a runtime the search starts on 127.0.0.1 or on an existing cluster
(``address``; the study directory must then be on a file system every node reaches): this
process asks Optuna for each trial's values and tells it the result, and each task trains its
trial, reporting its intermediate returns to the study and pruning as the pruner says. A trial
trains to the same result either way; which values TPE asks for next depends on which trials
have finished, so a parallel search takes another path through the space than a sequential one.

The study lives in ``STUDY_DIR/study.db`` (SQLite): a search that is killed and started again with
the same command continues the same study (the trials it had finished are kept; those it was
running are marked failed and asked again with the same values), until ``--trials`` trials have
finished in all. ``STUDY_DIR/best.yaml`` is the best configuration as a config file
(``kitae train ALGO ENV --config STUDY_DIR/best.yaml``) and ``STUDY_DIR/trials.csv`` lists the
trials.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from kitae.config import AlgoConfig, not_sweepable_reason, sweepable_keys, yaml_text
from kitae.loops.callbacks import Callback, Progress
from kitae.loops.compiled import CompiledExecutor
from kitae.loops.result import Episodes, RunResult
from kitae.runs.errors import RunError
from kitae.runs.grid import with_values
from kitae.runs.presets import did_you_mean, settable_keys
from kitae.runs.progress import ProgressBar
from kitae.runs.ray_tasks import check_workers, in_ray_tasks
from kitae.runs.resolve import ResolvedRun, RunSpec, check_seed_range, make_run_env, resolve_train
from kitae.runs.rundir import final_return_from_rows
from kitae.runs.signals import StopRequest, stop_on_signals

__all__ = ["TuneSpec", "DEFAULT_SPACES", "parse_space", "tune_run", "best_config_yaml", "trial_task"]

Space = dict[str, tuple[float, float, bool]]
"""``{dotted key: (low, high, log)}``."""

DEFAULT_SPACES: dict[str, Space] = {
    # rl-zoo's PPO sampler's float ranges, narrowed to those that train on a small budget
    "ppo": {
        "update_cfg.learning_rate": (1e-4, 3e-3, True),
        "algo_params.clip_coef": (0.1, 0.4, False),
        "algo_params.entropy_coef": (1e-5, 3e-2, True),
        "algo_params.gae_lambda": (0.8, 0.99, False),
        "algo_params.gamma": (0.95, 0.999, False),
    },
    "default": {
        "update_cfg.learning_rate": (1e-5, 1e-2, True),
        "algo_params.gamma": (0.9, 0.999, False),
    },
}
"""The search space of ``kitae tune`` when no ``--space`` is given (``default`` for the algorithms
without their own; keys an algorithm lacks are left out)."""

REPORTS = 20
"""Intermediate returns reported to the pruner per trial."""

STUDY_NAME = "kitae"

INTERRUPTED = "interrupted"
"""The study's record of the trials a stopped search failed, asked again when it starts again."""

STOPPING = "stopping the running trials (the same command started again asks them again; Ctrl-C again aborts)"


@dataclasses.dataclass
class TuneSpec:
    """What ``kitae tune`` was asked for.

    Attributes:
        algo, env_id: as ``kitae train``.
        trials: trials to finish in the study, in all (a restarted search counts those it has).
        space: ``["update_cfg.learning_rate=1e-4:1e-2:log", ...]`` (default ``DEFAULT_SPACES``).
        seeds: seeds per trial (its score is their mean).
        batch: trials per compiled program (JAX environments).
        steps, seed, n_envs, config_file, sets: as ``kitae train`` (what is not searched).
        study_dir: where the study goes (default ``runs/tune-<algo>-<env>-s<seed>``).
        quiet: no progress bar.
        workers: host-loop environments only: train this many trials at a time in Ray tasks
            (``None``: one after another in this process).
        address: with ``workers``: ``HOST:PORT`` of an existing Ray cluster (default: a runtime
            started for the search on 127.0.0.1 and shut down after it).
    """

    algo: str
    env_id: str
    trials: int
    space: list[str] = dataclasses.field(default_factory=list)
    seeds: int = 1
    batch: int = 8
    steps: int | None = None
    seed: int | None = None
    n_envs: int | None = None
    config_file: str | None = None
    sets: list[str] = dataclasses.field(default_factory=list)
    study_dir: str | None = None
    quiet: bool = False
    workers: int | None = None
    address: str | None = None


def parse_space(items: list[str]) -> Space:
    """``["update_cfg.learning_rate=1e-4:1e-2:log"]`` -> ``{"update_cfg.learning_rate": (1e-4, 1e-2, True)}``.

    Raises:
        RunError: for an item that is not ``KEY=LOW:HIGH[:log]`` with ``LOW < HIGH`` (``LOW > 0``
            with ``log``), or a key given twice.
    """
    space: Space = {}
    for item in items:
        key, sep, text = item.partition("=")
        key, parts = key.strip(), text.split(":")
        if not sep or not key or len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] != "log"):
            raise RunError(f"--space {item!r} is not KEY=LOW:HIGH or KEY=LOW:HIGH:log")
        try:
            low, high = float(parts[0]), float(parts[1])
        except ValueError:
            raise RunError(f"--space {item!r}: LOW and HIGH must be numbers") from None
        log = len(parts) == 3
        if not (math.isfinite(low) and math.isfinite(high) and low < high) or (log and low <= 0):
            allowed = "0 < LOW < HIGH" if log else "LOW < HIGH"
            raise RunError(f"--space {item!r}: LOW={low:g}, HIGH={high:g} is not allowed; allowed: {allowed}")
        if key in space:
            raise RunError(f"--space {key} is given twice")
        space[key] = (low, high, log)
    return space


def _default_space(algo: str, config: AlgoConfig) -> Space:
    allowed = set(sweepable_keys(config))
    space = DEFAULT_SPACES.get(algo, DEFAULT_SPACES["default"])
    return {k: v for k, v in space.items() if k in allowed}


class _Reporter(Callback):
    """Reports each trial's intermediate return (the mean over its seeds of the episodes that ended
    since the last report) about ``REPORTS`` times, and prunes as the pruner says. Rows ``t * K ..
    t * K + K - 1`` of a batch are trial ``t``'s seeds."""

    def __init__(self, trials: list[Any], seeds: int, total: int, first_row: int = 0) -> None:
        self.trials, self.seeds, self.first_row = trials, seeds, first_row
        self.every = max(1, total // REPORTS)
        self.next = self.every
        self.pending: dict[int, list[float]] = {}
        self.history: dict[int, list[dict]] = {}  # row -> metrics-like rows (final_return_from_rows)
        self.evaluations: dict[int, float] = {}  # row -> its final policy's mean evaluation return
        self.pruned: set[int] = set()

    def on_episodes(self, episodes: Episodes) -> None:
        row = self.first_row + episodes.seed_index
        self.history.setdefault(row, []).extend(
            {"seed": row, "episodic_return": float(r), "episodes": int(n)}
            for r, n in zip(episodes.return_, episodes.count)
        )
        total = self.pending.setdefault(row // self.seeds, [0.0, 0.0])
        total[0] += float(np.sum(episodes.return_ * episodes.count))
        total[1] += float(np.sum(episodes.count))

    def on_progress(self, progress: Progress) -> None:
        if progress.step < self.next:
            return
        self.next = (progress.step // self.every + 1) * self.every
        for index, (value, count) in self.pending.items():
            if index in self.pruned or not count:
                continue
            trial = self.trials[index]
            trial.report(value / count, progress.step)
            if trial.should_prune():
                self.pruned.add(index)
        self.pending = {}

    def should_stop(self) -> bool:
        return len(self.pruned) == len(self.trials)

    def final_returns(self, index: int) -> list[float]:
        """Trial ``index``'s final training return (the last 10 episodes), per seed."""
        rows = range(index * self.seeds, (index + 1) * self.seeds)
        return [final_return_from_rows(self.history.get(r, []), r) for r in rows]

    def evaluated(self, index: int) -> list[float] | None:
        """Trial ``index``'s evaluations per seed (``train_cfg.eval_episodes``), or ``None``."""
        rows = range(index * self.seeds, (index + 1) * self.seeds)
        return [self.evaluations[r] for r in rows] if all(r in self.evaluations for r in rows) else None

    def score(self, index: int) -> float:
        """Trial ``index``'s score: the mean over its seeds of its final policy's deterministic
        evaluation when the search evaluates (``train_cfg.eval_episodes``), else of the final
        training return (the last 10 episodes)."""
        evaluated = self.evaluated(index)
        return float(np.mean(evaluated if evaluated is not None else self.final_returns(index)))

    def record(self, index: int) -> None:
        """Keeps trial ``index``'s per-seed figures with it in the study (``trials.csv``): its
        final training returns and, when the search evaluates, its evaluations."""
        trial = self.trials[index]
        trial.set_user_attr("final_returns", [r if math.isfinite(r) else None for r in self.final_returns(index)])
        if (evaluated := self.evaluated(index)) is not None:
            trial.set_user_attr("eval_returns", evaluated)


def _open_study(study_dir: Path, run: ResolvedRun, space: Space, seeds: int, trials: int | None = None) -> Any:
    """Opens (or makes) the study in ``study_dir``, checks it is this search's, and readies a
    search started again: trials left running by a killed search, and those a stopped one marked
    failed (``_interrupt``), are asked again with their values.

    Raises:
        RunError: a ``study.db`` that is not a study, a study of another search (naming the fields
            that differ, the study's values and this command's), or one that already holds more
            finished trials than ``trials`` (nothing to run), before the study is changed.
    """
    import optuna
    import sqlalchemy.exc  # Optuna's RDB storage is SQLAlchemy: its errors are what a bad study.db raises

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    path = study_dir / "study.db"
    try:
        study = optuna.create_study(
            study_name=STUDY_NAME,
            storage=f"sqlite:///{path.absolute()}",
            load_if_exists=True,
            direction="maximize",
            sampler=optuna.samplers.TPESampler(seed=run.config.seed),
            pruner=_pruner(run),
        )
    except sqlalchemy.exc.SQLAlchemyError as error:  # not a database, or not Optuna's
        reason = str(getattr(error, "orig", None) or error).splitlines()[0]
        raise RunError(f"{path} is not a study kitae tune can open ({reason}); give another --study-dir") from None
    spec = {"algo": run.algo, "env": run.env.id, "steps": run.total, "seeds": seeds,
            "space": {k: list(v) for k, v in space.items()}}  # fmt: skip
    if run.config.train_cfg.eval_episodes:  # another score: a search that evaluates is another search
        spec["eval_episodes"] = run.config.train_cfg.eval_episodes
    if run.env.kwargs:  # another environment: another search (studies without them keep their spec)
        spec["env_kwargs"] = run.env.env_kwargs
    recorded = study.user_attrs.get("spec")
    if recorded is None:
        study.set_user_attr("spec", spec)
    elif recorded != spec:
        differs = sorted(k for k in {*spec, *recorded} if recorded.get(k) != spec.get(k))
        what = "; ".join(
            f"{k}: the study's {_spec_value(k, recorded.get(k))}, this command's {_spec_value(k, spec.get(k))}"
            for k in differs
        )
        raise RunError(
            f"{study_dir} holds a study of another search ({what}); give the same command to continue it, or "
            "another --study-dir"
        )
    if trials is not None and (finished := _finished(study)) > trials:
        raise RunError(
            f"{study_dir} already holds {finished} finished trials, more than --trials {trials}: nothing to run; "
            f"its best is in {study_dir / 'best.yaml'} (pass --trials N with N > {finished} to run more)"
        )
    # trials left running by a search that was killed, and those a stopped search failed
    # (``_interrupt``): failed, and asked again with their values, in the order they were asked.
    # A search killed inside ``study.ask`` leaves a trial whose values were not all chosen: it never
    # trained, so it is failed and not asked again (enqueueing its partial values would fix them).
    held = len(study.get_trials(deepcopy=False))
    stopped = set(study.user_attrs.get(INTERRUPTED, []))
    for trial in study.get_trials(deepcopy=False):
        if trial.state == optuna.trial.TrialState.RUNNING:
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        elif trial.number not in stopped or trial.state != optuna.trial.TrialState.FAIL:
            continue
        if set(trial.params) == set(space):
            study.enqueue_trial(trial.params, skip_if_exists=False)
    if stopped:
        study.set_user_attr(INTERRUPTED, [])
    # A sampler seeded as the first start's would draw that start's values again (TPE's first
    # trials are random draws): a search started again seeds it past the trials it holds.
    study.sampler = optuna.samplers.TPESampler(seed=run.config.seed + held)
    return study


def _spec_value(key: str, value: Any) -> str:
    """A value of a study's recorded search (``_open_study``) as the command line gives it."""
    if value is None:
        return "none"
    if key == "space":
        return ", ".join(f"{k}={lo:g}:{hi:g}" + (":log" if log else "") for k, (lo, hi, log) in value.items())
    if isinstance(value, dict):
        return ", ".join(f"{k}={v!r}" for k, v in value.items()) or "none"
    return str(value)


def _interrupt(study: Any, trials: list[Any]) -> None:
    """Marks the trials a stopped search was training failed at once (``trials.csv`` then says
    so, not RUNNING) and records them in the study, so that the same command started again asks
    them again with their values, as it does the trials of a killed search (``_open_study``)."""
    import optuna

    for trial in trials:  # asked and not told: still running
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    if trials:
        study.set_user_attr(INTERRUPTED, [*study.user_attrs.get(INTERRUPTED, []), *(t.number for t in trials)])


def _pruner(run: ResolvedRun) -> Any:
    import optuna

    return optuna.pruners.MedianPruner(n_startup_trials=4, n_warmup_steps=run.total // 4)


def _finished(study: Any) -> int:
    import optuna

    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    return len(study.get_trials(deepcopy=False, states=states))


def _tell(study: Any, trial: Any, value: float, pruned: bool, diverged: bool) -> None:
    import optuna

    if diverged:
        trial.set_user_attr("diverged", True)
    if pruned or diverged or not math.isfinite(value):
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
    else:
        study.tell(trial, value)


def _batch_compiled(
    run: ResolvedRun, env: Any, trials: list[Any], seeds: list[int], stop: Any, bar: ProgressBar
) -> tuple[_Reporter, RunResult]:
    values = {key: [t.params[key] for t in trials for _ in seeds] for key in trials[0].params}
    reporter = _Reporter(trials, len(seeds), run.total)
    result = CompiledExecutor().run(
        run.make_agent(),
        env,
        run.total,
        seeds=[s for _ in trials for s in seeds],
        variants=values,
        callbacks=[reporter, bar, stop],
    )
    if run.config.train_cfg.eval_episodes and not stop():
        for t, trial in enumerate(trials):
            if t in reporter.pruned:
                continue
            # the trial's own agent: a searched value may change how it acts
            agent = dataclasses.replace(run, config=with_values(run.config, trial.params)).make_agent()
            for k in range(len(seeds)):
                row = t * len(seeds) + k
                state = jax.tree_util.tree_map(lambda x, row=row: x[row], result.state.agent_state)
                reporter.evaluations[row] = _evaluate(run, agent, state)
    return reporter, result


def _evaluate(run: ResolvedRun, agent: Any, state: Any) -> float:
    """The mean return of ``state``'s deterministic policy over ``train_cfg.eval_episodes``
    episodes, as ``kitae eval`` evaluates a run (the executor's ``evaluate``, seed 0)."""
    returns = run.executor.evaluate(
        agent, run.env, run.config.train_cfg.eval_episodes, params=agent.acting_params(state)
    )
    return float(np.mean(returns))


def _trial_host(run: ResolvedRun, trial: Any, seeds: list[int], stop: Any, bar: ProgressBar) -> tuple[_Reporter, bool]:
    config = with_values(run.config, trial.params)
    trial_run = dataclasses.replace(run, config=config)
    reporter, diverged = _Reporter([trial], len(seeds), run.total), False
    for i, seed in enumerate(seeds):
        reporter.first_row, reporter.next = i, reporter.every
        env = make_run_env(run.env, config.env_cfg.n_envs)
        agent = trial_run.make_agent(seed)
        try:
            result = run.executor.run(agent, env, run.total, callbacks=[reporter, bar, stop])
        finally:
            env.close()
        diverged = diverged or any(d is not None for d in result.diverged)
        if reporter.pruned or diverged or stop():
            break
        if config.train_cfg.eval_episodes:
            reporter.evaluations[i] = _evaluate(trial_run, agent, result.state.agent_state)
    reporter.first_row = 0
    return reporter, diverged


def trial_task(run: ResolvedRun, storage: str, trial_id: int, seeds: list[int]) -> dict:
    """One host-loop trial, in a Ray task: the trial ``trial_id`` of the study in ``storage``
    (asked by the search's own process), trained as ``_trial_host`` trains it, its intermediate
    returns reported to the study and pruned as its pruner says. Returns ``{"score", "pruned",
    "diverged", "stopped"}``; the search's process tells the study."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=STUDY_NAME, storage=storage, pruner=_pruner(run))
    trial = optuna.trial.Trial(study, trial_id)  # the asked trial, continued in this process
    with stop_on_signals(STOPPING) as stop:  # a cancelled task (Ctrl-C on the search) stops its trial
        reporter, diverged = _trial_host(run, trial, seeds, stop, ProgressBar("", quiet=True))
    if not stop():
        reporter.record(0)
    return {"score": reporter.score(0), "pruned": 0 in reporter.pruned, "diverged": diverged, "stopped": stop()}


def _trials_on_ray(
    study: Any, study_dir: Path, run: ResolvedRun, distributions: dict, seeds: list[int], spec: TuneSpec, stop: Any
) -> None:
    """Host-loop trials ``spec.workers`` at a time in Ray tasks (``trial_task``) until
    ``spec.trials`` have finished or ``stop`` says so (the running tasks are then cancelled: their
    trials are failed, ``_interrupt``, and the next start asks them again)."""
    storage = f"sqlite:///{(study_dir / 'study.db').absolute()}"
    bar = ProgressBar(f"trials {run.algo} {run.env.id}, {spec.workers} Ray workers", spec.quiet)
    running: dict[int, Any] = {}  # asked, not yet told

    def next_task(busy: int) -> tuple[Any, tuple] | None:
        if spec.trials - _finished(study) <= busy:
            return None
        trial = study.ask(distributions)
        running[trial.number] = trial
        # Optuna continues an asked trial in another process from its study and id (the storage's)
        return trial, (run, storage, trial._trial_id, seeds)

    def on_result(trial: Any, out: dict) -> None:
        if out["stopped"]:  # cancelled mid-trial: failed below, asked again on the next start
            return
        del running[trial.number]
        _tell(study, trial, out["score"], out["pruned"], out["diverged"])
        bar.message(f"trial {trial.number}: " + ("pruned" if out["pruned"] else f"{out['score']:.1f}"))

    try:
        in_ray_tasks(
            trial_task, next_task, on_result, spec.workers or 1, spec.address, stop, lambda t: f"trial {t.number}"
        )
    finally:
        bar.close()
    if stop():
        _interrupt(study, list(running.values()))


def tune_run(spec: TuneSpec) -> dict:
    """Runs (or continues) a search (see the module docstring); returns its report (``best``:
    the best trial's number, score and values; ``best_config``: the path of ``best.yaml``;
    ``stopped``, and ``signal`` / ``signum``, the SIGINT or SIGTERM that stopped it, if one did).

    Raises:
        RunError, ValueError, TypeError: for bad input, before the study is touched.
    """
    if spec.trials < 1:
        raise RunError(f"--trials {spec.trials} is not allowed; allowed: an int >= 1")
    if spec.batch < 1:
        raise RunError(f"--batch {spec.batch} is not allowed; allowed: an int >= 1")
    if spec.seeds < 1:
        raise RunError(f"--seeds {spec.seeds} is not allowed; allowed: an int >= 1")
    space = parse_space(spec.space)
    run, env = resolve_train(
        RunSpec(spec.algo, spec.env_id, steps=spec.steps, seed=spec.seed, n_envs=spec.n_envs,
                config_file=spec.config_file, sets=list(spec.sets))
    )  # fmt: skip
    try:
        check_seed_range(run.config.seed, spec.seeds)
        allowed = sweepable_keys(run.config)
        space = space or _default_space(run.algo, run.config)
        if not space:
            raise RunError(f"{run.algo} has no default search space here; give --space KEY=LOW:HIGH[:log]")
        for key, (low, high, _) in space.items():
            if key not in allowed:
                settable = settable_keys(type(run.config.algo_params))
                what = not_sweepable_reason(run.config, key, settable)
                # a field of this config that it does not read is explained by ``what`` alone
                hint = "" if key in settable else did_you_mean(key, set(allowed))
                raise RunError(f"--space {key} cannot be searched: {what}{hint}; allowed: {', '.join(allowed)}")
            with_values(run.config, {key: low})  # each end is a value the config takes
            with_values(run.config, {key: high})
        if run.config.distributed is not None:
            raise RunError("kitae tune does not train distributed runs; drop --set distributed.*")
        if run.config.train_cfg.stop_return is not None:  # pruning and scores compare trials at equal steps
            raise RunError(
                f"train_cfg.stop_return={run.config.train_cfg.stop_return:g} is not allowed in kitae tune: its trials "
                "are compared at the same number of steps; drop it here (kitae train takes it)"
            )
        compiled = isinstance(run.executor, CompiledExecutor)
        instead = "whose trials train --batch at a time in one program already"
        check_workers(spec.workers, spec.address, compiled, run.env.id, "trials", instead)
    except BaseException:
        env.close()
        raise
    study_dir = (
        Path(spec.study_dir) if spec.study_dir else Path("runs") / f"tune-{run.algo}-{run.env.name}-s{run.config.seed}"
    )
    if study_dir.is_dir() and any(study_dir.iterdir()) and not (study_dir / "study.db").exists():
        env.close()  # a run's or a sweep's directory, or anything else: not a search to continue
        raise RunError(
            f"--study-dir {str(study_dir)!r} already exists and holds no study (study.db); choose another "
            "--study-dir (an existing one is continued only where it holds kitae tune's study)"
        )
    study_dir.mkdir(parents=True, exist_ok=True)
    seeds = [run.config.seed + i for i in range(spec.seeds)]
    try:
        study = _open_study(study_dir, run, space, spec.seeds, spec.trials)
    except RunError:
        env.close()
        raise
    import optuna

    distributions = {k: optuna.distributions.FloatDistribution(lo, hi, log=log) for k, (lo, hi, log) in space.items()}
    clock, stopped = time.perf_counter(), False
    if spec.workers is not None:
        env.close()  # each task makes its own
        with stop_on_signals(STOPPING) as stop:
            _trials_on_ray(study, study_dir, run, distributions, seeds, spec, stop)
        return _report(study, study_dir, run, space, spec, stop, time.perf_counter() - clock)
    with stop_on_signals(STOPPING) as stop:
        while not stopped and (left := spec.trials - _finished(study)) > 0:
            trials = [study.ask(distributions) for _ in range(min(left, spec.batch if compiled else 1))]
            bar = ProgressBar(f"trials {trials[0].number}-{trials[-1].number} {run.algo} {run.env.id}", spec.quiet)
            try:
                if compiled:
                    reporter, result = _batch_compiled(run, env, trials, seeds, stop, bar)
                    k = len(seeds)
                    diverged = [
                        any(d is not None for d in result.diverged[t * k : (t + 1) * k]) for t in range(len(trials))
                    ]
                else:
                    reporter, one = _trial_host(run, trials[0], seeds, stop, bar)
                    diverged = [one]
            finally:
                bar.close()
            stopped = bool(stop())
            if stopped:  # the unfinished trials: failed now, asked again by the next start
                _interrupt(study, trials)
                break
            for t, trial in enumerate(trials):
                reporter.record(t)
                _tell(study, trial, reporter.score(t), t in reporter.pruned, diverged[t])
    env.close()
    return _report(study, study_dir, run, space, spec, stop, time.perf_counter() - clock)


def _report(
    study: Any, study_dir: Path, run: ResolvedRun, space: Space, spec: TuneSpec, stop: StopRequest, wall: float
) -> dict:
    import optuna

    trials = study.get_trials(deepcopy=False)
    with open(study_dir / "trials.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["number", "state", "value", "diverged", "final_returns", "eval_returns", *space])
        for t in trials:
            figures = [
                json.dumps(t.user_attrs[key]) if key in t.user_attrs else ""
                for key in ("final_returns", "eval_returns")
            ]
            value = "" if t.value is None else t.value
            diverged = bool(t.user_attrs.get("diverged"))
            writer.writerow([t.number, t.state.name, value, diverged, *figures, *(t.params.get(k, "") for k in space)])
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    report: dict[str, Any] = {
        "study_dir": str(study_dir),
        "finished": _finished(study),
        "trials": spec.trials,
        "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in trials),
        "diverged": sum(bool(t.user_attrs.get("diverged")) for t in trials),
        "stopped": stop(),
        "signal": stop.name,
        "signum": stop.signal,
        "wall_seconds": wall,
        "best": None,
        "best_config": None,
        "score": "evaluation return" if run.config.train_cfg.eval_episodes else "final return",
    }
    if complete:
        best = study.best_trial
        config = with_values(run.config, best.params)
        path = study_dir / "best.yaml"
        path.write_text(best_config_yaml(config, best.number, best.value, report["score"]))
        report["best"] = {"number": best.number, "value": best.value, "params": best.params}
        report["best_config"] = str(path)
    return report


def best_config_yaml(config: AlgoConfig, number: int, value: float, score: str = "final return") -> str:
    """A config file (the keys of a preset section) holding ``config``: what ``kitae train
    --config`` takes; its first line names the trial and its score (``score``: what it is)."""
    data = config.to_dict()
    section = {
        "seed": data["seed"],
        "n_envs": config.env_cfg.n_envs,
        "n_env_steps": config.train_cfg.n_env_steps,
        **({"env_kwargs": config.env_cfg.env_kwargs} if config.env_cfg.env_kwargs else {}),
        "algo_params": data["algo_params"],
        "update_cfg": data["update_cfg"],
        "train_cfg": {k: v for k, v in data["train_cfg"].items() if k != "n_env_steps"},
        "replay": data["replay"],
    }
    header = f"# kitae tune: the best trial ({number}), {score} {value:.2f}\n"
    return header + yaml_text(section)
