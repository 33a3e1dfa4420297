"""The error of a run's input, which the command line reports in one line."""

from __future__ import annotations

__all__ = ["RunError", "RunDiverged"]


class RunError(Exception):
    """A problem with the user's input (a run directory, a flag, a checkpoint) that the command line
    reports in one line, without a traceback."""


class RunDiverged(RunError):
    """A run whose losses or parameters became non-finite: it stopped (or, seeds trained together,
    the diverged seeds stopped learning) keeping its last finite state; ``summary.json`` says where
    (``diverged``), and the newest checkpoint holds the last finite parameters. The command line
    reports it in one line and exits with status 3."""
