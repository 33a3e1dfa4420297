"""Stopping cleanly on Ctrl-C and SIGTERM: finish the current step or segment, save, exit."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from kitae.loops.callbacks import Callback

__all__ = ["StopRequest", "stop_on_signals"]

_held: list[StopRequest] = []  # the requests of the stop_on_signals blocks the main thread is in


class StopRequest(Callback):
    """Set by the first SIGINT / SIGTERM. As a callback, its ``should_stop`` tells the executor to
    stop after the current step (host loop) or segment (compiled loop), saving a checkpoint."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def __call__(self) -> bool:
        """Whether a SIGINT or SIGTERM came (as ``should_stop``; the ``stopping`` of
        ``PeriodicEvaluation``)."""
        return self.signal is not None

    def should_stop(self) -> bool:
        """Whether a SIGINT or SIGTERM came: the executor then stops and saves a checkpoint."""
        return self.signal is not None

    @property
    def name(self) -> str:
        """The signal's name (``"SIGINT"``, ``"SIGTERM"``), ``""`` before one came."""
        return signal.Signals(self.signal).name if self.signal is not None else ""


@contextlib.contextmanager
def stop_on_signals(
    doing: str = "finishing the current step and saving a checkpoint (Ctrl-C again aborts without saving)",
) -> Iterator[StopRequest]:
    """Within the block, SIGINT (Ctrl-C) and SIGTERM ask the run to stop cleanly; a second Ctrl-C
    aborts at once (``KeyboardInterrupt``). Handlers are only installed in the main thread.
    ``doing``: what the notice printed at the first signal says happens next.

    Within an outer block (a host-loop sweep around each combination's run) it yields the outer
    block's request and installs nothing: a signal that comes between two runs, or while one
    writes its summary, is recorded where the outer block looks for it, not lost with an inner
    block's handler (nor turned into ``KeyboardInterrupt`` by Python's own between them)."""
    if threading.current_thread() is not threading.main_thread():
        yield StopRequest()
        return
    if _held:
        yield _held[-1]
        return
    stop = StopRequest()

    def handler(signum: int, frame: Any) -> None:
        if stop.signal is None:
            stop.signal = signum
            sys.stderr.write(f"\nkitae: {signal.Signals(signum).name} received: {doing}\n")
            sys.stderr.flush()
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    _held.append(stop)
    try:
        yield stop
    finally:
        _held.remove(stop)
        for sig, old in previous.items():
            signal.signal(sig, old)
