"""What made a run: the software versions and the machine, as ``summary.json`` and every
checkpoint record them.

A seed and a config decide a run bit for bit only with the same software on the same kind of
machine: XLA compiles other code for another CPU, another jaxlib or other ``XLA_FLAGS``
(``docs/runs.md``, "Bits and thread settings"). ``summary.json`` therefore says what trained the
run, so that two ``state_fingerprint`` values are compared only where they should agree, and a
checkpoint says what wrote it, so that a run resumed elsewhere (a preempted cluster job restarted
on another kind of node) says that it goes on from the same state but not to the bits an
uninterrupted run would have reached (``ProvenanceWarning``).
"""

from __future__ import annotations

import functools
import os
import platform
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from kitae.devices import cpu_core_count, shard_count
from kitae.version import __version__

__all__ = [
    "PACKAGES",
    "SIMD_ORDER",
    "ProvenanceWarning",
    "versions",
    "machine",
    "cpu_name",
    "simd",
    "made_with",
    "differences",
]


class ProvenanceWarning(UserWarning):
    """A run resumes from a checkpoint written with other software or on another kind of machine:
    it goes on from the same state, but not to the bits of an uninterrupted run."""


PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "gymnasium")
"""The packages whose versions ``versions`` reports besides kitae and Python: those that decide
what a run computes."""


def versions() -> dict[str, str]:
    """``{"kitae", "python", "jax", "jaxlib", "flax", "optax", "numpy", "gymnasium"}`` -> version,
    read from the installed packages' metadata, not from imported modules; ``"not installed"`` for a
    package that is not."""

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {"kitae": __version__, "python": platform.python_version(), **{name: version(name) for name in PACKAGES}}


SIMD_ORDER = ("avx512f", "avx2", "avx", "sse4_2", "sve", "asimd")
"""Vector extensions, widest first, as ``/proc/cpuinfo`` names them (x86's ``flags``, ARM's
``Features``): ``simd`` reports the first one the CPU has."""


def _cpuinfo(cpuinfo: str | None) -> str:
    """``cpuinfo``, or else the text of ``/proc/cpuinfo`` on Linux, or else ``""``."""
    if cpuinfo is None and sys.platform.startswith("linux"):
        try:
            return Path("/proc/cpuinfo").read_text()
        except OSError:
            return ""
    return cpuinfo or ""


def _field(cpuinfo: str, *names: str) -> str:
    """The value of the first line of ``cpuinfo`` whose key is one of ``names`` (``""`` if none)."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in names and value.strip():
            return value.strip()
    return ""


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name: the first ``model name`` line of ``cpuinfo`` (default: the text of
    ``/proc/cpuinfo`` on Linux), else ``platform.processor()``, else ``platform.machine()``."""
    return _field(_cpuinfo(cpuinfo), "model name") or platform.processor() or platform.machine()


def simd(cpuinfo: str | None = None) -> str:
    """The widest vector extension of ``SIMD_ORDER`` that ``cpuinfo`` (default: ``/proc/cpuinfo``
    on Linux) lists, e.g. ``"avx2"``; ``""`` when it lists none or cannot be read. A virtual
    machine's model name can be as vague as "AMD EPYC", while XLA compiles for these extensions:
    two such machines can give other bits."""
    flags = set(_field(_cpuinfo(cpuinfo), "flags", "Features").split())
    return next((name for name in SIMD_ORDER if name in flags), "")


def machine() -> dict[str, Any]:
    """``{"platform", "cpu", "simd", "cores", "backend", "devices"}`` and, when set,
    ``"xla_flags"``: the operating system (``platform.platform()``), the CPU's model name and widest
    vector extension (``simd``), the cores this process may run on (an int: what speeds depend on),
    JAX's default backend (``cpu``, ``gpu``, ...) and its device count (the ``kitae`` command makes
    one CPU device per core: ``kitae.devices``; seeds trained together are sharded over them), and
    the ``XLA_FLAGS`` environment variable, which can change the compiled code."""
    import jax

    cpuinfo = _cpuinfo(None)
    flags = os.environ.get("XLA_FLAGS", "").strip()
    return {
        "platform": platform.platform(),
        "cpu": cpu_name(cpuinfo),
        "simd": simd(cpuinfo),
        "cores": cpu_core_count(),
        "backend": jax.default_backend(),
        "devices": jax.device_count(),
        **({"xla_flags": flags} if flags else {}),
    }


@functools.cache
def made_with() -> dict[str, dict[str, Any]]:
    """``{"versions": versions(), "machine": machine()}`` of this process (computed once: XLA reads
    ``XLA_FLAGS`` once too); what a checkpoint's metadata keeps as ``made_with``."""
    return {"versions": versions(), "machine": machine()}


BITS_DECIDED_BY = {"versions": (*PACKAGES, "kitae"), "machine": ("cpu", "simd", "backend", "xla_flags")}
"""The fields of ``made_with`` that can change a run's bits. Not Python's version (the same
fingerprints under 3.11, 3.12 and 3.13), the operating system's (``platform`` names the kernel's
version) nor the core or device counts as such: seeds trained together compare the devices they
are sharded over (``differences``' ``seeds``), and one seed runs on one device either way."""


def differences(recorded: Any, current: dict[str, dict[str, Any]] | None = None, *, seeds: int = 1) -> list[str]:
    """What differs between ``recorded`` (a checkpoint's ``made_with``) and ``current`` (default:
    this process's) among ``BITS_DECIDED_BY``, as ``"jaxlib 0.10.1 -> 0.10.2"`` strings; ``[]``
    when nothing does, or when ``recorded`` is not a ``made_with`` record (a checkpoint written
    before kitae recorded it). With ``seeds`` > 1 (a checkpoint of seeds trained together), also
    the number of devices they are sharded over (``kitae.devices.shard_count``): rows sharded over another count
    compute other bits. A sweep shards its combinations' rows together, so for a sweep this count
    is a guess from one combination's seeds: a change can go unreported there."""
    if not isinstance(recorded, dict):
        return []
    current = made_with() if current is None else current
    found = []
    before_machine, now_machine = recorded.get("machine"), current.get("machine", {})
    if seeds > 1 and isinstance(before_machine, dict) and "devices" in before_machine:
        old_count = shard_count(before_machine["devices"], seeds)
        new_count = shard_count(now_machine.get("devices", 1), seeds)
        if old_count != new_count:
            found.append(f"{seeds} seeds sharded over {old_count} -> {new_count} devices")
    for part, fields in BITS_DECIDED_BY.items():
        before, now = recorded.get(part), current.get(part, {})
        if not isinstance(before, dict):
            continue
        for field in fields:
            old, new = before.get(field, ""), now.get(field, "")
            if old != new:
                found.append(f"{field} {old or '(none)'} -> {new or '(none)'}")
    return found
