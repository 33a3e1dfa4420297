"""Input checks shared by every layer: each raises an error naming the field, the value and what
is allowed."""

from __future__ import annotations

from typing import Any

__all__ = ["check_positive_int"]


def check_positive_int(name: str, value: Any) -> int:
    """Returns ``value`` if it is an int >= 1 (not a bool); else raises ``ValueError`` naming
    ``name``, the value and what is allowed (step counts, sizes, capacities)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} is not allowed; allowed: an int >= 1")
    return value
