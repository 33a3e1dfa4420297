"""Runs: from an algorithm name and an environment id to a trained agent and a run directory.

``train_run(RunSpec("ppo", "gymnax:CartPole-v1"))`` resolves the config (preset, config file,
overrides), makes the environment (a JAX source trains in the compiled loop, the others in the
host loop), trains, and writes the run directory described in DESIGN.md. ``resume_run``,
``eval_run`` and ``plot_runs`` work on a run directory; ``load_agent`` rebuilds its agent. The
``kitae`` command is a thin layer over them.

Checkpoints (``kitae.checkpoint``) go to ``<run_dir>/checkpoints/<step>/`` every
``train_cfg.save_frequency`` environment steps, at the end, and when the run is stopped with
Ctrl-C or SIGTERM (the current step, or segment of the compiled program, finishes first). A run
of several seeds in the host loop trains them one after the other and keeps one checkpoint
folder per seed: ``checkpoints/seed-<seed>/<step>/``.

Resuming (``resume_run``) goes on from the newest readable checkpoint:

- the run's total becomes ``steps`` (default: ``train_cfg.n_env_steps`` of ``config.yaml``,
  which is rewritten with the new total), so ``kitae resume RUN`` finishes an interrupted run
  and ``kitae resume RUN --steps N`` trains on to N steps in all;
- ``metrics.jsonl`` drops the rows logged after the checkpoint and continues from there; the new
  TensorBoard event file purges the old file's events past the checkpoint (``purge_step``);
- compiled loop: the whole loop state comes back (agent, optimizer, buffer, keys, environment
  state), so the resumed run ends bit for bit where an uninterrupted one ends;
- host loop: agent state, optimizer, buffer, keys and counters come back; Gymnasium
  environments cannot be saved, so they are reset (seeded from the seed and the step) and the
  episodes that were running are marked truncated in the buffer at the cut.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import signal
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from kitae.algos.collections import ALGORITHMS, get_algorithm
from kitae.envs.make import parse_env_id
from kitae.presets import build_config, normalize_env_id, resolve
from kitae.rundir import MetricsFile, curves_from_metrics, peak_rss_mb, plot_curves, read_metrics, state_fingerprint
from kitae.rundir import write_summary

JAX_SOURCES = ("gymnax", "brax", "jaxmarl")
HOST_SOURCES = ("gymnasium", "envpool", "pettingzoo")
_WARNED_HOST_ONLY: set[str] = set()


def _warn_host_loop(source: str) -> None:
    """Warns once per process that ``source`` trains in the host loop, not the compiled one."""
    if source == "envpool" and source not in _WARNED_HOST_ONLY:
        import warnings

        _WARNED_HOST_ONLY.add(source)
        warnings.warn(
            "envpool: environments train in the host loop: EnvPool's XLA interface (a stateful handle, "
            "not a pure vmappable environment) does not fit kitae's compiled loop; see docs/envpool.md",
            stacklevel=3,
        )


class RunError(Exception):
    """A problem with the user's input that the command line reports in one line."""


def make_env(env_id: str, n_envs: int) -> Any:
    """A ``VecJaxEnv`` for JAX sources, a Gymnasium vector environment for host sources (copies of
    a PettingZoo ``ParallelEnv`` in this process, a ``SyncVecParallelEnv``, for ``pettingzoo:``)."""
    source, _ = parse_env_id(env_id)
    if source in JAX_SOURCES:
        from kitae.envs.jax_env import make_jax_env

        try:
            return make_jax_env(env_id, n_envs)
        except ImportError as error:  # an optional extra (jaxmarl) that is not installed
            raise RunError(str(error)) from None
    if source in HOST_SOURCES:
        from kitae.envs.make import make_vec_env

        _warn_host_loop(source)
        return make_vec_env(env_id, n_envs)
    raise RunError(
        f"environment source {source!r} is not available yet; available: {', '.join(JAX_SOURCES + HOST_SOURCES)}"
    )


def default_run_dir(algo: str, env_id: str, seed: int) -> Path:
    name = parse_env_id(env_id)[1].replace("/", "-")
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{algo.lower()}-{name}-s{seed}-{stamp}"


class _Progress:
    """A rich progress bar (steps, steps/s, latest mean return, time left), or nothing when quiet."""

    def __init__(self, total: int, quiet: bool, description: str, start: int = 0) -> None:
        self.quiet = quiet
        self.total = total
        self.start = start
        self.latest_return = float("nan")
        self._start = time.perf_counter()
        if not quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[sps]} steps/s"), TextColumn("return {task.fields[ret]}"),
                TimeRemainingColumn(),
            )
            self.task = self.progress.add_task(description, total=total, completed=start, sps="-", ret="-")

    def __enter__(self) -> "_Progress":
        if not self.quiet:
            self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if not self.quiet:
            self.progress.stop()

    def update(self, step: int, mean_return: float | None = None, sps: float | None = None) -> None:
        if mean_return is not None and np.isfinite(mean_return):
            self.latest_return = mean_return
        if self.quiet:
            return
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        sps = (step - self.start) / elapsed if sps is None else sps
        ret = "-" if not np.isfinite(self.latest_return) else f"{self.latest_return:.1f}"
        self.progress.update(self.task, completed=min(step, self.total), sps=f"{sps:,.0f}", ret=ret)

    def message(self, text: str) -> None:
        if not self.quiet:
            self.progress.console.print(text)


@dataclasses.dataclass
class RunSpec:
    """What ``kitae train`` was asked for."""

    algo: str
    env_id: str
    steps: int | None = None
    seed: int | None = None
    seeds: int | None = None
    n_envs: int | None = None
    config_file: str | None = None
    sets: list[str] = dataclasses.field(default_factory=list)
    run_dir: str | None = None
    quiet: bool = False


# ---------------------------------------------------------------------------------------------
# Stopping cleanly on Ctrl-C / SIGTERM
# ---------------------------------------------------------------------------------------------


class StopRequest:
    """Set by the first SIGINT / SIGTERM; the training loops poll it (``stop()`` is True then)
    and stop after the current step (host loop) or segment (compiled loop), saving a checkpoint."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self) -> bool:
        return self.signal is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signal).name if self.signal is not None else ""


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Within the block, SIGINT (Ctrl-C) and SIGTERM ask the run to stop cleanly; a second Ctrl-C
    aborts at once (``KeyboardInterrupt``). Handlers are only installed in the main thread."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.signal is None:
            stop.signal = signum
            sys.stderr.write(
                f"\nkitae: {signal.Signals(signum).name} received: finishing the current step and saving a "
                "checkpoint (Ctrl-C again aborts without saving)\n"
            )
            sys.stderr.flush()
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


# ---------------------------------------------------------------------------------------------
# Run directories
# ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _tensorboard(run_dir: Path, purge_step: int | None = None) -> Iterator[Any]:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(run_dir / "logs"), purge_step=purge_step)
    try:
        yield writer
    finally:
        writer.close()


def _check_run_dir(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise RunError(f"run directory {str(run_dir)!r} does not exist")
    if not run_dir.is_dir():
        raise RunError(f"{str(run_dir)!r} is not a directory; give a run directory (runs/<name>)")
    if not (run_dir / "config.yaml").is_file():
        raise RunError(f"{str(run_dir)!r} is not a kitae run directory: it has no config.yaml")
    return run_dir


def read_run_config(run_dir: str | Path) -> Any:
    """The ``AlgoConfig`` of a run directory (``config.yaml``); ``RunError`` if it is unusable."""
    from kitae.config import AlgoConfig

    run_dir = _check_run_dir(run_dir)
    try:
        return AlgoConfig.from_yaml(run_dir / "config.yaml")
    except (ValueError, TypeError, KeyError) as error:
        raise RunError(f"config.yaml in {str(run_dir)!r} is unusable: {error}".replace("\n", " ")) from None


def algorithm_of(config: Any) -> tuple[str, type]:
    """``(algo name, agent class)`` of a config, from its params class (built-in algorithms)."""
    params_name = type(config.algo_params).__name__
    for name, (_, agent_name, known_params) in ALGORITHMS.items():
        if known_params == params_name:
            return name, get_algorithm(name)[0]
    raise RunError(
        f"the run's algo_params class {params_name!r} is not a built-in algorithm's "
        f"({', '.join(p for _, _, p in ALGORITHMS.values())}); rebuild it with YourAgent.unserialize(run_dir)"
    )


def checkpoint_dirs(run_dir: Path) -> dict[int | None, Path]:
    """``{None: checkpoints/}`` or, for host runs of several seeds, ``{seed: checkpoints/seed-<seed>/}``."""
    root = run_dir / "checkpoints"
    per_seed = sorted(
        (int(p.name[5:]), p) for p in root.glob("seed-*") if p.is_dir() and p.name[5:].isdigit()
    ) if root.is_dir() else []
    return dict(per_seed) if per_seed else {None: root}


def _make_checkpointer(directory: Path, metrics: MetricsFile | None = None, writer: Any = None,
                       seeds: list[int] | None = None) -> Any:
    from kitae.checkpoint import Checkpointer

    def flush() -> None:  # what a checkpoint has seen is on disk before it
        if metrics is not None:
            metrics.flush()
        if writer is not None:
            writer.flush()

    return Checkpointer(directory, before_save=flush, meta={"seeds": seeds} if seeds else None)


def final_return_from_rows(rows: list[dict], seed: int, last: int = 10) -> float:
    """Mean return of (about) the last ``last`` training episodes of ``seed`` in metrics rows
    (host rows are episodes; compiled rows are iteration means with an ``episodes`` count, taken
    whole from the end until ``last`` episodes)."""
    total, count = 0.0, 0
    for row in reversed(rows):
        if row.get("seed", seed) != seed or "episodic_return" not in row:
            continue
        n = int(row.get("episodes", 1))
        total, count = total + float(row["episodic_return"]) * n, count + n
        if count >= last:
            break
    return total / count if count else float("nan")


def _truncate_metrics(path: Path, keep_until: dict[Any, int]) -> None:
    """Keeps the rows of each seed logged at or before its checkpoint step (atomically)."""
    if not path.exists():
        return
    lines = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        seed = row.get("seed")
        limit = keep_until.get(seed, keep_until.get(None, 0))
        if row.get("step", 0) <= limit:
            lines.append(line)
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    tmp.replace(path)


def _write_results(run_dir: Path, algo: str, env_id: str, config: Any, seeds: list[int] | None, result: dict,
                   wall_seconds: float, extra: dict | None = None) -> dict:
    rows = read_metrics(run_dir / "metrics.jsonl")
    finals = [final_return_from_rows(rows, seed) for seed in (seeds or [config.seed])]
    summary = write_summary(
        run_dir,
        algo=algo,
        env=env_id,
        **({"seeds": seeds} if seeds else {"seed": config.seed}),
        steps=result["steps"],
        wall_seconds=wall_seconds,
        compile_seconds=result["compile_seconds"],
        train_seconds=result["train_seconds"],
        sps=result["sps"],
        final_return=finals if seeds else finals[0],
        peak_rss_mb=peak_rss_mb(),
        state_fingerprint=result["state_fingerprint"],
        **(extra or {}),
    )
    _plot_run(run_dir, algo, env_id, rows)
    return {**summary, "run_dir": str(run_dir)}


def _plot_run(run_dir: Path, algo: str, env_id: str, rows: list[dict] | None = None) -> None:
    rows = read_metrics(run_dir / "metrics.jsonl") if rows is None else rows
    plot_curves({f"{algo} {env_id}": curves_from_metrics(rows, counts=True)}, run_dir / "curve.png", title=run_dir.name)


def _stopped(run_dir: Path, result: dict, stop: StopRequest) -> dict:
    checkpoint = result.get("checkpoint")
    if checkpoint and Path(checkpoint).is_relative_to(run_dir.absolute()):  # as the user named the run
        checkpoint = str(run_dir / Path(checkpoint).relative_to(run_dir.absolute()))
    return {"stopped": True, "signal": stop.name, "signum": stop.signal, "steps": result["steps"],
            "checkpoint": checkpoint, "run_dir": str(run_dir)}


# ---------------------------------------------------------------------------------------------
# kitae train
# ---------------------------------------------------------------------------------------------


def train_run(spec: RunSpec) -> dict:
    """Trains as ``spec`` says and writes the run directory; returns the summary (or, when the
    run was stopped by a signal, ``{"stopped": True, "steps": ..., "checkpoint": ...}``).

    Raises:
        RunError, ValueError, TypeError, FileNotFoundError: for bad input, before anything is
        written (the run directory is created only once the config is valid).
    """
    agent_cls, _ = get_algorithm(spec.algo)
    parse_env_id(spec.env_id)
    if spec.steps is not None and spec.steps < 1:
        raise RunError(f"--steps {spec.steps} is not allowed; allowed: an int >= 1")
    if spec.seeds is not None and spec.seeds < 1:
        raise RunError(f"--seeds {spec.seeds} is not allowed; allowed: an int >= 1")
    resolved = resolve(
        spec.algo, spec.env_id, config_file=spec.config_file, sets=spec.sets,
        overrides={"seed": spec.seed, "n_envs": spec.n_envs, "n_env_steps": spec.steps},
    )
    env = make_env(spec.env_id, resolved["n_envs"])
    config = build_config(spec.algo, spec.env_id, env, resolved)
    run_dir = Path(spec.run_dir) if spec.run_dir else default_run_dir(spec.algo, spec.env_id, config.seed)
    if run_dir.exists() and any(run_dir.iterdir()):
        env.close()
        raise RunError(f"run directory {str(run_dir)!r} already exists and is not empty; choose another --run-dir")
    agent = agent_cls(run_dir.name, config, run_dir=run_dir)

    run_dir.mkdir(parents=True, exist_ok=True)
    config.to_yaml(run_dir / "config.yaml")
    seeds = [config.seed + i for i in range(spec.seeds)] if spec.seeds else None
    algo, env_id = spec.algo.lower(), normalize_env_id(spec.env_id)
    source = parse_env_id(spec.env_id)[0]
    start = time.perf_counter()
    metrics = MetricsFile(run_dir / "metrics.jsonl")
    try:
        with _tensorboard(run_dir) as writer, stop_on_signals() as stop:
            writer.add_text("config", "```\n" + config.to_yaml() + "\n```")
            if source in JAX_SOURCES:
                checkpointer = _make_checkpointer(run_dir / "checkpoints", metrics, writer)
                result = _train_compiled(agent, env, config, seeds, metrics, writer, spec.quiet, checkpointer, stop)
            else:
                plans = [_HostPlan(seed, agent if i == 0 else None, env if i == 0 else None)
                         for i, seed in enumerate(seeds or [config.seed])]
                result = _train_host(plans, agent_cls, config, seeds, metrics, writer, spec.quiet, run_dir, stop,
                                     total=config.train_cfg.n_env_steps)
    finally:
        metrics.close()
    if result.get("stopped"):
        _plot_run(run_dir, algo, env_id)
        return _stopped(run_dir, result, stop)
    return _write_results(run_dir, algo, env_id, config, seeds, result, time.perf_counter() - start)


def _train_compiled(agent: Any, env: Any, config: Any, seeds: list[int] | None, metrics: MetricsFile,
                    writer: Any, quiet: bool, checkpointer: Any, stop: StopRequest, *,
                    start: Any = None, total: int | None = None) -> dict:
    from kitae.loops.compiled import compiled_train, log_iteration_metrics, log_run_speed

    total = config.train_cfg.n_env_steps if total is None else total
    seed_list = seeds or [config.seed]
    first_step = 0 if start is None else int(np.max(np.asarray(start.state.env_step)))
    progress = _Progress(total, quiet, f"{type(agent).__name__} {config.env_cfg.task_name}", start=first_step)

    def on_segment(rows: Any, state: Any) -> None:
        latest = []
        for index, seed in enumerate(seed_list):
            m = _pick(rows, index) if seeds else rows
            for i in np.flatnonzero(m.episodes > 0):
                n = int(m.episodes[i])
                metrics.write(step=int(m.env_step[i]), seed=seed, episodic_return=float(m.return_sum[i] / n),
                              episodic_length=float(m.length_sum[i] / n), episodes=n)
            if m.episodes.sum() > 0:
                latest.append(float(m.return_sum.sum() / m.episodes.sum()))
        log_iteration_metrics(writer, rows, 0 if seeds else None)
        step = int(np.max(rows.env_step)) if rows.env_step.size else first_step
        progress.update(step, float(np.mean(latest)) if latest else None)

    with progress:
        if start is None:
            progress.message("compiling the training program (one XLA program, run in segments)...")
        result = compiled_train(agent, env, total, seeds=seeds, checkpointer=checkpointer, should_stop=stop,
                                on_segment=on_segment, start=start)
    log_run_speed(writer, result)
    checkpointer.close()
    states = result.state.agent_state
    return {
        "stopped": result.stopped,
        "checkpoint": str(checkpointer.path(result.env_steps)) if result.stopped else None,
        "steps": result.env_steps,
        "compile_seconds": result.compile_seconds,
        "train_seconds": result.train_seconds,
        "sps": result.sps / len(result.seeds),
        "state_fingerprint": (
            [state_fingerprint(_pick(states, i)) for i in range(len(result.seeds))] if seeds
            else state_fingerprint(states)
        ),
    }


def _pick(tree: Any, i: int) -> Any:
    import jax

    return jax.tree_util.tree_map(lambda x: x[i], tree)


@dataclasses.dataclass
class _HostPlan:
    """One seed of a host run: its agent and environment when already made, and the checkpoint it
    resumes from (``None``: from the start)."""

    seed: int
    agent: Any = None
    env: Any = None
    restored: Any = None


def _reset_seed(seed: int, step: int) -> int:
    """The seed of the environments' reset when a host run resumes at ``step``."""
    return int(np.random.SeedSequence([seed, step]).generate_state(1)[0]) if step else seed


def _train_host(plans: list[_HostPlan], agent_cls: type, config: Any, seeds: list[int] | None,
                metrics: MetricsFile, writer: Any, quiet: bool, run_dir: Path, stop: StopRequest, *,
                total: int) -> dict:
    from kitae.checkpoint import apply_to_agent, mark_episodes_cut
    from kitae.loops.train import vectorized_train

    fingerprints, steps, compile_seconds, train_seconds, done = [], 0, 0.0, 0.0, 0
    for i, plan in enumerate(plans):
        seed = plan.seed
        agent = plan.agent
        if agent is None:  # further seeds: a fresh agent each, one after the other
            agent = agent_cls(run_dir.name, dataclasses.replace(config, seed=seed), run_dir=run_dir)
        start_step = 0
        if plan.restored is not None:
            apply_to_agent(agent, plan.restored)
            mark_episodes_cut(agent)
            start_step = plan.restored.step
        checkpointer = _make_checkpointer(
            run_dir / "checkpoints" / (f"seed-{seed}" if seeds else ""), metrics, writer if i == 0 else None, seeds
        )
        if start_step >= total:  # this seed had finished
            if plan.env is not None:
                plan.env.close()
            fingerprints.append(state_fingerprint(agent.state))
            steps = start_step
            continue
        env = plan.env if plan.env is not None else make_env(config.env_cfg.task_name, config.env_cfg.n_envs)
        progress = _Progress(total, quiet, f"{type(agent).__name__} {config.env_cfg.task_name} seed {seed}",
                             start=start_step)
        written = {"episodes": 0}

        def progress_fn(global_step: int, stats: Any) -> None:
            for j in range(written["episodes"], len(stats.episode_returns)):
                metrics.write(step=stats.episode_steps[j], seed=seed, episodic_return=stats.episode_returns[j],
                              episodic_length=stats.episode_lengths[j])
            written["episodes"] = len(stats.episode_returns)
            progress.update(global_step, stats.mean_return(10) if stats.episode_returns else None,
                            sps=(global_step - start_step) / max(stats.wall_seconds, 1e-9))

        with progress:
            stats = vectorized_train(_reset_seed(seed, start_step), agent, env, total - start_step, agent.algo_type,
                                     start_step=start_step + 1, checkpointer=checkpointer,
                                     writer=writer if i == 0 else None, progress_fn=progress_fn, should_stop=stop)
        checkpointer.close()
        fingerprints.append(state_fingerprint(agent.state))
        steps = stats.global_step
        compile_seconds += stats.compile_seconds
        train_seconds += stats.wall_seconds
        done += stats.global_step - start_step
        if stats.global_step < total and stop():
            return {"stopped": True, "steps": stats.global_step, "checkpoint": str(checkpointer.path(stats.global_step))}
    n_trained = max(1, sum(1 for p in plans if (p.restored.step if p.restored else 0) < total))
    return {
        "stopped": False,
        "steps": steps,
        "compile_seconds": compile_seconds / n_trained,
        "train_seconds": train_seconds,
        "sps": done / train_seconds if train_seconds else float("nan"),
        "state_fingerprint": fingerprints if seeds else fingerprints[0],
    }


# ---------------------------------------------------------------------------------------------
# kitae resume
# ---------------------------------------------------------------------------------------------


def _restore_error(error: Exception, run_dir: Path) -> RunError:
    from kitae.checkpoint import CheckpointError

    text = str(error)
    if isinstance(error, CheckpointError) and text.startswith("no checkpoint in"):
        return RunError(
            f"{text}: the run stopped before its first checkpoint (checkpoints are written every "
            "train_cfg.save_frequency steps, at the end and on Ctrl-C/SIGTERM); start it again with kitae train"
        )
    return RunError(text)


def restore_compiled(agent: Any, env: Any, directory: Path, max_step: int | None = None) -> tuple[Any, Any]:
    """Restores the newest readable compiled-loop checkpoint in ``directory``.

    Returns:
        ``(restored, LoopStart)``; the seeds are ``restored.meta["seeds"]`` (``None``: one seed).
    """
    from kitae.checkpoint import CheckpointMismatch, Checkpointer
    from kitae.loops.compiled import LoopStart, loop_state_shape

    def target(meta: dict) -> dict:
        if meta.get("kind") != "compiled":
            raise CheckpointMismatch(
                f"checkpoint step {meta.get('step')} was written by the host loop; a JAX environment resumes "
                "from a compiled-loop checkpoint"
            )
        return {"loop_state": loop_state_shape(agent, env, meta.get("seeds"))}

    with Checkpointer(directory) as checkpointer:
        restored = checkpointer.restore_latest(target, max_step=max_step)
    start = LoopStart(restored.items["loop_state"], int(restored.meta["iteration"]),
                      int(restored.meta.get("n_updates", 0)))
    return restored, start


def restore_host(agent: Any, directory: Path, max_step: int | None = None) -> Any:
    """Restores the newest readable host-loop checkpoint in ``directory`` (not yet applied)."""
    from kitae.checkpoint import Checkpointer, host_target

    with Checkpointer(directory) as checkpointer:
        return checkpointer.restore_latest(host_target(agent), max_step=max_step)


def resume_run(run_dir: str | Path, steps: int | None = None, quiet: bool = False) -> dict:
    """Goes on training the run in ``run_dir`` from its newest readable checkpoint until ``steps``
    environment steps in all (default: the run's ``train_cfg.n_env_steps``), then writes the
    summary as ``kitae train`` does. Everything is checked before anything is written.

    Raises:
        RunError: no such run directory, no readable checkpoint, a run already at ``steps``...
    """
    from kitae.checkpoint import CheckpointError

    if steps is not None and steps < 1:
        raise RunError(f"--steps {steps} is not allowed; allowed: an int >= 1")
    run_dir = _check_run_dir(run_dir)
    config = read_run_config(run_dir)
    algo, agent_cls = algorithm_of(config)
    env_id = normalize_env_id(config.env_cfg.task_name)
    source = parse_env_id(env_id)[0]
    total = config.train_cfg.n_env_steps if steps is None else steps
    if total != config.train_cfg.n_env_steps:
        config = dataclasses.replace(config, train_cfg=dataclasses.replace(config.train_cfg, n_env_steps=total))
    dirs = checkpoint_dirs(run_dir)
    env = make_env(env_id, config.env_cfg.n_envs)
    agent = agent_cls(run_dir.name, config, run_dir=run_dir)
    try:
        if source in JAX_SOURCES:
            restored, start = restore_compiled(agent, env, dirs[None])
            seeds = restored.meta.get("seeds")
            keep = {seed: restored.step for seed in (seeds or [config.seed])}
            plans = None
        else:
            seeds = _host_run_seeds(dirs)
            plans = []
            for i, seed in enumerate(seeds or [config.seed]):
                seed_agent = agent if i == 0 else agent_cls(
                    run_dir.name, dataclasses.replace(config, seed=seed), run_dir=run_dir)
                try:
                    restored = restore_host(seed_agent, dirs.get(seed if seeds else None, run_dir / "checkpoints"
                                                                 / f"seed-{seed}"))
                except CheckpointError as error:
                    if i == 0 or not str(error).startswith("no checkpoint in"):
                        raise
                    restored = None  # a later seed that had not started
                plans.append(_HostPlan(seed, seed_agent, env if i == 0 else None, restored))
                if restored is None:  # the seeds after it had not started either
                    plans += [_HostPlan(s) for s in seeds[i + 1:]]
                    break
            keep = {p.seed: (p.restored.step if p.restored else 0) for p in plans}
            restored = plans[0].restored
    except CheckpointError as error:
        env.close()
        raise _restore_error(error, run_dir) from None
    reached = min(keep.values())
    if reached >= total:
        env.close()
        raise RunError(
            f"the run in {str(run_dir)!r} already reached step {reached:,} of {total:,}; pass --steps N with "
            f"N > {reached} to train it further"
        )

    # Checked: from here on the run directory changes.
    if total != read_run_config(run_dir).train_cfg.n_env_steps:
        tmp = run_dir / "config.yaml.tmp"
        config.to_yaml(tmp)
        tmp.replace(run_dir / "config.yaml")
    _truncate_metrics(run_dir / "metrics.jsonl", keep)
    start_time = time.perf_counter()
    metrics = MetricsFile(run_dir / "metrics.jsonl")
    purge = keep[(seeds or [config.seed])[0]] + 1  # TensorBoard logs the first seed
    try:
        with _tensorboard(run_dir, purge_step=purge) as writer, stop_on_signals() as stop:
            if not quiet:
                print(f"resuming {run_dir} from step {restored.step:,} (checkpoint {restored.path.name}) to "
                      f"{total:,} steps", file=sys.stderr)
            if source in JAX_SOURCES:
                checkpointer = _make_checkpointer(dirs[None], metrics, writer)
                result = _train_compiled(agent, env, config, seeds, metrics, writer, quiet, checkpointer, stop,
                                         start=start, total=total)
            else:
                result = _train_host(plans, agent_cls, config, seeds, metrics, writer, quiet, run_dir, stop,
                                     total=total)
    finally:
        metrics.close()
    if result.get("stopped"):
        _plot_run(run_dir, algo, env_id)
        return _stopped(run_dir, result, stop)
    return _write_results(run_dir, algo, env_id, config, seeds, result, time.perf_counter() - start_time,
                          extra={"resumed_from": restored.step})


def resume_agent(agent: Any, env: Any, n_env_steps: int | None = None, *, writer: Any = None,
                 checkpointer: Any = None) -> Any:
    """``BaseAgent.resume``: restores ``agent`` from the newest readable checkpoint in
    ``<run_dir>/checkpoints`` and trains on until ``n_env_steps`` in all (default
    ``config.train_cfg.n_env_steps``), checkpointing as ``train`` does.

    Returns:
        ``TrainStats`` (host loop, this session's episodes) or ``CompiledRun`` (compiled loop,
        this session's iterations).
    """
    from kitae.checkpoint import Checkpointer, apply_to_agent, mark_episodes_cut
    from kitae.envs.jax_env import VecJaxEnv
    from kitae.loops.compiled import compiled_train, log_compiled_metrics
    from kitae.loops.train import vectorized_train

    total = agent.config.train_cfg.n_env_steps if n_env_steps is None else n_env_steps
    if not isinstance(total, int) or isinstance(total, bool) or total < 1:
        raise ValueError(f"n_env_steps={total!r} is not allowed; allowed: an int >= 1")
    checkpointer = checkpointer or Checkpointer(Path(agent.run_dir) / "checkpoints")
    if isinstance(env, VecJaxEnv):
        restored, start = restore_compiled(agent, env, checkpointer.directory)
        seeds = restored.meta.get("seeds")
        if not seeds:
            apply_to_agent(agent, restored)
    else:
        restored = restore_host(agent, checkpointer.directory)
        apply_to_agent(agent, restored)
        mark_episodes_cut(agent)
    if restored.step >= total:
        raise ValueError(f"the checkpoint is at step {restored.step}; n_env_steps={total} asks for no more")
    owns_writer = writer is None
    if owns_writer:
        from tensorboardX import SummaryWriter

        writer = SummaryWriter(str(Path(agent.run_dir) / "logs"), purge_step=restored.step + 1)
    try:
        if isinstance(env, VecJaxEnv):
            result = compiled_train(agent, env, total, seeds=seeds, checkpointer=checkpointer, start=start)
            log_compiled_metrics(writer, result)
            return result
        return vectorized_train(_reset_seed(agent.config.seed, restored.step), agent, env, total - restored.step,
                                agent.algo_type, start_step=restored.step + 1, checkpointer=checkpointer,
                                writer=writer)
    finally:
        if owns_writer:
            writer.close()


# ---------------------------------------------------------------------------------------------
# Loading an agent
# ---------------------------------------------------------------------------------------------


def load_agent(run_dir: str | Path, seed_index: int = 0, agent_cls: type | None = None) -> Any:
    """Rebuilds the trained agent of a run directory: ``config.yaml``, then the newest readable
    checkpoint (parameters, optimizer and normalisation state, keys, counters, buffer).

    Args:
        run_dir: the run directory.
        seed_index: which seed of a run of several seeds.
        agent_cls: the agent class (default: the built-in algorithm named by the config's
            params class); ``BaseAgent.unserialize`` passes its own class.

    Raises:
        RunError: for a missing or unusable run directory or checkpoint.
    """
    from kitae.checkpoint import CheckpointError, apply_to_agent

    run_dir = _check_run_dir(run_dir)
    config = read_run_config(run_dir)
    if agent_cls is None:
        agent_cls = algorithm_of(config)[1]
    dirs = checkpoint_dirs(run_dir)
    seeds = sorted(s for s in dirs if s is not None)
    if seeds:
        if not 0 <= seed_index < len(seeds):
            raise RunError(f"seed_index={seed_index} is not allowed; the run has {len(seeds)} seeds: {seeds}")
        config = dataclasses.replace(config, seed=seeds[seed_index])
    directory = dirs[seeds[seed_index] if seeds else None]
    try:
        agent = agent_cls(run_dir.name, config, run_dir=run_dir)
    except TypeError as error:  # a custom agent whose constructor takes no run_dir
        if "run_dir" not in str(error):
            raise
        agent = agent_cls(run_dir.name, config)
        agent.run_dir = run_dir
    source = parse_env_id(config.env_cfg.task_name)[0]
    try:
        from kitae.checkpoint import Checkpointer

        kind = None
        with Checkpointer(directory) as checkpointer:
            for step in reversed(checkpointer.all_steps()):  # the newest readable one tells
                try:
                    kind = checkpointer.read_meta(step).get("kind")
                    break
                except CheckpointError:
                    continue
        if source in JAX_SOURCES and kind != "host":
            env = make_env(config.env_cfg.task_name, config.env_cfg.n_envs)
            restored, _ = restore_compiled(agent, env, directory)
            run_seeds = restored.meta.get("seeds")
            if run_seeds and not 0 <= seed_index < len(run_seeds):
                raise RunError(f"seed_index={seed_index} is not allowed; the run has {len(run_seeds)} seeds: {run_seeds}")
            if run_seeds:
                agent.config = dataclasses.replace(agent.config, seed=run_seeds[seed_index])
        else:
            restored = restore_host(agent, directory)
    except CheckpointError as error:
        raise _restore_error(error, run_dir) from None
    apply_to_agent(agent, restored, seed_index)
    agent.checkpoint_step = restored.step
    return agent


def _host_run_seeds(dirs: dict[int | None, Path]) -> list[int] | None:
    """All the seeds of a host run of several seeds (also those not started when it stopped),
    from the metadata of its first seed's checkpoints; ``None`` for a run of one seed."""
    from kitae.checkpoint import Checkpointer

    per_seed = sorted(s for s in dirs if s is not None)
    if not per_seed:
        return None
    with Checkpointer(dirs[per_seed[0]]) as checkpointer:
        for step in reversed(checkpointer.all_steps()):
            try:
                seeds = checkpointer.read_meta(step).get("seeds")
            except Exception:
                continue
            if seeds:
                return sorted(set(seeds) | set(per_seed))
    return per_seed


def run_seeds(run_dir: Path) -> list[int] | None:
    """The seeds of a run of several seeds (``None`` for one seed), from its checkpoints."""
    from kitae.checkpoint import Checkpointer

    dirs = checkpoint_dirs(run_dir)
    if None not in dirs:
        return sorted(dirs)
    with Checkpointer(dirs[None]) as checkpointer:
        steps = checkpointer.all_steps()
        for step in reversed(steps):
            try:
                return checkpointer.read_meta(step).get("seeds")
            except Exception:
                continue
    return None


# ---------------------------------------------------------------------------------------------
# kitae eval
# ---------------------------------------------------------------------------------------------


def _pure_select(agent: Any) -> Any:
    """``select_action`` as a pure function ``(state, key, observations) -> (actions, key)``."""

    def select(state: Any, key: Any, observations: Any) -> tuple[Any, Any]:
        saved = agent.state, agent.key
        agent.state, agent.key = state, key
        try:
            actions, _ = agent.select_action(observations)
            return actions, agent.key
        finally:
            agent.state, agent.key = saved

    return select


def _eval_gymnax(agent: Any, name: str, episodes: int, seed: int) -> np.ndarray:
    """Raw returns of ``episodes`` episodes in the JAX environment, all run together (vmapped)
    in one compiled loop that stops when every environment has finished its first episode."""
    import jax
    import jax.numpy as jnp

    from kitae.envs.jax_env import make_jax_env

    env = make_jax_env(f"{parse_env_id(agent.config.env_cfg.task_name)[0]}:{name}", episodes)
    limit = int(getattr(env.params, "max_steps_in_episode", getattr(env.params, "episode_length", 100_000))) + 1
    select = _pure_select(agent)

    def evaluate(state: Any, key: jax.Array) -> jax.Array:
        key, reset_key = jax.random.split(key)
        observation, env_state = env.reset(reset_key)

        def cond(carry: tuple) -> jax.Array:
            t, *_, done = carry
            return jnp.logical_and(t < limit, jnp.logical_not(jnp.all(done)))

        def body(carry: tuple) -> tuple:
            t, key, observation, env_state, returns, done = carry
            actions, key = select(state, key, observation)
            key, step_key = jax.random.split(key)
            ts = env.step(step_key, env_state, actions)
            returns = returns + jnp.where(done, 0.0, ts.reward)
            done = jnp.logical_or(done, jnp.logical_or(ts.terminated, ts.truncated))
            return t + 1, key, ts.observation, ts.state, returns, done

        carry = (0, key, observation, env_state, jnp.zeros(episodes, jnp.float32), jnp.zeros(episodes, bool))
        return jax.lax.while_loop(cond, body, carry)[4]

    return np.asarray(jax.jit(evaluate)(agent.state, jax.random.PRNGKey(seed)), dtype=np.float64)


def _eval_jaxmarl(agent: Any, name: str, episodes: int, seed: int) -> np.ndarray:
    """Team returns (the agents' returns added up) of ``episodes`` JaxMARL episodes, one per
    environment, all run together (``kitae.loops.multi_agent.evaluate_team_returns``)."""
    import jax

    from kitae.envs.jaxmarl_env import make_jaxmarl_env
    from kitae.loops.multi_agent import evaluate_team_returns

    select = _pure_select(agent)
    state = agent.state
    returns = evaluate_team_returns(make_jaxmarl_env(name, episodes), lambda key, obs: select(state, key, obs)[0],
                                    jax.random.PRNGKey(seed))
    return returns[:, 0]


def _eval_gymnasium(agent: Any, name: str, episodes: int, seed: int) -> np.ndarray:
    """Raw returns of ``episodes`` host-loop episodes (``name``: an id ``make_vec_env`` takes), run
    as vector environments of up to 64, each environment seeded ``seed + i`` and counted for its
    first episode only; for PettingZoo environments, the team's return (sum over agents); EnvPool
    Atari: whole games with unclipped rewards."""
    from kitae.envs.make import make_vec_env

    source, task = parse_env_id(name)
    env_kwargs = None
    if source == "envpool":
        from kitae.envs.envpool_env import evaluation_kwargs

        env_kwargs = evaluation_kwargs(task)
    returns: list[float] = []
    while len(returns) < episodes:
        n = min(64, episodes - len(returns))
        env = make_vec_env(name, n, env_kwargs=env_kwargs)
        try:
            observations, _ = env.reset(seed=seed + len(returns))
            totals, done = np.zeros(n), np.zeros(n, bool)
            while not done.all():
                actions, _ = agent.select_action(observations)
                if isinstance(actions, dict):  # PettingZoo: the team's reward; all agents end together
                    observations, rewards, terminations, truncations, _ = env.step(
                        {agent: np.asarray(a) for agent, a in actions.items()})
                    rewards = np.sum(list(rewards.values()), axis=0)
                    terminations = np.any(list(terminations.values()), axis=0)
                    truncations = np.any(list(truncations.values()), axis=0)
                else:
                    observations, rewards, terminations, truncations, _ = env.step(np.asarray(actions))
                totals += np.where(done, 0.0, rewards)
                done |= np.logical_or(terminations, truncations)
        finally:
            env.close()
        returns.extend(totals.tolist())
    return np.asarray(returns)


def gymnasium_twin(env_id: str) -> str | None:
    """The Gymnasium id that renders ``env_id``: itself for Gymnasium ids, the id of the same name
    for gymnax ids whose environment Gymnasium also has (CartPole-v1, Pendulum-v1, Acrobot-v1,
    MountainCar-v0, MountainCarContinuous-v0), else ``None``."""
    import gymnasium as gym

    _, name = parse_env_id(env_id)
    return name if name in gym.registry else None


def record_video(agent: Any, env_id: str, folder: Path, prefix: str, seed: int = 0) -> Path:
    """Records one episode of ``agent.select_action`` as an MP4 in ``folder`` (Gymnasium's
    ``RecordVideo`` on ``rgb_array`` frames; a gymnax environment is rendered through its
    Gymnasium twin, ``gymnasium_twin``). Returns the file."""
    import os

    import gymnasium as gym

    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")  # pygame renders off-screen: no sound card,
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # no display needed
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    name = gymnasium_twin(env_id)
    if name is None:
        raise RunError(f"--video: {env_id} has no Gymnasium environment of the same name to render")
    import warnings

    env = gym.make(name, render_mode="rgb_array")
    with warnings.catch_warnings():  # a second evaluation of the same checkpoint replaces its video
        warnings.filterwarnings("ignore", message=".*Overwriting existing videos")
        env = gym.wrappers.RecordVideo(env, str(folder), name_prefix=prefix, episode_trigger=lambda i: i == 0,
                                       disable_logger=True)
    try:
        observation, _ = env.reset(seed=seed)
        done = False
        while not done:
            actions, _ = agent.select_action(np.asarray(observation)[None])
            action = np.asarray(actions)[0]
            if isinstance(env.action_space, gym.spaces.Box):
                action = np.clip(action, env.action_space.low, env.action_space.high)
            observation, _, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
    finally:
        env.close()
    videos = sorted(folder.glob(f"{prefix}-episode-0.mp4"))
    if not videos:
        raise RunError(f"--video: no video was written to {folder} (is moviepy installed?)")
    return videos[-1]


def eval_run(run_dir: str | Path, episodes: int = 10, video: bool = False, seed: int = 0) -> dict:
    """Evaluates the run's agent(s) with the deterministic policy (``select_action``) over
    ``episodes`` episodes and writes ``eval_return`` (mean raw return; one per seed for runs of
    several seeds), ``eval_return_std``, ``eval_episodes`` and ``eval_step`` into ``summary.json``.

    With ``video``, records one episode to ``<run_dir>/videos/``.
    """
    if not isinstance(episodes, int) or isinstance(episodes, bool) or episodes < 1:
        raise RunError(f"--episodes {episodes} is not allowed; allowed: an int >= 1")
    run_dir = _check_run_dir(run_dir)
    config = read_run_config(run_dir)
    env_id = normalize_env_id(config.env_cfg.task_name)
    source, name = parse_env_id(env_id)
    if video and gymnasium_twin(env_id) is None:
        raise RunError(f"--video: {env_id} has no Gymnasium environment of the same name to render")
    seeds = run_seeds(run_dir)
    means, stds, all_returns, step, video_path = [], [], [], 0, None
    for index in range(len(seeds) if seeds else 1):
        agent = load_agent(run_dir, index)
        if source == "jaxmarl":
            returns = _eval_jaxmarl(agent, name, episodes, seed)
        elif source in JAX_SOURCES:
            returns = _eval_gymnax(agent, name, episodes, seed)
        else:
            returns = _eval_gymnasium(agent, env_id, episodes, seed)
        means.append(float(np.mean(returns)))
        stds.append(float(np.std(returns)))
        all_returns.append(returns.tolist())
        step = agent.checkpoint_step
        if video and index == 0:
            video_path = record_video(agent, env_id, run_dir / "videos", f"eval-step{step}", seed)
    summary_path = run_dir / "summary.json"
    try:
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    except json.JSONDecodeError:
        summary = {}
    summary.update(
        eval_return=means if seeds else means[0],
        eval_return_std=stds if seeds else stds[0],
        eval_episodes=episodes,
        eval_step=step,
    )
    write_summary(run_dir, **summary)
    return {"run_dir": str(run_dir), "env": env_id, "seeds": seeds, "episodes": episodes, "step": step,
            "mean": means, "std": stds, "returns": all_returns,
            "video": str(video_path) if video_path else None}


# ---------------------------------------------------------------------------------------------
# kitae plot
# ---------------------------------------------------------------------------------------------


def plot_runs(run_dirs: list[str | Path], output: str | Path | None = None) -> Path:
    """Plots the training curves of several runs on one figure (each run's seeds as a mean line
    and a min-max band); returns the image's path (default ``curves.png``)."""
    if not run_dirs:
        raise RunError("give at least one run directory")
    output = Path(output) if output is not None else Path("curves.png")
    if output.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise RunError(f"-o {str(output)!r}: the output must end in .png, .pdf or .svg")
    if not output.parent.is_dir():
        raise RunError(f"-o {str(output)!r}: the folder {str(output.parent)!r} does not exist")
    runs = []
    for run_dir in run_dirs:
        run_dir = _check_run_dir(run_dir)
        config = read_run_config(run_dir)
        metrics_path = run_dir / "metrics.jsonl"
        curves = curves_from_metrics(read_metrics(metrics_path), counts=True) if metrics_path.exists() else {}
        if not curves:
            raise RunError(f"{str(run_dir)!r} has no finished episodes in metrics.jsonl yet")
        try:
            algo = algorithm_of(config)[0]
        except RunError:
            algo = type(config.algo_params).__name__
        runs.append((run_dir, algo, normalize_env_id(config.env_cfg.task_name), curves))
    algos, envs = {r[1] for r in runs}, {r[2] for r in runs}
    names = [r[0].name for r in runs]
    named = {}
    for run_dir, algo, env_id, curves in runs:
        name = run_dir.name if names.count(run_dir.name) == 1 else str(run_dir)
        differs = [x for x, shared in ((algo, len(algos) == 1), (env_id, len(envs) == 1)) if not shared]
        named[name + (f" ({' '.join(differs)})" if differs else "")] = curves
    title = " on ".join(([next(iter(algos))] if len(algos) == 1 else []) + ([next(iter(envs))] if len(envs) == 1 else []))
    plot_curves(named, output, title=title or None)
    return output
