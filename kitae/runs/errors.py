"""The error of a run's input, which the command line reports in one line."""

from __future__ import annotations

__all__ = ["RunError"]


class RunError(Exception):
    """A problem with the user's input (a run directory, a flag, a checkpoint) that the command line
    reports in one line, without a traceback."""
