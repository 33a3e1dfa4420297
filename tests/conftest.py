"""Every test runs in its own temporary working directory, so runs/ never lands in the repository."""

import os
import shutil
import tempfile

import pytest

# The suite compiles with three XLA:CPU flags, set before JAX starts so that every process the
# tests start (xdist workers, `kitae` commands, Ray workers) inherits them. The tests check what
# kitae's code computes: values against hand-computed ones, the same bits for two runs, or for two
# programs of the same maths (a run in segments and in one program, the host and compiled loops,
# the functional API and the agents, a Ray worker and the compiled loop), compiled alike; not
# XLA's code generation. Their programs are short runs compiled once or twice, so compiling is most
# of their time:
# - backend optimisation level 0 (LLVM without its optimisation passes): 90 s where the default
#   took 154 s on four test modules (README, "Development");
# - XLA's older fusion emitters, which compile in about half the time of the default ones (PPO's
#   training program on gymnax CartPole: 3.1 s of backend compile against 6.3 s);
# - no instruction newer than AVX. With the older emitters alone, two programs of the same maths
#   gave other bits (8 tests failed); capped at AVX, the same bits again (a run in segments against
#   one program: other bits with AVX2 or AVX-512 allowed, the same with AVX; which of the newer
#   instructions, FMA among them, made the difference was not pinned down). The AVX2 and AVX-512
#   machines CI runs on both get AVX code.
# The three together: the whole suite used 29.9 min of CPU against 39.5 with level 0 alone (20:12
# against 25:32, 2026-11-28, one after the other). Tests about compile options set theirs explicitly
# (tests/test_cold_start.py). A flag that a user's own XLA_FLAGS set is left as they set it.
for _name, _value in {
    "xla_backend_optimization_level": "0",
    "xla_cpu_use_fusion_emitters": "false",
    "xla_cpu_max_isa": "AVX",
}.items():
    if _name not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --{_name}={_value}".strip()

import jax  # noqa: E402  (after XLA_FLAGS)

# The tests compare two computations of the same maths at float32 tolerances (a scanned core
# against the core stepped one step at a time, an update against its two halves). On NVIDIA GPUs
# JAX's default rounds float32 matrix products through TF32 (10 bits of mantissa): relative
# differences of about 2e-4, which failed four of those tests on an H200 (BENCHMARKS.md, "On a
# GPU"). Full float32 products make the suite mean the same on any backend; on the CPU, XLA already
# computes them in float32, so nothing changes there (the same bits, checked on PPO and recurrent
# PPO runs).
jax.config.update("jax_default_matmul_precision", "highest")

# Compiled programs are cached on disk for the session only (never in the user's cache, even one
# set with KITAE_CACHE_DIR). The process that makes the folder (pytest itself, or xdist's
# controller) removes it at the end; the xdist workers inherit its KITAE_CACHE_DIR, so a program
# one worker compiled the other loads.
_OWN_CACHE = "PYTEST_XDIST_WORKER" not in os.environ
if _OWN_CACHE:
    os.environ["KITAE_CACHE_DIR"] = tempfile.mkdtemp(prefix="kitae-test-cache-")
    # Thrown away at the end: unbounded (JAX's default), which spares each of the suite's
    # thousands of writes the bound's scan of the whole folder (tests/test_compilation_cache.py
    # tests the bound).
    os.environ.setdefault("KITAE_CACHE_MAX_BYTES", "-1")

from kitae.compilation_cache import enable_compilation_cache  # noqa: E402  (after KITAE_CACHE_DIR)

# On for every test from the start, not only once a loop has run: the tests rebuild the same
# agents many times, and a rebuilt agent's programs load from the cache instead of compiling again
# (the whole suite 16:01 against 16:52 in one back-to-back pair of full runs).
enable_compilation_cache()


def pytest_unconfigure(config):
    if _OWN_CACHE and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["KITAE_CACHE_DIR"], ignore_errors=True)


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield


@pytest.fixture
def restored_registries():
    """The algorithm and params-class registries (process-wide dicts) as they were before the test,
    restored in place after it: a class a test registers is otherwise still there for the next test
    of its pytest-xdist worker (a second ``__main__:ScriptParams`` made the ``__main__`` fallback of
    ``kitae.config.algo_params_class`` find two)."""
    import kitae.config
    from kitae.algos.collections import ALGORITHMS

    registries = (ALGORITHMS, kitae.config._ALGO_PARAMS_REGISTRY)
    saved = [dict(registry) for registry in registries]
    yield
    for registry, before in zip(registries, saved, strict=True):
        registry.clear()
        registry.update(before)
