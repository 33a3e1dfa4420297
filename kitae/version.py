"""kitae's version: the one place it is written (``pyproject.toml`` reads it from here, and
``kitae.__version__`` is this)."""

__version__ = "0.1.0"
