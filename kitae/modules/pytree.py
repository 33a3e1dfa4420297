"""Pytree containers for an agent's state.

``AgentPyTree`` is the base of every agent state: subclasses are dataclasses registered as JAX
pytrees, so a state can be passed through ``jax.jit`` / ``jax.vmap`` / ``jax.lax.scan``, and its
fields can be reassigned inside a jitted function (``state.qvalue = state.qvalue.apply_gradients(...)``).

``TrainState`` is flax's ``TrainState`` with an extra ``target_params`` field for target networks.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, ClassVar, Self, dataclass_transform

import jax
import jax.numpy as jnp
import optax
from flax.training import train_state as flax_train_state

from kitae.types import Params


@dataclass_transform(eq_default=False)
class AgentPyTree:
    """Base class of agent states: a mutable dataclass that is also a JAX pytree.

    Declare the fields as class annotations; every field is a pytree child::

        class DQNState(AgentPyTree):
            qvalue: TrainState

        state = DQNState(TrainState.create(...))

    Reassigning a field (``state.qvalue = ...``) inside a jitted function changes only the traced
    copy that the function received; return the state to keep the change.
    """

    if TYPE_CHECKING:  # every subclass is made a dataclass (below): what dataclasses.replace needs
        __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # eq=False: comparing states field by field would compare arrays, which is ambiguous.
        dataclasses.dataclass(cls, eq=False)
        jax.tree_util.register_dataclass(cls)

    def replace(self, **changes: Any) -> Self:
        """Returns a copy of the state with the given fields replaced."""
        return dataclasses.replace(self, **changes)


class TrainState(flax_train_state.TrainState):
    """flax ``TrainState`` (``step``, ``apply_fn``, ``params``, ``tx``, ``opt_state``) plus
    ``target_params``, the parameters of a target network (``None`` when the agent has none).

    Create it with ``TrainState.create(apply_fn=..., params=..., tx=..., target_params=...)``.
    """

    target_params: Params = None

    @classmethod
    def create(cls, *, apply_fn: Any, params: Params, tx: optax.GradientTransformation, **kwargs: Any) -> TrainState:
        """flax's ``create``, with ``step`` an int32 scalar ``()`` array from the start (flax starts
        it as the Python int 0, which becomes an array after the first update and makes every
        jitted function that takes the state compile twice). ``params`` is any pytree of arrays;
        ``kwargs`` sets the other fields (``target_params``)."""
        state = super().create(apply_fn=apply_fn, params=params, tx=tx, **kwargs)
        return state.replace(step=jnp.zeros((), jnp.int32))

    def soft_update_target(self, tau: float | jax.Array) -> TrainState:
        """Polyak averaging: ``target <- tau * params + (1 - tau) * target``, leaf by leaf (shapes
        kept); ``tau`` a float or a scalar ``()`` in ``[0, 1]``."""
        return self.replace(target_params=optax.incremental_update(self.params, self.target_params, tau))

    def hard_update_target(self) -> TrainState:
        """Copies ``params`` into ``target_params``."""
        return self.replace(target_params=self.params)
