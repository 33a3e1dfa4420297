"""JAX's persistent compilation cache, on by default for both training loops.

With it, a second run of the same configuration loads its compiled programs (the explore call,
the update, or the whole compiled loop) from disk instead of compiling them again.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

_ENABLED = False


def enable_compilation_cache(directory: str | Path | None = None) -> Path:
    """Turns on JAX's persistent compilation cache in a user-level folder.

    The folder is ``directory``, else ``$KITAE_CACHE_DIR``, else ``$XDG_CACHE_HOME/kitae/jax``
    (``~/.cache/kitae/jax``). A second run of the same configuration then loads its program from
    disk instead of compiling it. Set ``KITAE_NO_COMPILATION_CACHE=1`` to leave it off.
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
    _ENABLED = True
    return path


def use_compilation_cache() -> None:
    """Enables the cache once per process unless ``KITAE_NO_COMPILATION_CACHE`` is set."""
    if not _ENABLED and not os.environ.get("KITAE_NO_COMPILATION_CACHE"):
        enable_compilation_cache()
