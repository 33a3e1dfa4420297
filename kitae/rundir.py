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


def curves_from_metrics(rows: Iterable[dict]) -> dict[Any, tuple[np.ndarray, np.ndarray]]:
    """``{seed: (steps, returns)}`` from metrics rows that carry ``episodic_return``."""
    curves: dict[Any, tuple[list, list]] = {}
    for row in rows:
        if "episodic_return" in row:
            steps, returns = curves.setdefault(row.get("seed", 0), ([], []))
            steps.append(row["step"])
            returns.append(row["episodic_return"])
    return {seed: (np.asarray(s), np.asarray(r)) for seed, (s, r) in curves.items()}


def _smooth(steps: np.ndarray, returns: np.ndarray, grid: np.ndarray, window: int = 10) -> np.ndarray:
    if len(returns) == 0:
        return np.full_like(grid, np.nan, dtype=float)
    kernel = min(window, len(returns))
    smoothed = np.convolve(returns, np.ones(kernel) / kernel, mode="valid")
    return np.interp(grid, steps[kernel - 1:], smoothed, left=np.nan)


def plot_curves(runs: dict[str, dict[Any, tuple[np.ndarray, np.ndarray]]], path: str | Path,
                title: str | None = None) -> Path:
    """Plots return against environment steps: for each run, its seeds' mean (a rolling mean of
    10 episodes per seed) as a line and their min-max as a band. Writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for label, curves in runs.items():
        curves = {s: c for s, c in curves.items() if len(c[0])}
        if not curves:
            continue
        end = max(c[0].max() for c in curves.values())
        grid = np.linspace(0, end, 200)
        lines = np.stack([_smooth(s, r, grid) for s, r in curves.values()])
        mean = np.nanmean(lines, axis=0) if len(lines) > 1 else lines[0]
        (line,) = ax.plot(grid, mean, label=f"{label} ({len(curves)} seed{'s' if len(curves) > 1 else ''})", lw=1.8)
        if len(lines) > 1:
            ax.fill_between(grid, np.nanmin(lines, axis=0), np.nanmax(lines, axis=0), color=line.get_color(), alpha=0.2)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episodic return (rolling mean of 10)")
    ax.grid(alpha=0.3)
    ax.ticklabel_format(axis="x", style="sci", scilimits=(0, 3))
    if title:
        ax.set_title(title)
    if runs:
        ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
