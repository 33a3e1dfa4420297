"""Recurrent PPO (``kitae train ppo_lstm``, rl-zoo's name; SB3-contrib's ``RecurrentPPO``).

Why this module is long: one algorithm is one module (params, state, network, the four factories,
the losses over sequences, the agent class), on the template of ``kitae.algos.collections.ppo``,
whose losses, heads and action mapping it reuses.

PPO with a recurrent core (``kitae.modules.recurrent``: Flax's LSTM or GRU cell) between the
observation encoder and the policy and value heads, for partially observed tasks:

* **Network**: ``encoder (hidden_sizes) -> core -> MLP (head_sizes) -> head``, with an MLP of its
  own for the policy and for the value (SB3's ``net_arch=dict(pi=..., vf=...)`` after the LSTM).
  ``shared_core=True``: one encoder and one core feed both (the hidden state is the core's);
  ``False``: the actor and the critic each have their own encoder and core (SB3's
  ``enable_critic_lstm``; the hidden state is the pair ``(actor, critic)``).
* **Hidden state outside the network**: the executors carry it per environment
  (``kitae.loops.collect.Memory``) and hand it to ``act_recurrent``; where an observation starts
  an episode (after a termination or a truncation alike, and at every reset) the core starts from
  the initial state.
* **Storage**: each stored step holds the hidden state it was acted with (before the reset) and
  its ``start`` flag. The rollout of each environment is cut into sequences of
  ``sequence_length`` steps (default: the whole rollout); a sequence keeps the stored hidden
  state at its first step.
* **Processing** (one environment's rollout ``(T, ...)``): the core is re-run over the rollout from
  the stored state at its first step, giving ``V(obs_t)``; ``V(next_obs_t)`` (the bootstrap at a
  truncation, the real final observation) is the critic's step from the core's state after step
  ``t``; GAE as PPO's (``terminated`` stops bootstrapping, both cut the chain).
* **Update**: minibatches of whole sequences (``batch_size / sequence_length`` of them, shuffled
  over sequences, never over single steps); the core is re-run over each sequence from its stored
  state, with the resets at the stored starts; PPO's clipped losses on every step.

* **Multi-agent environments** (shared parameters, ``env_cfg.n_agents > 1``): each agent carries its
  own hidden state (``Memory`` holds dicts keyed by agent); the functions above are written for one
  agent in one environment and lifted over agents like PPO's.

* **Observation and reward normalisation** (``PPOParams.normalize_observations``,
  ``normalize_rewards``; rl-zoo's ``normalize: True``): PPO's running statistics, in the state
  and updated by PPO's hooks around every update (``ppo.update_hooks_factory``): acting, the
  processing's pass over the rollout and the update all read normalised observations, and GAE
  the scaled rewards.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp

import kitae.config as cfg
from kitae.algos.collections.ppo import (
    PPOParams,
    PPOState,
    _action_map,
    _observation_normalizer,
    apply_action_mask,
    apply_gradients_factory,
    check_spaces,
    init_running_statistics,
    normalize_advantages,
    policy_head,
    ppo_loss,
    scale_rewards,
    update_hooks_factory,
)
from kitae.algos.factory import explore_general_factory
from kitae.algos.gradients import BatchLike, as_batch, update_step_from_gradients
from kitae.algos.update import UpdateHooks
from kitae.base import OnPolicyAgent, agent_keys
from kitae.config import register_algo_params
from kitae.modules.encoders import MLP, encoder_factory, space_input_shape
from kitae.modules.optimizer import optimizer_from_config
from kitae.modules.pytree import TrainState
from kitae.modules.recurrent import CORES, RecurrentCore, initial_hidden
from kitae.modules.value import ValueHead
from kitae.timesteps import compute_gae
from kitae.types import AlgoType, Params

__all__ = [
    "RecurrentPPOParams",
    "RecurrentPPOState",
    "RecurrentExperience",
    "RecurrentPPOBatch",
    "RecurrentActorCritic",
    "RecurrentPPO",
    "train_state_factory",
    "explore_factory",
    "process_experience_factory",
    "compute_gradients_factory",
    "apply_gradients_factory",
    "update_step_factory",
    "sequence_outputs",
]

_require = cfg.check_algo_param


@register_algo_params
@dataclass
class RecurrentPPOParams(PPOParams):
    """Recurrent PPO hyperparameters: PPO's (``PPOParams``) and the core's.

    Attributes:
        core: ``"lstm"`` or ``"gru"`` (Flax's ``OptimizedLSTMCell`` / ``GRUCell``).
        core_size: the core's hidden size (>= 1).
        head_sizes: hidden layers between the core and each head (ints >= 1, possibly empty);
            ``hidden_sizes`` are the encoder's, before the core.
        shared_core: one encoder and core for the actor and the critic (``True``), or one each.
        sequence_length: steps per training sequence (>= 1, dividing the rollout length
            ``max_buffer_size`` and ``batch_size``); ``None``: the whole rollout of an environment.
    """

    ADVANTAGE_ESTIMATORS = ("gae",)  # its processing computes GAE only

    core: str = "lstm"
    core_size: int = 128
    head_sizes: tuple = ()
    shared_core: bool = True
    sequence_length: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _require(self.core in CORES, "core", self.core, f"one of {', '.join(map(repr, CORES))}")
        _require(self.core_size >= 1, "core_size", self.core_size, "an int >= 1")
        _require(
            all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in self.head_sizes),
            "head_sizes",
            self.head_sizes,
            "a tuple of ints >= 1 (possibly empty)",
        )
        _require(
            self.sequence_length is None or self.sequence_length >= 1,
            "sequence_length",
            self.sequence_length,
            "an int >= 1, or None for whole rollouts",
        )


def sequence_length(config: cfg.AlgoConfig) -> int:
    """The training sequence length: ``sequence_length`` or the rollout length."""
    p: RecurrentPPOParams = config.algo_params
    return config.update_cfg.max_buffer_size if p.sequence_length is None else p.sequence_length


NAME = "recurrent PPO (ppo_lstm)"
"""How errors name this algorithm (``check_spaces`` would say ``PPO``, the user made ``ppo_lstm``)."""


def check_config(config: cfg.AlgoConfig) -> None:
    """Refuses configs recurrent PPO cannot train, when the agent is made.

    Raises:
        ValueError: naming the field, its value and what is allowed (spaces: naming ``NAME``).
    """
    check_spaces(config, NAME)
    length, rollout, batch = sequence_length(config), config.update_cfg.max_buffer_size, config.update_cfg.batch_size
    if rollout % length:
        raise ValueError(
            f"algo_params.sequence_length={length} does not divide update_cfg.max_buffer_size={rollout} (the rollout "
            "length); allowed: a divisor of it"
        )
    if batch % length:
        raise ValueError(
            f"update_cfg.batch_size={batch} is not a multiple of algo_params.sequence_length={length}; minibatches "
            "hold whole sequences"
        )
    workers = config.distributed.gradient_workers if config.distributed is not None else 1
    if (batch // length) % workers:
        raise ValueError(
            f"distributed.gradient_workers={workers} is not allowed; allowed: a divisor of the {batch // length} "
            f"sequences of a minibatch (update_cfg.batch_size={batch} / algo_params.sequence_length={length}): "
            "each gradient worker takes an equal part of every minibatch"
        )


# ---------------------------------------------------------------------------------------------
# State and network
# ---------------------------------------------------------------------------------------------


class RecurrentPPOState(PPOState):
    """The recurrent PPO agent's state: PPO's fields (``PPOState``).

    Attributes:
        actor_critic: ``TrainState`` of a ``RecurrentActorCritic`` (``method="step"``).
        observation_statistics, return_statistics, discounted_returns: PPO's running statistics,
            used with ``normalize_observations`` / ``normalize_rewards``.
    """


class RecurrentActorCritic(nn.Module):
    """``encoder -> core -> heads``, one step for a batch of rows.

    Attributes:
        encoder_fn: makes an observation encoder ``(B, *obs_shape) -> (B, F)``.
        head_fn: makes the MLP between the core and a head ``(B, core) -> (B, H)``.
        policy_head: features -> a distribution with batch shape ``(B,)``.
        value_head: features -> values ``(B,)``.
        kind, features: the core (``RecurrentCore``).
        shared: one encoder and core for both heads, else one each.
    """

    encoder_fn: Callable[[], nn.Module]
    head_fn: Callable[[], nn.Module]
    policy_head: nn.Module
    value_head: nn.Module
    kind: str
    features: int
    shared: bool

    def setup(self) -> None:
        """Makes the submodules: the encoder, the core and the two head MLPs, plus a second
        encoder and core for the critic unless ``shared``."""
        self.encoder = self.encoder_fn()
        self.core = RecurrentCore(self.kind, self.features)
        self.policy_mlp, self.value_mlp = self.head_fn(), self.head_fn()
        if not self.shared:
            self.value_encoder = self.encoder_fn()
            self.value_core = RecurrentCore(self.kind, self.features)

    def encode(self, observations: Any) -> Any:
        """The encoders over a batch of rows: ``observations (N, ...) -> features`` ``(N, D)``
        (shared core) or the pair ``(actor, critic)``."""
        if self.shared:
            return self.encoder(observations)
        return self.encoder(observations), self.value_encoder(observations)

    def cores(self, hidden: Any, features: Any, start: jax.Array) -> tuple[Any, Any]:
        """One step of the core(s): ``(hidden, features as encode gives them, start (B,)) ->
        (hidden, outputs)``, ``outputs`` ``(B, F)`` or the pair ``(actor, critic)``; where
        ``start`` holds the row starts from the initial state."""
        if self.shared:
            return self.core(hidden, features, start)
        (actor, critic), (x_actor, x_critic) = hidden, features
        actor, y_actor = self.core(actor, x_actor, start)
        critic, y_critic = self.value_core(critic, x_critic, start)
        return (actor, critic), (y_actor, y_critic)

    def heads(self, outputs: Any) -> tuple[Any, jax.Array]:
        """The heads over a batch of core outputs (``(N, F)`` or the pair): ``(distribution with
        batch shape (N,), values (N,))``."""
        y_actor, y_critic = (outputs, outputs) if self.shared else outputs
        return self.policy_head(self.policy_mlp(y_actor)), self.value_head(self.value_mlp(y_critic))

    def step(self, hidden: Any, observations: Any, start: jax.Array) -> tuple[Any, Any, jax.Array]:
        """``(hidden, observations (B, ...), start (B,)) -> (hidden, distribution, values (B,))``;
        where ``start`` holds the row starts from the initial state."""
        hidden, outputs = self.cores(hidden, self.encode(observations), start)
        return (hidden, *self.heads(outputs))

    def __call__(self, hidden: Any, observations: Any, start: jax.Array) -> tuple[Any, Any, jax.Array]:
        """``step``: ``(hidden, observations (B, *obs_shape), start (B,)) -> (hidden, distribution
        with batch shape (B,), values (B,))``; ``hidden`` as ``agent_initial_hidden`` makes it (GRU
        ``(B, features)``, LSTM a pair of them; a pair of those with separate cores)."""
        return self.step(hidden, observations, start)


def _module(config: cfg.AlgoConfig) -> RecurrentActorCritic:
    p: RecurrentPPOParams = config.algo_params
    distribution = policy_head(config.env_cfg.action_space, p.log_std_init)  # the space passed check_spaces
    space = config.env_cfg.observation_space

    def encoder() -> nn.Module:
        return encoder_factory(space, hidden=p.hidden_sizes, activation=p.activation)

    def head() -> nn.Module:
        return MLP(p.head_sizes, p.activation)

    return RecurrentActorCritic(encoder, head, distribution, ValueHead(), p.core, p.core_size, p.shared_core)


def agent_initial_hidden(config: cfg.AlgoConfig, n: int) -> Any:
    """The initial hidden state of ``n`` rows (``kitae.modules.recurrent.initial_hidden``; a pair
    ``(actor, critic)`` with separate cores)."""
    p: RecurrentPPOParams = config.algo_params
    one = initial_hidden(p.core, p.core_size, n)
    return one if p.shared_core else (one, initial_hidden(p.core, p.core_size, n))


def train_state_factory(
    key: jax.Array, config: cfg.AlgoConfig, *, preprocess_fn: Callable | None = None, tabulate: bool = False
) -> RecurrentPPOState:
    """Builds the state: the recurrent actor-critic's ``TrainState`` (initialised on one row:
    observations ``(1, *obs_shape)``, the initial hidden state, ``start`` ``(1,)``) and PPO's
    running statistics (observations ``(*obs_shape)``, returns scalars, ``discounted_returns``
    ``(n_envs * n_agents,)``).

    Args:
        key: a PRNG key (a raw ``(2,)`` uint32 key) for the parameters.
        config: the ``AlgoConfig`` (``algo_params`` a ``RecurrentPPOParams``).
        preprocess_fn: must be ``None``.
        tabulate: print the network's table of layers and parameters.

    Returns:
        A ``RecurrentPPOState``.

    Raises:
        ValueError: for a config recurrent PPO cannot train (``check_config``), or a
            ``preprocess_fn`` (not available for the recurrent agent).
    """
    check_config(config)
    if preprocess_fn is not None:
        raise ValueError("preprocess_fn is not available for recurrent PPO; allowed: None")
    module = _module(config)
    shape = space_input_shape(config.env_cfg.observation_space)
    observations = jax.tree_util.tree_map(
        lambda s: jnp.zeros((1, *s), jnp.float32), shape, is_leaf=lambda s: isinstance(s, tuple)
    )
    inputs = (agent_initial_hidden(config, 1), observations, jnp.ones((1,), bool))
    if tabulate:
        print(module.tabulate(key, *inputs))
    params = module.init(key, *inputs)
    space = config.env_cfg.observation_space
    obs_shape = space.shape if isinstance(space, gym.spaces.Box) else ()
    return RecurrentPPOState(
        actor_critic=TrainState.create(
            apply_fn=module.apply, params=params, tx=optimizer_from_config(config, AlgoType.ON_POLICY)
        ),
        observation_statistics=init_running_statistics(tuple(obs_shape)),
        return_statistics=init_running_statistics(()),
        discounted_returns=jnp.zeros((config.env_cfg.n_envs * config.env_cfg.n_agents,), jnp.float32),
    )


# ---------------------------------------------------------------------------------------------
# Explore
# ---------------------------------------------------------------------------------------------


def explore_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``explore_fn(state, key, observations, hidden, start, deterministic=False) ->
    (actions, log_probs, hidden)``: one step of the core from ``hidden`` (the initial state where
    ``start`` holds), then a sample of the policy (``deterministic``: its mode). Actions in the
    environment's units, as PPO's. Observations are raw (normalised inside with the state's
    statistics when ``normalize_observations``)."""
    action_map = _action_map(config.env_cfg.action_space)
    normalize = _observation_normalizer(config)

    def explore_fn(
        state: RecurrentPPOState,
        key: jax.Array,
        observations: Any,
        hidden: Any,
        start: jax.Array,
        deterministic: bool = False,
    ) -> tuple[jax.Array, jax.Array, Any]:
        ac = state.actor_critic
        hidden, dist, _ = ac.apply_fn(ac.params, hidden, normalize(state, observations), start, method="step")
        dist = apply_action_mask(dist, observations)
        if deterministic:
            raw = dist.mode()
            log_probs = dist.log_prob(raw)
        else:
            raw, log_probs = dist.sample_and_log_prob(key)
        return action_map.to_env(raw), log_probs, hidden

    return explore_fn


def value_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``value_fn(state, observations, hidden, start) -> values (B,)``: the critic's value
    of raw observations ``(B, ...)`` after one step of the core from ``hidden`` (the initial
    state where ``start`` holds), as ``explore_fn``'s step computes it."""
    normalize = _observation_normalizer(config)

    def value_fn(state: RecurrentPPOState, observations: Any, hidden: Any, start: jax.Array) -> jax.Array:
        ac = state.actor_critic
        return ac.apply_fn(ac.params, hidden, normalize(state, observations), start, method="step")[2]

    return value_fn


# ---------------------------------------------------------------------------------------------
# Process experience
# ---------------------------------------------------------------------------------------------


class RecurrentExperience(NamedTuple):
    """A recurrent agent's stored step: ``kitae.buffer.Experience``'s fields, the ``start`` flag
    (the observation is the first of an episode) and the ``hidden`` state it was acted with
    (before the reset where ``start`` holds). Leaves ``(E, ...)`` per vector step."""

    observation: Any
    action: Any
    reward: Any
    done: Any
    next_observation: Any
    log_prob: Any
    truncated: Any
    start: Any
    hidden: Any


class RecurrentPPOBatch(NamedTuple):
    """Training sequences: leaves ``(S, L, ...)`` (``(B, L, ...)`` in a minibatch), except
    ``hidden``, the stored state at each sequence's first step, ``(S, ...)``.

    Attributes:
        observation, action (policy units), log_prob, value, advantage, return_: as ``PPOBatch``.
        start: ``(S, L)`` bool, episode starts.
        hidden: the hidden state before each sequence's first step.
    """

    observation: Any
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array
    advantage: jax.Array
    return_: jax.Array
    start: jax.Array
    hidden: Any


def _flat(x: Any) -> Any:
    """Leaves ``(L, B, ...) -> (L * B, ...)``."""
    return jax.tree_util.tree_map(lambda a: a.reshape(a.shape[0] * a.shape[1], *a.shape[2:]), x)


def _sequence_pass(
    ac: TrainState, params: Params, hidden: Any, observations: Any, starts: jax.Array, keep_hiddens: bool
) -> tuple[Any, Any, Any, jax.Array]:
    """The network over sequences ``(L, B, ...)`` from ``hidden``, equal to ``L`` calls of
    ``step``: the encoders and heads run once over all ``L * B`` rows, only the cores step in a
    ``jax.lax.scan``. Why: on CPU a scan's cost is per operation in its body (forward and
    backward), so the fewer and larger the operations outside the recurrence, the faster the
    update (``BENCHMARKS.md``, issue 12).

    Returns:
        ``(the hidden state after each step, leaves (L, B, ...), or None unless keep_hiddens;
        the distribution, batch shape (L * B,); values (L * B,); observations flattened to
        (L * B, ...))``.
    """
    length, batch = starts.shape
    flat_obs = _flat(observations)
    features = jax.tree_util.tree_map(
        lambda f: f.reshape(length, batch, *f.shape[1:]), ac.apply_fn(params, flat_obs, method="encode")
    )

    def step(h: Any, inputs: tuple) -> tuple[Any, tuple]:
        x, start = inputs
        h, y = ac.apply_fn(params, h, x, start, method="cores")
        return h, ((h, y) if keep_hiddens else (None, y))

    _, (hiddens, outputs) = jax.lax.scan(step, hidden, (features, starts))
    dist, values = ac.apply_fn(params, _flat(outputs), method="heads")
    return hiddens, dist, values, flat_obs


def _core_pass(ac: TrainState, params: Params, hidden: Any, observations: Any, starts: jax.Array) -> tuple:
    """The network over a sequence ``(L, B, ...)`` from ``hidden``: ``(the hidden state after each
    step, leaves (L, B, ...); values (L, B))``."""
    hiddens, _, values, _ = _sequence_pass(ac, params, hidden, observations, starts, keep_hiddens=True)
    return hiddens, values.reshape(starts.shape)


def process_experience_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``process_fn(state, key, experience) -> RecurrentPPOBatch`` for ONE environment's
    rollout (leaves ``(T, ...)``), cut into ``T / L`` sequences (see the module docstring)."""
    p: RecurrentPPOParams = config.algo_params
    action_map = _action_map(config.env_cfg.action_space)
    length = sequence_length(config)
    normalize = _observation_normalizer(config)

    def process_fn(state: RecurrentPPOState, key: jax.Array, experience: RecurrentExperience) -> RecurrentPPOBatch:
        del key
        ac = state.actor_critic
        start = jnp.asarray(experience.start, bool)
        hidden0 = jax.tree_util.tree_map(lambda h: h[0][None], experience.hidden)  # (1, ...): a batch of one row
        observation = normalize(state, experience.observation)  # (T, ...)
        observations = jax.tree_util.tree_map(lambda o: o[:, None], observation)  # (T, 1, ...)
        hiddens, values = _core_pass(ac, ac.params, hidden0, observations, start[:, None])
        values = values[:, 0]
        # V(next_obs_t): the critic's step from the state after step t, without a reset
        after = jax.tree_util.tree_map(lambda h: h[:, 0], hiddens)  # (T, ...): T rows
        _, _, next_values = ac.apply_fn(
            ac.params, after, normalize(state, experience.next_observation), jnp.zeros(start.shape, bool), method="step"
        )
        advantages, returns = compute_gae(
            scale_rewards(p, state, experience.reward),
            values,
            next_values,
            experience.done,
            experience.truncated,
            p.gamma,
            p.gae_lambda,
        )

        def chunks(x: jax.Array) -> jax.Array:
            return x.reshape(x.shape[0] // length, length, *x.shape[1:])

        return RecurrentPPOBatch(
            observation=jax.tree_util.tree_map(chunks, observation),
            action=chunks(action_map.from_env(experience.action)),
            log_prob=chunks(jnp.asarray(experience.log_prob, jnp.float32)),
            value=chunks(values),
            advantage=chunks(advantages),
            return_=chunks(returns),
            start=chunks(start),
            hidden=jax.tree_util.tree_map(lambda h: h[::length], experience.hidden),
        )

    return process_fn


# ---------------------------------------------------------------------------------------------
# Losses and update
# ---------------------------------------------------------------------------------------------


def sequence_outputs(
    ac: TrainState, params: Params, batch: RecurrentPPOBatch
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Re-runs the network over a minibatch of sequences (leaves ``(B, L, ...)``) from their stored
    states, resetting at the stored starts.

    Returns:
        ``(log_probs, entropies, values)`` of the stored actions, each ``(B, L)``.
    """

    def time_major(x: jax.Array) -> jax.Array:
        return jnp.swapaxes(x, 0, 1)

    observations = jax.tree_util.tree_map(time_major, batch.observation)
    starts = time_major(batch.start)
    _, dist, values, flat_obs = _sequence_pass(ac, params, batch.hidden, observations, starts, keep_hiddens=False)
    dist = apply_action_mask(dist, flat_obs)
    actions = _flat(time_major(batch.action))

    def batch_major(x: jax.Array) -> jax.Array:
        return time_major(x.reshape(starts.shape))

    return batch_major(dist.log_prob(actions)), batch_major(dist.entropy()), batch_major(values)


def compute_gradients_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``compute_gradients_fn(state, key, batch) -> (grads, info)`` on a minibatch of
    sequences: PPO's loss (``ppo_policy_loss + value_coef * ppo_value_loss - entropy_coef *
    entropy``) over every step of every sequence; info as PPO's."""
    p: RecurrentPPOParams = config.algo_params
    value_clip = (p.clip_coef if p.value_clip_coef is None else p.value_clip_coef) if p.clip_value_loss else None

    def compute_gradients_fn(state: RecurrentPPOState, key: jax.Array, batch: BatchLike) -> tuple[Params, dict]:
        del key
        batch = as_batch(RecurrentPPOBatch, batch)
        ac = state.actor_critic
        advantages = batch.advantage.reshape(-1)
        advantages = normalize_advantages(advantages) if p.normalize_advantages else advantages
        old_log_probs, old_values, returns = (x.reshape(-1) for x in (batch.log_prob, batch.value, batch.return_))

        def loss_fn(params: Params) -> tuple[jax.Array, dict]:
            log_probs, entropies, values = (x.reshape(-1) for x in sequence_outputs(ac, params, batch))
            return ppo_loss(p, value_clip, log_probs, entropies, values, old_log_probs, old_values, returns, advantages)

        (_, info), grads = jax.value_and_grad(loss_fn, has_aux=True)(ac.params)
        return grads, info

    return compute_gradients_fn


def update_step_factory(config: cfg.AlgoConfig) -> Callable:
    """Makes ``update_step_fn(state, key, batch) -> (state, info)`` on one minibatch of sequences."""
    return update_step_from_gradients(compute_gradients_factory(config), apply_gradients_factory(config))


# ---------------------------------------------------------------------------------------------
# The agent
# ---------------------------------------------------------------------------------------------


class RecurrentPPO(OnPolicyAgent):
    """PPO with an LSTM or GRU core (see the module docstring).

    Args:
        run_name: name of the run.
        config: an ``AlgoConfig`` whose ``algo_params`` is a ``RecurrentPPOParams``.
        preprocess_fn, tabulate, run_dir: as ``PPO``'s.

    Raises:
        TypeError: if ``config.algo_params`` is not a ``RecurrentPPOParams``.
        ValueError: for spaces PPO does not accept, or a sequence length that does not divide the
            rollout and the minibatch (``check_config``).
    """

    recurrent = True
    learning_params = ("gamma", "gae_lambda", "clip_coef", "value_clip_coef", "entropy_coef", "value_coef")

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
        if not isinstance(config.algo_params, RecurrentPPOParams):
            raise TypeError(
                f"algo_params={type(config.algo_params).__name__} is not allowed for recurrent PPO; allowed: a "
                "RecurrentPPOParams"
            )
        check_config(config)
        super().__init__(
            run_name,
            config,
            train_state_factory,
            explore_factory,
            process_experience_factory,
            update_step_factory,
            preprocess_fn=preprocess_fn,
            tabulate=tabulate,
            experience_type=RecurrentExperience,
            run_dir=run_dir,
        )

    def _configure(self) -> None:
        super()._configure()
        self.algo_params = self.config.algo_params
        self.gradient_factories = (compute_gradients_factory, apply_gradients_factory)
        self.value_fn = explore_general_factory(value_factory(self.config), self.vectorized, self.parallel)

    def update_hooks(self, config: cfg.AlgoConfig) -> UpdateHooks:
        """PPO's running statistics around the update (``ppo.update_hooks_factory``)."""
        return update_hooks_factory(config)

    @property
    def minibatch_rows(self) -> int:
        """Sequences per minibatch: ``batch_size / sequence_length``."""
        return self.config.update_cfg.batch_size // sequence_length(self.config)

    def initial_hidden(self, n: int) -> Any:
        """The initial hidden state of ``n`` environments (leaves ``(n, core_size)``)."""
        return agent_initial_hidden(self.config, n)

    def acting_params(self, state: RecurrentPPOState) -> RecurrentPPOState:
        """The state without the optimizer state: ``state`` is the agent's ``RecurrentPPOState``
        pytree; every leaf kept keeps its shape (the statistics ``(*obs_shape)`` and scalars,
        ``discounted_returns`` ``(n_envs * n_agents,)``)."""
        return state.replace(actor_critic=state.actor_critic.replace(opt_state=None))

    def act_recurrent(
        self,
        acting_params: RecurrentPPOState,
        key: jax.Array,
        observation: Any,
        hidden: Any,
        start: jax.Array,
        env_step: Any,
        deterministic: bool = False,
    ) -> tuple[jax.Array, jax.Array, Any]:
        """Acts as a pure function: ``(actions (E, ...), log_probs (E,), hidden)`` from the
        observations ``(E, ...)``, the hidden state and the ``start`` flags ``(E,)`` (where one
        holds, the step starts from the initial state). ``env_step`` is not used. Multi-agent:
        observations, hidden states, flags and outputs are dicts keyed by agent, ``key`` is split
        per agent (``kitae.base.agent_keys``)."""
        del env_step
        keys = agent_keys(key, observation, self.parallel)
        return self.explore_fn(acting_params, keys, observation, hidden, start, deterministic=deterministic)

    def act_extras(
        self, acting_params: RecurrentPPOState, observation: Any, hidden: Any = None, start: Any = None
    ) -> dict[str, Any]:
        """``{"value": V (E,)}``: the critic's value of each observation after the step from
        ``hidden`` and ``start`` (``act_recurrent``'s inputs, both required); pure. Multi-agent:
        dicts keyed by agent."""
        if hidden is None or start is None:
            raise TypeError("RecurrentPPO.act_extras needs hidden and start, as act_recurrent takes them")
        return {"value": self.value_fn(acting_params, observation, hidden, start)}

    def act(
        self, acting_params: Any, key: jax.Array, observation: Any, env_step: Any, deterministic: bool = False
    ) -> tuple[Any, Any]:
        """Not available: a recurrent agent acts with its hidden state (``act_recurrent``; the
        executors and ``kitae.distributed.AgentAlgorithm.acting_step`` carry it). The arguments
        are ``BaseAgent.act``'s (``key`` a raw ``(2,)`` uint32 PRNG key, ``observation``
        ``(E, *obs_shape)``); none is read.

        Raises:
            TypeError: always.
        """
        raise TypeError(
            "RecurrentPPO acts with a hidden state: call act_recurrent(acting_params, key, observation, hidden, "
            "start, env_step), or train it with agent.train / kitae train, which carry the hidden state"
        )
