"""TD3: Twin Delayed Deep Deterministic policy gradient (Fujimoto et al., 2018), for continuous actions.

Why this module is long: one algorithm is one module, on the template every algorithm of the
collection follows (params with documented defaults, state, networks, the four factories, the losses
split into ``compute_gradients`` / ``apply_gradients``, the agent class), so that a reader finds the
whole algorithm in one place; its parts are small functions, each tested on its own.

A deterministic, tanh-bounded policy ``pi(s)`` in ``[-1, 1]`` and two critics ``Q_1, Q_2`` (one
``qvalue_factory(..., n_critics=2)`` ensemble), each with a Polyak-averaged target network.

* **Exploration**: ``clip(pi(s) + N(0, exploration_noise), -1, 1)``, scaled to the ``Box`` bounds;
  uniform random actions while fewer than ``start_step`` transitions (summed over environments)
  have been made. The switch is computed inside ``explore_fn`` with ``jnp.where`` from the
  ``env_step`` hyperparameter, so it also works when ``env_step`` is traced.
* **Critic target** (target policy smoothing, clipped double Q)::

      a' = clip(pi_targ(s') + clip(N(0, policy_noise), -noise_clip, noise_clip), -1, 1)
      y  = r + gamma * (1 - terminated) * min_i Q_i,targ(s', a')

  and the critic loss is ``sum_i mean((Q_i(s, a) - y)^2)``.
* **Delayed policy updates**: the actor (loss ``-mean(Q_1(s, pi(s)))``) and both target networks
  are updated once every ``policy_delay`` critic updates, on the critic updates numbered
  ``policy_delay, 2 * policy_delay, ...`` (counted with the critic ``TrainState.step``). The
  choice is a ``jax.lax.cond`` on the step counter, so the actor's parameters, optimizer state and
  step and the target parameters are left untouched on the other steps.

Actions: the policy works in ``[-1, 1]``; ``explore`` / ``select_action`` return actions in the
environment's units (``scale_action`` with the ``Box`` bounds) and the update unscales the stored
actions back to ``[-1, 1]``. Only ``Box`` action spaces of shape ``(D,)`` with finite bounds are
accepted; ``TD3`` refuses others when it is made.

Usage (a runnable example; about a minute on a laptop CPU)::

    import numpy as np

    import kitae.config as cfg
    from kitae.algos.collections.td3 import TD3, TD3Params
    from kitae.envs.make import make_vec_env

    env = make_vec_env("Pendulum-v1", n_envs=1)
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=TD3Params(gamma=0.98, start_step=1000),
        update_cfg=cfg.UpdateConfig(learning_rate=1e-3, max_grad_norm=None,
                                    max_buffer_size=100_000, batch_size=256),
        train_cfg=cfg.TrainConfig(n_env_steps=15_000),
        env_cfg=cfg.EnvConfig(task_name="Pendulum-v1",
                              observation_space=env.single_observation_space,
                              action_space=env.single_action_space, n_envs=1),
    )
    agent = TD3("td3-pendulum", config)
    stats = agent.train(env, config.train_cfg.n_env_steps)
    print(stats.mean_return())              # mean return of the last 10 training episodes
    actions, _ = agent.select_action(np.zeros((1, 3), np.float32))  # greedy, (1, 1) in [-2, 2]
"""

from __future__ import annotations

import math
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

import kitae.config as cfg
from kitae.action_masks import refuse_action_mask
from kitae.algos.gradients import BatchLike, as_batch, update_step_from_gradients
from kitae.algos.utils import critic_td_errors, weighted_mean
from kitae.base import OffPolicyAgent, agent_keys
from kitae.buffer import Experience
from kitae.config import AlgoParams, register_algo_params, validate_types
from kitae.modules.encoders import space_input_shape
from kitae.modules.modules import init_params
from kitae.modules.optimizer import n_gradient_steps, optimizer_factory, optimizer_from_config
from kitae.modules.policy import policy_factory, scale_action, unscale_action
from kitae.modules.pytree import AgentPyTree, TrainState
from kitae.modules.qvalue import qvalue_factory
from kitae.timesteps import bootstrap_discounts, compute_td_targets
from kitae.types import AlgoType, Params

__all__ = [
    "TD3Params",
    "TD3State",
    "TD3Batch",
    "TD3",
    "check_action_space",
    "Preprocessed",
    "train_state_td3_factory",
    "explore_factory",
    "process_experience_factory",
    "compute_gradients_factory",
    "apply_gradients_factory",
    "update_step_factory",
    "is_policy_update_step",
    "td3_target_actions",
    "td3_targets",
    "td3_critic_loss",
    "td3_actor_loss",
]

N_CRITICS = 2

TD3Batch = namedtuple(
    "TD3Batch", ["observation", "action", "reward", "discount", "next_observation", "weight"], defaults=(None,)
)
TD3Batch.__doc__ = """What ``process_fn`` hands the update, for a batch of ``B`` transitions.

Attributes:
    observation: ``(B, *obs_shape)``.
    action: the action taken, unscaled to ``[-1, 1]``, ``(B, D)``.
    reward: ``(B,)``.
    discount: ``gamma * (1 - terminated)``, ``(B,)`` (truncation still bootstraps; ``gamma **
        n_steps`` for n-step transitions: ``kitae.timesteps.bootstrap_discounts``).
    next_observation: the real next observation, ``(B, *obs_shape)``.
    weight: prioritized replay's importance weights ``(B,)``, or ``None``.
"""


# ---------------------------------------------------------------------------------------------
# 1. Parameters
# ---------------------------------------------------------------------------------------------


_require = cfg.check_algo_param


@register_algo_params
@dataclass
class TD3Params(AlgoParams):
    """TD3's hyperparameters (defaults follow the TD3 paper / CleanRL, except ``start_step``).

    Attributes:
        gamma: discount factor, in ``[0, 1]``.
        tau: Polyak coefficient of both target networks, ``target <- tau * params + (1 - tau) *
            target``, in ``(0, 1]``.
        exploration_noise: std of the Gaussian noise added to the policy's action while exploring,
            in ``[-1, 1]`` action units (finite, ``>= 0``).
        policy_noise: std of the target policy smoothing noise, in ``[-1, 1]`` action units
            (finite, ``>= 0``).
        noise_clip: the smoothing noise is clipped to ``[-noise_clip, noise_clip]`` (``>= 0``;
            ``inf``: not clipped).
        policy_delay: the actor and the target networks are updated once every ``policy_delay``
            critic updates (``>= 1``).
        start_step: uniform random actions, and no update, before this many environment
            transitions summed over environments (``>= 0``).
        skip_steps: update once every ``skip_steps`` transitions (``>= 1``); each update makes
            ``UpdateConfig.n_epochs`` gradient steps.
        actor_hidden: hidden sizes of the actor's MLP (ReLU), ints ``>= 1``.
        critic_hidden: hidden sizes of each critic's MLP (ReLU), ints ``>= 1``.
    """

    gamma: float = 0.99
    tau: float = 0.005
    exploration_noise: float = 0.1
    policy_noise: float = 0.2
    noise_clip: float = 0.5
    policy_delay: int = 2
    start_step: int = 1000
    skip_steps: int = 1
    actor_hidden: tuple[int, ...] = (256, 256)
    critic_hidden: tuple[int, ...] = (256, 256)

    @property
    def n_critics(self) -> int:
        """TD3's twin critics (``N_CRITICS``; DDPG, built on these factories, has one)."""
        return N_CRITICS

    def __post_init__(self) -> None:
        validate_types(self, "algo_params.")
        check_deterministic_actor_params(self)
        _require(0.0 <= self.policy_noise < math.inf, "policy_noise", self.policy_noise, "a finite float >= 0")
        _require(self.noise_clip >= 0.0, "noise_clip", self.noise_clip, "a float >= 0 (inf: no clipping)")
        _require(self.policy_delay >= 1, "policy_delay", self.policy_delay, "an int >= 1")


def check_deterministic_actor_params(p: Any) -> None:
    """Checks the fields TD3 shares with DDPG: ``gamma``, ``tau``, ``exploration_noise``,
    ``start_step``, ``skip_steps``, ``actor_hidden``, ``critic_hidden``.

    Raises:
        ValueError: naming the field, its value and what is allowed.
    """
    _require(0.0 <= p.gamma <= 1.0, "gamma", p.gamma, "a float in [0, 1]")
    _require(0.0 < p.tau <= 1.0, "tau", p.tau, "a float in (0, 1]")
    _require(0.0 <= p.exploration_noise < math.inf, "exploration_noise", p.exploration_noise, "a finite float >= 0")
    _require(p.start_step >= 0, "start_step", p.start_step, "an int >= 0 (environment transitions)")
    _require(p.skip_steps >= 1, "skip_steps", p.skip_steps, "an int >= 1")
    for name in ("actor_hidden", "critic_hidden"):
        sizes = getattr(p, name)
        _require(
            all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in sizes),
            name,
            sizes,
            "a tuple of ints >= 1",
        )


# ---------------------------------------------------------------------------------------------
# 2. State
# ---------------------------------------------------------------------------------------------


class TD3State(AgentPyTree):
    """TD3's state.

    Attributes:
        actor: the deterministic policy, ``apply_fn(params, observations (B, *obs_shape)) -> (B, D)``
            in ``[-1, 1]``, with ``target_params``; its ``step`` counts actor updates.
        critic: the twin critics, ``apply_fn(params, observations (B, *obs_shape), actions (B, D))
            -> (2, B)``, with ``target_params``; its ``step`` counts critic updates (gradient steps).
            ``None`` in the acting params (``TD3.acting_params``: acting reads the actor only).
    """

    actor: TrainState
    critic: TrainState | None


# ---------------------------------------------------------------------------------------------
# Action space
# ---------------------------------------------------------------------------------------------


def check_action_space(action_space: gym.Space, name: str = "TD3") -> gym.spaces.Box:
    """Raises ``ValueError`` (naming ``name``, the algorithm) unless ``action_space`` is a ``Box`` of
    shape ``(D,)`` with finite bounds."""
    ok = (
        isinstance(action_space, gym.spaces.Box)
        and len(action_space.shape) == 1
        and bool(np.all(np.isfinite(action_space.low)))
        and bool(np.all(np.isfinite(action_space.high)))
    )
    if not ok:
        hint = ""
        if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) == 1:
            hint = (
                " (gymnasium's vector ClipAction wrapper replaces a Box's bounds by -inf, inf: build the "
                "EnvConfig from the environment's own bounded action space)"
            )
        raise ValueError(
            f"{name} cannot act in action space {action_space}: {name} accepts only continuous actions, "
            f"a gymnasium.spaces.Box of shape (D,) with finite low and high bounds{hint}"
        )
    assert isinstance(action_space, gym.spaces.Box)  # ok above
    return action_space


def _bounds(config: cfg.AlgoConfig) -> tuple[np.ndarray, np.ndarray]:
    space = check_action_space(config.env_cfg.action_space)
    return np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)


class Preprocessed(nn.Module):
    """``module(preprocess_fn(observations), *rest)``: an observation preprocessing in front of a
    network (TD3's, DDPG's and MPO's actors and critics)."""

    module: nn.Module
    preprocess_fn: Callable

    def __call__(self, observations: Any, *rest: Any) -> Any:
        """``module(preprocess_fn(observations), *rest)``: observations ``(B, *obs_shape)`` (what
        ``preprocess_fn`` takes), ``rest`` the module's other inputs (a critic's actions
        ``(B, D)``); returns the module's output."""
        return self.module(self.preprocess_fn(observations), *rest)


# ---------------------------------------------------------------------------------------------
# 3. Factories
# ---------------------------------------------------------------------------------------------


def train_state_td3_factory(
    key: jax.Array,
    config: cfg.AlgoConfig,
    *,
    preprocess_fn: Callable | None = None,
    tabulate: bool = False,
) -> TD3State:
    """Builds the actor (``policy_factory(kind="deterministic")``, ReLU, ``actor_hidden``) and the
    twin critics (``qvalue_factory(n_critics=2)``, ``critic_hidden``), their target networks (copies)
    and their Adam optimizers (``optimizer_from_config``; the actor's annealing horizon is
    ``policy_delay`` times shorter, since it is updated that much less often).

    Args:
        key: a PRNG key (a raw ``(2,)`` uint32 key).
        config: the ``AlgoConfig`` (``algo_params`` a ``TD3Params``).
        preprocess_fn: optional function applied to the observations before both networks.
        tabulate: print each network's layers and parameter counts.

    Returns:
        A ``TD3State``, the networks initialised on ``(1, *obs_shape)`` observations and
        ``(1, D)`` actions (with ``n_critics > 1``, the critics' parameters stacked on a leading ``n_critics`` axis).
    """
    p = config.algo_params
    observation_space, action_space = config.env_cfg.observation_space, config.env_cfg.action_space
    check_action_space(action_space)
    assert isinstance(action_space, gym.spaces.Box)  # what check_action_space allows
    refuse_action_mask(observation_space, "TD3")
    action_dim = int(action_space.shape[0])

    actor: nn.Module = policy_factory(
        observation_space, action_space, hidden=p.actor_hidden, kind="deterministic", activation="relu"
    )
    critic = qvalue_factory(observation_space, action_space, hidden=p.critic_hidden, n_critics=p.n_critics)
    if preprocess_fn is not None:
        actor, critic = Preprocessed(actor, preprocess_fn), Preprocessed(critic, preprocess_fn)

    actor_key, critic_key = jax.random.split(key)
    obs_shape = space_input_shape(observation_space)
    actor_params = init_params(actor_key, actor, [obs_shape], tabulate)
    critic_params = init_params(critic_key, critic, [obs_shape, (action_dim,)], tabulate)

    u = config.update_cfg
    actor_annealing: int | None = None
    if u.learning_rate_annealing:
        actor_annealing = max(1, n_gradient_steps(config, AlgoType.OFF_POLICY) // p.policy_delay)
    actor_tx = optimizer_factory(u.learning_rate, max_grad_norm=u.max_grad_norm, annealing_steps=actor_annealing)
    critic_tx = optimizer_from_config(config, AlgoType.OFF_POLICY)

    critic_apply: Callable = critic.apply
    if p.n_critics == 1:  # DDPG: one critic's (B,) as the ensemble layout (1, B) the losses take

        def critic_apply(params: Params, observations: Any, actions: jax.Array) -> jax.Array:
            q: jax.Array = critic.apply(params, observations, actions)  # type: ignore[assignment]
            return q[None]

    return TD3State(
        actor=TrainState.create(apply_fn=actor.apply, params=actor_params, tx=actor_tx, target_params=actor_params),
        critic=TrainState.create(
            apply_fn=critic_apply, params=critic_params, tx=critic_tx, target_params=critic_params
        ),
    )


def explore_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``explore_fn(state, key, observations, *, exploration_noise, env_step) -> (actions, log_probs)``.

    ``observations`` ``(B, *obs_shape)``; ``exploration_noise`` (float scalar, may be an array) is
    the std of the Gaussian noise in ``[-1, 1]`` units (0 gives the greedy action); ``env_step``
    (int scalar, may be a traced array) is the number of transitions made so far: while
    ``env_step < start_step`` the actions are uniform in the bounds. Returns actions ``(B, D)``
    float32 in the environment's units and log-probs ``(B,)`` (zeros: a deterministic policy has none).
    """
    low, high = _bounds(config)
    start_step = config.algo_params.start_step

    @jax.jit
    def explore_fn(
        state: TD3State,
        key: jax.Array,
        observations: jax.Array,
        *,
        exploration_noise: float | jax.Array,
        env_step: int | jax.Array,
    ) -> tuple[jax.Array, jax.Array]:
        noise_key, random_key = jax.random.split(key)
        actions = state.actor.apply_fn(state.actor.params, observations)
        noise = exploration_noise * jax.random.normal(noise_key, actions.shape, actions.dtype)
        actions = jnp.clip(actions + noise, -1.0, 1.0)
        random_actions = jax.random.uniform(random_key, actions.shape, actions.dtype, -1.0, 1.0)
        actions = jnp.where(jnp.asarray(env_step) < start_step, random_actions, actions)
        actions = scale_action(actions, low, high).astype(jnp.float32)
        return actions, jnp.zeros(actions.shape[:-1], jnp.float32)

    return explore_fn


def process_experience_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``process_fn(state, key, experience) -> TD3Batch`` for a sampled batch (leaves ``(B, ...)``).

    Unscales the stored actions to ``[-1, 1]`` and turns ``done`` (termination) into the discount
    ``gamma * (1 - done)``; targets are computed in ``compute_gradients`` (they need a key for the
    smoothing noise and the target networks of the current state).
    """
    low, high = _bounds(config)
    gamma = config.algo_params.gamma

    def process_fn(state: TD3State, key: jax.Array, experience: Experience) -> TD3Batch:
        actions = unscale_action(jnp.asarray(experience.action, jnp.float32), low, high)
        discounts = bootstrap_discounts(gamma, experience.done, experience.n_steps)
        return TD3Batch(
            experience.observation,
            actions,
            jnp.asarray(experience.reward, jnp.float32),
            discounts,
            experience.next_observation,
            experience.weight,
        )

    return process_fn


# ---------------------------------------------------------------------------------------------
# Losses and targets (small pure functions)
# ---------------------------------------------------------------------------------------------


def is_policy_update_step(critic_step: int | jax.Array, policy_delay: int) -> jax.Array:
    """Whether the critic update about to be made (``critic_step`` updates made so far) is also a
    policy (actor + targets) update: ``(critic_step + 1) % policy_delay == 0``, a bool scalar."""
    return (jnp.asarray(critic_step) + 1) % policy_delay == 0


def td3_target_actions(key: jax.Array, next_actions: jax.Array, policy_noise: float, noise_clip: float) -> jax.Array:
    """Target policy smoothing: ``clip(next_actions + clip(policy_noise * N(0, 1), -noise_clip,
    noise_clip), -1, 1)``. Shapes: ``next_actions (B, D)`` -> ``(B, D)``."""
    noise = jnp.clip(
        policy_noise * jax.random.normal(key, next_actions.shape, next_actions.dtype), -noise_clip, noise_clip
    )
    return jnp.clip(next_actions + noise, -1.0, 1.0)


def td3_targets(
    key: jax.Array,
    actor_apply_fn: Callable,
    actor_target_params: Params,
    critic_apply_fn: Callable,
    critic_target_params: Params,
    next_observations: jax.Array,
    rewards: jax.Array,
    discounts: jax.Array,
    policy_noise: float,
    noise_clip: float,
) -> jax.Array:
    """Clipped double-Q targets ``r + discount * min_i Q_i,targ(s', smoothed pi_targ(s'))``.

    Shapes: ``next_observations (B, *obs_shape)``, ``rewards (B,)``, ``discounts (B,)``;
    ``actor_apply_fn(params, obs) -> (B, D)``, ``critic_apply_fn(params, obs, actions) ->
    (n_critics, B)``. Returns ``(B,)`` (no gradient flows through it).
    """
    next_actions = td3_target_actions(
        key, actor_apply_fn(actor_target_params, next_observations), policy_noise, noise_clip
    )
    next_q = jnp.min(critic_apply_fn(critic_target_params, next_observations, next_actions), axis=0)
    return jax.lax.stop_gradient(compute_td_targets(rewards, discounts, next_q))


def td3_critic_loss(
    critic_params: Params,
    critic_apply_fn: Callable,
    observations: jax.Array,
    actions: jax.Array,
    targets: jax.Array,
    weights: jax.Array | None = None,
    td_errors: bool = False,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``sum_i mean_b (Q_i(s_b, a_b) - y_b)^2`` over the critics (each squared error weighted by
    prioritized replay's ``weights`` ``(B,)`` when given).

    Shapes: ``observations (B, *obs_shape)``, ``actions (B, D)`` in ``[-1, 1]``, ``targets (B,)``;
    ``critic_apply_fn(params, obs, actions) -> (n_critics, B)``.

    Returns:
        ``(loss, {"loss_critic": loss, "qvalue": mean Q over critics and batch})``, with
        ``td_error`` ``(B,)`` (``critic_td_errors``) when ``td_errors`` (static).
    """
    q = critic_apply_fn(critic_params, observations, actions)
    loss = jnp.sum(weighted_mean(jnp.square(q - targets[None]), weights))
    info = {"loss_critic": loss, "qvalue": jnp.mean(q)}
    if td_errors:
        info["td_error"] = critic_td_errors(q, targets)
    return loss, info


def td3_actor_loss(
    actor_params: Params,
    actor_apply_fn: Callable,
    critic_params: Params,
    critic_apply_fn: Callable,
    observations: jax.Array,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``-mean_b Q_1(s_b, pi(s_b))`` (the first critic only, as in the TD3 paper).

    Shapes: ``observations (B, *obs_shape)``; ``actor_apply_fn(params, obs) -> (B, D)``,
    ``critic_apply_fn(params, obs, actions) -> (n_critics, B)``.

    Returns:
        ``(loss, {"loss_actor": loss})``.
    """
    actions = actor_apply_fn(actor_params, observations)
    loss = -jnp.mean(critic_apply_fn(critic_params, observations, actions)[0])
    return loss, {"loss_actor": loss}


# ---------------------------------------------------------------------------------------------
# Gradients and update
# ---------------------------------------------------------------------------------------------


def compute_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``compute_gradients_fn(state, key, batch) -> (grads, info)``.

    ``batch`` is a ``TD3Batch`` (leaves ``(B, ...)``). ``grads`` is ``{"critic": ..., "actor": ...}``;
    the actor's gradient is only computed on policy-update steps (``is_policy_update_step`` of the
    critic's step) and is zeros otherwise (a ``jax.lax.cond``, so the work is skipped). ``info``:
    ``loss_critic``, ``qvalue`` (mean Q), ``loss_actor`` (computed on every step), and
    ``td_error`` ``(B,)`` under prioritized replay.
    """
    p = config.algo_params
    prioritized = config.replay.prioritized

    def compute_gradients_fn(state: TD3State, key: jax.Array, batch: BatchLike) -> tuple[dict, dict]:
        batch = as_batch(TD3Batch, batch)
        actor, critic = state.actor, state.critic
        assert critic is not None  # a full state (acting params have no critic)
        targets = td3_targets(
            key,
            actor.apply_fn,
            actor.target_params,
            critic.apply_fn,
            critic.target_params,
            batch.next_observation,
            batch.reward,
            batch.discount,
            p.policy_noise,
            p.noise_clip,
        )
        (_, critic_info), critic_grads = jax.value_and_grad(td3_critic_loss, has_aux=True)(
            critic.params, critic.apply_fn, batch.observation, batch.action, targets, batch.weight, prioritized
        )

        def actor_gradients(_: None) -> tuple[dict, Params]:
            (_, info), grads = jax.value_and_grad(td3_actor_loss, has_aux=True)(
                actor.params, actor.apply_fn, critic.params, critic.apply_fn, batch.observation
            )
            return info, grads

        def actor_loss_only(_: None) -> tuple[dict, Params]:
            _loss, info = td3_actor_loss(
                actor.params, actor.apply_fn, critic.params, critic.apply_fn, batch.observation
            )
            return info, jax.tree_util.tree_map(jnp.zeros_like, actor.params)

        actor_info, actor_grads = jax.lax.cond(
            is_policy_update_step(critic.step, p.policy_delay), actor_gradients, actor_loss_only, None
        )
        return {"critic": critic_grads, "actor": actor_grads}, {**critic_info, **actor_info}

    return compute_gradients_fn


def apply_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``apply_gradients_fn(state, grads) -> state``.

    Always applies ``grads["critic"]``. On policy-update steps (``is_policy_update_step`` of the
    critic's step before this update) it also applies ``grads["actor"]`` and Polyak-averages both
    target networks with ``tau``; on the other steps the actor (parameters, optimizer state, step)
    and the targets are returned unchanged (a ``jax.lax.cond``).
    """
    p = config.algo_params

    def apply_gradients_fn(state: TD3State, grads: dict) -> TD3State:
        assert state.critic is not None  # a full state (acting params have no critic)
        policy_step = is_policy_update_step(state.critic.step, p.policy_delay)
        critic = state.critic.apply_gradients(grads=grads["critic"])

        def update_policy_and_targets(actor: TrainState, critic: TrainState) -> tuple[TrainState, TrainState]:
            actor = actor.apply_gradients(grads=grads["actor"]).soft_update_target(p.tau)
            return actor, critic.soft_update_target(p.tau)

        def keep(actor: TrainState, critic: TrainState) -> tuple[TrainState, TrainState]:
            return actor, critic

        actor, critic = jax.lax.cond(policy_step, update_policy_and_targets, keep, state.actor, critic)
        return state.replace(actor=actor, critic=critic)

    return apply_gradients_fn


def update_step_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``update_step_fn(state, key, batch) -> (state, info)``: ``compute_gradients`` then
    ``apply_gradients`` (``update_step_from_gradients``)."""
    return update_step_from_gradients(compute_gradients_factory(config), apply_gradients_factory(config))


# ---------------------------------------------------------------------------------------------
# 4. The agent
# ---------------------------------------------------------------------------------------------


class TD3(OffPolicyAgent):
    """TD3 agent (continuous ``Box`` actions of shape ``(D,)`` with finite bounds).

    Args:
        run_name: name of the run (logs go to ``runs/<run_name>`` unless ``run_dir`` is given).
        config: an ``AlgoConfig`` whose ``algo_params`` is a ``TD3Params``.
        preprocess_fn: optional function applied to the observations before both networks.
        tabulate: print each network's layers and parameter counts.
        run_dir: where logs go.

    Attributes:
        state: a ``TD3State``.
        compute_gradients_fn: the pure ``(state, key, batch) -> (grads, info)``.
        apply_gradients_fn: the pure ``(state, grads) -> state``.

    Raises:
        ValueError: for an action space other than a bounded ``Box`` of shape ``(D,)``.
        TypeError: when ``config.algo_params`` is not a ``TD3Params``.
    """

    learning_params = ("gamma", "tau", "policy_noise", "noise_clip")
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
        if isinstance(config, cfg.AlgoConfig):
            if not isinstance(config.algo_params, TD3Params):
                raise TypeError(
                    f"algo_params={type(config.algo_params).__name__} is not allowed for TD3; allowed: a TD3Params"
                )
            check_action_space(config.env_cfg.action_space)
        super().__init__(
            run_name,
            config,
            train_state_td3_factory,
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
        self.algo_params: TD3Params = config.algo_params
        self.compute_gradients_fn = compute_gradients_factory(config)
        self.gradient_factories = (compute_gradients_factory, apply_gradients_factory)
        self.apply_gradients_fn = apply_gradients_factory(config)
        self._exploration_noise = jnp.asarray(self.algo_params.exploration_noise, jnp.float32)
        self._no_noise = np.asarray(0.0, np.float32)
        self._not_random = np.asarray(self.algo_params.start_step, np.int32)  # env_step >= start_step

    def acting_params(self, state: TD3State) -> TD3State:
        """The actor without its optimizer state and target parameters (what acting reads):
        ``state`` is the agent's ``TD3State`` pytree; the actor's parameters keep their leaves'
        shape, ``critic`` becomes ``None``."""
        return TD3State(actor=state.actor.replace(opt_state=None, target_params=None), critic=None)

    def act(
        self, acting_params: TD3State, key: jax.Array, observation: Any, env_step: Any, deterministic: bool = False
    ) -> tuple[jax.Array, jax.Array]:
        """Noisy policy actions (uniform random before ``start_step``), in the environment's units,
        pure (see ``BaseAgent.act``); ``deterministic``: the policy's action without noise.

        Returns:
            ``(actions (E, D), log_probs (E,) zeros)``.
        """
        keys = agent_keys(key, observation, self.parallel)
        if deterministic:
            return self.explore_fn(
                acting_params, keys, observation, exploration_noise=self._no_noise, env_step=self._not_random
            )
        return self.explore_fn(
            acting_params, keys, observation, exploration_noise=self._exploration_noise, env_step=env_step
        )
