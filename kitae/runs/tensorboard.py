"""The run's TensorBoard writer (``logs/`` in the run directory, ``docs/runs.md``)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["tensorboard_writer", "summary_writer_class", "flush_to_disk"]


def summary_writer_class() -> type:
    """tensorboardX's ``SummaryWriter``, imported without PyTorch.

    tensorboardX imports ``torch`` at its own import wherever PyTorch is installed, only to accept
    torch tensors (kitae hands it Python floats): about a second of every run's start-up for a
    user with PyTorch beside kitae (1.0 s measured with ``python -X importtime``). Unless the
    process has imported torch already, torch is hidden from that one import (``sys.modules``
    maps it to ``None``, which makes ``import torch`` raise ``ImportError``, the case
    tensorboardX handles) and restored right after; a thread importing torch at that very moment
    would get the ``ImportError`` too.
    """
    if "tensorboardX.writer" in sys.modules or "torch" in sys.modules:
        from tensorboardX import SummaryWriter

        return SummaryWriter
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        from tensorboardX import SummaryWriter
    finally:
        if sys.modules.get("torch", 0) is None:
            del sys.modules["torch"]
    return SummaryWriter


@contextlib.contextmanager
def tensorboard_writer(run_dir: Path, purge_step: int | None = None) -> Iterator[Any]:
    """A tensorboardX ``SummaryWriter`` on ``run_dir / "logs"``, closed on leaving.

    Args:
        run_dir: the run directory.
        purge_step: a resumed run's checkpoint step: the new event file hides the old file's
            events from that step on (``None``: a new run).
    """
    writer = summary_writer_class()(str(run_dir / "logs"), purge_step=purge_step)
    try:
        yield writer
    finally:
        writer.close()


def flush_to_disk(writer: Any) -> None:
    """Writes every event ``writer`` (a tensorboardX ``SummaryWriter``) was given to its files.

    tensorboardX's own ``flush`` flushes the event file but not the queue its writing thread
    consumes, so events added just before it can still be in memory when a checkpoint appears; a
    run killed then loses them, and its resume is missing those TensorBoard points. Here each
    file writer's thread is stopped (it writes everything queued before the stop signal, in order),
    the file flushed, and a new thread started on the same queue and file. This reaches into
    tensorboardX 2.6's ``EventFileWriter`` (``_worker``, ``_event_queue``, ``_ev_writer``,
    ``_flush_secs``; the version is pinned); where those are missing it falls back to ``flush``.
    """
    from tensorboardX.event_file_writer import _EventLoggerThread

    for file_writer in (getattr(writer, "all_writers", None) or {}).values():
        events = getattr(file_writer, "event_writer", None)
        worker = getattr(events, "_worker", None)
        if events is None or worker is None or getattr(events, "_closed", True):
            continue
        worker.stop()  # joins the thread once it has written what was queued before
        events._ev_writer.flush()
        events._worker = _EventLoggerThread(events._event_queue, events._ev_writer, events._flush_secs)
        events._worker.start()
    writer.flush()
