"""``init_params`` and re-exports of kitae's public modules (encoders, heads, factories)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from kitae.modules.encoders import (
    MLP,
    DictEncoder,
    DiscreteEncoder,
    MinAtarCNN,
    NatureCNN,
    encoder_factory,
    space_input_shape,
)
from kitae.modules.policy import (
    CategoricalHead,
    DeterministicHead,
    NormalHead,
    Policy,
    TanhNormalHead,
    policy_factory,
    scale_action,
    unscale_action,
)
from kitae.modules.qvalue import ContinuousQValue, DiscreteQValue, qvalue_factory
from kitae.modules.value import Value, ValueHead, value_factory
from kitae.types import Params

InputShape = tuple[int, ...] | dict[str, Any]
"""One input's shape without the batch dim, or a (nested) dict of them for dict observations."""


def _zeros(shape: InputShape) -> Any:
    if isinstance(shape, dict):
        return {k: _zeros(v) for k, v in shape.items()}
    return jnp.zeros((1, *shape))


INPUT_SHAPES_ALLOWED = (
    "a list of shapes, one per positional input of the module, each a tuple of ints without the batch dim "
    "or a (nested) dict of them: [(4,)] for one input of shape (4,), [(4,), (2,)] for two"
)


def _is_shape(shape: Any) -> bool:
    if isinstance(shape, dict):
        return all(_is_shape(v) for v in shape.values())
    if not isinstance(shape, (tuple, list)):
        return False
    return all(isinstance(d, numbers.Integral) and not isinstance(d, bool) for d in shape)


def _check_input_shapes(input_shapes: Any) -> None:
    """Refuses what ``init_params`` would otherwise fail on deep inside (a single shape ``(4,)``
    read as shapes ``4``: "Value after * must be an iterable, not int")."""
    if not isinstance(input_shapes, (list, tuple)) or not all(_is_shape(shape) for shape in input_shapes):
        hint = (
            f" (one input of shape {tuple(input_shapes)}? pass [{tuple(input_shapes)}])"
            if _is_shape(input_shapes) and not isinstance(input_shapes, dict) and input_shapes
            else ""
        )
        raise TypeError(f"input_shapes={input_shapes!r} is not allowed{hint}; allowed: {INPUT_SHAPES_ALLOWED}")


def init_params(
    key: jax.Array,
    module: nn.Module,
    input_shapes: Sequence[InputShape],
    tabulate: bool = False,
) -> Params:
    """Initialises ``module`` on dummy inputs and returns its variables.

    Args:
        key: PRNG key.
        module: a flax.linen module.
        input_shapes: one shape per positional input of ``module``, without the batch dim; the
            input is ``jnp.zeros((1, *shape))`` (float32). A dict ``{name: shape}`` (nested
            allowed) builds a dict of such arrays, for modules over ``gymnasium.spaces.Dict``
            observations (``space_input_shape(space)`` gives it).
        tabulate: also print ``module.tabulate(key, *inputs)``, flax's table of layers and params.

    Returns:
        ``module.init(key, *inputs)``, i.e. ``{"params": ...}``.

    Raises:
        TypeError: if ``input_shapes`` is not a list of shapes (a single shape ``(4,)`` included),
            naming it and what is allowed.
    """
    _check_input_shapes(input_shapes)
    inputs = [_zeros(shape) for shape in input_shapes]
    if tabulate:
        print(module.tabulate(key, *inputs))
    return module.init(key, *inputs)


__all__ = [
    "init_params",
    "MLP",
    "NatureCNN",
    "MinAtarCNN",
    "DiscreteEncoder",
    "DictEncoder",
    "encoder_factory",
    "space_input_shape",
    "CategoricalHead",
    "NormalHead",
    "TanhNormalHead",
    "DeterministicHead",
    "Policy",
    "policy_factory",
    "scale_action",
    "unscale_action",
    "ValueHead",
    "Value",
    "value_factory",
    "DiscreteQValue",
    "ContinuousQValue",
    "qvalue_factory",
]
