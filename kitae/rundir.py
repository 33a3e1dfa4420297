"""What a run leaves on disk (DESIGN.md, run directory): config, metrics, summary, curve.

``runs/<run_name>/`` holds ``config.yaml``, ``logs/`` (TensorBoard), ``metrics.jsonl`` (one JSON
object per logged point), ``summary.json`` (written when the run ends) and ``curve.png``.
Nothing here is pickled.
"""

from __future__ import annotations

import hashlib
import json
import resource
from pathlib import Path
from typing import Any, Iterable

import jax
import numpy as np


def state_fingerprint(state: Any) -> str:
    """A SHA-256 of every array leaf of ``state`` (dtype, shape and bytes, in tree order).

    Two runs with equal fingerprints hold bit-identical parameters, optimizer states and targets.
    """
    digest = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(state):
        array = np.asarray(leaf)
        digest.update(str(array.dtype).encode())
        digest.update(str(array.shape).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def peak_rss_mb() -> float:
    """Peak resident memory of this process, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class MetricsFile:
    """Appends one JSON object per line to ``metrics.jsonl``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self.path.open("a")

    def write(self, **values: Any) -> None:
        self._file.write(json.dumps({k: _plain(v) for k, v in values.items()}) + "\n")

    def flush(self) -> None:
        """Pushes the written rows to disk (before a checkpoint, so it never runs ahead of them)."""
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _plain(value: Any) -> Any:
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    if isinstance(value, jax.Array):
        return np.asarray(value).tolist()
    return value


def read_metrics(path: str | Path) -> list[dict]:
    """The objects of a ``metrics.jsonl`` file (blank or torn last lines skipped)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def write_summary(run_dir: str | Path, **fields: Any) -> dict:
    """Writes ``summary.json`` (atomically: a temporary file renamed over the old one)."""
    path = Path(run_dir) / "summary.json"
    tmp = path.with_suffix(".json.tmp")
    data = {k: _plain(v) for k, v in fields.items()}
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
    return data


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


def _smooth(steps: np.ndarray, returns: np.ndarray, grid: np.ndarray, window: int = 10,
            counts: np.ndarray | None = None) -> np.ndarray:
    """The mean of the last ``window`` episodes at each step (fewer at the start), read at ``grid``
    (NaN before the first episode and after the last). Rows averaging several episodes weigh as many."""
    if len(returns) == 0:
        return np.full_like(grid, np.nan, dtype=float)
    counts = np.ones(len(returns)) if counts is None else np.maximum(np.asarray(counts, float), 1e-12)
    total_n = np.concatenate([[0.0], np.cumsum(counts)])
    total_r = np.concatenate([[0.0], np.cumsum(np.asarray(returns, float) * counts)])
    end = np.arange(1, len(returns) + 1)
    begin = np.searchsorted(total_n, total_n[end] - window, side="left")
    begin = np.minimum(begin, end - 1)  # at least the row itself
    smoothed = (total_r[end] - total_r[begin]) / (total_n[end] - total_n[begin])
    return np.interp(grid, steps, smoothed, left=np.nan, right=np.nan)


def _format_steps(value: float, _: Any = None) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def plot_curves(runs: dict[str, dict[Any, tuple[np.ndarray, ...]]], path: str | Path,
                title: str | None = None, window: int = 10) -> Path:
    """Plots return against environment steps: for each run, its seeds' mean (each seed smoothed
    as the mean of its last ``window`` episodes) as a line and their min-max as a band. Curves are
    ``(steps, returns)`` or ``(steps, returns, episodes)`` (``curves_from_metrics``). Writes
    the image (PNG, PDF or SVG, from the suffix)."""
    import warnings

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(8, 4.6), dpi=130)
    for label, curves in runs.items():
        curves = {s: c for s, c in curves.items() if len(c[0])}
        if not curves:
            continue
        start = min(c[0].min() for c in curves.values())
        end = max(c[0].max() for c in curves.values())
        grid = np.linspace(start, end, 300) if end > start else np.asarray([start, start + 1.0])
        lines = np.stack([_smooth(c[0], c[1], grid, window, c[2] if len(c) > 2 else None) for c in curves.values()])
        with warnings.catch_warnings():  # grid points where no seed has a value yet stay NaN
            warnings.simplefilter("ignore", RuntimeWarning)
            mean = np.nanmean(lines, axis=0)
            low, high = np.nanmin(lines, axis=0), np.nanmax(lines, axis=0)
        seeds = f"{len(curves)} seed{'s' if len(curves) > 1 else ''}"
        (line,) = ax.plot(grid, mean, label=f"{label}  [{seeds}]", lw=2)
        if len(lines) > 1:
            ax.fill_between(grid, low, high, color=line.get_color(), alpha=0.18, lw=0)
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
        if any(len(c) > 1 for c in runs.values()):
            legend.set_title("line: mean over seeds, band: min-max", prop={"size": 7})
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
