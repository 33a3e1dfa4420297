"""Discrete SAC: soft actor-critic for ``Discrete`` action spaces (Christodoulou 2019,
https://arxiv.org/abs/1910.07207). ``kitae train sac ENV`` trains it when ENV's action space is
``Discrete``; the ``SAC`` agent class (``kitae.algos.collections.sac``) picks these factories.

With a categorical policy every expectation over actions is a sum, not a sample:

* **Critics**: twin Q-networks ``Q_i(s, .)`` over all actions, Polyak-averaged targets; the target
  ``y = r + gamma * (1 - terminated) * sum_a pi(a|s') (min_i Q_i,targ(s', a) - alpha log pi(a|s'))``
  and the loss ``0.5 * sum_i mean_b (Q_i(s_b, a_b) - y_b)^2`` (SAC's, ``sac.sac_critic_loss``'s form).
* **Actor**: ``mean_b sum_a pi(a|s_b) (alpha log pi(a|s_b) - min_i Q_i(s_b, a))``.
* **Temperature**: learned so that the policy's entropy tracks ``target_entropy``, by default
  ``target_entropy_scale * log(n)``, a fraction of the maximum entropy ``log(n)``:
  loss ``-log_alpha * mean_b (sum_a pi(a|s_b) log pi(a|s_b) + target_entropy)``.

The state (``SACState``), the hyperparameters (``SACParams``), ``apply_gradients`` (the critics'
step and Polyak targets every step, the actor's and the temperature's every ``policy_frequency``)
and the agent class are SAC's. Actions are uniform random before ``start_step`` transitions.

Action masks are not supported: observations with an ``"action_mask"`` key are refused when the
agent is made (``kitae.action_masks.refuse_action_mask``), as continuous SAC refuses them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp

import kitae.algos.collections.sac as sac
import kitae.config as cfg
from kitae.action_masks import refuse_action_mask
from kitae.algos.gradients import BatchLike, as_batch, update_step_from_gradients
from kitae.algos.utils import critic_td_errors, n_step_gamma, weighted_mean
from kitae.distributions import Categorical
from kitae.modules.optimizer import optimizer_from_config
from kitae.modules.policy import policy_factory
from kitae.modules.pytree import TrainState
from kitae.modules.qvalue import qvalue_factory
from kitae.types import AlgoType, Params

__all__ = [
    "discrete_sac_targets",
    "discrete_sac_critic_loss",
    "taken_q_values",
    "discrete_sac_actor_loss",
    "discrete_sac_temperature_loss",
    "target_entropy",
    "train_state_factory",
    "explore_factory",
    "process_experience_factory",
    "compute_gradients_factory",
    "update_step_factory",
]


def _discrete(config: cfg.AlgoConfig) -> gym.spaces.Discrete:
    space = config.env_cfg.action_space
    assert isinstance(space, gym.spaces.Discrete)  # SAC picks this module for Discrete spaces only
    return space


def target_entropy(config: cfg.AlgoConfig) -> float:
    """``algo_params.target_entropy``, or ``target_entropy_scale * log(n)`` for ``n`` actions."""
    p: sac.SACParams = config.algo_params
    if p.target_entropy is not None:
        return float(p.target_entropy)
    return p.target_entropy_scale * math.log(_discrete(config).n)


def discrete_sac_targets(
    rewards: jax.Array,
    dones: jax.Array,
    next_probs: jax.Array,
    next_log_probs: jax.Array,
    next_q_values: jax.Array,
    alpha: jax.Array | float,
    gamma: jax.Array | float,
) -> jax.Array:
    """Soft targets ``r + gamma * (1 - done) * sum_a pi(a|s') (min_i Q'_i(s', a) - alpha log pi(a|s'))``.

    Shapes: ``rewards``, ``dones`` ``(B,)``; ``next_probs``, ``next_log_probs`` ``(B, n)``;
    ``next_q_values`` the target critics ``(N, B, n)``. Returns ``(B,)``, gradients stopped.
    """
    values = jnp.sum(next_probs * (jnp.min(next_q_values, axis=0) - alpha * next_log_probs), axis=-1)
    return jax.lax.stop_gradient(rewards + gamma * (1.0 - dones) * values)


def taken_q_values(q_values: jax.Array, actions: jax.Array) -> jax.Array:
    """Every critic's value of the actions taken: ``q_values`` ``(N, B, n)``, ``actions`` ``(B,)``
    indices -> ``(N, B)``."""
    return jnp.take_along_axis(q_values, jnp.asarray(actions, jnp.int32)[None, :, None], axis=-1)[..., 0]


def discrete_sac_critic_loss(
    q_values: jax.Array, actions: jax.Array, targets: jax.Array, weights: jax.Array | None = None
) -> jax.Array:
    """``0.5 * sum_i mean_b (Q_i(s_b, a_b) - y_b)^2``; ``q_values`` ``(N, B, n)``, ``actions``
    ``(B,)`` indices, ``targets`` ``(B,)``; ``weights``: prioritized replay's importance weights
    ``(B,)`` on each squared error, or ``None``."""
    return 0.5 * jnp.sum(weighted_mean(jnp.square(taken_q_values(q_values, actions) - targets[None]), weights))


def discrete_sac_actor_loss(
    probs: jax.Array, log_probs: jax.Array, q_values: jax.Array, alpha: jax.Array | float
) -> jax.Array:
    """``mean_b sum_a pi(a|s_b) (alpha log pi(a|s_b) - min_i Q_i(s_b, a))``; ``probs``,
    ``log_probs`` ``(B, n)``, ``q_values`` ``(N, B, n)`` (constants), ``alpha`` a constant."""
    alpha = jax.lax.stop_gradient(alpha)
    q = jax.lax.stop_gradient(jnp.min(q_values, axis=0))
    return jnp.mean(jnp.sum(probs * (alpha * log_probs - q), axis=-1))


def discrete_sac_temperature_loss(
    log_alpha: jax.Array, probs: jax.Array, log_probs: jax.Array, target: jax.Array | float
) -> jax.Array:
    """``-log_alpha * mean_b (sum_a pi(a|s_b) log pi(a|s_b) + target)`` (the policy held
    constant): the temperature rises while the entropy is below ``target``. ``log_alpha`` a
    scalar, ``probs`` and ``log_probs`` ``(B, n)``, ``target`` a scalar; returns a scalar."""
    neg_entropy = jax.lax.stop_gradient(jnp.sum(probs * log_probs, axis=-1))
    return -jnp.mean(log_alpha * (neg_entropy + target))


def train_state_factory(
    key: jax.Array, config: cfg.AlgoConfig, *, preprocess_fn: Callable | None = None, tabulate: bool = False
) -> sac.SACState:
    """The actor (``policy_factory``: a categorical policy, ReLU, ``policy_hidden``), the critics
    (``qvalue_factory``: ``Q(s, .)`` per critic, ``q_hidden``, ``n_critics``; the targets a copy)
    and the temperature, each with its own Adam (``optimizer_from_config`` with its rate).
    ``key``: a PRNG key (a raw ``(2,)`` uint32 key); the networks are initialised on
    ``(1, *obs_shape)`` observations, the critics' ``apply_fn`` returns ``(n_critics, B, n)``,
    ``log_alpha`` is a float32 scalar.

    Raises:
        ValueError: for observations that carry an ``"action_mask"`` (``refuse_action_mask``):
            discrete SAC's policy, random actions and targets do not read masks, so a masked
            environment would get illegal actions.
    """
    p: sac.SACParams = config.algo_params
    observation_space, action_space = config.env_cfg.observation_space, config.env_cfg.action_space
    assert isinstance(action_space, gym.spaces.Discrete)  # SAC picks this module for Discrete only
    refuse_action_mask(observation_space, "SAC")
    policy_key, q_key = jax.random.split(key)
    policy = policy_factory(observation_space, action_space, hidden=p.policy_hidden, activation="relu")
    qvalue = qvalue_factory(observation_space, action_space, hidden=p.q_hidden, n_critics=p.n_critics)

    def policy_apply(params: Params, observations: Any) -> Categorical:
        return policy.apply(params, observations if preprocess_fn is None else preprocess_fn(observations))  # type: ignore[return-value]

    def q_apply(params: Params, observations: Any) -> jax.Array:
        q: jax.Array = qvalue.apply(params, observations if preprocess_fn is None else preprocess_fn(observations))  # type: ignore[assignment]
        return q[None] if p.n_critics == 1 else q  # (N, B, n)

    observation = sac._dummy_observation(observation_space, preprocess_fn)
    if tabulate:
        print(policy.tabulate(policy_key, observation))
        print(qvalue.tabulate(q_key, observation))
    policy_params, q_params = policy.init(policy_key, observation), qvalue.init(q_key, observation)

    def optimizer(learning_rate: float | None) -> Any:
        return optimizer_from_config(config, AlgoType.OFF_POLICY, learning_rate)

    return sac.SACState(
        policy=TrainState.create(apply_fn=policy_apply, params=policy_params, tx=optimizer(p.policy_learning_rate)),
        qvalue=TrainState.create(
            apply_fn=q_apply, params=q_params, target_params=q_params, tx=optimizer(p.q_learning_rate)
        ),
        alpha=TrainState.create(
            apply_fn=sac._alpha_apply,
            params={"log_alpha": jnp.asarray(math.log(p.alpha), jnp.float32)},
            tx=optimizer(p.alpha_learning_rate),
        ),
    )


def explore_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``explore_fn(state, key, observations, env_step=start_step, deterministic=False) ->
    (actions (B,) int32, log_probs (B,))``: a sample of the policy, uniform random actions while
    ``env_step < start_step``, the most likely action when ``deterministic`` (log-probs of the
    action taken)."""
    space = _discrete(config)
    n, offset = int(space.n), int(space.start)
    start_step = config.algo_params.start_step

    def explore_fn(
        state: sac.SACState, key: jax.Array, observations: Any, env_step: Any = start_step, deterministic: Any = False
    ) -> tuple[jax.Array, jax.Array]:
        sample_key, random_key = jax.random.split(key)
        dist = state.policy.apply_fn(state.policy.params, observations)
        sampled, log_probs = dist.sample_and_log_prob(sample_key)
        uniform = jax.random.randint(random_key, sampled.shape, 0, n)
        random = jnp.logical_and(jnp.asarray(env_step) < start_step, jnp.logical_not(deterministic))
        actions = jnp.where(deterministic, dist.mode(), jnp.where(random, uniform, sampled)).astype(jnp.int32)
        log_probs = jnp.where(random, -math.log(n), dist.log_prob(actions))
        return actions + offset, log_probs

    return jax.jit(explore_fn)


def process_experience_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``process_fn(state, key, experience) -> SACBatch``: actions as indices from 0 (the
    space's ``start`` removed), rewards and terminations as float32."""
    offset = int(_discrete(config).start)

    def process_fn(state: sac.SACState, key: jax.Array, experience: Any) -> sac.SACBatch:
        return sac.SACBatch(
            observation=experience.observation,
            action=jnp.asarray(experience.action, jnp.int32) - offset,
            reward=jnp.asarray(experience.reward, jnp.float32),
            done=jnp.asarray(experience.done, jnp.float32),
            next_observation=experience.next_observation,
            n_steps=getattr(experience, "n_steps", None),
            weight=getattr(experience, "weight", None),
        )

    return process_fn


def compute_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``compute_gradients_fn(state, key, batch) -> (grads, info)``: the critics', the
    actor's and (``autotune``) the temperature's gradients, in SAC's layout (``{"qvalue",
    "policy", "alpha"}``); ``info``: ``loss_critic``, ``loss_actor``, ``loss_alpha``, ``alpha``,
    ``entropy``."""
    p: sac.SACParams = config.algo_params
    gamma, autotune, target = p.gamma, p.autotune, target_entropy(config)
    prioritized = config.replay.prioritized

    def compute_gradients_fn(state: sac.SACState, key: jax.Array, batch: BatchLike) -> tuple[dict, dict]:
        del key  # expectations over actions: nothing is sampled
        batch = as_batch(sac.SACBatch, batch)
        policy, qvalue = state.policy, state.qvalue
        assert qvalue is not None and state.alpha is not None  # a full state
        log_alpha = state.alpha.params["log_alpha"]
        alpha = jnp.exp(log_alpha)
        next_dist = policy.apply_fn(policy.params, batch.next_observation)
        next_log_probs = jax.nn.log_softmax(next_dist.logits, axis=-1)
        targets = discrete_sac_targets(
            batch.reward,
            batch.done,
            jnp.exp(next_log_probs),
            next_log_probs,
            qvalue.apply_fn(qvalue.target_params, batch.next_observation),
            alpha,
            n_step_gamma(gamma, batch.n_steps),
        )
        critic_loss, q_grads = jax.value_and_grad(
            lambda q_params: discrete_sac_critic_loss(
                qvalue.apply_fn(q_params, batch.observation), batch.action, targets, batch.weight
            )
        )(qvalue.params)
        q_values = qvalue.apply_fn(qvalue.params, batch.observation)

        def actor_loss_fn(policy_params: Params) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
            log_probs = jax.nn.log_softmax(policy.apply_fn(policy_params, batch.observation).logits, axis=-1)
            probs = jnp.exp(log_probs)
            return discrete_sac_actor_loss(probs, log_probs, q_values, alpha), (probs, log_probs)

        (actor_loss, (probs, log_probs)), policy_grads = jax.value_and_grad(actor_loss_fn, has_aux=True)(policy.params)
        if autotune:
            alpha_loss, log_alpha_grad = jax.value_and_grad(discrete_sac_temperature_loss)(
                log_alpha, probs, log_probs, target
            )
        else:
            alpha_loss, log_alpha_grad = jnp.zeros((), jnp.float32), jnp.zeros_like(log_alpha)
        grads = {"qvalue": q_grads, "policy": policy_grads, "alpha": {"log_alpha": log_alpha_grad}}
        entropy = -jnp.mean(jnp.sum(probs * log_probs, axis=-1))
        info = {
            "loss_critic": critic_loss,
            "loss_actor": actor_loss,
            "loss_alpha": alpha_loss,
            "alpha": alpha,
            "entropy": entropy,
        }
        if prioritized:
            info["td_error"] = critic_td_errors(taken_q_values(q_values, batch.action), targets)
        return grads, info

    return compute_gradients_fn


def update_step_factory(config: cfg.AlgoConfig) -> Callable:
    """``compute_gradients`` then SAC's ``apply_gradients``."""
    return update_step_from_gradients(compute_gradients_factory(config), sac.apply_gradients_factory(config))


sac.DISCRETE_FACTORIES.update(
    train_state=train_state_factory,
    explore=explore_factory,
    process=process_experience_factory,
    compute_gradients=compute_gradients_factory,
)
