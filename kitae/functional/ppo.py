"""The functional PPO: seed 002's stateless API over the collection's PPO
(``kitae.algos.collections.ppo``).

``predict`` is the collection's ``explore`` (a sample of the policy, or its mode in evaluation);
``update`` is the collection's whole on-policy update (``kitae.algos.update.on_policy_update``):
GAE over the rollout with the collection's processing, then ``n_epochs`` epochs of shuffled
minibatches, each one ``compute_gradients`` + ``apply_gradients`` step. Nothing else.

The network: ``network(action_space) -> net`` whose ``apply(params, obs (B, ...))`` returns
``(policy, value)``: ``value`` ``(B,)`` (or ``(B, 1)``), and ``policy`` the logits ``(B, n)`` for
a ``Discrete`` space, ``(B, K, max(nvec))`` for a ``MultiDiscrete(nvec)`` / ``MultiBinary(K)``
one (one row per component; the classes a component lacks are ignored), ``(loc, log_std)`` for a
1-D ``Box`` (``log_std`` ``(B, d)`` or ``(d,)``;
the Gaussian lives in the policy's units, mapped to the box as the collection does: ``center +
half_range * u``), or a kitae distribution (``kitae.distributions.Categorical`` / ``MultiCategorical`` /
``DiagNormal``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import optax

import kitae.config as cfg
from kitae.algos.collections import ppo as collection
from kitae.algos.experience import ExperiencePipeline
from kitae.algos.update import UpdateHooks, on_policy_update, with_update_hooks
from kitae.buffer import Experience
from kitae.distributions import Categorical, DiagNormal, MultiCategorical, multi_categorical_valid
from kitae.functional.base import CollectionAgent, Network, OptimState, as_key
from kitae.functional.checks import (
    PROBE_BATCH,
    check_data_observations,
    check_output_shape,
    data_fields,
    dummy_observation,
    probe_observation,
    update_key,
)
from kitae.modules.policy import multi_discrete_nvec
from kitae.modules.pytree import TrainState

__all__ = ["PPO", "Params", "PolicyState", "PolicyOutput", "OptimOutput", "DATA_KEYS"]

DATA_KEYS = ("obs", "action", "log_prob", "reward", "terminated", "truncated", "next_obs")
"""What ``PPO.update``'s ``data`` holds: a rollout, leaves ``(T, E, ...)`` (time, environments):
``obs`` and ``next_obs`` ``(T, E, *obs_shape)`` (``next_obs`` the real next observation, the final
one where an episode ended), ``action`` ``(T, E)`` or ``(T, E, d)`` in the environment's units,
``log_prob`` ``(T, E)`` (``predict``'s), ``reward``, ``terminated``, ``truncated`` ``(T, E)``.
Optionally ``key``: the PRNG key of the minibatch shuffles (default ``fold_in(PRNGKey(seed),
OptimState.count)``)."""


def _distribution(policy: Any, discrete: bool | tuple[int, ...]) -> Any:
    if isinstance(policy, (Categorical, DiagNormal, MultiCategorical)):
        return policy
    if isinstance(discrete, tuple):  # MultiDiscrete / MultiBinary: classes per component
        logits = jnp.asarray(policy, jnp.float32)
        want = (len(discrete), max(discrete))
        if logits.shape[-2:] != want:
            raise TypeError(
                f"the network's policy output has shape {logits.shape}; allowed for the action space's components "
                f"{discrete}: logits (B, {want[0]}, {want[1]}), one row per component (classes a component lacks "
                "are ignored), or a kitae.distributions.MultiCategorical"
            )
        return MultiCategorical(logits, multi_categorical_valid(discrete))
    if discrete:
        return Categorical(jnp.asarray(policy, jnp.float32))
    if not (isinstance(policy, tuple) and len(policy) == 2):
        found = f"an array of shape {policy.shape}" if hasattr(policy, "shape") else type(policy).__name__
        raise TypeError(
            f"the network's policy output is {found}; allowed for a Box action space: (loc, log_std) "
            "or a kitae.distributions.DiagNormal"
        )
    loc, log_std = policy
    return DiagNormal(loc, jnp.exp(jnp.broadcast_to(log_std, jnp.shape(loc))))


def policy_kind(action_space: gym.Space) -> bool | tuple[int, ...]:
    """``actor_critic_apply``'s ``discrete`` for ``action_space``."""
    nvec = multi_discrete_nvec(action_space)
    return nvec if nvec is not None else isinstance(action_space, gym.spaces.Discrete)


def actor_critic_apply(network: Network, discrete: bool | tuple[int, ...]) -> Callable[..., Any]:
    """The collection's actor-critic ``apply_fn(params, obs, method=None)`` over a user network
    returning ``(policy, value)``: ``method="policy"`` gives the distribution, ``"value"`` the
    values ``(B,)``, ``None`` both. ``discrete``: ``True`` for a ``Discrete`` space, the classes
    per component for a ``MultiDiscrete`` / ``MultiBinary`` one (``multi_discrete_nvec``),
    ``False`` for a ``Box``."""

    def apply(params: Any, observations: Any, method: str | None = None) -> Any:
        out = network.apply(params, observations)
        if not (isinstance(out, tuple) and len(out) == 2):
            found = f"an array of shape {out.shape}" if hasattr(out, "shape") else type(out).__name__
            raise TypeError(f"PPO's network must return (policy, value); it returned {found}")
        policy, value = out
        value = jnp.asarray(value)
        value = value[..., 0] if value.ndim == 2 and value.shape[-1] == 1 else value
        dist = _distribution(policy, discrete)
        if method == "policy":
            return dist
        if method == "value":
            return value
        return dist, value

    return apply


class PPO(CollectionAgent):
    """Proximal Policy Optimization as pure functions (seed 002's API).

    Args:
        network: ``network(action_space) -> net``, ``net.apply(params, obs)`` returning
            ``(policy, value)`` (see the module docstring); Haiku or Flax.
        env: a Gymnasium environment or vector environment (``Discrete``, 1-D ``MultiDiscrete`` /
            ``MultiBinary`` or 1-D ``Box`` actions).
        learning_rate: Adam's, a float > 0 or an optax schedule (counted in gradient steps).
        discount_factor, gae_lambda, clip_coef, entropy_coef, value_coef, clip_value_loss,
        normalize_advantages: as ``kitae.algos.collections.ppo.PPOParams``'s ``gamma``,
            ``gae_lambda``, ...; validated there (an error names the field).
        n_epochs: epochs over each rollout (>= 1).
        batch_size: rows per minibatch (>= 1; a rollout of ``T * E`` rows makes
            ``T * E // batch_size`` minibatches per epoch).
        max_grad_norm: global-norm clipping (``None``: none).
        seed: the default shuffle keys are ``fold_in(PRNGKey(seed), OptimState.count)``.

    Raises:
        TypeError: for a network creator or environment that is not allowed.
        ValueError: for an action space PPO cannot act in, or a hyperparameter out of range.
    """

    # Box actions are not held to the bounds: a rollout may hold the Gaussian's samples, which the
    # log-probabilities are of, before the environment clips them.
    check_box_action_bounds = False

    class Params(NamedTuple):
        """PPO's parameters: the actor-critic network's."""

        network: Any

    class PolicyState(NamedTuple):
        """What acting carries: ``count``, the ``predict`` calls in training mode (PPO reads none)."""

        count: jax.Array  # type: ignore[assignment]  # the seed's field name shadows tuple.count

    class PolicyOutput(NamedTuple):
        """``predict``'s output: ``actions`` ``(B,)`` / ``(B, d)`` in the environment's units and
        their ``log_probs`` ``(B,)`` under the policy (what ``update``'s ``log_prob`` wants)."""

        actions: jax.Array
        log_probs: jax.Array

    class OptimOutput(NamedTuple):
        """``update``'s losses, means over its gradient steps: ``loss`` (total), ``policy_loss``,
        ``value_loss``, ``entropy``, ``approx_kl``, ``clip_fraction``."""

        loss: jax.Array
        policy_loss: jax.Array
        value_loss: jax.Array
        entropy: jax.Array
        approx_kl: jax.Array
        clip_fraction: jax.Array

    def __init__(
        self,
        network: Callable[[gym.Space], Any],
        env: Any,
        learning_rate: float | optax.Schedule,
        discount_factor: float = 0.99,
        gae_lambda: float = 0.95,
        clip_coef: float = 0.2,
        entropy_coef: float = 0.01,
        value_coef: float = 0.5,
        clip_value_loss: bool = True,
        normalize_advantages: bool = True,
        n_epochs: int = 4,
        batch_size: int = 64,
        max_grad_norm: float | None = 0.5,
        seed: int = 0,
    ) -> None:
        super().__init__(network, env, learning_rate)
        params = collection.PPOParams(
            gamma=discount_factor,
            gae_lambda=gae_lambda,
            clip_coef=clip_coef,
            entropy_coef=entropy_coef,
            value_coef=value_coef,
            clip_value_loss=clip_value_loss,
            normalize_advantages=normalize_advantages,
        )
        self.use_on_policy_collection(collection, params, learning_rate, n_epochs, batch_size, max_grad_norm, seed)

    def use_on_policy_collection(
        self,
        module: Any,
        params: Any,
        learning_rate: float | optax.Schedule,
        n_epochs: int,
        batch_size: int,
        max_grad_norm: float | None,
        seed: int,
    ) -> cfg.AlgoConfig:
        """Takes the on-policy collection algorithm ``module``'s functions for ``params`` (its
        params dataclass of scalar hyperparameters: ``gamma``, ``clip_coef``, ...; no arrays),
        after checking ``n_epochs`` and ``batch_size``; returns the config.

        Raises:
            ValueError: for ``n_epochs`` or ``batch_size`` not an int >= 1.
        """
        for name, value in (("n_epochs", n_epochs), ("batch_size", batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} is not allowed; allowed: an int >= 1")
        config = self.collection_config(params, max_grad_norm, seed=seed, n_epochs=n_epochs, batch_size=batch_size)
        collection.check_spaces(config, type(self).__name__)
        self.n_epochs, self.batch_size = n_epochs, batch_size
        self._apply = actor_critic_apply(self.network, policy_kind(self.action_space))
        self.use_collection(module, config, learning_rate, max_grad_norm)
        self._pipeline = ExperiencePipeline([self._process], vectorized=True)
        self.hooks = UpdateHooks()
        return config

    def check_action_space(self, action_space: gym.Space) -> None:
        """Raises ``ValueError`` unless ``action_space`` is ``Discrete``, a 1-D ``MultiDiscrete`` or
        ``MultiBinary``, or a 1-D ``Box``."""
        ok = isinstance(action_space, gym.spaces.Discrete) or (
            isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
        )
        if not ok and multi_discrete_nvec(action_space) is None:
            raise ValueError(
                f"action_space={action_space} is not allowed for {type(self).__name__}; allowed: Discrete, a 1-D "
                "MultiDiscrete or MultiBinary, or a 1-D Box"
            )

    # -- state -----------------------------------------------------------------------------------

    value_shape: tuple[int, ...] = ()
    """The shape of one observation's value from the network (after a trailing ``1`` is
    dropped): PPO's a scalar, ``(B,)`` or ``(B, 1)`` for ``B`` observations."""
    value_allowed = "values (B,) or (B, 1)"

    def init_params(self, rng: Any) -> Params:
        """``Params(network)``: the network initialised on a dummy observation ``(1, *obs_shape)``.
        ``rng``: a PRNG key (a raw ``(2,)`` uint32 key) or an ``hk.PRNGSequence``.

        Raises:
            TypeError: if the network's outputs do not fit the action space
                (``check_network_outputs``).
        """
        network = self.network.init(as_key(rng), dummy_observation(self.observation_space))
        self.check_network_outputs(network)
        return PPO.Params(network)

    def check_network_outputs(self, network_params: Any) -> None:
        """Checks, on ``PROBE_BATCH`` zero observations (shapes only, nothing computed), that the
        network returns a policy over this action space (logits ``(B, n)``, ``(B, K, max(nvec))``,
        or ``(loc, log_std)`` of ``(B, d)`` actions) and values of ``value_shape`` per row.

        Raises:
            TypeError: naming the output, the shape found and the shape required.
        """
        space, name = self.action_space, type(self).__name__
        kind = policy_kind(space)
        expected: type
        want: tuple[int, ...]
        if isinstance(kind, tuple):
            expected, want = MultiCategorical, (len(kind), max(kind))
            allowed = f"logits (B, K, max(nvec)) with K={want[0]}, max(nvec)={want[1]} for the action space {space}"
        elif kind:
            expected, want = Categorical, (int(space.n),)  # type: ignore[attr-defined]
            allowed = f"logits (B, n) with n={want[0]} for the action space {space}"
        else:
            expected, want = DiagNormal, tuple(space.shape or ())
            allowed = f"(loc, log_std), loc (B, d) with d={want[0]} for the action space {space}"

        def outputs(params: Any, obs: Any) -> tuple[jax.Array, jax.Array]:
            dist, value = self._apply(params, obs)
            if not isinstance(dist, expected):
                raise TypeError(
                    f"{name}'s network returned a policy {type(dist).__name__}, which is not allowed for the action "
                    f"space {space}; allowed: {allowed}, or a kitae.distributions.{expected.__name__}"
                )
            if isinstance(dist, DiagNormal):
                return jnp.broadcast_to(dist.loc, dist.shape), value
            return dist.logits, value

        policy, value = jax.eval_shape(outputs, network_params, probe_observation(self.observation_space))
        check_output_shape(policy, (PROBE_BATCH, *want), f"{name}'s network (the policy)", allowed)
        check_output_shape(
            value, (PROBE_BATCH, *self.value_shape), f"{name}'s network (the values)", self.value_allowed
        )

    def init_policy(self, rng: Any) -> PolicyState:
        """``PolicyState(count=0)``, an int32 scalar; ``rng`` (a raw ``(2,)`` uint32 PRNG key or an
        ``hk.PRNGSequence``) is not used."""
        del rng
        return PPO.PolicyState(jnp.zeros((), jnp.int32))

    def init_optimizer(self, params: Params, rng: Any) -> OptimState:
        """``OptimState(count=0, opt_state)``: ``count`` an int32 scalar, the optax state's moments
        of the shapes of ``params.network``'s leaves; ``rng`` (a raw ``(2,)`` uint32 PRNG key or an
        ``hk.PRNGSequence``) is not used."""
        del rng
        return OptimState(jnp.zeros((), jnp.int32), self.tx.init(params.network))

    def collection_state(self, params: Params, optimizer_state: OptimState | None = None) -> collection.PPOState:
        """The collection's ``PPOState`` for these explicit parts (made on every call, never kept):
        ``params.network`` (its leaves' shapes kept) and ``optimizer_state`` (``None``: no optimizer
        state, step 0) in its ``TrainState``, with running statistics of shape ``()`` and
        ``discounted_returns`` ``(1,)`` (placeholders: the functional agent's ``PPOParams`` keep
        ``normalize_observations`` and ``normalize_rewards`` False)."""
        return collection.PPOState(
            actor_critic=TrainState(
                step=jnp.zeros((), jnp.int32) if optimizer_state is None else optimizer_state.count,
                apply_fn=self._apply,
                params=params.network,
                tx=self.tx,
                opt_state=None if optimizer_state is None else optimizer_state.opt_state,
            ),
            observation_statistics=collection.init_running_statistics(()),
            return_statistics=collection.init_running_statistics(()),
            discounted_returns=jnp.zeros((1,), jnp.float32),
        )

    # -- acting and learning ----------------------------------------------------------------------

    def _predict(
        self, params: Params, policy_state: PolicyState, obs: Any, key: jax.Array, evaluation: bool = False
    ) -> tuple[PolicyOutput, PolicyState]:
        actions, log_probs = self._explore(self.collection_state(params), key, obs, deterministic=evaluation)
        count = policy_state.count if evaluation else policy_state.count + 1
        return PPO.PolicyOutput(actions, log_probs), PPO.PolicyState(count)

    def rollout_update(self, state: Any, optimizer_state: OptimState, data: Mapping[str, Any]) -> tuple[Any, dict]:
        """The collection's whole on-policy update of ``state`` on the rollout ``data``
        (``DATA_KEYS``), between the agent's update hooks (``self.hooks``: none for PPO, RND's
        statistics for RND-PPO), with the key ``update_key(data, seed, optimizer_state.count)``.

        Returns:
            ``(state, info)``: the collection's new state and the means of its losses.
        """
        fields = data_fields(data, DATA_KEYS, type(self).__name__)
        check_data_observations(self.observation_space, data, "T, E", type(self).__name__)
        obs, action, log_prob, reward, terminated, truncated, next_obs = fields
        rollout = Experience(
            observation=obs,
            action=action,
            reward=reward,
            done=terminated,
            next_observation=next_obs,
            log_prob=log_prob,
            truncated=truncated,
        )
        key = update_key(data, self.seed, optimizer_state.count)
        batch_size = self.minibatch_rows(rollout)

        def whole_update(state: Any, key: jax.Array, rollout: Experience) -> tuple[Any, dict]:
            return on_policy_update(
                self._pipeline,
                self._update_step,
                state,
                key,
                rollout,
                n_epochs=self.n_epochs,
                batch_size=batch_size,
            )

        return with_update_hooks(self.hooks, whole_update)(state, key, rollout)

    def minibatch_rows(self, rollout: Experience) -> int:
        """Rows per minibatch for this rollout (static): ``batch_size``."""
        del rollout
        return self.batch_size

    def _update(
        self, params: Params, optimizer_state: OptimState, data: Mapping[str, Any]
    ) -> tuple[OptimOutput, Params, OptimState]:
        state, info = self.rollout_update(self.collection_state(params, optimizer_state), optimizer_state, data)
        ac = state.actor_critic
        output = PPO.OptimOutput(
            info["loss_total"],
            info["loss_policy"],
            info["loss_value"],
            info["entropy"],
            info["approx_kl"],
            info["clip_fraction"],
        )
        return output, PPO.Params(ac.params), OptimState(ac.step, ac.opt_state)


Params = PPO.Params
PolicyState = PPO.PolicyState
PolicyOutput = PPO.PolicyOutput
OptimOutput = PPO.OptimOutput
