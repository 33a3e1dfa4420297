"""The progress bar of a run (rich): steps, steps per second, latest return, time left."""

from __future__ import annotations

from typing import Any

import numpy as np

from kitae.loops.callbacks import Callback, Progress, RunInfo

__all__ = ["ProgressBar"]


class ProgressBar(Callback):
    """A rich progress bar, or nothing when ``quiet``; a callback of the executors.

    Args:
        description: the bar's label (``"PPO gymnax:CartPole-v1"``).
        quiet: show nothing.
    """

    def __init__(self, description: str, quiet: bool) -> None:
        self.description, self.quiet = description, quiet
        self.latest_return = float("nan")
        self.progress: Any = None

    def on_start(self, info: RunInfo) -> None:
        """Shows the bar (unless quiet) at ``info.start_step`` of ``info.end_step``; its label is the
        description, with the seed when the run trains one."""
        if self.quiet:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
        from rich.progress import Progress as Bar

        seeds = f" seed {info.seeds[0]}" if len(info.seeds) == 1 else ""
        self.progress = Bar(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[sps]} steps/s"),
            TextColumn("return {task.fields[ret]}"),
            TimeRemainingColumn(),
        )
        self.task = self.progress.add_task(
            self.description + seeds, total=info.end_step, completed=info.start_step, sps="-", ret="-"
        )
        self.progress.start()

    def on_progress(self, progress: Progress) -> None:
        """Moves the bar to ``progress.step`` with the steps per second and the latest finite return
        (the previous one is kept when ``progress.latest_return`` is ``None`` or not finite)."""
        if progress.latest_return is not None and np.isfinite(progress.latest_return):
            self.latest_return = progress.latest_return
        if self.progress is None:
            return
        ret = "-" if not np.isfinite(self.latest_return) else f"{self.latest_return:.1f}"
        self.progress.update(self.task, completed=progress.step, sps=f"{progress.sps:,.0f}", ret=ret)

    def on_end(self, result: Any) -> None:
        """Closes the bar (``result`` is not read)."""
        self.close()

    def close(self) -> None:
        """Stops the bar and lets it go; nothing when there is none (quiet, or already closed)."""
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def message(self, text: str) -> None:
        """Prints a line above the bar (nothing when quiet)."""
        if not self.quiet:
            from rich.console import Console

            (self.progress.console if self.progress is not None else Console(stderr=True)).print(text)
