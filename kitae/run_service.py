"""The run service: how the agent facade's ``train``, ``resume``, ``save`` and ``unserialize``
reach ``kitae.runs``, a layer above the agents.

``kitae.base`` depends on this interface only; ``kitae.runs.python_api.PythonRuns`` implements it
with the code the command line runs and ``kitae.runs`` installs it when it is imported (importing
``kitae`` does). So a run started from Python writes the same run directory as one started with
``kitae train``, and the layers still import one way (``docs/architecture.md``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

__all__ = ["RunService", "install_run_service", "run_service"]


class RunService(Protocol):
    """What ``agent.train``, ``agent.resume``, ``agent.save`` and ``Agent.unserialize`` delegate to."""

    def train(self, agent: Any, env: Any, n_env_steps: int | None, **options: Any) -> Any:
        """Trains ``agent`` in ``env`` for ``n_env_steps`` more steps into its run directory."""
        ...

    def resume(self, agent: Any, env: Any, n_env_steps: int | None, **options: Any) -> Any:
        """Restores ``agent`` from its run directory's newest checkpoint and trains on to ``n_env_steps``."""
        ...

    def save(self, agent: Any, step: int | None, directory: str | Path | None) -> Path:
        """Saves the agent's whole state as a checkpoint; returns its folder."""
        ...

    def load(
        self, agent_cls: type | None, run_dir: str | Path, seed_index: int, checkpoint: int | str | None = None
    ) -> Any:
        """Rebuilds the agent of a run directory from its newest checkpoint, its best-evaluated one
        (``checkpoint="best"``) or the checkpoint of a step."""
        ...


_INSTALLED: list[RunService] = []


def install_run_service(service: RunService) -> None:
    """Installs the service the agent facade uses (``kitae.runs`` does, when imported)."""
    _INSTALLED[:] = [service]


def run_service() -> RunService:
    """The installed service.

    Raises:
        RuntimeError: when none is installed (``kitae.base`` loaded without the ``kitae`` package,
            which importing it always runs).
    """
    if not _INSTALLED:
        raise RuntimeError("no run service is installed: import kitae (kitae.runs installs it)")
    return _INSTALLED[0]
