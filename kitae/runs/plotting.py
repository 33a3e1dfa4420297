"""Curves of runs: return against environment steps, for ``curve.png`` and ``kitae plot``."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from kitae.algos.collections import algorithm_of_params_name
from kitae.envs.make import EnvSpec
from kitae.runs.errors import RunError
from kitae.runs.rundir import check_run_dir, read_metrics, read_run_config, run_config_names, sweep_run_dirs

__all__ = ["curves_from_metrics", "evaluations_from_metrics", "plot_curves", "plot_runs"]


def curves_from_metrics(rows: Iterable[dict], counts: bool = False) -> dict[Any, tuple[np.ndarray, ...]]:
    """``{seed: (steps, returns)}`` from metrics rows that carry ``episodic_return``.

    With ``counts``, ``{seed: (steps, returns, episodes)}``: how many episodes each row averages
    (the compiled loop logs one row per iteration with an ``episodes`` count; the host loop one
    row per episode).
    """
    curves: dict[Any, tuple[list, list, list]] = {}
    for row in rows:
        if "episodic_return" in row:
            steps, returns, n = curves.setdefault(row.get("seed", 0), ([], [], []))
            steps.append(row["step"])
            returns.append(row["episodic_return"])
            n.append(row.get("episodes", 1))
    return {
        seed: (np.asarray(s), np.asarray(r, dtype=float), np.asarray(n, dtype=float))[: 3 if counts else 2]
        for seed, (s, r, n) in curves.items()
    }


def evaluations_from_metrics(rows: Iterable[dict]) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, returns)``: the ``train_cfg.eval_episodes`` evaluations of metrics rows
    (``eval_return``), the mean over the seeds evaluated at each step, by step; empty arrays when
    the run evaluated nothing (or only returns that are not finite)."""
    by_step: dict[int, list[float]] = {}
    for row in rows:
        value = row.get("eval_return")
        if value is not None and np.isfinite(value):
            by_step.setdefault(int(row["step"]), []).append(float(value))
    steps = sorted(by_step)
    return np.asarray(steps, dtype=float), np.asarray([np.mean(by_step[s]) for s in steps], dtype=float)


def _smooth(
    steps: np.ndarray, returns: np.ndarray, grid: np.ndarray, window: int = 10, counts: np.ndarray | None = None
) -> np.ndarray:
    """The mean of the last ``window`` episodes at each step (fewer at the start), read at ``grid``
    (NaN before the first episode; after the last, that last mean held to the grid's end, which
    ``plot_curves`` sets at the run's end). Rows averaging several episodes weigh as many, and are
    taken whole until they hold ``window`` episodes: ``kitae.loops.result.recent_return``'s rule,
    so that a curve ends at the run's ``final_return``."""
    if len(returns) == 0:
        return np.full_like(grid, np.nan, dtype=float)
    counts = np.ones(len(returns)) if counts is None else np.maximum(np.asarray(counts, float), 1e-12)
    total_n = np.concatenate([[0.0], np.cumsum(counts)])
    total_r = np.concatenate([[0.0], np.cumsum(np.asarray(returns, float) * counts)])
    end = np.arange(1, len(returns) + 1)
    # the latest start whose rows hold at least `window` episodes (the first row when none does)
    begin = np.maximum(np.searchsorted(total_n, total_n[end] - window, side="right") - 1, 0)
    smoothed = (total_r[end] - total_r[begin]) / (total_n[end] - total_n[begin])
    # Held, not NaN, after the seed's last episode: a seed whose episodes run long (CartPole at 500)
    # often ends none in the run's last iterations, and a NaN there would drop it from the mean and
    # the band at the right edge. Before its first episode there is nothing to hold: NaN.
    return np.interp(grid, steps, smoothed, left=np.nan, right=smoothed[-1])


# what plot_curves imports: a run imports them while it trains (kitae.runs.callbacks.ImportWhileTraining)
PLOT_MODULES = ("matplotlib.figure", "matplotlib.backends.backend_agg")


def _format_steps(value: float, _: Any = None) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def _mean_and_band(
    curves: dict[Any, tuple[np.ndarray, ...]], window: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(grid, mean, low, high)``: one run's seeds (curves with at least one episode), each
    smoothed by ``_smooth``, read at 300 steps from the first episode to the run's last step, and
    their mean, min and max there."""
    import warnings

    start = min(c[0].min() for c in curves.values())
    # The run's end: the largest step any seed logged. Seeds trained together step in lockstep,
    # so each reached it, and a finished run's host seeds (trained one after another) each
    # trained to the run's steps: holding each seed's last mean up to it claims no step a seed
    # did not train (only a host run plotted while a later seed still trains holds that seed
    # past its step). summary.json's steps would need the run directory, which curves lack.
    end = max(c[0].max() for c in curves.values())
    grid = np.linspace(start, end, 300) if end > start else np.asarray([start, start + 1.0])
    lines = np.stack([_smooth(c[0], c[1], grid, window, c[2] if len(c) > 2 else None) for c in curves.values()])
    with warnings.catch_warnings():  # grid points before any seed's first episode stay NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(lines, axis=0)
        low, high = np.nanmin(lines, axis=0), np.nanmax(lines, axis=0)
    return grid, mean, low, high


def plot_curves(
    runs: dict[str, dict[Any, tuple[np.ndarray, ...]]],
    path: str | Path,
    title: str | None = None,
    window: int = 10,
    evaluations: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
) -> Path:
    """Plots return against environment steps: for each run, its seeds' mean (each seed smoothed
    as the mean of its last ``window`` episodes, its last mean held to the run's last step) as a
    line and their min-max as a band. Curves are
    ``(steps, returns)`` or ``(steps, returns, episodes)`` (``curves_from_metrics``).
    ``evaluations``: for the runs that evaluated their checkpoints, ``(steps, mean returns)``
    (``evaluations_from_metrics``), drawn as dots on a dashed line of the run's colour. Writes the
    image (PNG, PDF or SVG, from the suffix)."""
    import warnings

    # matplotlib's object interface, not pyplot: no global figure state, and a third less to import
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.font_manager import FontProperties
    from matplotlib.ticker import FuncFormatter

    fig = Figure(figsize=(8, 4.6), dpi=130)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for label, curves in runs.items():
        curves = {s: c for s, c in curves.items() if len(c[0])}
        if not curves:
            continue
        grid, mean, low, high = _mean_and_band(curves, window)
        seeds = f"{len(curves)} seed{'s' if len(curves) > 1 else ''}"
        (line,) = ax.plot(grid, mean, label=f"{label}  [{seeds}]", lw=2)
        if len(curves) > 1:
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.18, lw=0)
        steps, returns = (evaluations or {}).get(label, ((), ()))
        if len(steps):
            ax.plot(steps, returns, "o--", color=line.get_color(), lw=1, ms=4, label=f"{label}  [evaluation]")
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"episodic return (mean of last {window} episodes)")
    ax.xaxis.set_major_formatter(FuncFormatter(_format_steps))
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    if title:
        ax.set_title(title)
    if any(len(c) for c in runs.values()):
        legend = ax.legend(loc="best", fontsize=8, frameon=True, framealpha=0.85)
        notes = []
        if any(len(c) > 1 for c in runs.values()):
            notes.append("line: mean over seeds, band: min-max")
        if any(len(e[0]) for e in (evaluations or {}).values()):
            notes.append("dots: deterministic policy at each checkpoint")
        if notes:
            legend.set_title("; ".join(notes), prop=FontProperties(size=7))
    path = Path(path)
    with warnings.catch_warnings():
        # a run directory's name in a script the font lacks (CJK with DejaVu Sans) is drawn as boxes;
        # matplotlib's warning, one per character, would be printed as the run's own
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font")
        fig.tight_layout()
        fig.savefig(path)
    return path


def plot_runs(run_dirs: list[str | Path], output: str | Path | None = None, window: int = 10) -> Path:
    """Plots the training curves of several runs on one figure (each run's seeds as a mean line
    and a min-max band, each seed smoothed as the mean of its last ``window`` episodes); returns
    the image's path (default ``curves.png``). A sweep directory stands for each of its
    combinations' runs."""
    if not run_dirs:
        raise RunError("give at least one run directory")
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise RunError(f"--window {window} is not allowed; allowed: an int >= 1 (episodes averaged)")
    output = Path(output) if output is not None else Path("curves.png")
    if output.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise RunError(f"-o {str(output)!r}: the output must end in .png, .pdf or .svg")
    if not output.parent.is_dir():
        raise RunError(f"-o {str(output)!r}: the folder {str(output.parent)!r} does not exist")
    runs = []
    expanded = [run for run_dir in run_dirs for run in (sweep_run_dirs(run_dir) or [Path(run_dir)])]
    for run_dir in expanded:
        metrics_path = Path(run_dir) / "metrics.jsonl"
        if Path(run_dir).is_dir() and not (Path(run_dir) / "config.yaml").exists() and metrics_path.is_file():
            # The curves are all in metrics.jsonl: a run whose config.yaml was lost still plots,
            # labelled by its folder's name alone.
            run_dir = Path(run_dir)
            warnings.warn(
                f"{str(run_dir)!r} has no config.yaml: plotted from its metrics.jsonl, without its algorithm "
                "and environment",
                RuntimeWarning,
                stacklevel=2,
            )
            algo, env_id = "?", "?"
        else:
            run_dir = check_run_dir(run_dir)
            # Labels from the file's names, not a built config: a custom agent's run, whose params
            # class this process has not registered, plots as well.
            kind, task_name = run_config_names(run_dir)
            if kind is None:  # not a config kitae wrote: read_run_config says what is wrong with it
                read_run_config(run_dir)
            algo = algorithm_of_params_name(kind or "") or (kind or "?").rpartition(":")[2]
            try:
                env_id = EnvSpec.parse(task_name or "?").id
            except ValueError:
                env_id = task_name or "?"
        rows = read_metrics(metrics_path) if metrics_path.exists() else []
        curves = curves_from_metrics(rows, counts=True)
        if not curves:
            raise RunError(f"{str(run_dir)!r} has no finished episodes in metrics.jsonl yet")
        runs.append((run_dir, algo, env_id, curves, evaluations_from_metrics(rows)))
    algos, envs = {r[1] for r in runs}, {r[2] for r in runs}
    names = [r[0].name for r in runs]
    named, evaluations = {}, {}
    for run_dir, algo, env_id, curves, evaluated in runs:
        name = run_dir.name if names.count(run_dir.name) == 1 else str(run_dir)
        differs = [x for x, shared in ((algo, len(algos) == 1), (env_id, len(envs) == 1)) if not shared and x != "?"]
        label = name + (f" ({' '.join(differs)})" if differs else "")
        named[label], evaluations[label] = curves, evaluated
    title = " on ".join(
        ([next(iter(algos))] if algos - {"?"} and len(algos) == 1 else [])
        + ([next(iter(envs))] if envs - {"?"} and len(envs) == 1 else [])
    )
    plot_curves(named, output, title=title or None, window=window, evaluations=evaluations)
    return output
