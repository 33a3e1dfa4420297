"""Proximal Policy Optimization (PPO), Schulman et al. 2017, https://arxiv.org/abs/1707.06347.

Why this module is long: one algorithm is one module, on the template every algorithm of the
collection follows (params with documented defaults, state, networks, the four factories, the losses
split into ``compute_gradients`` / ``apply_gradients``, the agent class), so that a reader finds the
whole algorithm in one place; its parts are small functions, each tested on its own.

An on-policy actor-critic with a clipped surrogate objective, written from kitae's four pure
factories (see the custom-agent guide) on ``kitae.base.OnPolicyAgent``:

* **Policies**: a categorical policy for ``Discrete(n)`` actions and a diagonal Gaussian with a
  state-independent learned log-std for 1-D ``Box(D,)`` actions. Other action spaces are refused
  when the agent is made.
* **Action masks** (``kitae.action_masks``): with an ``"action_mask"`` entry in ``Dict``
  observations, the categorical policy's logits are masked: ``explore`` samples only allowed
  actions, ``select_action`` picks the best allowed one, and the log-probabilities and entropy of
  the update are over the allowed actions of each stored observation.
* **Continuous actions**: the Gaussian works in ``[-1, 1]`` units; ``explore`` / ``select_action``
  return ``center + half_range * u`` in the environment's units (``center`` and ``half_range`` from
  the ``Box`` bounds; dimensions with an infinite bound are left unscaled). The raw sample is NOT
  clipped: ``make_vec_env`` clips actions before they reach the environment, so the buffer keeps
  the unclipped action and ``process_experience`` maps it back to ``u`` exactly, keeping the
  stored log-probabilities consistent with the ones recomputed in the update.
* **Advantages**: GAE through ``kitae.timesteps.compute_gae`` with ``terminated`` (no bootstrap)
  and ``truncated`` (bootstrap from ``V(next_observation)``, the real final observation) kept
  apart; the chain is cut at both.
* **Losses** (small pure functions, tested against hand-computed values): ``ppo_policy_loss``
  (clipped surrogate), ``ppo_value_loss`` (optionally clipped around the old values),
  the entropy bonus, and per-minibatch advantage normalisation (``normalize_advantages``).
* **Networks**: one ``TrainState`` holds the actor and the critic. With
  ``UpdateConfig.shared_encoder`` they share one encoder (params ``encoder``, ``policy_head``,
  ``value_head``); otherwise each has its own (``policy_encoder``, ``value_encoder``,
  ``policy_head``, ``value_head``). One optimizer (``optimizer_from_config`` with
  ``AlgoType.ON_POLICY``: Adam, global-norm clipping with ``UpdateConfig.max_grad_norm``, linear
  learning-rate annealing to 0 with ``UpdateConfig.learning_rate_annealing``) minimises
  ``policy_loss + value_coef * value_loss - entropy_coef * entropy``.
* **Minibatch epochs**: ``OnPolicyAgent`` runs ``n_epochs`` epochs of shuffled minibatches of
  ``batch_size`` transitions with ``kitae.loops.update.update_epoch``, all in one compiled call.

Running statistics (observation and reward normalisation)
---------------------------------------------------------
Both are optional (``normalize_observations``, ``normalize_rewards``) and live IN THE AGENT STATE
(``PPOState.observation_statistics``, ``return_statistics``, ``discounted_returns``), as plain
arrays updated by pure functions inside the compiled update, so checkpoints, resumption, and the
compiled loop see them like any parameter. They change in the two hooks ``OnPolicyAgent`` runs
around every update (``update_hooks_factory``; ``kitae.algos.update.UpdateHooks``), in every
executor, the distributed one's update made gradient step by gradient step included:

1. ``prepare``, with ``normalize_rewards``: the per-environment discounted return ``R <- gamma * R + r`` (reset to 0
   after each episode end, carried across rollouts in ``discounted_returns``) is run over the
   rollout, and its variance is merged into ``return_statistics`` (as in SB3's ``VecNormalize``);
   rewards are then divided by ``sqrt(var + 1e-8)`` and clipped to ``+-reward_clip`` before GAE.
   This happens BEFORE processing, so the rollout's own returns count.
2. the usual update: processing (GAE) and the minibatch epochs.
3. ``finish``, with ``normalize_observations``: the rollout's observations are merged into
   ``observation_statistics`` AFTER the epochs. The actions' stored log-probabilities were
   computed with the statistics in force during the rollout; keeping those statistics for the
   whole update keeps the probability ratios exactly 1 at the start of the first epoch. The next
   rollout then acts with the merged statistics. Observations are normalised as
   ``clip((obs - mean) / sqrt(var + 1e-8), -observation_clip, observation_clip)`` in ``explore``,
   ``select_action`` and ``process_experience`` (which hands normalised observations to the
   update).

The merge is the parallel-variance (Chan et al.) formula (``update_running_statistics``): with
counts ``n_a, n_b``, means ``m_a, m_b``, variances ``v_a, v_b`` and ``d = m_b - m_a``, ``n = n_a + n_b``,
``m = m_a + d * n_b / n`` and ``v = (v_a * n_a + v_b * n_b + d^2 * n_a * n_b / n) / n``. The
statistics start at ``count = 0, mean = 0, var = 1`` (the identity normalisation), so after the
first merge they are exactly the first batch's mean and (population) variance.

Example::

    import kitae.config as cfg
    from kitae.algos.collections.ppo import PPO, PPOParams
    from kitae.envs.make import make_vec_env

    env = make_vec_env("CartPole-v1", 4)
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=PPOParams(gamma=0.99, gae_lambda=0.95, clip_coef=0.2, entropy_coef=0.01),
        update_cfg=cfg.UpdateConfig(
            learning_rate=2.5e-4, learning_rate_annealing=True, max_grad_norm=0.5,
            max_buffer_size=128, batch_size=128, n_epochs=4,
        ),
        train_cfg=cfg.TrainConfig(n_env_steps=50_000),
        env_cfg=cfg.EnvConfig(
            task_name="CartPole-v1", observation_space=env.single_observation_space,
            action_space=env.single_action_space, n_envs=4,
        ),
    )
    agent = PPO("ppo-cartpole", config)
    stats = agent.train(env)  # closes env
    print(stats.mean_return(10))
    actions, _ = agent.select_action(env.observation_space.sample())  # greedy actions, (4,)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

import kitae.config as cfg
from kitae.action_masks import check_action_mask_space, get_action_mask
from kitae.algos.factory import explore_general_factory
from kitae.algos.gradients import BatchLike, as_batch, update_step_from_gradients
from kitae.algos.update import UpdateHooks, with_update_hooks
from kitae.base import OnPolicyAgent, agent_keys
from kitae.buffer import Experience
from kitae.config import AlgoParams, register_algo_params, validate_types
from kitae.distributions import Categorical
from kitae.modules.encoders import encoder_factory, get_activation, space_input_shape
from kitae.modules.modules import init_params
from kitae.modules.optimizer import optimizer_from_config
from kitae.modules.policy import CategoricalHead, MultiCategoricalHead, NormalHead, multi_discrete_nvec
from kitae.modules.pytree import AgentPyTree, TrainState
from kitae.modules.value import ValueHead
from kitae.timesteps import compute_gae, compute_vtrace
from kitae.types import AlgoType, Params

__all__ = [
    "PPOParams",
    "PPOState",
    "PPOBatch",
    "RunningStatistics",
    "SharedActorCritic",
    "SeparateActorCritic",
    "PPO",
    "ppo_policy_loss",
    "ppo_value_loss",
    "normalize_advantages",
    "approx_kl_and_clip_fraction",
    "ppo_loss",
    "init_running_statistics",
    "update_running_statistics",
    "normalize_with_statistics",
    "scale_rewards",
    "discounted_return_statistics",
    "update_return_statistics",
    "merge_observations",
    "update_observation_statistics",
    "check_spaces",
    "apply_action_mask",
    "train_state_ppo_factory",
    "explore_factory",
    "process_experience_factory",
    "compute_gradients_factory",
    "apply_gradients_factory",
    "update_step_factory",
    "update_hooks_factory",
    "episode_ends",
    "ppo_rollout_update_factory",
    "CollectionFactories",
]

STATISTICS_EPSILON = 1e-8
"""Added to variances before taking square roots when normalising."""

ADVANTAGE_EPSILON = 1e-8
"""Added to the advantages' standard deviation in ``normalize_advantages``."""


# ---------------------------------------------------------------------------------------------
# 1. Parameters
# ---------------------------------------------------------------------------------------------


_require = cfg.check_algo_param


@register_algo_params
@dataclass
class PPOParams(AlgoParams):
    """PPO hyperparameters (defaults: CleanRL's ``ppo.py``).

    The rollout length, minibatch size, epochs, learning rate, its annealing, gradient clipping
    and encoder sharing are in ``UpdateConfig`` (``max_buffer_size``, ``batch_size``, ``n_epochs``,
    ``learning_rate``, ``learning_rate_annealing``, ``max_grad_norm``, ``shared_encoder``).

    Attributes:
        gamma: discount factor, in ``[0, 1]``.
        gae_lambda: GAE lambda, in ``[0, 1]``.
        clip_coef: policy ratio clip range ``epsilon`` (> 0): ratios are clipped to
            ``[1 - clip_coef, 1 + clip_coef]``.
        clip_value_loss: clip the value prediction around the old value (CleanRL's ``clip_vloss``).
        value_clip_coef: the value clip range (> 0); ``None`` uses ``clip_coef``. Only used when
            ``clip_value_loss``.
        entropy_coef: weight of the entropy bonus (>= 0).
        value_coef: weight of the value loss (>= 0).
        normalize_advantages: normalise advantages to zero mean, unit std in each minibatch.
        normalize_observations: normalise observations with running statistics kept in the
            state (needs a ``Box`` observation space; see the module docstring).
        observation_clip: normalised observations are clipped to ``+-observation_clip`` (> 0;
            ``inf``: not clipped, as Gymnasium's ``NormalizeObservation``).
        normalize_rewards: divide rewards by the running std of the discounted return, kept in the
            state (see the module docstring).
        reward_clip: normalised rewards are clipped to ``+-reward_clip`` (> 0; ``inf``: not
            clipped).
        hidden_sizes: hidden layer sizes of the encoders (ints >= 1; ``()`` makes the encoders
            the identity, i.e. linear heads on the raw observation).
        activation: activation of the encoders, one of ``kitae.modules.encoders.get_activation``'s
            names (``"tanh"``, ``"relu"``, ...).
        log_std_init: initial log standard deviation of the Gaussian policy (Box actions only),
            in ``[-20, 2]``.
        advantage_estimator: ``"gae"`` (GAE over the rollout), or ``"vtrace"``: V-trace targets and
            advantages (``kitae.timesteps.compute_vtrace``, with ``gae_lambda`` as its ``lambda``),
            which correct for a rollout collected by an older policy than the one learning (the
            distributed executor's asynchronous collection, which picks it by default for PPO);
            the clipped ratio is then taken against the policy at the update's start.
        vtrace_rho_bar: V-trace's clip of the importance weights in its TD errors (> 0).
        vtrace_c_bar: V-trace's clip of its trace coefficients (> 0).
    """

    ADVANTAGE_ESTIMATORS: ClassVar[tuple[str, ...]] = ("gae", "vtrace")
    """The ``advantage_estimator`` values this params class accepts (its agent's processing
    computes them)."""

    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_coef: float = 0.2
    clip_value_loss: bool = True
    value_clip_coef: float | None = None
    entropy_coef: float = 0.01
    value_coef: float = 0.5
    normalize_advantages: bool = True
    normalize_observations: bool = False
    observation_clip: float = 10.0
    normalize_rewards: bool = False
    reward_clip: float = 10.0
    hidden_sizes: tuple = (64, 64)
    activation: str = "tanh"
    log_std_init: float = 0.0
    advantage_estimator: str = "gae"
    vtrace_rho_bar: float = 1.0
    vtrace_c_bar: float = 1.0

    def __post_init__(self) -> None:
        validate_types(self, "algo_params.")
        check_actor_critic_params(self)
        _require(
            self.advantage_estimator in self.ADVANTAGE_ESTIMATORS,
            "advantage_estimator",
            self.advantage_estimator,
            f"one of {self.ADVANTAGE_ESTIMATORS}",
        )
        for name in ("vtrace_rho_bar", "vtrace_c_bar"):
            _require(0.0 < getattr(self, name) < math.inf, name, getattr(self, name), "a finite float > 0")
        _require(0.0 < self.clip_coef < math.inf, "clip_coef", self.clip_coef, "a finite float > 0")
        _require(
            self.value_clip_coef is None or 0.0 < self.value_clip_coef < math.inf,
            "value_clip_coef",
            self.value_clip_coef,
            "a finite float > 0, or None to use clip_coef",
        )

    def unread_fields(self, config: cfg.AlgoConfig) -> dict[str, str]:
        """The fields a run of ``config`` does not read, each with what would make it read them
        (``kitae.config.unread_float_keys``: a sweep or a search of one trains the same run every
        time): V-trace's clips without ``advantage_estimator="vtrace"``, ``value_clip_coef``
        without ``clip_value_loss``, and the network's and normalisation's
        (``actor_critic_unread_fields``)."""
        unread = actor_critic_unread_fields(self, config)
        if self.advantage_estimator != "vtrace":
            why = "read only with algo_params.advantage_estimator=vtrace"
            unread.update(vtrace_rho_bar=why, vtrace_c_bar=why)
        if not self.clip_value_loss:
            unread["value_clip_coef"] = "read only with algo_params.clip_value_loss=true"
        return unread


def actor_critic_unread_fields(p: Any, config: cfg.AlgoConfig) -> dict[str, str]:
    """The fields of PPO's network and normalisation (shared with A2C) a run of ``config`` does
    not read: ``log_std_init`` (the Gaussian policy's) without a ``Box`` action space,
    ``observation_clip`` without ``normalize_observations``, ``reward_clip`` without
    ``normalize_rewards``; each with what would make it read them."""
    unread = {}
    if not isinstance(config.env_cfg.action_space, gym.spaces.Box):
        unread["log_std_init"] = f"read only for a Box action space, this run's is {config.env_cfg.action_space}"
    if not p.normalize_observations:
        unread["observation_clip"] = "read only with algo_params.normalize_observations=true"
    if not p.normalize_rewards:
        unread["reward_clip"] = "read only with algo_params.normalize_rewards=true"
    return unread


def check_actor_critic_params(p: Any) -> None:
    """Checks the fields PPO shares with the algorithms built on its network and processing (A2C):
    ``gamma``, ``gae_lambda``, ``entropy_coef``, ``value_coef``, ``observation_clip``,
    ``reward_clip``, ``hidden_sizes``, ``activation``, ``log_std_init``.

    Raises:
        ValueError: naming the field, its value and what is allowed.
    """
    _require(0.0 <= p.gamma <= 1.0, "gamma", p.gamma, "a float in [0, 1]")
    _require(0.0 <= p.gae_lambda <= 1.0, "gae_lambda", p.gae_lambda, "a float in [0, 1]")
    _require(0.0 <= p.entropy_coef < math.inf, "entropy_coef", p.entropy_coef, "a finite float >= 0")
    _require(0.0 <= p.value_coef < math.inf, "value_coef", p.value_coef, "a finite float >= 0")
    _require(p.observation_clip > 0.0, "observation_clip", p.observation_clip, "a float > 0 (inf: no clipping)")
    _require(p.reward_clip > 0.0, "reward_clip", p.reward_clip, "a float > 0 (inf: no clipping)")
    _require(
        all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in p.hidden_sizes),
        "hidden_sizes",
        p.hidden_sizes,
        "a tuple of ints >= 1 (possibly empty)",
    )
    try:
        get_activation(p.activation)
    except ValueError:
        _require(
            False,
            "activation",
            p.activation,
            "one of 'tanh', 'relu', 'gelu', 'elu', 'silu', 'swish', 'leaky_relu', 'sigmoid', 'identity'",
        )
    _require(-20.0 <= p.log_std_init <= 2.0, "log_std_init", p.log_std_init, "a float in [-20, 2]")


# ---------------------------------------------------------------------------------------------
# Spaces
# ---------------------------------------------------------------------------------------------


def check_spaces(config: cfg.AlgoConfig, name: str = "PPO") -> None:
    """Refuses spaces PPO (or ``name``, an algorithm built on PPO's network: A2C) cannot handle,
    when the agent is made.

    Accepted action spaces: ``Discrete(n)`` (categorical policy), one-dimensional
    ``MultiDiscrete(nvec)`` and ``MultiBinary(K)`` (one independent categorical per component) and
    ``Box`` of shape ``(D,)`` (diagonal Gaussian). Observation spaces: those
    ``kitae.modules.encoders.encoder_factory`` accepts; ``normalize_observations`` needs a ``Box``.

    Raises:
        ValueError: naming PPO, the space and what is accepted.
    """
    action_space = config.env_cfg.action_space
    discrete = isinstance(action_space, gym.spaces.Discrete) or multi_discrete_nvec(action_space) is not None
    box = isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1
    if not (discrete or box):
        raise ValueError(
            f"{name} cannot act in the action space {action_space!r}; {name} accepts Discrete(n) "
            "(categorical policy), a one-dimensional MultiDiscrete(nvec) or MultiBinary(K) (one categorical per "
            "component) or a one-dimensional Box of shape (D,) (diagonal Gaussian policy)"
        )
    observation_space = config.env_cfg.observation_space
    check_action_mask_space(observation_space, action_space, name)
    try:
        encoder_factory(observation_space, hidden=())
    except ValueError as error:
        raise ValueError(f"{name} cannot encode the observation space {observation_space!r}: {error}") from None
    if getattr(config.algo_params, "normalize_observations", False) and not isinstance(
        observation_space, gym.spaces.Box
    ):
        raise ValueError(
            f"{name}: algo_params.normalize_observations=True needs a Box observation space, got "
            f"{observation_space!r}; set algo_params.normalize_observations=False"
        )


class _ActionMap(NamedTuple):
    """Maps between the policy's actions and the environment's (static, from the action space)."""

    to_env: Callable[[jax.Array], jax.Array]
    from_env: Callable[[jax.Array], jax.Array]


def _action_map(action_space: gym.Space) -> _ActionMap:
    if isinstance(action_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)):
        start = np.asarray(action_space.start, np.int32)  # () or (K,)
        return _ActionMap(
            lambda a: a.astype(jnp.int32) + start,
            lambda a: jnp.asarray(a).astype(jnp.int32) - start,
        )
    if isinstance(action_space, gym.spaces.MultiBinary):
        dtype = action_space.dtype  # int8: what the environment's own samples are
        return _ActionMap(lambda a: a.astype(dtype), lambda a: jnp.asarray(a).astype(jnp.int32))
    if not isinstance(action_space, gym.spaces.Box):
        raise ValueError(f"PPO cannot act in the action space {action_space}; allowed: Discrete or a 1-D Box")
    low = np.asarray(action_space.low, np.float64)
    high = np.asarray(action_space.high, np.float64)
    finite = np.isfinite(low) & np.isfinite(high)
    low, high = np.where(finite, low, -1.0), np.where(finite, high, 1.0)  # identity where unbounded
    center = jnp.asarray((high + low) / 2.0, jnp.float32)
    half = jnp.asarray((high - low) / 2.0, jnp.float32)
    return _ActionMap(
        lambda u: center + half * u,
        lambda a: (jnp.asarray(a, jnp.float32) - center) / half,
    )


# ---------------------------------------------------------------------------------------------
# Running statistics
# ---------------------------------------------------------------------------------------------


class RunningStatistics(NamedTuple):
    """Running mean and (population) variance of a stream of batches (a pytree).

    Attributes:
        mean: ``(*shape)`` float32.
        var: ``(*shape)`` float32.
        count: ``()`` float32, the number of samples merged so far.
    """

    mean: jax.Array
    var: jax.Array
    count: jax.Array  # type: ignore[assignment]  # a field named like tuple.count: shadows the method on purpose


def init_running_statistics(shape: tuple[int, ...] = ()) -> RunningStatistics:
    """``count = 0, mean = 0, var = 1``: normalising with them is (almost) the identity."""
    return RunningStatistics(jnp.zeros(shape, jnp.float32), jnp.ones(shape, jnp.float32), jnp.zeros((), jnp.float32))


def update_running_statistics(stats: RunningStatistics, batch: jax.Array) -> RunningStatistics:
    """Merges a batch ``(N, *shape)`` into ``stats`` with the parallel-variance formula.

    After merging batches ``x_1, ..., x_k`` into ``init_running_statistics``, ``mean`` and ``var``
    are ``np.mean`` and ``np.var`` (ddof 0) of their concatenation, up to rounding.
    """
    batch = jnp.asarray(batch, jnp.float32)
    batch_count = jnp.asarray(batch.shape[0], jnp.float32)
    batch_mean = jnp.mean(batch, axis=0)
    batch_var = jnp.var(batch, axis=0)
    delta = batch_mean - stats.mean
    total = stats.count + batch_count
    mean = stats.mean + delta * batch_count / total
    m2 = stats.var * stats.count + batch_var * batch_count + jnp.square(delta) * stats.count * batch_count / total
    return RunningStatistics(mean, m2 / total, total)


def normalize_with_statistics(x: jax.Array, stats: RunningStatistics, clip: float) -> jax.Array:
    """``clip((x - mean) / sqrt(var + 1e-8), -clip, clip)``; ``x`` is ``(..., *shape)``."""
    x = jnp.asarray(x, jnp.float32)
    return jnp.clip((x - stats.mean) / jnp.sqrt(stats.var + STATISTICS_EPSILON), -clip, clip)


def _time_env_leaves(tree: Any) -> jax.Array:
    """Leaves ``(T, E)`` (dicts keyed by agent in multi-agent rollouts) -> ``(T, E * A)``."""
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.concatenate([jnp.reshape(x, (x.shape[0], -1)) for x in leaves], axis=1)


# ---------------------------------------------------------------------------------------------
# 2. State and networks
# ---------------------------------------------------------------------------------------------


class PPOState(AgentPyTree):
    """The PPO agent's state.

    Attributes:
        actor_critic: ``TrainState`` of a ``SharedActorCritic`` or ``SeparateActorCritic``
            (``apply_fn`` is the module's ``apply``; ``method="policy"`` / ``"value"``).
        observation_statistics: running statistics of the observations, ``(*obs_shape)`` for a
            ``Box`` observation space (``()`` otherwise); used when ``normalize_observations``.
        return_statistics: running statistics of the discounted returns, scalars; used when
            ``normalize_rewards``.
        discounted_returns: ``(n_envs * n_agents,)``, each environment's running discounted
            return, carried from one rollout to the next (``normalize_rewards``).
    """

    actor_critic: TrainState
    observation_statistics: RunningStatistics
    return_statistics: RunningStatistics
    discounted_returns: jax.Array


class SharedActorCritic(nn.Module):
    """Actor and critic on one shared encoder: params ``encoder``, ``policy_head``, ``value_head``.

    Attributes:
        encoder: observations ``(..., *obs_shape)`` -> features ``(..., F)``.
        policy_head: features -> a distribution with batch shape ``(...)``.
        value_head: features -> values ``(...)``.
        preprocess_fn: optional function applied to the (normalised) observations first.
    """

    encoder: nn.Module
    policy_head: nn.Module
    value_head: nn.Module
    preprocess_fn: Callable | None = None

    def _features(self, observations: Any) -> jax.Array:
        if self.preprocess_fn is not None:
            observations = self.preprocess_fn(observations)
        return self.encoder(observations)

    def policy(self, observations: Any) -> Any:
        """observations -> the policy's distribution (batch shape ``(...)``)."""
        return self.policy_head(self._features(observations))

    def value(self, observations: Any) -> jax.Array:
        """observations ``(..., *obs_shape)`` -> values ``(...)``."""
        return self.value_head(self._features(observations))

    def __call__(self, observations: Any) -> tuple[Any, jax.Array]:
        """observations ``(..., *obs_shape)`` -> ``(distribution with batch shape (...), values
        (...))`` with one pass through the encoder."""
        features = self._features(observations)
        return self.policy_head(features), self.value_head(features)


class SeparateActorCritic(nn.Module):
    """Actor and critic with their own encoders: params ``policy_encoder``, ``value_encoder``,
    ``policy_head``, ``value_head``.

    Attributes:
        policy_encoder, value_encoder: observations ``(..., *obs_shape)`` -> features ``(..., F)``.
        policy_head: features -> a distribution with batch shape ``(...)``.
        value_head: features -> values ``(...)``.
        preprocess_fn: optional function applied to the (normalised) observations first.
    """

    policy_encoder: nn.Module
    value_encoder: nn.Module
    policy_head: nn.Module
    value_head: nn.Module
    preprocess_fn: Callable | None = None

    def _preprocess(self, observations: Any) -> Any:
        return observations if self.preprocess_fn is None else self.preprocess_fn(observations)

    def policy(self, observations: Any) -> Any:
        """observations -> the policy's distribution (batch shape ``(...)``)."""
        return self.policy_head(self.policy_encoder(self._preprocess(observations)))

    def value(self, observations: Any) -> jax.Array:
        """observations ``(..., *obs_shape)`` -> values ``(...)``."""
        return self.value_head(self.value_encoder(self._preprocess(observations)))

    def __call__(self, observations: Any) -> tuple[Any, jax.Array]:
        """observations ``(..., *obs_shape)`` -> ``(distribution with batch shape (...), values
        (...))``."""
        observations = self._preprocess(observations)
        return (
            self.policy_head(self.policy_encoder(observations)),
            self.value_head(self.value_encoder(observations)),
        )


def policy_head(action_space: gym.Space, log_std_init: float) -> nn.Module:
    """The policy head of PPO and the algorithms built on its network (A2C, RND-PPO, recurrent
    PPO) for a space ``check_spaces`` accepted: ``CategoricalHead``, ``MultiCategoricalHead`` or a
    ``NormalHead`` whose log-std is one learned vector starting at ``log_std_init``."""
    if isinstance(action_space, gym.spaces.Discrete):
        return CategoricalHead(int(action_space.n))
    nvec = multi_discrete_nvec(action_space)
    if nvec is not None:
        return MultiCategoricalHead(nvec)
    if isinstance(action_space, gym.spaces.Box):
        return NormalHead(int(action_space.shape[0]), state_dependent_std=False, log_std_init=log_std_init)
    raise ValueError(f"PPO cannot act in the action space {action_space}; allowed: see check_spaces")


def _actor_critic_module(
    config: cfg.AlgoConfig, preprocess_fn: Callable | None, value_head: nn.Module | None = None
) -> nn.Module:
    p: PPOParams = config.algo_params
    head = policy_head(config.env_cfg.action_space, p.log_std_init)

    def encoder() -> nn.Module:
        return encoder_factory(config.env_cfg.observation_space, hidden=p.hidden_sizes, activation=p.activation)

    value_head = ValueHead() if value_head is None else value_head
    if config.update_cfg.shared_encoder:
        return SharedActorCritic(encoder(), head, value_head, preprocess_fn)
    return SeparateActorCritic(encoder(), encoder(), head, value_head, preprocess_fn)


def train_state_ppo_factory(
    key: jax.Array,
    config: cfg.AlgoConfig,
    *,
    preprocess_fn: Callable | None = None,
    tabulate: bool = False,
    value_head: nn.Module | None = None,
) -> PPOState:
    """Builds the PPO state: the actor-critic's ``TrainState`` and the normalisation statistics.

    Args:
        key: PRNG key for the parameters.
        config: the ``AlgoConfig`` (``algo_params`` a ``PPOParams``).
        preprocess_fn: optional function applied to (normalised) observations inside the networks.
        tabulate: print the network's table of layers and parameters.
        value_head: the critic's head, features ``(..., F)`` -> values (default ``ValueHead()``:
            ``(...)``; RND-PPO's has two outputs).

    Returns:
        A ``PPOState``.

    Raises:
        ValueError: for spaces PPO does not accept (``check_spaces``).
    """
    check_spaces(config)
    module = _actor_critic_module(config, preprocess_fn, value_head)
    observation_space = config.env_cfg.observation_space
    params = init_params(key, module, [space_input_shape(observation_space)], tabulate)
    obs_shape = observation_space.shape if isinstance(observation_space, gym.spaces.Box) else ()
    return PPOState(
        actor_critic=TrainState.create(
            apply_fn=module.apply,
            params=params,
            tx=optimizer_from_config(config, AlgoType.ON_POLICY),
        ),
        observation_statistics=init_running_statistics(tuple(obs_shape)),
        return_statistics=init_running_statistics(()),
        discounted_returns=jnp.zeros((config.env_cfg.n_envs * config.env_cfg.n_agents,), jnp.float32),
    )


def apply_action_mask(dist: Any, observations: Any) -> Any:
    """The policy's distribution restricted to the allowed actions of ``observations``: a
    ``Categorical`` with the mask of ``observations["action_mask"]`` (``(B, n)``) when the
    observations carry one (``kitae.action_masks``), ``dist`` unchanged otherwise."""
    mask = get_action_mask(observations)
    if mask is None:
        return dist
    return Categorical(dist.logits, mask)


def _observation_normalizer(config: cfg.AlgoConfig) -> Callable[[PPOState, Any], Any]:
    """``(state, observations) -> observations`` normalised with the state's statistics, or
    unchanged when ``normalize_observations`` is off."""
    p: PPOParams = config.algo_params
    if not p.normalize_observations:
        return lambda state, observations: observations
    return lambda state, observations: normalize_with_statistics(
        observations, state.observation_statistics, p.observation_clip
    )


# ---------------------------------------------------------------------------------------------
# 3. Explore
# ---------------------------------------------------------------------------------------------


def explore_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``explore_fn(state, key, observations, deterministic=False) -> (actions, log_probs)``.

    ``observations``: ``(B, *obs_shape)``, raw (normalised inside with the state's statistics
    when ``normalize_observations``). Returns actions ``(B,)`` int32 (``Discrete``, offset by the
    space's ``start``) or ``(B, D)`` float32 in the environment's units (``Box``: ``center +
    half_range * u`` with ``u`` the Gaussian sample, not clipped), and the log-probabilities
    ``(B,)`` of the policy's own sample (of ``u`` for ``Box``). ``deterministic=True`` (static)
    returns the mode (greedy action / Gaussian mean) and its log-probability. Observations with
    an ``"action_mask"`` restrict both to the allowed actions (``apply_action_mask``).
    """
    action_map = _action_map(config.env_cfg.action_space)
    normalize = _observation_normalizer(config)

    def explore_fn(
        state: PPOState, key: jax.Array, observations: Any, deterministic: bool = False
    ) -> tuple[jax.Array, jax.Array]:
        ac = state.actor_critic
        dist = ac.apply_fn(ac.params, normalize(state, observations), method="policy")
        dist = apply_action_mask(dist, observations)
        if deterministic:
            raw = dist.mode()
            log_probs = dist.log_prob(raw)
        else:
            raw, log_probs = dist.sample_and_log_prob(key)
        return action_map.to_env(raw), log_probs

    return jax.jit(explore_fn, static_argnames=("deterministic",))


def value_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``value_fn(state, observations) -> values``: the critic's ``V(observation)`` of raw
    observations ``(B, *obs_shape)`` (normalised inside as ``explore_fn`` does), ``(B,)``
    (``(B, 2)`` for RND-PPO's two heads). What acting reports besides the action
    (``PPO.act_extras``)."""
    normalize = _observation_normalizer(config)

    def value_fn(state: PPOState, observations: Any) -> jax.Array:
        ac = state.actor_critic
        return ac.apply_fn(ac.params, normalize(state, observations), method="value")

    return value_fn


# ---------------------------------------------------------------------------------------------
# 4. Process experience
# ---------------------------------------------------------------------------------------------


class PPOBatch(NamedTuple):
    """Processed transitions (leaves ``(T, ...)`` for one env, ``(B, ...)`` as minibatches).

    Attributes:
        observation: observations, normalised when ``normalize_observations``, ``(T, *obs_shape)``.
        action: the policy's actions: class indices from 0 (``Discrete``) ``(T,)`` int32, or the
            raw Gaussian sample ``u`` (``Box``) ``(T, D)``.
        log_prob: log-probability of ``action`` under the acting policy, ``(T,)``.
        value: ``V(observation)`` under the acting parameters, ``(T,)``.
        advantage: GAE advantages, ``(T,)``.
        return_: value targets ``advantage + value``, ``(T,)``.
    """

    observation: Any
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantage: jax.Array
    return_: jax.Array


def scale_rewards(p: PPOParams, state: PPOState, rewards: jax.Array) -> jax.Array:
    """Rewards ``(T, ...)`` as float32, and with ``normalize_rewards`` divided by the running std
    of the discounted return, ``sqrt(var + 1e-8)``, then clipped to ``+-reward_clip``."""
    rewards = jnp.asarray(rewards, jnp.float32)
    if not p.normalize_rewards:
        return rewards
    scale = jnp.sqrt(state.return_statistics.var + STATISTICS_EPSILON)
    return jnp.clip(rewards / scale, -p.reward_clip, p.reward_clip)


def process_experience_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``process_fn(state, key, experience) -> PPOBatch`` for ONE environment's rollout.

    ``experience`` is an ``Experience`` with leaves ``(T, ...)``. Computes ``V(obs)`` and
    ``V(next_obs)`` (``next_observation`` is the real next observation, the final one on
    truncation), scales rewards when ``normalize_rewards``, and runs ``compute_gae`` with
    ``terminated = done`` and ``truncated``: bootstrapping stops only at termination, the advantage
    chain is cut at both. Maps stored actions back to the policy's units.

    With ``advantage_estimator="vtrace"``: V-trace (``compute_vtrace``) with the importance
    weights of the current policy over the one that acted (the stored ``log_prob``) instead of
    GAE, and the batch's ``log_prob`` the current policy's (the clipped ratio's reference).
    """
    p: PPOParams = config.algo_params
    action_map = _action_map(config.env_cfg.action_space)
    normalize = _observation_normalizer(config)
    vtrace = getattr(p, "advantage_estimator", "gae") == "vtrace"  # A2C shares this processing

    def process_fn(state: PPOState, key: jax.Array, experience: Experience) -> PPOBatch:
        ac = state.actor_critic
        observations = normalize(state, experience.observation)
        next_observations = normalize(state, experience.next_observation)
        values = ac.apply_fn(ac.params, observations, method="value")
        next_values = ac.apply_fn(ac.params, next_observations, method="value")
        rewards = scale_rewards(p, state, experience.reward)
        actions = action_map.from_env(experience.action)
        log_probs = jnp.asarray(experience.log_prob, jnp.float32)
        if vtrace:
            behaviour = log_probs
            log_probs = jax.lax.stop_gradient(ac.apply_fn(ac.params, observations, method="policy").log_prob(actions))
            returns, advantages = compute_vtrace(
                rewards,
                values,
                next_values,
                experience.done,
                experience.truncated,
                log_probs - behaviour,
                p.gamma,
                p.gae_lambda,
                p.vtrace_rho_bar,
                p.vtrace_c_bar,
            )
        else:
            advantages, returns = compute_gae(
                rewards, values, next_values, experience.done, experience.truncated, p.gamma, p.gae_lambda
            )
        return PPOBatch(
            observation=observations,
            action=actions,
            log_prob=log_probs,
            value=values,
            advantage=advantages,
            return_=returns,
        )

    return process_fn


# ---------------------------------------------------------------------------------------------
# 5. Losses and update
# ---------------------------------------------------------------------------------------------


def ppo_policy_loss(
    log_probs: jax.Array, old_log_probs: jax.Array, advantages: jax.Array, clip_coef: float | jax.Array
) -> jax.Array:
    """Clipped surrogate loss (to minimise), a scalar.

    With ``ratio = exp(log_probs - old_log_probs)``:
    ``mean(max(-advantages * ratio, -advantages * clip(ratio, 1 - clip_coef, 1 + clip_coef)))``.

    Args:
        log_probs: ``(B,)`` log-probabilities under the current parameters.
        old_log_probs: ``(B,)`` log-probabilities under the acting policy.
        advantages: ``(B,)`` advantages (normalised or not).
        clip_coef: the clip range ``epsilon``.
    """
    ratio = jnp.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - clip_coef, 1.0 + clip_coef)
    return jnp.mean(jnp.maximum(unclipped, clipped))


def ppo_value_loss(
    values: jax.Array, old_values: jax.Array, returns: jax.Array, clip_coef: float | jax.Array | None
) -> jax.Array:
    """Value loss (to minimise), a scalar, with the 1/2 factor of CleanRL.

    * ``clip_coef=None``: ``0.5 * mean((values - returns)^2)``.
    * otherwise, with ``clipped = old_values + clip(values - old_values, -clip_coef, clip_coef)``:
      ``0.5 * mean(max((values - returns)^2, (clipped - returns)^2))``.

    Args:
        values: ``(B,)`` predictions under the current parameters.
        old_values: ``(B,)`` predictions when the rollout was processed.
        returns: ``(B,)`` targets.
        clip_coef: the clip range, or ``None`` for no clipping (static).
    """
    unclipped = jnp.square(values - returns)
    if clip_coef is None:
        return 0.5 * jnp.mean(unclipped)
    clipped_values = old_values + jnp.clip(values - old_values, -clip_coef, clip_coef)
    return 0.5 * jnp.mean(jnp.maximum(unclipped, jnp.square(clipped_values - returns)))


def normalize_advantages(advantages: jax.Array) -> jax.Array:
    """``(advantages - mean) / (std + 1e-8)`` over the minibatch ``(B,)``."""
    return (advantages - jnp.mean(advantages)) / (jnp.std(advantages) + ADVANTAGE_EPSILON)


def approx_kl_and_clip_fraction(
    log_probs: jax.Array, old_log_probs: jax.Array, clip_coef: float | jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Diagnostics: ``mean((ratio - 1) - log ratio)`` (the k3 KL estimator) and the fraction of
    ratios outside ``[1 - clip_coef, 1 + clip_coef]``, from ``log_probs`` and ``old_log_probs``
    ``(B,)`` (any matching shapes) and a scalar ``clip_coef``: two float32 scalars."""
    log_ratio = log_probs - old_log_probs
    ratio = jnp.exp(log_ratio)
    approx_kl = jnp.mean((ratio - 1.0) - log_ratio)
    clip_fraction = jnp.mean((jnp.abs(ratio - 1.0) > clip_coef).astype(jnp.float32))
    return approx_kl, clip_fraction


def ppo_loss(
    p: PPOParams,
    value_clip: float | None,
    log_probs: jax.Array,
    entropies: jax.Array,
    values: jax.Array,
    old_log_probs: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    advantages: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO's loss on rows ``(B,)`` and its info: ``ppo_policy_loss + value_coef * ppo_value_loss -
    entropy_coef * mean entropy``; info holds ``loss_policy``, ``loss_value``, ``entropy``,
    ``loss_total``, ``approx_kl``, ``clip_fraction``. Shared by PPO and recurrent PPO (whose rows
    are the steps of its sequences)."""
    policy_loss = ppo_policy_loss(log_probs, old_log_probs, advantages, p.clip_coef)
    value_loss = ppo_value_loss(values, old_values, returns, value_clip)
    entropy = jnp.mean(entropies)
    loss = policy_loss + p.value_coef * value_loss - p.entropy_coef * entropy
    approx_kl, clip_fraction = approx_kl_and_clip_fraction(jax.lax.stop_gradient(log_probs), old_log_probs, p.clip_coef)
    return loss, {
        "loss_policy": policy_loss,
        "loss_value": value_loss,
        "entropy": entropy,
        "loss_total": loss,
        "approx_kl": approx_kl,
        "clip_fraction": clip_fraction,
    }


def compute_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``compute_gradients_fn(state, key, batch) -> (grads, info)``.

    ``batch`` is a ``PPOBatch`` (or a tuple in its order) with leaves ``(B, ...)``. The loss is
    ``ppo_policy_loss + value_coef * ppo_value_loss - entropy_coef * mean entropy``; ``grads`` has
    the structure of ``state.actor_critic.params``. ``info`` holds scalars ``loss_policy``,
    ``loss_value``, ``entropy``, ``loss_total``, ``approx_kl``, ``clip_fraction``.
    """
    p: PPOParams = config.algo_params
    value_clip = (p.clip_coef if p.value_clip_coef is None else p.value_clip_coef) if p.clip_value_loss else None

    def compute_gradients_fn(state: PPOState, key: jax.Array, batch: BatchLike) -> tuple[Params, dict]:
        batch = as_batch(PPOBatch, batch)
        ac = state.actor_critic
        advantages = normalize_advantages(batch.advantage) if p.normalize_advantages else batch.advantage

        def loss_fn(params: Params) -> tuple[jax.Array, dict]:
            dist, values = ac.apply_fn(params, batch.observation)
            dist = apply_action_mask(dist, batch.observation)
            log_probs = dist.log_prob(batch.action)
            return ppo_loss(
                p, value_clip, log_probs, dist.entropy(), values, batch.log_prob, batch.value, batch.return_, advantages
            )

        (_, info), grads = jax.value_and_grad(loss_fn, has_aux=True)(ac.params)
        return grads, info

    return compute_gradients_fn


def apply_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``apply_gradients_fn(state, grads) -> state``: one optimizer step on the actor-critic
    (global-norm clipping and the learning-rate schedule are in the optimizer)."""

    def apply_gradients_fn(state: PPOState, grads: Params) -> PPOState:
        return state.replace(actor_critic=state.actor_critic.apply_gradients(grads=grads))

    return apply_gradients_fn


def update_step_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``update_step_fn(state, key, batch) -> (state, info)``, one gradient step on one
    minibatch: ``apply_gradients(compute_gradients(...))``."""
    return update_step_from_gradients(compute_gradients_factory(config), apply_gradients_factory(config))


# ---------------------------------------------------------------------------------------------
# Statistics around the whole update
# ---------------------------------------------------------------------------------------------


def discounted_return_statistics(
    statistics: RunningStatistics, running: jax.Array, rewards: Any, episode_ends: Any, gamma: float | jax.Array
) -> tuple[RunningStatistics, jax.Array]:
    """Runs each environment's discounted return over a rollout and merges its values into
    ``statistics`` (pure; PPO's reward scale and RND-PPO's intrinsic one).

    For each step, ``R <- gamma * R + r``; ``R`` is recorded, then reset to 0 where the episode
    ended. The recorded values ``(T * N,)`` are merged into ``statistics``.

    Args:
        statistics: scalar ``RunningStatistics``.
        running: ``(N,)``, each environment's ``R`` before the rollout.
        rewards: ``(T, E)`` (or a dict of them keyed by agent, ``N = E * A`` columns).
        episode_ends: bool, same layout (all False: a return that never resets).
        gamma: discount factor.

    Returns:
        ``(statistics, running)``: the merged statistics and each environment's ``R`` after the
        rollout ``(N,)``.
    """
    rewards = _time_env_leaves(rewards).astype(jnp.float32)
    ends = _time_env_leaves(episode_ends).astype(bool)

    def step(running: jax.Array, inputs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        reward, end = inputs
        running = gamma * running + reward
        return jnp.where(end, 0.0, running), running

    final, returns = jax.lax.scan(step, running, (rewards, ends))
    return update_running_statistics(statistics, returns.reshape(-1)), final


def update_return_statistics(state: PPOState, rewards: Any, episode_ends: Any, gamma: float) -> PPOState:
    """Runs each environment's discounted return over a rollout and merges it into the state
    (``discounted_return_statistics`` on ``state.return_statistics``, the final ``R`` kept in
    ``state.discounted_returns``).

    Args:
        state: the PPO state.
        rewards: ``(T, E)`` (or a dict of them keyed by agent, ``N = E * A`` columns).
        episode_ends: bool, same layout: ``done | truncated``.
        gamma: discount factor.
    """
    statistics, final = discounted_return_statistics(
        state.return_statistics, state.discounted_returns, rewards, episode_ends, gamma
    )
    return state.replace(return_statistics=statistics, discounted_returns=final)


def merge_observations(statistics: RunningStatistics, observations: Any) -> RunningStatistics:
    """``statistics`` (of shape ``obs_shape``) with a rollout's observations ``(T, E,
    *obs_shape)`` (or a dict of them keyed by agent) merged in (pure)."""
    shape = statistics.mean.shape
    leaves = jax.tree_util.tree_leaves(observations)
    batch = jnp.concatenate([jnp.reshape(x, (-1, *shape)) for x in leaves], axis=0)
    return update_running_statistics(statistics, batch)


def update_observation_statistics(state: PPOState, observations: Any) -> PPOState:
    """Merges a rollout's observations ``(T, E, *obs_shape)`` (or a dict of them keyed by agent)
    into ``state.observation_statistics``."""
    return state.replace(observation_statistics=merge_observations(state.observation_statistics, observations))


def update_hooks_factory(config: cfg.AlgoConfig) -> UpdateHooks:
    """Makes PPO's running statistics as the hooks ``OnPolicyAgent`` runs around every update
    (``kitae.algos.update.UpdateHooks``), each ``(state, rollout) -> state``, pure and jit-able:

    1. ``prepare`` (before processing), with ``normalize_rewards``: ``update_return_statistics``
       on the rollout, so that the rollout's own returns count in the scale of its rewards;
    2. ``finish`` (after the epochs), with ``normalize_observations``:
       ``update_observation_statistics`` with the rollout's observations (see the module
       docstring for why after).

    ``rollout`` is an ``Experience`` with leaves ``(T, E, ...)``. With an option off its hook is
    ``None``.
    """
    p: PPOParams = config.algo_params
    prepare = finish = None
    if p.normalize_rewards:

        def prepare(state: PPOState, rollout: Experience) -> PPOState:
            return update_return_statistics(state, rollout.reward, episode_ends(rollout), p.gamma)

    if p.normalize_observations:

        def finish(state: PPOState, rollout: Experience) -> PPOState:
            return update_observation_statistics(state, rollout.observation)

    return UpdateHooks(prepare, finish)


def episode_ends(rollout: Experience) -> Any:
    """Where the rollout's episodes ended, ``done | truncated`` (leaves ``(T, E)``; ``done`` alone
    when the rollout has no ``truncated``)."""
    if rollout.truncated is None:
        return rollout.done
    return jax.tree_util.tree_map(jnp.logical_or, rollout.done, rollout.truncated)


def ppo_rollout_update_factory(config: cfg.AlgoConfig, update_fn: Callable) -> Callable:
    """``update_fn(state, key, rollout) -> (state, info)`` with PPO's running statistics around it
    (``update_hooks_factory``; ``update_fn`` itself with both options off). ``PPO`` composes the
    same hooks through ``OnPolicyAgent``; this is the composition for a caller holding an update."""
    return with_update_hooks(update_hooks_factory(config), update_fn)


# ---------------------------------------------------------------------------------------------
# 6. The agent
# ---------------------------------------------------------------------------------------------


class CollectionFactories(NamedTuple):
    """What an agent class of the PPO family is made of: ``check(config)`` (raises for what it
    cannot train), the factories (``update_step`` is ``compute_gradients`` then
    ``apply_gradients``) and ``update_hooks(config)``, the running statistics around the update
    (default PPO's, ``update_hooks_factory``)."""

    check: Callable[[cfg.AlgoConfig], None]
    train_state: Callable
    explore: Callable
    process: Callable
    update_step: Callable
    compute_gradients: Callable
    apply_gradients: Callable
    update_hooks: Callable[[cfg.AlgoConfig], UpdateHooks] = update_hooks_factory


class PPO(OnPolicyAgent):
    """Proximal Policy Optimization (https://arxiv.org/abs/1707.06347).

    Implementation details follow CleanRL's ``ppo.py`` / ``ppo_continuous_action.py``
    (https://iclr-blog-track.github.io/2022/03/25/ppo-implementation-details/), with optional
    observation and reward normalisation kept in the state (see the module docstring).

    Args:
        run_name: name of the run (logs go to ``runs/<run_name>`` unless ``run_dir`` is given).
        config: an ``AlgoConfig`` whose ``algo_params`` is a ``PPOParams``.
        preprocess_fn: optional function applied to (normalised) observations inside the networks.
        tabulate: print the network's table of layers and parameters.
        run_dir: where logs go.

    Attributes:
        compute_gradients_fn: ``(state, key, batch) -> (grads, info)`` (pure).
        apply_gradients_fn: ``(state, grads) -> state`` (pure).

    Raises:
        TypeError: if ``config.algo_params`` is not a ``PPOParams``.
        ValueError: for an action space other than ``Discrete`` or a 1-D ``Box``, an observation
            space the encoders do not accept, or ``normalize_observations`` without a ``Box``
            observation space.
    """

    algo_name = "PPO"
    params_class: type = PPOParams

    learning_params: tuple[str, ...] = (
        "gamma",
        "gae_lambda",
        "clip_coef",
        "value_clip_coef",
        "entropy_coef",
        "value_coef",
    )
    """``algo_params`` fields that only learning reads (``kitae.distributed.Algorithm``'s
    ``update_algorithm_parameter`` changes them during training)."""

    def __init__(
        self,
        run_name: str,
        config: cfg.AlgoConfig,
        *,
        preprocess_fn: Callable | None = None,
        tabulate: bool = False,
        run_dir: str | None = None,
    ) -> None:
        if not isinstance(config, cfg.AlgoConfig):
            raise TypeError(f"config={type(config).__name__} is not allowed; allowed: a kitae.config.AlgoConfig")
        name, params_class = type(self).algo_name, type(self).params_class
        given = type(config.algo_params)
        # kitae's recurrent and RND PPOs extend PPOParams: their params are another algorithm's,
        # whose fields PPO would ignore (a user's own subclass of PPOParams is let through)
        if not isinstance(config.algo_params, params_class) or (
            given is not params_class and given.__module__.startswith("kitae.")
        ):
            raise TypeError(
                f"algo_params={given.__name__} is not allowed for {name}; allowed: a {params_class.__name__}"
            )
        factories = self.collection_factories()
        factories.check(config)
        super().__init__(
            run_name,
            config,
            factories.train_state,
            factories.explore,
            factories.process,
            factories.update_step,
            preprocess_fn=preprocess_fn,
            tabulate=tabulate,
            experience_type=Experience,
            run_dir=run_dir,
        )

    def _configure(self) -> None:
        super()._configure()
        config, factories = self.config, self.collection_factories()
        self.algo_params: Any = config.algo_params
        self.compute_gradients_fn = factories.compute_gradients(config)
        self.gradient_factories = (factories.compute_gradients, factories.apply_gradients)
        self.apply_gradients_fn = factories.apply_gradients(config)
        self.value_fn = explore_general_factory(value_factory(config), self.vectorized, self.parallel)

    @staticmethod
    def collection_factories() -> CollectionFactories:
        """The functions this agent class is made of (``A2C``, built on this class, names its own)."""
        return CollectionFactories(
            check_spaces,
            train_state_ppo_factory,
            explore_factory,
            process_experience_factory,
            update_step_factory,
            compute_gradients_factory,
            apply_gradients_factory,
        )

    def update_hooks(self, config: cfg.AlgoConfig) -> UpdateHooks:
        """The running statistics around the update: ``collection_factories().update_hooks``
        (PPO's: ``update_hooks_factory``)."""
        return self.collection_factories().update_hooks(config)

    def acting_params(self, state: PPOState) -> PPOState:
        """The state without the optimizer state (acting reads the parameters and the observation
        statistics): ``state`` is the agent's ``PPOState`` pytree; every leaf kept keeps its shape
        (``observation_statistics`` ``(*obs_shape)``, ``discounted_returns`` ``(n_envs * n_agents,)``)."""
        return state.replace(actor_critic=state.actor_critic.replace(opt_state=None))

    def act(
        self, acting_params: PPOState, key: jax.Array, observation: Any, env_step: Any, deterministic: bool = False
    ) -> tuple[jax.Array, jax.Array]:
        """Samples actions from the policy (pure; see ``BaseAgent.act``): observations
        ``(E, *obs_shape)`` -> ``(actions (E, ...), log_probs (E,))``, actions in the environment's
        units; ``deterministic``: the mode (greedy class / Gaussian mean). ``env_step`` is not used."""
        del env_step
        return self.explore_fn(
            acting_params, agent_keys(key, observation, self.parallel), observation, deterministic=deterministic
        )

    def act_extras(
        self, acting_params: PPOState, observation: Any, hidden: Any = None, start: Any = None
    ) -> dict[str, Any]:
        """``{"value": V(observation)}``, the critic's value of each observation ``(E,)`` (a dict
        keyed by agent in multi-agent mode); pure. ``hidden`` and ``start`` are not used."""
        del hidden, start
        return {"value": self.value_fn(acting_params, observation)}
