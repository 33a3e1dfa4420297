"""The run directory's callbacks: ``metrics.jsonl`` rows and checkpoints, written as the executor runs.

(TensorBoard files are written by ``kitae.loops.callbacks.WriterLogger`` with a
``tensorboardX.SummaryWriter``, the progress bar is ``kitae.runs.progress.ProgressBar`` and
Ctrl-C is ``kitae.runs.signals.StopRequest``.)
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np

from kitae.loops.callbacks import Callback, Progress
from kitae.loops.result import Episodes
from kitae.loops.state import Payload
from kitae.runs.checkpoints import Checkpointer
from kitae.runs.rundir import MetricsFile

__all__ = ["MetricsLogger", "CheckpointSaver", "ImportWhileTraining"]


class MetricsLogger(Callback):
    """Appends one ``metrics.jsonl`` row per finished episode (host loop) or per iteration in which
    episodes finished (compiled loop): ``step``, ``seed``, ``episodic_return``,
    ``episodic_length``, ``episodes`` (how many episodes the row's means are over).

    Args:
        metrics: the open ``metrics.jsonl``.
        seeds: the run's seeds, by seed index.
    """

    def __init__(self, metrics: MetricsFile, seeds: list[int]) -> None:
        self.metrics, self.seeds = metrics, seeds

    def on_episodes(self, episodes: Episodes) -> None:
        seed = self.seeds[episodes.seed_index]
        for i in range(len(episodes)):
            self.metrics.write(
                step=int(episodes.step[i]),
                seed=seed,
                episodic_return=float(episodes.return_[i]),
                episodic_length=float(episodes.length[i]),
                episodes=int(episodes.count[i]),
            )


class CheckpointSaver(Callback):
    """Saves each due checkpoint with a ``Checkpointer``; ``last`` is the newest checkpoint folder."""

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.checkpointer = checkpointer
        self.last: Path | None = None

    def on_checkpoint(self, payload: Payload) -> None:
        self.last = self.checkpointer.save(int(np.max(np.asarray(payload.state.env_step))), payload)


class ImportWhileTraining(Callback):
    """Imports modules the run needs later (orbax for its last checkpoint, matplotlib for
    ``curve.png``) at its first progress report: in the compiled loop this thread then waits on
    XLA, which trains the next segment, so the imports (about 0.5 s) add nothing to the run's time.

    Args:
        modules: module names, imported in order.
    """

    def __init__(self, *modules: str) -> None:
        self.modules: tuple[str, ...] = modules

    def on_progress(self, progress: Progress) -> None:
        modules, self.modules = self.modules, ()
        for name in modules:
            importlib.import_module(name)
