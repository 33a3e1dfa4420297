"""Host-loop work N at a time in Ray tasks: the window ``kitae sweep --workers`` and ``kitae tune
--workers`` share (``in_ray_tasks``).

Each task runs in a fresh Ray worker process (``max_calls=1``: no JAX state or memory carried from
one task to the next, as each ``kitae train`` is a process of its own), ``num_cpus=0`` (the window,
not Ray's CPU count, decides how many run at once) and ``SPREAD`` (on different nodes of a cluster
where it can). Ctrl-C (``stop``) cancels the running tasks: Ray interrupts each one, which stops
as ``kitae train`` does on Ctrl-C.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kitae.distributed.runtime import check_local_room, check_reachable, ray_runtime
from kitae.runs.errors import RunError

__all__ = ["check_workers", "in_ray_tasks"]


def check_workers(workers: Any, address: str | None, compiled: bool, env_id: str, what: str, instead: str) -> None:
    """Refuses ``--workers N`` / ``--address`` where they do not apply, with one ``RunError``:
    ``workers`` not an int >= 1, a JAX environment (``compiled``: ``what`` trains ``instead``
    already), an address without workers, an address where no Ray head answers
    (``kitae.distributed.runtime.check_reachable``)."""
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise RunError(f"--workers {workers!r} is not allowed; allowed: an int >= 1")
        if compiled:
            raise RunError(
                f"--workers trains host-loop {what} in parallel on Ray; {env_id} is a JAX environment, "
                f"{instead}: drop --workers"
            )
        try:  # each task at once is a worker process of its own
            check_local_room(workers, address, f"--workers {workers}")
        except ValueError as error:
            raise RunError(str(error)) from None
        check_reachable(address)  # before the sweep's or the study's directory is written (exit 1, as train's)
    elif address is not None:
        raise RunError("--address is for --workers: give --workers N too")


def in_ray_tasks(
    function: Callable[..., Any],
    next_task: Callable[[int], tuple[Any, tuple] | None],
    on_result: Callable[[Any, Any], None],
    workers: int,
    address: str | None,
    stop: Callable[[], bool],
    name: Callable[[Any], str],
) -> None:
    """Runs ``function(*args)`` in Ray tasks, at most ``workers`` at a time, on a runtime started on
    127.0.0.1 (or the cluster at ``address``), until ``next_task`` has no more and every task has
    ended, or ``stop()`` is true and the running tasks are cancelled.

    Args:
        function: what each task runs (importable by the workers).
        next_task: ``next_task(n_running)``: ``(tag, args)`` of the next task, or ``None`` when there
            is none to start now. Called while fewer than ``workers`` run.
        on_result: ``on_result(tag, value)`` for each task that returned (cancelled ones are not).
        workers: how many run at once.
        address: ``HOST:PORT`` of an existing cluster, or ``None``.
        stop: true once the work should stop (Ctrl-C).
        name: a tag's name for errors (``"learning_rate=0.001"``, ``"trial 3"``).

    Raises:
        The task's own exception, as it was raised; ``RunError`` when a task's worker died.
    """
    with ray_runtime(address) as ray:
        task = ray.remote(num_cpus=0, scheduling_strategy="SPREAD", max_retries=0, max_calls=1)(function)
        running: dict[Any, Any] = {}
        cancelled = False
        while True:
            while len(running) < workers and not stop() and (nxt := next_task(len(running))) is not None:
                tag, args = nxt
                running[task.remote(*args)] = tag
            if stop() and not cancelled:
                cancelled = True
                for ref in running:  # an interrupt in each task: it stops as on Ctrl-C
                    ray.cancel(ref)
            if not running:
                return
            done, _ = ray.wait(list(running), num_returns=1, timeout=0.5)
            for ref in done:
                tag = running.pop(ref)
                try:
                    value = ray.get(ref)
                except ray.exceptions.TaskCancelledError:
                    continue
                except ray.exceptions.RayTaskError as error:  # the task's own error, as it was raised
                    raise error.as_instanceof_cause() from None
                except ray.exceptions.RayError as error:  # its worker died (memory, a lost node)
                    raise RunError(f"{name(tag)}: its Ray task failed: {error}") from None
                on_result(tag, value)
