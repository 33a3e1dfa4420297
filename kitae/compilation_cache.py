"""JAX's persistent compilation cache, on by default for both training loops, evaluation and the
command line.

With it, a second run of the same configuration loads its compiled programs (the explore call,
the update, or the whole compiled loop) from disk instead of compiling them again.

The cache is bounded (``DEFAULT_MAX_BYTES``, least recently used entries evicted first) rather
than JAX's default of unbounded: every new configuration, seed count or environment adds
programs to a user-level folder, which would otherwise only grow. A bound also makes JAX take a
file lock around each read and write of the cache: without it an entry is written in place, and
a process that reads it while another writes it (Ray workers, parallel test workers, two
``kitae train`` at once) finds a truncated entry ("Error reading persistent compilation cache
entry ... truncated stream", and compiles again).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

_ENABLED = False

DEFAULT_MAX_BYTES = 4 * 1024**3
"""The cache's size bound unless ``KITAE_CACHE_MAX_BYTES`` (or JAX's own
``JAX_COMPILATION_CACHE_MAX_SIZE``) says otherwise; a PPO run on CartPole adds about 0.5 MB of programs."""


def cache_max_bytes() -> int:
    """The cache's bound in bytes: ``$KITAE_CACHE_MAX_BYTES``, else ``DEFAULT_MAX_BYTES``; ``-1``
    leaves it unbounded (JAX's default, without the lock).

    Raises:
        ValueError: for a value that is not an int >= 1 or -1.
    """
    text = os.environ.get("KITAE_CACHE_MAX_BYTES")
    if text is None:
        return DEFAULT_MAX_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 and value != -1:
        raise ValueError(
            f"KITAE_CACHE_MAX_BYTES={text!r} is not allowed; allowed: an int >= 1 (bytes), or -1 for no bound"
        )
    return value


def enable_compilation_cache(directory: str | Path | None = None) -> Path:
    """Turns on JAX's persistent compilation cache in a user-level folder.

    The folder is ``directory``, else ``$KITAE_CACHE_DIR``, else ``$XDG_CACHE_HOME/kitae/jax``
    (``~/.cache/kitae/jax``). A second run of the same configuration then loads its program from
    disk instead of compiling it. Set ``KITAE_NO_COMPILATION_CACHE=1`` to leave it off. The folder
    holds at most ``cache_max_bytes()`` (JAX's ``jax_compilation_cache_max_size``, kept if the
    user set it through ``JAX_COMPILATION_CACHE_MAX_SIZE``).
    """
    global _ENABLED
    if directory is None:
        directory = os.environ.get("KITAE_CACHE_DIR") or (
            Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kitae" / "jax"
        )
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ:
        jax.config.update("jax_compilation_cache_max_size", cache_max_bytes())
    if getattr(jax.config, "jax_compilation_cache_max_size") != -1:  # noqa: B009 (not in its type stubs)
        give_entries_access_times(path)
    _ENABLED = True
    return path


_CACHE_SUFFIX, _ATIME_SUFFIX = "-cache", "-atime"  # the names jax._src.lru_cache gives its files


def give_entries_access_times(path: Path) -> int:
    """Writes an access time for every entry of the cache folder ``path`` that has none; returns
    how many it wrote.

    A bounded cache (JAX's ``LRUCache``) keeps each entry's last use in a ``<key>-atime`` file
    beside its ``<key>-cache`` file, and reads them all before every write to choose what to evict;
    an unbounded one (kitae before its caches were bounded, ``KITAE_CACHE_MAX_BYTES=-1``) writes no
    such file. Without this, a bounded run in a folder an unbounded one filled could cache nothing
    ("Error writing persistent compilation cache entry ... FileNotFoundError ... -atime" at every
    compile). An entry gets its file's modification time, so the oldest are evicted first. One
    directory listing when nothing is missing (a few milliseconds for a thousand entries).
    """
    names = set(os.listdir(path))
    missing = [
        name[: -len(_CACHE_SUFFIX)]
        for name in names
        if name.endswith(_CACHE_SUFFIX) and name[: -len(_CACHE_SUFFIX)] + _ATIME_SUFFIX not in names
    ]
    if not missing:
        return 0
    import filelock  # JAX's own lock of the folder, so no process evicts an entry while it is given a time

    written = 0
    with filelock.FileLock(path / ".lockfile", timeout=30):
        for key in missing:
            try:
                modified = (path / f"{key}{_CACHE_SUFFIX}").stat().st_mtime_ns
            except FileNotFoundError:  # evicted since the listing
                continue
            (path / f"{key}{_ATIME_SUFFIX}").write_bytes(modified.to_bytes(8, "little"))
            written += 1
    return written


def use_compilation_cache() -> None:
    """Enables the cache once per process unless ``KITAE_NO_COMPILATION_CACHE`` is set."""
    if not _ENABLED and not os.environ.get("KITAE_NO_COMPILATION_CACHE"):
        enable_compilation_cache()
