"""Hyperparameter sweeps: ``kitae sweep ALGO ENV --grid KEY=V1,V2,... --seeds K``.

Every combination of the grid's values trains with every seed. In a JAX environment the whole
sweep is ONE compiled program: the swept float hyperparameters become traced values of the agent
(``kitae.loops.program.make_variant_functions``), vmapped beside the seeds, so C combinations x K
seeds cost one compile and one batched run. Fields that decide shapes or the program's structure
(integers, booleans, strings, ``None``) cannot be traced; the sweep refuses them and names the
keys it can sweep (``kitae.config.sweepable_keys``). In the host loop (Gymnasium, EnvPool,
PettingZoo) the combinations train one after another, each as ``kitae train`` would, or, with
``workers=N`` (``kitae sweep ... --workers N``), N at a time in Ray tasks, on a runtime the sweep
starts on 127.0.0.1 or on an existing cluster (``address``): each task trains one combination
exactly as the sequential sweep does (the same run directory, the same bits).

The sweep directory::

    SWEEP_DIR/
      <key>=<value>,.../   one run directory per combination (docs/runs.md: config.yaml,
                           checkpoints/, logs/, metrics.jsonl, summary.json, curve.png), which
                           kitae resume, eval and plot take like any other
      sweep-plan.json      the sweep as asked (algorithm, environment, grid, seeds, steps, workers),
                           written first: ``kitae resume SWEEP_DIR`` finishes a stopped sweep
      sweep.json           the grid, and per combination its values, final returns (per seed,
                           mean, std, min, max), whether it diverged, its run directory; timings
      table.txt            the same as a table, best mean final return first
      curves.png           one line (mean over seeds) and band (min-max) per combination

A combination that diverges (``kitae.loops.collect.update_step``: a non-finite loss or state) is
marked ``diverged`` in the table and ``sweep.json``; its seeds stop updating and the other
combinations go on. Ctrl-C stops the sweep: a compiled sweep after the current segment with each
combination's checkpoint saved; a host sweep stops its running combinations with their checkpoints
and starts no other (one after another, under one stop request: a signal that comes as one
combination ends, or between two, lets it finish and stops the sweep there); the command names
which combinations finished, stopped with a checkpoint, or had not started. ``kitae resume
SWEEP_DIR`` (``kitae.runs.sweep_resume``) finishes it: a compiled sweep goes on as one program
from its combinations' checkpoints (the bits of a sweep never stopped), a host sweep resumes the
stopped combinations and trains those not started; then the table and plot are written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import time
from pathlib import Path
from typing import Any

import jax

from kitae.config import not_sweepable_reason, sweepable_keys
from kitae.loops.callbacks import Callback, RunInfo, WriterLogger
from kitae.loops.compiled import CompiledExecutor
from kitae.loops.result import Episodes, RunResult
from kitae.loops.state import Payload, pick_seed
from kitae.runs.callbacks import ImportWhileTraining, MetricsLogger, checkpoint_callbacks, stop_at_return
from kitae.runs.checkpoints import CHECKPOINT_MODULES, Checkpointer
from kitae.runs.errors import RunDiverged, RunError
from kitae.runs.grid import learning_rate_set, parse_grid, with_values
from kitae.runs.load import checkpoint_dirs
from kitae.runs.lock import in_use_by_this_process
from kitae.runs.plotting import PLOT_MODULES
from kitae.runs.presets import did_you_mean, settable_keys
from kitae.runs.progress import ProgressBar
from kitae.runs.ray_tasks import check_workers, in_ray_tasks
from kitae.runs.resolve import ResolvedRun, RunSpec, resolve_train
from kitae.runs.resume import resume_run
from kitae.runs.rundir import (
    SWEEP_PLAN,
    MetricsFile,
    claim_new_run_dir,
    read_metrics,
    state_fingerprint,
    training_summary,
    write_config,
)
from kitae.runs.session import execute, plot_run, stopped_early, train_plans
from kitae.runs.signals import stop_on_signals
from kitae.runs.summary import run_divergences, write_run_summary
from kitae.runs.sweep_report import combination_name, counted, format_table, write_sweep
from kitae.runs.tensorboard import flush_to_disk, tensorboard_writer

__all__ = ["PLAN", "SweepSpec", "parse_grid", "sweep_run", "format_table", "with_values", "train_combination"]

PLAN = SWEEP_PLAN  # the sweep as asked, written before training: what kitae resume finishes


@dataclasses.dataclass
class SweepSpec:
    """What ``kitae sweep`` was asked for.

    Attributes:
        algo, env_id: as ``kitae train``.
        grid: ``["update_cfg.learning_rate=1e-4,3e-4", ...]``: each key's values.
        seeds: seeds per combination (``seed``, ``seed + 1``, ...).
        steps, seed, n_envs, config_file, sets: as ``kitae train`` (the fields not swept).
        sweep_dir: the sweep directory (default ``runs/sweep-<algo>-<env>-<time>``).
        quiet: no progress bar.
        workers: host-loop environments only: train this many combinations at a time in Ray tasks
            (``None``: one after another in this process). On a cluster, the sweep directory must
            be on a file system every node writes to.
        address: with ``workers``: ``HOST:PORT`` of an existing Ray cluster (default: a runtime
            started for the sweep on 127.0.0.1 and shut down after it).
    """

    algo: str
    env_id: str
    grid: list[str]
    seeds: int = 1
    steps: int | None = None
    seed: int | None = None
    n_envs: int | None = None
    config_file: str | None = None
    sets: list[str] = dataclasses.field(default_factory=list)
    sweep_dir: str | None = None
    quiet: bool = False
    workers: int | None = None
    address: str | None = None


class _Split(Callback):
    """Hands each combination's share of a sweep program's events to that combination's callbacks:
    rows ``c * K .. c * K + K - 1`` of the batch are combination ``c``'s seeds."""

    def __init__(self, children: list[list[Callback]], seeds: list[int]) -> None:
        self.children, self.seeds = children, seeds

    def _of(self, row: int) -> tuple[list[Callback], int]:
        return self.children[row // len(self.seeds)], row % len(self.seeds)

    def on_start(self, info: RunInfo) -> None:
        for callbacks in self.children:
            for cb in callbacks:
                cb.on_start(dataclasses.replace(info, seeds=self.seeds))

    def on_episodes(self, episodes: Episodes) -> None:
        callbacks, index = self._of(episodes.seed_index)
        for cb in callbacks:
            cb.on_episodes(
                Episodes(
                    episodes.step, episodes.return_, episodes.length, episodes.count, episodes.agent_returns, index
                )
            )

    def on_losses(self, step: int, losses: dict[str, float], seed_index: int | None) -> None:
        callbacks, index = self._of(seed_index or 0)
        for cb in callbacks:
            cb.on_losses(step, losses, index)

    def should_stop(self) -> bool:
        """When every combination's callbacks would stop (``train_cfg.stop_return``): the
        combinations share one program."""
        # every combination's StopAtReturn looks (and records its returns), not only up to a "no"
        stops = [any(cb.should_stop() for cb in callbacks) for callbacks in self.children]
        return all(stops)

    def on_checkpoint(self, payload: Payload) -> None:
        k = len(self.seeds)
        for c, callbacks in enumerate(self.children):
            # one payload per combination, handed to each of its callbacks: its checkpoint saver
            # finds there the evaluation its PeriodicEvaluation made of that same payload
            share = Payload(_rows(payload.state, c * k, k), {**payload.meta, "seeds": self.seeds})
            for cb in callbacks:
                cb.on_checkpoint(share)


def _rows(tree: Any, first: int, count: int) -> Any:
    """Rows ``first .. first + count - 1`` of every leaf of a batched tree (a ``LoopState``, metrics)."""
    return jax.tree_util.tree_map(lambda x: x[first : first + count], tree)


def _share(result: RunResult, c: int, seeds: list[int]) -> RunResult:
    """Combination ``c``'s part of the sweep program's result (its seeds' rows)."""
    k = len(seeds)
    return dataclasses.replace(
        result,
        seeds=seeds,
        state=_rows(result.state, c * k, k),
        episodes=result.episodes[c * k : (c + 1) * k],
        update_steps=result.update_steps[c * k : (c + 1) * k],
        diverged=result.diverged[c * k : (c + 1) * k],
        metrics=_rows(result.metrics, c * k, k),
    )


def _compiled_sweep(
    run: ResolvedRun,
    env: Any,
    combos: list[tuple[dict[str, float], ResolvedRun]],
    quiet: bool,
    clock: float,
    start: Any = None,
    first_step: int = 0,
) -> tuple[list[RunResult] | None, dict | None]:
    """Trains every combination x seed in one program; writes each combination's logs and
    checkpoints as it goes. Returns each combination's result (``None`` if stopped) and the stop.
    ``start``: the ``LoopState`` of every row (combination-major) to go on from, at ``first_step``
    (a resumed sweep, ``kitae.runs.sweep_resume``)."""
    seeds = run.seeds or [run.config.seed]
    rows = [s for _ in combos for s in seeds]
    variants = {key: [values[key] for values, _ in combos for _ in seeds] for key in combos[0][0]}
    agent = run.make_agent()
    executor = CompiledExecutor()
    with contextlib.ExitStack() as stack:
        stop = stack.enter_context(stop_on_signals())
        children, savers, targets = [], [], []
        for _, combo in combos:
            stack.enter_context(in_use_by_this_process(combo.run_dir))
            metrics = MetricsFile(combo.run_dir / "metrics.jsonl")
            stack.callback(metrics.close)
            writer = stack.enter_context(tensorboard_writer(combo.run_dir, first_step + 1 if first_step else None))
            if not first_step:
                writer.add_text("config", "```\n" + combo.config.to_yaml() + "\n```")

            def flush(metrics: MetricsFile = metrics, writer: Any = writer) -> None:
                metrics.flush()
                flush_to_disk(writer)

            episodes = combo.config.train_cfg.eval_episodes
            # the combination's own agent: a swept value may change how it acts
            agent_of = combo.make_agent() if episodes else None
            saver, saving = checkpoint_callbacks(
                Checkpointer.for_run(combo.run_dir / "checkpoints", combo.config.train_cfg, before_save=flush),
                agent_of, run.executor, run.env, episodes, metrics, writer, seeds, stop,
            )  # fmt: skip
            savers.append(saver)
            target = stop_at_return(combo.config.train_cfg, len(seeds), saver)
            targets.append(target)
            children.append([MetricsLogger(metrics, seeds), *saving, *target, WriterLogger(writer)])
        bar = ProgressBar(f"sweep {len(combos)} x {len(seeds)} {type(agent).__name__} {run.env.id}", quiet)
        if not quiet:
            sizes = f"{counted(len(combos), 'combination')} x {counted(len(seeds), 'seed')}"
            bar.message(f"compiling the sweep ({sizes}, one program)...")
        try:
            callbacks = [_Split(children, seeds), bar, stop, ImportWhileTraining(*CHECKPOINT_MODULES, *PLOT_MODULES)]
            result = executor.run(
                agent, env, run.total, start=start, seeds=rows, variants=variants, callbacks=callbacks
            )
        finally:
            bar.close()
        shares = [_share(result, c, seeds) for c in range(len(combos))]
        if result.stopped and stop():  # Ctrl-C, SIGTERM (else every combination reached train_cfg.stop_return)
            return None, {"stopped": True, "signal": stop.name, "signum": stop.signal, "steps": result.env_steps}
        for (_, combo), share, saver, target in zip(combos, shares, savers, targets):
            divergences = run_divergences(share, combo.run_dir, saver.last)
            share_rows = (
                read_metrics(combo.run_dir / "metrics.jsonl") if (combo.run_dir / "metrics.jsonl").exists() else []
            )
            plot_run(combo, share_rows)
            fingerprints = [state_fingerprint(pick_seed(share.state.agent_state, i)) for i in range(len(seeds))]
            write_run_summary(
                combo,
                [share],
                share_rows,
                fingerprints,
                divergences,
                share.env_steps,
                time.perf_counter() - clock,
                {
                    "sweep": str(run.run_dir),
                    **({"resumed_from": first_step} if first_step else {}),
                    **({"stopped_early": [stopped_early(seeds, share, target)]} if result.stopped else {}),
                },
            )
    return shares, None


def train_combination(
    combo: ResolvedRun, sweep_dir: str, env: Any = None, quiet: bool = True, resume: bool = False
) -> dict:
    """Trains one combination of a host-loop sweep as ``kitae train`` would (its environments made
    here unless ``env`` is given), or with ``resume`` goes on from its checkpoint as ``kitae
    resume`` does; returns its ``summary.json`` content, or the stop's description when a signal
    stopped it. A divergence is recorded in its summary; the sweep goes on."""
    try:
        if resume:
            return resume_run(combo.run_dir, combo.total, quiet=quiet)
        agent = combo.make_agent()
        with in_use_by_this_process(combo.run_dir):
            summary, _ = execute(
                combo, train_plans(combo, agent, env), combo.total, quiet=quiet, extra_summary={"sweep": sweep_dir}
            )
    except RunDiverged:
        return json.loads((combo.run_dir / "summary.json").read_text())
    return summary


def _host_sweep(
    run: ResolvedRun,
    env: Any,
    combos: list[tuple[dict[str, float], ResolvedRun]],
    quiet: bool,
    workers: int | None,
    address: str | None,
    resume: frozenset[str] = frozenset(),
) -> dict | None:
    """Trains the combinations one after another, or ``workers`` at a time in Ray tasks (those
    named in ``resume`` go on from their checkpoints). Returns the stop's description when a
    signal stopped the sweep, else ``None``."""
    if workers is None:
        # one request for the whole sweep, shared by each combination's run (``stop_on_signals``
        # nests): a signal that comes as a combination ends or while it writes its summary is
        # not lost (its summary is written, then the sweep stops); one that comes while the next
        # sets up stops that one after its first step, with its checkpoint
        with stop_on_signals() as stop:
            for i, (_, combo) in enumerate(combos):
                going_on = combo.run_dir.name in resume
                summary = train_combination(combo, str(run.run_dir), env if i == 0 else None, quiet, going_on)
                if summary.get("stopped"):  # Ctrl-C: this combination saved its checkpoint; the rest wait
                    return {key: summary[key] for key in ("stopped", "signal", "signum", "steps")}
                if stop():  # the signal came after its last step: it finished; the rest wait
                    return {"stopped": True, "signal": stop.name, "signum": stop.signal, "steps": summary["steps"]}
        return None
    if env is not None:
        env.close()  # each task makes its own
    waiting = [combo for _, combo in combos]
    stopped_at: list[int] = []
    bar = ProgressBar(f"sweep {len(combos)} combinations, {workers} Ray workers", quiet)

    def next_task(_: int) -> tuple[ResolvedRun, tuple] | None:
        if not waiting:
            return None
        combo = waiting.pop(0)
        # absolute: a task on another node of a cluster starts elsewhere than this process
        remote = dataclasses.replace(combo, run_dir=combo.run_dir.absolute())
        return combo, (remote, str(run.run_dir.absolute()), None, True, combo.run_dir.name in resume)

    def on_result(combo: ResolvedRun, summary: dict) -> None:
        if summary.get("stopped"):
            stopped_at.append(int(summary["steps"]))
        bar.message(f"{combo.run_dir.name}: done")

    with stop_on_signals() as stop:
        try:
            in_ray_tasks(train_combination, next_task, on_result, workers, address, stop, lambda c: c.run_dir.name)
        finally:
            bar.close()
        if stop.should_stop():
            return {"stopped": True, "signal": stop.name, "signum": stop.signal, "steps": max(stopped_at, default=0)}
    return None


def _where_each_stopped(combos: list[tuple[dict[str, float], ResolvedRun]]) -> dict[str, list[str]]:
    """After a stop, each combination's directory name by what it holds: ``finished`` (its
    summary.json written before the stop; not one ``kitae eval`` wrote alone), ``checkpointed``
    (stopped mid-run, its checkpoint saved: ``kitae resume`` goes on with it) and ``not_started``
    (a sequential or Ray sweep had not reached it: only its config.yaml). Read from disk, so it
    holds however the stop reached each one."""
    where: dict[str, list[str]] = {"finished": [], "checkpointed": [], "not_started": []}
    for _, combo in combos:
        if training_summary(combo.run_dir) is not None:
            where["finished"].append(combo.run_dir.name)
        elif any(Checkpointer(d).all_steps() for d in checkpoint_dirs(combo.run_dir).values()):
            where["checkpointed"].append(combo.run_dir.name)
        else:
            where["not_started"].append(combo.run_dir.name)
    return where


def sweep_run(spec: SweepSpec) -> dict:
    """Runs a sweep (see the module docstring) and writes its directory; returns ``sweep.json``'s
    content, or when a signal stopped it ``{"stopped": True, "signal", "signum", "steps",
    "sweep_dir", "finished", "checkpointed", "not_started"}`` (the last three: lists of
    combination directory names, see ``_where_each_stopped``).

    Raises:
        RunError, ValueError, TypeError: for bad input (a key that cannot be swept, a value its
            field refuses), before anything is written.
    """
    grid = parse_grid(spec.grid)
    if spec.seeds < 1:
        raise RunError(f"--seeds {spec.seeds} is not allowed; allowed: an int >= 1")
    rate = learning_rate_set(spec.grid)  # read as --set reads it: each combination is its kitae train
    run, env = resolve_train(
        RunSpec(
            spec.algo,
            spec.env_id,
            steps=spec.steps,
            seed=spec.seed,
            seeds=spec.seeds,
            n_envs=spec.n_envs,
            config_file=spec.config_file,
            sets=[*spec.sets, *([rate] if rate else [])],
            run_dir=spec.sweep_dir,
        )
    )
    try:
        allowed = sweepable_keys(run.config)
        for key in grid:
            if key not in allowed:
                settable = settable_keys(type(run.config.algo_params))
                what = not_sweepable_reason(run.config, key, settable)
                # a field of this config that it does not read is explained by ``what`` alone
                hint = "" if key in settable else did_you_mean(key, set(allowed))
                raise RunError(f"--grid {key} cannot be swept: {what}{hint}; allowed: {', '.join(allowed)}")
        if run.config.distributed is not None:
            raise RunError("kitae sweep does not train distributed runs; drop --set distributed.*")
        compiled = isinstance(run.executor, CompiledExecutor)
        instead = "whose sweep is one compiled program already"
        check_workers(spec.workers, spec.address, compiled, run.env.id, "combinations", instead)
        sweep_dir = Path(spec.sweep_dir) if spec.sweep_dir else Path("runs") / f"sweep-{run.run_dir.name}"
        if spec.sweep_dir and sweep_dir.exists() and any(sweep_dir.iterdir()):
            raise RunError(
                f"sweep directory {str(sweep_dir)!r} already exists and is not empty; choose another --sweep-dir"
            )
        seeds = [run.config.seed + i for i in range(spec.seeds)]
        run = dataclasses.replace(run, run_dir=sweep_dir, seeds=seeds)
        combos = []
        for point in itertools.product(*grid.values()):
            values = dict(zip(grid, point))
            config = with_values(run.config, values)  # validates each value: refused before anything is written
            combo_dir = sweep_dir / combination_name(values)
            combos.append((values, dataclasses.replace(run, config=config, run_dir=combo_dir)))
    except BaseException:
        env.close()
        raise
    if not spec.sweep_dir:  # named by the second it starts: claimed atomically, as kitae train's default
        claimed = claim_new_run_dir(sweep_dir)
        if claimed != sweep_dir:
            sweep_dir, run = claimed, dataclasses.replace(run, run_dir=claimed)
            combos = [(values, dataclasses.replace(c, run_dir=claimed / c.run_dir.name)) for values, c in combos]
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(in_use_by_this_process(sweep_dir, "sweep directory"))
        except RunError:  # another process sweeps in it
            env.close()
            raise
        if spec.sweep_dir and any(sweep_dir.iterdir()):  # again, held: another sweep may have started in it
            env.close()
            raise RunError(
                f"sweep directory {str(sweep_dir)!r} already exists and is not empty; choose another --sweep-dir"
            )
        clock = time.perf_counter()
        for _, combo in combos:
            combo.run_dir.mkdir(parents=True, exist_ok=True)
            write_config(combo.run_dir, combo.config)
        plan = {
            "algo": run.algo,
            "env": run.env.id,
            "grid": grid,
            "seeds": seeds,
            "steps": run.total,
            "workers": spec.workers,
            "address": spec.address,
            "combinations": [{"values": values, "name": combo.run_dir.name} for values, combo in combos],
        }
        (sweep_dir / PLAN).write_text(json.dumps(plan, indent=2) + "\n")
        if compiled:
            results, stopped = _compiled_sweep(run, env, combos, spec.quiet, clock)
            if stopped is not None:
                return {**stopped, **_where_each_stopped(combos), "sweep_dir": str(sweep_dir)}
            assert results is not None
            compile_seconds, train_seconds = results[0].compile_seconds, results[0].train_seconds
        else:
            stopped = _host_sweep(run, env, combos, spec.quiet, spec.workers, spec.address)
            if stopped is not None:
                return {**stopped, **_where_each_stopped(combos), "sweep_dir": str(sweep_dir)}
            compile_seconds = train_seconds = float("nan")
        return write_sweep(
            sweep_dir,
            run,
            grid,
            combos,
            compiled,
            spec.workers,
            time.perf_counter() - clock,
            compile_seconds,
            train_seconds,
        )
