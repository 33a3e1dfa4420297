"""``kitae.loops.train`` (seed 001's path): the host loop's documented functions.

``vectorized_train`` trains an agent in a Gymnasium, EnvPool or PettingZoo vector environment;
it is the host executor (``kitae.loops.host.HostExecutor``) with the writer and checkpointer
arguments of seed 001 turned into callbacks. ``check_env`` and ``process_termination`` are the
host loop's own (``kitae.loops.host``).

Step units: ``n_env_steps`` and ``start_step`` count environment transitions summed over all
environments (a step of ``N`` copies of a multi-agent environment is ``N`` steps, whatever the
number of agents).
"""

from __future__ import annotations

from typing import Any

from kitae.envs.subproc import SubProcVecParallelEnv
from kitae.loops.callbacks import Callback, WriterLogger
from kitae.loops.host import EnvLike, HostExecutor, check_env, episode_statistics, process_termination
from kitae.loops.result import RunResult
from kitae.loops.state import Payload, apply_loop_state, payload_from_agent
from kitae.types import AlgoType
from kitae.validation import check_positive_int

__all__ = [
    "check_env",
    "process_termination",
    "episode_statistics",
    "vectorized_train",
    "SubProcVecParallelEnv",
    "CheckpointerCallback",
]


class CheckpointerCallback(Callback):
    """Hands every due checkpoint to ``checkpointer.save(step, payload)`` (e.g. a
    ``kitae.runs.checkpoints.Checkpointer``)."""

    def __init__(self, checkpointer: Any) -> None:
        if not callable(getattr(checkpointer, "save", None)):
            raise TypeError(
                f"checkpointer={checkpointer!r} is not allowed; allowed: an object with save(step, payload)"
            )
        self.checkpointer = checkpointer

    def on_checkpoint(self, payload: Payload) -> None:
        """``checkpointer.save(step, payload)`` at the payload's environment step (one seed's: a
        scalar ``payload.state.env_step``)."""
        self.checkpointer.save(int(payload.state.env_step), payload)


def vectorized_train(
    seed: int,
    agent: Any,
    env: EnvLike,
    n_env_steps: int,
    algo_type: AlgoType,
    *,
    start_step: int = 1,
    checkpointer: Any = None,
    writer: Any = None,
    callbacks: Any = (),
) -> RunResult:
    """Trains an agent in a vectorized environment.

    Important: ``env.close()`` is called at the end of the training.

    The host loop (``kitae.loops.host``): each vector step acts, steps ``env``, stores the real
    next observations (``process_termination``) and, when ``agent.schedule`` says so, updates.
    The agent's state, key, buffer and counters are those at the end.

    Args:
        seed (int): An int for reproducibility (seeds the environments' reset).
        agent (IAgent): An agent to train.
        env (EnvLike): An environment to train in (see ``check_env``).
        n_env_steps (int): The number of steps to do in the environment: transitions summed over
            all environments, rounded up to whole iterations (``kitae.schedule``).
        algo_type (AlgoType): The type of algorithm (must match ``agent.algo_type``).
        start_step (int): The starting step in the environment: 1 for a fresh agent; steps
            ``start_step .. start_step + n_env_steps - 1`` are done (the agent's ``env_step`` is
            set to ``start_step - 1`` first).
        checkpointer: optional, with ``save(step, payload)`` (``kitae.runs.checkpoints.Checkpointer``):
            called every ``train_cfg.save_frequency`` steps and at the end.
        writer (SummaryWriter): optional TensorBoard writer; x axis = environment steps.
        callbacks: more ``kitae.loops.callbacks.Callback`` objects.

    Returns:
        The ``kitae.loops.result.RunResult``.
    """
    if not isinstance(algo_type, AlgoType):
        raise TypeError(f"algo_type={algo_type!r} is not allowed; allowed: a kitae.types.AlgoType")
    if getattr(agent, "algo_type", algo_type) is not algo_type:
        raise ValueError(f"algo_type={algo_type} does not match the agent's {agent.algo_type}")
    check_positive_int("n_env_steps", n_env_steps)
    check_positive_int("start_step", start_step)
    extra: list[Callback] = [WriterLogger(writer)] if writer is not None else []
    if checkpointer is not None:
        extra.append(CheckpointerCallback(checkpointer))
    start = payload_from_agent(agent).state
    start = start._replace(env_step=start.env_step * 0 + (start_step - 1))
    result = HostExecutor().run(
        agent,
        env,
        start_step - 1 + n_env_steps,
        start=start,
        seeds=[seed],
        callbacks=[*extra, *(callbacks if not isinstance(callbacks, Callback) else [callbacks])],
    )
    apply_loop_state(agent, result.state)
    return result
