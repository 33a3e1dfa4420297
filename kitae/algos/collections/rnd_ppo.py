"""PPO with Random Network Distillation (RND-PPO), Burda et al. 2018, https://arxiv.org/abs/1810.12894.

Why this module is long: one algorithm is one module on the collection's template (params,
state, networks, RND's maths as small tested functions, the statistics hooks, the four
factories, the agent class), so that a reader finds RND-PPO in one place; PPO's parts are
imported from ``kitae.algos.collections.ppo``, not copied.

On the template of the collection (params, state, the four factories, ``compute_gradients`` /
``apply_gradients``, the agent class); what RND-PPO shares with PPO it takes from
``kitae.algos.collections.ppo`` rather than copying it: the policy (categorical for
``Discrete(n)``, diagonal Gaussian for a 1-D ``Box``), ``explore``, the clipped surrogate loss
(``ppo.ppo_loss``), the extrinsic GAE with termination and truncation kept apart, and PPO's
optional observation and reward normalisation for the actor-critic.

What RND adds (the paper's Algorithm 1; defaults: the paper and CleanRL's ``ppo_rnd_envpool.py``):

* **Two networks on the next observation** ``s'``: a fixed random **target** ``f`` (encoder, then
  ``Dense(rnd_feature_size)``) and a trained **predictor** ``f^`` (the same encoder shape, then
  two more ``Dense(rnd_feature_size)`` layers with the activation: deeper than the target, as in
  the paper). Both read ``s'`` normalised with their own running statistics and clipped to
  ``+-rnd_observation_clip`` (5 in the paper): ``clip((s' - mean) / sqrt(var + 1e-8), -5, 5)``.
* **Intrinsic reward** ``i_t = mean_k (f^(s'_t) - f(s'_t))_k^2`` (``rnd_prediction_error``; the
  paper's squared norm over ``rnd_feature_size``, a constant factor the normalisation removes),
  divided by ``sqrt(var + 1e-8)`` of a running variance of the **intrinsic discounted returns**
  ``R <- intrinsic_gamma * R + i``, a return per environment that never resets (as the paper's
  ``RewardForwardFilter``), without subtracting a mean (``normalize_intrinsic_rewards``).
* **Two value heads** on the critic's features (``ExtrinsicIntrinsicValueHead``: ``V_ext``,
  ``V_int``). The extrinsic GAE is PPO's (``gamma``, episodic). The intrinsic GAE is
  **non-episodic** (``intrinsic_gae``): it never cuts at an episode end and always bootstraps;
  the value after step ``t`` is ``V_int`` of the observation acted on next (``s_{t+1}``, the
  first of the next episode after an end: the intrinsic return runs on through it, as in the
  reference implementations), and after the rollout's last step ``V_int`` of its next
  observation.
* **Advantages** ``extrinsic_coef * A_ext + intrinsic_coef * A_int`` (paper: 2 and 1), then
  PPO's per-minibatch normalisation. The loss is ``ppo.ppo_loss`` with the extrinsic head (value
  loss clipped as PPO's) plus ``value_coef * 0.5 * mean((V_int - R_int)^2)`` (unclipped, as
  CleanRL's ``int_v_loss``).
* **Predictor loss** in the same gradient step (``rnd_loss``): the mean prediction error on a
  random ``update_proportion`` of each minibatch (the paper's proportion of experience used for
  training the predictor; 0.25). The predictor has its own Adam (the ``UpdateConfig``'s learning
  rate, clipping and annealing); the reference implementations put both networks in one Adam with
  one global-norm clip.

Running statistics, and their order around the update
------------------------------------------------------
All live IN THE AGENT STATE (``RNDPPOState``) as arrays changed by pure functions, so
checkpoints, resumption, the compiled loop and the distributed executor see them like parameters.
They change in the two hooks ``OnPolicyAgent`` runs around every update (``update_hooks_factory``):

1. ``prepare`` (before processing): PPO's reward statistics (``normalize_rewards``), then the
   **RND observation statistics** merge the rollout's next observations, then the **intrinsic
   return statistics** merge the rollout's intrinsic discounted returns (prediction errors of the
   current predictor on the observations normalised with the statistics just updated). Then
   processing normalises the rollout's intrinsic rewards with them. The paper updates the reward
   normalisation with each ``i_t`` during the rollout and normalises the batch after it, so the
   rollout's own returns count: the same here. It updates the observation normalisation with the
   batch after computing its rewards and before training the predictor; here it is updated
   before both, so that the rewards and the predictor's training see one normalisation, and the
   first rollout initialises the statistics before any intrinsic reward is computed (the paper
   steps a random policy for that first; kitae's executors have no such phase, and an untrained
   policy's first rollout plays its part).
2. processing (both GAEs) and the minibatch epochs.
3. ``finish`` (after the epochs): PPO's observation statistics of the actor-critic
   (``normalize_observations``), after the epochs for PPO's reason (the stored log-probabilities
   were computed with the statistics in force during the rollout).

Spaces: the actions of PPO (``Discrete(n)``, 1-D ``Box``), and a ``Box`` observation space (the
RND networks normalise observations per dimension); others are refused when the agent is made.

Example::

    $ kitae train rnd_ppo MountainCar-v0
    $ kitae train rnd_ppo gymnax:MountainCar-v0
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp

import kitae.algos.collections.ppo as ppo
import kitae.config as cfg
from kitae.algos.gradients import BatchLike, as_batch, update_step_from_gradients
from kitae.algos.update import UpdateHooks
from kitae.buffer import Experience
from kitae.config import register_algo_params
from kitae.modules.encoders import MLP, dense_init, encoder_factory, get_activation, space_input_shape
from kitae.modules.modules import init_params
from kitae.modules.optimizer import optimizer_from_config
from kitae.modules.pytree import TrainState
from kitae.timesteps import compute_gae
from kitae.types import AlgoType, Params

__all__ = [
    "RNDPPOParams",
    "RNDPPOState",
    "RNDPPOBatch",
    "RNDNetwork",
    "ExtrinsicIntrinsicValueHead",
    "RNDPPO",
    "check_config",
    "rnd_prediction_error",
    "normalize_intrinsic_rewards",
    "rnd_loss",
    "intrinsic_gae",
    "combine_advantages",
    "rnd_ppo_loss",
    "update_rnd_statistics",
    "train_state_rnd_ppo_factory",
    "explore_factory",
    "process_experience_factory",
    "compute_gradients_factory",
    "apply_gradients_factory",
    "update_step_factory",
    "update_hooks_factory",
]

_require = cfg.check_algo_param

ACTIVATIONS = "one of 'tanh', 'relu', 'gelu', 'elu', 'silu', 'swish', 'leaky_relu', 'sigmoid', 'identity'"


# ---------------------------------------------------------------------------------------------
# 1. Parameters
# ---------------------------------------------------------------------------------------------


@register_algo_params
@dataclass
class RNDPPOParams(ppo.PPOParams):
    """RND-PPO hyperparameters: PPO's (``PPOParams``, defaults CleanRL's ``ppo.py``; ``gamma``
    is the extrinsic discount, the paper's 0.999 by default) and RND's (defaults: the paper's
    and CleanRL's ``ppo_rnd_envpool.py``).

    Attributes:
        gamma: the extrinsic discount, in ``[0, 1]`` (paper: 0.999).
        intrinsic_gamma: the intrinsic discount, in ``[0, 1]`` (paper: 0.99).
        extrinsic_coef: weight of the extrinsic advantages, a finite float >= 0 (paper: 2).
        intrinsic_coef: weight of the intrinsic advantages, a finite float >= 0 (paper: 1).
        update_proportion: the fraction of each minibatch the predictor trains on, in ``(0, 1]``
            (paper: 0.25; each row is kept with this probability).
        rnd_hidden_sizes: hidden layers of the target's and the predictor's encoders (ints >= 1,
            possibly empty).
        rnd_feature_size: the size of the embedding the predictor learns to predict (an int >= 1).
        rnd_activation: activation of the RND networks (``"relu"``, ``"tanh"``, ...).
        rnd_observation_clip: the RND networks' normalised observations are clipped to
            ``+-rnd_observation_clip``, a finite float > 0 (paper: 5).
    """

    ADVANTAGE_ESTIMATORS = ("gae",)  # its processing computes GAE only

    gamma: float = 0.999
    intrinsic_gamma: float = 0.99
    extrinsic_coef: float = 2.0
    intrinsic_coef: float = 1.0
    update_proportion: float = 0.25
    rnd_hidden_sizes: tuple = (64, 64)
    rnd_feature_size: int = 64
    rnd_activation: str = "relu"
    rnd_observation_clip: float = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(0.0 <= self.intrinsic_gamma <= 1.0, "intrinsic_gamma", self.intrinsic_gamma, "a float in [0, 1]")
        for name in ("extrinsic_coef", "intrinsic_coef"):
            value = getattr(self, name)
            _require(0.0 <= value < math.inf, name, value, "a finite float >= 0")
        _require(0.0 < self.update_proportion <= 1.0, "update_proportion", self.update_proportion, "a float in (0, 1]")
        _require(
            all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in self.rnd_hidden_sizes),
            "rnd_hidden_sizes",
            self.rnd_hidden_sizes,
            "a tuple of ints >= 1 (possibly empty)",
        )
        _require(self.rnd_feature_size >= 1, "rnd_feature_size", self.rnd_feature_size, "an int >= 1")
        try:
            get_activation(self.rnd_activation)
        except ValueError:
            _require(False, "rnd_activation", self.rnd_activation, ACTIVATIONS)
        _require(
            0.0 < self.rnd_observation_clip < math.inf,
            "rnd_observation_clip",
            self.rnd_observation_clip,
            "a finite float > 0",
        )


def check_config(config: cfg.AlgoConfig) -> None:
    """Refuses what RND-PPO cannot train, when the agent is made: PPO's action spaces
    (``ppo.check_spaces``) and an observation space other than a ``Box`` (the RND networks read
    observations normalised per dimension with running statistics).

    Raises:
        ValueError: naming RND-PPO, the space and what is allowed.
    """
    ppo.check_spaces(config, "RND-PPO")
    space = config.env_cfg.observation_space
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(
            f"RND-PPO cannot read the observation space {space!r}; RND-PPO accepts a Box observation space "
            "(its RND networks normalise observations per dimension with running statistics)"
        )


# ---------------------------------------------------------------------------------------------
# 2. State and networks
# ---------------------------------------------------------------------------------------------


class RNDPPOState(ppo.PPOState):
    """The RND-PPO agent's state: PPO's (``actor_critic`` with two value outputs, the
    actor-critic's optional normalisation statistics) and RND's.

    Attributes:
        rnd_predictor: ``TrainState`` of the predictor ``RNDNetwork`` (its own Adam).
        rnd_target_params: the fixed random target ``RNDNetwork``'s parameters (never trained).
        rnd_observation_statistics: running statistics of the next observations the RND
            networks read, ``(*obs_shape)``.
        intrinsic_return_statistics: running statistics of the intrinsic discounted returns,
            scalars (their ``var`` scales the intrinsic rewards).
        intrinsic_discounted_returns: ``(n_envs * n_agents,)``, each environment's intrinsic
            discounted return, carried from one rollout to the next and never reset.
    """

    rnd_predictor: TrainState
    rnd_target_params: Params
    rnd_observation_statistics: ppo.RunningStatistics
    intrinsic_return_statistics: ppo.RunningStatistics
    intrinsic_discounted_returns: jax.Array


class RNDNetwork(nn.Module):
    """Normalised observations ``(..., *obs_shape)`` -> embeddings ``(..., feature_size)``:
    ``encoder``, then ``head_hidden`` layers ``Dense -> activation``, then ``Dense(feature_size)``
    (orthogonal init, as CleanRL's). The target has ``head_hidden=()``, the predictor two layers
    of ``feature_size``.

    Attributes:
        encoder: observations -> features ``(..., F)``.
        feature_size: the embedding's size.
        head_hidden: sizes of the layers between the encoder and the output.
        activation: their activation.
    """

    encoder: nn.Module
    feature_size: int
    head_hidden: tuple = ()
    activation: str = "relu"

    @nn.compact
    def __call__(self, observations: jax.Array) -> jax.Array:
        """observations ``(..., *obs_shape)`` -> ``(..., feature_size)``."""
        features = MLP(self.head_hidden, self.activation)(self.encoder(observations))
        return nn.Dense(self.feature_size, kernel_init=dense_init(None))(features)


class ExtrinsicIntrinsicValueHead(nn.Module):
    """Features ``(..., F)`` -> values ``(..., 2)``: ``[..., 0]`` the extrinsic value, ``[..., 1]``
    the intrinsic one (two linear heads on the critic's features, CleanRL's ``critic_ext`` and
    ``critic_int``; orthogonal init of scale 1, as PPO's ``ValueHead``)."""

    @nn.compact
    def __call__(self, features: jax.Array) -> jax.Array:
        """features ``(..., F)`` -> ``(..., 2)``."""
        return nn.Dense(2, kernel_init=dense_init(1.0))(features)


def rnd_networks(config: cfg.AlgoConfig) -> tuple[RNDNetwork, RNDNetwork]:
    """``(target, predictor)`` modules for the config (static: built again wherever needed)."""
    p: RNDPPOParams = config.algo_params

    def network(head_hidden: tuple) -> RNDNetwork:
        encoder = encoder_factory(
            config.env_cfg.observation_space, hidden=p.rnd_hidden_sizes, activation=p.rnd_activation
        )
        return RNDNetwork(encoder, p.rnd_feature_size, head_hidden, p.rnd_activation)

    return network(()), network((p.rnd_feature_size, p.rnd_feature_size))


def train_state_rnd_ppo_factory(
    key: jax.Array, config: cfg.AlgoConfig, *, preprocess_fn: Callable | None = None, tabulate: bool = False
) -> RNDPPOState:
    """Builds the RND-PPO state: PPO's (``ppo.train_state_ppo_factory`` with
    ``ExtrinsicIntrinsicValueHead``), the predictor's ``TrainState`` (Adam from the
    ``UpdateConfig``), the target's parameters and RND's statistics (``count = 0, mean = 0,
    var = 1``; intrinsic returns 0). ``(actor-critic, target, predictor)`` keys are
    ``split(key, 3)``. ``preprocess_fn`` is the actor-critic's (the RND networks read the
    normalised raw observations).

    Raises:
        ValueError: for a config RND-PPO cannot train (``check_config``).
    """
    check_config(config)
    ac_key, target_key, predictor_key = jax.random.split(key, 3)
    base = ppo.train_state_ppo_factory(
        ac_key, config, preprocess_fn=preprocess_fn, tabulate=tabulate, value_head=ExtrinsicIntrinsicValueHead()
    )
    target, predictor = rnd_networks(config)
    obs_shape = space_input_shape(config.env_cfg.observation_space)
    e = config.env_cfg
    return RNDPPOState(
        actor_critic=base.actor_critic,
        observation_statistics=base.observation_statistics,
        return_statistics=base.return_statistics,
        discounted_returns=base.discounted_returns,
        rnd_predictor=TrainState.create(
            apply_fn=predictor.apply,
            params=init_params(predictor_key, predictor, [obs_shape], tabulate),
            tx=optimizer_from_config(config, AlgoType.ON_POLICY),
        ),
        rnd_target_params=init_params(target_key, target, [obs_shape], tabulate),
        rnd_observation_statistics=ppo.init_running_statistics(tuple(config.env_cfg.observation_space.shape or ())),
        intrinsic_return_statistics=ppo.init_running_statistics(()),
        intrinsic_discounted_returns=jnp.zeros((e.n_envs * e.n_agents,), jnp.float32),
    )


# ---------------------------------------------------------------------------------------------
# The maths of RND, small pure functions (tested against hand-computed values)
# ---------------------------------------------------------------------------------------------


def rnd_prediction_error(predicted: jax.Array, target: jax.Array) -> jax.Array:
    """The prediction error per row, ``mean_k (predicted - target)_k^2``: ``(..., F)`` -> ``(...)``.
    It is the raw intrinsic reward and the predictor's loss per row."""
    return jnp.mean(jnp.square(predicted - target), axis=-1)


def normalize_intrinsic_rewards(errors: jax.Array, statistics: ppo.RunningStatistics) -> jax.Array:
    """Intrinsic rewards ``errors / sqrt(var + 1e-8)`` with ``var`` the running variance of the
    intrinsic discounted returns (no mean subtracted, no clipping: the paper's); any shape."""
    return errors / jnp.sqrt(statistics.var + ppo.STATISTICS_EPSILON)


def rnd_loss(errors: jax.Array, mask: jax.Array) -> jax.Array:
    """The predictor's loss on a minibatch: the mean of ``errors`` ``(B,)`` over the rows where
    ``mask`` ``(B,)`` holds, ``sum(errors * mask) / max(sum(mask), 1)`` (0 with no row kept)."""
    mask = mask.astype(errors.dtype)
    return jnp.sum(errors * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def intrinsic_gae(
    rewards: jax.Array,
    values: jax.Array,
    last_next_value: jax.Array,
    gamma: float | jax.Array,
    lambda_: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Non-episodic GAE over one environment's rollout: never cut, always bootstrapped.

    With ``V'_t = values[t + 1]`` for ``t < T - 1`` and ``V'_{T-1} = last_next_value``:
    ``delta_t = r_t + gamma * V'_t - values[t]``, ``A_t = delta_t + gamma * lambda_ * A_{t+1}``,
    returns ``A_t + values[t]`` (``kitae.timesteps.compute_gae`` with no episode end).

    Args:
        rewards: ``(T,)`` intrinsic rewards.
        values: ``(T,)`` ``V_int(s_t)``.
        last_next_value: ``()`` ``V_int`` of the rollout's last next observation.
        gamma: the intrinsic discount factor in ``[0, 1]``.
        lambda_: GAE's ``lambda`` in ``[0, 1]``.

    Returns:
        ``(advantages (T,), returns (T,))``.
    """
    next_values = jnp.concatenate([values[1:], jnp.reshape(last_next_value, (1,))])
    never = jnp.zeros(jnp.shape(rewards), bool)
    return compute_gae(rewards, values, next_values, never, None, gamma, lambda_)


def combine_advantages(
    extrinsic: jax.Array, intrinsic: jax.Array, extrinsic_coef: float | jax.Array, intrinsic_coef: float | jax.Array
) -> jax.Array:
    """``extrinsic_coef * extrinsic + intrinsic_coef * intrinsic``: advantages ``(T,)`` (any
    matching shapes), scalar coefficients; the result has the advantages' shape."""
    return extrinsic_coef * extrinsic + intrinsic_coef * intrinsic


def rnd_ppo_loss(
    p: RNDPPOParams,
    value_clip: float | None,
    log_probs: jax.Array,
    entropies: jax.Array,
    values: jax.Array,
    old_log_probs: jax.Array,
    old_values: jax.Array,
    returns: jax.Array,
    advantages: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The actor-critic's loss on rows ``(B,)``: ``ppo.ppo_loss`` with the extrinsic head
    (``values[:, 0]``, clipped around ``old_values[:, 0]`` when ``value_clip``) plus
    ``value_coef * 0.5 * mean((values[:, 1] - returns[:, 1])^2)``, the intrinsic head's loss
    (unclipped). ``values``, ``old_values``, ``returns``: ``(B, 2)``.

    Returns:
        ``(total, info)``, info ``ppo.ppo_loss``'s (``loss_value`` the extrinsic head's) with
        ``loss_value_intrinsic``, and ``loss_total`` the total.
    """
    loss, info = ppo.ppo_loss(
        p, value_clip, log_probs, entropies, values[:, 0], old_log_probs, old_values[:, 0], returns[:, 0], advantages
    )
    intrinsic = ppo.ppo_value_loss(values[:, 1], old_values[:, 1], returns[:, 1], None)
    total = loss + p.value_coef * intrinsic
    return total, {**info, "loss_value_intrinsic": intrinsic, "loss_total": total}


# ---------------------------------------------------------------------------------------------
# Statistics around the update
# ---------------------------------------------------------------------------------------------


def _env_columns(tree: Any) -> jax.Array:
    """Observations ``(T, E, *obs_shape)`` (a dict of them keyed by agent) -> ``(T, E * A,
    *obs_shape)``, the agents' columns side by side (``ppo.discounted_return_statistics``'s
    column order)."""
    leaves = jax.tree_util.tree_leaves(tree)
    return jnp.concatenate([jnp.asarray(x) for x in leaves], axis=1)


def _embed(network: RNDNetwork, params: Params, inputs: jax.Array) -> jax.Array:
    """``network.apply(params, inputs)``: ``(..., *obs_shape)`` -> ``(..., feature_size)``."""
    return cast(jax.Array, network.apply(params, inputs))


def _rnd_errors(config: cfg.AlgoConfig) -> Callable[[RNDPPOState, jax.Array], tuple[jax.Array, jax.Array]]:
    """``(state, next_observations (..., *obs_shape)) -> (errors (...), rnd_inputs)``: the
    prediction errors of the state's predictor on the observations normalised with the state's
    RND statistics and clipped, and those normalised observations."""
    p: RNDPPOParams = config.algo_params
    target, _ = rnd_networks(config)

    def errors_fn(state: RNDPPOState, next_observations: jax.Array) -> tuple[jax.Array, jax.Array]:
        inputs = ppo.normalize_with_statistics(
            next_observations, state.rnd_observation_statistics, p.rnd_observation_clip
        )
        predictor = state.rnd_predictor
        predicted = predictor.apply_fn(predictor.params, inputs)
        return rnd_prediction_error(predicted, _embed(target, state.rnd_target_params, inputs)), inputs

    return errors_fn


def update_rnd_statistics(
    state: RNDPPOState, next_observations: Any, errors_fn: Callable, intrinsic_gamma: float | jax.Array
) -> RNDPPOState:
    """RND's statistics with a rollout merged in (pure), in this order: the RND observation
    statistics with ``next_observations`` (leaves ``(T, E, *obs_shape)``), then the intrinsic
    return statistics with the rollout's intrinsic discounted returns (``R <- intrinsic_gamma * R
    + error``, per environment, never reset), the errors computed by ``errors_fn(state,
    observations)`` with the statistics just merged (see the module docstring for why)."""
    observations = _env_columns(next_observations)
    state = state.replace(
        rnd_observation_statistics=ppo.merge_observations(state.rnd_observation_statistics, observations)
    )
    errors, _ = errors_fn(state, observations)  # (T, E * A)
    statistics, running = ppo.discounted_return_statistics(
        state.intrinsic_return_statistics,
        state.intrinsic_discounted_returns,
        errors,
        jnp.zeros(errors.shape, bool),
        intrinsic_gamma,
    )
    return state.replace(intrinsic_return_statistics=statistics, intrinsic_discounted_returns=running)


def update_hooks_factory(config: cfg.AlgoConfig) -> UpdateHooks:
    """Makes RND-PPO's hooks around the update (``kitae.algos.update.UpdateHooks``), each
    ``(state, rollout) -> state``, pure:

    * ``prepare``: PPO's (``normalize_rewards``), then ``update_rnd_statistics`` with the
      rollout's next observations;
    * ``finish``: PPO's (``normalize_observations``, the actor-critic's statistics).

    ``rollout`` is an ``Experience`` with leaves ``(T, E, ...)``.
    """
    p: RNDPPOParams = config.algo_params
    ppo_hooks = ppo.update_hooks_factory(config)
    errors_fn = _rnd_errors(config)

    def prepare(state: RNDPPOState, rollout: Experience) -> RNDPPOState:
        if ppo_hooks.prepare is not None:
            state = ppo_hooks.prepare(state, rollout)
        return update_rnd_statistics(state, rollout.next_observation, errors_fn, p.intrinsic_gamma)

    return UpdateHooks(prepare, ppo_hooks.finish)


# ---------------------------------------------------------------------------------------------
# 3. Explore (PPO's) and 4. process experience
# ---------------------------------------------------------------------------------------------


explore_factory = ppo.explore_factory
"""PPO's ``explore`` (a sample of the policy, or its mode); it reads the actor-critic's policy only."""


class RNDPPOBatch(NamedTuple):
    """Processed transitions (leaves ``(T, ...)`` for one env, ``(B, ...)`` as minibatches).

    Attributes:
        observation: the actor-critic's observations (normalised when ``normalize_observations``),
            ``(T, *obs_shape)``.
        rnd_observation: the next observations as the RND networks read them (normalised with
            RND's statistics, clipped), ``(T, *obs_shape)``.
        action: the policy's actions (``ppo.PPOBatch``'s), ``(T,)`` or ``(T, D)``.
        log_prob: log-probability of ``action`` under the acting policy, ``(T,)``.
        value: ``(V_ext, V_int)(observation)`` under the acting parameters, ``(T, 2)``.
        advantage: the combined advantages ``extrinsic_coef * A_ext + intrinsic_coef * A_int``,
            ``(T,)``.
        return_: the value targets ``(R_ext, R_int)``, ``(T, 2)``.
    """

    observation: Any
    rnd_observation: jax.Array
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantage: jax.Array
    return_: jax.Array


def process_experience_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``process_fn(state, key, experience) -> RNDPPOBatch`` for ONE environment's rollout
    (``experience`` an ``Experience``, leaves ``(T, ...)``).

    Extrinsic: PPO's (rewards scaled with ``normalize_rewards``; ``compute_gae`` with
    ``terminated`` and ``truncated`` kept apart, ``gamma``). Intrinsic: the prediction errors on
    the next observations over ``sqrt(var)`` of the intrinsic returns
    (``normalize_intrinsic_rewards``), ``intrinsic_gae`` (non-episodic, ``intrinsic_gamma``).
    Both with ``gae_lambda``; then ``combine_advantages``.
    """
    p: RNDPPOParams = config.algo_params
    action_map = ppo._action_map(config.env_cfg.action_space)
    normalize = ppo._observation_normalizer(config)
    errors_fn = _rnd_errors(config)

    def process_fn(state: RNDPPOState, key: jax.Array, experience: Experience) -> RNDPPOBatch:
        del key
        ac = state.actor_critic
        observations = normalize(state, experience.observation)
        values = ac.apply_fn(ac.params, observations, method="value")  # (T, 2)
        next_values = ac.apply_fn(ac.params, normalize(state, experience.next_observation), method="value")
        ext_advantages, ext_returns = compute_gae(
            ppo.scale_rewards(p, state, experience.reward),
            values[:, 0],
            next_values[:, 0],
            experience.done,
            experience.truncated,
            p.gamma,
            p.gae_lambda,
        )
        errors, rnd_observations = errors_fn(state, experience.next_observation)
        int_rewards = normalize_intrinsic_rewards(errors, state.intrinsic_return_statistics)
        int_advantages, int_returns = intrinsic_gae(
            int_rewards, values[:, 1], next_values[-1, 1], p.intrinsic_gamma, p.gae_lambda
        )
        return RNDPPOBatch(
            observation=observations,
            rnd_observation=rnd_observations,
            action=action_map.from_env(experience.action),
            log_prob=jnp.asarray(experience.log_prob, jnp.float32),
            value=values,
            advantage=combine_advantages(ext_advantages, int_advantages, p.extrinsic_coef, p.intrinsic_coef),
            return_=jnp.stack([ext_returns, int_returns], axis=-1),
        )

    return process_fn


# ---------------------------------------------------------------------------------------------
# 5. Losses and update
# ---------------------------------------------------------------------------------------------


def compute_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``compute_gradients_fn(state, key, batch) -> (grads, info)``.

    ``batch`` is an ``RNDPPOBatch`` (or a tuple in its order), leaves ``(B, ...)``. ``grads`` is
    ``{"actor_critic": ..., "rnd_predictor": ...}``: the gradient of ``rnd_ppo_loss`` (advantages
    normalised per minibatch with ``normalize_advantages``) and of ``rnd_loss`` on the rows kept
    by ``uniform(key, (B,)) < update_proportion``. ``info``: ``rnd_ppo_loss``'s scalars and
    ``loss_rnd`` (the predictor's loss on the kept rows).
    """
    p: RNDPPOParams = config.algo_params
    value_clip = (p.clip_coef if p.value_clip_coef is None else p.value_clip_coef) if p.clip_value_loss else None
    target, _ = rnd_networks(config)

    def compute_gradients_fn(state: RNDPPOState, key: jax.Array, batch: BatchLike) -> tuple[Params, dict]:
        batch = as_batch(RNDPPOBatch, batch)
        ac, predictor = state.actor_critic, state.rnd_predictor
        advantages = ppo.normalize_advantages(batch.advantage) if p.normalize_advantages else batch.advantage

        def actor_critic_loss(params: Params) -> tuple[jax.Array, dict]:
            dist, values = ac.apply_fn(params, batch.observation)
            return rnd_ppo_loss(
                p,
                value_clip,
                dist.log_prob(batch.action),
                dist.entropy(),
                values,
                batch.log_prob,
                batch.value,
                batch.return_,
                advantages,
            )

        targets = _embed(target, state.rnd_target_params, batch.rnd_observation)
        mask = jax.random.uniform(key, (batch.advantage.shape[0],)) < p.update_proportion

        def predictor_loss(params: Params) -> jax.Array:
            return rnd_loss(rnd_prediction_error(predictor.apply_fn(params, batch.rnd_observation), targets), mask)

        (_, info), ac_grads = jax.value_and_grad(actor_critic_loss, has_aux=True)(ac.params)
        loss_rnd, predictor_grads = jax.value_and_grad(predictor_loss)(predictor.params)
        return {"actor_critic": ac_grads, "rnd_predictor": predictor_grads}, {**info, "loss_rnd": loss_rnd}

    return compute_gradients_fn


def apply_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``apply_gradients_fn(state, grads) -> state``: one optimizer step on the actor-critic
    and one on the predictor (each ``TrainState``'s own Adam)."""

    def apply_gradients_fn(state: RNDPPOState, grads: Params) -> RNDPPOState:
        return state.replace(
            actor_critic=state.actor_critic.apply_gradients(grads=grads["actor_critic"]),
            rnd_predictor=state.rnd_predictor.apply_gradients(grads=grads["rnd_predictor"]),
        )

    return apply_gradients_fn


def update_step_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``update_step_fn(state, key, batch) -> (state, info)``, one gradient step on one
    minibatch: ``apply_gradients(compute_gradients(...))``."""
    return update_step_from_gradients(compute_gradients_factory(config), apply_gradients_factory(config))


# ---------------------------------------------------------------------------------------------
# 6. The agent
# ---------------------------------------------------------------------------------------------


class RNDPPO(ppo.PPO):
    """PPO with Random Network Distillation (see the module docstring). PPO's agent class with
    RND-PPO's factories and hooks; acting is PPO's.

    Args:
        run_name, config (``algo_params`` an ``RNDPPOParams``), preprocess_fn, tabulate, run_dir:
            as ``PPO``'s.

    Raises:
        TypeError: if ``config.algo_params`` is not an ``RNDPPOParams``.
        ValueError: for an action space other than ``Discrete`` or a 1-D ``Box``, or an
            observation space other than a ``Box`` (``check_config``).
    """

    algo_name = "RND-PPO"
    params_class = RNDPPOParams
    learning_params = (
        *ppo.PPO.learning_params,
        "intrinsic_gamma",
        "extrinsic_coef",
        "intrinsic_coef",
        "update_proportion",
    )

    @staticmethod
    def collection_factories() -> ppo.CollectionFactories:
        """RND-PPO's check, factories and hooks (PPO's explore)."""
        return ppo.CollectionFactories(
            check_config,
            train_state_rnd_ppo_factory,
            explore_factory,
            process_experience_factory,
            update_step_factory,
            compute_gradients_factory,
            apply_gradients_factory,
            update_hooks_factory,
        )

    def acting_params(self, state: RNDPPOState) -> ppo.PPOState:  # type: ignore[override]
        """What acting reads: PPO's state (the actor-critic without its optimizer state, the
        actor-critic's statistics), without RND's networks and statistics. ``state`` is the agent's
        ``RNDPPOState`` pytree; every leaf kept keeps its shape (``observation_statistics``
        ``(*obs_shape)``, ``discounted_returns`` ``(n_envs * n_agents,)``)."""
        return ppo.PPOState(
            actor_critic=state.actor_critic.replace(opt_state=None),
            observation_statistics=state.observation_statistics,
            return_statistics=state.return_statistics,
            discounted_returns=state.discounted_returns,
        )

    def act_extras(
        self, acting_params: ppo.PPOState, observation: Any, hidden: Any = None, start: Any = None
    ) -> dict[str, Any]:
        """``{"value": V_ext(observation), "value_intrinsic": V_int(observation)}``, each ``(E,)``
        (dicts keyed by agent in multi-agent mode); pure."""
        values = super().act_extras(acting_params, observation)["value"]
        return {
            "value": jax.tree_util.tree_map(lambda v: v[..., 0], values),
            "value_intrinsic": jax.tree_util.tree_map(lambda v: v[..., 1], values),
        }
