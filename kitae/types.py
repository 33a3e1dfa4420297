"""Type aliases shared across kitae, and the `AlgoType` enum.

Shapes follow one convention everywhere: ``T`` steps, ``E`` environments, ``A`` agents,
``B`` a batch of transitions.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax

Params = Any
"""A pytree of parameter arrays, as returned by ``flax.linen.Module.init``."""

PRNGKeyArray = jax.Array
"""A JAX PRNG key (``jax.random.key`` or ``jax.random.PRNGKey``)."""

Array = jax.Array
ObsType = Any
"""An observation: an array ``(E, *obs_shape)`` or a dict of them keyed by agent."""

ActionType = Any
"""An action batch: an array ``(E, *action_shape)`` or a dict of them keyed by agent."""

ExperienceTransform = Callable[[Any, jax.Array, NamedTuple], Any]
"""``transform(state, key, experience) -> experience``: one step of an ``ExperiencePipeline``."""

ExploreFn = Callable[..., tuple[jax.Array, jax.Array]]
"""``explore_fn(state, key, *observations, **hyper) -> (actions, log_probs)``, batched on axis 0."""

ProcessExperienceFn = Callable[[Any, jax.Array, NamedTuple], tuple[jax.Array, ...]]
"""``process_fn(state, key, experience) -> tuple of arrays``, written for one agent in one env."""

UpdateStepFn = Callable[[Any, jax.Array, tuple], tuple[Any, dict[str, jax.Array]]]
"""``update_fn(state, key, batch) -> (state, info)``: one gradient step on one minibatch."""


class AlgoType(enum.Enum):
    """Whether an agent learns from a replay buffer (off-policy) or from fresh rollouts (on-policy)."""

    ON_POLICY = "on_policy"
    OFF_POLICY = "off_policy"


class TrainStateFactory(Protocol):
    """What an agent builds its train state with (``BaseAgent.train_state_factory``)."""

    def __call__(
        self, key: jax.Array, config: Any, *, preprocess_fn: Callable | None = None, tabulate: bool = False
    ) -> Any:
        """The agent's initial train state.

        Args:
            key: a PRNG key, a raw ``(2,)`` uint32 key, that initialises the networks.
            config: the agent's ``kitae.config.AlgoConfig``.
            preprocess_fn: applied to observations ``(B, *obs_shape)`` before the networks.
            tabulate: print a summary of the networks.

        Returns:
            The train state, a pytree of arrays.
        """
        ...
