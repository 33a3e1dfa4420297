"""Runs: from an algorithm name and an environment id to a trained agent and a run directory.

``train_run("ppo", "gymnax:CartPole-v1")`` resolves the config (preset, config file, overrides),
makes the environment (a JAX source trains in the compiled loop, the others in the host loop),
trains, and writes the run directory described in DESIGN.md. The ``kitae train`` command is a
thin layer over it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from kitae.algos.collections import get_algorithm
from kitae.envs.make import parse_env_id
from kitae.presets import build_config, normalize_env_id, resolve
from kitae.rundir import MetricsFile, peak_rss_mb, plot_curves, read_metrics, state_fingerprint, write_summary
from kitae.rundir import curves_from_metrics

JAX_SOURCES = ("gymnax",)
HOST_SOURCES = ("gymnasium",)


class RunError(Exception):
    """A problem with the user's input that the command line reports in one line."""


def make_env(env_id: str, n_envs: int) -> Any:
    """A ``VecJaxEnv`` for JAX sources, a Gymnasium vector environment for host sources."""
    source, _ = parse_env_id(env_id)
    if source in JAX_SOURCES:
        from kitae.envs.jax_env import make_jax_env

        return make_jax_env(env_id, n_envs)
    if source in HOST_SOURCES:
        from kitae.envs.make import make_vec_env

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

    def __init__(self, total: int, quiet: bool, description: str) -> None:
        self.quiet = quiet
        self.total = total
        self.latest_return = float("nan")
        if not quiet:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[sps]} steps/s"), TextColumn("return {task.fields[ret]}"),
                TimeRemainingColumn(),
            )
            self.task = self.progress.add_task(description, total=total, sps="-", ret="-")
            self._start = time.perf_counter()

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
        sps = step / elapsed if sps is None else sps
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


@contextlib.contextmanager
def _tensorboard(run_dir: Path) -> Iterator[Any]:
    from tensorboardX import SummaryWriter

    writer = SummaryWriter(str(run_dir / "logs"))
    try:
        yield writer
    finally:
        writer.close()


def train_run(spec: RunSpec) -> dict:
    """Trains as ``spec`` says and writes the run directory; returns the summary.

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
    source = parse_env_id(spec.env_id)[0]
    metrics = MetricsFile(run_dir / "metrics.jsonl")
    start = time.perf_counter()
    try:
        with _tensorboard(run_dir) as writer:
            writer.add_text("config", "```\n" + config.to_yaml() + "\n```")
            if source in JAX_SOURCES:
                summary = _train_compiled(agent, env, config, seeds, metrics, writer, spec.quiet)
            else:
                summary = _train_host(agent, agent_cls, env, config, seeds, metrics, writer, spec, run_dir)
    finally:
        metrics.close()
    summary = write_summary(
        run_dir,
        algo=spec.algo.lower(),
        env=normalize_env_id(spec.env_id),
        **({"seeds": seeds} if seeds else {"seed": config.seed}),
        steps=summary.pop("steps"),
        wall_seconds=time.perf_counter() - start,
        **summary,
        peak_rss_mb=peak_rss_mb(),
    )
    curves = curves_from_metrics(read_metrics(run_dir / "metrics.jsonl"))
    plot_curves({f"{spec.algo.lower()} {normalize_env_id(spec.env_id)}": curves}, run_dir / "curve.png")
    return {**summary, "run_dir": str(run_dir)}


def _train_compiled(agent: Any, env: Any, config: Any, seeds: list[int] | None, metrics: MetricsFile,
                    writer: Any, quiet: bool) -> dict:
    from kitae.loops.compiled import compiled_train, log_compiled_metrics, n_iterations_for

    n_steps = config.train_cfg.n_env_steps
    n_iterations = n_iterations_for(agent, env, n_steps)
    progress = _Progress(n_steps, quiet, f"{type(agent).__name__} {config.env_cfg.task_name}")
    state = {"return_sum": 0.0, "episodes": 0}

    def log_fn(env_step: Any, return_sum: Any, episodes: Any) -> None:
        step = int(np.max(env_step))
        state["return_sum"] += float(np.sum(return_sum))
        state["episodes"] += int(np.sum(episodes))
        mean = state["return_sum"] / state["episodes"] if state["episodes"] else None
        state["return_sum"], state["episodes"] = 0.0, 0
        progress.update(step, mean)

    with progress:
        progress.message("compiling the training program (one XLA program for the whole run)...")
        result = compiled_train(agent, env, n_steps, seeds=seeds, log_every=max(1, n_iterations // 50), log_fn=log_fn)
        progress.update(result.env_steps, sps=result.sps / len(result.seeds))

    for index, seed in enumerate(result.seeds):
        steps, returns = result.episode_curve(index)
        for step, value in zip(steps, returns):
            metrics.write(step=int(step), seed=seed, episodic_return=float(value))
        log_compiled_metrics(writer, result, index) if index == 0 else None
    final = [result.final_return(i) for i in range(len(result.seeds))]
    states = result.state.agent_state
    return {
        "steps": result.env_steps,
        "compile_seconds": result.compile_seconds,
        "train_seconds": result.train_seconds,
        "sps": result.sps / len(result.seeds),
        "final_return": final if seeds else final[0],
        "state_fingerprint": (
            [state_fingerprint(_index(states, i)) for i in range(len(result.seeds))] if seeds
            else state_fingerprint(states)
        ),
    }


def _index(tree: Any, i: int) -> Any:
    import jax

    return jax.tree_util.tree_map(lambda x: x[i], tree)


def _train_host(agent: Any, agent_cls: type, env: Any, config: Any, seeds: list[int] | None,
                metrics: MetricsFile, writer: Any, spec: RunSpec, run_dir: Path) -> dict:
    seed_list = seeds or [config.seed]
    finals, fingerprints, steps, compile_seconds, train_seconds = [], [], 0, 0.0, 0.0
    for i, seed in enumerate(seed_list):
        if i > 0:  # further seeds: a fresh agent and environment each, one after the other
            config = dataclasses.replace(config, seed=seed)
            env = make_env(spec.env_id, config.env_cfg.n_envs)
            agent = agent_cls(run_dir.name, config, run_dir=run_dir)
        progress = _Progress(config.train_cfg.n_env_steps, spec.quiet, f"{type(agent).__name__} {config.env_cfg.task_name} seed {seed}")
        written = {"episodes": 0}

        def progress_fn(global_step: int, stats: Any) -> None:
            new = range(written["episodes"], len(stats.episode_returns))
            for j in new:
                metrics.write(step=stats.episode_steps[j], seed=seed, episodic_return=stats.episode_returns[j],
                              episodic_length=stats.episode_lengths[j])
            written["episodes"] = len(stats.episode_returns)
            progress.update(global_step, stats.mean_return(10) if stats.episode_returns else None,
                            sps=global_step / max(stats.wall_seconds, 1e-9))

        from kitae.loops.train import vectorized_train

        with progress:
            stats = vectorized_train(seed, agent, env, config.train_cfg.n_env_steps, agent.algo_type,
                                     writer=writer if i == 0 else None, progress_fn=progress_fn)
        finals.append(stats.mean_return(10))
        fingerprints.append(state_fingerprint(agent.state))
        steps = stats.global_step
        compile_seconds += stats.compile_seconds
        train_seconds += stats.wall_seconds
    return {
        "steps": steps,
        "compile_seconds": compile_seconds / len(seed_list),
        "train_seconds": train_seconds,
        "sps": steps * len(seed_list) / train_seconds if train_seconds else float("nan"),
        "final_return": finals if seeds else finals[0],
        "state_fingerprint": fingerprints if seeds else fingerprints[0],
    }
