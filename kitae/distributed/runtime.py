"""The Ray runtime a distributed run uses: started by the run itself, or an existing cluster.

With no address, ``ray_runtime()`` starts a local Ray instance bound to 127.0.0.1, with Ray's
token authentication on and no dashboard, and shuts it down when the run ends (no Ray process
outlives it). With an address (``"HOST:PORT"`` of a head started by ``ray start --head``), it joins
that cluster and only disconnects at the end. When this process is already connected to Ray
(``ray.init`` called by the user, or a test sharing one runtime), it uses that connection and
leaves it open.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["ray_runtime", "import_ray"]


def _local_only_environment() -> None:
    """Environment of a runtime that serves this machine only.

    ``RAY_AUTH_MODE=token``: every RPC carries Ray's generated token. Ray resolves 127.0.0.1 to
    the machine's outward address unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is false, which
    makes a local instance take the loopback address: its servers then listen on 127.0.0.1 only.
    """
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


def import_ray() -> Any:
    """``import ray`` with a clear error when Ray is missing."""
    try:
        import ray
    except ImportError as error:  # pragma: no cover - ray is a dependency of kitae
        raise RuntimeError("distributed training needs Ray: pip install 'ray==2.60.0'") from error
    return ray


@contextmanager
def ray_runtime(address: str | None = None, *, num_cpus: int | None = None) -> Iterator[Any]:
    """A Ray runtime for the duration of a run; yields the ``ray`` module.

    Args:
        address: ``None`` to start a local runtime (127.0.0.1, token authentication, no
            dashboard), or the ``"HOST:PORT"`` of an existing cluster's head.
        num_cpus: CPUs the local runtime offers its actors (default: Ray's count). Workers
            reserve none, so the number of actors is not bound by the number of cores.
    """
    if address is None:
        _local_only_environment()
    ray = import_ray()
    if address is None:
        import ray._private.ray_constants as constants

        constants.ENABLE_RAY_CLUSTER = False  # read when Ray picks its address (see above)
    if ray.is_initialized():
        yield ray
        return
    kwargs: dict[str, Any] = {"log_to_driver": False, "configure_logging": False}
    if address is None:
        # Ray reads its RAY_* variables into its C++ config when it is first imported: a process
        # that imported Ray before _local_only_environment() (the user's own `import ray`) holds
        # the authentication mode it read then, and its driver would send no token to the runtime
        # it starts, which wants one (GCS "Authentication token is missing", after 20 s of
        # retries). Re-read them, as ray.init does when it turns token authentication on itself.
        from ray._raylet import Config  # type: ignore[attr-defined]  # Cython; no public name in Ray 2.60

        Config.initialize("")
        # "local": a new instance even when a cluster started with `ray start` runs on this machine
        # (with no address Ray would join that one, found through /tmp/ray/ray_current_cluster)
        ray.init(address="local", include_dashboard=False, num_cpus=num_cpus, **kwargs)
    else:
        ray.init(address=address, **kwargs)
    try:
        yield ray
    finally:
        ray.shutdown()
