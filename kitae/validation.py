"""Input checks shared by every layer: each raises an error naming the field, the value and what
is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

__all__ = ["check_positive_int", "closest_names"]


def check_positive_int(name: str, value: Any) -> int:
    """Returns ``value`` if it is an int >= 1 (not a bool); else raises ``ValueError`` naming
    ``name``, the value and what is allowed (step counts, sizes, capacities)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} is not allowed; allowed: an int >= 1")
    return value


def closest_names(name: str, known: Iterable[str], n: int = 3) -> str:
    """``"; did you mean 'CartPole-v1'?"`` naming up to ``n`` of ``known`` closest to a name that
    is not among them (``difflib``'s ratio of at least 0.6), else ``""``: for error messages."""
    close = difflib.get_close_matches(name, sorted(known), n=n)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
