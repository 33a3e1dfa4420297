"""The functional TD3: seed 002's stateless API over the collection's TD3
(``kitae.algos.collections.td3``).

``predict`` is the collection's ``explore`` (the deterministic action plus Gaussian noise,
uniform actions for the first ``start_step`` training calls, no noise in evaluation); ``update``
is the collection's processing and one ``compute_gradients`` + ``apply_gradients`` step (twin
critics against target networks with smoothed target actions; the actor and the Polyak target
updates every ``policy_delay`` critic steps). Nothing else.

The network: ``network(action_space) -> (actor, critic)`` (Haiku or Flax each):
``actor.apply(params, obs (B, ...))`` returns actions ``(B, d)`` in ``[-1, 1]`` (end with a
``tanh``); ``critic.apply(params, obs, action (B, d))`` returns Q-values ``(B,)`` or ``(B, 1)``.
``critic_copies`` (default 2) copies of the critic are initialised independently; a critic that is
itself a twin ensemble (``(2, B)`` Q-values) takes ``critic_copies=1``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import optax

from kitae.algos.collections import td3 as collection
from kitae.functional.actor_critic import ActorCriticAgent
from kitae.functional.base import OptimState, critic_ensemble
from kitae.modules.pytree import TrainState

__all__ = ["TD3"]


class TD3(ActorCriticAgent):
    """Twin Delayed DDPG as pure functions (seed 002's API), for 1-D ``Box`` actions with finite
    bounds. ``update``'s ``data``: ``kitae.functional.checks.OFF_POLICY_DATA_KEYS``.

    Args:
        network: ``network(action_space) -> (actor, critic)`` (see the module docstring).
        env: a Gymnasium environment or vector environment.
        learning_rate: Adam's, for the actor and the critics; a float > 0 or an optax schedule.
        discount_factor, tau, exploration_noise, policy_noise, noise_clip, policy_delay,
        start_step: as ``kitae.algos.collections.td3.TD3Params``'s ``gamma``, ``tau``, ...
            (validated there); ``start_step`` counts ``predict`` calls in training mode.
        max_grad_norm: global-norm clipping (``None``: none).
        critic_copies: independently initialised copies of the critic (their Q-value rows must
            add up to TD3's 2 critics).
        seed: the default update keys are ``fold_in(PRNGKey(seed), OptimState.count)``.
    """

    collection_module = collection

    class Params(NamedTuple):
        """TD3's parameters: actor, twin critics (stacked), and their targets."""

        actor: Any
        critic: Any
        actor_target: Any
        critic_target: Any

    class PolicyState(NamedTuple):
        """``count``: ``predict`` calls in training mode (random actions while below ``start_step``)."""

        count: jax.Array  # type: ignore[assignment]  # the seed's field name shadows tuple.count

    class PolicyOutput(NamedTuple):
        """``actions`` ``(B, d)`` in the environment's units."""

        actions: jax.Array

    class OptimOutput(NamedTuple):
        """``update``'s losses before the step: ``critic_loss``, ``actor_loss`` (computed every step,
        applied every ``policy_delay``), ``q_values`` (mean Q)."""

        critic_loss: jax.Array
        actor_loss: jax.Array
        q_values: jax.Array

    def __init__(
        self,
        network: Callable[[gym.Space], Any],
        env: Any,
        learning_rate: float | optax.Schedule,
        discount_factor: float = 0.99,
        tau: float = 0.005,
        exploration_noise: float = 0.1,
        policy_noise: float = 0.2,
        noise_clip: float = 0.5,
        policy_delay: int = 2,
        start_step: int = 0,
        max_grad_norm: float | None = None,
        critic_copies: int = 2,
        seed: int = 0,
    ) -> None:
        super().__init__(network, env, learning_rate)
        if critic_copies not in (1, 2):
            raise ValueError(
                f"critic_copies={critic_copies!r} is not allowed; allowed: 2 (a single critic network) or 1 (a twin "
                "ensemble)"
            )
        params = collection.TD3Params(
            gamma=discount_factor,
            tau=tau,
            exploration_noise=exploration_noise,
            policy_noise=policy_noise,
            noise_clip=noise_clip,
            policy_delay=policy_delay,
            start_step=start_step,
        )
        config = self.collection_config(params, max_grad_norm, seed=seed)
        self.exploration_noise, self.policy_delay = exploration_noise, policy_delay
        self.actor, critic = self.network
        self.critic = critic_ensemble(critic, critic_copies)
        self.use_collection(collection, config, learning_rate, max_grad_norm)

    # -- state -----------------------------------------------------------------------------------

    def init_params(self, rng: Any) -> Params:
        """Actor and twin critics initialised on dummy inputs; the targets are copies.

        Raises:
            TypeError: if the actor's or the critic's outputs do not fit the action space (shapes
                checked on ``PROBE_BATCH`` zero observations), naming the shape found and the one
                required.
        """
        actor_key, critic_key, obs, action = self.dummy_inputs(rng)
        actor = self.actor.init(actor_key, obs)
        critic = self.critic.init(critic_key, obs, action)
        probe_obs, probe_action = self.probe_inputs()
        self.check_actor_output(jax.eval_shape(self.actor.apply, actor, probe_obs), "actions in [-1, 1]")
        jax.eval_shape(self.critic.apply, critic, probe_obs, probe_action)  # critic_ensemble checks the shapes
        copy = jax.tree_util.tree_map(jnp.copy, (actor, critic))
        return TD3.Params(actor, critic, *copy)

    def init_policy(self, rng: Any) -> PolicyState:
        """``PolicyState(count=0)``, an int32 scalar; ``rng`` (a raw ``(2,)`` uint32 PRNG key or an
        ``hk.PRNGSequence``) is not used."""
        del rng
        return TD3.PolicyState(jnp.zeros((), jnp.int32))

    def init_optimizer(self, params: Params, rng: Any) -> OptimState:
        """``OptimState(count=0, {"actor", "critic"} optimizer states)``: ``count`` an int32
        scalar, each optax state's moments of the shapes of its part of ``params``;
        ``rng`` (a raw ``(2,)`` uint32 PRNG key or an ``hk.PRNGSequence``) is not used."""
        del rng
        return OptimState(
            jnp.zeros((), jnp.int32), {"actor": self.tx.init(params.actor), "critic": self.tx.init(params.critic)}
        )

    def collection_state(self, params: Params, optimizer_state: OptimState | None = None) -> collection.TD3State:
        """The collection's ``TD3State`` for these explicit parts (made on every call): ``params``
        (the ``Params`` pytree, leaves' shapes kept) and ``optimizer_state`` (``None``: no
        optimizer states, count 0). The actor's step (updates so far, an int32 scalar) follows from
        the critics' count: ``ceil(count / policy_delay)``."""
        count = jnp.zeros((), jnp.int32) if optimizer_state is None else optimizer_state.count
        opt = {} if optimizer_state is None else optimizer_state.opt_state
        return collection.TD3State(
            actor=TrainState(
                step=(count + self.policy_delay - 1) // self.policy_delay,
                apply_fn=self.actor.apply,
                params=params.actor,
                tx=self.tx,
                opt_state=opt.get("actor"),
                target_params=params.actor_target,
            ),
            critic=TrainState(
                step=count,
                apply_fn=self.critic.apply,
                params=params.critic,
                tx=self.tx,
                opt_state=opt.get("critic"),
                target_params=params.critic_target,
            ),
        )

    # -- acting and learning ----------------------------------------------------------------------

    def _predict(
        self, params: Params, policy_state: PolicyState, obs: Any, key: jax.Array, evaluation: bool = False
    ) -> tuple[PolicyOutput, PolicyState]:
        noise = 0.0 if evaluation else self.exploration_noise
        # evaluation: no random warm-up either (an env step past start_step)
        step = jnp.iinfo(jnp.int32).max if evaluation else policy_state.count
        actions, _ = self._explore(self.collection_state(params), key, obs, exploration_noise=noise, env_step=step)
        count = policy_state.count if evaluation else policy_state.count + 1
        return TD3.PolicyOutput(actions), TD3.PolicyState(count)

    def _update(
        self, params: Params, optimizer_state: OptimState, data: Mapping[str, Any]
    ) -> tuple[OptimOutput, Params, OptimState]:
        state, info = self.off_policy_update(
            self.collection_state(params, optimizer_state), data, optimizer_state.count
        )
        actor, critic = state.actor, state.critic
        assert critic is not None  # a full state
        output = TD3.OptimOutput(info["loss_critic"], info["loss_actor"], info["qvalue"])
        new = TD3.Params(actor.params, critic.params, actor.target_params, critic.target_params)
        return output, new, OptimState(critic.step, {"actor": actor.opt_state, "critic": critic.opt_state})
