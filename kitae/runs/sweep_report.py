"""A sweep's report: ``sweep.json``, ``table.txt`` and ``curves.png`` (``write_sweep``), and the
lines the command prints (``outcome``). Shared by a sweep (``kitae.runs.sweep``) and a resumed one
(``kitae.runs.sweep_resume``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kitae.runs.plotting import curves_from_metrics, evaluations_from_metrics, plot_curves
from kitae.runs.resolve import ResolvedRun
from kitae.runs.rundir import json_safe, read_metrics

__all__ = ["combination_name", "counted", "format_table", "outcome", "write_sweep"]


def combination_name(values: dict[str, float]) -> str:
    """A combination's directory name: ``learning_rate=0.001,clip_coef=0.2``."""
    return ",".join(f"{key.split('.')[-1]}={value:g}" for key, value in values.items())


def write_sweep(
    sweep_dir: Path,
    run: ResolvedRun,
    grid: dict[str, list[float]],
    combos: list[tuple[dict[str, float], ResolvedRun]],
    one_program: bool,
    workers: int | None,
    wall_seconds: float,
    compile_seconds: float,
    train_seconds: float,
) -> dict:
    """Writes the sweep directory's ``sweep.json``, ``table.txt`` and ``curves.png`` from each
    combination's ``summary.json`` and ``metrics.jsonl``; returns ``sweep.json``'s content with
    ``sweep_dir``."""
    entries: list[dict] = []
    curves: dict = {}
    evaluations: dict = {}
    for values, combo in combos:
        summary = json.loads((combo.run_dir / "summary.json").read_text())
        finals = np.asarray(summary["final_return"], float).reshape(-1)
        diverged = sorted({d["seed"] for d in summary.get("diverged", [])})
        stopped = sorted({int(e["step"]) for e in summary.get("stopped_early", [])})  # train_cfg.stop_return
        entries.append(
            {
                "values": values,
                "run_dir": str(combo.run_dir),
                # what the run trained: the requested total (the report's "steps") rounded up to
                # whole iterations of its algorithm (a PPO rollout of n_envs x n_steps)
                "steps": int(summary["steps"]),
                "final_return": finals.tolist(),
                "mean": float(np.nanmean(finals)) if np.isfinite(finals).any() else float("nan"),
                "std": float(np.nanstd(finals)) if np.isfinite(finals).any() else float("nan"),
                "min": float(np.nanmin(finals)) if np.isfinite(finals).any() else float("nan"),
                "max": float(np.nanmax(finals)) if np.isfinite(finals).any() else float("nan"),
                "diverged_seeds": diverged,
                "stopped_early_at": stopped,
            }
        )
        rows = read_metrics(combo.run_dir / "metrics.jsonl") if (combo.run_dir / "metrics.jsonl").exists() else []
        label = combination_name(values) + (" (diverged)" if diverged else "")
        curves[label], evaluations[label] = curves_from_metrics(rows, counts=True), evaluations_from_metrics(rows)
    title = f"{run.algo} {run.env.id}: {len(combos)} combinations"
    plot_curves(curves, sweep_dir / "curves.png", title=title, evaluations=evaluations)
    report = {
        "algo": run.algo,
        "env": run.env.id,
        "grid": grid,
        "seeds": run.seeds,
        "steps": run.total,
        "one_program": one_program,
        "workers": workers,
        "wall_seconds": wall_seconds,
        "compile_seconds": compile_seconds,
        "train_seconds": train_seconds,
        "combinations": entries,
    }
    (sweep_dir / "sweep.json").write_text(json.dumps(json_safe(report), indent=2, allow_nan=False) + "\n")
    (sweep_dir / "table.txt").write_text(format_table(report) + "\n")
    return {**report, "sweep_dir": str(sweep_dir)}


def format_table(report: dict) -> str:
    """``sweep.json``'s combinations as a table, best mean final return first."""
    keys = list(report["grid"])
    header = [k.split(".")[-1] for k in keys] + ["final return (mean +- std over seeds)", "min", "max", "note"]
    lines = []
    order = sorted(report["combinations"], key=lambda e: -e["mean"] if np.isfinite(e["mean"]) else np.inf)
    for e in order:
        notes = [f"diverged (seeds {', '.join(map(str, e['diverged_seeds']))})"] if e["diverged_seeds"] else []
        if e.get("stopped_early_at"):  # absent from a sweep.json written before the field
            steps = ", ".join(f"{s:,}" for s in e["stopped_early_at"])
            notes.append(f"stopped early (step{'s' * (len(e['stopped_early_at']) > 1)} {steps})")
        note = "; ".join(notes)
        lines.append(
            [f"{e['values'][k]:g}" for k in keys]
            + [f"{e['mean']:.1f} +- {e['std']:.1f}", f"{e['min']:.1f}", f"{e['max']:.1f}", note]
        )
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    table = [fmt.format(*header), fmt.format(*("-" * w for w in widths))] + [fmt.format(*line) for line in lines]
    return "\n".join(line.rstrip() for line in table)


def outcome(report: dict) -> tuple[str, bool]:
    """What ``kitae sweep`` and ``kitae resume SWEEP_DIR`` print for ``report`` (``sweep_run``'s
    or ``resume_sweep``'s): ``(text, stopped)``; the table and one line, or when a signal stopped
    the sweep one line naming what finished, what stopped with a checkpoint, what had not
    started, and the command that finishes it."""
    if report.get("stopped"):
        parts = [f"kitae: sweep stopped by {report['signal']} at step {report['steps']:,} in {report['sweep_dir']}"]
        for key, what in (
            ("finished", "finished"),
            ("checkpointed", "stopped with a checkpoint"),
            ("not_started", "not started"),
        ):
            if report[key]:
                parts.append(f"{what}: {', '.join(report[key])}")
        return "; ".join(parts) + f"; finish it with: kitae resume {report['sweep_dir']}", True
    how = (
        "one program"
        if report["one_program"]
        else f"{report['workers']} at a time on Ray"
        if report["workers"]
        else "one after another"
    )
    timing = (
        f", compile {report['compile_seconds']:.1f} s, train {report['train_seconds']:.1f} s"
        if report["one_program"] and np.isfinite(report["compile_seconds"])  # NaN: nothing left to train
        else ""
    )
    line = (
        f"{counted(len(report['combinations']), 'combination')} x {counted(len(report['seeds']), 'seed')} "
        f"({how}){timing}, "
        f"wall {report['wall_seconds']:.1f} s -> {report['sweep_dir']}"
    )
    return format_table(report) + "\n" + line, False


def counted(n: int, noun: str) -> str:
    """``"1 seed"``, ``"4 seeds"`` (the sweep's printed lines)."""
    return f"{n} {noun}" + ("" if n == 1 else "s")
