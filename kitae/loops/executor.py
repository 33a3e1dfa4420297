"""The executor seam: one protocol, two implementations, and the one place that picks between them.

An executor runs an agent's pure functions (``kitae.base``) in a loop. Every executor shares the
schedule (``kitae.schedule``), the collection and update steps (``kitae.loops.collect``), the
loop state and checkpoint payload (``kitae.loops.state``), the result (``kitae.loops.result``) and
the callbacks (``kitae.loops.callbacks``); only the driving loop differs:

- ``HostExecutor`` (``kitae.loops.host``): a Python loop over Gymnasium, EnvPool and PettingZoo
  vector environments;
- ``CompiledExecutor`` (``kitae.loops.compiled``): the whole run as one XLA program, for
  environments written in JAX (gymnax, Brax, JaxMARL).

``executor_for(env_or_spec)`` picks one; nothing else in kitae tests which executor to use.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from kitae.envs.jax_env import VecJaxEnv
from kitae.envs.make import EnvSpec
from kitae.loops.compiled import CompiledExecutor, loop_state_shape
from kitae.loops.evaluate import EvaluatesBySource
from kitae.loops.host import HostExecutor
from kitae.loops.result import RunResult
from kitae.loops.state import LoopState

__all__ = ["Executor", "executor_for", "EXECUTORS"]


class Executor(Protocol):
    """What every executor does.

    Attributes:
        name: ``"host"``, ``"compiled"`` or ``"distributed"`` (``kitae.distributed.DistributedExecutor``;
            recorded in checkpoints).
        batches_seeds: whether one ``run`` trains several seeds together (else one seed per run).
        makes_envs: ``run`` takes the environment id and makes the environments itself (the
            distributed executor's workers), instead of environments made by the caller.
        starting: a line to show before a run starts (the compiled loop compiles first), or ``None``.
    """

    name: str
    batches_seeds: bool
    makes_envs: bool
    starting: str | None

    def run(
        self,
        agent: Any,
        env: Any,
        n_env_steps: int,
        *,
        start: LoopState | None = None,
        seeds: list[int] | None = None,
        callbacks: Any = (),
    ) -> RunResult:
        """Trains until ``n_env_steps`` in all (whole iterations), from ``start`` (default: the
        agent's own state); see ``HostExecutor.run`` and ``CompiledExecutor.run``."""
        ...

    def restore_target(self, agent: Any, env: Any, meta: dict) -> LoopState | None:
        """The abstract ``LoopState`` a checkpoint with metadata ``meta`` is restored into
        (``None``: build it from the checkpoint's own description, for payloads without an
        environment part)."""
        ...

    def evaluate(
        self,
        agent: Any,
        spec: EnvSpec,
        episodes: int,
        seed: int = 0,
        params: Any = None,
        explore_step: int | None = None,
    ) -> np.ndarray:
        """Raw returns of ``episodes`` episodes of the deterministic policy, ``(episodes,)``
        (``params``: the acting parameters to evaluate, default the agent's; ``explore_step``:
        of the policy as it explores at that environment step instead,
        ``kitae.loops.evaluate``)."""
        ...


class _Host(EvaluatesBySource, HostExecutor):
    makes_envs = False

    def restore_target(self, agent: Any, env: Any, meta: dict) -> LoopState | None:
        del agent, env, meta
        return None


class _Compiled(EvaluatesBySource, CompiledExecutor):
    makes_envs = False

    def restore_target(self, agent: Any, env: Any, meta: dict) -> LoopState | None:
        if not meta.get("env_saved"):
            return None
        shape = loop_state_shape(agent, env, meta.get("seeds"))
        # checkpoints written before LoopState.diverged_step lack it (the run starts it at -1)
        return shape if meta.get("diverged_saved") else shape._replace(diverged_step=None)


EXECUTORS: dict[str, Executor] = {"host": _Host(), "compiled": _Compiled()}
"""The executors by name."""


def executor_for(env_or_spec: Any) -> Executor:
    """The executor of an environment (a ``VecJaxEnv`` trains compiled, anything else in the host
    loop) or of an ``EnvSpec`` / id (JAX sources compiled, the others in the host loop)."""
    if isinstance(env_or_spec, (EnvSpec, str)):
        return EXECUTORS["compiled" if EnvSpec.parse(env_or_spec).is_jax else "host"]
    return EXECUTORS["compiled" if isinstance(env_or_spec, VecJaxEnv) else "host"]
