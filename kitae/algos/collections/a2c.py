"""Advantage Actor-Critic (A2C), the synchronous variant of Mnih et al. 2016's A3C
(https://arxiv.org/abs/1602.01783), as Stable-Baselines3 and rl-baselines3-zoo run it.

On the template of the collection (params, state, the four factories, ``compute_gradients`` /
``apply_gradients``, the agent class); what A2C shares with PPO it takes from
``kitae.algos.collections.ppo`` rather than copying it:

* **Network, acting, processing**: PPO's actor-critic (a categorical policy for ``Discrete(n)``,
  a diagonal Gaussian for a 1-D ``Box``; separate or shared encoders), PPO's ``explore`` and PPO's
  processing: GAE with ``terminated`` (no bootstrap) and ``truncated`` (bootstrap from the real
  final observation) kept apart. With ``gae_lambda=1`` (the default, SB3's) the advantages are
  the n-step returns of the rollout, bootstrapped from ``V`` at its end, minus ``V``.
  Observation and reward normalisation work as PPO's.
* **Loss** (``a2c_loss``): ``-mean(advantage * log_prob) + value_coef * mean((return -
  value)**2) - entropy_coef * mean(entropy)``, SB3's (no clipping, the value loss without 1/2).
* **One gradient step per rollout**, on the whole rollout: ``UpdateConfig.n_epochs`` must be 1 and
  ``batch_size`` the rollout's size (``max_buffer_size * n_envs * n_agents``); other values are
  refused when the agent is made.
* **RMSprop** as in the reference implementations (PyTorch's: ``alpha=0.99``, ``eps=1e-5``
  outside the square root; ``kitae.modules.optimizer.optimizer_factory``), or Adam
  (``optimizer="adam"``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp

import kitae.algos.collections.ppo as ppo
import kitae.config as cfg
from kitae.algos.gradients import BatchLike, as_batch, update_step_from_gradients
from kitae.config import AlgoParams, register_algo_params, validate_types
from kitae.modules.optimizer import OPTIMIZERS, n_gradient_steps, optimizer_factory
from kitae.types import AlgoType, Params

__all__ = [
    "A2CParams",
    "A2C",
    "a2c_loss",
    "check_config",
    "train_state_a2c_factory",
    "explore_factory",
    "process_experience_factory",
    "compute_gradients_factory",
    "apply_gradients_factory",
    "update_step_factory",
]

_require = cfg.check_algo_param


@register_algo_params
@dataclass
class A2CParams(AlgoParams):
    """A2C hyperparameters (defaults: Stable-Baselines3's A2C).

    The rollout length (SB3's ``n_steps``, default 5 there), the learning rate (7e-4 there), its
    annealing and gradient clipping (0.5) are in ``UpdateConfig`` (``max_buffer_size``,
    ``learning_rate``, ``learning_rate_annealing``, ``max_grad_norm``); ``n_epochs`` must be 1 and
    ``batch_size`` the whole rollout (one gradient step per rollout).

    Attributes:
        gamma: discount factor, in ``[0, 1]``.
        gae_lambda: GAE lambda in ``[0, 1]``; 1 gives n-step returns (SB3's default).
        entropy_coef: weight of the entropy bonus (>= 0).
        value_coef: weight of the value loss (>= 0).
        normalize_advantages: normalise the rollout's advantages (SB3: off).
        normalize_observations, observation_clip, normalize_rewards, reward_clip: as PPO's.
        hidden_sizes, activation, log_std_init: the actor-critic network, as PPO's.
        optimizer: ``"rmsprop"`` (SB3's, PyTorch's RMSprop) or ``"adam"``.
        rms_prop_alpha: RMSprop's smoothing constant, in ``(0, 1)``.
        rms_prop_eps: RMSprop's epsilon (> 0), added outside the square root.
    """

    gamma: float = 0.99
    gae_lambda: float = 1.0
    entropy_coef: float = 0.0
    value_coef: float = 0.5
    normalize_advantages: bool = False
    normalize_observations: bool = False
    observation_clip: float = 10.0
    normalize_rewards: bool = False
    reward_clip: float = 10.0
    hidden_sizes: tuple = (64, 64)
    activation: str = "tanh"
    log_std_init: float = 0.0
    optimizer: str = "rmsprop"
    rms_prop_alpha: float = 0.99
    rms_prop_eps: float = 1e-5

    def __post_init__(self) -> None:
        validate_types(self, "algo_params.")
        ppo.check_actor_critic_params(self)
        _require(self.optimizer in OPTIMIZERS, "optimizer", self.optimizer, f"one of {', '.join(OPTIMIZERS)}")
        _require(0.0 < self.rms_prop_alpha < 1.0, "rms_prop_alpha", self.rms_prop_alpha, "a float in (0, 1)")
        _require(0.0 < self.rms_prop_eps < math.inf, "rms_prop_eps", self.rms_prop_eps, "a finite float > 0")

    def unread_fields(self, config: cfg.AlgoConfig) -> dict[str, str]:
        """The fields a run of ``config`` does not read, each with what would make it read them
        (``kitae.config.unread_float_keys``): PPO's network's and normalisation's
        (``ppo.actor_critic_unread_fields``), and RMSprop's with ``optimizer="adam"``."""
        unread = ppo.actor_critic_unread_fields(self, config)
        if self.optimizer != "rmsprop":
            why = "read only with algo_params.optimizer=rmsprop"
            unread.update(rms_prop_alpha=why, rms_prop_eps=why)
        return unread


def check_config(config: cfg.AlgoConfig) -> None:
    """Refuses what A2C cannot train, when the agent is made: PPO's spaces
    (``ppo.check_spaces``), and an update that is not one gradient step on the whole rollout.

    Raises:
        ValueError: naming the field, its value and what is allowed.
    """
    ppo.check_spaces(config, "A2C")
    u, e = config.update_cfg, config.env_cfg
    if u.n_epochs != 1:
        raise ValueError(f"update_cfg.n_epochs={u.n_epochs} is not allowed for A2C; allowed: 1 (one gradient step)")
    rows = u.max_buffer_size * e.n_envs * e.n_agents
    if u.batch_size != rows:
        raise ValueError(
            f"update_cfg.batch_size={u.batch_size} is not allowed for A2C; allowed: {rows}, the whole rollout "
            f"(max_buffer_size {u.max_buffer_size} x n_envs {e.n_envs} x n_agents {e.n_agents}; in a preset, a "
            "config file or --set: 'rollout')"
        )


def a2c_loss(
    log_probs: jax.Array,
    entropies: jax.Array,
    values: jax.Array,
    returns: jax.Array,
    advantages: jax.Array,
    value_coef: float | jax.Array,
    entropy_coef: float | jax.Array,
) -> tuple[jax.Array, dict]:
    """A2C's loss on a batch ``(B,)`` of each input (``advantages`` and ``returns`` are data: no
    gradient flows into them).

    ``policy = -mean(advantages * log_probs)``, ``value = mean((returns - values)**2)``,
    ``entropy = mean(entropies)``; ``total = policy + value_coef * value - entropy_coef * entropy``.

    Returns:
        ``(total, {"loss_policy", "loss_value", "entropy", "loss_total"})``.
    """
    advantages, returns = jax.lax.stop_gradient(advantages), jax.lax.stop_gradient(returns)
    policy_loss = -jnp.mean(advantages * log_probs)
    value_loss = jnp.mean(jnp.square(returns - values))
    entropy = jnp.mean(entropies)
    total = policy_loss + value_coef * value_loss - entropy_coef * entropy
    return total, {"loss_policy": policy_loss, "loss_value": value_loss, "entropy": entropy, "loss_total": total}


def train_state_a2c_factory(
    key: jax.Array, config: cfg.AlgoConfig, *, preprocess_fn: Callable | None = None, tabulate: bool = False
) -> ppo.PPOState:
    """PPO's state (``ppo.train_state_ppo_factory``: the actor-critic and the normalisation
    statistics) with A2C's optimizer: ``optimizer_factory`` with ``algo_params.optimizer``
    (RMSprop by default), the ``UpdateConfig``'s learning rate, clipping and annealing. The
    arguments are ``train_state_ppo_factory``'s (``key`` a PRNG key (a raw ``(2,)`` uint32 key)); the statistics are
    ``(*obs_shape)`` and scalars, ``discounted_returns`` ``(n_envs * n_agents,)``.

    Raises:
        ValueError: for a config A2C cannot train (``check_config``).
    """
    check_config(config)
    p: A2CParams = config.algo_params
    u = config.update_cfg
    state = ppo.train_state_ppo_factory(key, config, preprocess_fn=preprocess_fn, tabulate=tabulate)
    tx = optimizer_factory(
        u.learning_rate,
        max_grad_norm=u.max_grad_norm,
        annealing_steps=n_gradient_steps(config, AlgoType.ON_POLICY) if u.learning_rate_annealing else None,
        optimizer=p.optimizer,
        rms_decay=p.rms_prop_alpha,
        rms_eps=p.rms_prop_eps,
    )
    ac = state.actor_critic
    return state.replace(actor_critic=ac.replace(tx=tx, opt_state=tx.init(ac.params)))


explore_factory = ppo.explore_factory
"""PPO's ``explore`` (a sample of the policy, or its mode)."""

process_experience_factory = ppo.process_experience_factory
"""PPO's processing: GAE over one environment's rollout (``PPOBatch``)."""


def compute_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``compute_gradients_fn(state, key, batch) -> (grads, info)`` on a ``PPOBatch`` (the
    whole rollout): the gradient of ``a2c_loss`` (advantages normalised first when
    ``normalize_advantages``)."""
    p: A2CParams = config.algo_params

    def compute_gradients_fn(state: ppo.PPOState, key: jax.Array, batch: BatchLike) -> tuple[Params, dict]:
        del key
        batch = as_batch(ppo.PPOBatch, batch)
        ac = state.actor_critic
        advantages = ppo.normalize_advantages(batch.advantage) if p.normalize_advantages else batch.advantage

        def loss_fn(params: Params) -> tuple[jax.Array, dict]:
            dist, values = ac.apply_fn(params, batch.observation)
            dist = ppo.apply_action_mask(dist, batch.observation)
            return a2c_loss(
                dist.log_prob(batch.action),
                dist.entropy(),
                values,
                batch.return_,
                advantages,
                p.value_coef,
                p.entropy_coef,
            )

        (_, info), grads = jax.value_and_grad(loss_fn, has_aux=True)(ac.params)
        return grads, info

    return compute_gradients_fn


apply_gradients_factory = ppo.apply_gradients_factory
"""PPO's: one optimizer step on the actor-critic."""


def update_step_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``update_step_fn(state, key, batch) -> (state, info)``: the one gradient step."""
    return update_step_from_gradients(compute_gradients_factory(config), apply_gradients_factory(config))


class A2C(ppo.PPO):
    """Advantage Actor-Critic (see the module docstring). PPO's agent class with A2C's factories:
    acting, the acting parameters and the statistics around the update are PPO's.

    Args:
        run_name, config (``algo_params`` an ``A2CParams``), preprocess_fn, tabulate, run_dir: as
            ``PPO``'s.

    Raises:
        TypeError: if ``config.algo_params`` is not an ``A2CParams``.
        ValueError: for spaces A2C cannot handle, or an update that is not one gradient step on
            the whole rollout (``check_config``).
    """

    algo_name = "A2C"
    params_class = A2CParams
    learning_params = ("gamma", "gae_lambda", "entropy_coef", "value_coef")

    @staticmethod
    def collection_factories() -> ppo.CollectionFactories:
        """A2C's check and factories (PPO's explore, processing and ``apply_gradients``)."""
        return ppo.CollectionFactories(
            check_config,
            train_state_a2c_factory,
            explore_factory,
            process_experience_factory,
            update_step_factory,
            compute_gradients_factory,
            apply_gradients_factory,
        )
