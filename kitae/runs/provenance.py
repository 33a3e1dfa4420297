"""What made a run: the software versions and the machine, as ``summary.json`` records them.

A seed and a config decide a run bit for bit only with the same software on the same kind of
machine: XLA compiles other code for another CPU, another jaxlib or other ``XLA_FLAGS``
(``docs/runs.md``, "Bits and thread settings"). ``summary.json`` therefore says what trained the
run, so that two ``state_fingerprint`` values are compared only where they should agree.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

from kitae.version import __version__

__all__ = ["PACKAGES", "SIMD_ORDER", "versions", "machine", "cpu_name", "simd"]

PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "gymnasium")
"""The packages whose versions ``versions`` reports besides kitae and Python: those that decide
what a run computes."""


def versions() -> dict[str, str]:
    """``{"kitae", "python", "jax", "jaxlib", "flax", "optax", "numpy", "gymnasium"}`` -> version,
    read from the installed packages' metadata (nothing is imported); ``"not installed"`` for a
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


def machine() -> dict[str, str]:
    """``{"platform", "cpu", "simd", "backend"}`` and, when set, ``"xla_flags"``: the operating
    system (``platform.platform()``), the CPU's model name and widest vector extension (``simd``),
    JAX's default backend (``cpu``, ``gpu``, ...) and the ``XLA_FLAGS`` environment variable,
    which can change the compiled code."""
    import jax

    cpuinfo = _cpuinfo(None)
    flags = os.environ.get("XLA_FLAGS", "").strip()
    return {
        "platform": platform.platform(),
        "cpu": cpu_name(cpuinfo),
        "simd": simd(cpuinfo),
        "backend": jax.default_backend(),
        **({"xla_flags": flags} if flags else {}),
    }
