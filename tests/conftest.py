"""Every test runs in its own temporary working directory, so runs/ never lands in the repository."""

import os
import tempfile

import pytest

# Compiled programs are cached on disk for the session only (never in the user's cache).
os.environ.setdefault("KITAE_CACHE_DIR", tempfile.mkdtemp(prefix="kitae-test-cache-"))


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield
