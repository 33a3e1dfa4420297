"""Resuming a run from its newest readable checkpoint: ``kitae resume RUN_DIR`` and
``agent.resume(env)``, on the road of ``kitae.runs.session`` (its plans and ``execute``).

The run's total becomes ``steps`` (default its ``train_cfg.n_env_steps``; ``config.yaml`` records
a new total); ``metrics.jsonl`` drops the rows logged after the checkpoint; the new TensorBoard
event file purges the old file's events past it. A compiled run comes back whole (environments
included) and ends bit for bit where an uninterrupted one ends; a host run's environments are
reset and the episodes that were running are marked truncated at the cut. A run that diverged
(every seed of it) is reported again (``RunDiverged``) instead of trained on, and a host run's seed
that diverged is not trained on by a resume of the others; a run whose
checkpoints end where its total ends but which has no ``summary.json`` gets its summary written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from kitae.loops.result import RunResult
from kitae.loops.state import apply_loop_state
from kitae.runs.checkpoints import CheckpointError
from kitae.runs.errors import RunDiverged, RunError
from kitae.runs.load import checkpoint_dirs, refuse_a_run_of_several_seeds, restore_error, restore_payload, run_seeds
from kitae.runs.lock import in_use_by_this_process
from kitae.runs.resolve import ResolvedRun, make_run_env, resolve_agent, resolve_run_dir
from kitae.runs.rundir import check_run_dir, read_run_config, truncate_metrics, write_config
from kitae.runs.session import Plan, execute
from kitae.runs.summary import describe_divergence, every_seed_diverged
from kitae.validation import check_positive_int

__all__ = ["resume_run", "resume_agent"]


def _read_summary(run_dir: Path) -> dict:
    """The run's ``summary.json``, or ``{}`` when it has none or it cannot be read (the
    checkpoints decide then, as without one)."""
    path = run_dir / "summary.json"
    try:
        summary = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, json.JSONDecodeError):
        return {}
    return summary if isinstance(summary, dict) else {}


def _report_again(summary: dict, env: Any = None) -> RunDiverged:
    """The ``RunDiverged`` a run's ``summary.json`` records, with the line ``kitae train`` printed
    (``env`` closed)."""
    if hasattr(env, "close"):
        env.close()
    several = "seeds" in summary
    return RunDiverged("; ".join(describe_divergence(entry, several=several) for entry in summary["diverged"]))


def _refuse_a_diverged_run(run_dir: Path, env: Any = None) -> None:
    """A run whose ``summary.json`` records that it diverged, every seed of it
    (``every_seed_diverged``: a run of one seed, a sweep's combination), is reported again with
    the line ``kitae train`` printed, before anything is made or compiled: its newest checkpoint
    holds the last finite parameters, from which the same config diverges again. (A run of seeds
    where some did not diverge goes on: the diverged ones stay so.)

    Raises:
        RunDiverged: naming the step and the losses, as when it diverged (``env`` closed).
    """
    summary = _read_summary(run_dir)
    if every_seed_diverged(summary):
        raise _report_again(summary, env)


def _diverged_seeds(run_dir: Path) -> dict[int, dict]:
    """``{seed: its summary.json "diverged" entry}`` of a host run of several seeds: a seed that
    diverged is not trained on by a resume (its newest checkpoint holds the last finite parameters,
    from which the same config diverges again); its entry goes on into the new summary."""
    summary = _read_summary(run_dir)
    return {entry["seed"]: entry for entry in summary.get("diverged") or [] if isinstance(entry, dict)}


def _check_total(run_dir: Path, reached: int, total: int, python: bool = False) -> None:
    """Refuses a total the run reached already, saying how to give a larger one: ``--steps N``
    on the command line, ``agent.resume(env, n_env_steps)`` from Python (``python``)."""
    if reached >= total:
        further = (
            f"call agent.resume(env, n_env_steps) with n_env_steps > {reached}"
            if python
            else (f"pass --steps N with N > {reached}")
        )
        raise RunError(
            f"the run in {str(run_dir)!r} already reached step {reached:,} of {total:,}; {further} to train it further"
        )


def _prepare_resume(run: ResolvedRun, keep: dict[Any, int]) -> None:
    """Checked: from here on the run directory changes."""
    if run.total != read_run_config(run.run_dir).train_cfg.n_env_steps:
        write_config(run.run_dir, run.config)
    truncate_metrics(run.run_dir / "metrics.jsonl", keep)


def resume_run(run_dir: str | Path, steps: int | None = None, quiet: bool = False) -> dict:
    """Goes on training the run in ``run_dir`` from its newest readable checkpoint until ``steps``
    environment steps in all (default: the run's ``train_cfg.n_env_steps``), then writes the
    summary as ``kitae train`` does. Everything is checked before anything is written. A run whose
    checkpoints already end where a run of ``steps`` ends but which has no ``summary.json`` (killed
    while it wrote it, a sweep's combination stopped then) trains nothing: its summary is written.

    Raises:
        RunError: no such run directory, no readable checkpoint, a run already at ``steps``...
        RunDiverged: a run that diverged, every seed of it (its ``summary.json`` says so),
            before anything is made or written.
    """
    run_dir = check_run_dir(run_dir)
    with in_use_by_this_process(run_dir):
        return _resume_run(run_dir, steps, quiet)


def _resume_run(run_dir: Path, steps: int | None, quiet: bool) -> dict:
    _refuse_a_diverged_run(run_dir)
    seeds = run_seeds(run_dir)
    run = resolve_run_dir(run_dir, steps=steps, seeds=seeds)
    dirs = checkpoint_dirs(run_dir)
    env = make_run_env(run.env, run.config.env_cfg.n_envs)
    plans: list[Plan] = []
    try:
        if None in dirs:  # one folder: one seed, or seeds trained together in one program
            agent = run.make_agent()
            payload, restored = restore_payload(agent, env, run.executor, dirs[None], resuming=True)
            batched = payload.meta.get("seeds")
            done = not batched and restored.step >= run.total
            if done:
                apply_loop_state(agent, payload.state)
            plans.append(
                Plan(
                    dirs[None],
                    run.config.seed,
                    seeds=batched,
                    agent=agent,
                    env=env,
                    start=payload.state,
                    finished=done,
                )
            )
            keep = dict.fromkeys(batched or [run.config.seed], restored.step)
        else:  # a host run of several seeds, one after the other
            keep = {}
            diverged = _diverged_seeds(run_dir)
            for i, seed in enumerate(seeds or []):
                agent = run.make_agent(seed)
                directory = dirs.get(seed, run_dir / "checkpoints" / f"seed-{seed}")
                try:
                    payload, restored = restore_payload(agent, None, run.executor, directory, resuming=True)
                except CheckpointError as error:
                    if i == 0 or not str(error).startswith("no checkpoint in"):
                        raise
                    plans.append(Plan(directory, seed, agent=agent))  # not started yet
                    keep[seed] = 0
                    continue
                step = restored.step
                done = step >= run.total or seed in diverged
                plans.append(
                    Plan(
                        directory,
                        seed,
                        agent=agent,
                        env=env if not plans else None,
                        start=payload.state,
                        finished=done,
                        diverged=diverged.get(seed),
                    )
                )
                if done:
                    apply_loop_state(agent, payload.state)
                # a diverged seed keeps its rows up to where it diverged (past its last checkpoint)
                keep[seed] = max(step, int(diverged[seed]["step"])) if seed in diverged else step
    except CheckpointError as error:
        env.close()
        raise restore_error(error, run) from None
    try:
        # killed (or a sweep stopped) after its last checkpoint, before its summary was written:
        # every seed is where a run of this total ends (whole iterations: a run of 6,000 steps may
        # end at 6,144), so only the summary is left to write
        ends = plans[0].agent.schedule.run_steps(run.total)
        finishing = (
            all(plan.finished for plan in plans)
            and max(keep.values()) <= ends
            # kitae eval writes its fields into summary.json (even one the run never wrote):
            # only a training summary (its "steps") says that the run ended
            and "steps" not in _read_summary(run_dir)
        )
        if not finishing:
            if all(plan.finished for plan in plans) and any(plan.diverged for plan in plans):
                # every seed reached the total or diverged: the run ended as it did, diverged
                raise _report_again(_read_summary(run_dir))
            _check_total(run_dir, min(keep.values()), run.total)
    except (RunError, ValueError):  # RunDiverged too
        env.close()
        raise
    first_step = keep[(seeds or [run.config.seed])[0]]
    _prepare_resume(run, keep)
    if finishing:
        env.close()
        for plan in plans:
            plan.env = None
        if not quiet:
            print(f"finishing {run_dir}: it reached step {first_step:,} of {run.total:,}", file=sys.stderr)
    elif not quiet:
        print(f"resuming {run_dir} from step {first_step:,} to {run.total:,} steps", file=sys.stderr)
    return execute(
        run,
        plans,
        run.total,
        quiet=quiet,
        purge_step=first_step + 1,
        describe_config=False,
        extra_summary={} if finishing else {"resumed_from": first_step},
    )[0]


def resume_agent(
    agent: Any, env: Any, n_env_steps: int | None = None, *, callbacks: Any = (), quiet: bool = True
) -> RunResult:
    """``agent.resume(env, n_env_steps)``: restores ``agent`` from the newest readable checkpoint in
    ``<run_dir>/checkpoints`` and trains on until ``n_env_steps`` in all (default
    ``config.train_cfg.n_env_steps``), writing the run directory as ``kitae resume`` does.

    Raises:
        RunError: no readable checkpoint, or one already at ``n_env_steps``.
        RunDiverged: the run diverged (its ``summary.json`` says so), before anything is restored.
    """
    run = resolve_agent(agent, env)
    total = agent.config.train_cfg.n_env_steps if n_env_steps is None else n_env_steps
    check_positive_int("n_env_steps", total)
    refuse_a_run_of_several_seeds(run.run_dir, agent, env)
    # a directory that does not exist holds no checkpoint: restoring says so
    held = in_use_by_this_process(run.run_dir) if run.run_dir.is_dir() else contextlib.nullcontext()
    with held:
        return _resume_agent(agent, env, run, total, callbacks, quiet)


def _resume_agent(agent: Any, env: Any, run: ResolvedRun, total: int, callbacks: Any, quiet: bool) -> RunResult:
    _refuse_a_diverged_run(run.run_dir, env)
    directory = run.run_dir / "checkpoints"
    try:
        payload, restored = restore_payload(agent, env, run.executor, directory, resuming=True)
    except CheckpointError as error:
        raise restore_error(error, run, road="agent") from None
    batched = payload.meta.get("seeds")
    if not batched:
        apply_loop_state(agent, payload.state)
    _check_total(run.run_dir, restored.step, total, python=True)
    if total != agent.config.train_cfg.n_env_steps:
        # the run's total becomes ``total``, as with kitae resume --steps: config.yaml records it
        # and the agent is the one that config makes (a learning rate annealed over the new total)
        run = run.with_total(total)
        agent.reconfigure(run.config)
        payload, restored = restore_payload(agent, env, run.executor, directory, resuming=True)
        if not batched:
            apply_loop_state(agent, payload.state)
    _prepare_resume(run, dict.fromkeys(batched or [agent.config.seed], restored.step))
    plan = Plan(directory, agent.config.seed, seeds=batched, agent=agent, env=env, start=payload.state)
    _, results = execute(
        dataclasses.replace(run, seeds=batched),
        [plan],
        total,
        quiet=quiet,
        purge_step=restored.step + 1,
        describe_config=False,
        callbacks=list(callbacks) if not hasattr(callbacks, "on_start") else [callbacks],
        extra_summary={"resumed_from": restored.step},
    )
    return results[0]
