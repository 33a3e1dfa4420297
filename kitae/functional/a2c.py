"""The functional A2C: seed 002's stateless API over the collection's A2C
(``kitae.algos.collections.a2c``): the functional PPO's network, acting and data, with A2C's loss,
RMSprop and ONE gradient step on the whole rollout given to ``update`` (``T * E`` rows, whatever
their number)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import jax
import optax

from kitae.algos.collections import a2c as collection
from kitae.algos.experience import ExperiencePipeline
from kitae.algos.update import UpdateHooks
from kitae.buffer import Experience
from kitae.functional.base import BaseAgent, OptimState
from kitae.functional.ppo import DATA_KEYS, PPO, actor_critic_apply, policy_kind

__all__ = ["A2C", "DATA_KEYS"]


class A2C(PPO):
    """Advantage Actor-Critic as pure functions (seed 002's API). ``network``, ``env``,
    ``predict`` and ``update``'s ``data`` (a rollout ``(T, E, ...)``) are the functional PPO's.

    Args:
        network, env, learning_rate: as ``kitae.functional.PPO``'s.
        discount_factor, gae_lambda, entropy_coef, value_coef, normalize_advantages, optimizer,
        rms_prop_alpha, rms_prop_eps: as ``kitae.algos.collections.a2c.A2CParams``'s ``gamma``, ...
            (validated there).
        max_grad_norm: global-norm clipping (``None``: none).
        seed: the default update keys are ``fold_in(PRNGKey(seed), OptimState.count)``.
    """

    class OptimOutput(NamedTuple):
        """``update``'s losses (the one step's): ``loss``, ``policy_loss``, ``value_loss``, ``entropy``."""

        loss: jax.Array
        policy_loss: jax.Array
        value_loss: jax.Array
        entropy: jax.Array

    def __init__(
        self,
        network: Callable[[gym.Space], Any],
        env: Any,
        learning_rate: float | optax.Schedule,
        discount_factor: float = 0.99,
        gae_lambda: float = 1.0,
        entropy_coef: float = 0.0,
        value_coef: float = 0.5,
        normalize_advantages: bool = False,
        optimizer: str = "rmsprop",
        rms_prop_alpha: float = 0.99,
        rms_prop_eps: float = 1e-5,
        max_grad_norm: float | None = 0.5,
        seed: int = 0,
    ) -> None:
        BaseAgent.__init__(self, network, env, learning_rate)
        params = collection.A2CParams(
            gamma=discount_factor,
            gae_lambda=gae_lambda,
            entropy_coef=entropy_coef,
            value_coef=value_coef,
            normalize_advantages=normalize_advantages,
            optimizer=optimizer,
            rms_prop_alpha=rms_prop_alpha,
            rms_prop_eps=rms_prop_eps,
        )
        config = self.collection_config(params, max_grad_norm, seed=seed)
        self.n_epochs = 1
        self._apply = actor_critic_apply(self.network, policy_kind(self.action_space))
        self.use_collection(
            collection,
            config,
            learning_rate,
            max_grad_norm,
            optimizer=optimizer,
            rms_decay=rms_prop_alpha,
            rms_eps=rms_prop_eps,
        )
        self._pipeline = ExperiencePipeline([self._process], vectorized=True)
        self.hooks = UpdateHooks()

    def minibatch_rows(self, rollout: Experience) -> int:
        """The whole rollout is the one minibatch: ``T * E`` rows (static)."""
        return int(jax.numpy.size(rollout.reward))

    def _update(
        self, params: PPO.Params, optimizer_state: OptimState, data: Mapping[str, Any]
    ) -> tuple[Any, PPO.Params, OptimState]:  # A2C.OptimOutput
        state, info = self.rollout_update(self.collection_state(params, optimizer_state), optimizer_state, data)
        ac = state.actor_critic
        output = A2C.OptimOutput(info["loss_total"], info["loss_policy"], info["loss_value"], info["entropy"])
        return output, PPO.Params(ac.params), OptimState(ac.step, ac.opt_state)
