"""kitae's persistent compilation cache: bounded, least recently used entries evicted first, and
read and written under JAX's file lock (``kitae.compilation_cache``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kitae.compilation_cache import DEFAULT_MAX_BYTES, cache_max_bytes

# Twelve distinct programs, compiled one after the other into a cache bounded to 60 kB (each of
# these programs takes a few kB); prints what the cache folder holds and JAX's setting.
_FILL = """
import json, os, pathlib, sys
import jax, jax.numpy as jnp
from kitae.compilation_cache import enable_compilation_cache
path = enable_compilation_cache(sys.argv[1])
first = int(sys.argv[2]) if len(sys.argv) > 2 else 1
for n in range(first, first + 12):
    jax.jit(lambda x: jnp.tanh(x @ x.T) + n)(jnp.ones((n, 3))).block_until_ready()
entries = sorted(path.glob("*-cache"))
print(json.dumps({
    "max_size": jax.config.jax_compilation_cache_max_size,
    "entries": len(entries),
    "bytes": sum(p.stat().st_size for p in entries),
    "lock": (path / ".lockfile").exists(),
    "atimes": len(list(path.glob("*-atime"))),
}))
"""


def _fill(tmp_path, first: int = 1, **env: str) -> dict:
    environ = {
        k: v for k, v in os.environ.items() if k not in ("KITAE_CACHE_MAX_BYTES", "JAX_COMPILATION_CACHE_MAX_SIZE")
    }
    done = subprocess.run(
        [sys.executable, "-c", _FILL, str(tmp_path / "cache"), str(first)],
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "compilation cache" not in done.stderr, done.stderr[-3000:]  # JAX's errors reading or writing it
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_cache_keeps_to_its_bound_evicting_the_oldest_entries(tmp_path):
    bounded = _fill(tmp_path / "a", KITAE_CACHE_MAX_BYTES="60000")
    assert bounded["max_size"] == 60000 and bounded["lock"]  # bounded: JAX locks each read and write
    assert 0 < bounded["bytes"] <= 60000
    unbounded = _fill(tmp_path / "b", KITAE_CACHE_MAX_BYTES="-1")
    assert unbounded["max_size"] == -1 and not unbounded["lock"]
    assert unbounded["bytes"] > 60000 and unbounded["entries"] > bounded["entries"]  # the bound evicted some


def test_a_bounded_run_caches_in_a_folder_an_unbounded_one_filled(tmp_path):
    """An unbounded cache (kitae before its bound, ``KITAE_CACHE_MAX_BYTES=-1``) writes no access
    times; JAX's bounded cache reads one per entry before each write, and without them cached
    nothing ("Error writing persistent compilation cache entry ... -atime" at every compile)."""
    unbounded = _fill(tmp_path, KITAE_CACHE_MAX_BYTES="-1")
    assert unbounded["entries"] >= 12 and unbounded["atimes"] == 0
    bounded = _fill(tmp_path, first=13, KITAE_CACHE_MAX_BYTES=str(10**8))  # twelve new programs
    assert bounded["entries"] >= unbounded["entries"] + 12 and bounded["atimes"] == bounded["entries"]


def test_the_default_bound_and_the_users_own_jax_setting(monkeypatch):
    monkeypatch.delenv("KITAE_CACHE_MAX_BYTES", raising=False)  # the suite's own cache is unbounded (conftest)
    assert cache_max_bytes() == DEFAULT_MAX_BYTES == 4 * 1024**3
    done = subprocess.run(
        [sys.executable, "-c", "import jax, sys; from kitae.compilation_cache import enable_compilation_cache; "
         "enable_compilation_cache(sys.argv[1]); print(jax.config.jax_compilation_cache_max_size)", "unused-cache"],
        env={**os.environ, "JAX_COMPILATION_CACHE_MAX_SIZE": "12345"},
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "12345"  # JAX's own variable wins


@pytest.mark.parametrize("value", ["0", "-2", "lots", "1.5"])
def test_a_bad_bound_is_refused(monkeypatch, value):
    monkeypatch.setenv("KITAE_CACHE_MAX_BYTES", value)
    with pytest.raises(ValueError, match=f"KITAE_CACHE_MAX_BYTES='{value}' is not allowed; allowed: an int >= 1"):
        cache_max_bytes()


def test_a_good_bound_is_read(monkeypatch):
    monkeypatch.setenv("KITAE_CACHE_MAX_BYTES", "1000000")
    assert cache_max_bytes() == 1_000_000
    monkeypatch.setenv("KITAE_CACHE_MAX_BYTES", "-1")
    assert cache_max_bytes() == -1


def _eval_in_a_process(cache, *command: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if k not in ("KITAE_CACHE_DIR", "KITAE_NO_COMPILATION_CACHE")}
    done = subprocess.run(
        [sys.executable, *command],
        env={**environ, "KITAE_CACHE_DIR": str(cache), **env},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_kitae_eval_and_eval_run_compile_into_the_cache_and_load_from_it(tmp_path):
    """``kitae eval`` (and ``eval_run`` from Python) use the cache as the loops do: the first
    evaluation of a run writes its programs (none was written before: a compiled run's evaluation
    compiled again in every command), a second finds every one there and writes nothing, and
    ``KITAE_NO_COMPILATION_CACHE=1`` leaves the folder unmade."""
    from kitae.cli import main

    run_dir = tmp_path / "run"
    assert main(["train", "ppo", "gymnax:CartPole-v1", "--steps", "512", "--run-dir", str(run_dir), "--quiet"]) == 0
    cache = tmp_path / "cache"
    command = ("-m", "kitae.cli", "eval", str(run_dir), "--episodes", "3")
    first = _eval_in_a_process(cache, *command)
    entries = sorted(p.name for p in cache.glob("*-cache"))
    assert entries  # the agent's programs and the evaluation's
    assert _eval_in_a_process(cache, *command) == first
    assert sorted(p.name for p in cache.glob("*-cache")) == entries  # every program loaded, none compiled
    script = f"from kitae.runs import eval_run; print(eval_run({str(run_dir)!r}, episodes=3)['returns'])"
    _eval_in_a_process(tmp_path / "python", "-c", script)
    assert list((tmp_path / "python").glob("*-cache"))  # the Python road: the evaluation's programs
    _eval_in_a_process(tmp_path / "off", *command, KITAE_NO_COMPILATION_CACHE="1")
    assert not (tmp_path / "off").exists()
