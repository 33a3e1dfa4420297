"""The Python road: what ``agent.train``, ``agent.resume``, ``agent.save`` and ``Agent.unserialize``
do, through the same code as the command line (``kitae.runs.session``, ``kitae.runs.resume``, ``kitae.runs.load``).

``kitae.base`` declares the ``RunService`` interface these methods call; this module implements it
and ``kitae.runs`` installs it (``kitae.base.install_run_service``) when it is imported.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kitae.runs.checkpoints import Checkpointer
from kitae.runs.load import load_agent, refuse_a_run_of_several_seeds
from kitae.runs.resume import resume_agent
from kitae.runs.session import train_agent

__all__ = ["PythonRuns"]


class PythonRuns:
    """``kitae.base.RunService`` on the run-directory code of the command line."""

    def train(self, agent: Any, env: Any, n_env_steps: int | None, **options: Any) -> Any:
        """``agent.train``: ``kitae.runs.session.train_agent(agent, env, n_env_steps, **options)``
        (``options``: its ``callbacks`` and ``quiet``).

        Returns:
            The ``RunResult``.
        """
        return train_agent(agent, env, n_env_steps, **options)

    def resume(self, agent: Any, env: Any, n_env_steps: int | None, **options: Any) -> Any:
        """``agent.resume``: ``kitae.runs.resume.resume_agent(agent, env, n_env_steps, **options)``
        (``options``: its ``callbacks`` and ``quiet``).

        Returns:
            The ``RunResult``.
        """
        return resume_agent(agent, env, n_env_steps, **options)

    def save(self, agent: Any, step: int | None, directory: str | Path | None) -> Path:
        """``agent.save``: saves the agent's whole training state as a checkpoint, keeping
        ``train_cfg.keep_checkpoints`` of them.

        Args:
            agent: the agent.
            step: the checkpoint's step (its folder name); ``None``: ``agent.env_step``.
            directory: the checkpoints folder; ``None``: ``<agent.run_dir>/checkpoints``.

        Returns:
            The checkpoint folder.

        Raises:
            RunError: ``directory`` is ``None`` and ``agent.run_dir`` holds a run of several seeds.
        """
        if directory is None:  # the run's own checkpoints: not those of a run of several seeds
            refuse_a_run_of_several_seeds(Path(agent.run_dir), agent, None)
        directory = directory or Path(agent.run_dir) / "checkpoints"
        with Checkpointer.for_run(directory, agent.config.train_cfg) as checkpointer:
            return checkpointer.save(agent.env_step if step is None else step, agent)

    def load(
        self, agent_cls: type | None, run_dir: str | Path, seed_index: int, checkpoint: int | str | None = None
    ) -> Any:
        """``Agent.unserialize``: ``kitae.runs.load.load_agent`` (its arguments, same meanings).

        Returns:
            The agent restored from the checkpoint.
        """
        return load_agent(run_dir, seed_index, agent_cls=agent_cls, checkpoint=checkpoint)
