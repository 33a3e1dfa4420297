"""Finishing a stopped sweep: ``kitae resume SWEEP_DIR`` (``resume_sweep``).

A sweep writes ``sweep-plan.json`` (``kitae.runs.sweep.PLAN``) before it trains, so a sweep
stopped by Ctrl-C, SIGTERM or a killed process can be finished from its directory alone:

- a compiled sweep (a JAX environment, every combination x seed in one program) restores each
  combination's checkpoint at the newest step they all have, stacks them into the batch the
  program was running and goes on as that one program: the bits of a sweep never stopped. With
  no such step (killed before its first checkpoint) it starts again from the beginning;
- a host-loop sweep resumes each combination stopped with a checkpoint (as ``kitae resume`` does)
  and trains each one not started (as ``kitae train`` does), one after another or on the Ray
  workers the sweep was given. One whose checkpoint is where its run ends (whole iterations:
  ``Schedule.run_steps``) but which has no ``summary.json`` gets its summary, nothing trained;
  one that diverged (every seed) is done;

then writes ``sweep.json``, ``table.txt`` and ``curves.png`` as an uninterrupted sweep does.
``steps`` (``--steps N``) trains every combination further, to ``N`` steps in all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any, cast

import jax
import jax.numpy as jnp

from kitae.loops.compiled import CompiledExecutor
from kitae.runs.checkpoints import Checkpointer, CheckpointError
from kitae.runs.errors import RunError
from kitae.runs.load import checkpoint_dirs, restore_error, restore_payload
from kitae.runs.lock import in_use_by_this_process
from kitae.runs.resolve import ResolvedRun, make_run_env, resolve_run_dir
from kitae.runs.rundir import check_run_dir, read_run_config, training_summary, truncate_metrics, write_config
from kitae.runs.summary import every_seed_diverged
from kitae.runs.sweep import PLAN, _compiled_sweep, _host_sweep, _where_each_stopped
from kitae.runs.sweep_report import write_sweep
from kitae.schedule import Schedule

__all__ = ["is_sweep_dir", "resume_sweep"]


def is_sweep_dir(path: str | Path) -> bool:
    """``path`` is a sweep directory (it holds ``sweep-plan.json``)."""
    return (Path(path) / PLAN).is_file()


def _reached(combo: ResolvedRun) -> list[int]:
    """The steps of a combination's checkpoints on disk (every seed folder's, for a host run of
    several seeds: those all of them have)."""
    folders = [Checkpointer(d).all_steps() for d in checkpoint_dirs(combo.run_dir).values()]
    return sorted(set.intersection(*map(set, folders))) if folders else []


def _read_plan(sweep_dir: Path) -> dict:
    """``sweep_dir``'s ``sweep-plan.json``, checked for what resuming reads: ``seeds`` (ints),
    ``combinations`` (each a ``name`` and its ``values``, numbers by key), ``grid`` (lists of
    numbers by key), ``workers`` (an int or null), ``address`` (a string or null).

    Raises:
        RunError: naming the file and the first field missing or of another type.
    """
    path = sweep_dir / PLAN
    try:
        plan = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise RunError(f"{path} is not valid JSON ({error}); kitae sweep writes it") from None

    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    def numbers_by_key(x: Any) -> bool:
        return isinstance(x, dict) and all(isinstance(k, str) and number(v) for k, v in x.items())

    checks = {
        "seeds": lambda x: isinstance(x, list) and bool(x) and all(type(v) is int for v in x),
        "combinations": lambda x: (
            isinstance(x, list)
            and bool(x)
            and all(
                isinstance(c, dict) and isinstance(c.get("name"), str) and numbers_by_key(c.get("values")) for c in x
            )
        ),
        "grid": lambda x: isinstance(x, dict) and all(isinstance(v, list) and all(map(number, v)) for v in x.values()),
        "workers": lambda x: x is None or type(x) is int,
        "address": lambda x: x is None or isinstance(x, str),
    }
    what = {
        "seeds": "a list of ints",
        "combinations": "a list of {name, values}",
        "grid": "lists of numbers by key",
        "workers": "an int or null",
        "address": "a string or null",
    }
    if not isinstance(plan, dict):
        raise RunError(f"{path} holds a {type(plan).__name__}, not the sweep's plan; kitae sweep writes it")
    for field, check in checks.items():
        if field not in plan:
            raise RunError(f"{path} lacks {field!r}; kitae sweep writes it")
        if not check(plan[field]):
            raise RunError(
                f"{path}: {field}={plan[field]!r} is not allowed; allowed: {what[field]} (kitae sweep writes it)"
            )
    return plan


def resume_sweep(sweep_dir: str | Path, steps: int | None = None, quiet: bool = False) -> dict:
    """Finishes the stopped sweep in ``sweep_dir`` (see the module docstring).

    Args:
        sweep_dir: a directory ``kitae sweep`` wrote (it holds ``sweep-plan.json``).
        steps: a new total for every combination (default: the sweep's own).
        quiet: no progress bar.

    Returns:
        ``sweep.json``'s content with ``sweep_dir``, as ``kitae.runs.sweep.sweep_run`` returns it,
        or the stop's description when a signal stopped it again.

    Raises:
        RunError: not a sweep directory, a sweep already finished (without a larger ``steps``), a
            combination's directory missing or unreadable.
    """
    sweep_dir = Path(sweep_dir)
    if not is_sweep_dir(sweep_dir):
        raise RunError(f"{str(sweep_dir)!r} is not a sweep directory: it has no {PLAN}")
    plan = _read_plan(sweep_dir)
    seeds: list[int] = plan["seeds"]
    combos: list[tuple[dict[str, float], ResolvedRun]] = []
    for entry in plan["combinations"]:
        combo = resolve_run_dir(check_run_dir(sweep_dir / entry["name"]), steps=steps, seeds=seeds)
        combos.append((entry["values"], combo))
    with contextlib.ExitStack() as held:  # the sweep's directory, and a compiled sweep's combinations' at once
        held.enter_context(in_use_by_this_process(sweep_dir, "sweep directory"))
        if isinstance(combos[0][1].executor, CompiledExecutor):
            for _, combo in combos:
                held.enter_context(in_use_by_this_process(combo.run_dir))
        total = combos[0][1].total
        grid = {key: [float(v) for v in values] for key, values in plan["grid"].items()}
        run = dataclasses.replace(combos[0][1], run_dir=sweep_dir)  # the sweep's agent: the swept values are traced
        clock = time.perf_counter()
        compiled = isinstance(run.executor, CompiledExecutor)
        stopped, compile_seconds, train_seconds = None, float("nan"), float("nan")
        finished = len(_where_each_stopped(combos)["finished"]) == len(combos)
        reached = 0
        # a combination whose every seed diverged is done at any total (kitae resume reports it
        # again, kitae.runs.resume): the others' steps say how far the sweep is
        if finished:
            summaries = [_summary(c) or {} for _, c in combos]
            reached = min((s["steps"] for s in summaries if not every_seed_diverged(s)), default=total)
        if finished and reached >= total:
            if (sweep_dir / "sweep.json").exists():
                raise RunError(
                    f"the sweep in {str(sweep_dir)!r} already reached step {reached:,} of {total:,} (its table: "
                    f"{sweep_dir / 'table.txt'}); pass --steps N with N > {reached} to train it further"
                )
            # else every combination finished before the sweep wrote its table: only that is left
        elif compiled:
            stopped, compile_seconds, train_seconds = _go_on_compiled(run, combos, quiet, clock)
        else:
            stopped = _go_on_host(run, combos, quiet, plan)
        if stopped is not None:
            return {**stopped, **_where_each_stopped(combos), "sweep_dir": str(sweep_dir)}
        return write_sweep(
            sweep_dir,
            run,
            grid,
            combos,
            compiled,
            plan["workers"],
            time.perf_counter() - clock,
            compile_seconds,
            train_seconds,
        )


def _go_on_compiled(
    run: ResolvedRun, combos: list[tuple[dict[str, float], ResolvedRun]], quiet: bool, clock: float
) -> tuple[dict | None, float, float]:
    """The compiled sweep's program again, from the newest step every combination checkpointed."""
    common = set.intersection(*(set(_reached(combo)) for _, combo in combos))
    first_step = max(common, default=0)
    _check_total(first_step, run.total)
    _check_none_ahead(combos, first_step, quiet)
    env = make_run_env(run.env, run.config.env_cfg.n_envs)
    start = None
    try:
        if first_step:
            agent = run.make_agent()
            states = []
            for _, combo in combos:
                try:
                    payload, restored = restore_payload(
                        agent,
                        env,
                        run.executor,
                        checkpoint_dirs(combo.run_dir)[None],
                        max_step=first_step,
                        resuming=True,
                    )
                except CheckpointError as error:
                    raise restore_error(error, combo) from None
                if restored.step != first_step:
                    raise RunError(
                        f"{combo.run_dir.name}: its checkpoint at step {first_step:,} could not be read (the newest "
                        f"readable is at {restored.step:,}); the sweep's combinations must go on from one step"
                    )
                states.append(payload.state)
            # by leaves: each restore rebuilds the state's static parts (functions compare unequal)
            leaves = [jax.tree_util.tree_leaves(state) for state in states]
            start = jax.tree_util.tree_unflatten(
                jax.tree_util.tree_structure(states[0]), [jnp.concatenate(rows) for rows in zip(*leaves)]
            )
    except BaseException:
        env.close()
        raise
    _prepare(combos, first_step)
    results, stopped = _compiled_sweep(run, env, combos, quiet, clock, start=start, first_step=first_step)
    if stopped is not None or results is None:
        return stopped, float("nan"), float("nan")
    return None, results[0].compile_seconds, results[0].train_seconds


def _check_none_ahead(combos: list[tuple[dict[str, float], ResolvedRun]], first_step: int, quiet: bool) -> None:
    """Refuses, before anything changes, a compiled sweep one of whose combinations was trained
    past ``first_step`` (the newest step they all have) to a total of its own (``kitae resume
    SWEEP_DIR/NAME --steps N`` records it in that combination's ``config.yaml``): the sweep's one
    program goes on from one step for every combination, so going on would restore it at
    ``first_step``, cut its metrics back and drop that training.

    A combination ahead with the sweep's own total was cut short by the sweep itself (a process
    killed while it saved one segment's checkpoints, one combination after another) or resumed
    alone to that total: going on from ``first_step`` replaces those steps with the sweep's own,
    as before, and a line says so (unless ``quiet``).

    Raises:
        RunError: naming the combinations ahead with a total of their own, their newest step, and
            the two ways on: train the others on to that step on their own, or remove the
            checkpoints past ``first_step``.
    """
    newest = {combo.run_dir.name: (_reached(combo) or [0])[-1] for _, combo in combos}
    totals = {combo.run_dir.name: read_run_config(combo.run_dir).train_cfg.n_env_steps for _, combo in combos}
    ahead = {name: step for name, step in newest.items() if step > first_step}
    if not ahead:
        return
    usual = min(totals.values())  # a combination trained on on its own has a larger total
    own = {name: step for name, step in ahead.items() if totals[name] != usual}
    sweep_dir = combos[0][1].run_dir.parent
    start = f"step {first_step:,}" if first_step else "the start (no step every combination has)"
    if not own:
        if not quiet:
            named = ", ".join(f"{name} (to {step:,})" for name, step in ahead.items())
            print(
                f"going on from {start} for every combination: the checkpoints of {named} past it are replaced",
                file=sys.stderr,  # beside kitae resume's "resuming RUN from step N"
            )
        return
    target = max(own.values())
    behind = [name for name, step in newest.items() if step < target]
    them = "its own" if len(behind) == 1 else "their own"
    named = ", ".join(f"{name} (to {step:,})" for name, step in own.items())
    was = "was trained on past it on its own" if len(own) == 1 else "were trained on past it on their own"
    raise RunError(
        f"the sweep in {str(sweep_dir)!r} goes on from one step for every combination, the newest they all have "
        f"({start}), but {named} {was}: going on would drop "
        f"that training; first train {', '.join(behind)} on to step {target:,} on {them} (kitae resume "
        f"{sweep_dir}/NAME --steps {target}), or remove the checkpoints past {start} to go on from there"
    )


def _go_on_host(
    run: ResolvedRun, combos: list[tuple[dict[str, float], ResolvedRun]], quiet: bool, plan: dict
) -> dict | None:
    """The host sweep's combinations that had not finished: resumed from their checkpoints or
    started, one after another or on the sweep's Ray workers."""
    left, resume = [], set()
    for values, combo in combos:
        summary = _summary(combo)
        if summary is not None and (summary["steps"] >= combo.total or every_seed_diverged(summary)):
            continue
        reached = _reached(combo)
        if reached:
            # a combination stopped after its last step, before its summary: it reached the total
            # (rounded up to whole iterations); resuming it writes its summary
            if summary is not None or reached[-1] > _run_steps(combo):
                _check_total(reached[-1], combo.total)  # each checked before any is touched
            resume.add(combo.run_dir.name)
        left.append((values, combo))
    for values, combo in left:
        if combo.run_dir.name not in resume:  # not started, or stopped before its first checkpoint
            _prepare([(values, combo)], 0)
    return _host_sweep(run, None, left, quiet, plan["workers"], plan["address"], frozenset(resume))


def _summary(combo: ResolvedRun) -> dict | None:
    """The combination's ``summary.json`` when its training wrote it (it finished), or ``None``
    (``kitae.runs.rundir.training_summary``: one ``kitae eval`` wrote alone is not)."""
    return training_summary(combo.run_dir)


def _run_steps(combo: ResolvedRun) -> int:
    """Where a run of the combination's total ends: whole iterations (``Schedule.run_steps``)."""
    algo_type = cast(Any, combo.agent_cls).algo_type  # an agent class's: on- or off-policy
    return Schedule.from_config(combo.config, algo_type).run_steps(combo.total)


def _check_total(step: int, total: int) -> None:
    if step >= total:
        raise RunError(
            f"the sweep has a combination at step {step:,}, past the total of {total:,} asked; pass --steps N with "
            f"N > {step}"
        )


def _prepare(combos: list[tuple[dict[str, float], ResolvedRun]], step: int) -> None:
    """Each combination's directory as it was at ``step``: its config with the run's total, its
    metrics rows up to ``step``, no summary; TensorBoard's later events are hidden by the writer's
    purge step, or at step 0 (a combination that starts again) its event files removed."""
    for _, combo in combos:
        write_config(combo.run_dir, combo.config)
        keep: dict[int | None, int] = dict.fromkeys(combo.seeds or [], step)
        truncate_metrics(combo.run_dir / "metrics.jsonl", {**keep, None: step})
        (combo.run_dir / "summary.json").unlink(missing_ok=True)
        (combo.run_dir / "curve.png").unlink(missing_ok=True)
        if step == 0:
            shutil.rmtree(combo.run_dir / "logs", ignore_errors=True)
