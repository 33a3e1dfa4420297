"""What a run returns, whatever the executor: ``RunResult``, and the ``Episodes`` it reports."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Episodes", "RunResult", "Divergence", "concat_episodes", "recent_return", "RECENT_EPISODES"]

# How many of a seed's latest training episodes its "final return" (summary.json, the command's
# line, ``RunResult.final_return``) and ``train_cfg.stop_return`` average over.
RECENT_EPISODES = 10


def recent_return(returns: Any, counts: Any, last: int = RECENT_EPISODES) -> tuple[float, int]:
    """Mean return of (about) the latest ``last`` episodes, from rows that each stand for
    ``counts[i]`` episodes of mean return ``returns[i]`` (the compiled loop reports one row per
    iteration): rows are taken whole from the end until they hold ``last`` episodes.

    Args:
        returns: ``(n,)`` each row's mean return, oldest first.
        counts: ``(n,)`` how many episodes each row stands for.
        last: episodes to average over (>= 1).

    Returns:
        ``(mean, episodes)``: the mean (nan if no episode) and how many episodes it is over (at
        least ``last`` unless fewer finished, possibly more when a row holds several).
    """
    total, count = 0.0, 0
    for ret, n in zip(reversed(list(returns)), reversed(list(counts))):
        total, count = total + float(ret) * int(n), count + int(n)
        if count >= last:
            break
    return (total / count if count else float("nan")), count


class Episodes(NamedTuple):
    """Finished training episodes of one seed, as parallel arrays.

    The host loop reports each episode (``count`` 1); the compiled loop reports, for each iteration
    in which episodes ended, their mean (``count`` of them).

    Attributes:
        step: ``(n,)`` environment step at which they ended (the iteration's end for the compiled loop).
        return_: ``(n,)`` the return (mean over ``count`` episodes); multi-agent: the team's, the
            sum of the agents' returns.
        length: ``(n,)`` the length (mean over ``count``).
        count: ``(n,)`` how many episodes each row stands for.
        agent_returns: multi-agent: ``{agent: (n,)}`` each agent's return (mean); else ``None``.
        seed_index: which seed of the run.
    """

    step: np.ndarray
    return_: np.ndarray
    length: np.ndarray
    count: np.ndarray  # type: ignore[assignment]  # a field named like tuple.count: shadows the method on purpose
    agent_returns: dict[str, np.ndarray] | None = None
    seed_index: int = 0

    @classmethod
    def empty(cls, seed_index: int = 0, agents: tuple[str, ...] | None = None) -> Episodes:
        """No episodes: every array ``(0,)`` (``step`` and ``count`` int64); with ``agents`` (a
        multi-agent run), ``agent_returns`` maps each of them to ``(0,)``."""
        zeros = np.zeros(0)
        return cls(
            zeros.astype(np.int64),
            zeros,
            zeros,
            zeros.astype(np.int64),
            None if agents is None else dict.fromkeys(agents, zeros),
            seed_index,
        )

    def __len__(self) -> int:
        return len(self.step)


def concat_episodes(parts: list[Episodes], seed_index: int = 0, agents: tuple[str, ...] | None = None) -> Episodes:
    """One ``Episodes`` from several, in order (``agents``: the agents of a multi-agent run, so that
    a run in which no episode ended still says whose returns it would hold)."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return Episodes.empty(seed_index, agents)
    first_agents = parts[0].agent_returns
    agent_returns: dict[str, np.ndarray] | None = None
    if first_agents is not None:
        by_part = []
        for p in parts:
            assert p.agent_returns is not None, "single-agent and multi-agent episodes in one concat_episodes"
            by_part.append(p.agent_returns)
        agent_returns = {a: np.concatenate([returns[a] for returns in by_part]) for a in first_agents}
    return Episodes(
        np.concatenate([p.step for p in parts]),
        np.concatenate([p.return_ for p in parts]),
        np.concatenate([p.length for p in parts]),
        np.concatenate([p.count for p in parts]),
        agent_returns,
        seed_index,
    )


class Divergence(NamedTuple):
    """Where a run diverged: the first update whose losses or new parameters were not finite.

    Attributes:
        step: the environment step after which that update was made.
        losses: its info, ``{name: value}`` (the non-finite values say which loss diverged);
            empty where ``before_resume``.
        before_resume: the run diverged before it was last resumed (a compiled run's
            checkpoint keeps the step; that part's logs have the losses).
    """

    step: int
    losses: dict[str, float]
    before_resume: bool = False

    def describe(self) -> str:
        """``"loss_qvalue=nan"`` (the non-finite losses), ``"a parameter is not finite (every
        loss is)"``, or ``"before the run was resumed"``."""
        if self.before_resume:
            return "before the run was resumed"
        bad = [f"{name}={value}" for name, value in self.losses.items() if not np.isfinite(value)]
        return ", ".join(bad) if bad else "a parameter is not finite (every loss is)"


@dataclasses.dataclass
class RunResult:
    """The result of a training run, from any executor.

    Attributes:
        executor: ``"host"``, ``"compiled"`` or ``"distributed"``.
        seeds: the seeds trained (several only for a compiled run of seeds in one program).
        state: the final ``kitae.loops.state.LoopState`` (leading seed axis when ``batched``).
        episodes: one ``Episodes`` per seed: the episodes that ended in this run.
        update_steps: one array per seed: the environment steps after which updates happened.
        start_step: environment steps when this run started (0 unless it went on from a state).
        env_steps: environment steps at the end (counted from the start of training).
        compile_seconds: time spent tracing and compiling (or loading from the cache): the compiled
            program, or the host loop's first act and first update.
        train_seconds: time spent training, compilation excluded.
        stopped: the run was stopped early (a callback's ``should_stop``).
        batched: the state has a leading seed axis (seeds trained together in one program).
        metrics: compiled runs: the per-iteration ``IterationMetrics`` (numpy); distributed runs:
            ``{name: float}`` (start-up and time spent per part in seconds, restarts, the policy
            and gradient lags' means and maxima over the run); host runs ``None``.
        diverged: one entry per seed: a ``Divergence`` where the seed's run diverged (its state
            is then the last finite one: the diverged update was not kept, nor any after it), else
            ``None``. A single run that diverges stops (``stopped``); seeds trained together go on.
        devices: the devices the seed axis was sharded over (``kitae.devices``); 1 when it was not.
    """

    executor: str
    seeds: list[int]
    state: Any
    episodes: list[Episodes]
    update_steps: list[np.ndarray]
    start_step: int
    env_steps: int
    compile_seconds: float
    train_seconds: float
    stopped: bool = False
    batched: bool = False
    metrics: Any = None
    diverged: list[Divergence | None] = dataclasses.field(default_factory=list)
    devices: int = 1

    def divergence(self, seed_index: int = 0) -> Divergence | None:
        """The seed's ``Divergence``, or ``None`` where it did not diverge."""
        return self.diverged[seed_index] if seed_index < len(self.diverged) else None

    @property
    def n_updates(self) -> int:
        """Updates made in this run (by the first seed)."""
        return len(self.update_steps[0])

    @property
    def sps(self) -> float:
        """Environment transitions per second of training in this run, summed over seeds."""
        done = (self.env_steps - self.start_step) * len(self.seeds)
        return done / self.train_seconds if self.train_seconds else float("nan")

    @property
    def episode_returns(self) -> list[float]:
        """The first seed's episode returns, in order (host runs: one per episode)."""
        return self.episodes[0].return_.tolist()

    @property
    def episode_steps(self) -> list[int]:
        """The environment steps at which the first seed's episodes ended, in the order of ``episode_returns``."""
        return self.episodes[0].step.tolist()

    @property
    def episode_lengths(self) -> list[float]:
        """The first seed's episode lengths, in the order of ``episode_returns``."""
        return self.episodes[0].length.tolist()

    @property
    def agent_episode_returns(self) -> dict[str, list[float]]:
        """Multi-agent runs: ``{agent: the first seed's returns of that agent}``, in the order of
        ``episode_returns`` (the team's); ``{}`` for a single agent."""
        agents = self.episodes[0].agent_returns
        return {} if agents is None else {a: v.tolist() for a, v in agents.items()}

    def final_return(self, seed_index: int = 0, last: int = RECENT_EPISODES) -> float:
        """Mean return of (about) the last ``last`` finished episodes of one seed: rows are taken
        whole from the end until they hold ``last`` episodes (nan if none finished;
        ``recent_return``)."""
        e = self.episodes[seed_index]
        return recent_return(e.return_, e.count, last)[0]

    def mean_return(self, last: int = RECENT_EPISODES) -> float:
        """``final_return(0, last)``: the first seed's mean return of its last ``last`` episodes."""
        return self.final_return(0, last)

    def final_agent_returns(self, seed_index: int = 0, last: int = RECENT_EPISODES) -> dict[str, float]:
        """Multi-agent runs: ``{agent: mean return}`` over the same episodes as ``final_return``
        (whose team return is their sum; ``recent_return`` per agent)."""
        e = self.episodes[seed_index]
        if e.agent_returns is None:
            raise ValueError("final_agent_returns is for multi-agent runs; this run has a single agent")
        return {agent: recent_return(returns, e.count, last)[0] for agent, returns in e.agent_returns.items()}

    def episode_curve(self, seed_index: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, returns)`` of one seed's finished episodes (rows)."""
        e = self.episodes[seed_index]
        return e.step, e.return_
