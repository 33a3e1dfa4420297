"""``init_params`` and re-exports of kitae's public modules (encoders, heads, factories)."""

from __future__ import annotations

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
    """
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
