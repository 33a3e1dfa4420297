"""DDPG: Deep Deterministic Policy Gradient (Lillicrap et al., 2016, https://arxiv.org/abs/1509.02971),
for continuous actions.

A deterministic, tanh-bounded policy ``pi(s)`` in ``[-1, 1]`` and ONE critic ``Q``, each with a
Polyak-averaged target network; the critic's target is ``r + gamma * (1 - terminated) *
Q_targ(s', pi_targ(s'))`` and the actor's loss ``-mean(Q(s, pi(s)))``, both updated on every
gradient step. That is TD3 (``kitae.algos.collections.td3``) with one critic, no target policy
smoothing and no delay, so DDPG takes TD3's state, processing, losses and
``compute_gradients`` / ``apply_gradients`` with those settings (``DDPGParams`` exposes them as
``n_critics=1``, ``policy_noise=0``, ``noise_clip=0``, ``policy_delay=1``) instead of copying them.
``tests/test_ddpg.py`` checks the loss against hand-computed values.

Exploration noise (``noise_type``), in ``[-1, 1]`` action units, added to ``pi(s)`` and clipped:

* ``"normal"``: independent ``N(0, exploration_noise)`` at each step;
* ``"ornstein_uhlenbeck"``: the temporally correlated process of the DDPG paper (SB3's
  ``OrnsteinUhlenbeckActionNoise``): ``x <- x + ou_theta * (0 - x) * ou_dt + exploration_noise *
  sqrt(ou_dt) * N(0, 1)``, starting from 0 where an episode starts. The noise is state that acting
  carries from step to step, per environment: the agent is then ``recurrent`` (its noise is the
  hidden state), so every executor carries it and resets it at episode starts with the rule
  written once for recurrent agents (``kitae.loops.collect``), and checkpoints keep it.

Uniform random actions before ``start_step`` transitions, as TD3's.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import kitae.algos.collections.td3 as td3
import kitae.config as cfg
from kitae.action_masks import refuse_action_mask
from kitae.base import OffPolicyAgent, agent_keys
from kitae.buffer import Experience
from kitae.config import AlgoParams, register_algo_params, validate_types
from kitae.modules.policy import scale_action

__all__ = [
    "DDPGParams",
    "DDPG",
    "NOISE_TYPES",
    "check_action_space",
    "ou_noise_step",
    "train_state_ddpg_factory",
    "explore_factory",
    "process_experience_factory",
    "compute_gradients_factory",
    "apply_gradients_factory",
    "update_step_factory",
]

_require = cfg.check_algo_param

NOISE_TYPES = ("normal", "ornstein_uhlenbeck")


@register_algo_params
@dataclass
class DDPGParams(AlgoParams):
    """DDPG's hyperparameters (defaults: Stable-Baselines3's DDPG, except ``start_step``).

    Attributes:
        gamma: discount factor, in ``[0, 1]``.
        tau: Polyak coefficient of both target networks, in ``(0, 1]``.
        exploration_noise: the noise's scale in ``[-1, 1]`` action units (finite, >= 0): the
            normal noise's std, the Ornstein-Uhlenbeck process's ``sigma``.
        noise_type: ``"normal"`` or ``"ornstein_uhlenbeck"``.
        ou_theta: the Ornstein-Uhlenbeck process's pull to 0 (finite, >= 0).
        ou_dt: its time step (> 0).
        start_step: uniform random actions, and no update, before this many transitions (>= 0).
        skip_steps: update once every ``skip_steps`` transitions (>= 1), ``UpdateConfig.n_epochs``
            gradient steps each.
        actor_hidden, critic_hidden: hidden sizes of the actor's and the critic's MLPs (ReLU).
    """

    gamma: float = 0.99
    tau: float = 0.005
    exploration_noise: float = 0.1
    noise_type: str = "normal"
    ou_theta: float = 0.15
    ou_dt: float = 1e-2
    start_step: int = 1000
    skip_steps: int = 1
    actor_hidden: tuple[int, ...] = (400, 300)
    critic_hidden: tuple[int, ...] = (400, 300)

    # What TD3's factories read, fixed for DDPG: one critic, no smoothing, no delay.
    @property
    def n_critics(self) -> int:
        """One critic (TD3's factories read it)."""
        return 1

    @property
    def policy_noise(self) -> float:
        """No target-policy smoothing noise."""
        return 0.0

    @property
    def noise_clip(self) -> float:
        """No smoothing noise to clip."""
        return 0.0

    @property
    def policy_delay(self) -> int:
        """The actor is updated at every critic update (no delay)."""
        return 1

    def __post_init__(self) -> None:
        validate_types(self, "algo_params.")
        td3.check_deterministic_actor_params(self)
        _require(self.noise_type in NOISE_TYPES, "noise_type", self.noise_type, f"one of {', '.join(NOISE_TYPES)}")
        _require(0.0 <= self.ou_theta < math.inf, "ou_theta", self.ou_theta, "a finite float >= 0")
        _require(0.0 < self.ou_dt < math.inf, "ou_dt", self.ou_dt, "a finite float > 0")

    def unread_fields(self, config: cfg.AlgoConfig) -> dict[str, str]:
        """The fields a run of ``config`` does not read, each with what would make it read them
        (``kitae.config.unread_float_keys``): the Ornstein-Uhlenbeck process's without it."""
        if self.noise_type == "ornstein_uhlenbeck":
            return {}
        why = "read only with algo_params.noise_type=ornstein_uhlenbeck"
        return {"ou_theta": why, "ou_dt": why}


def check_action_space(action_space: Any) -> Any:
    """TD3's check, naming DDPG: a ``Box`` of shape ``(D,)`` with finite bounds, else ``ValueError``."""
    return td3.check_action_space(action_space, "DDPG")


def ou_noise_step(
    key: jax.Array, noise: jax.Array, start: jax.Array, sigma: float | jax.Array, theta: float, dt: float
) -> jax.Array:
    """One step of the Ornstein-Uhlenbeck process from ``noise`` ``(E, D)`` (0 where ``start``
    ``(E,)`` holds: an episode starts): ``x + theta * (0 - x) * dt + sigma * sqrt(dt) * N(0, 1)``."""
    x = jnp.where(jnp.asarray(start, bool)[:, None], 0.0, noise)
    return x - theta * x * dt + sigma * math.sqrt(dt) * jax.random.normal(key, x.shape, x.dtype)


def train_state_ddpg_factory(
    key: jax.Array, config: cfg.AlgoConfig, *, preprocess_fn: Callable | None = None, tabulate: bool = False
) -> td3.TD3State:
    """TD3's state with one critic: the actor, the critic, their targets and Adam optimizers
    (``td3.train_state_td3_factory``, same arguments: ``key`` a PRNG key (a raw ``(2,)`` uint32 key)); the critic's
    ``apply_fn`` returns ``(1, B)``, the ensemble layout of TD3's ``(2, B)``."""
    td3.check_action_space(config.env_cfg.action_space, "DDPG")
    refuse_action_mask(config.env_cfg.observation_space, "DDPG")  # named DDPG, not TD3, in the error
    return td3.train_state_td3_factory(key, config, preprocess_fn=preprocess_fn, tabulate=tabulate)


def explore_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``explore_fn(state, key, observations, noise, env_step) -> (actions, log_probs)``:
    ``clip(pi(s) + noise, -1, 1)`` (``noise`` ``(B, D)`` in ``[-1, 1]`` units), uniform random
    actions while ``env_step < start_step``, scaled to the ``Box`` bounds; log-probs zeros."""
    space = td3.check_action_space(config.env_cfg.action_space, "DDPG")
    low, high = np.asarray(space.low, np.float32), np.asarray(space.high, np.float32)
    start_step = config.algo_params.start_step

    @jax.jit
    def explore_fn(
        state: td3.TD3State, key: jax.Array, observations: Any, noise: jax.Array, env_step: Any
    ) -> tuple[jax.Array, jax.Array]:
        actions = jnp.clip(state.actor.apply_fn(state.actor.params, observations) + noise, -1.0, 1.0)
        random_actions = jax.random.uniform(key, actions.shape, actions.dtype, -1.0, 1.0)
        actions = jnp.where(jnp.asarray(env_step) < start_step, random_actions, actions)
        return scale_action(actions, low, high).astype(jnp.float32), jnp.zeros(actions.shape[:-1], jnp.float32)

    return explore_fn


process_experience_factory = td3.process_experience_factory
"""TD3's: stored actions back to ``[-1, 1]``, ``gamma * (1 - terminated)`` discounts."""

compute_gradients_factory = td3.compute_gradients_factory
"""TD3's, which with ``DDPGParams`` is DDPG's: target ``r + discount * Q_targ(s', pi_targ(s'))``,
critic loss ``mean((Q(s, a) - y)^2)``, actor loss ``-mean(Q(s, pi(s)))`` on every step."""

apply_gradients_factory = td3.apply_gradients_factory
"""TD3's: the critic's and the actor's steps, then both targets Polyak-averaged (every step)."""

update_step_factory = td3.update_step_factory


class DDPG(OffPolicyAgent):
    """DDPG agent (continuous ``Box`` actions of shape ``(D,)`` with finite bounds).

    Args:
        run_name, config (``algo_params`` a ``DDPGParams``), preprocess_fn, tabulate, run_dir: as
            ``TD3``'s.

    Raises:
        TypeError: if ``config.algo_params`` is not a ``DDPGParams``.
        ValueError: for an action space other than a bounded 1-D ``Box``, or Ornstein-Uhlenbeck
            noise in a multi-agent environment.
    """

    learning_params = ("gamma", "tau")
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
        if not isinstance(config.algo_params, DDPGParams):
            raise TypeError(
                f"algo_params={type(config.algo_params).__name__} is not allowed for DDPG; allowed: a DDPGParams"
            )
        td3.check_action_space(config.env_cfg.action_space, "DDPG")
        p = config.algo_params
        # Ornstein-Uhlenbeck noise is state carried from step to step: the recurrent road.
        self.recurrent = p.noise_type == "ornstein_uhlenbeck"
        if self.recurrent and config.env_cfg.n_agents > 1:
            raise ValueError(
                "algo_params.noise_type='ornstein_uhlenbeck' is not allowed in a multi-agent environment "
                f"(env_cfg.n_agents={config.env_cfg.n_agents}); allowed: 'normal'"
            )
        super().__init__(
            run_name,
            config,
            train_state_ddpg_factory,
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
        self.algo_params: DDPGParams = config.algo_params
        self.compute_gradients_fn = compute_gradients_factory(config)
        self.gradient_factories = (compute_gradients_factory, apply_gradients_factory)
        self.apply_gradients_fn = apply_gradients_factory(config)
        self._action_dim = int(np.prod(config.env_cfg.action_space.shape or (1,)))  # a 1-D Box
        self._explore = explore_factory(config)  # per agent in multi-agent mode (act splits the keys)
        self._not_random = np.asarray(self.algo_params.start_step, np.int32)  # env_step >= start_step

    def acting_params(self, state: td3.TD3State) -> td3.TD3State:
        """The actor without its optimizer state and target parameters (what acting reads):
        ``state`` is the agent's ``TD3State`` pytree; the actor's parameters keep their leaves'
        shape, ``critic`` becomes ``None``."""
        return td3.TD3State(actor=state.actor.replace(opt_state=None, target_params=None), critic=None)

    def act(
        self, acting_params: td3.TD3State, key: jax.Array, observation: Any, env_step: Any, deterministic: bool = False
    ) -> tuple[Any, Any]:
        """Policy actions plus normal noise (uniform random before ``start_step``), in the
        environment's units, pure; ``deterministic``: no noise. With Ornstein-Uhlenbeck noise the
        agent acts with ``act_recurrent`` (its noise is carried state).

        Returns:
            ``(actions (E, D), log_probs (E,) zeros)``.
        """
        if self.recurrent:
            raise TypeError("DDPG with Ornstein-Uhlenbeck noise acts with act_recurrent (the noise is its state)")
        keys = agent_keys(key, observation, self.parallel)

        def one(k: jax.Array, obs: Any) -> tuple[jax.Array, jax.Array]:
            noise_key, random_key = jax.random.split(k)
            n = jax.tree_util.tree_leaves(obs)[0].shape[0]
            scale = 0.0 if deterministic else self.algo_params.exploration_noise
            noise = scale * jax.random.normal(noise_key, (n, self._action_dim), jnp.float32)
            step = self._not_random if deterministic else env_step
            return self._explore(acting_params, random_key, obs, noise, step)

        if self.parallel:
            out = {a: one(keys[a], observation[a]) for a in observation}
            return {a: o[0] for a, o in out.items()}, {a: o[1] for a, o in out.items()}
        return one(keys, observation)

    def initial_hidden(self, n: int) -> jax.Array:
        """Ornstein-Uhlenbeck noise at rest: zeros ``(n, D)``."""
        return jnp.zeros((n, self._action_dim), jnp.float32)

    def act_recurrent(
        self,
        acting_params: td3.TD3State,
        key: jax.Array,
        observation: Any,
        hidden: jax.Array,
        start: jax.Array,
        env_step: Any,
        deterministic: bool = False,
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Acts with Ornstein-Uhlenbeck noise: the noise ``hidden`` ``(E, D)`` steps on
        (``ou_noise_step``, from 0 where ``start`` holds) and is added to ``pi(s)``;
        ``deterministic``: no noise, the noise state unchanged.

        Returns:
            ``(actions (E, D), log_probs (E,) zeros, noise (E, D))``.
        """
        p = self.algo_params
        noise_key, random_key = jax.random.split(key)
        if deterministic:
            noise, step = jnp.zeros_like(hidden), self._not_random
        else:
            hidden = ou_noise_step(noise_key, hidden, start, p.exploration_noise, p.ou_theta, p.ou_dt)
            noise, step = hidden, env_step
        actions, log_probs = self._explore(acting_params, random_key, observation, noise, step)
        return actions, log_probs, hidden
