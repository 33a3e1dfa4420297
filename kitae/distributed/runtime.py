"""The Ray runtime a distributed run uses: started by the run itself, or an existing cluster.

With no address, ``ray_runtime()`` starts a local Ray instance bound to 127.0.0.1, with Ray's
token authentication on and no dashboard, and shuts it down when the run ends: no Ray process
outlives it, and the process's Ray settings are as they were. With an address (``"HOST:PORT"``
of a head started by ``ray start --head``), it joins that cluster and only disconnects at the end.
When this process is already connected to Ray (``ray.init`` called by the user, or a test sharing
one runtime), it uses that connection and leaves it open. A local runtime's workers import from
the directories this process added to ``sys.path`` too (``driver_import_paths``) and know the
Gymnasium ids it registered (``register_driver_envs``); a cluster's nodes import and register what is
installed on them.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["ray_runtime", "import_ray", "check_reachable", "check_local_room", "CONNECT_TIMEOUT", "WORKER_MEMORY_GB"]

# Seconds to wait for a cluster's head to accept a connection before the run is refused. Ray's own
# ray.init(address=...) waits minutes on an address where nothing listens, printing its GCS
# client's retries.
CONNECT_TIMEOUT = 10.0


def check_reachable(address: str | None, timeout: float | None = None) -> None:
    """Refuses, before Ray is started or anything is written, a cluster address where no Ray head
    answers within ``timeout`` seconds (``None``, a local runtime, passes): nothing accepts a TCP
    connection there, or what does is not a gRPC server (a Ray head's GCS and its client server
    both are), e.g. the dashboard's HTTP port 8265 typed for the head's 6379. ``timeout`` defaults
    to ``CONNECT_TIMEOUT``.

    Raises:
        ConnectionError: naming the address, the reason and what is allowed.
    """
    if address is None:
        return
    timeout = CONNECT_TIMEOUT if timeout is None else timeout
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not port.isdigit():  # not HOST:PORT: Ray's own check says what it wants
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as error:
        reason = "no answer" if isinstance(error, TimeoutError) else (error.strerror or type(error).__name__)
        raise _unreachable(address, f"{reason}, {timeout:g} s") from None
    # Something listens. Ray's ray.init on a port that is not a head's waits without end (seen
    # 10 minutes on an HTTP server), so the gRPC handshake is checked first, with the grpcio that
    # Ray talks to its head with. A cluster with TLS (RAY_USE_TLS) needs its certificates for
    # that: Ray's own connection decides there.
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return
    import grpc  # Ray's dependency; imported here, where Ray is about to be

    channel = grpc.insecure_channel(f"{host}:{port}")
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        reason = f"a server answers but no gRPC handshake in {timeout:g} s: not a Ray head"
        raise _unreachable(address, reason) from None
    finally:
        channel.close()


def _unreachable(address: str, reason: str) -> ConnectionError:
    return ConnectionError(
        f"distributed.address={address!r}: no Ray cluster answers there ({reason}); allowed: the HOST:PORT of a "
        "running cluster's head (`ray start --head` prints it), or no address to start a local runtime"
    )


# The least memory one Ray worker process of a kitae run holds: JAX, the agent's programs and its
# environments. Measured 2026-12-01 on PPO's CartPole-v1 collection workers (420-430 MB resident
# each once training) and its gradient worker (about 550 MB); Atari or MuJoCo workers hold more.
WORKER_MEMORY_GB = 0.4


def _available_memory_gb() -> float | None:
    """The memory the kernel says new processes can take (``MemAvailable``), or ``None`` where
    there is no ``/proc/meminfo`` (macOS): the check is then skipped."""
    try:
        with open("/proc/meminfo") as file:
            for line in file:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20  # kB -> GiB
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_local_room(workers: int, address: str | None, flag: str, *, name: str = "--workers", extra: int = 0) -> None:
    """Refuses, before Ray starts, more worker processes than this machine's memory holds when
    the run starts its own local runtime: every worker is a process of at least
    ``WORKER_MEMORY_GB`` (Ray starts them all at once; ``--workers 100000`` grew for minutes until
    the machine ran out of memory). A cluster (``address``) is not checked: its nodes' memory is
    not this machine's.

    Args:
        workers: the worker processes the user asked for (collection workers, or the tasks a sweep
            or search runs at a time).
        address: the cluster's ``HOST:PORT``, or ``None`` for a local runtime.
        flag: what the user set, as the error names it (``"--workers 100000"``).
        name: the setting, as the error's "allowed" names it (``"--workers"``).
        extra: worker processes the run starts besides them (a distributed run's gradient workers).

    Raises:
        ValueError: naming the flag, the memory and the most workers it holds.
    """
    if address is not None:
        return
    available = _available_memory_gb()
    if available is None:
        return
    room = int(available / WORKER_MEMORY_GB + 1e-9)  # 2.0 // 0.4 is 4.0 in floats
    if workers + extra > room:
        besides = f" besides {extra} gradient worker{'s' * (extra > 1)}" if extra else ""
        raise ValueError(
            f"{flag} is not allowed on this machine: each Ray worker is a process of at least {WORKER_MEMORY_GB:g} GB "
            f"and {available:.1f} GB is available, room for {room:,}; allowed: {name} at most {max(room - extra, 0):,}"
            f"{besides}, or --address HOST:PORT of a Ray cluster"
        )


_LOCAL_ONLY = {"RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@contextmanager
def _local_only_settings() -> Iterator[None]:
    """Ray's settings for a runtime that serves this machine only, for the ``with`` block; the
    process's own are restored after it (its environment variables and Ray's constant), so that a
    later ``ray.init`` or ``ray start`` of the user's is not bound to them.

    ``RAY_AUTH_MODE=token`` (unless the user chose a mode): every RPC carries Ray's generated
    token. Ray resolves 127.0.0.1 to the machine's outward address unless
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is false (the environment variable, read by the processes
    the runtime starts, and its constant in this process, read when Ray picks its address), which
    makes a local instance take the loopback address: its servers then listen on 127.0.0.1 only.
    """
    import ray._private.ray_constants as constants
    from ray._raylet import Config  # type: ignore[attr-defined]  # Cython; no public name in Ray 2.60

    saved = {name: os.environ.get(name) for name in _LOCAL_ONLY}
    saved_constant = constants.ENABLE_RAY_CLUSTER
    os.environ.setdefault("RAY_AUTH_MODE", _LOCAL_ONLY["RAY_AUTH_MODE"])
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = _LOCAL_ONLY["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]
    constants.ENABLE_RAY_CLUSTER = False
    # Ray reads its RAY_* variables into its C++ config when it is first imported: a process that
    # imported Ray before this point (the user's own `import ray`) holds the authentication mode
    # it read then, and its driver would send no token to the runtime it starts, which wants one
    # (GCS "Authentication token is missing", after 20 s of retries). Re-read them, as ray.init
    # does when it turns token authentication on itself; and again once they are restored.
    Config.initialize("")
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        constants.ENABLE_RAY_CLUSTER = saved_constant
        Config.initialize("")


def import_ray() -> Any:
    """``import ray`` with a clear error when Ray is missing."""
    try:
        import ray
    except ImportError as error:  # pragma: no cover - ray is a dependency of kitae
        raise RuntimeError("distributed training needs Ray: pip install 'ray==2.60.0'") from error
    return ray


def driver_import_paths() -> list[str]:
    """The directories on this process's ``sys.path`` that a worker of a local runtime would not
    have: those the process added itself (``sys.path.insert`` in a script, ``sys.path.append``
    in a notebook), outside Python's installation and its environment's ``site-packages``.

    Ray's workers start with the driver's script directory and working directory only, so an
    agent class imported from anywhere else was a ``ModuleNotFoundError`` in every worker.
    """
    system = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths: list[str] = []
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        real = os.path.realpath(entry)
        if any(real == root or real.startswith(root + os.sep) for root in system) or real in paths:
            continue
        paths.append(real)
    return paths


def gymnasium_registrations() -> list[tuple[str, bytes]]:
    """This process's Gymnasium registry as ``(id, pickled EnvSpec)`` pairs, without Gymnasium's and
    kitae's own (a worker registers them when it imports them) and the entries that cannot be
    pickled: what a local runtime's workers register where they lack the id
    (``register_driver_envs``), so an environment the driver registered itself (``gym.register`` in
    a script or notebook) is made in the workers as in the host loop."""
    import cloudpickle
    import gymnasium as gym

    pairs = []
    for env_id, spec in gym.registry.items():
        entry = spec.entry_point
        module = entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "")
        if str(module).split(".")[0] in ("gymnasium", "kitae"):  # registered again where they are imported
            continue
        try:
            pairs.append((env_id, cloudpickle.dumps(spec)))
        except Exception:  # an entry point that cannot travel: the worker's own registry decides
            continue
    return pairs


def _worker_runtime_env() -> dict[str, Any]:
    """A local runtime's job-wide ``runtime_env``: ``PYTHONPATH`` with ``driver_import_paths``
    (before any ``PYTHONPATH`` the process was given, which workers inherit too) and a setup hook
    that registers the driver's Gymnasium ids (``register_driver_envs``)."""
    paths = driver_import_paths() + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    registrations = gymnasium_registrations()

    def register_driver_envs() -> None:
        """Run in each worker as it starts: registers the driver's Gymnasium ids it lacks (an
        entry that cannot be read there is skipped: making that id fails as it would have).
        Self-contained, a named function (Ray exports its setup hook by name), so that starting
        a worker imports neither kitae nor JAX."""
        import pickle

        import gymnasium as gym

        for env_id, blob in registrations:
            if env_id not in gym.registry:
                try:
                    gym.registry[env_id] = pickle.loads(blob)
                except Exception:
                    continue

    runtime_env: dict[str, Any] = {"worker_process_setup_hook": register_driver_envs}
    if paths:
        runtime_env["env_vars"] = {"PYTHONPATH": os.pathsep.join(paths)}
    return runtime_env


@contextmanager
def _no_jax_fork_warning() -> Iterator[None]:
    """Silences JAX's "os.fork() was called ... will likely lead to a deadlock" while Ray starts.

    Ray starts its processes (GCS, raylet, ...) with ``subprocess`` and a ``preexec_fn``, which
    runs the interpreter's fork hooks, JAX's among them. The child only sets its signals and
    execs a new program: none of JAX's threads or locks is used in it, so there is no deadlock to
    warn of (a run that resumes, with JAX already running, printed the warning).
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        yield


@contextmanager
def _keeping_signal_handlers() -> Iterator[None]:
    """Puts back this process's SIGINT and SIGTERM handlers after the block: ``ray.init`` installs
    its own SIGTERM handler (``sys.exit(signum)`` from wherever the main thread is), which
    replaced the run's (``kitae.runs.signals.stop_on_signals``: stop after the current step with
    a checkpoint, exit 143), so a SIGTERM killed a distributed run without its checkpoint."""
    if threading.current_thread() is not threading.main_thread():  # handlers live in the main thread
        yield
        return
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in handlers.items():
            if handler is not None:  # None: set outside Python, nothing to put back
                signal.signal(sig, handler)


@contextmanager
def ray_runtime(address: str | None = None, *, num_cpus: int | None = None) -> Iterator[Any]:
    """A Ray runtime for the duration of a run; yields the ``ray`` module.

    Args:
        address: ``None`` to start a local runtime (127.0.0.1, token authentication, no
            dashboard), or the ``"HOST:PORT"`` of an existing cluster's head (refused at once
            where nothing answers: ``check_reachable``).
        num_cpus: CPUs the local runtime offers its actors (default: Ray's count). Workers
            reserve none, so the number of actors is not bound by the number of cores.
    """
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    if address is not None:
        check_reachable(address)
        with _no_jax_fork_warning(), _keeping_signal_handlers():
            ray.init(address=address, **kwargs)
        try:
            yield ray
        finally:
            ray.shutdown()
        return
    with _local_only_settings():
        # "local": a new instance even when a cluster started with `ray start` runs on this machine
        # (with no address Ray would join that one, found through /tmp/ray/ray_current_cluster)
        with _no_jax_fork_warning(), _keeping_signal_handlers():
            ray.init(
                address="local", include_dashboard=False, num_cpus=num_cpus, runtime_env=_worker_runtime_env(), **kwargs
            )
        try:
            yield ray
        finally:
            ray.shutdown()
