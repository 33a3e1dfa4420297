"""MPO: Maximum a Posteriori Policy Optimisation (Abdolmaleki et al., 2018,
https://arxiv.org/abs/1806.06920), for continuous actions.

Why this module is long: one algorithm is one module (params, state, networks, the E-step's
dual, the M-step's decoupled KL constraints and their Lagrange multipliers, the four factories,
``compute_gradients`` / ``apply_gradients``, the agent class), so a reader finds all of MPO in
one place; split, each part would need the others to be read.

On the template of the collection (params with documented defaults, state, networks, the four
factories, ``compute_gradients`` / ``apply_gradients``, the agent class). Off-policy, from a replay
buffer, with a Gaussian policy ``N(mu(s), Sigma(s))`` with a full covariance ``Sigma = L L^T``
(``L`` lower triangular with a positive diagonal), one critic ``Q(s, a)``, and target copies of
both (Polyak-averaged with ``tau``). Each gradient step on a batch of ``B`` states:

* **Critic** (expected SARSA over the target policy)::

      y = r + gamma * (1 - terminated) * mean_i Q_targ(s', a'_i),   a'_i ~ pi_targ(. | s'), i = 1..N

  and the loss ``mean_b (Q(s_b, a_b) - y_b)^2``.
* **E-step**: ``N`` actions ``a_ib ~ pi_targ(. | s_b)`` per state, scored ``Q_ib = Q_targ(s_b,
  a_ib)``. The non-parametric improved policy weights them ``w_ib = softmax_i(Q_ib / eta)``; the
  temperature ``eta`` minimises the dual of "maximise E_q[Q] subject to KL(q || pi_targ) <
  epsilon"::

      g(eta) = eta * epsilon + eta * mean_b log mean_i exp(Q_ib / eta)

  (``temperature_dual_loss``), one gradient step on it per update, as in Acme.
* **M-step** (weighted maximum likelihood with decoupled trust regions): with the online policy's
  ``(mu, L)`` and the target's ``(mu_t, L_t)``, the policy loss is
  ``-mean_b sum_i w_ib [log N(a_ib; mu_b, L_t,b) + log N(a_ib; mu_t,b, L_b)]`` (the mean learned
  with the target's covariance, the covariance with the target's mean), and the two KL
  constraints ``KL_mu < epsilon_mean``, ``KL_Sigma < epsilon_stddev`` (``kitae.algos.utils.gaussian_kl``
  of the target and the online Gaussians) enter through Lagrange multipliers ``alpha_mean``,
  ``alpha_stddev``: the policy minimises ``alpha * KL`` (alpha fixed), the multipliers minimise
  ``alpha * (epsilon - KL)`` (KL fixed), so each grows while its constraint is violated
  (``mpo_kl_losses``).

``eta``, ``alpha_mean`` and ``alpha_stddev`` are ``softplus`` of unconstrained parameters with
their own Adam (``dual_learning_rate``).

Actions: the policy works in ``[-1, 1]`` (a ``tanh`` mean; samples clipped to ``[-1, 1]`` before
they are scored by the critic or sent, and fitted unclipped by the M-step); ``explore`` /
``select_action`` return actions in the environment's units (``scale_action`` with the ``Box``
bounds), the update unscales the stored ones. Only
``Box`` action spaces of shape ``(D,)`` with finite bounds; ``MPO`` refuses others when it is made.

Usage (a runnable example; a few minutes on a laptop CPU)::

    import kitae.config as cfg
    from kitae.algos.collections.mpo import MPO, MPOParams
    from kitae.envs.make import make_vec_env

    env = make_vec_env("Pendulum-v1", n_envs=1)
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=MPOParams(start_step=1000),
        update_cfg=cfg.UpdateConfig(learning_rate=3e-4, max_grad_norm=None,
                                    max_buffer_size=100_000, batch_size=256),
        train_cfg=cfg.TrainConfig(n_env_steps=30_000),
        env_cfg=cfg.EnvConfig(task_name="Pendulum-v1",
                              observation_space=env.single_observation_space,
                              action_space=env.single_action_space, n_envs=1),
    )
    agent = MPO("mpo-pendulum", config)
    stats = agent.train(env, config.train_cfg.n_env_steps)
    print(stats.mean_return())              # mean return of the last 10 training episodes
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.scipy.linalg import solve_triangular

import kitae.algos.collections.td3 as td3
import kitae.config as cfg
from kitae.action_masks import refuse_action_mask
from kitae.algos.gradients import BatchLike, as_batch, update_step_from_gradients
from kitae.algos.utils import critic_td_errors, gaussian_kl, weighted_mean
from kitae.base import OffPolicyAgent, agent_keys
from kitae.buffer import Experience
from kitae.config import AlgoParams, register_algo_params, validate_types
from kitae.modules.encoders import MLP, dense_init, encoder_factory, space_input_shape
from kitae.modules.modules import init_params
from kitae.modules.optimizer import optimizer_factory, optimizer_from_config
from kitae.modules.policy import scale_action
from kitae.modules.pytree import AgentPyTree, TrainState
from kitae.modules.qvalue import qvalue_factory
from kitae.types import AlgoType, Params

__all__ = [
    "MPOParams",
    "MPOState",
    "MPOPolicy",
    "MPO",
    "check_action_space",
    "dual_values",
    "initial_dual_params",
    "dual_optimizer",
    "mvn_log_prob",
    "sample_actions",
    "temperature_dual_loss",
    "e_step_weights",
    "mpo_policy_loss",
    "mpo_kl_losses",
    "train_state_mpo_factory",
    "explore_factory",
    "process_experience_factory",
    "compute_gradients_factory",
    "apply_gradients_factory",
    "update_step_factory",
]

DUAL_EPSILON = 1e-8
"""Added to ``softplus`` of the dual parameters, so the temperature and multipliers stay > 0."""

_require = cfg.check_algo_param


# ---------------------------------------------------------------------------------------------
# 1. Parameters
# ---------------------------------------------------------------------------------------------


@register_algo_params
@dataclass
class MPOParams(AlgoParams):
    """MPO's hyperparameters (the trust regions and duals follow Acme's MPO and daisatojp/mpo).

    Attributes:
        gamma: discount factor, in ``[0, 1]``.
        tau: Polyak coefficient of the target policy and critic, in ``(0, 1]``.
        n_action_samples: actions sampled per state for the E-step and the critic's target (>= 1).
        epsilon: the E-step's KL bound between the improved and the target policy (> 0).
        epsilon_mean: the M-step's bound on the mean's KL (> 0).
        epsilon_stddev: the M-step's bound on the covariance's KL (> 0).
        init_temperature: the temperature ``eta`` at the start (> 0).
        init_alpha_mean: the mean's Lagrange multiplier at the start (> 0).
        init_alpha_stddev: the covariance's Lagrange multiplier at the start (> 0).
        dual_learning_rate: Adam's step for the temperature and the multipliers (> 0).
        init_std: the policy's standard deviation at the start, in ``[-1, 1]`` action units (> min_std).
        min_std: the smallest standard deviation (the diagonal of ``L`` is ``softplus + min_std``), > 0.
        start_step: uniform random actions, and no update, before this many transitions (>= 0).
        skip_steps: update once every ``skip_steps`` transitions (>= 1), ``UpdateConfig.n_epochs``
            gradient steps each.
        actor_hidden: hidden sizes of the policy's MLP (ELU, as Acme's), ints >= 1.
        critic_hidden: hidden sizes of the critic's MLP (ReLU), ints >= 1.
    """

    gamma: float = 0.99
    tau: float = 0.005
    n_action_samples: int = 20
    epsilon: float = 0.1
    epsilon_mean: float = 1e-2
    epsilon_stddev: float = 1e-4
    init_temperature: float = 1.0
    init_alpha_mean: float = 1.0
    init_alpha_stddev: float = 10.0
    dual_learning_rate: float = 1e-2
    init_std: float = 0.5
    min_std: float = 1e-3
    start_step: int = 1000
    skip_steps: int = 1
    actor_hidden: tuple[int, ...] = (256, 256)
    critic_hidden: tuple[int, ...] = (256, 256)

    def __post_init__(self) -> None:
        validate_types(self, "algo_params.")
        _require(0.0 <= self.gamma <= 1.0, "gamma", self.gamma, "a float in [0, 1]")
        _require(0.0 < self.tau <= 1.0, "tau", self.tau, "a float in (0, 1]")
        _require(self.n_action_samples >= 1, "n_action_samples", self.n_action_samples, "an int >= 1")
        for name in (
            "epsilon",
            "epsilon_mean",
            "epsilon_stddev",
            "init_temperature",
            "init_alpha_mean",
            "init_alpha_stddev",
            "dual_learning_rate",
            "min_std",
        ):
            value = getattr(self, name)
            _require(0.0 < value < math.inf, name, value, "a finite float > 0")
        _require(
            self.min_std < self.init_std < math.inf,
            "init_std",
            self.init_std,
            f"a finite float > min_std={self.min_std}",
        )
        _require(self.start_step >= 0, "start_step", self.start_step, "an int >= 0 (environment transitions)")
        _require(self.skip_steps >= 1, "skip_steps", self.skip_steps, "an int >= 1")
        for name in ("actor_hidden", "critic_hidden"):
            sizes = getattr(self, name)
            _require(
                all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in sizes),
                name,
                sizes,
                "a tuple of ints >= 1",
            )


def check_action_space(action_space: gym.Space) -> gym.spaces.Box:
    """TD3's check, naming MPO: a ``Box`` of shape ``(D,)`` with finite bounds, else ``ValueError``."""
    return td3.check_action_space(action_space, "MPO")


# ---------------------------------------------------------------------------------------------
# 2. State and networks
# ---------------------------------------------------------------------------------------------


class MPOState(AgentPyTree):
    """MPO's state.

    Attributes:
        actor: the policy, ``apply_fn(params, observations (B, *obs_shape)) -> (mean (B, D) in
            [-1, 1], L (B, D, D))``, with ``target_params``.
        critic: ``apply_fn(params, observations (B, *obs_shape), actions (B, D)) -> (B,)``, with
            ``target_params``. ``None`` in the acting params.
        dual: ``params`` ``{"temperature", "alpha_mean", "alpha_stddev"}`` (scalars, before
            ``softplus``: see ``dual_values``) and their Adam state. ``None`` in the acting params.
    """

    actor: TrainState
    critic: TrainState | None
    dual: TrainState | None


def _inverse_softplus(y: Any) -> Any:
    """``x`` with ``softplus(x) = y`` (``y > 0``): ``log(expm1(y))``, written to stay finite for large ``y``.
    Python's maths for a float (the bits runs had), JAX's for a traced one (a sweep of
    ``init_temperature``, ``init_std``... traces it: ``math`` cannot read a traced value)."""
    if isinstance(y, jax.core.Tracer):
        return y + jnp.log(-jnp.expm1(-y))
    return float(y + math.log(-math.expm1(-y)))


class MPOPolicy(nn.Module):
    """Observations -> a Gaussian with full covariance: ``(mean (..., D), L (..., D, D))``.

    ``mean = tanh(Dense(features))`` in ``[-1, 1]``; ``L`` is lower triangular with diagonal
    ``softplus(Dense(features)) + min_std`` (``init_std`` at the start: the layer's bias) and the
    entries below it a third ``Dense`` (``D (D - 1) / 2`` outputs; none when ``D = 1``).

    Attributes:
        encoder: observations ``(..., *obs_shape)`` -> ``(..., F0)`` (identity for vectors).
        hidden: the MLP's hidden sizes (ELU).
        action_dim: ``D``.
        init_std, min_std: see ``MPOParams``.
    """

    encoder: nn.Module
    hidden: tuple[int, ...]
    action_dim: int
    init_std: float
    min_std: float

    @nn.compact
    def __call__(self, observations: Any) -> tuple[jax.Array, jax.Array]:
        """``observations (..., *obs_shape) -> (mean (..., D), L (..., D, D))``: ``mean`` in
        ``[-1, 1]``, ``L`` the lower-triangular Cholesky factor of the covariance."""
        x = MLP(self.hidden, "elu")(self.encoder(observations))
        d = self.action_dim
        mean = jnp.tanh(nn.Dense(d, kernel_init=dense_init(0.01), name="mean")(x))
        diagonal = nn.Dense(
            d,
            kernel_init=dense_init(0.01),
            bias_init=nn.initializers.constant(_inverse_softplus(self.init_std - self.min_std)),
            name="std",
        )(x)
        chol = (jax.nn.softplus(diagonal) + self.min_std)[..., None] * jnp.eye(d)
        if d > 1:
            rows, cols = np.tril_indices(d, -1)
            below = nn.Dense(len(rows), kernel_init=dense_init(0.01), name="off_diagonal")(x)
            chol = chol.at[..., rows, cols].set(below)
        return mean, chol


# ---------------------------------------------------------------------------------------------
# Small pure functions (each tested against hand-computed values)
# ---------------------------------------------------------------------------------------------


def dual_values(dual_params: Params) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(temperature, alpha_mean, alpha_stddev)``: ``softplus(param) + 1e-8`` of each dual parameter."""
    return tuple(  # type: ignore[return-value]
        jax.nn.softplus(dual_params[name]) + DUAL_EPSILON for name in ("temperature", "alpha_mean", "alpha_stddev")
    )


def initial_dual_params(p: MPOParams) -> Params:
    """The dual parameters at the start: ``{"temperature", "alpha_mean", "alpha_stddev"}``, float32
    scalars whose ``softplus`` is ``p.init_temperature``, ``p.init_alpha_mean``, ``p.init_alpha_stddev``."""
    names = {"temperature": p.init_temperature, "alpha_mean": p.init_alpha_mean, "alpha_stddev": p.init_alpha_stddev}
    return {name: jnp.asarray(_inverse_softplus(value), jnp.float32) for name, value in names.items()}


def dual_optimizer(p: MPOParams) -> optax.GradientTransformation:
    """The duals' optimizer: Adam at ``p.dual_learning_rate``, unclipped, never annealed."""
    return optimizer_factory(p.dual_learning_rate)


def mvn_log_prob(x: jax.Array, mean: jax.Array, chol: jax.Array) -> jax.Array:
    """``log N(x; mean, L L^T)``: ``-0.5 |L^-1 (x - mean)|^2 - sum log diag L - D/2 log(2 pi)``.

    Shapes: ``x (..., B, D)`` (leading sample axes broadcast), ``mean (B, D)``, ``chol (B, D, D)``
    lower triangular; returns ``(..., B)``.
    """
    d = mean.shape[-1]
    inverse = solve_triangular(chol, jnp.broadcast_to(jnp.eye(d), chol.shape), lower=True)  # (B, D, D)
    z = jnp.einsum("bij,...bj->...bi", inverse, x - mean)
    log_det = jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)  # (B,)
    return -0.5 * jnp.sum(jnp.square(z), axis=-1) - log_det - 0.5 * d * math.log(2.0 * math.pi)


def sample_actions(key: jax.Array, mean: jax.Array, chol: jax.Array, n: int) -> jax.Array:
    """``n`` samples ``mean + L eps``, ``eps ~ N(0, I)``, per state: ``mean (B, D)``, ``chol (B, D,
    D)`` -> ``(n, B, D)``. Not clipped: the M-step fits the Gaussian to them, and clipped samples
    would pull its mean in from the bounds and shrink its covariance (a flat critic would then
    move the policy). The critic scores them clipped to ``[-1, 1]``, as the environment acts."""
    eps = jax.random.normal(key, (n, *mean.shape), mean.dtype)
    return mean + jnp.einsum("bij,nbj->nbi", chol, eps)


def temperature_dual_loss(temperature: jax.Array, q_values: jax.Array, epsilon: float | jax.Array) -> jax.Array:
    """The E-step's dual ``eta * epsilon + eta * mean_b (logsumexp_i(Q_ib / eta) - log N)``, a scalar.

    ``q_values`` ``(N, B)``: the sampled actions' values (no gradient should flow into them).
    """
    n = q_values.shape[0]
    log_mean_exp = jax.nn.logsumexp(q_values / temperature, axis=0) - math.log(n)
    return temperature * epsilon + temperature * jnp.mean(log_mean_exp)


def e_step_weights(q_values: jax.Array, temperature: jax.Array) -> jax.Array:
    """The improved policy's weights ``softmax_i(Q_ib / eta)`` over the samples of each state:
    ``(N, B)`` -> ``(N, B)``, each column summing to 1 (no gradient to ``eta``)."""
    return jax.lax.stop_gradient(jax.nn.softmax(q_values / temperature, axis=0))


def mpo_policy_loss(weights: jax.Array, log_probs_mean: jax.Array, log_probs_stddev: jax.Array) -> jax.Array:
    """The M-step's weighted maximum likelihood, decoupled: ``-mean_b sum_i w_ib (log_probs_mean_ib
    + log_probs_stddev_ib)``. All ``(N, B)``: the log-probabilities of the samples under the
    online mean with the target covariance, and under the target mean with the online covariance."""
    return -jnp.mean(jnp.sum(weights * (log_probs_mean + log_probs_stddev), axis=0))


def mpo_kl_losses(
    kl_mean: jax.Array,
    kl_stddev: jax.Array,
    alpha_mean: jax.Array,
    alpha_stddev: jax.Array,
    epsilon_mean: float | jax.Array,
    epsilon_stddev: float | jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The M-step's Lagrangian terms, scalars:

    * the policy's penalty ``alpha_mean * KL_mu + alpha_stddev * KL_Sigma`` (no gradient to the
      multipliers);
    * the multipliers' loss ``alpha_mean * (epsilon_mean - KL_mu) + alpha_stddev * (epsilon_stddev
      - KL_Sigma)`` (no gradient to the KLs): minimising it raises a multiplier while its KL
      exceeds its bound.
    """
    sg = jax.lax.stop_gradient
    penalty = sg(alpha_mean) * kl_mean + sg(alpha_stddev) * kl_stddev
    multipliers = alpha_mean * (epsilon_mean - sg(kl_mean)) + alpha_stddev * (epsilon_stddev - sg(kl_stddev))
    return penalty, multipliers


def _sample_values(apply_fn: Callable, params: Params, observations: Any, actions: jax.Array) -> jax.Array:
    """``Q(s_b, clip(a_ib, -1, 1))`` for actions ``(N, B, D)`` (``sample_actions``') -> ``(N, B)``:
    the action the environment would receive, which is what the critic learnt from. The critic
    (``ContinuousQValue``) encodes each of the ``B`` observations once for its ``N`` actions."""
    return apply_fn(params, observations, jnp.clip(actions, -1.0, 1.0))


# ---------------------------------------------------------------------------------------------
# 3. Factories
# ---------------------------------------------------------------------------------------------


def train_state_mpo_factory(
    key: jax.Array,
    config: cfg.AlgoConfig,
    *,
    preprocess_fn: Callable | None = None,
    tabulate: bool = False,
) -> MPOState:
    """Builds the policy (``MPOPolicy``), the critic (``qvalue_factory``, one critic), their target
    copies, their Adam optimizers (``optimizer_from_config``) and the dual parameters (at the
    ``init_*`` values) with Adam at ``dual_learning_rate``.

    Args:
        key: a PRNG key (a raw ``(2,)`` uint32 key).
        config: the ``AlgoConfig`` (``algo_params`` an ``MPOParams``).
        preprocess_fn: optional function applied to the observations before both networks.
        tabulate: print each network's layers and parameter counts.

    Returns:
        An ``MPOState``: the actor and critic initialised on ``(1, *obs_shape)`` observations and
        ``(1, D)`` actions, the duals float32 scalars.
    """
    p: MPOParams = config.algo_params
    observation_space, action_space = config.env_cfg.observation_space, config.env_cfg.action_space
    space = check_action_space(action_space)
    refuse_action_mask(observation_space, "MPO")
    action_dim = int(space.shape[0])
    actor: nn.Module = MPOPolicy(
        encoder_factory(observation_space, hidden=()), p.actor_hidden, action_dim, p.init_std, p.min_std
    )
    critic: nn.Module = qvalue_factory(observation_space, action_space, hidden=p.critic_hidden, n_critics=1)
    if preprocess_fn is not None:
        actor, critic = td3.Preprocessed(actor, preprocess_fn), td3.Preprocessed(critic, preprocess_fn)
    actor_key, critic_key = jax.random.split(key)
    obs_shape = space_input_shape(observation_space)
    actor_params = init_params(actor_key, actor, [obs_shape], tabulate)
    critic_params = init_params(critic_key, critic, [obs_shape, (action_dim,)], tabulate)
    tx = optimizer_from_config(config, AlgoType.OFF_POLICY)
    return MPOState(
        actor=TrainState.create(apply_fn=actor.apply, params=actor_params, tx=tx, target_params=actor_params),
        critic=TrainState.create(apply_fn=critic.apply, params=critic_params, tx=tx, target_params=critic_params),
        dual=TrainState.create(apply_fn=dual_values, params=initial_dual_params(p), tx=dual_optimizer(p)),
    )


def explore_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``explore_fn(state, key, observations, *, env_step, deterministic=False) -> (actions, log_probs)``.

    ``observations`` ``(B, *obs_shape)``. Actions ``(B, D)`` float32 in the environment's units:
    a sample of the policy clipped to ``[-1, 1]`` and scaled (``deterministic``, static: the mean),
    uniform in the bounds while ``env_step < start_step`` (``env_step`` may be traced). The
    log-probabilities ``(B,)`` are the policy's of the sample before clipping (of the mean when
    deterministic; of nothing meaningful for the uniform warm-up actions).
    """
    space = check_action_space(config.env_cfg.action_space)
    low, high = np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)
    start_step = config.algo_params.start_step

    def explore_fn(
        state: MPOState, key: jax.Array, observations: Any, *, env_step: Any, deterministic: bool = False
    ) -> tuple[jax.Array, jax.Array]:
        noise_key, random_key = jax.random.split(key)
        mean, chol = state.actor.apply_fn(state.actor.params, observations)
        if deterministic:
            raw = mean
        else:
            raw = mean + jnp.einsum("bij,bj->bi", chol, jax.random.normal(noise_key, mean.shape, mean.dtype))
        log_probs = mvn_log_prob(raw, mean, chol)
        actions = jnp.clip(raw, -1.0, 1.0)
        if not deterministic:
            random_actions = jax.random.uniform(random_key, actions.shape, actions.dtype, -1.0, 1.0)
            actions = jnp.where(jnp.asarray(env_step) < start_step, random_actions, actions)
        return scale_action(actions, low, high).astype(jnp.float32), log_probs

    return jax.jit(explore_fn, static_argnames=("deterministic",))


def process_experience_factory(config: cfg.AlgoConfig) -> Callable:
    """TD3's processing (a ``td3.TD3Batch``): the stored actions back to ``[-1, 1]``, the discount
    ``gamma * (1 - terminated)`` (truncation still bootstraps), the real next observation."""
    check_action_space(config.env_cfg.action_space)
    return td3.process_experience_factory(config)


def compute_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``compute_gradients_fn(state, key, batch) -> (grads, info)``.

    ``batch`` a ``td3.TD3Batch`` (leaves ``(B, ...)``). ``grads`` is ``{"critic", "actor",
    "dual"}``: the critic's on its TD loss, the policy's on the M-step (weighted likelihood plus the
    KL penalty), the duals' on the temperature's dual and the multipliers' loss. ``info``:
    ``loss_critic``, ``qvalue``, ``loss_policy``, ``kl_mean``, ``kl_stddev``, ``loss_temperature``,
    ``temperature``, ``alpha_mean``, ``alpha_stddev``.
    """
    p: MPOParams = config.algo_params
    n = p.n_action_samples
    prioritized = config.replay.prioritized

    def compute_gradients_fn(state: MPOState, key: jax.Array, batch: BatchLike) -> tuple[dict, dict]:
        batch = as_batch(td3.TD3Batch, batch)
        actor, critic, dual = state.actor, state.critic, state.dual
        assert critic is not None and dual is not None  # a full state (acting params have neither)
        target_key, sample_key = jax.random.split(key)

        # critic: expected SARSA over the target policy
        next_mean, next_chol = actor.apply_fn(actor.target_params, batch.next_observation)
        next_actions = sample_actions(target_key, next_mean, next_chol, n)
        next_q = jnp.mean(
            _sample_values(critic.apply_fn, critic.target_params, batch.next_observation, next_actions), 0
        )
        targets = jax.lax.stop_gradient(batch.reward + batch.discount * next_q)

        def critic_loss(params: Params) -> tuple[jax.Array, jax.Array]:
            q = critic.apply_fn(params, batch.observation, batch.action)
            return weighted_mean(jnp.square(q - targets), batch.weight), q

        (loss_critic, q), critic_grads = jax.value_and_grad(critic_loss, has_aux=True)(critic.params)

        # E-step: samples of the target policy, scored by the target critic
        target_mean, target_chol = actor.apply_fn(actor.target_params, batch.observation)
        actions = sample_actions(sample_key, target_mean, target_chol, n)
        q_values = jax.lax.stop_gradient(
            _sample_values(critic.apply_fn, critic.target_params, batch.observation, actions)
        )
        target_cov = target_chol @ jnp.swapaxes(target_chol, -1, -2)

        def actor_and_dual_loss(actor_params: Params, dual_params: Params) -> tuple[jax.Array, dict]:
            temperature, alpha_mean, alpha_stddev = dual_values(dual_params)
            loss_temperature = temperature_dual_loss(temperature, q_values, p.epsilon)
            weights = e_step_weights(q_values, temperature)
            mean, chol = actor.apply_fn(actor_params, batch.observation)
            loss_policy = mpo_policy_loss(
                weights, mvn_log_prob(actions, mean, target_chol), mvn_log_prob(actions, target_mean, chol)
            )
            kl_mean, kl_stddev = gaussian_kl(target_mean, mean, target_cov, chol @ jnp.swapaxes(chol, -1, -2))
            penalty, loss_multipliers = mpo_kl_losses(
                kl_mean, kl_stddev, alpha_mean, alpha_stddev, p.epsilon_mean, p.epsilon_stddev
            )
            total = loss_policy + penalty + loss_multipliers + loss_temperature
            return total, {
                "loss_policy": loss_policy,
                "kl_mean": kl_mean,
                "kl_stddev": kl_stddev,
                "loss_temperature": loss_temperature,
                "temperature": temperature,
                "alpha_mean": alpha_mean,
                "alpha_stddev": alpha_stddev,
            }

        (_, info), (actor_grads, dual_grads) = jax.value_and_grad(actor_and_dual_loss, argnums=(0, 1), has_aux=True)(
            actor.params, dual.params
        )
        grads = {"critic": critic_grads, "actor": actor_grads, "dual": dual_grads}
        info = {"loss_critic": loss_critic, "qvalue": jnp.mean(q), **info}
        if prioritized:
            info["td_error"] = critic_td_errors(q, targets)
        return grads, info

    return compute_gradients_fn


def apply_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``apply_gradients_fn(state, grads) -> state``: one Adam step on the critic, the policy
    and the duals, then both target networks Polyak-averaged with ``tau``."""
    tau = config.algo_params.tau

    def apply_gradients_fn(state: MPOState, grads: dict) -> MPOState:
        assert state.critic is not None and state.dual is not None  # a full state
        return state.replace(
            actor=state.actor.apply_gradients(grads=grads["actor"]).soft_update_target(tau),
            critic=state.critic.apply_gradients(grads=grads["critic"]).soft_update_target(tau),
            dual=state.dual.apply_gradients(grads=grads["dual"]),
        )

    return apply_gradients_fn


def update_step_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``update_step_fn(state, key, batch) -> (state, info)``: ``compute_gradients`` then
    ``apply_gradients`` (``update_step_from_gradients``)."""
    return update_step_from_gradients(compute_gradients_factory(config), apply_gradients_factory(config))


# ---------------------------------------------------------------------------------------------
# 4. The agent
# ---------------------------------------------------------------------------------------------


class MPO(OffPolicyAgent):
    """MPO agent (continuous ``Box`` actions of shape ``(D,)`` with finite bounds).

    Args:
        run_name: name of the run (logs go to ``runs/<run_name>`` unless ``run_dir`` is given).
        config: an ``AlgoConfig`` whose ``algo_params`` is an ``MPOParams``.
        preprocess_fn: optional function applied to the observations before both networks.
        tabulate: print each network's layers and parameter counts.
        run_dir: where logs go.

    Attributes:
        state: an ``MPOState``.
        compute_gradients_fn: the pure ``(state, key, batch) -> (grads, info)``.
        apply_gradients_fn: the pure ``(state, grads) -> state``.

    Raises:
        TypeError: when ``config.algo_params`` is not an ``MPOParams``.
        ValueError: for an action space other than a bounded ``Box`` of shape ``(D,)``.
    """

    learning_params = ("gamma", "tau", "epsilon", "epsilon_mean", "epsilon_stddev")
    """``algo_params`` fields that only learning reads (``kitae.distributed.Algorithm``'s
    ``update_algorithm_parameter`` changes them during training)."""
    replay_features = frozenset({"prioritized", "n_step"})

    def __init__(
        self,
        run_name: str,
        config: cfg.AlgoConfig,
        *,
        preprocess_fn: Callable | None = None,
        tabulate: bool = False,
        run_dir: str | Path | None = None,
    ) -> None:
        if not isinstance(config, cfg.AlgoConfig):
            raise TypeError(f"config={type(config).__name__} is not allowed; allowed: a kitae.config.AlgoConfig")
        if not isinstance(config.algo_params, MPOParams):
            raise TypeError(
                f"algo_params={type(config.algo_params).__name__} is not allowed for MPO; allowed: an MPOParams"
            )
        check_action_space(config.env_cfg.action_space)
        super().__init__(
            run_name,
            config,
            train_state_mpo_factory,
            explore_factory,
            process_experience_factory,
            update_step_factory,
            preprocess_fn=preprocess_fn,
            tabulate=tabulate,
            experience_type=Experience,
            run_dir=run_dir,
        )

    def _configure(self) -> None:
        super()._configure()
        config = self.config
        self.algo_params: MPOParams = config.algo_params
        self.compute_gradients_fn = compute_gradients_factory(config)
        self.gradient_factories = (compute_gradients_factory, apply_gradients_factory)
        self.apply_gradients_fn = apply_gradients_factory(config)

    def acting_params(self, state: MPOState) -> MPOState:
        """The policy without its optimizer state and target parameters (what acting reads):
        ``state`` is the agent's ``MPOState`` pytree; the actor's parameters keep their leaves'
        shape, ``critic`` and ``dual`` become ``None``."""
        return MPOState(actor=state.actor.replace(opt_state=None, target_params=None), critic=None, dual=None)

    def act(
        self, acting_params: MPOState, key: jax.Array, observation: Any, env_step: Any, deterministic: bool = False
    ) -> tuple[jax.Array, jax.Array]:
        """Policy samples (uniform random before ``start_step``) in the environment's units, pure
        (see ``BaseAgent.act``); ``deterministic``: the policy's mean.

        Returns:
            ``(actions (E, D), log_probs (E,))``.
        """
        keys = agent_keys(key, observation, self.parallel)
        return self.explore_fn(acting_params, keys, observation, env_step=env_step, deterministic=deterministic)
