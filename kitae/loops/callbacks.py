"""The one callback interface of the executors: progress, logging, checkpointing, stopping.

An executor calls these hooks while it trains; every hook is optional (the base class does
nothing). ``kitae.runs`` builds the run directory's callbacks on it (metrics file, checkpoints,
progress bar, Ctrl-C); ``WriterLogger`` writes TensorBoard scalars through any object with
``add_scalar(tag, value, step)`` (a ``tensorboardX.SummaryWriter``).

When the hooks are called:

- ``on_start(info)`` once, before training;
- ``on_episodes(episodes)`` with the episodes that ended (host loop: after the step where they
  ended; compiled loop: after each segment, one row per iteration);
- ``on_losses(step, losses, seed_index)`` with the mean of each update's info over the updates of
  the last ``train_cfg.log_frequency`` environment steps, and of those since then at every
  checkpoint and at the end (the same points in every executor, resumed or not);
- ``on_progress(progress)`` about twice a second (host loop) or after each segment (compiled);
- ``on_checkpoint(payload)`` when a checkpoint is due (``kitae.schedule``), when the run is
  stopped, and at the end;
- ``should_stop()`` after every step (host) or segment (compiled): ``True`` stops the run there,
  with a checkpoint (``RunResult.stopped``; ``kitae.runs`` then ends it as a finished run, unless
  Ctrl-C or SIGTERM asked for the stop);
- ``on_end(result)`` once, with the ``RunResult``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from kitae.loops.result import Episodes, RunResult
from kitae.loops.state import Payload

__all__ = ["Callback", "CallbackList", "Progress", "RunInfo", "LossMeans", "WriterLogger"]


@dataclasses.dataclass
class RunInfo:
    """What a run is, told to ``on_start``.

    Attributes:
        executor: ``"host"``, ``"compiled"`` or ``"distributed"``.
        seeds: the seeds trained in this run.
        start_step: environment steps when the run starts.
        end_step: environment steps it will end at (whole iterations).
        agent: the agent (its ``config``, its class).
    """

    executor: str
    seeds: list[int]
    start_step: int
    end_step: int
    agent: Any


@dataclasses.dataclass
class Progress:
    """Where a run is, told to ``on_progress``.

    Attributes:
        step: environment steps done (the furthest seed).
        sps: environment steps per second of training so far (per seed).
        latest_return: mean return of the latest finished episodes, or ``None``.
    """

    step: int
    sps: float
    latest_return: float | None = None


class Callback:
    """Hooks an executor calls while it trains (see the module docstring); all no-ops here."""

    def on_start(self, info: RunInfo) -> None:
        """Before training."""

    def on_episodes(self, episodes: Episodes) -> None:
        """Episodes ended."""

    def on_losses(self, step: int, losses: dict[str, float], seed_index: int | None) -> None:
        """Mean update info over the last ``log_frequency`` steps."""

    def on_progress(self, progress: Progress) -> None:
        """About twice a second, or after each segment."""

    def on_scalars(self, step: int, scalars: dict[str, float]) -> None:
        """Named scalars of the executor at ``step`` (the distributed executor's ``distributed/...``)."""

    def on_checkpoint(self, payload: Payload) -> None:
        """A checkpoint is due: ``payload`` is the whole training state at ``payload.state.env_step``."""

    def should_stop(self) -> bool:
        """Whether to stop the run now (it then saves a checkpoint and returns early)."""
        return False

    def on_end(self, result: RunResult) -> None:
        """After training."""


class CallbackList(Callback):
    """Several callbacks called in order (``should_stop`` is true when any says so)."""

    def __init__(self, callbacks: Iterable[Callback] = ()) -> None:
        self.callbacks = [cb for cb in callbacks if cb is not None]
        for cb in self.callbacks:
            if not isinstance(cb, Callback):
                raise TypeError(f"callback {cb!r} is not allowed; allowed: kitae.loops.callbacks.Callback instances")

    def on_start(self, info: RunInfo) -> None:
        """Calls every callback's ``on_start``, in order."""
        for cb in self.callbacks:
            cb.on_start(info)

    def on_episodes(self, episodes: Episodes) -> None:
        """Calls every callback's ``on_episodes``, in order."""
        for cb in self.callbacks:
            cb.on_episodes(episodes)

    def on_losses(self, step: int, losses: dict[str, float], seed_index: int | None) -> None:
        """Calls every callback's ``on_losses``, in order."""
        for cb in self.callbacks:
            cb.on_losses(step, losses, seed_index)

    def on_progress(self, progress: Progress) -> None:
        """Calls every callback's ``on_progress``, in order."""
        for cb in self.callbacks:
            cb.on_progress(progress)

    def on_scalars(self, step: int, scalars: dict[str, float]) -> None:
        """Calls every callback's ``on_scalars``, in order."""
        for cb in self.callbacks:
            cb.on_scalars(step, scalars)

    def on_checkpoint(self, payload: Payload) -> None:
        """Calls every callback's ``on_checkpoint``, in order."""
        for cb in self.callbacks:
            cb.on_checkpoint(payload)

    def should_stop(self) -> bool:
        """Whether any callback asks to stop (asked in order, up to the first that does)."""
        return any(cb.should_stop() for cb in self.callbacks)

    def on_end(self, result: RunResult) -> None:
        """Calls every callback's ``on_end``, in order."""
        for cb in self.callbacks:
            cb.on_end(result)


class LossMeans:
    """Means of each update's info over the updates of every ``log_frequency`` environment steps.

    ``add(step, info)`` after each update; it returns ``(step, means)`` when ``step`` crossed a
    multiple of ``log_frequency`` since the previous update (or ``start``), else ``None``;
    ``flush(step)`` returns what is left: the executors flush at every checkpoint and at the end,
    so a run resumed from a checkpoint of its ``save_frequency`` writes the same points as one
    that never stopped (a stop's checkpoint adds a point at the stop step: the pending sums are
    not saved in it). One ``add_scalar`` per loss and update would cost an off-policy agent more
    than acting does.
    """

    def __init__(self, log_frequency: int, start: int = 0) -> None:
        self.log_frequency = log_frequency
        self.sums: dict[str, float] = {}
        self.count = 0
        self.last_step = start

    def add(self, step: int, info: dict[str, float]) -> tuple[int, dict[str, float]] | None:
        """Adds one update's info (scalars, converted with ``float``) at environment step ``step``.

        Returns:
            ``(step, means)`` when ``step`` crossed a multiple of ``log_frequency`` since the
            previous update (the means of the updates since the last flush, this one included),
            else ``None``.
        """
        crossed = step // self.log_frequency > self.last_step // self.log_frequency
        self.last_step = step
        for name, value in info.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value)
        self.count += 1
        return self.flush(step) if crossed else None

    def flush(self, step: int) -> tuple[int, dict[str, float]] | None:
        """``(step, means)`` of the updates added since the last flush, then starts over; ``None``
        when there were none."""
        if not self.count:
            return None
        means = {name: total / self.count for name, total in self.sums.items()}
        self.sums, self.count = {}, 0
        return step, means


class WriterLogger(Callback):
    """Writes the run to a TensorBoard writer (anything with ``add_scalar(tag, value, step)``), x
    axis = environment steps: ``charts/episodic_return`` and ``charts/episodic_length`` (each row of
    ``on_episodes``; multi-agent: the team's, and each agent's as ``charts/<agent>/episodic_return``),
    ``losses/<name>``, the executor's scalars under their own names (``distributed/...``),
    ``charts/SPS`` (every ``sps_every`` steps of progress and at the end) and
    ``charts/compile_seconds``. Only the first seed of a run of several seeds is written.
    """

    def __init__(self, writer: Any, sps_every_seconds: float = 5.0) -> None:
        self.writer = writer
        self.sps_every_seconds = sps_every_seconds
        self._last_sps: tuple[float, int] | None = None
        self._sps_written_at: int | None = None  # the step of the last charts/SPS point

    def on_episodes(self, episodes: Episodes) -> None:
        """Writes each row's return and length (and each agent's return) at its ``step``; the
        first seed's only."""
        if episodes.seed_index != 0:
            return
        for i in range(len(episodes)):
            step = int(episodes.step[i])
            self.writer.add_scalar("charts/episodic_return", float(episodes.return_[i]), step)
            self.writer.add_scalar("charts/episodic_length", float(episodes.length[i]), step)
            for agent, values in (episodes.agent_returns or {}).items():
                self.writer.add_scalar(f"charts/{agent}/episodic_return", float(values[i]), step)

    def on_losses(self, step: int, losses: dict[str, float], seed_index: int | None) -> None:
        """Writes ``losses/<name>`` at ``step`` (the first seed's, or a run's without seeds)."""
        if seed_index in (None, 0):
            for name, value in losses.items():
                self.writer.add_scalar(f"losses/{name}", value, step)

    def on_scalars(self, step: int, scalars: dict[str, float]) -> None:
        """Writes each scalar under its own name at ``step``."""
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, step)

    def on_progress(self, progress: Progress) -> None:
        """Writes ``charts/SPS``, the steps per second since the last write, once at least
        ``sps_every_seconds`` have passed and the run moved on (the first call only starts the clock)."""
        import time

        now = time.perf_counter()
        if self._last_sps is None:
            self._last_sps = (now, progress.step)
            return
        then, step = self._last_sps
        if now - then >= self.sps_every_seconds and progress.step > step:
            self.writer.add_scalar("charts/SPS", (progress.step - step) / (now - then), progress.step)
            self._last_sps, self._sps_written_at = (now, progress.step), progress.step

    def on_end(self, result: RunResult) -> None:
        """Writes the run's ``charts/SPS`` per seed (when it trained at all, and ``on_progress``
        wrote none at that step: one point per step) and ``charts/compile_seconds``, at the run's
        last environment step."""
        if result.train_seconds > 0 and self._sps_written_at != result.env_steps:
            self.writer.add_scalar("charts/SPS", result.sps / len(result.seeds), result.env_steps)
        self.writer.add_scalar("charts/compile_seconds", result.compile_seconds, result.env_steps)
