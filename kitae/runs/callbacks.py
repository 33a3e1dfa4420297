"""The run directory's callbacks: ``metrics.jsonl`` rows and checkpoints, written as the executor runs.

(TensorBoard files are written by ``kitae.loops.callbacks.WriterLogger`` with a
``tensorboardX.SummaryWriter``, the progress bar is ``kitae.runs.progress.ProgressBar`` and
Ctrl-C is ``kitae.runs.signals.StopRequest``.)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

from kitae.loops.callbacks import Callback, Progress
from kitae.loops.result import RECENT_EPISODES, Episodes, recent_return
from kitae.loops.state import Payload
from kitae.runs.checkpoints import Checkpointer
from kitae.runs.rundir import MetricsFile

__all__ = [
    "MetricsLogger",
    "CheckpointSaver",
    "ImportWhileTraining",
    "PeriodicEvaluation",
    "StopAtReturn",
    "checkpoint_callbacks",
    "stop_at_return",
]


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
        """Writes one row per row of ``episodes`` (its ``step``, ``return_``, ``length`` and
        ``count``, each ``(n,)``), with the seed at ``episodes.seed_index``."""
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
    """Saves each due checkpoint with a ``Checkpointer``; ``last`` is the newest checkpoint folder.

    Args:
        checkpointer: where to save.
        evaluation: the run's ``PeriodicEvaluation``, placed before this callback: each
            checkpoint's metadata then holds its evaluation (``eval_return``), by which the
            checkpointer keeps the best one (``Checkpointer.best_step``).
    """

    def __init__(self, checkpointer: Checkpointer, evaluation: PeriodicEvaluation | None = None) -> None:
        self.checkpointer, self.evaluation = checkpointer, evaluation
        self.last: Path | None = None

    def on_checkpoint(self, payload: Payload) -> None:
        """Saves ``payload`` at its furthest seed's step (the largest of ``payload.state.env_step``,
        a scalar, or ``(n_seeds,)`` for seeds trained together), with the evaluation's
        ``eval_return`` in its metadata when ``payload`` was evaluated; ``last`` becomes its folder."""
        extra = self.evaluation.checkpoint_meta(payload) if self.evaluation is not None else None
        self.last = self.checkpointer.save(int(np.max(np.asarray(payload.state.env_step))), payload, extra=extra)


class PeriodicEvaluation(Callback):
    """``train_cfg.eval_episodes``: at every checkpoint, each seed's deterministic policy over
    ``episodes`` episodes, with the executor's ``evaluate`` (what ``kitae eval`` runs: the same
    environments and seed, so the last evaluation is ``kitae eval RUN_DIR --episodes N``'s).

    Each evaluation is a ``metrics.jsonl`` row (``step``, ``seed``, ``eval_return`` (the mean raw
    return), ``eval_return_std``, ``eval_episodes``) and, for the run's first seed, the
    TensorBoard scalars ``eval/episodic_return`` and ``eval/episodic_return_std``. Placed before
    the ``CheckpointSaver``, so a checkpoint's rows include its evaluation.

    Args:
        agent: the run's agent (its ``act`` and ``acting_params``; the evaluated state is the
            checkpoint's).
        executor: the run's executor.
        env: the run's environment id.
        episodes: episodes per evaluation (>= 1).
        metrics: the open ``metrics.jsonl``.
        writer: the run's TensorBoard writer, or ``None``.
        seeds: the run's seeds, by seed index (a checkpoint of seeds trained together holds them
            along its leading axis).
        stopping: the run's ``StopRequest`` (``kitae.runs.signals``), or ``None``: the checkpoint
            a stop writes (Ctrl-C, SIGTERM) is not evaluated, so the run stops as soon as it is
            saved.
    """

    def __init__(
        self,
        agent: Any,
        executor: Any,
        env: Any,
        episodes: int,
        metrics: MetricsFile,
        writer: Any,
        seeds: list[int],
        stopping: Callable[[], bool] | None = None,
    ) -> None:
        self.agent, self.executor, self.env, self.episodes = agent, executor, env, episodes
        self.metrics, self.writer, self.seeds, self.stopping = metrics, writer, seeds, stopping
        self._evaluated: tuple[Payload, list[float]] | None = None  # the last payload and its means
        self.latest: list[float] | None = None  # each seed's mean return at the latest evaluation

    def checkpoint_meta(self, payload: Payload) -> dict | None:
        """``{"eval_return": mean}`` (a list, one per seed, for seeds trained together) for the
        checkpoint metadata of ``payload`` once it was evaluated, else ``None``. Asked once, by
        the saver that follows: the payload (a whole training state, a replay buffer with it) is
        not kept any longer."""
        evaluated, self._evaluated = self._evaluated, None
        if evaluated is None or evaluated[0] is not payload:
            return None
        means = evaluated[1]
        return {"eval_return": means if payload.meta.get("seeds") is not None else means[0]}

    def on_checkpoint(self, payload: Payload) -> None:
        """Evaluates each seed's acting parameters of ``payload`` (for seeds trained together, the
        ``index``-th slice along the leading axis of every leaf of ``payload.state.agent_state``),
        writes one ``metrics.jsonl`` row per seed and the first seed's TensorBoard scalars, and
        keeps the means for ``checkpoint_meta`` and ``latest``. Nothing while the run is being
        stopped (``stopping()`` true)."""
        if self.stopping is not None and self.stopping():
            return
        steps = np.broadcast_to(np.asarray(payload.state.env_step), (len(self.seeds),))
        batched = payload.meta.get("seeds") is not None
        means = []
        for index, seed in enumerate(self.seeds):
            state = payload.state.agent_state
            if batched:
                state = jax.tree_util.tree_map(lambda x, i=index: x[i], state)
            returns = self.executor.evaluate(
                self.agent, self.env, self.episodes, params=self.agent.acting_params(state)
            )
            step, mean, std = int(steps[index]), float(np.mean(returns)), float(np.std(returns))
            means.append(mean)
            self.metrics.write(step=step, seed=seed, eval_return=mean, eval_return_std=std, eval_episodes=len(returns))
            if self.writer is not None and index == 0:
                self.writer.add_scalar("eval/episodic_return", mean, step)
                self.writer.add_scalar("eval/episodic_return_std", std, step)
        self._evaluated = (payload, means)
        self.latest = means


def checkpoint_callbacks(
    checkpointer: Checkpointer,
    agent: Any,
    executor: Any,
    env: Any,
    episodes: int,
    metrics: MetricsFile,
    writer: Any,
    seeds: list[int],
    stopping: Callable[[], bool] | None = None,
) -> tuple[CheckpointSaver, list[Callback]]:
    """What every run (``execute``, a compiled sweep's combinations) does at a checkpoint: a
    ``PeriodicEvaluation`` when ``episodes`` (the run's ``train_cfg.eval_episodes``) is at least 1,
    then the ``CheckpointSaver``, which records that evaluation with the checkpoint.

    Args:
        checkpointer: the run's (or one host seed's) checkpointer.
        agent, executor, env, episodes, metrics, writer, seeds, stopping: as for ``PeriodicEvaluation``.

    Returns:
        ``(saver, callbacks)``: the saver (its ``last`` is the newest checkpoint) and the
        callbacks, in order.
    """
    evaluation = (
        PeriodicEvaluation(agent, executor, env, episodes, metrics, writer, seeds, stopping) if episodes else None
    )
    saver = CheckpointSaver(checkpointer, evaluation)
    return saver, [*([evaluation] if evaluation is not None else []), saver]


class StopAtReturn(Callback):
    """``train_cfg.stop_return``: stops the run once every seed's return has reached ``target``.

    The return is each seed's mean over its last ``RECENT_EPISODES`` training episodes (the
    summary's ``final_return``; a seed with fewer finished episodes has not reached it), or, with
    an ``evaluation``, each seed's mean return at the latest evaluation (the checkpoints' ``kitae
    eval``). The executor then saves a checkpoint and ends the run as a finished one.

    Args:
        target: the return to reach.
        n_seeds: seeds trained together (the ``seed_index`` of ``Episodes``).
        evaluation: the run's ``PeriodicEvaluation``, placed before this callback, or ``None``.

    Attributes:
        reached: once stopped, ``{"step": environment step, "returns": [each seed's return]}``.
    """

    def __init__(self, target: float, n_seeds: int, evaluation: PeriodicEvaluation | None = None) -> None:
        self.target, self.evaluation = float(target), evaluation
        self.recent: list[tuple[list[float], list[int]]] = [([], []) for _ in range(n_seeds)]
        self.step = 0
        self.changed = False  # something new to look at since the last should_stop
        self.reached: dict | None = None

    def on_episodes(self, episodes: Episodes) -> None:
        """Records the furthest step of ``episodes`` and, without an evaluation, the rows of its
        seed (``return_`` and ``count``, each ``(n,)``) that the mean over its last
        ``RECENT_EPISODES`` episodes reads."""
        self.step = max(self.step, int(np.max(episodes.step, initial=0)))
        if self.evaluation is not None:
            return
        returns, counts = self.recent[episodes.seed_index]
        returns.extend(episodes.return_.tolist())
        counts.extend(episodes.count.tolist())
        while len(counts) > 1 and sum(counts[1:]) >= RECENT_EPISODES:  # only the rows the mean reads
            del returns[0], counts[0]
        self.changed = True

    def on_checkpoint(self, payload: Payload) -> None:
        """With an evaluation that has run, records the checkpoint's furthest step
        (``payload.state.env_step``) so ``should_stop`` looks at the new evaluation."""
        if self.evaluation is not None and self.evaluation.latest is not None:
            self.step = max(self.step, int(np.max(np.asarray(payload.state.env_step))))
            self.changed = True

    def returns(self) -> list[float | None]:
        """Each seed's return as this callback judges it, ``None`` where there is none yet."""
        if self.evaluation is not None:
            latest = self.evaluation.latest
            return [None] * len(self.recent) if latest is None else list(latest)
        means = [recent_return(r, c) for r, c in self.recent]
        return [mean if count >= RECENT_EPISODES else None for mean, count in means]

    def should_stop(self) -> bool:
        """Whether every seed's return (``returns``) has reached ``target``; once it has, ``reached``
        is set and every later call is ``True``. Looks again only when episodes or an evaluation
        came since the last call."""
        if self.reached is not None:
            return True
        if not self.changed:  # called after every host step: look only when something changed
            return False
        self.changed = False
        returns = self.returns()
        if all(r is not None and r >= self.target for r in returns):
            self.reached = {"step": self.step, "returns": returns}
        return self.reached is not None


def stop_at_return(train_cfg: Any, n_seeds: int, saver: CheckpointSaver) -> list[StopAtReturn]:
    """The run's ``StopAtReturn`` when its ``train_cfg.stop_return`` is set (judged by the
    evaluation ``saver`` records, if the run evaluates), placed after ``checkpoint_callbacks``'s
    callbacks; else none."""
    if train_cfg.stop_return is None:
        return []
    return [StopAtReturn(train_cfg.stop_return, n_seeds, saver.evaluation)]


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
        """Imports the modules at the first call; later calls do nothing."""
        modules, self.modules = self.modules, ()
        for name in modules:
            importlib.import_module(name)
