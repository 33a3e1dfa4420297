"""Soft Actor-Critic (SAC) for continuous (``Box``) action spaces.

Why this module is long: one algorithm is one module, on the template every algorithm of the
collection follows (params with documented defaults, state, networks, the four factories, the losses
split into ``compute_gradients`` / ``apply_gradients``, the agent class), so that a reader finds the
whole algorithm in one place; its parts are small functions, each tested on its own.

SAC (Haarnoja et al., 2018, "Soft Actor-Critic Algorithms and Applications") learns a stochastic
tanh-squashed Gaussian policy that maximises return plus entropy, with:

* an ensemble of ``n_critics`` (2: "twin") Q-networks and their Polyak-averaged targets (``tau``);
* critic targets ``r + gamma * (1 - terminated) * (min_i Q'_i(s', a') - alpha * log pi(a'|s'))``
  with ``a' ~ pi(.|s')`` sampled from the current policy;
* an actor that minimises ``alpha * log pi(a|s) - min_i Q_i(s, a)`` with reparameterised ``a``;
* a learned temperature ``alpha = exp(log_alpha)`` (its own ``TrainState``) driven towards the
  target entropy ``-|A|``, or a fixed ``alpha`` (``autotune=False``);
* uniform random actions for the first ``start_step`` environment transitions (no update before
  then either).

The policy acts in ``[-1, 1]^D``; ``explore`` / ``select_action`` return actions in the
environment's units (scaled to the ``Box`` bounds) and the update maps stored actions back to
``[-1, 1]``. Every function below is pure and jit-able; the random-action switch is a
``jnp.where`` on ``env_step``, so the same explore function runs with a traced step inside one
compiled program.

Each gradient step computes the gradients of the three losses from the same state
(``compute_gradients``: a dict ``{"qvalue", "policy", "alpha"}``), then applies them and
Polyak-updates the target critics (``apply_gradients``), as in the CleanRL / Stable-Baselines3
order: critic targets use a next-state policy sample and the entropy term, the actor uses the
current critics, the temperature uses the actor's log-probabilities.

Usage (Pendulum-v1, about 20k steps to a return near -150)::

    import kitae.config as cfg
    from kitae.algos.collections.sac import SAC, SACParams
    from kitae.envs.make import make_vec_env

    env = make_vec_env("Pendulum-v1", 1)
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=SACParams(gamma=0.99, tau=0.005, start_step=1_000),
        update_cfg=cfg.UpdateConfig(learning_rate=1e-3, max_grad_norm=None, max_buffer_size=100_000,
                                    batch_size=256, n_epochs=1),
        train_cfg=cfg.TrainConfig(n_env_steps=20_000),
        env_cfg=cfg.EnvConfig(task_name="Pendulum-v1", observation_space=env.single_observation_space,
                              action_space=env.single_action_space, n_envs=1),
    )
    agent = SAC("sac-pendulum", config)
    stats = agent.train(env, config.train_cfg.n_env_steps)
    print(stats.mean_return())
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

import kitae.config as cfg
from kitae.action_masks import refuse_action_mask
from kitae.algos.gradients import BatchLike, as_batch, update_step_from_gradients
from kitae.algos.utils import critic_td_errors, n_step_gamma, weighted_mean
from kitae.base import OffPolicyAgent, agent_keys
from kitae.config import AlgoParams, register_algo_params, validate_types
from kitae.modules.encoders import space_input_shape
from kitae.modules.optimizer import optimizer_from_config
from kitae.modules.policy import policy_factory, scale_action, unscale_action
from kitae.modules.pytree import AgentPyTree, TrainState
from kitae.modules.qvalue import qvalue_factory
from kitae.types import AlgoType, Params

__all__ = [
    "SACParams",
    "SACState",
    "SACExperience",
    "SACBatch",
    "SAC",
    "check_action_space",
    "sac_td_targets",
    "sac_critic_loss",
    "sac_actor_loss",
    "sac_temperature_loss",
    "train_state_sac_factory",
    "explore_factory",
    "process_experience_factory",
    "compute_gradients_factory",
    "apply_gradients_factory",
    "update_step_factory",
]


# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------


def _bad(field: str, value: Any, allowed: str) -> ValueError:
    return ValueError(f"algo_params.{field}={value!r} is not allowed; allowed: {allowed}")


@register_algo_params
@dataclass
class SACParams(AlgoParams):
    """SAC hyperparameters.

    Defaults follow Stable-Baselines3 / CleanRL: ``gamma=0.99``, ``tau=0.005``, twin critics,
    ``[256, 256]`` ReLU networks, automatic temperature with target entropy ``-|A|``, starting
    from ``alpha=1``. Pair them with ``UpdateConfig(max_grad_norm=None, batch_size=256,
    n_epochs=1)`` (one gradient step per environment transition with ``skip_steps=1``, 1 env).

    Attributes:
        gamma: discount factor, in ``[0, 1]``.
        tau: Polyak coefficient of the target critics, ``target <- tau * params + (1 - tau) *
            target`` after every gradient step, in ``(0, 1]``.
        start_step: environment transitions (summed over environments) of uniform random actions
            before the policy acts and the first update happens (SB3's ``learning_starts``), >= 0.
        skip_steps: update once every ``skip_steps`` transitions (SB3's ``train_freq``), >= 1.
            Each update runs ``UpdateConfig.n_epochs`` gradient steps.
        policy_frequency: update the actor and the temperature on one gradient step in
            ``policy_frequency`` (SBX's ``policy_delay``); the critics are updated on every one, >= 1.
        alpha: the initial temperature (``autotune=True``) or the fixed one (``autotune=False``), > 0.
        autotune: learn the temperature so that the policy's entropy tracks ``target_entropy``.
        target_entropy: the entropy target; ``None`` means ``-|A|`` (minus the action dimension).
        policy_learning_rate: the actor's learning rate; ``None`` uses ``UpdateConfig.learning_rate``.
        q_learning_rate: the critics' learning rate; ``None`` uses ``UpdateConfig.learning_rate``.
        alpha_learning_rate: the temperature's learning rate; ``None`` uses
            ``UpdateConfig.learning_rate``.
        policy_hidden: hidden layer sizes of the actor's MLP (ReLU), ints >= 1 (``()``: a linear
            head on the observation).
        q_hidden: hidden layer sizes of each critic's MLP (ReLU), ints >= 1 (``()``: linear).
        n_critics: number of critics in the ensemble (the target takes their minimum), >= 1.
        target_entropy_scale: discrete SAC's default target entropy, this fraction of the maximum
            entropy ``log(n)`` of ``n`` actions, in ``(0, 1]`` (CleanRL's 0.89; unused for ``Box``).
    """

    gamma: float = 0.99
    tau: float = 0.005
    start_step: int = 5_000
    skip_steps: int = 1
    policy_frequency: int = 1
    alpha: float = 1.0
    autotune: bool = True
    target_entropy: float | None = None
    policy_learning_rate: float | None = None
    q_learning_rate: float | None = None
    alpha_learning_rate: float | None = None
    policy_hidden: tuple = (256, 256)
    q_hidden: tuple = (256, 256)
    n_critics: int = 2
    target_entropy_scale: float = 0.89

    def __post_init__(self) -> None:
        validate_types(self, "algo_params.")
        if not (0.0 <= self.gamma <= 1.0):
            raise _bad("gamma", self.gamma, "a float in [0, 1]")
        if not (0.0 < self.tau <= 1.0):
            raise _bad("tau", self.tau, "a float in (0, 1]")
        if self.start_step < 0:
            raise _bad("start_step", self.start_step, "an int >= 0")
        if self.skip_steps < 1:
            raise _bad("skip_steps", self.skip_steps, "an int >= 1")
        if self.policy_frequency < 1:
            raise _bad("policy_frequency", self.policy_frequency, "an int >= 1")
        if not (self.alpha > 0.0 and math.isfinite(self.alpha)):
            raise _bad("alpha", self.alpha, "a finite float > 0")
        if self.target_entropy is not None and not math.isfinite(self.target_entropy):
            raise _bad("target_entropy", self.target_entropy, "a finite float or None (-|A|)")
        for name in ("policy_learning_rate", "q_learning_rate", "alpha_learning_rate"):
            value = getattr(self, name)
            # float32's range, as UpdateConfig.learning_rate: the optimizer computes in float32
            if value is not None and not 0.0 < value <= cfg.FLOAT32_MAX:
                raise _bad(
                    name, value, "a finite float > 0 (at most float32's 3.4e38) or None (UpdateConfig.learning_rate)"
                )
        for name in ("policy_hidden", "q_hidden"):
            value = getattr(self, name)
            if not isinstance(value, (tuple, list)) or not all(
                isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in value
            ):
                raise _bad(name, value, "a tuple of ints >= 1 (hidden layer sizes; (): linear)")
        if self.n_critics < 1:
            raise _bad("n_critics", self.n_critics, "an int >= 1")
        if not 0.0 < self.target_entropy_scale <= 1.0:
            raise _bad("target_entropy_scale", self.target_entropy_scale, "a float in (0, 1]")

    def unread_fields(self, config: cfg.AlgoConfig) -> dict[str, str]:
        """The fields a run of ``config`` does not read, each with what would make it read them
        (``kitae.config.unread_float_keys``): ``target_entropy_scale`` is discrete SAC's default
        target entropy, read only with a ``Discrete`` action space, ``target_entropy=None`` and
        ``autotune`` (``kitae.algos.collections.sac_discrete.target_entropy``)."""
        discrete = isinstance(config.env_cfg.action_space, gym.spaces.Discrete)
        if discrete and self.target_entropy is None and self.autotune:
            return {}
        return {
            "target_entropy_scale": "read only for a Discrete action space with algo_params.target_entropy=null and "
            f"algo_params.autotune=true (this run's: {config.env_cfg.action_space}, target_entropy="
            f"{self.target_entropy}, autotune={self.autotune})"
        }


# ---------------------------------------------------------------------------------------------
# State, experience and batch
# ---------------------------------------------------------------------------------------------


class SACState(AgentPyTree):
    """SAC's state.

    Attributes:
        policy: the actor; ``apply_fn(params, observations (B, *obs)) -> TanhNormal`` with batch
            shape ``(B,)`` over ``[-1, 1]^D`` actions.
        qvalue: the critic ensemble and its targets (``target_params``);
            ``apply_fn(params, observations (B, *obs), actions (B, D)) -> (n_critics, B)``, actions
            in ``[-1, 1]``.
        alpha: the temperature, ``params = {"log_alpha": ()}``; ``apply_fn(params) -> alpha ()``.
            Not updated when ``autotune=False``.

    ``qvalue`` and ``alpha`` are ``None`` in the acting params (``SAC.acting_params``: acting reads
    the policy only).
    """

    policy: TrainState
    qvalue: TrainState | None
    alpha: TrainState | None


class SACExperience(NamedTuple):
    """What SAC stores per transition (a subset of ``kitae.buffer.Experience``'s fields).

    Attributes:
        observation: ``(E, *obs_shape)``.
        action: the action in the environment's units, ``(E, D)``.
        reward: ``(E,)``.
        done: the episode terminated (no bootstrapping), ``(E,)`` bool.
        next_observation: the real next observation, ``(E, *obs_shape)``.
        truncated: the episode was cut (time limit), ``(E,)`` bool: where n-step returns stop.
        n_steps, weight: set on sampled transitions by n-step and prioritized replay
            (``kitae.buffer.Experience``'s); never stored.
    """

    observation: Any
    action: Any
    reward: Any
    done: Any
    next_observation: Any
    truncated: Any = None
    n_steps: Any = None
    weight: Any = None


class SACBatch(NamedTuple):
    """A processed minibatch, ``(B, ...)`` leaves.

    Attributes:
        observation: ``(B, *obs_shape)``.
        action: the stored action mapped to ``[-1, 1]``, ``(B, D)``.
        reward: ``(B,)`` float32.
        done: 1.0 where the episode terminated, ``(B,)`` float32.
        next_observation: ``(B, *obs_shape)``.
        n_steps: the rewards ``reward`` sums (n-step replay), ``(B,)``, or ``None`` (one).
        weight: prioritized replay's importance weights ``(B,)``, or ``None``.
    """

    observation: Any
    action: jax.Array
    reward: jax.Array
    done: jax.Array
    next_observation: Any
    n_steps: Any = None
    weight: Any = None


# ---------------------------------------------------------------------------------------------
# Losses (pure)
# ---------------------------------------------------------------------------------------------


def sac_td_targets(
    rewards: jax.Array,
    dones: jax.Array,
    next_q_values: jax.Array,
    next_log_probs: jax.Array,
    alpha: jax.Array | float,
    gamma: jax.Array | float,
) -> jax.Array:
    """Soft TD targets ``r + gamma * (1 - done) * (min_i Q'_i(s', a') - alpha * log pi(a'|s'))``.

    Args:
        rewards: ``(B,)``.
        dones: 1 where the episode terminated at this transition, ``(B,)`` (truncation is not
            termination: it bootstraps).
        next_q_values: the target critics at ``(s', a')`` with ``a' ~ pi(.|s')``, ``(N, B)``.
        next_log_probs: ``log pi(a'|s')``, ``(B,)``.
        alpha: the temperature, a scalar.
        gamma: the discount, a scalar (or ``(B,)``: ``gamma ** n_steps`` for n-step transitions).

    Returns:
        The targets ``(B,)``, with gradients stopped.
    """
    next_values = jnp.min(next_q_values, axis=0) - alpha * next_log_probs
    targets = rewards + gamma * (1.0 - dones) * next_values
    return jax.lax.stop_gradient(targets)


def sac_critic_loss(
    q_values: jax.Array,
    rewards: jax.Array,
    dones: jax.Array,
    next_q_values: jax.Array,
    next_log_probs: jax.Array,
    alpha: jax.Array | float,
    gamma: jax.Array | float,
    weights: jax.Array | None = None,
) -> jax.Array:
    """The critics' loss ``0.5 * sum_i mean_b (Q_i(s_b, a_b) - y_b)^2`` (as in SB3 / SBX), with
    ``y = sac_td_targets(rewards, dones, next_q_values, next_log_probs, alpha, gamma)``.

    Args:
        q_values: every critic at the stored ``(s, a)``, ``(N, B)``.
        rewards, dones, next_q_values, next_log_probs, alpha, gamma: as in ``sac_td_targets``.
        weights: prioritized replay's importance weights ``(B,)`` on each squared error, or ``None``.

    Returns:
        The scalar loss; its gradient flows only through ``q_values``.
    """
    targets = sac_td_targets(rewards, dones, next_q_values, next_log_probs, alpha, gamma)
    return 0.5 * jnp.sum(weighted_mean(jnp.square(q_values - targets[None]), weights))


def sac_actor_loss(log_probs: jax.Array, q_values: jax.Array, alpha: jax.Array | float) -> jax.Array:
    """The actor's loss ``mean_b (alpha * log pi(a_b|s_b) - min_i Q_i(s_b, a_b))``.

    Args:
        log_probs: ``log pi(a|s)`` of reparameterised samples ``a ~ pi(.|s)``, with the tanh
            correction, ``(B,)``.
        q_values: the (current, not target) critics at ``(s, a)``, ``(N, B)``.
        alpha: the temperature, a scalar (treated as a constant).

    Returns:
        The scalar loss.
    """
    alpha = jax.lax.stop_gradient(alpha)
    return jnp.mean(alpha * log_probs - jnp.min(q_values, axis=0))


def sac_temperature_loss(log_alpha: jax.Array, log_probs: jax.Array, target_entropy: jax.Array | float) -> jax.Array:
    """The temperature's loss ``-mean_b log_alpha * (log pi(a_b|s_b) + target_entropy)``.

    Written on ``log_alpha`` as in SB3 / SBX / softlearning: the temperature rises while the
    policy's entropy ``-log pi`` is below ``target_entropy`` and falls while it is above.

    Args:
        log_alpha: the log-temperature, a scalar.
        log_probs: the actor's ``log pi(a|s)`` of its samples, ``(B,)`` (treated as constants).
        target_entropy: the target entropy, a scalar (``-|A|`` by default).

    Returns:
        The scalar loss.
    """
    return -jnp.mean(log_alpha * jax.lax.stop_gradient(log_probs + target_entropy))


# ---------------------------------------------------------------------------------------------
# Factories
# ---------------------------------------------------------------------------------------------


DISCRETE_FACTORIES: dict[str, Callable] = {}
"""Discrete SAC's factories (``train_state``, ``explore``, ``process``, ``compute_gradients``),
which ``kitae.algos.collections.sac_discrete`` registers when imported (it builds on this module,
so this module cannot import it; importing ``kitae.algos.collections`` imports both). ``SAC``
takes them for a ``Discrete`` action space."""


def _accepts() -> str:
    return "SAC accepts a continuous gymnasium.spaces.Box action space of shape (D,) with finite bounds"


def check_action_space(action_space: Any) -> gym.spaces.Box:
    """Returns ``action_space`` if SAC can act in it (a ``Box`` of shape ``(D,)`` with finite
    bounds); raises ``ValueError`` naming SAC, the space and what it accepts otherwise."""
    if not isinstance(action_space, gym.spaces.Box):
        raise ValueError(f"SAC cannot act in the action space {action_space!r}; {_accepts()}")
    if len(action_space.shape) != 1:
        raise ValueError(
            f"SAC cannot act in the action space {action_space!r} of shape {action_space.shape}; {_accepts()}"
        )
    if not (np.all(np.isfinite(action_space.low)) and np.all(np.isfinite(action_space.high))):
        raise ValueError(
            f"SAC cannot act in the unbounded action space {action_space!r}; {_accepts()} (gymnasium's "
            "vector ClipAction wrapper reports Box(-inf, inf): build the EnvConfig from the environment's "
            "own bounded space, e.g. env.unwrapped.single_action_space)"
        )
    return action_space


def _action_bounds(config: cfg.AlgoConfig) -> tuple[np.ndarray, np.ndarray]:
    space = check_action_space(config.env_cfg.action_space)
    return np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)


def _target_entropy(config: cfg.AlgoConfig) -> float:
    params = config.algo_params
    if params.target_entropy is not None:
        return float(params.target_entropy)
    shape = check_action_space(config.env_cfg.action_space).shape
    return -float(np.prod(shape))


def _alpha_apply(params: Params) -> jax.Array:
    """The temperature ``exp(log_alpha)``."""
    return jnp.exp(params["log_alpha"])


def _dummy_observation(space: gym.Space, preprocess_fn: Callable | None) -> Any:
    shape = space_input_shape(space)

    def zeros(s: Any) -> Any:
        if isinstance(s, dict):
            return {k: zeros(v) for k, v in s.items()}
        return jnp.zeros((1, *s))

    observation = zeros(shape)
    return observation if preprocess_fn is None else preprocess_fn(observation)


def _log(value: Any) -> Any:
    """``log(value)``: Python's for a float (the bits runs had), JAX's for a traced one (a sweep of
    ``algo_params.alpha`` traces it: Python's ``math.log`` cannot read a traced value)."""
    return jnp.log(value) if isinstance(value, jax.core.Tracer) else math.log(value)


def train_state_sac_factory(
    key: jax.Array,
    config: cfg.AlgoConfig,
    *,
    preprocess_fn: Callable | None = None,
    tabulate: bool = False,
) -> SACState:
    """Creates SAC's state: actor, critic ensemble (targets = a copy) and temperature.

    The actor is ``policy_factory(..., kind="tanh_normal", hidden=policy_hidden, activation="relu")``
    and the critics ``qvalue_factory(..., hidden=q_hidden, n_critics=n_critics)``. Each network has
    its own Adam (``optimizer_from_config`` with its learning rate: clipping and annealing from the
    ``UpdateConfig``).

    Args:
        key: a PRNG key (a raw ``(2,)`` uint32 key).
        config: an ``AlgoConfig`` with ``SACParams`` and a ``Box`` action space.
        preprocess_fn: optional ``observations -> observations`` applied before both networks
            (inside their ``apply_fn``).
        tabulate: print each network's table of layers.

    Returns:
        A ``SACState``: the networks initialised on ``(1, *obs_shape)`` observations and ``(1, D)``
        actions (with ``n_critics > 1``, the critics' parameters stacked on a leading ``n_critics``
        axis), ``log_alpha`` a float32 scalar, every ``step`` an int32 scalar.
    """
    params = config.algo_params
    observation_space = config.env_cfg.observation_space
    action_space = check_action_space(config.env_cfg.action_space)
    refuse_action_mask(observation_space, "SAC")
    action_dim = int(action_space.shape[0])
    policy_key, q_key = jax.random.split(key)

    policy_module = policy_factory(
        observation_space, action_space, hidden=params.policy_hidden, kind="tanh_normal", activation="relu"
    )
    q_module = qvalue_factory(observation_space, action_space, hidden=params.q_hidden, n_critics=params.n_critics)
    single_critic = params.n_critics == 1

    def policy_apply(policy_params: Params, observations: Any) -> Any:
        if preprocess_fn is not None:
            observations = preprocess_fn(observations)
        return policy_module.apply(policy_params, observations)

    def q_apply(q_params: Params, observations: Any, actions: jax.Array) -> jax.Array:
        if preprocess_fn is not None:
            observations = preprocess_fn(observations)
        # flax types apply's result as Any | (Any, variables); the pair only comes with mutable=...
        q: jax.Array = q_module.apply(q_params, observations, actions)  # type: ignore[assignment]
        return q[None] if single_critic else q

    observation = _dummy_observation(observation_space, preprocess_fn)
    action = jnp.zeros((1, action_dim))
    if tabulate:
        print(policy_module.tabulate(policy_key, observation))
        print(q_module.tabulate(q_key, observation, action))
    policy_params = policy_module.init(policy_key, observation)
    q_params = q_module.init(q_key, observation, action)

    def optimizer(learning_rate: float | None) -> Any:
        return optimizer_from_config(config, AlgoType.OFF_POLICY, learning_rate)

    # ``step`` as an int32 array from the start (flax's default is the Python int 0, whose weak type
    # differs from the updated step's and would make every jitted function compile twice).
    step = jnp.zeros((), jnp.int32)
    return SACState(
        policy=TrainState.create(
            apply_fn=policy_apply, params=policy_params, tx=optimizer(params.policy_learning_rate)
        ).replace(step=step),
        qvalue=TrainState.create(
            apply_fn=q_apply, params=q_params, target_params=q_params, tx=optimizer(params.q_learning_rate)
        ).replace(step=step),
        alpha=TrainState.create(
            apply_fn=_alpha_apply,
            params={"log_alpha": jnp.asarray(_log(params.alpha), jnp.float32)},
            tx=optimizer(params.alpha_learning_rate),
        ).replace(step=step),
    )


def explore_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``explore_fn(state, key, observations, env_step=start_step, deterministic=False)
    -> (actions (B, D), log_probs (B,))``, jitted.

    * ``deterministic`` true: the mean action ``tanh(loc)``; log-probs are zeros.
    * otherwise, while ``env_step < start_step``: actions uniform in the ``Box`` bounds, log-probs
      ``-D * log 2`` (the uniform density on ``[-1, 1]^D``);
    * otherwise: a sample of the policy and its log-probability (on ``[-1, 1]^D``).

    ``env_step`` and ``deterministic`` may be Python values or traced arrays (one compiled
    function serves every step: they are not static). Actions are in the environment's units.
    Only ``state.policy.params`` and ``state.policy.apply_fn`` are read (``SAC.explore`` hands
    over just those).
    """
    low, high = _action_bounds(config)
    start_step = config.algo_params.start_step
    action_dim = low.shape[0]
    uniform_log_prob = -action_dim * math.log(2.0)

    def explore_fn(
        state: SACState,
        key: jax.Array,
        observations: Any,
        env_step: Any = start_step,
        deterministic: Any = False,
    ) -> tuple[jax.Array, jax.Array]:
        sample_key, random_key = jax.random.split(key)
        dist = state.policy.apply_fn(state.policy.params, observations)
        sampled, log_probs = dist.sample_and_log_prob(sample_key)
        uniform = jax.random.uniform(random_key, sampled.shape, sampled.dtype, -1.0, 1.0)
        random = jnp.logical_and(jnp.asarray(env_step) < start_step, jnp.logical_not(deterministic))
        actions = jnp.where(deterministic, dist.mode(), jnp.where(random, uniform, sampled))
        log_probs = jnp.where(deterministic, 0.0, jnp.where(random, uniform_log_prob, log_probs))
        return scale_action(actions, low, high), log_probs

    return jax.jit(explore_fn)


def process_experience_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``process_fn(state, key, experience) -> SACBatch`` for sampled transitions
    (leaves ``(B, ...)``): stored env-unit actions are mapped back to ``[-1, 1]`` (and clipped),
    rewards and terminations become float32. ``experience`` is a ``SACExperience`` or an
    ``Experience``."""
    low, high = _action_bounds(config)

    def process_fn(state: SACState, key: jax.Array, experience: Any) -> SACBatch:
        actions = jnp.clip(unscale_action(jnp.asarray(experience.action, jnp.float32), low, high), -1.0, 1.0)
        return SACBatch(
            observation=experience.observation,
            action=actions,
            reward=jnp.asarray(experience.reward, jnp.float32),
            done=jnp.asarray(experience.done, jnp.float32),
            next_observation=experience.next_observation,
            n_steps=getattr(experience, "n_steps", None),
            weight=getattr(experience, "weight", None),
        )

    return process_fn


def compute_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``compute_gradients_fn(state, key, batch) -> (grads, info)``.

    From one ``SACBatch`` and the current state, computes the gradients of
    ``sac_critic_loss`` (w.r.t. the critics), ``sac_actor_loss`` (w.r.t. the actor) and, when
    ``autotune``, ``sac_temperature_loss`` (w.r.t. ``log_alpha``; zeros otherwise).

    Returns:
        ``grads = {"qvalue": ..., "policy": ..., "alpha": ...}`` shaped like the parameters, and
        ``info = {"loss_critic", "loss_actor", "loss_alpha", "alpha"}`` (scalars), with
        ``td_error`` ``(B,)`` under prioritized replay (``critic_td_errors``).
    """
    params = config.algo_params
    gamma, autotune, prioritized = params.gamma, params.autotune, config.replay.prioritized
    target_entropy = _target_entropy(config)

    def compute_gradients_fn(state: SACState, key: jax.Array, batch: BatchLike) -> tuple[dict, dict]:
        batch = as_batch(SACBatch, batch)
        next_key, actor_key = jax.random.split(key)
        policy, qvalue = state.policy, state.qvalue
        assert qvalue is not None and state.alpha is not None  # a full state (acting params have the policy only)
        log_alpha = state.alpha.params["log_alpha"]
        alpha = jnp.exp(log_alpha)

        next_actions, next_log_probs = policy.apply_fn(policy.params, batch.next_observation).sample_and_log_prob(
            next_key
        )
        next_q_values = qvalue.apply_fn(qvalue.target_params, batch.next_observation, next_actions)

        batch_gamma = n_step_gamma(gamma, batch.n_steps)

        def critic_loss_fn(q_params: Params) -> tuple[jax.Array, jax.Array]:
            q_values = qvalue.apply_fn(q_params, batch.observation, batch.action)
            loss = sac_critic_loss(
                q_values, batch.reward, batch.done, next_q_values, next_log_probs, alpha, batch_gamma, batch.weight
            )
            return loss, q_values

        def actor_loss_fn(policy_params: Params) -> tuple[jax.Array, jax.Array]:
            actions, log_probs = policy.apply_fn(policy_params, batch.observation).sample_and_log_prob(actor_key)
            q_values = qvalue.apply_fn(qvalue.params, batch.observation, actions)
            return sac_actor_loss(log_probs, q_values, alpha), log_probs

        (critic_loss, q_values), q_grads = jax.value_and_grad(critic_loss_fn, has_aux=True)(qvalue.params)
        (actor_loss, log_probs), policy_grads = jax.value_and_grad(actor_loss_fn, has_aux=True)(policy.params)
        if autotune:
            alpha_loss, log_alpha_grad = jax.value_and_grad(sac_temperature_loss)(log_alpha, log_probs, target_entropy)
        else:
            alpha_loss = jnp.zeros((), jnp.float32)
            log_alpha_grad = jnp.zeros_like(log_alpha)

        grads = {"qvalue": q_grads, "policy": policy_grads, "alpha": {"log_alpha": log_alpha_grad}}
        info = {"loss_critic": critic_loss, "loss_actor": actor_loss, "loss_alpha": alpha_loss, "alpha": alpha}
        if prioritized:
            targets = sac_td_targets(batch.reward, batch.done, next_q_values, next_log_probs, alpha, batch_gamma)
            info["td_error"] = critic_td_errors(q_values, targets)
        return grads, info

    return compute_gradients_fn


def apply_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``apply_gradients_fn(state, grads) -> state``.

    Applies the critics' gradients and Polyak-updates their targets (``tau``) on every call; the
    actor's and the temperature's (the latter only when ``autotune``) on the calls where the
    critics' step count (before this call) is a multiple of ``policy_frequency``.
    """
    params = config.algo_params
    tau, autotune, policy_frequency = params.tau, params.autotune, params.policy_frequency

    def apply_gradients_fn(state: SACState, grads: dict) -> SACState:
        current_alpha = state.alpha
        assert state.qvalue is not None and current_alpha is not None  # a full state (acting params: the policy only)
        qvalue = state.qvalue.apply_gradients(grads=grads["qvalue"]).soft_update_target(tau)

        def update_actor(_: Any) -> tuple[TrainState, TrainState]:
            policy = state.policy.apply_gradients(grads=grads["policy"])
            alpha = current_alpha.apply_gradients(grads=grads["alpha"]) if autotune else current_alpha
            return policy, alpha

        if policy_frequency == 1:
            policy, alpha = update_actor(None)
        else:
            policy, alpha = jax.lax.cond(
                state.qvalue.step % policy_frequency == 0,
                update_actor,
                lambda _: (state.policy, state.alpha),
                None,
            )
        return SACState(policy=policy, qvalue=qvalue, alpha=alpha)

    return apply_gradients_fn


def update_step_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``update_step_fn(state, key, batch) -> (state, info)``: ``compute_gradients`` then
    ``apply_gradients`` (see ``kitae.algos.gradients.update_step_from_gradients``)."""
    return update_step_from_gradients(compute_gradients_factory(config), apply_gradients_factory(config))


# ---------------------------------------------------------------------------------------------
# Agent
# ---------------------------------------------------------------------------------------------


class SAC(OffPolicyAgent):
    """Soft Actor-Critic agent for continuous (``Box``) action spaces, and for ``Discrete`` ones
    (discrete SAC, ``kitae.algos.collections.sac_discrete``).

    Args:
        run_name: name of the run (logs go to ``runs/<run_name>`` unless ``run_dir`` is given).
        config: an ``AlgoConfig`` whose ``algo_params`` is a ``SACParams``.
        preprocess_fn: optional observation preprocessing (applied inside both networks).
        tabulate: print each network's table of layers.
        run_dir: where logs go.

    Raises:
        TypeError: if ``config.algo_params`` is not a ``SACParams``.
        ValueError: for an action space other than a bounded ``Box`` of shape ``(D,)`` or a
            ``Discrete`` one.

    Attributes:
        discrete: whether the action space is ``Discrete`` (discrete SAC).
        compute_gradients_fn: ``(state, key, batch) -> (grads, info)`` (pure).
        apply_gradients_fn: ``(state, grads) -> state`` (pure).
    """

    learning_params = ("gamma", "tau")
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
        run_dir: Any = None,
    ) -> None:
        if not isinstance(config, cfg.AlgoConfig):
            raise TypeError(f"config={type(config).__name__} is not allowed; allowed: a kitae.config.AlgoConfig")
        if not isinstance(config.algo_params, SACParams):
            raise TypeError(
                f"algo_params={type(config.algo_params).__name__} is not allowed; allowed: a "
                "kitae.algos.collections.sac.SACParams"
            )
        self.discrete = isinstance(config.env_cfg.action_space, gym.spaces.Discrete)
        if self.discrete:
            factories = DISCRETE_FACTORIES
            train_state, explore, process = factories["train_state"], factories["explore"], factories["process"]
            compute_gradients = factories["compute_gradients"]
        else:
            try:
                check_action_space(config.env_cfg.action_space)
            except ValueError as error:
                raise ValueError(f"{error}, or a Discrete one (discrete SAC)") from None
            train_state, explore, process = train_state_sac_factory, explore_factory, process_experience_factory
            compute_gradients = compute_gradients_factory

        def update_step(config: cfg.AlgoConfig) -> Callable:
            return update_step_from_gradients(compute_gradients(config), apply_gradients_factory(config))

        super().__init__(
            run_name,
            config,
            train_state,
            explore,
            process,
            update_step,
            preprocess_fn=preprocess_fn,
            tabulate=tabulate,
            experience_type=SACExperience,
            run_dir=run_dir,
        )

    def _configure(self) -> None:
        super()._configure()
        compute_gradients = DISCRETE_FACTORIES["compute_gradients"] if self.discrete else compute_gradients_factory
        self.algo_params: SACParams = self.config.algo_params
        self.compute_gradients_fn = compute_gradients(self.config)
        self.gradient_factories = (compute_gradients, apply_gradients_factory)
        self.apply_gradients_fn = apply_gradients_factory(self.config)

    def acting_params(self, state: SACState) -> SACState:
        """The part of the state that acting reads: the policy without its optimizer state, so
        each act call hands the compiled function a handful of arrays instead of ~60. ``state`` is
        the agent's ``SACState`` pytree; the policy's parameters keep their leaves' shape,
        ``qvalue`` and ``alpha`` become ``None``."""
        return SACState(policy=state.policy.replace(opt_state=None), qvalue=None, alpha=None)

    def act(
        self, acting_params: SACState, key: jax.Array, observation: Any, env_step: Any, deterministic: bool = False
    ) -> tuple[jax.Array, jax.Array]:
        """Samples actions (uniform random ones while ``env_step < start_step``), pure (see
        ``BaseAgent.act``); ``deterministic``: ``tanh(mean)`` scaled to the bounds, log-probs 0.

        Returns:
            ``(actions (E, D) in the environment's units, log_probs (E,))``.
        """
        return self.explore_fn(
            acting_params,
            agent_keys(key, observation, self.parallel),
            observation,
            env_step=env_step,
            deterministic=deterministic,
        )
