"""One process trains in a run directory at a time: ``in_use_by_this_process(directory)``.

Two ``kitae resume RUN_DIR`` (or ``kitae train --run-dir DIR``, ``agent.train(env)``, a sweep and
a ``kitae resume`` of one of its combinations) started together would both train in it: each
replaces ``metrics.jsonl`` (truncated at its checkpoint) and appends to its own copy, so one's rows
are lost; both write TensorBoard events (every point twice); both save and delete the same
checkpoint folders. The training entry points hold an exclusive ``flock`` on the directory while
they run, so the second one is refused with one line. ``kitae eval`` and ``kitae plot`` only read
(``eval`` writes its figures into ``summary.json``) and take no lock: evaluating a run while it
trains is allowed.

Why ``flock`` on the directory itself: nothing is added to the run directory (its contract lists
its files), and the kernel releases the lock when the process ends, however it ends, so a killed
run leaves no stale lock behind. It is advisory (only kitae's entry points ask for it) and it
works on local file systems and on NFS (Linux emulates it with the server's locks).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from kitae.runs.errors import RunError

__all__ = ["in_use_by_this_process"]

# directories this process holds, with how many nested holders (a sweep holds each combination's
# directory while one of them trains through the same entry point as a single run), and their
# descriptors
_HELD: dict[Path, int] = {}
_DESCRIPTORS: dict[Path, int] = {}


def _drop_in_a_forked_child() -> None:
    """A process forked while a directory is held (a subprocess vector environment's worker) would
    share the lock and keep it after its parent ended; it closes its copies (the parent's lock
    stays: it holds its own descriptor)."""
    for descriptor in _DESCRIPTORS.values():
        with contextlib.suppress(OSError):
            os.close(descriptor)
    _HELD.clear()
    _DESCRIPTORS.clear()


os.register_at_fork(after_in_child=_drop_in_a_forked_child)


@contextlib.contextmanager
def in_use_by_this_process(directory: Path, what: str = "run directory") -> Iterator[None]:
    """Holds ``directory`` (which must exist) for this process within the block.

    Args:
        directory: a run, sweep or combination directory.
        what: how the refusal names it (``"run directory"``, ``"sweep directory"``).

    Raises:
        RunError: another process holds it.
    """
    key = Path(directory).resolve()
    if key in _HELD:  # this process holds it already
        _HELD[key] += 1
        try:
            yield
        finally:
            _HELD[key] -= 1
        return
    descriptor = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunError(
                f"{what} {str(directory)!r} is in use: another kitae process is training in it; wait for it to end "
                "(or stop it: Ctrl-C, or kill -TERM, saves a checkpoint) and try again"
            ) from None
        _HELD[key], _DESCRIPTORS[key] = 1, descriptor
        try:
            yield
        finally:
            del _HELD[key], _DESCRIPTORS[key]
    finally:
        os.close(descriptor)  # releases the lock
