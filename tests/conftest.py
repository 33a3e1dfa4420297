"""Every test runs in its own temporary working directory, so runs/ never lands in the repository."""

import pytest


@pytest.fixture(autouse=True)
def _in_tmp_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    yield
