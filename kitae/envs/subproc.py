"""``SubProcVecParallelEnv``: copies of a PettingZoo ``ParallelEnv`` in worker processes.

Each copy lives in its own process and talks to the parent through a pipe; the batching, the
autoreset (Gymnasium's ``SAME_STEP``: ``infos["final_obs"]``) and the checks are those of
``kitae.envs.parallel.VecParallelEnv``.

Processes. The workers are started with the ``"spawn"`` method by default (``"forkserver"`` is
allowed): a process that has started JAX's threads must not be forked. So a script that makes a
``SubProcVecParallelEnv`` must guard its entry point with ``if __name__ == "__main__":``, and the
environment makers must be importable or picklable with cloudpickle (a lambda is fine). No
worker outlives its parent or the vector environment:

* ``close()`` asks each worker to close its environment and exit, waits, then terminates (and
  kills) the ones still there; it also runs when the object is garbage collected and at
  interpreter exit (``weakref.finalize``);
* workers are daemonic and ignore SIGINT (the parent decides when to stop: kitae's runner stops
  cleanly on Ctrl-C and then closes the environment);
* a worker whose parent dies (even by SIGKILL) sees its pipe close and exits;
* a worker that dies or raises makes the parent raise a ``RuntimeError`` naming the worker, its
  pid and exit code (or its traceback), after shutting every other worker down.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import traceback
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from kitae.envs.parallel import ParallelEnvCopy, UnsupportedParallelEnv, VecParallelEnv

__all__ = ["SubProcVecParallelEnv", "START_METHODS"]

START_METHODS = ("spawn", "forkserver")
MAKING = "making its environment"  # what a worker does first, named in errors
"""Start methods allowed for the workers: never ``"fork"``, which copies a parent whose JAX threads
may hold locks."""


def _worker(index: int, conn: Connection, env_fn_bytes: bytes, clip_actions: bool) -> None:
    """A worker's loop: make the copy, then answer ``(command, data)`` messages until ``close``
    or until the parent's end of the pipe closes. Answers are ``("ok", result)`` or
    ``("error", (exception or None, traceback text))`` (the exception itself only for
    ``UnsupportedParallelEnv``, which the parent raises again); after an error the worker exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the parent decides
    copy = None
    try:
        import cloudpickle

        copy = ParallelEnvCopy(cloudpickle.loads(env_fn_bytes)(), index, clip_actions)
        conn.send(("ok", copy.describe()))
        while True:
            try:
                command, data = conn.recv()
            except (EOFError, OSError):  # the parent is gone: exit, no orphan
                break
            if command == "step":
                conn.send(("ok", copy.step(data)))
            elif command == "reset":
                conn.send(("ok", copy.reset(*data)))
            elif command == "close":
                closing, copy = copy, None
                closing.close()
                conn.send(("ok", None))
                break
            else:
                raise ValueError(f"unknown command {command!r}")
    except Exception as error:
        with contextlib.suppress(OSError, EOFError):
            conn.send(("error", (error if isinstance(error, UnsupportedParallelEnv) else None, traceback.format_exc())))
    finally:
        if copy is not None:
            with contextlib.suppress(Exception):
                copy.close()
        conn.close()


def _shutdown(conns: list[Connection], processes: list[Any], timeout: float) -> None:
    """Asks every live worker to close, waits up to ``timeout`` seconds, then terminates and
    kills what is left, and reaps every process. Never raises."""
    for conn, process in zip(conns, processes):
        if process.is_alive():
            with contextlib.suppress(OSError, EOFError, ValueError):
                conn.send(("close", None))
    for conn, process in zip(conns, processes):
        try:
            if conn.poll(timeout):  # the worker's answer to close (or an error)
                conn.recv()
        except (OSError, EOFError, ValueError):
            pass
        process.join(timeout)
        if process.is_alive():
            process.terminate()
            process.join(1.0)
        if process.is_alive():
            process.kill()
            process.join()
        with contextlib.suppress(OSError):
            conn.close()


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "exit code unknown (still running)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"exit code {exitcode} (killed by {name})"
    return f"exit code {exitcode}"


class SubProcVecParallelEnv(VecParallelEnv):
    """``N`` copies of a PettingZoo ``ParallelEnv``, one per worker process, stepped together.

    Observations, actions, rewards, terminations and truncations are dicts keyed by agent of
    arrays batched over the copies, ``(N, ...)``; the autoreset hands back the final observation
    of an ended episode in ``infos["final_obs"]`` (``kitae.envs.parallel``). Worth it when one
    environment step costs more than a message between processes (about 0.1 ms here).

    Args:
        env_fns: ``N >= 1`` callables, each making one copy of the same environment; sent to the
            workers with cloudpickle.
        start_method: ``"spawn"`` (default) or ``"forkserver"``.
        clip_actions: clip ``Box`` actions to the action space's bounds (in the workers).
        close_timeout: seconds ``close`` waits for each worker before terminating it.

    Attributes:
        processes: the worker processes (``multiprocessing.Process``), one per copy.

    Raises:
        ValueError: for bad arguments; as ``check_parallel_env`` for an environment kitae cannot
            train (heterogeneous agents...), or if the copies differ.
        RuntimeError: when a worker fails to make its environment, dies or raises (then, and after
            any error while making the copies, every worker is shut down).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        *,
        start_method: str = "spawn",
        clip_actions: bool = True,
        close_timeout: float = 5.0,
    ) -> None:
        import cloudpickle  # env_fns may be lambdas; cloudpickle sends them by value (Gymnasium does the same)

        env_fns = list(env_fns)
        if not env_fns or not all(callable(fn) for fn in env_fns):
            raise ValueError(
                f"env_fns={env_fns!r} is not allowed; allowed: a non-empty list of callables making a ParallelEnv"
            )
        if start_method not in START_METHODS:
            raise ValueError(f"start_method={start_method!r} is not allowed; allowed: {', '.join(START_METHODS)}")
        if not isinstance(close_timeout, (int, float)) or close_timeout < 0:
            raise ValueError(f"close_timeout={close_timeout!r} is not allowed; allowed: a number of seconds >= 0")
        context = multiprocessing.get_context(start_method)
        self.closed = True  # until the workers are up
        self._conns: list[Connection] = []
        self.processes: list[Any] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._conns, self.processes, float(close_timeout))
        try:
            for index, fn in enumerate(env_fns):
                parent_end, child_end = context.Pipe()
                # typeshed types get_context(str) as BaseContext, which lacks the Process every context has
                process = context.Process(  # type: ignore[attr-defined]
                    target=_worker,
                    args=(index, child_end, cloudpickle.dumps(fn), clip_actions),
                    name=f"kitae-parallel-env-{index}",
                    daemon=True,
                )
                process.start()
                child_end.close()  # only the worker holds its end: its death closes the pipe
                self._conns.append(parent_end)
                self.processes.append(process)
            descriptions = [self._receive(index, MAKING) for index in range(len(env_fns))]
            self._init_layout(len(env_fns), descriptions)
        except BaseException:
            self._finalizer()
            raise

    # -- messages -------------------------------------------------------------------------------

    def _fail(self, message: str) -> RuntimeError:
        """Shuts every worker down and returns the error to raise."""
        self.closed = True
        self._finalizer()
        return RuntimeError(message)

    def _dead(self, index: int, during: str) -> RuntimeError:
        process = self.processes[index]
        process.join(1.0)  # reap it, so its exit code is known
        hint = ""
        if during == MAKING and process.exitcode == 1:
            # The usual cause: a script that makes the environments at import time, unguarded. A
            # spawned worker imports the main module again before it runs, makes the environments
            # there, and multiprocessing refuses to start processes from a bootstrapping one: the
            # worker exits 1 before its pipe carries anything, so the reason is only on its stderr.
            hint = (
                "; if your script makes this environment at import time, guard its entry point with "
                "`if __name__ == \"__main__\":` (workers are started with 'spawn' and import the main module again)"
            )
        return self._fail(
            f"SubProcVecParallelEnv: worker {index} (pid {process.pid}) died while {during}, "
            f"{_describe_exit(process.exitcode)}; the other workers were shut down{hint}"
        )

    def _send(self, index: int, message: tuple, during: str) -> None:
        try:
            self._conns[index].send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            raise self._dead(index, during) from None

    def _receive(self, index: int, during: str) -> Any:
        try:
            status, payload = self._conns[index].recv()
        except (EOFError, ConnectionResetError, OSError):
            raise self._dead(index, during) from None
        if status != "ok":
            error, text = payload
            pid = self.processes[index].pid
            failure = self._fail(
                f"SubProcVecParallelEnv: worker {index} (pid {pid}) raised while {during}; the workers were shut "
                f"down. The worker's traceback:\n{text}"
            )
            if error is not None:  # an environment kitae cannot train: the same error as in one process
                raise UnsupportedParallelEnv(f"{error} (in worker {index}; the workers were shut down)")
            raise failure
        return payload

    # -- VecParallelEnv -------------------------------------------------------------------------

    def _reset_copies(self, seeds: list[int | None], options: dict | None) -> list[np.ndarray]:
        for index, seed in enumerate(seeds):
            self._send(index, ("reset", (seed, options)), "resetting")
        return [self._receive(index, "resetting") for index in range(self.num_envs)]

    def _step_copies(self, actions: list[list[Any]]) -> list[tuple]:
        for index, action in enumerate(actions):
            self._send(index, ("step", action), "stepping")
        return [self._receive(index, "stepping") for index in range(self.num_envs)]

    def _close_copies(self) -> None:
        self._finalizer()
