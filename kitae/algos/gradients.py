"""The update step split in two, so gradients can be computed in one place and applied in another.

Every built-in algorithm writes ``compute_gradients(state, key, batch) -> (grads, info)`` and
``apply_gradients(state, grads) -> state`` as separate pure functions; its update step is their
composition. Distributed training computes gradients on workers and applies them on an updater.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax

__all__ = ["ComputeGradientsFn", "ApplyGradientsFn", "update_step_from_gradients", "as_batch", "BatchLike"]

# What a ``compute_gradients_fn`` takes as its batch: the algorithm's NamedTuple (or a tuple in its
# order), or a mapping of its fields (``as_batch``).
BatchLike = tuple | Mapping[str, Any]

B = TypeVar("B", bound=tuple)

ComputeGradientsFn = Callable[[Any, jax.Array, tuple], tuple[Any, dict[str, jax.Array]]]
ApplyGradientsFn = Callable[[Any, Any], Any]


def update_step_from_gradients(
    compute_gradients_fn: ComputeGradientsFn, apply_gradients_fn: ApplyGradientsFn
) -> Callable:
    """Composes the two halves into ``update_step_fn(state, key, batch) -> (state, info)``."""

    def update_step_fn(state: Any, key: jax.Array, batch: tuple) -> tuple[Any, dict[str, jax.Array]]:
        grads, info = compute_gradients_fn(state, key, batch)
        return apply_gradients_fn(state, grads), info

    return update_step_fn


def as_batch(batch_type: Callable[..., B], batch: Any) -> B:
    """The ``compute_gradients_fn``'s batch as ``batch_type`` (a ``NamedTuple``: ``DQNBatch``,
    ``PPOBatch``...) from one of them, a tuple in its fields' order, or a mapping of its fields
    (seed 003's ``compute_gradients`` takes "a dict containing all required tensors"). Runs at
    trace time; the leaves (``(B, ...)`` each) are not touched, so they keep their shape.

    Raises:
        TypeError: naming the missing and unknown fields of a mapping, or the type of anything
            else, and the fields ``batch_type`` has.
    """
    cls: Any = batch_type  # a NamedTuple class
    fields, defaults, name = cls._fields, cls._field_defaults, cls.__name__
    allowed = f"a {name}, a tuple in its order or a dict of its fields ({', '.join(fields)})"
    if isinstance(batch, cls):
        return batch
    if isinstance(batch, Mapping):
        missing = [f for f in fields if f not in batch and f not in defaults]
        unknown = sorted(str(k) for k in batch if k not in fields)
        if missing or unknown:
            wrong = "; ".join(
                [f"missing {', '.join(missing)}"] * bool(missing) + [f"unknown {', '.join(unknown)}"] * bool(unknown)
            )
            raise TypeError(f"batch with keys {sorted(map(str, batch))} is not allowed ({wrong}); allowed: {allowed}")
        return batch_type(**batch)
    if isinstance(batch, tuple) and len(fields) - len(defaults) <= len(batch) <= len(fields):
        return batch_type(*batch)
    what = f"a tuple of {len(batch)}" if isinstance(batch, tuple) else type(batch).__name__
    raise TypeError(f"batch is {what}; allowed: {allowed}")
