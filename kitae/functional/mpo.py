"""The functional MPO: seed 002's stateless API over the collection's MPO
(``kitae.algos.collections.mpo``).

``predict`` is the collection's ``explore`` (a sample of the Gaussian policy clipped to the
bounds, uniform actions for the first ``start_step`` training calls, the mean in evaluation);
``update`` is the collection's processing and one ``compute_gradients`` + ``apply_gradients`` step
(the critic on its expected-SARSA target, the E-step's temperature, the M-step with its decoupled
KL bounds and Lagrange multipliers, Polyak targets). Nothing else.

The network: ``network(action_space) -> (actor, critic)`` (Haiku or Flax each):
``actor.apply(params, obs (B, ...))`` returns ``(mean (B, D), L (B, D, D))``: the mean in
``[-1, 1]`` (end with a ``tanh``) and the lower-triangular Cholesky factor of the covariance with
a positive diagonal (``kitae.algos.collections.mpo.MPOPolicy`` is one);
``critic.apply(params, obs, action (B, D))`` returns Q-values ``(B,)`` or ``(B, 1)``, actions in
``[-1, 1]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import optax

from kitae.algos.collections import mpo as collection
from kitae.functional.actor_critic import ActorCriticAgent
from kitae.functional.base import Network, OptimState, critic_ensemble
from kitae.functional.checks import OFF_POLICY_DATA_KEYS
from kitae.modules.pytree import TrainState

__all__ = ["MPO", "DATA_KEYS"]

DATA_KEYS = OFF_POLICY_DATA_KEYS
"""What ``MPO.update``'s ``data`` holds: ``kitae.functional.checks.OFF_POLICY_DATA_KEYS``
(``obs``, ``action`` in the environment's units, ``reward``, ``terminated``, ``next_obs``;
optionally ``key``)."""


def _gaussian(network: Network, action_dim: int) -> Callable[[Any, Any], tuple[jax.Array, jax.Array]]:
    """The actor's ``apply``, checked (when traced) to return ``(mean (B, D), L (B, D, D))``."""

    def apply(params: Any, observations: Any) -> tuple[jax.Array, jax.Array]:
        out = network.apply(params, observations)
        ok = isinstance(out, tuple) and len(out) == 2
        if ok:
            mean, chol = (jnp.asarray(x) for x in out)
            ok = mean.ndim == 2 and mean.shape[-1] == action_dim and chol.shape == (*mean.shape, action_dim)
        if not ok:
            got = type(out).__name__ if not isinstance(out, tuple) else str([jnp.shape(x) for x in out])
            raise TypeError(
                f"MPO's actor returned {got}, which is not allowed; allowed: (mean (B, {action_dim}), "
                f"L (B, {action_dim}, {action_dim})), L lower triangular with a positive diagonal"
            )
        return mean, chol

    return apply


def _one_critic(critic: Network) -> Network:
    """The critic's Q-values as ``(B,)``; an ensemble (``(k, B)``, ``k > 1``) is refused.

    The collection's MPO scores ``N`` sampled actions per observation, ``action (N, B, D)`` ->
    ``(N, B)`` (kitae's ``ContinuousQValue`` encodes each observation once for them); a user's
    critic takes ``(B, D)`` only, so it gets the observations repeated ``N`` times, ``N * B`` rows.
    """
    rows = critic_ensemble(critic, 1)

    def apply(params: Any, obs: Any, action: Any) -> jax.Array:
        if jnp.ndim(action) == 3:
            n, b = jnp.shape(action)[:2]
            repeated = jax.tree_util.tree_map(
                lambda x: jnp.broadcast_to(x[None], (n, *x.shape)).reshape(n * b, *x.shape[1:]), obs
            )
            return apply(params, repeated, jnp.reshape(action, (n * b, -1))).reshape(n, b)
        q = rows.apply(params, obs, action)
        if q.shape[0] != 1:
            raise TypeError(
                f"MPO's critic returned {q.shape[0]} rows of Q-values, which is not allowed; allowed: one critic, "
                "Q-values (B,) or (B, 1)"
            )
        return q[0]

    return Network(critic.init, apply)


class MPO(ActorCriticAgent):
    """Maximum a posteriori Policy Optimisation as pure functions (seed 002's API), for 1-D ``Box``
    actions with finite bounds. ``update``'s ``data``: ``DATA_KEYS``.

    Args:
        network: ``network(action_space) -> (actor, critic)`` (see the module docstring).
        env: a Gymnasium environment or vector environment.
        learning_rate: Adam's, for the actor and the critic; a float > 0 or an optax schedule.
        discount_factor, tau, n_action_samples, epsilon, epsilon_mean, epsilon_stddev,
        init_temperature, init_alpha_mean, init_alpha_stddev, dual_learning_rate, start_step:
            as ``kitae.algos.collections.mpo.MPOParams``'s ``gamma``, ``tau``, ... (validated
            there); ``start_step`` counts ``predict`` calls in training mode.
        max_grad_norm: global-norm clipping (``None``: none).
        seed: the default update keys are ``fold_in(PRNGKey(seed), OptimState.count)``.
    """

    collection_module = collection

    class Params(NamedTuple):
        """MPO's parameters: the policy's, the critic's, their targets', and the duals'
        ``{"temperature", "alpha_mean", "alpha_stddev"}`` (scalars before ``softplus``)."""

        policy: Any
        critic: Any
        policy_target: Any
        critic_target: Any
        dual: Any

    class PolicyState(NamedTuple):
        """``count``: ``predict`` calls in training mode (random actions while below ``start_step``)."""

        count: jax.Array  # type: ignore[assignment]  # the seed's field name shadows tuple.count

    class PolicyOutput(NamedTuple):
        """``actions`` ``(B, D)`` in the environment's units, ``log_probs`` ``(B,)`` (of the sample
        before clipping; of the mean in evaluation)."""

        actions: jax.Array
        log_probs: jax.Array

    class OptimOutput(NamedTuple):
        """``update``'s figures before the step: the critic's and the policy's losses, the two KLs
        of the M-step, and the temperature ``eta``."""

        critic_loss: jax.Array
        policy_loss: jax.Array
        kl_mean: jax.Array
        kl_stddev: jax.Array
        temperature: jax.Array

    def __init__(
        self,
        network: Callable[[gym.Space], Any],
        env: Any,
        learning_rate: float | optax.Schedule,
        discount_factor: float = 0.99,
        tau: float = 0.005,
        n_action_samples: int = 20,
        epsilon: float = 0.1,
        epsilon_mean: float = 1e-2,
        epsilon_stddev: float = 1e-4,
        init_temperature: float = 1.0,
        init_alpha_mean: float = 1.0,
        init_alpha_stddev: float = 10.0,
        dual_learning_rate: float = 1e-2,
        start_step: int = 0,
        max_grad_norm: float | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(network, env, learning_rate)
        params = collection.MPOParams(
            gamma=discount_factor,
            tau=tau,
            n_action_samples=n_action_samples,
            epsilon=epsilon,
            epsilon_mean=epsilon_mean,
            epsilon_stddev=epsilon_stddev,
            init_temperature=init_temperature,
            init_alpha_mean=init_alpha_mean,
            init_alpha_stddev=init_alpha_stddev,
            dual_learning_rate=dual_learning_rate,
            start_step=start_step,
        )
        config = self.collection_config(params, max_grad_norm, seed=seed)
        self.algo_params = params
        actor, critic = self.network
        self.actor = Network(
            actor.init, _gaussian(actor, int(collection.check_action_space(self.action_space).shape[0]))
        )
        self.critic = _one_critic(critic)
        self.dual_tx = collection.dual_optimizer(params)
        self.use_collection(collection, config, learning_rate, max_grad_norm)

    # -- state -----------------------------------------------------------------------------------

    def init_params(self, rng: Any) -> Params:
        """Actor and critic initialised on dummy inputs (the targets copies), the duals at the
        ``init_*`` values (scalars). ``rng``: a PRNG key (a raw ``(2,)`` uint32 key) or an ``hk.PRNGSequence``.

        Raises:
            TypeError: if the actor's or the critic's outputs do not fit the action space (shapes
                checked on ``PROBE_BATCH`` zero observations), naming what was found and what is
                required.
        """
        actor_key, critic_key, obs, action = self.dummy_inputs(rng)
        policy, critic = self.actor.init(actor_key, obs), self.critic.init(critic_key, obs, action)
        # the outputs' shapes, checked now on PROBE_BATCH observations (_gaussian, _one_critic)
        probe_obs, probe_action = self.probe_inputs()
        mean, _ = jax.eval_shape(self.actor.apply, policy, probe_obs)
        self.check_actor_output(mean, "(mean, L) with mean")
        jax.eval_shape(self.critic.apply, critic, probe_obs, probe_action)
        policy_target, critic_target = jax.tree_util.tree_map(jnp.copy, (policy, critic))
        return MPO.Params(
            policy, critic, policy_target, critic_target, collection.initial_dual_params(self.algo_params)
        )

    def init_policy(self, rng: Any) -> PolicyState:
        """``PolicyState(count=0)``, an int32 scalar; ``rng`` (a raw ``(2,)`` uint32 PRNG key or an
        ``hk.PRNGSequence``) is not used."""
        del rng
        return MPO.PolicyState(jnp.zeros((), jnp.int32))

    def init_optimizer(self, params: Params, rng: Any) -> OptimState:
        """``OptimState(count=0, {"policy", "critic", "dual"} optimizer states)``: ``count`` an int32
        scalar, each optax state's moments of the shapes of its part of ``params`` (the ``Params``
        pytree); ``rng`` (a raw ``(2,)`` uint32 PRNG key or an ``hk.PRNGSequence``) is not used."""
        del rng
        opt_state = {
            "policy": self.tx.init(params.policy),
            "critic": self.tx.init(params.critic),
            "dual": self.dual_tx.init(params.dual),
        }
        return OptimState(jnp.zeros((), jnp.int32), opt_state)

    def collection_state(self, params: Params, optimizer_state: OptimState | None = None) -> collection.MPOState:
        """The collection's ``MPOState`` for these explicit parts (made on every call): ``params``
        (the ``Params`` pytree) and ``optimizer_state`` (``None``: no optimizer states, step 0)
        become its ``TrainState`` objects, their leaves' shapes kept; ``step`` an int32 scalar."""
        step = jnp.zeros((), jnp.int32) if optimizer_state is None else optimizer_state.count
        opt = {} if optimizer_state is None else optimizer_state.opt_state

        def train_state(
            apply_fn: Callable, name: str, params: Any, target: Any = None, tx: Any = self.tx
        ) -> TrainState:
            return TrainState(
                step=step, apply_fn=apply_fn, params=params, tx=tx, opt_state=opt.get(name), target_params=target
            )

        return collection.MPOState(
            actor=train_state(self.actor.apply, "policy", params.policy, params.policy_target),
            critic=train_state(self.critic.apply, "critic", params.critic, params.critic_target),
            dual=train_state(collection.dual_values, "dual", params.dual, tx=self.dual_tx),
        )

    # -- acting and learning ----------------------------------------------------------------------

    def _predict(
        self, params: Params, policy_state: PolicyState, obs: Any, key: jax.Array, evaluation: bool = False
    ) -> tuple[PolicyOutput, PolicyState]:
        state = self.collection_state(params)
        actions, log_probs = self._explore(state, key, obs, env_step=policy_state.count, deterministic=evaluation)
        count = policy_state.count if evaluation else policy_state.count + 1
        return MPO.PolicyOutput(actions, log_probs), MPO.PolicyState(count)

    def _update(
        self, params: Params, optimizer_state: OptimState, data: Mapping[str, Any]
    ) -> tuple[OptimOutput, Params, OptimState]:
        state, info = self.off_policy_update(
            self.collection_state(params, optimizer_state), data, optimizer_state.count
        )
        actor, critic, dual = state.actor, state.critic, state.dual
        assert critic is not None and dual is not None  # a full state
        output = MPO.OptimOutput(
            info["loss_critic"], info["loss_policy"], info["kl_mean"], info["kl_stddev"], info["temperature"]
        )
        new = MPO.Params(actor.params, critic.params, actor.target_params, critic.target_params, dual.params)
        opt_state = {"policy": actor.opt_state, "critic": critic.opt_state, "dual": dual.opt_state}
        return output, new, OptimState(critic.step, opt_state)
