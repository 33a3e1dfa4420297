"""The functional DDPG: seed 002's stateless API over the collection's DDPG
(``kitae.algos.collections.ddpg``): the functional TD3's networks (``network(action_space) ->
(actor, critic)``, ONE critic here), parameters and data, with DDPG's update (one critic, no
target smoothing, no delay) and Gaussian exploration noise. The Ornstein-Uhlenbeck noise of the
collection's DDPG is not offered here (it would be policy state; not written yet)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import optax

from kitae.algos.collections import ddpg as collection
from kitae.functional.actor_critic import ActorCriticAgent
from kitae.functional.base import critic_ensemble
from kitae.functional.td3 import TD3

__all__ = ["DDPG"]


class DDPG(TD3):
    """Deep Deterministic Policy Gradient as pure functions (seed 002's API), for 1-D ``Box``
    actions with finite bounds. ``Params(actor, critic, actor_target, critic_target)``,
    ``update``'s ``data``: ``kitae.functional.checks.OFF_POLICY_DATA_KEYS``.

    Args:
        network: ``network(action_space) -> (actor, critic)``: ``actor.apply(params, obs) ->
            actions in [-1, 1]``, ``critic.apply(params, obs, action) -> Q (B,)``.
        env, learning_rate: as ``kitae.functional.TD3``'s.
        discount_factor, tau, exploration_noise, start_step: as
            ``kitae.algos.collections.ddpg.DDPGParams``'s ``gamma``, ... (validated there);
            ``start_step`` counts ``predict`` calls in training mode.
        max_grad_norm: global-norm clipping (``None``: none).
        seed: the default update keys are ``fold_in(PRNGKey(seed), OptimState.count)``.
    """

    collection_module = collection

    def __init__(
        self,
        network: Callable[[gym.Space], Any],
        env: Any,
        learning_rate: float | optax.Schedule,
        discount_factor: float = 0.99,
        tau: float = 0.005,
        exploration_noise: float = 0.1,
        start_step: int = 0,
        max_grad_norm: float | None = None,
        seed: int = 0,
    ) -> None:
        ActorCriticAgent.__init__(self, network, env, learning_rate)
        params = collection.DDPGParams(
            gamma=discount_factor, tau=tau, exploration_noise=exploration_noise, start_step=start_step
        )
        config = self.collection_config(params, max_grad_norm, seed=seed)
        self.exploration_noise, self.policy_delay = exploration_noise, 1
        self.actor, critic = self.network
        self.critic = critic_ensemble(critic, 1)  # (1, B): the layout TD3's losses take
        self.use_collection(collection, config, learning_rate, max_grad_norm)

    def _predict(
        self, params: TD3.Params, policy_state: TD3.PolicyState, obs: Any, key: jax.Array, evaluation: bool = False
    ) -> tuple[TD3.PolicyOutput, TD3.PolicyState]:
        noise_key, random_key = jax.random.split(key)
        pi = self.actor.apply(params.actor, obs)
        scale = 0.0 if evaluation else self.exploration_noise
        noise = scale * jax.random.normal(noise_key, jnp.shape(pi), jnp.float32)
        step = jnp.iinfo(jnp.int32).max if evaluation else policy_state.count  # evaluation: no warm-up
        actions, _ = self._explore(self.collection_state(params), random_key, obs, noise, step)
        count = policy_state.count if evaluation else policy_state.count + 1
        return TD3.PolicyOutput(actions), TD3.PolicyState(count)
