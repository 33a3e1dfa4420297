"""Deep Q-Network (DQN): epsilon-greedy Q-learning from a replay buffer with a target network.

Why this module is long: one algorithm is one module, on the template every algorithm of the
collection follows (params with documented defaults, state, networks, the four factories, the losses
split into ``compute_gradients`` / ``apply_gradients``, the agent class), so that a reader finds the
whole algorithm in one place; its parts are small functions, each tested on its own.

Mnih et al. (2015), "Human-level control through deep reinforcement learning", with the usual
options: Double DQN (van Hasselt et al., 2016), a Huber or squared TD loss, and a target network
updated by hard copies every ``target_update_interval`` gradient steps or by Polyak averaging.

Discrete action spaces only (``gymnasium.spaces.Discrete``). Observations go through
``kitae.modules.qvalue.qvalue_factory``: an ``MLP`` for vectors, ``NatureCNN`` for images
``(H, W, C)``, one-hot for ``Discrete`` observations, per-key encoders for ``Dict`` spaces.

Action masks (``kitae.action_masks``): with an ``"action_mask"`` entry in ``Dict`` observations,
the greedy action and the epsilon-greedy random action are drawn among the allowed actions only,
and the TD target's max over next actions (Double DQN: the online argmax) is taken over the
actions the NEXT observation's mask allows.

The pure pieces, each usable on its own (and inside one compiled program, where the environment
step may be a traced scalar):

* ``epsilon_schedule(algo_params, n_env_steps)``: ``step -> epsilon``.
* ``dqn_targets(...)`` and ``dqn_loss(...)``: TD targets (plain or double) and the TD loss.
* ``update_target(train_state, target_update_interval, tau)``: the target-network rule.
* the factories ``train_state_dqn_factory``, ``explore_factory``, ``process_experience_factory``,
  ``compute_gradients_factory``, ``apply_gradients_factory``, ``update_step_factory``.

Usage (the CartPole benchmark's settings: rl-zoo's tuned ones with an ``l2`` loss, a final
epsilon of 0.01, an annealed learning rate and 3-step returns; a return of 500 after about 50 k
steps, held to the end)::

    import kitae.config as cfg
    from kitae.algos.collections.dqn import DQN, DQNParams
    from kitae.envs.make import make_vec_env

    env = make_vec_env("CartPole-v1", n_envs=1)
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=DQNParams(
            gamma=0.99, start_step=1000, skip_steps=256, target_update_interval=128, loss="l2",
            exploration=1.0, exploration_final=0.01, exploration_fraction=0.08, hidden=(256, 256),
        ),
        update_cfg=cfg.UpdateConfig(
            learning_rate=1e-3, learning_rate_annealing=True, max_grad_norm=10.0,
            max_buffer_size=100_000, batch_size=64, n_epochs=128,
        ),
        replay=cfg.ReplayConfig(n_step=3),
        train_cfg=cfg.TrainConfig(n_env_steps=100_000),
        env_cfg=cfg.EnvConfig(
            task_name="CartPole-v1", observation_space=env.single_observation_space,
            action_space=env.single_action_space, n_envs=env.num_envs,
        ),
    )
    agent = DQN("dqn-cartpole", config)
    stats = agent.train(env)
    print(stats.mean_return())  # mean return of the last 10 training episodes

Step units: ``start_step``, ``skip_steps`` and the exploration horizon count environment
transitions summed over all environments; ``target_update_interval`` counts gradient steps
(``TrainState.step``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import optax

import kitae.config as cfg
from kitae.action_masks import check_action_mask_space, get_action_mask, masked_argmax, masked_max
from kitae.algos.gradients import BatchLike, as_batch, update_step_from_gradients
from kitae.base import OffPolicyAgent, agent_keys
from kitae.buffer import Experience
from kitae.config import AlgoParams, register_algo_params
from kitae.distributions import EpsilonGreedy
from kitae.modules.encoders import _ACTIVATIONS, space_input_shape
from kitae.modules.optimizer import optimizer_from_config
from kitae.modules.pytree import AgentPyTree, TrainState
from kitae.modules.qvalue import qvalue_factory
from kitae.timesteps import bootstrap_discounts, compute_td_targets
from kitae.types import AlgoType, Params

__all__ = [
    "DQNParams",
    "DQNState",
    "DQNBatch",
    "DQN",
    "LOSSES",
    "epsilon_schedule",
    "dqn_targets",
    "dqn_loss",
    "update_target",
    "train_state_dqn_factory",
    "explore_factory",
    "process_experience_factory",
    "compute_gradients_factory",
    "apply_gradients_factory",
    "update_step_factory",
]

LOSSES = ("huber", "l2")
"""The TD losses ``DQNParams.loss`` accepts."""


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


def _field_error(name: str, value: Any, allowed: str, error: type = ValueError) -> Exception:
    return error(f"algo_params.{name}={value!r} is not allowed; allowed: {allowed}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@register_algo_params
@dataclass
class DQNParams(AlgoParams):
    """DQN hyperparameters.

    The defaults are Stable-Baselines3's DQN defaults where SB3 has one (SB3 counts the target
    update in environment steps; kitae counts gradient steps).

    rl-zoo's tuned settings for ``CartPole-v1``, in kitae's units: ``gamma=0.99``,
    ``start_step=1000``, ``skip_steps=256`` with ``UpdateConfig(n_epochs=128)`` (128 gradient
    steps every 256 transitions), ``target_update_interval=128`` (SB3's "every 10 environment
    steps" with training every 256 steps copies the target once per update, i.e. every 128
    gradient steps), ``exploration=1.0``, ``exploration_final=0.04``, epsilon decaying over 8 k
    transitions (``exploration_fraction=0.16`` of rl-zoo's 50 k), ``hidden=(256, 256)``,
    ``loss="huber"`` and ``UpdateConfig(learning_rate=2.3e-3, batch_size=64,
    max_buffer_size=100_000, max_grad_norm=10.0)``. ``benchmarks/bench_dqn.py`` starts from them
    and, so that the LAST training episodes stay at 500, uses ``loss="l2"``,
    ``exploration_final=0.01``, a learning rate of 1e-3 annealed to 0 over 100 k steps and
    3-step returns (``ReplayConfig(n_step=3)``; its docstring says why).

    Attributes:
        gamma: discount factor in ``[0, 1]``.
        exploration: the epsilon of epsilon-greedy exploration. A float in ``[0, 1]``: the initial
            epsilon, decayed linearly to ``exploration_final`` over the first
            ``exploration_fraction * train_cfg.n_env_steps`` transitions (constant when
            ``exploration_fraction`` is 0). Or a callable ``step -> epsilon`` (``step`` an int32
            scalar, possibly traced; it must be written with ``jax.numpy``), passed in Python:
            a callable cannot be written to YAML (``AlgoConfig.to_yaml`` raises), and
            ``exploration_final`` / ``exploration_fraction`` are then not used.
        exploration_final: epsilon at the end of the decay, in ``[0, 1]``.
        exploration_fraction: fraction of ``train_cfg.n_env_steps`` over which epsilon decays,
            in ``[0, 1]``; 0 keeps epsilon constant at ``exploration``.
        start_step: no update before this many transitions (SB3's ``learning_starts``), an
            int >= 0; actions are uniformly random before it (epsilon 1).
        skip_steps: one update every this many transitions (SB3's ``train_freq``), an int >= 1.
            Each update makes ``UpdateConfig.n_epochs`` gradient steps (SB3's ``gradient_steps``).
        target_update_interval: update the target network every this many gradient steps, an
            int >= 1.
        tau: the target update ``target <- tau * online + (1 - tau) * target``, in ``(0, 1]``;
            1 is a hard copy (classic DQN), e.g. ``tau=0.005`` with ``target_update_interval=1``
            is Polyak averaging after every gradient step.
        double_dqn: Double DQN targets: the online network picks the next action, the target
            network evaluates it.
        loss: the TD loss, ``"huber"`` (delta 1, PyTorch's ``smooth_l1_loss`` as in SB3 and the
            Nature paper's error clipping) or ``"l2"`` (``0.5 * td_error**2``). Huber bounds each
            transition's gradient, which suits clipped rewards (Atari) but can fail when values
            are large and learning is slow: on CartPole (Q near 100) with a small learning rate
            the rare terminal transitions barely pull the values down, they grow past any real
            return and the greedy action stops depending on the state. ``"l2"`` is the safer
            choice there (the CartPole benchmark uses it).
        hidden: hidden layer sizes of the Q-network's MLP (vector and discrete observations;
            image observations use ``NatureCNN``), a tuple of ints >= 1 (empty: linear Q).
        activation: activation of the MLP, a name known to ``kitae.modules.encoders.get_activation``.
    """

    gamma: float = 0.99
    exploration: float | Callable[[jax.Array], jax.Array] = 1.0
    exploration_final: float = 0.05
    exploration_fraction: float = 0.1
    start_step: int = 100
    skip_steps: int = 4
    target_update_interval: int = 2500
    tau: float = 1.0
    double_dqn: bool = False
    loss: str = "huber"
    hidden: tuple[int, ...] = (64, 64)
    activation: str = "relu"

    def __post_init__(self) -> None:
        cfg.validate_types(self, "algo_params.")
        if not 0.0 <= self.gamma <= 1.0:
            raise _field_error("gamma", self.gamma, "a float in [0, 1]")
        if callable(self.exploration):
            pass
        elif not (_is_number(self.exploration) and 0.0 <= self.exploration <= 1.0):
            raise _field_error("exploration", self.exploration, "a float in [0, 1] or a callable step -> epsilon")
        if not 0.0 <= self.exploration_final <= 1.0:
            raise _field_error("exploration_final", self.exploration_final, "a float in [0, 1]")
        if not 0.0 <= self.exploration_fraction <= 1.0:
            raise _field_error("exploration_fraction", self.exploration_fraction, "a float in [0, 1]")
        if self.start_step < 0:
            raise _field_error("start_step", self.start_step, "an int >= 0")
        if self.skip_steps < 1:
            raise _field_error("skip_steps", self.skip_steps, "an int >= 1")
        if self.target_update_interval < 1:
            raise _field_error("target_update_interval", self.target_update_interval, "an int >= 1")
        if not 0.0 < self.tau <= 1.0:
            raise _field_error("tau", self.tau, "a float in (0, 1]")
        if self.loss not in LOSSES:
            raise _field_error("loss", self.loss, f"one of {', '.join(repr(x) for x in LOSSES)}")
        if not all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in self.hidden):
            raise _field_error("hidden", self.hidden, "a tuple of ints >= 1")
        if self.activation not in _ACTIVATIONS:
            raise _field_error("activation", self.activation, f"one of {sorted(_ACTIVATIONS)}")


# ---------------------------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------------------------


class DQNState(AgentPyTree):
    """DQN's state.

    Attributes:
        qvalue: the Q-network's ``TrainState``: ``params`` (online network), ``target_params``
            (target network), ``opt_state`` and ``step`` (gradient steps so far). Its ``apply_fn``
            maps observations ``(B, *obs_shape)`` to Q-values ``(B, n_actions)``.
    """

    qvalue: TrainState


class DQNBatch(NamedTuple):
    """What ``process_fn`` hands the gradient step, for a batch of ``B`` transitions.

    Attributes:
        observation: ``(B, *obs_shape)``.
        action: action indices in ``[0, n_actions)``, ``(B,)`` int32 (the space's ``start`` removed).
        target: TD targets, ``(B,)`` float32 (no gradient flows into them).
        weight: prioritized replay's importance weights ``(B,)``, or ``None``.
    """

    observation: Any
    action: jax.Array
    target: jax.Array
    weight: jax.Array | None = None


def _check_action_space(action_space: gym.Space) -> gym.spaces.Discrete:
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ValueError(
            f"DQN does not support the action space {action_space}; DQN accepts "
            "gymnasium.spaces.Discrete action spaces only (for Box actions: SAC, TD3, DDPG, MPO or PPO; for "
            "MultiDiscrete or MultiBinary: PPO or A2C)"
        )
    return action_space


def train_state_dqn_factory(
    key: jax.Array,
    config: cfg.AlgoConfig,
    *,
    preprocess_fn: Callable | None = None,
    tabulate: bool = False,
) -> DQNState:
    """Builds the Q-network and its ``TrainState`` (target parameters = a copy of the online ones).

    The network is ``qvalue_factory(observation_space, action_space, hidden=algo_params.hidden,
    activation=algo_params.activation)``; the optimizer is ``optimizer_from_config`` (Adam, the
    ``UpdateConfig``'s clipping and annealing).

    Args:
        key: PRNG key for the initial parameters.
        config: an ``AlgoConfig`` with ``DQNParams``.
        preprocess_fn: optional ``observations -> observations`` applied before the network (pure,
            jit-able); the network is initialised on its output for a dummy observation.
        tabulate: print the network's table of layers and parameter counts.

    Returns:
        A ``DQNState``.

    Raises:
        ValueError: for a non-``Discrete`` action space.
    """
    _check_action_space(config.env_cfg.action_space)
    check_action_mask_space(config.env_cfg.observation_space, config.env_cfg.action_space, "DQN")
    params_cfg = config.algo_params
    module = qvalue_factory(
        config.env_cfg.observation_space,
        config.env_cfg.action_space,
        hidden=params_cfg.hidden,
        activation=params_cfg.activation,
    )
    dummy = jax.tree_util.tree_map(
        lambda shape: jnp.zeros((1, *shape)),
        space_input_shape(config.env_cfg.observation_space),
        is_leaf=lambda x: isinstance(x, tuple),
    )
    apply_fn: Callable[..., Any]
    if preprocess_fn is None:
        apply_fn = module.apply
    else:
        dummy = preprocess_fn(dummy)

        def apply_fn(params: Params, observations: Any) -> jax.Array:
            # flax types apply's result as Any | (Any, variables); the pair only comes with mutable=...
            return module.apply(params, preprocess_fn(observations))  # type: ignore[return-value]

    if tabulate:
        print(module.tabulate(key, dummy))
    params = module.init(key, dummy)
    return DQNState(
        qvalue=TrainState.create(
            apply_fn=apply_fn,
            params=params,
            target_params=jax.tree_util.tree_map(jnp.copy, params),
            tx=optimizer_from_config(config, AlgoType.OFF_POLICY),
        )
    )


# ---------------------------------------------------------------------------------------------
# Exploration
# ---------------------------------------------------------------------------------------------


def epsilon_schedule(algo_params: DQNParams, n_env_steps: int) -> Callable[[jax.Array | int], jax.Array]:
    """The exploration rate as a pure function of the environment step.

    * ``algo_params.exploration`` a float: ``optax.linear_schedule(exploration, exploration_final,
      int(exploration_fraction * n_env_steps))``, i.e. a linear decay over that many transitions,
      then constant; constant ``exploration`` when that horizon is 0.
    * a callable: the callable itself.

    In both cases epsilon is 1 (uniformly random actions) while ``step < start_step``.

    Args:
        algo_params: the ``DQNParams``.
        n_env_steps: the training horizon in transitions (``train_cfg.n_env_steps``).

    Returns:
        ``schedule(step) -> epsilon``: ``step`` an int scalar (Python or traced), ``epsilon`` a
        float32 scalar.
    """
    p = algo_params
    if callable(p.exploration):
        base = p.exploration
    elif isinstance(p.exploration_fraction, jax.core.Tracer):
        # swept (kitae sweep / tune: a traced value per row), so the horizon is traced too: optax's
        # linear schedule written out, as it computes it, for a horizon that is not a Python int
        horizon = jnp.floor(p.exploration_fraction * n_env_steps)

        def base(step: jax.Array) -> jax.Array:
            remaining = 1 - jnp.clip(step, 0, horizon) / jnp.maximum(horizon, 1)
            decayed = (p.exploration - p.exploration_final) * remaining + p.exploration_final
            return jnp.where(horizon > 0, decayed, p.exploration)

    else:
        horizon = int(p.exploration_fraction * n_env_steps)
        if horizon > 0:
            base = optax.linear_schedule(p.exploration, p.exploration_final, horizon)
        else:
            initial = p.exploration  # a float, or a traced one in a sweep of it

            def base(step: jax.Array) -> jax.Array:
                return jnp.full((), initial, jnp.float32)

    start_step = p.start_step

    def schedule(step: jax.Array | int) -> jax.Array:
        step = jnp.asarray(step)
        epsilon = jnp.asarray(base(step), jnp.float32)
        if start_step > 0:
            epsilon = jnp.where(step < start_step, jnp.float32(1.0), epsilon)
        return epsilon

    return schedule


def explore_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes the (jitted) epsilon-greedy ``explore_fn``.

    ``explore_fn(state, key, observations, env_step=0, exploration=None) -> (actions, log_probs)``:

    * ``observations``: ``(B, *obs_shape)``.
    * ``env_step``: transitions so far (an int, possibly traced); epsilon is
      ``epsilon_schedule(config.algo_params, config.train_cfg.n_env_steps)(env_step)``.
    * ``exploration``: if given, this epsilon (a float or scalar array) is used instead of the
      schedule (``0.0`` acts greedily).
    * returns actions ``(B,)`` int32 in the action space's units (``start`` added) and their
      log-probabilities under the epsilon-greedy distribution ``(B,)``.
    * observations with an ``"action_mask"`` (``(B, n)``): greedy and random actions are both
      drawn among the allowed actions (``EpsilonGreedy`` with ``mask``).
    """
    action_space = _check_action_space(config.env_cfg.action_space)
    schedule = epsilon_schedule(config.algo_params, config.train_cfg.n_env_steps)
    action_start = int(action_space.start)

    @jax.jit
    def explore_fn(
        state: DQNState,
        key: jax.Array,
        observations: Any,
        env_step: jax.Array | int = 0,
        exploration: jax.Array | float | None = None,
    ) -> tuple[jax.Array, jax.Array]:
        qvalues = state.qvalue.apply_fn(state.qvalue.params, observations)
        epsilon = schedule(env_step) if exploration is None else exploration
        dist = EpsilonGreedy(qvalues, epsilon, get_action_mask(observations))
        actions, log_probs = dist.sample_and_log_prob(key)
        return actions + action_start, log_probs

    return explore_fn


# ---------------------------------------------------------------------------------------------
# Targets and loss
# ---------------------------------------------------------------------------------------------


def dqn_targets(
    rewards: jax.Array,
    terminated: jax.Array,
    next_q_target: jax.Array,
    gamma: float | jax.Array,
    next_q_online: jax.Array | None = None,
    next_mask: jax.Array | None = None,
    n_steps: jax.Array | None = None,
) -> jax.Array:
    """TD targets ``r + gamma * (1 - terminated) * V(s')`` (n-step transitions:
    ``gamma ** n_steps``, ``kitae.timesteps.bootstrap_discounts``).

    Plain DQN (``next_q_online is None``): ``V(s') = max_a Q_target(s', a)``. Double DQN:
    ``V(s') = Q_target(s', argmax_a Q_online(s', a))``. Truncated transitions are not
    ``terminated``: they bootstrap from the real next observation. With ``next_mask`` the max
    (or the argmax) runs over the actions allowed in ``s'`` only (a row allowing nothing counts
    as allowing everything: ``kitae.action_masks.allowed_actions``).

    Args:
        rewards: ``(B,)``.
        terminated: ``(B,)`` bool or 0/1.
        next_q_target: the target network's Q-values of the next observations, ``(B, N)``.
        gamma: the discount.
        next_q_online: the online network's Q-values of the next observations, ``(B, N)``, for
            Double DQN; ``None`` for plain DQN.
        next_mask: the next observations' action masks ``(B, N)`` (True / 1 = allowed), or ``None``.
        n_steps: ``(B,)`` rewards summed in ``rewards`` (n-step replay), or ``None`` (one step).

    Returns:
        The targets ``(B,)``, with gradients stopped.
    """
    if next_q_online is None:
        next_values = masked_max(next_q_target, next_mask)
    else:
        next_actions = masked_argmax(next_q_online, next_mask)
        next_values = jnp.take_along_axis(next_q_target, next_actions[..., None], axis=-1)[..., 0]
    discounts = bootstrap_discounts(gamma, terminated, n_steps).astype(next_values.dtype)
    targets = compute_td_targets(jnp.asarray(rewards, next_values.dtype), discounts, next_values)
    return jax.lax.stop_gradient(targets)


def dqn_loss(
    q_values: jax.Array, actions: jax.Array, targets: jax.Array, loss: str = "huber", weights: jax.Array | None = None
) -> jax.Array:
    """The mean TD loss of the taken actions' Q-values (each weighted by ``weights``, prioritized
    replay's importance weights, when given).

    With ``td = Q(s, a) - target``: ``"huber"``: ``0.5 * td**2`` if ``|td| <= 1`` else
    ``|td| - 0.5`` (``optax.huber_loss`` with delta 1); ``"l2"``: ``0.5 * td**2``.

    Args:
        q_values: the online network's Q-values ``(B, N)``.
        actions: the actions taken, indices ``(B,)`` in ``[0, N)``.
        targets: TD targets ``(B,)``.
        loss: ``"huber"`` or ``"l2"`` (a static Python string).
        weights: ``(B,)`` per-transition weights, or ``None`` (1).

    Returns:
        A scalar.
    """
    q_taken = jnp.take_along_axis(q_values, jnp.asarray(actions, jnp.int32)[..., None], axis=-1)[..., 0]
    if loss == "huber":
        losses = optax.huber_loss(q_taken, targets, delta=1.0)
    elif loss == "l2":
        losses = optax.l2_loss(q_taken, targets)
    else:
        raise ValueError(f"loss={loss!r} is not allowed; allowed: one of {LOSSES}")
    return jnp.mean(losses if weights is None else weights * losses)


def update_target(train_state: TrainState, target_update_interval: int, tau: float) -> TrainState:
    """The target-network rule, applied after a gradient step.

    When ``train_state.step`` (gradient steps done, counting the one just applied) is a multiple
    of ``target_update_interval``: ``target <- tau * params + (1 - tau) * target`` (a copy when
    ``tau == 1``); otherwise the target is unchanged. Pure and branch-free (``jnp.where``), so
    ``step`` may be traced.

    Args:
        train_state: a ``TrainState`` with ``target_params``.
        target_update_interval: an int >= 1 (static).
        tau: a float in ``(0, 1]`` (static).

    Returns:
        The ``TrainState`` with its new ``target_params``.
    """
    if tau == 1.0:
        candidate = train_state.params
    else:
        candidate = optax.incremental_update(train_state.params, train_state.target_params, tau)
    if target_update_interval == 1:
        return train_state.replace(target_params=candidate)
    due = train_state.step % target_update_interval == 0
    target = jax.tree_util.tree_map(lambda new, old: jnp.where(due, new, old), candidate, train_state.target_params)
    return train_state.replace(target_params=target)


# ---------------------------------------------------------------------------------------------
# Processing and update
# ---------------------------------------------------------------------------------------------


def process_experience_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``process_fn(state, key, experience) -> DQNBatch`` for a sampled batch.

    ``experience`` is an ``Experience`` whose leaves are ``(B, ...)``; the TD targets use the
    target network (and the online network for Double DQN) on ``next_observation`` and stop at
    ``done`` (termination only); with action masks, only the next observation's allowed actions
    count. Actions are shifted to ``[0, n_actions)``.
    """
    p = config.algo_params
    action_space = _check_action_space(config.env_cfg.action_space)
    action_start = int(action_space.start)

    def process_fn(state: DQNState, key: jax.Array, experience: Experience) -> DQNBatch:
        del key
        qvalue = state.qvalue
        next_q_target = qvalue.apply_fn(qvalue.target_params, experience.next_observation)
        next_q_online = qvalue.apply_fn(qvalue.params, experience.next_observation) if p.double_dqn else None
        next_mask = get_action_mask(experience.next_observation)
        targets = dqn_targets(
            experience.reward, experience.done, next_q_target, p.gamma, next_q_online, next_mask, experience.n_steps
        )
        actions = jnp.asarray(experience.action, jnp.int32) - action_start
        return DQNBatch(experience.observation, actions, targets, experience.weight)

    return process_fn


def compute_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``compute_gradients_fn(state, key, batch) -> (grads, info)``.

    ``batch`` is a ``DQNBatch`` (or a tuple in its order) of ``B`` transitions; ``grads`` has the
    structure of ``state.qvalue.params``; ``info`` holds ``loss_qvalue`` and ``q_values`` (the
    mean Q-value of the taken actions), scalars, and with prioritized replay
    (``config.replay.prioritized``) ``td_error`` ``(B,)``, ``Q(s, a) - target`` (the new priorities).
    """
    loss_type = config.algo_params.loss
    prioritized = config.replay.prioritized

    def compute_gradients_fn(state: DQNState, key: jax.Array, batch: BatchLike) -> tuple[Params, dict]:
        del key
        batch = as_batch(DQNBatch, batch)

        def loss_fn(params: Params) -> tuple[jax.Array, dict]:
            q_values = state.qvalue.apply_fn(params, batch.observation)
            loss = dqn_loss(q_values, batch.action, batch.target, loss_type, batch.weight)
            q_taken = jnp.take_along_axis(q_values, batch.action[..., None], axis=-1)[..., 0]
            info = {"loss_qvalue": loss, "q_values": jnp.mean(q_taken)}
            if prioritized:
                info["td_error"] = q_taken - batch.target
            return loss, info

        (_, info), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.qvalue.params)
        return grads, info

    return compute_gradients_fn


def apply_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``apply_gradients_fn(state, grads) -> state``: one optimizer step on the Q-network,
    then ``update_target`` with ``target_update_interval`` and ``tau``."""
    interval = config.algo_params.target_update_interval
    tau = config.algo_params.tau

    def apply_gradients_fn(state: DQNState, grads: Params) -> DQNState:
        qvalue = state.qvalue.apply_gradients(grads=grads)
        return state.replace(qvalue=update_target(qvalue, interval, tau))

    return apply_gradients_fn


def update_step_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``update_step_fn(state, key, batch) -> (state, info)``: ``compute_gradients`` then
    ``apply_gradients`` (see ``kitae.algos.gradients.update_step_from_gradients``)."""
    return update_step_from_gradients(compute_gradients_factory(config), apply_gradients_factory(config))


# ---------------------------------------------------------------------------------------------
# Agent
# ---------------------------------------------------------------------------------------------


class DQN(OffPolicyAgent):
    """Deep Q-Network agent (discrete actions).

    Args:
        run_name: the run's name (logs in ``runs/<run_name>`` unless ``run_dir`` is given).
        config: an ``AlgoConfig`` whose ``algo_params`` is a ``DQNParams``.
        preprocess_fn: optional observation preprocessing (see ``train_state_dqn_factory``).
        tabulate: print the Q-network's table of layers.
        run_dir: where logs go.

    Raises:
        TypeError: when ``config.algo_params`` is not a ``DQNParams``.
        ValueError: for an action space other than ``gymnasium.spaces.Discrete``.

    Attributes:
        compute_gradients_fn: ``(state, key, batch) -> (grads, info)``, the pure first half of
            the update step.
        apply_gradients_fn: ``(state, grads) -> state``, the pure second half.
        epsilon_fn: ``step -> epsilon``, the exploration schedule.
    """

    learning_params = ("gamma", "tau")
    replay_features = frozenset({"prioritized", "n_step"})
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
        if isinstance(config, cfg.AlgoConfig):
            if not isinstance(config.algo_params, DQNParams):
                raise TypeError(f"algo_params={type(config.algo_params).__name__} is not allowed; allowed: a DQNParams")
            _check_action_space(config.env_cfg.action_space)
        super().__init__(
            run_name,
            config,
            train_state_dqn_factory,
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
        self.algo_params = self.config.algo_params
        self.compute_gradients_fn = compute_gradients_factory(self.config)
        self.gradient_factories = (compute_gradients_factory, apply_gradients_factory)
        self.apply_gradients_fn = apply_gradients_factory(self.config)
        self.epsilon_fn = epsilon_schedule(self.algo_params, self.config.train_cfg.n_env_steps)
        self._greedy = np.float32(0.0)  # epsilon of select_action (an array: no new static value)

    def acting_params(self, state: DQNState) -> DQNState:
        """The online Q-network without its optimizer state and target parameters (what acting
        reads): ``state`` is the agent's ``DQNState`` pytree; the online parameters keep their
        leaves' shape."""
        return DQNState(qvalue=state.qvalue.replace(opt_state=None, target_params=None))

    def act(
        self, acting_params: DQNState, key: jax.Array, observation: Any, env_step: Any, deterministic: bool = False
    ) -> tuple[jax.Array, jax.Array]:
        """Epsilon-greedy actions with epsilon from the schedule at ``env_step`` (pure; see
        ``BaseAgent.act``); ``deterministic``: greedy actions ``argmax_a Q(s, a)``.

        Args:
            acting_params: the ``DQNState``.
            key: a PRNG key.
            observation: ``(E, *obs_shape)`` (dicts keyed by agent in multi-agent mode).
            env_step: transitions so far, an int32 scalar (possibly traced).
            deterministic: act greedily.

        Returns:
            ``(actions (E,), log_probs (E,))``.
        """
        keys = agent_keys(key, observation, self.parallel)
        if deterministic:
            return self.explore_fn(acting_params, keys, observation, exploration=self._greedy)
        return self.explore_fn(acting_params, keys, observation, env_step=env_step)
