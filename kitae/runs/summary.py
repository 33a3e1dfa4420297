"""A run's ``summary.json`` (``docs/runs.md``, "The run directory"): what trained it, its final
returns from ``metrics.jsonl``, its fingerprints, its divergences and its last evaluations."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kitae.loops.result import RunResult
from kitae.runs.load import best_evaluations
from kitae.runs.provenance import made_with
from kitae.runs.resolve import ResolvedRun
from kitae.runs.rundir import final_return_from_rows, peak_rss_mb, summary_lock, write_summary

__all__ = [
    "write_run_summary",
    "run_divergences",
    "describe_divergence",
    "relative_checkpoint",
    "every_seed_diverged",
]


def write_run_summary(
    run: ResolvedRun,
    results: list[RunResult],
    rows: list[dict],
    fingerprints: list[str],
    divergences: list[dict],
    steps: int,
    wall_seconds: float,
    extra: dict | None = None,
) -> dict:
    """Writes the run directory's ``summary.json`` (``docs/runs.md``) from what trained it and
    its ``metrics.jsonl`` rows, with the software versions and the machine that made it
    (``kitae.runs.provenance``); returns it."""
    train_seconds = sum(r.train_seconds for r in results)
    done = sum((r.env_steps - r.start_step) * len(r.seeds) for r in results)
    seeds = run.seeds
    finals = [final_return_from_rows(rows, seed) for seed in (seeds or [run.config.seed])]
    fields = dict(
        algo=run.algo,
        env=run.env.id,
        **({"seeds": seeds} if seeds else {"seed": run.config.seed}),
        steps=steps,
        wall_seconds=wall_seconds,
        compile_seconds=float(np.mean([r.compile_seconds for r in results])) if results else 0.0,
        train_seconds=train_seconds,
        sps=(done / train_seconds / (len(seeds) if seeds else 1)) if train_seconds else float("nan"),
        final_return=finals if seeds else finals[0],
        peak_rss_mb=peak_rss_mb(),
        state_fingerprint=fingerprints if seeds else fingerprints[0],
        **_distributed_summary(results),
        **_devices_summary(results),
        **({"diverged": divergences} if divergences else {}),
        **_evaluation_summary(rows, seeds or [run.config.seed], several=bool(seeds)),
        **best_evaluations(run.run_dir, seeds),
        **(extra or {}),
        **made_with(),
    )
    with summary_lock(run.run_dir):  # kitae eval may be adding its figures to the old one
        return write_summary(run.run_dir, **fields)


def _evaluation_summary(rows: list[dict], seeds: list[int], several: bool) -> dict:
    """``summary.json``'s ``eval_return``, ``eval_return_std``, ``eval_episodes``, ``eval_step``
    (one value per seed for runs of several seeds) and ``eval_policy`` (the keys ``kitae eval``
    writes) from each seed's last ``train_cfg.eval_episodes`` evaluation in ``metrics.jsonl``;
    nothing when the run evaluated none."""
    last = {row["seed"]: row for row in rows if "eval_return" in row and row.get("seed") in seeds}
    if not last:
        return {}

    def per_seed(key: str) -> list:
        return [last[s][key] if s in last else None for s in seeds]

    means, stds, steps = per_seed("eval_return"), per_seed("eval_return_std"), per_seed("step")
    return {
        "eval_return": means if several else means[0],
        "eval_return_std": stds if several else stds[0],
        "eval_episodes": max(row["eval_episodes"] for row in last.values()),
        "eval_step": steps if several else steps[0],
        # PeriodicEvaluation plays each checkpoint's deterministic policy (no explore_step), as
        # kitae eval does without --stochastic
        "eval_policy": "deterministic",
    }


def run_divergences(result: RunResult, run_dir: Path, checkpoint: Path | None) -> list[dict]:
    """``summary.json``'s ``diverged`` entries of a result: ``{"seed", "step", "losses",
    "checkpoint"}`` for each seed that diverged (``checkpoint``: the newest, which holds the last
    finite parameters)."""
    out = []
    for seed, divergence in zip(result.seeds, result.diverged):
        if divergence is not None:
            where = relative_checkpoint(run_dir, checkpoint)
            losses = {k: (v if np.isfinite(v) else str(v)) for k, v in divergence.losses.items()}  # JSON: no NaN
            out.append({"seed": seed, "step": divergence.step, "what": divergence.describe(), "losses": losses,
                        "checkpoint": where})  # fmt: skip
    return out


def every_seed_diverged(summary: dict) -> bool:
    """``summary.json``'s content records that every seed of the run diverged (its ``diverged``
    entries name them all: ``seed``, or each of ``seeds``). ``kitae resume`` and ``agent.resume``
    report such a run again instead of training on (seeds trained together where some did not
    diverge go on: the diverged ones stay so)."""
    entries = summary.get("diverged") or []
    seeds = summary.get("seeds") or [summary.get("seed")]
    return bool(entries) and set(seeds) <= {entry.get("seed") for entry in entries}


def describe_divergence(entry: dict, several: bool) -> str:
    """One ``diverged`` entry as the line ``kitae`` prints."""
    who = f"seed {entry['seed']} " if several else ""
    where = (
        f"; the newest checkpoint ({entry['checkpoint']}) holds the last finite parameters"
        if entry["checkpoint"]
        else ""
    )
    return f"{who}diverged at step {entry['step']:,}: {entry['what']}{where}"


def relative_checkpoint(run_dir: Path, checkpoint: Path | None) -> str | None:
    """The checkpoint's path as the user named the run directory."""
    if checkpoint is None:
        return None
    if checkpoint.is_relative_to(run_dir.absolute()):
        return str(run_dir / checkpoint.relative_to(run_dir.absolute()))
    return str(checkpoint)


def _distributed_summary(results: list[RunResult]) -> dict:
    """``{"distributed": the last distributed run's metrics}`` (lags, restarts, where time went),
    or nothing when no part of the run was distributed."""
    last = [r.metrics for r in results if r.executor == "distributed" and isinstance(r.metrics, dict)]
    return {"distributed": {k: float(v) for k, v in last[-1].items()}} if last else {}


def _devices_summary(results: list[RunResult]) -> dict:
    """``{"devices": n}`` when seeds trained together were sharded over ``n`` devices (``kitae.devices``)."""
    devices = max((r.devices for r in results), default=1)
    return {"devices": devices} if devices > 1 else {}
