"""The functional SAC: seed 002's stateless API over the collection's SAC
(``kitae.algos.collections.sac``).

``predict`` is the collection's ``explore`` (a sample of the tanh-Gaussian policy, uniform actions
for the first ``start_step`` training calls, the mean action in evaluation); ``update`` is the
collection's processing and one ``compute_gradients`` + ``apply_gradients`` step (twin critics
against Polyak-averaged targets, the actor, the learned temperature). Nothing else.

The network: ``network(action_space) -> (actor, critic)`` (Haiku or Flax each):
``actor.apply(params, obs (B, ...))`` returns ``(loc, log_std)`` ``(B, d)`` of the pre-tanh
Gaussian (bound ``log_std`` yourself; ``[-5, 2]`` is usual) or a
``kitae.distributions.TanhNormal``; ``critic.apply(params, obs, action (B, d))`` returns Q-values
``(B,)`` or ``(B, 1)``, actions in ``[-1, 1]``. ``n_critics`` copies of the critic are initialised
independently (a critic that is already an ensemble ``(k, B)`` takes ``n_critics=1``).

On a ``Discrete`` action space of ``n`` actions the same class is **discrete SAC**, as ``kitae
train sac`` on such a space (``kitae.algos.collections.sac_discrete``: expectations over actions,
a target entropy of ``target_entropy_scale * log n``): ``actor.apply(params, obs)`` returns the
logits ``(B, n)`` (or a ``kitae.distributions.Categorical``), ``critic.apply(params, obs)`` the
Q-values of every action ``(B, n)`` (no action input), and ``predict``'s actions are ``(B,)``
int32 in the space's own numbering.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import optax

from kitae.action_masks import refuse_action_mask
from kitae.algos.collections import sac as collection
from kitae.algos.collections import sac_discrete
from kitae.distributions import Categorical, TanhNormal
from kitae.functional.actor_critic import ActorCriticAgent
from kitae.functional.base import Network, OptimState, critic_ensemble
from kitae.functional.checks import OFF_POLICY_DATA_KEYS, PROBE_BATCH, check_output_shape, shape_text
from kitae.modules.pytree import TrainState

__all__ = ["SAC", "DATA_KEYS"]

DATA_KEYS = OFF_POLICY_DATA_KEYS
"""What ``SAC.update``'s ``data`` holds: ``kitae.functional.checks.OFF_POLICY_DATA_KEYS``
(``obs``, ``action`` in the environment's units, ``reward``, ``terminated``, ``next_obs``;
optionally ``key``)."""


def _tanh_normal(network: Network) -> Callable[[Any, Any], TanhNormal]:
    def apply(params: Any, observations: Any) -> TanhNormal:
        out = network.apply(params, observations)
        if isinstance(out, TanhNormal):
            return out
        if not (isinstance(out, tuple) and len(out) == 2):
            raise TypeError(
                f"SAC's actor must return (loc, log_std) or a kitae.distributions.TanhNormal; it returned "
                f"{type(out).__name__}"
            )
        loc, log_std = out
        return TanhNormal(loc, jnp.exp(jnp.broadcast_to(log_std, jnp.shape(loc))))

    return apply


def _categorical(network: Network) -> Callable[[Any, Any], Categorical]:
    def apply(params: Any, observations: Any) -> Categorical:
        out = network.apply(params, observations)
        return out if isinstance(out, Categorical) else Categorical(jnp.asarray(out, jnp.float32))

    return apply


def _discrete_critics(critic: Network, copies: int, n: int) -> Network:
    """``copies`` independently initialised copies of a ``Q(s, .)`` critic over ``n`` actions:
    ``init(key, obs)``, ``apply(params, obs) -> (N, B, n)`` (the layout discrete SAC's losses
    take): each copy's ``(B, n)``, or its ``k`` rows when the copy is itself an ensemble
    ``(k, B, n)``; anything else raises ``TypeError`` (while traced) naming the shape found."""

    def rows(params: Any, obs: Any) -> jax.Array:
        q = critic.apply(params, obs)
        batch = jax.tree_util.tree_leaves(obs)[0].shape[0]
        shape = getattr(q, "shape", None)
        if shape == (batch, n):
            return q[None]
        if isinstance(shape, tuple) and len(shape) == 3 and shape[1:] == (batch, n):
            return q
        raise TypeError(
            f"SAC's critic returned {shape_text(q)} for a batch of B={batch} observations, which is not allowed; "
            f"required: shape ({batch}, {n}), that is Q-values (B, n) with n={n} (one per action), or "
            f"(k, {batch}, {n}) for an ensemble of k critics"
        )

    if copies == 1:
        return Network(critic.init, rows)

    def init(key: jax.Array, obs: Any) -> Any:
        return jax.vmap(lambda k: critic.init(k, obs))(jax.random.split(key, copies))

    def apply(params: Any, obs: Any) -> jax.Array:
        q = jax.vmap(lambda p: rows(p, obs))(params)  # (copies, k, B, n)
        return q.reshape(-1, *q.shape[2:])

    return Network(init, apply)


def _alpha_apply(params: Any) -> jax.Array:
    return jnp.exp(params["log_alpha"])


class SAC(ActorCriticAgent):
    """Soft Actor-Critic as pure functions (seed 002's API), for 1-D ``Box`` actions with finite
    bounds, and discrete SAC for ``Discrete`` actions (see the module docstring).

    Args:
        network: ``network(action_space) -> (actor, critic)`` (see the module docstring).
        env: a Gymnasium environment or vector environment.
        learning_rate: Adam's, for the actor, the critics and the temperature; a float > 0 or an
            optax schedule.
        discount_factor, tau, alpha, autotune, target_entropy, target_entropy_scale, n_critics,
        policy_frequency, start_step: as ``kitae.algos.collections.sac.SACParams``'s ``gamma``, ``tau``, ...
            (validated there); ``start_step`` counts ``predict`` calls in training mode
            (``PolicyState.count``; default 0: the policy acts from the first call).
        max_grad_norm: global-norm clipping (``None``: none).
        seed: the default update keys are ``fold_in(PRNGKey(seed), OptimState.count)``.
    """

    collection_module = collection

    class Params(NamedTuple):
        """SAC's parameters: the actor's, the critics' (stacked when ``n_critics`` copies), their
        targets', and the temperature's ``{"log_alpha": ()}``."""

        policy: Any
        qvalue: Any
        qvalue_target: Any
        alpha: Any

    class PolicyState(NamedTuple):
        """``count``: ``predict`` calls in training mode (random actions while below ``start_step``)."""

        count: jax.Array  # type: ignore[assignment]  # the seed's field name shadows tuple.count

    class PolicyOutput(NamedTuple):
        """``actions`` ``(B, d)`` in the environment's units, ``log_probs`` ``(B,)`` (zeros in
        evaluation); discrete SAC: ``actions`` ``(B,)`` int32, ``log_probs`` of the actions taken."""

        actions: jax.Array
        log_probs: jax.Array

    class OptimOutput(NamedTuple):
        """``update``'s losses before the step: critics', actor's, temperature's, and ``alpha``."""

        critic_loss: jax.Array
        actor_loss: jax.Array
        alpha_loss: jax.Array
        alpha: jax.Array

    def __init__(
        self,
        network: Callable[[gym.Space], Any],
        env: Any,
        learning_rate: float | optax.Schedule,
        discount_factor: float = 0.99,
        tau: float = 0.005,
        alpha: float = 1.0,
        autotune: bool = True,
        target_entropy: float | None = None,
        target_entropy_scale: float = 0.89,
        n_critics: int = 2,
        policy_frequency: int = 1,
        start_step: int = 0,
        max_grad_norm: float | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(network, env, learning_rate)
        params = collection.SACParams(
            gamma=discount_factor,
            tau=tau,
            alpha=alpha,
            autotune=autotune,
            target_entropy=target_entropy,
            target_entropy_scale=target_entropy_scale,
            n_critics=n_critics,
            policy_frequency=policy_frequency,
            start_step=start_step,
        )
        config = self.collection_config(params, max_grad_norm, seed=seed)
        self.initial_alpha = alpha
        self.discrete = isinstance(self.action_space, gym.spaces.Discrete)
        actor, critic = self.network
        if self.discrete:
            self.actor = Network(actor.init, _categorical(actor))
            self.critic = _discrete_critics(critic, n_critics, int(self.action_space.n))  # type: ignore[attr-defined]
        else:
            self.actor = Network(actor.init, _tanh_normal(actor))
            self.critic = critic_ensemble(critic, n_critics)
        self.use_collection(sac_discrete if self.discrete else collection, config, learning_rate, max_grad_norm)

    def check_action_space(self, action_space: gym.Space) -> None:
        """A bounded 1-D ``Box`` or a ``Discrete`` space, and no ``"action_mask"`` in the
        observations (neither SAC reads masks)."""
        if not isinstance(action_space, gym.spaces.Discrete):
            try:
                collection.check_action_space(action_space)
            except ValueError as error:
                raise ValueError(
                    f"action_space={action_space} is not allowed for SAC; {error}, or a Discrete one (discrete SAC)"
                ) from None
        refuse_action_mask(self.observation_space, "SAC")

    # -- state -----------------------------------------------------------------------------------

    def init_params(self, rng: Any) -> Params:
        """Actor and critics initialised on dummy inputs (the targets a copy), ``log_alpha`` from
        ``alpha``.

        Raises:
            TypeError: if the actor's or the critic's outputs do not fit the action space (shapes
                checked on ``PROBE_BATCH`` zero observations), naming the shape found and the one
                required.
        """
        actor_key, critic_key, obs, action = self.dummy_inputs(rng)
        policy = self.actor.init(actor_key, obs)
        qvalue = self.critic.init(critic_key, obs) if self.discrete else self.critic.init(critic_key, obs, action)
        self._check_outputs(policy, qvalue)
        return SAC.Params(
            policy,
            qvalue,
            jax.tree_util.tree_map(jnp.copy, qvalue),
            {"log_alpha": jnp.asarray(math.log(self.initial_alpha), jnp.float32)},
        )

    def _check_outputs(self, policy: Any, qvalue: Any) -> None:
        obs, action = self.probe_inputs()
        if self.discrete:
            n = int(self.action_space.n)  # type: ignore[attr-defined]
            logits = jax.eval_shape(lambda p, o: self.actor.apply(p, o).logits, policy, obs)
            check_output_shape(
                logits,
                (PROBE_BATCH, n),
                "SAC's actor",
                f"logits (B, n) with n={n} for the action space {self.action_space}",
            )
            jax.eval_shape(self.critic.apply, qvalue, obs)  # _discrete_critics checks the shapes
            return

        def loc(params: Any, observations: Any) -> jax.Array:
            dist = self.actor.apply(params, observations)
            return jnp.broadcast_to(dist.loc, dist.base.shape)

        self.check_actor_output(jax.eval_shape(loc, policy, obs), "(loc, log_std) with loc")
        jax.eval_shape(self.critic.apply, qvalue, obs, action)  # critic_ensemble checks the shapes

    def init_policy(self, rng: Any) -> PolicyState:
        """``PolicyState(count=0)``, an int32 scalar; ``rng`` (a raw ``(2,)`` uint32 PRNG key or an
        ``hk.PRNGSequence``) is not used."""
        del rng
        return SAC.PolicyState(jnp.zeros((), jnp.int32))

    def init_optimizer(self, params: Params, rng: Any) -> OptimState:
        """``OptimState(count=0, {"policy", "qvalue", "alpha"} optimizer states)``: ``count`` an
        int32 scalar, each optax state's moments of the shapes of its part of ``params``;
        ``rng`` (a raw ``(2,)`` uint32 PRNG key or an ``hk.PRNGSequence``) is not used."""
        del rng
        opt_state = {
            "policy": self.tx.init(params.policy),
            "qvalue": self.tx.init(params.qvalue),
            "alpha": self.tx.init(params.alpha),
        }
        return OptimState(jnp.zeros((), jnp.int32), opt_state)

    def collection_state(self, params: Params, optimizer_state: OptimState | None = None) -> collection.SACState:
        """The collection's ``SACState`` for these explicit parts (made on every call): ``params``
        (the ``Params`` pytree: ``alpha`` ``{"log_alpha": ()}``, a scalar) and ``optimizer_state``
        (``None``: no optimizer states, step 0) as its ``TrainState`` objects, leaves' shapes kept."""
        step = jnp.zeros((), jnp.int32) if optimizer_state is None else optimizer_state.count
        opt = {} if optimizer_state is None else optimizer_state.opt_state

        def train_state(apply_fn: Callable, name: str, params: Any, target: Any = None) -> TrainState:
            return TrainState(
                step=step, apply_fn=apply_fn, params=params, tx=self.tx, opt_state=opt.get(name), target_params=target
            )

        return collection.SACState(
            policy=train_state(self.actor.apply, "policy", params.policy),
            qvalue=train_state(self.critic.apply, "qvalue", params.qvalue, params.qvalue_target),
            alpha=train_state(_alpha_apply, "alpha", params.alpha),
        )

    # -- acting and learning ----------------------------------------------------------------------

    def _predict(
        self, params: Params, policy_state: PolicyState, obs: Any, key: jax.Array, evaluation: bool = False
    ) -> tuple[PolicyOutput, PolicyState]:
        state = self.collection_state(params)
        actions, log_probs = self._explore(state, key, obs, policy_state.count, evaluation)
        count = policy_state.count if evaluation else policy_state.count + 1
        return SAC.PolicyOutput(actions, log_probs), SAC.PolicyState(count)

    def _update(
        self, params: Params, optimizer_state: OptimState, data: Mapping[str, Any]
    ) -> tuple[OptimOutput, Params, OptimState]:
        state, info = self.off_policy_update(
            self.collection_state(params, optimizer_state), data, optimizer_state.count
        )
        qvalue = state.qvalue
        assert qvalue is not None and state.alpha is not None  # a full state
        output = SAC.OptimOutput(info["loss_critic"], info["loss_actor"], info["loss_alpha"], info["alpha"])
        new = SAC.Params(state.policy.params, qvalue.params, qvalue.target_params, state.alpha.params)
        opt_state = {"policy": state.policy.opt_state, "qvalue": qvalue.opt_state, "alpha": state.alpha.opt_state}
        return output, new, OptimState(qvalue.step, opt_state)
