"""Shared pieces of the learning benchmarks: train an agent for several seeds and record results.

Each ``benchmarks/bench_<algo>.py`` names its tuned settings and calls ``run_learning``; results
go to ``benchmarks/results/<name>.json`` and are summarised in BENCHMARKS.md.

``RESULTS`` is the folder every benchmark script writes its results into: ``benchmarks/results/``,
or the folder named by the environment variable ``KITAE_BENCH_RESULTS`` (made if missing), so that
a run need not overwrite the recorded files. This module imports only the standard library at its
top (kitae, JAX and NumPy inside the functions that use them), so that a worker process whose
whole wall time is measured can import ``RESULTS`` at no cost.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import kitae.config as cfg

RESULTS = Path(os.environ.get("KITAE_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")


def build_config(
    env,
    algo_params: Any,
    update_cfg: cfg.UpdateConfig,
    *,
    seed: int,
    n_env_steps: int,
    env_id: str,
    replay: cfg.ReplayConfig | None = None,
) -> cfg.AlgoConfig:
    """An ``AlgoConfig`` for a vector environment made by ``make_vec_env`` (``replay``: the
    default ``ReplayConfig`` when ``None``)."""
    import kitae.config as cfg

    return cfg.AlgoConfig(
        replay=replay or cfg.ReplayConfig(),
        seed=seed,
        algo_params=algo_params,
        update_cfg=update_cfg,
        train_cfg=cfg.TrainConfig(n_env_steps=n_env_steps),
        env_cfg=cfg.EnvConfig(
            task_name=env_id,
            observation_space=env.single_observation_space,
            action_space=env.single_action_space,
            n_envs=env.num_envs,
        ),
    )


def run_learning(
    name: str,
    agent_cls: Callable,
    algo_params: Any,
    update_cfg: cfg.UpdateConfig,
    *,
    env_id: str,
    n_envs: int,
    n_env_steps: int,
    seeds: list[int],
    threshold: float,
    last_episodes: int = 10,
    replay: cfg.ReplayConfig | None = None,
) -> dict:
    """Trains one agent per seed (one after the other) and records the mean return of the last
    ``last_episodes`` training episodes for each; passes if every seed reaches ``threshold``
    (``replay``: an off-policy agent's ``ReplayConfig``, the default when ``None``)."""
    import numpy as np

    from kitae.envs.make import make_vec_env
    from kitae.runs.provenance import made_with

    runs = []
    for seed in seeds:
        env = make_vec_env(env_id, n_envs)
        config = build_config(
            env, algo_params, update_cfg, seed=seed, n_env_steps=n_env_steps, env_id=env_id, replay=replay
        )
        run_dir = Path(f"/tmp/kitae-bench/{name}-{seed}")
        # Each benchmark run starts fresh: a run directory left by an earlier (or killed) run would
        # otherwise be refused, as a run directory that already holds a run is.
        shutil.rmtree(run_dir, ignore_errors=True)
        agent = agent_cls(f"bench-{name}-{seed}", config, run_dir=str(run_dir))
        start = time.perf_counter()
        stats = agent.train(env, n_env_steps)
        wall = time.perf_counter() - start
        final = stats.mean_return(last_episodes)
        first_hit = next((step for step, _ in _rolling(stats, last_episodes) if _ >= threshold), None)
        runs.append(
            {
                "seed": seed,
                "final_return": final,
                "wall_seconds": wall,
                "sps": stats.env_steps / wall,
                "steps": stats.env_steps,
                "episodes": len(stats.episode_returns),
                "first_step_at_threshold": first_hit,
            }
        )
        print(
            f"[{name}] seed {seed}: final return {final:.1f} (threshold {threshold}), "
            f"{stats.env_steps} steps in {wall:.1f} s, first at threshold: {first_hit}",
            flush=True,
        )
    result = {
        "name": name,
        "env_id": env_id,
        "n_envs": n_envs,
        "n_env_steps": n_env_steps,
        "threshold": threshold,
        "passed": all(r["final_return"] >= threshold for r in runs),
        "mean_final_return": float(np.mean([r["final_return"] for r in runs])),
        "runs": runs,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "made_with": made_with(),
        "algo_params": repr(algo_params),
        "update_cfg": repr(update_cfg),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=2))
    return result


def _rolling(stats, window: int):
    import numpy as np

    returns = stats.episode_returns
    for i in range(window, len(returns) + 1):
        yield stats.episode_steps[i - 1], float(np.mean(returns[i - window : i]))


def seeds_argument(default: tuple[int, ...] = (0, 1, 2)) -> list[int]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, nargs="+", default=list(default))
    return parser.parse_args().seeds


# ---- whole `kitae train` processes ----------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def kitae_train(argv: list[str], run_dir: Path) -> dict:
    command = [sys.executable, "-m", "kitae.cli", "train", *argv, "--run-dir", str(run_dir), "--quiet"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads((run_dir / "summary.json").read_text())


def running_means(run_dir: Path, seed: int, window: int = 10) -> list[tuple[int, float]]:
    """``(step, mean of the last `window` training episodes)`` along a run, from ``metrics.jsonl``
    (a row holds the mean return of ``episodes`` episodes that ended at ``step``)."""
    returns: list[float] = []
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("seed", seed) != seed or "episodic_return" not in row:
            continue
        returns.extend([row["episodic_return"]] * int(row.get("episodes", 1)))
        if len(returns) >= window:
            out.append((row["step"], statistics.fmean(returns[-window:])))
    return out


def curve_figures(run_dir: Path, seed: int, threshold: float = 475.0) -> dict:
    means = running_means(run_dir, seed)
    first = next((step for step, mean in means if mean >= threshold), None)
    return {f"first_step_at_{threshold:g}": first, "max_running_mean": max((m for _, m in means), default=None)}


def seed_figures(seed: int, summary: dict, run_dir: Path, threshold: float) -> dict:
    """One seed's learning figures, from its ``summary.json`` (``summary``) and ``metrics.jsonl``:
    the final return, the first step where the running mean of 10 episodes reached ``threshold``,
    the best running mean, the steps, and the compile and training seconds."""
    curve = curve_figures(run_dir, seed, threshold)
    return {
        "seed": seed,
        "final_return": summary["final_return"],
        "first_step_at_target": curve[f"first_step_at_{threshold:g}"],
        "max_running_mean": curve["max_running_mean"],
        "steps": summary["steps"],
        "compile_seconds": summary["compile_seconds"],
        "train_seconds": summary["train_seconds"],
    }


def first_step_above(run_dir: Path, seed: int, threshold: float) -> int | None:
    """The step of the first ``metrics.jsonl`` row whose ``episodic_return`` is above
    ``threshold`` (``None``: none). A row holds the mean return of the episodes that ended at its
    step, so this is the first episode above ``threshold`` where no episode can return less than
    it (MountainCar-v0: returns are at least -200, and above -200 exactly when the goal was
    reached)."""
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("seed", seed) == seed and row.get("episodic_return", -math.inf) > threshold:
            return int(row["step"])
    return None
