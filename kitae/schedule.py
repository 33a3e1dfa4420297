"""When things happen in a training run: one pure description that every executor and the optimizer read.

A run is a sequence of **iterations**. An iteration collects ``vector_steps_per_iteration`` vector
steps (each moves every one of the ``n_envs`` environments once, so it is ``n_envs`` environment
steps), then updates the agent if an update is due. Every executor (the host loop, the compiled
loop) runs whole iterations and asks this module when to update and when to save; the optimizer
asks it how many gradient steps a run makes, to anneal its learning rate over exactly those.

The rules:

- **On-policy**: an iteration is one rollout of ``max_buffer_size`` vector steps; every iteration
  ends with one update on the full rollout.
- **Off-policy**: an update is due after the vector step that crosses a multiple of ``skip_steps``
  environment steps (at most one update per vector step), once ``env_step >= start_step`` and the
  buffer holds at least ``batch_size`` transitions. An iteration is ``skip_steps // n_envs`` vector
  steps when ``n_envs`` divides ``skip_steps`` (then every iteration end is such a crossing), else
  one vector step.
- **Length**: a run of ``n_env_steps`` runs whole iterations: ``n_env_steps`` rounded up to a
  multiple of ``steps_per_iteration``.
- **Checkpoints**: periodic saves happen at the end of the iteration that crosses a multiple of
  ``train_cfg.save_frequency`` environment steps (and at the end of the run).
- **Learning-rate annealing** decays over ``n_gradient_steps(train_cfg.n_env_steps)``: the number of
  gradient steps the run really makes, so the learning rate reaches 0 exactly at its end.

The custom-agent guide's fields keep working: ``start_step`` and ``skip_steps`` are read from the
algorithm's params when it has them (default 0 and 1), here and nowhere else.

Every method is pure; ``update_due`` and ``save_due`` take Python ints or JAX arrays (traced inside
the compiled loop), so the same rule runs in every executor.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kitae.config import MAX_ENV_STEPS, AlgoConfig
from kitae.types import AlgoType

__all__ = ["Schedule", "check_iteration_size"]


def check_iteration_size(n_envs: int, vector_steps_per_iteration: int) -> None:
    """Refuses ``n_envs`` environments whose one iteration (``vector_steps_per_iteration`` vector
    steps of them all) is more environment steps than a run may make; called before any
    environment is made (``kitae.runs.resolve``), and by ``Schedule.n_iterations``.

    Raises:
        ValueError: naming ``n_envs``, the iteration's size and the most environments allowed.
    """
    if n_envs * vector_steps_per_iteration > MAX_ENV_STEPS:
        per = f"{vector_steps_per_iteration:,} vector steps of {n_envs:,} environments"
        raise ValueError(
            f"n_envs={n_envs:,} is not allowed: one iteration ({per}) is {n_envs * vector_steps_per_iteration:,} "
            f"steps; allowed: at most {MAX_ENV_STEPS // vector_steps_per_iteration:,} environments here "
            "(step counters are int32 in JAX)"
        )


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When collection, updates, gradient steps, learning-rate decay and checkpoints happen.

    Build it with ``Schedule.from_config(config, algo_type)``. All step counts are environment
    steps summed over the environments (one vector step of ``n_envs`` environments is ``n_envs``).

    Attributes:
        n_envs: environments stepped together.
        n_agents: agents per environment (one transition of an environment stores one per agent).
        on_policy: learns from rollouts (``True``) or from a replay buffer.
        vector_steps_per_iteration: vector steps collected between two update checks.
        start_step: off-policy: no update before this many environment steps.
        skip_steps: off-policy: one update per vector step that crosses a multiple of this.
        batch_size: off-policy: the buffer must hold this many transitions before an update.
        gradient_steps_per_update: gradient steps one update makes (on-policy: epochs times
            minibatches; off-policy: ``n_epochs``).
        save_frequency: save every this many environment steps (at iteration ends), or -1.
    """

    n_envs: int
    n_agents: int
    on_policy: bool
    vector_steps_per_iteration: int
    start_step: int
    skip_steps: int
    batch_size: int
    gradient_steps_per_update: int
    save_frequency: int

    @classmethod
    def from_config(cls, config: AlgoConfig, algo_type: AlgoType) -> Schedule:
        """The schedule of ``config`` for an on- or off-policy agent."""
        update, env = config.update_cfg, config.env_cfg
        on_policy = algo_type is AlgoType.ON_POLICY
        if on_policy:
            minibatches = update.max_buffer_size * env.n_envs * env.n_agents // update.batch_size
            return cls(
                n_envs=env.n_envs,
                n_agents=env.n_agents,
                on_policy=True,
                vector_steps_per_iteration=update.max_buffer_size,
                start_step=0,
                skip_steps=1,
                batch_size=update.batch_size,
                gradient_steps_per_update=update.n_epochs * max(1, minibatches),
                save_frequency=config.train_cfg.save_frequency,
            )
        params = config.algo_params
        start_step = max(0, int(getattr(params, "start_step", 0)))
        skip_steps = max(1, int(getattr(params, "skip_steps", 1)))
        per_iteration = skip_steps // env.n_envs if skip_steps % env.n_envs == 0 else 1
        return cls(
            n_envs=env.n_envs,
            n_agents=env.n_agents,
            on_policy=False,
            vector_steps_per_iteration=per_iteration,
            start_step=start_step,
            skip_steps=skip_steps,
            batch_size=update.batch_size,
            gradient_steps_per_update=update.n_epochs,
            save_frequency=config.train_cfg.save_frequency,
        )

    # -- lengths -------------------------------------------------------------------------------

    @property
    def steps_per_iteration(self) -> int:
        """Environment steps one iteration collects."""
        return self.vector_steps_per_iteration * self.n_envs

    def n_iterations(self, n_env_steps: int) -> int:
        """Iterations a run of ``n_env_steps`` makes (rounded up).

        Raises:
            ValueError: when the rounded run is longer than ``kitae.config.MAX_ENV_STEPS``.
        """
        check_iteration_size(self.n_envs, self.vector_steps_per_iteration)
        iterations = -(-int(n_env_steps) // self.steps_per_iteration)
        if iterations * self.steps_per_iteration > MAX_ENV_STEPS:
            raise ValueError(
                f"n_env_steps={int(n_env_steps):,} is not allowed: in whole iterations of "
                f"{self.steps_per_iteration:,} steps it is {iterations * self.steps_per_iteration:,}; "
                f"allowed: at most {MAX_ENV_STEPS:,} in whole iterations (step counters are int32 in JAX)"
            )
        return iterations

    def run_steps(self, n_env_steps: int) -> int:
        """Environment steps a run of ``n_env_steps`` really makes: whole iterations."""
        return self.n_iterations(n_env_steps) * self.steps_per_iteration

    # -- updates -------------------------------------------------------------------------------

    def update_due(self, env_step: Any, buffer_rows: Any) -> Any:
        """Whether an update is due right after the vector step that brought the run to ``env_step``.

        Args:
            env_step: environment steps done, after the vector step (an int or an int array).
            buffer_rows: vector steps held by the buffer (its ``size``).

        Returns:
            A bool (or a bool array for array inputs).
        """
        if self.on_policy:
            return buffer_rows >= self.vector_steps_per_iteration
        crossed = env_step // self.skip_steps > (env_step - self.n_envs) // self.skip_steps
        started = env_step >= self.start_step
        enough = buffer_rows * (self.n_envs * self.n_agents) >= self.batch_size
        return crossed & started & enough

    def n_updates(self, n_env_steps: int) -> int:
        """Updates a run of ``n_env_steps`` makes (the run rounded up to whole iterations).

        Equal to counting ``update_due`` at every iteration end of the run, in closed form.
        """
        iterations = self.n_iterations(n_env_steps)
        if self.on_policy:
            return iterations
        per_iteration = self.steps_per_iteration
        rows_per_iteration = self.vector_steps_per_iteration * self.n_envs * self.n_agents
        first = max(1, -(-self.start_step // per_iteration), -(-self.batch_size // rows_per_iteration))
        if first > iterations:
            return 0
        if per_iteration >= self.skip_steps:  # every iteration end crosses a multiple of skip_steps
            return iterations - first + 1
        # one vector step per iteration, fewer environment steps than skip_steps: each crossing
        # iteration crosses exactly one multiple
        return iterations * per_iteration // self.skip_steps - (first - 1) * per_iteration // self.skip_steps

    def n_gradient_steps(self, n_env_steps: int) -> int:
        """Gradient steps a run of ``n_env_steps`` makes (the learning-rate annealing horizon), >= 1."""
        return max(1, self.n_updates(n_env_steps) * self.gradient_steps_per_update)

    # -- checkpoints ---------------------------------------------------------------------------

    def save_due(self, previous_step: Any, env_step: Any) -> Any:
        """Whether the iteration that went from ``previous_step`` to ``env_step`` crossed a multiple
        of ``save_frequency`` (always ``False`` when ``save_frequency`` is -1)."""
        if self.save_frequency == -1:
            return False
        return env_step // self.save_frequency > previous_step // self.save_frequency

    def save_iterations(self, first: int, last: int) -> list[int]:
        """The iteration ends ``k`` in ``(first, last]`` (iterations counted from the start of the run)
        after which a periodic checkpoint is due: for each multiple of ``save_frequency`` in
        ``(first * P, last * P]`` (``P = steps_per_iteration``), the first iteration end at or past it."""
        if self.save_frequency == -1:
            return []
        per, every = self.steps_per_iteration, self.save_frequency
        multiples = range(first * per // every + 1, last * per // every + 1)
        return sorted({-(-m * every // per) for m in multiples})

    def describe(self) -> str:
        """One line for logs and errors."""
        if self.on_policy:
            return (
                f"on-policy: one update every rollout of {self.vector_steps_per_iteration} x {self.n_envs} "
                f"steps, {self.gradient_steps_per_update} gradient steps each"
            )
        return (
            f"off-policy: one update (of {self.gradient_steps_per_update} gradient steps) per vector step "
            f"crossing a multiple of {self.skip_steps} steps, from step {self.start_step} and "
            f"{self.batch_size} stored transitions; iterations of {self.vector_steps_per_iteration} vector "
            f"step{'s' if self.vector_steps_per_iteration > 1 else ''} of {self.n_envs} environment"
            f"{'s' if self.n_envs > 1 else ''}"
        )
