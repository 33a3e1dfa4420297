"""One XLA device per CPU core, so several seeds (or a sweep's rows) train on every core.

XLA:CPU runs one program on one device, and a small reinforcement-learning program (a 64 x 64
network, a few environments) keeps about one core busy whatever the batch. With the CPU split
into one device per core, the compiled loop shards its seed axis across them
(``kitae.loops.compiled.CompiledExecutor``: seeds, sweep rows and tuning trials): 16 PPO seeds
on gymnax CartPole train about 1.7x faster on 2 cores (BENCHMARKS.md).

The ``kitae`` command line calls ``use_cpu_cores()`` when its process starts; from Python, call it
right after ``import kitae``, before any JAX computation (JAX fixes the device count when its CPU
backend starts). A single-seed run uses one device either way. Several seeds sharded over ``n``
devices compute the bits of the same seeds on ``n`` devices: the per-device batch is part of the
program XLA compiles, so their bits can differ from an unsharded run's in the last place (a
resumed run shards as the run it continues, on the same machine).
"""

from __future__ import annotations

import os

import jax

__all__ = ["use_cpu_cores", "cpu_core_count", "shard_count", "available_memory"]


def cpu_core_count() -> int:
    """The CPU cores this process may run on (``os.sched_getaffinity`` where the platform has it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def available_memory(device: jax.Device | None = None) -> int | None:
    """Bytes that arrays on ``device`` (default: JAX's first device) can still take, or ``None``
    where this cannot be told.

    An accelerator's from its allocator (``memory_stats()``: ``bytes_limit - bytes_in_use``); the
    CPU's from the operating system (``MemAvailable`` in Linux's ``/proc/meminfo``: free memory
    plus the caches it can drop), which XLA:CPU allocates from. Other processes change it at any
    time: a check against it tells what surely cannot fit, not what surely can.
    """
    device = jax.devices()[0] if device is None else device
    if device.platform != "cpu":
        stats = device.memory_stats() or {}
        if "bytes_limit" in stats:
            return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))
        return None
    try:
        with open("/proc/meminfo") as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:  # not Linux
        pass
    return None


def shard_count(devices: int, rows: int) -> int:
    """Over how many of ``devices`` the compiled loop shards ``rows`` rows trained together (seeds,
    a sweep's combinations x seeds): all of them when there are several and they divide ``rows``,
    else 1 (no sharding). ``kitae.loops.compiled`` decides by it, and a resumed run compares it
    with its checkpoint's (``kitae.runs.provenance.differences``)."""
    if not isinstance(devices, int) or devices < 2 or rows < 2:
        return 1
    return devices if rows % devices == 0 else 1


def use_cpu_cores(count: int | None = None) -> int:
    """Splits the CPU into ``count`` XLA devices (``jax_num_cpu_devices``); returns the count in use.

    Args:
        count: the number of devices; default ``$KITAE_CPU_DEVICES``, else the number of cores.

    Leaves JAX alone (and returns its current CPU device count) when its backend has already
    started, or when ``XLA_FLAGS`` or ``jax_num_cpu_devices`` already choose a count.

    Raises:
        ValueError: for a count below 1 (``KITAE_CPU_DEVICES`` included).
    """
    name = "count"
    if count is None:
        raw = os.environ.get("KITAE_CPU_DEVICES")
        try:
            count = int(raw) if raw else cpu_core_count()
        except ValueError:
            raise ValueError(f"KITAE_CPU_DEVICES={raw!r} is not allowed; allowed: an int >= 1") from None
        name = "KITAE_CPU_DEVICES" if raw else name
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"{name}={count!r} is not allowed; allowed: an int >= 1")
    chosen = "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    if chosen or getattr(jax.config, "jax_num_cpu_devices", -1) != -1:
        return _current_count()
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # the backend has started: its device count is fixed
        return _current_count()
    return count


def _current_count() -> int:
    return len(jax.devices("cpu"))
