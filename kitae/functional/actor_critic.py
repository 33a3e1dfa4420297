"""What the functional SAC and TD3 share: an actor and a critic network from one creator, a
continuous action space with finite bounds, and dummy inputs to initialise them."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp

from kitae.action_masks import refuse_action_mask
from kitae.functional.base import CollectionAgent, as_key, make_actor_critic
from kitae.functional.checks import PROBE_BATCH, check_output_shape, dummy_observation, probe_observation

__all__ = ["ActorCriticAgent"]


class ActorCriticAgent(CollectionAgent):
    """A ``CollectionAgent`` whose creator returns ``(actor, critic)`` (``make_actor_critic``) and whose
    action space is a 1-D ``Box`` with finite bounds (the collection module's
    ``check_action_space`` decides; ``collection_module`` is that module)."""

    collection_module: Any = None

    def make_networks(self, creator: Any, action_space: gym.Space) -> Any:
        """``(actor, critic)`` ``Network`` objects from the creator (``make_actor_critic``)."""
        return make_actor_critic(creator, action_space)

    def check_action_space(self, action_space: gym.Space) -> None:
        """The collection module's ``check_action_space``, and no ``"action_mask"`` in the
        observations (``refuse_action_mask``: these agents read none)."""
        try:
            self.collection_module.check_action_space(action_space)
        except ValueError as error:
            raise ValueError(f"action_space={action_space} is not allowed for {type(self).__name__}; {error}") from None
        refuse_action_mask(self.observation_space, type(self).__name__)

    def probe_inputs(self) -> tuple[Any, jax.Array]:
        """``(observations, actions)``, ``PROBE_BATCH`` zeros of each: what ``init_params`` checks
        the networks' output shapes on (``jax.eval_shape``)."""
        action = jnp.zeros((PROBE_BATCH, *(self.action_space.shape or ())), jnp.float32)
        return probe_observation(self.observation_space), action

    def check_actor_output(self, output: Any, allowed: str) -> None:
        """Raises ``TypeError`` unless the actor's ``output`` (a ``jax.eval_shape`` leaf on
        ``probe_inputs``) is ``(B, d)`` for this ``Box(d,)`` action space; ``allowed`` names what
        the actor returns."""
        d = int(self.action_space.shape[0])  # type: ignore[index]  # a Box of shape (d,): check_action_space
        check_output_shape(
            output,
            (PROBE_BATCH, d),
            f"{type(self).__name__}'s actor",
            f"{allowed} (B, d) with d={d} for the action space {self.action_space}",
        )

    def dummy_inputs(self, rng: Any) -> tuple[jax.Array, jax.Array, Any, jax.Array]:
        """``(actor_key, critic_key, observations (1, ...), actions (1, d))`` to initialise the
        networks, the keys split from ``rng``."""
        actor_key, critic_key = jax.random.split(as_key(rng))
        action = jnp.zeros((1, *(self.action_space.shape or ())), jnp.float32)
        return actor_key, critic_key, dummy_observation(self.observation_space), action
