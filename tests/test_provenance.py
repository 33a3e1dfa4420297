"""What made a run (``kitae.runs.provenance``): the versions and the machine in ``summary.json``."""

from __future__ import annotations

import platform

import flax
import gymnasium
import jax
import numpy as np
import optax

import kitae
from kitae.runs.provenance import PACKAGES, cpu_name, machine, simd, versions

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu vme avx2

processor\t: 1
model name\t: AMD EPYC 9R14 96-Core Processor
"""


def test_versions_are_the_installed_ones():
    found = versions()
    assert list(found) == ["kitae", "python", *PACKAGES]
    assert found["kitae"] == kitae.__version__ and found["python"] == platform.python_version()
    assert found["jax"] == jax.__version__ and found["numpy"] == np.__version__
    assert found["flax"] == flax.__version__ and found["optax"] == optax.__version__
    assert found["gymnasium"] == gymnasium.__version__


def test_the_cpu_is_named_from_cpuinfo_or_the_platform():
    assert cpu_name(CPUINFO) == "AMD EPYC 9R14 96-Core Processor"
    # no model name (some ARM kernels): what the platform module knows
    assert cpu_name("processor\t: 0\nBogoMIPS\t: 50.00\n") == (platform.processor() or platform.machine())
    assert cpu_name()  # this machine's, whatever it is


def test_the_widest_vector_extension_is_named():
    assert simd(CPUINFO) == "avx2"
    assert simd("flags\t\t: fpu sse4_2 avx avx2 avx512f avx512bw\n") == "avx512f"
    assert simd("Features\t: fp asimd evtstrm aes\n") == "asimd"  # ARM
    assert simd("processor\t: 0\n") == ""


def test_the_machine_records_xla_flags_only_when_set(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", " --xla_cpu_max_isa=AVX ")
    found = machine()
    assert found["backend"] == jax.default_backend() and found["platform"] == platform.platform()
    assert found["cpu"] == cpu_name() and found["simd"] == simd()
    assert found["xla_flags"] == "--xla_cpu_max_isa=AVX"
    monkeypatch.delenv("XLA_FLAGS")
    assert "xla_flags" not in machine()


def test_the_version_is_written_once():
    """``pyproject.toml`` reads kitae's version from ``kitae/version.py``: the installed package's
    metadata and ``kitae.__version__`` agree."""
    from importlib import metadata

    assert metadata.version("kitae") == kitae.__version__ == versions()["kitae"]
