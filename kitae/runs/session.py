"""Training a run into its run directory: the one road of ``kitae train``, ``kitae resume``,
``agent.train(env)`` and ``agent.resume(env)``.

Every entry point resolves its run once (``kitae.runs.resolve``), turns it into plans (an agent,
its environments, where it starts, where its checkpoints go) and hands them to ``execute``, which
writes the run directory (``docs/runs.md``): ``config.yaml``, ``checkpoints/<step>/`` every
``train_cfg.save_frequency`` steps, at the end and when stopped with Ctrl-C or SIGTERM,
``logs/`` (TensorBoard), ``metrics.jsonl``, ``summary.json`` and ``curve.png``.

A host-loop run of several seeds trains them one after the other (one checkpoint folder per seed,
``checkpoints/seed-<seed>/``); a compiled run trains them together in one program.

Resuming (``kitae resume``, ``agent.resume(env)``) is ``kitae.runs.resume``, on this road.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

from kitae.distributed.executor import WorkersLost
from kitae.distributed.runtime import check_reachable
from kitae.envs.make import EnvSpec
from kitae.loops.callbacks import WriterLogger
from kitae.loops.result import RunResult
from kitae.loops.state import LoopState, apply_loop_state, pick_seed
from kitae.runs.callbacks import ImportWhileTraining, MetricsLogger, StopAtReturn, checkpoint_callbacks, stop_at_return
from kitae.runs.checkpoints import CHECKPOINT_MODULES, Checkpointer
from kitae.runs.errors import RunDiverged, RunError
from kitae.runs.load import refuse_a_run_of_several_seeds
from kitae.runs.lock import in_use_by_this_process
from kitae.runs.plotting import PLOT_MODULES, curves_from_metrics, evaluations_from_metrics, plot_curves
from kitae.runs.progress import ProgressBar
from kitae.runs.resolve import ResolvedRun, RunSpec, make_run_env, resolve_agent, resolve_train
from kitae.runs.rundir import (
    MetricsFile,
    claim_new_run_dir,
    clear_before_training,
    never_trained,
    read_metrics,
    state_fingerprint,
    write_config,
)
from kitae.runs.signals import StopRequest, stop_on_signals
from kitae.runs.summary import (
    describe_divergence,
    relative_checkpoint,
    run_divergences,
    write_run_summary,
)
from kitae.runs.tensorboard import flush_to_disk, tensorboard_writer
from kitae.validation import check_positive_int

__all__ = [
    "train_run",
    "train_agent",
    "Plan",
    "execute",
    "train_plans",
    "stopped_early",
]


@dataclasses.dataclass
class Plan:
    """One executor call of a run.

    Attributes:
        directory: where its checkpoints go.
        seed: the seed (host runs of several seeds: one plan per seed).
        seeds: the seeds of a compiled run of several seeds (one plan, one program), else ``None``.
        agent: its agent (made from the run when ``None``).
        env: its environments (made from the run when ``None``).
        start: the ``LoopState`` it goes on from (``None``: the agent's own state, or fresh seeds).
        finished: the seed had already reached the total, or diverged (nothing to train).
        diverged: the ``summary.json`` ``diverged`` entry of a host seed that diverged before a
            resume (it stays so: the entry goes on into the new summary).
    """

    directory: Path
    seed: int
    seeds: list[int] | None = None
    agent: Any = None
    env: Any = None
    start: LoopState | None = None
    finished: bool = False
    diverged: dict | None = None


def _fingerprints(result: RunResult) -> list[str]:
    states = result.state.agent_state
    if result.batched:
        return [state_fingerprint(pick_seed(states, i)) for i in range(len(result.seeds))]
    return [state_fingerprint(states)]


def execute(
    run: ResolvedRun,
    plans: list[Plan],
    total: int,
    *,
    quiet: bool,
    purge_step: int | None = None,
    describe_config: bool = True,
    callbacks: Any = (),
    extra_summary: dict | None = None,
) -> tuple[dict, list[RunResult]]:
    """Trains the plans until ``total`` environment steps and writes the run directory.

    Returns:
        ``(summary, results)``: the summary written to ``summary.json`` (or, when a signal stopped
        the run, ``{"stopped": True, "steps": ..., "checkpoint": ...}``) and each plan's
        ``RunResult``.
    """
    run_dir = run.run_dir
    clock = time.perf_counter()
    metrics = MetricsFile(run_dir / "metrics.jsonl")
    results: list[RunResult] = []
    fingerprints: list[str] = []
    stopped: dict | None = None
    divergences: list[dict] = []
    early: list[dict] = []
    steps = 0
    try:
        with tensorboard_writer(run_dir, purge_step) as writer, stop_on_signals() as stop:
            if describe_config:
                writer.add_text("config", "```\n" + run.config.to_yaml() + "\n```")

            def flush() -> None:  # what a checkpoint has seen is on disk before it
                metrics.flush()
                flush_to_disk(writer)

            for index, plan in enumerate(plans):
                agent = plan.agent if plan.agent is not None else run.make_agent(plan.seed)
                if plan.finished:
                    fingerprints.append(state_fingerprint(agent.state))
                    steps = max(steps, int(agent.env_step))
                    divergences.extend([plan.diverged] if plan.diverged else [])
                    continue
                if run.executor.makes_envs:  # the executor's workers make their own from the id
                    if plan.env is not None and not isinstance(plan.env, (str, EnvSpec)):
                        plan.env.close()
                    env = run.env
                else:
                    env = plan.env if plan.env is not None else make_run_env(run.env, run.config.env_cfg.n_envs)
                # a host run of several seeds records them all (also those not started when it stops)
                meta = {"run_seeds": run.seeds} if run.seeds and plan.seeds is None else None
                bar = ProgressBar(f"{type(agent).__name__} {run.env.id}", quiet)
                if run.executor.starting and index == 0:
                    bar.message(run.executor.starting)
                plan_seeds = plan.seeds or [plan.seed]
                extra = [WriterLogger(writer)] if index == 0 else []
                saver, saving = checkpoint_callbacks(
                    Checkpointer.for_run(plan.directory, run.config.train_cfg, before_save=flush, meta=meta),
                    agent,
                    run.executor,
                    run.env,
                    run.config.train_cfg.eval_episodes,
                    metrics,
                    writer if index == 0 else None,
                    plan_seeds,
                    stop,
                )
                target = stop_at_return(run.config.train_cfg, len(plan_seeds), saver)
                try:
                    result = run.executor.run(
                        agent,
                        env,
                        total,
                        start=plan.start,
                        seeds=plan.seeds,
                        callbacks=[
                            MetricsLogger(metrics, plan_seeds),
                            *saving,
                            *target,
                            bar,
                            stop,
                            *extra,
                            *callbacks,
                            ImportWhileTraining(*CHECKPOINT_MODULES, *PLOT_MODULES),
                        ],
                    )
                except WorkersLost as error:  # it saved a checkpoint: the command line names the run to resume
                    error.run_dir = str(run_dir)
                    raise
                finally:
                    bar.close()
                if not result.batched:
                    apply_loop_state(agent, result.state)
                results.append(result)
                fingerprints.extend(_fingerprints(result))
                steps = result.env_steps
                diverged = run_divergences(result, run_dir, saver.last)
                divergences.extend(diverged)
                if result.stopped and not diverged and stop():  # Ctrl-C, SIGTERM: not finished
                    stopped = _stopped(run_dir, saver.last, result.env_steps, stop)
                    break
                if result.stopped and not diverged:  # train_cfg.stop_return, or a callback of the caller's
                    early.append(stopped_early(plan_seeds, result, target))
    finally:
        metrics.close()
    rows = read_metrics(run_dir / "metrics.jsonl")
    plot_run(run, rows)
    if stopped is not None:
        return stopped, results
    keys = {**({"stopped_early": early} if early else {}), **(extra_summary or {})}
    wall = time.perf_counter() - clock
    summary = write_run_summary(run, results, rows, fingerprints, divergences, steps, wall, keys)
    if divergences:
        raise RunDiverged("; ".join(describe_divergence(d, several=bool(run.seeds)) for d in divergences))
    return {**summary, "run_dir": str(run_dir)}, results


def plot_run(run: ResolvedRun, rows: list[dict]) -> None:
    label = f"{run.algo} {run.env.id}"
    plot_curves(
        {label: curves_from_metrics(rows, counts=True)},
        run.run_dir / "curve.png",
        title=run.run_dir.name,
        evaluations={label: evaluations_from_metrics(rows)},
    )


def stopped_early(seeds: list[int], result: RunResult, target: list[StopAtReturn]) -> dict:
    """``summary.json``'s ``stopped_early`` entry of a run (or one host seed) that a callback
    ended before its last step: ``seeds``, ``step`` (where it stopped) and with
    ``train_cfg.stop_return`` the ``target``, the step where the seeds' returns reached it
    (``reached_at``) and those ``returns``; else ``"by": "callback"`` (a callback of the caller's)."""
    reached = target[0].reached if target else None
    entry: dict[str, Any] = {"seeds": seeds, "step": result.env_steps}
    if reached is None:
        return {**entry, "by": "callback"}
    return {
        **entry,
        "by": "train_cfg.stop_return",
        "target": target[0].target,
        "reached_at": reached["step"],  # before "step" when seeds trained together reached it apart
        "returns": reached["returns"],
    }


def _stopped(run_dir: Path, checkpoint: Path | None, steps: int, stop: StopRequest) -> dict:
    where = relative_checkpoint(run_dir, checkpoint)
    return {
        "stopped": True,
        "signal": stop.name,
        "signum": stop.signal,
        "steps": steps,
        "checkpoint": where,
        "run_dir": str(run_dir),
    }


# ---------------------------------------------------------------------------------------------
# kitae train / agent.train
# ---------------------------------------------------------------------------------------------


def _holds_a_run(run_dir: Path) -> bool:
    return run_dir.exists() and any(run_dir.iterdir())


def _not_started(run: ResolvedRun) -> bool:
    """The run directory holds no more than this run writes before its first step
    (``never_trained``: a sweep's combination that had not started when the sweep stopped, a run
    that refused its environment), with the ``config.yaml`` this run would write: training it
    loses nothing."""
    return never_trained(run.run_dir) and (run.run_dir / "config.yaml").read_text() == run.config.to_yaml()


def train_run(spec: RunSpec) -> dict:
    """Trains as ``spec`` says and writes the run directory; returns the summary (or, when the
    run was stopped by a signal, ``{"stopped": True, "steps": ..., "checkpoint": ...}``).

    Raises:
        RunError, ValueError, TypeError, FileNotFoundError: for bad input, before anything is
        written (the run directory is created only once the config is valid).
    """
    run, env = resolve_train(spec)
    if run.config.distributed is not None:  # a cluster that does not answer: refused before anything is written
        try:
            check_reachable(run.config.distributed.address)
        except ConnectionError:
            env.close()
            raise
    if spec.run_dir is None:
        # The default directory is named by the second the run starts, so runs started together
        # (several `kitae train ... &` of one algorithm, environment and seed) would share it:
        # each claims its own with an atomic mkdir (`runs/<name>`, else `runs/<name>-2`, ...).
        agent = _agent_whose_buffers_fit(run, env)
        run.run_dir = claim_new_run_dir(run.run_dir)
        agent.run_dir, agent.run_name = run.run_dir, run.run_dir.name
    else:
        _refuse_a_directory_holding_a_run(run, env)
        agent = _agent_whose_buffers_fit(run, env)
        run.run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(in_use_by_this_process(run.run_dir))
        except RunError:  # another process trains in it
            env.close()
            raise
        if spec.run_dir is not None:
            _refuse_a_directory_holding_a_run(run, env)  # again, held: another process may have trained in it meanwhile
        clear_before_training(run.run_dir)
        write_config(run.run_dir, run.config)
        return execute(run, train_plans(run, agent, env), run.total, quiet=spec.quiet)[0]


def _agent_whose_buffers_fit(run: ResolvedRun, env: Any) -> Any:
    """The run's agent, once its buffers (one per seed where the executor trains seeds together)
    are known to fit in the memory available."""
    agent = run.make_agent()
    _check_buffers_fit(agent, env, len(run.seeds) if run.seeds and run.executor.batches_seeds else 1)
    return agent


def _check_buffers_fit(agent: Any, env: Any, copies: int = 1) -> None:
    """``agent.check_buffer_memory(copies)``, closing ``env`` when it refuses (as the run's other
    refusals do), before anything is written."""
    try:
        agent.check_buffer_memory(copies)
    except ValueError:
        if hasattr(env, "close"):
            env.close()
        raise


def _refuse_a_directory_holding_a_run(run: ResolvedRun, env: Any) -> None:
    if _holds_a_run(run.run_dir) and not _not_started(run):
        env.close()
        raise RunError(f"run directory {str(run.run_dir)!r} already exists and is not empty; choose another --run-dir")


def train_plans(run: ResolvedRun, agent: Any, env: Any) -> list[Plan]:
    """The plans of a new run: one per seed in the host loop (``checkpoints/seed-<seed>/``), one
    for all its seeds where the executor trains them together."""
    root = run.run_dir / "checkpoints"
    if run.seeds and not run.executor.batches_seeds:
        return [
            Plan(root / f"seed-{seed}", seed, agent=agent if i == 0 else None, env=env if i == 0 else None)
            for i, seed in enumerate(run.seeds)
        ]
    return [Plan(root, run.config.seed, seeds=run.seeds, agent=agent, env=env)]


def train_agent(agent: Any, env: Any, n_env_steps: int | None, *, callbacks: Any = (), quiet: bool = True) -> RunResult:
    """``agent.train(env, n_env_steps)``: trains ``n_env_steps`` more steps (default
    ``train_cfg.n_env_steps``) from the agent's state into ``agent.run_dir``, as ``kitae train`` does.
    Past the config's total, the run's total becomes the call's end (``agent.reconfigure``,
    ``config.yaml``), as ``kitae resume --steps`` makes it."""
    n_env_steps = agent.config.train_cfg.n_env_steps if n_env_steps is None else n_env_steps
    check_positive_int("n_env_steps", n_env_steps)
    run = resolve_agent(agent, env)
    refuse_a_run_of_several_seeds(run.run_dir, agent, env)
    fresh = agent.env_step == 0 and agent.n_updates == 0
    total = int(agent.env_step) + n_env_steps
    # past the config's total, the run's total becomes the new one, as kitae resume --steps
    # makes it: kept, a learning rate annealed over the old total stayed at zero past it
    extended = total > agent.config.train_cfg.n_env_steps
    run = run.with_total(total) if extended else run
    if fresh and _holds_a_run(run.run_dir) and not _not_started(run):
        if hasattr(env, "close"):
            env.close()
        if not any((run.run_dir / "checkpoints").rglob("*")):
            raise RunError(
                f"run directory {str(run.run_dir)!r} already holds a run that stopped before its first checkpoint "
                "(nothing to go on from): delete the directory to train it again from the start, or give the agent "
                "another run_name or run_dir"
            )
        raise RunError(
            f"run directory {str(run.run_dir)!r} already holds a run; go on with agent.resume(env), or give the "
            "agent another run_name or run_dir"
        )
    if fresh:
        _check_buffers_fit(agent, env)
    if extended:
        agent.reconfigure(run.config)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    with in_use_by_this_process(run.run_dir):
        if fresh:  # a new directory, or one whose run never trained: started from scratch
            clear_before_training(run.run_dir)
        if extended or not (run.run_dir / "config.yaml").exists():
            write_config(run.run_dir, run.config)
        plan = Plan(run.run_dir / "checkpoints", agent.config.seed, agent=agent, env=env)
        summary, results = execute(
            run,
            [plan],
            total,
            quiet=quiet,
            describe_config=fresh,
            callbacks=list(callbacks) if not hasattr(callbacks, "on_start") else [callbacks],
        )
    return results[0]
