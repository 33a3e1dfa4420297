"""A sweep's grid: ``--grid KEY=V1,V2,...`` items parsed into values, and a config given one
combination of them (``kitae sweep``; ``with_values`` serves ``kitae tune``'s trials too)."""

from __future__ import annotations

import dataclasses

from kitae.config import AlgoConfig
from kitae.runs.errors import RunError
from kitae.runs.presets import parse_value

__all__ = ["ANNEALED", "LEARNING_RATE", "learning_rate_set", "parse_grid", "with_values"]

LEARNING_RATE = "update_cfg.learning_rate"
ANNEALED = "lin_"
"""A swept learning rate written ``lin_V`` anneals from ``V`` to 0, as ``--set`` reads it."""


def parse_grid(items: list[str]) -> dict[str, list[float]]:
    """``["update_cfg.learning_rate=1e-4,3e-4"]`` -> ``{"update_cfg.learning_rate": [1e-4, 3e-4]}``.

    ``update_cfg.learning_rate``'s values may be written ``lin_V`` (all of them or none), as
    ``--set`` takes them (``learning_rate_set``).

    Raises:
        RunError: for an item that is not ``KEY=V1,V2,...`` with numbers, or a key given twice.
    """
    if not items:
        raise RunError("give at least one --grid KEY=V1,V2,...")
    grid: dict[str, list[float]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise RunError(f"--grid {item!r} is not KEY=V1,V2,...")
        if key in grid:
            raise RunError(f"--grid {key} is given twice; give all its values in one --grid")
        parts = [part.strip() for part in text.split(",")]
        annealed = [part.startswith(ANNEALED) for part in parts] if key == LEARNING_RATE else [False]
        if any(annealed) and not all(annealed):
            raise RunError(
                f"--grid {key}={text} mixes annealed (lin_V) and constant values; allowed: all lin_V or none "
                "(whether the rate anneals is one program's structure)"
            )
        values = []
        for part in parts:
            value = parse_value(part.removeprefix(ANNEALED) if all(annealed) else part)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                allowed = "numbers, or lin_V for each" if key == LEARNING_RATE else "numbers"
                raise RunError(f"--grid {key}: {part!r} is not allowed; allowed: {allowed}, V1,V2,...")
            values.append(float(value))
        if len(set(values)) != len(values):
            raise RunError(f"--grid {key}: the values {text} repeat one")
        grid[key] = values
    return grid


def learning_rate_set(items: list[str]) -> str | None:
    """``--set update_cfg.learning_rate=V`` with the grid's first learning rate as written
    (``items``: ``parse_grid``'s, checked there), or ``None`` when the grid does not sweep it.

    Resolved with the run's other ``--set`` items, it makes the swept rate read as ``kitae train
    --set`` reads it: a plain value is a constant rate where the preset anneals its own
    (``lin_...``), and keeps an explicit ``learning_rate_annealing`` of a ``--config`` file; a
    ``lin_V`` value anneals. Each combination then replaces the value."""
    for item in items:
        key, _, text = item.partition("=")
        if key.strip() == LEARNING_RATE:
            return f"{LEARNING_RATE}={text.split(',')[0].strip()}"
    return None


def with_values(config: AlgoConfig, values: dict[str, float]) -> AlgoConfig:
    """``config`` with the combination's values, validated as any config is."""
    sections: dict[str, dict[str, float]] = {}
    for key, value in values.items():
        section, _, name = key.partition(".")
        sections.setdefault(section, {})[name] = value
    changes = {s: dataclasses.replace(getattr(config, s), **fields) for s, fields in sections.items()}
    return dataclasses.replace(config, **changes)
