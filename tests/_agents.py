"""Small agents written for the tests, in the shape of the custom-agent guide.

``TinyDQN`` is an off-policy agent like the guide's (epsilon-greedy Q-learning) with a Polyak
target network; ``TinyA2C`` is an on-policy actor-critic with GAE. Both use kitae's own
distributions and timesteps, so the tests exercise the whole stack without distrax.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import optax

import kitae.config as cfg
from kitae.base import OffPolicyAgent, OnPolicyAgent
from kitae.buffer import Experience
from kitae.distributions import Categorical, EpsilonGreedy
from kitae.modules.modules import init_params
from kitae.modules.pytree import AgentPyTree, TrainState
from kitae.timesteps import compute_gae, compute_td_targets


class QNetwork(nn.Module):
    n_actions: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(64)(x))
        x = nn.relu(nn.Dense(64)(x))
        return nn.Dense(self.n_actions)(x)


# --------------------------------------------------------------------------------------------
# Off-policy: a DQN of the guide's shape
# --------------------------------------------------------------------------------------------

TDBatch = namedtuple("TDBatch", ["observation", "action", "return_"])


@cfg.register_algo_params
@dataclass
class TinyDQNParams:
    exploration: float = 0.1
    gamma: float = 0.99
    tau: float = 0.05
    skip_steps: int = 1
    start_step: int = -1


class TinyDQNState(AgentPyTree):
    qvalue: TrainState


def tiny_dqn_state_factory(key, config, *, preprocess_fn=None, tabulate=False) -> TinyDQNState:
    module = QNetwork(config.env_cfg.action_space.n)
    params = init_params(key, module, [config.env_cfg.observation_space.shape], tabulate)
    return TinyDQNState(
        TrainState.create(
            apply_fn=module.apply,
            params=params,
            target_params=params,
            tx=optax.adam(config.update_cfg.learning_rate),
        )
    )


def tiny_dqn_explore_factory(config) -> Callable:
    def explore_fn(state: TinyDQNState, key, observations, exploration):
        qvalues = state.qvalue.apply_fn(state.qvalue.params, observations)
        return EpsilonGreedy(qvalues, exploration).sample_and_log_prob(key)

    return jax.jit(explore_fn)


def tiny_dqn_process_factory(config) -> Callable:
    gamma = config.algo_params.gamma

    def process_fn(state: TinyDQNState, key, experience: Experience):
        next_q = state.qvalue.apply_fn(state.qvalue.target_params, experience.next_observation)
        discounts = gamma * (1.0 - experience.done[..., None])
        returns = compute_td_targets(experience.reward[..., None], discounts, jnp.max(next_q, -1, keepdims=True))
        return (experience.observation, experience.action[..., None], returns)

    return process_fn


def tiny_dqn_update_factory(config) -> Callable:
    tau = config.algo_params.tau

    def update_fn(state: TinyDQNState, key, experiences):
        batch = TDBatch(*experiences)

        def loss_fn(params):
            q = jnp.take_along_axis(state.qvalue.apply_fn(params, batch.observation), batch.action, axis=-1)
            loss = jnp.mean(optax.l2_loss(q, batch.return_))
            return loss, {"loss_qvalue": loss}

        (_, info), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.qvalue.params)
        state.qvalue = state.qvalue.apply_gradients(grads=grads).soft_update_target(tau)
        return state, info

    return update_fn


class TinyDQN(OffPolicyAgent):
    def __init__(self, run_name: str, config: cfg.AlgoConfig, **kwargs):
        super().__init__(
            run_name,
            config,
            tiny_dqn_state_factory,
            tiny_dqn_explore_factory,
            tiny_dqn_process_factory,
            tiny_dqn_update_factory,
            **kwargs,
        )

    def explore(self, observation):
        return self.explore_fn(
            self.state, self.interact_keys(observation), observation, exploration=self.config.algo_params.exploration
        )

    def select_action(self, observation):
        return self.explore_fn(self.state, self.interact_keys(observation), observation, exploration=0.0)


# --------------------------------------------------------------------------------------------
# On-policy: advantage actor-critic
# --------------------------------------------------------------------------------------------

A2CBatch = namedtuple("A2CBatch", ["observation", "action", "advantage", "return_"])


@cfg.register_algo_params
@dataclass
class TinyA2CParams:
    gamma: float = 0.99
    gae_lambda: float = 0.95
    value_coef: float = 0.5
    entropy_coef: float = 0.01


class ActorCritic(nn.Module):
    n_actions: int

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        h = nn.tanh(nn.Dense(64)(x))
        logits = nn.Dense(self.n_actions)(nn.tanh(nn.Dense(64)(h)))
        value = nn.Dense(1)(nn.tanh(nn.Dense(64)(h)))[..., 0]
        return logits, value


class TinyA2CState(AgentPyTree):
    model: TrainState


def tiny_a2c_state_factory(key, config, *, preprocess_fn=None, tabulate=False) -> TinyA2CState:
    module = ActorCritic(config.env_cfg.action_space.n)
    return TinyA2CState(
        TrainState.create(
            apply_fn=module.apply,
            params=init_params(key, module, [config.env_cfg.observation_space.shape], tabulate),
            tx=optax.chain(optax.clip_by_global_norm(0.5), optax.adam(config.update_cfg.learning_rate)),
        )
    )


def tiny_a2c_explore_factory(config) -> Callable:
    def explore_fn(state: TinyA2CState, key, observations):
        logits, _ = state.model.apply_fn(state.model.params, observations)
        return Categorical(logits).sample_and_log_prob(key)

    return jax.jit(explore_fn)


def tiny_a2c_process_factory(config) -> Callable:
    p = config.algo_params

    def process_fn(state: TinyA2CState, key, experience: Experience):
        _, values = state.model.apply_fn(state.model.params, experience.observation)
        _, next_values = state.model.apply_fn(state.model.params, experience.next_observation)
        advantages, returns = compute_gae(
            experience.reward, values, next_values, experience.done, experience.truncated, p.gamma, p.gae_lambda
        )
        return (experience.observation, experience.action, advantages, returns)

    return process_fn


def tiny_a2c_update_factory(config) -> Callable:
    p = config.algo_params

    def update_fn(state: TinyA2CState, key, experiences):
        batch = A2CBatch(*experiences)

        def loss_fn(params):
            logits, values = state.model.apply_fn(params, batch.observation)
            dist = Categorical(logits)
            advantage = (batch.advantage - batch.advantage.mean()) / (batch.advantage.std() + 1e-8)
            policy_loss = -jnp.mean(dist.log_prob(batch.action) * advantage)
            value_loss = jnp.mean(jnp.square(values - batch.return_))
            entropy = jnp.mean(dist.entropy())
            loss = policy_loss + p.value_coef * value_loss - p.entropy_coef * entropy
            return loss, {"loss_policy": policy_loss, "loss_value": value_loss, "entropy": entropy}

        (_, info), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.model.params)
        state.model = state.model.apply_gradients(grads=grads)
        return state, info

    return update_fn


class TinyA2C(OnPolicyAgent):
    def __init__(self, run_name: str, config: cfg.AlgoConfig, **kwargs):
        super().__init__(
            run_name,
            config,
            tiny_a2c_state_factory,
            tiny_a2c_explore_factory,
            tiny_a2c_process_factory,
            tiny_a2c_update_factory,
            **kwargs,
        )

    def explore(self, observation):
        return self.explore_fn(self.state, self.interact_keys(observation), observation)

    def select_action(self, observation):
        logits, _ = self.state.model.apply_fn(self.state.model.params, observation)
        return jnp.argmax(logits, axis=-1), jnp.zeros(logits.shape[:-1])


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------


def config_from_spaces(
    observation_space: gym.Space,
    action_space: gym.Space,
    algo_params,
    *,
    n_envs: int = 1,
    seed: int = 0,
    learning_rate: float = 1e-3,
    max_buffer_size: int = 1000,
    batch_size: int = 64,
    n_epochs: int = 1,
    n_env_steps: int = 10_000,
    task_name: str = "test",
) -> cfg.AlgoConfig:
    """An ``AlgoConfig`` for tests from one environment's spaces."""
    return cfg.AlgoConfig(
        seed=seed,
        algo_params=algo_params,
        update_cfg=cfg.UpdateConfig(
            learning_rate=learning_rate, max_buffer_size=max_buffer_size, batch_size=batch_size, n_epochs=n_epochs
        ),
        train_cfg=cfg.TrainConfig(n_env_steps=n_env_steps),
        env_cfg=cfg.EnvConfig(
            task_name=task_name,
            observation_space=observation_space,
            action_space=action_space,
            n_envs=n_envs,
        ),
    )


def make_config(env: gym.vector.VectorEnv, algo_params, **kwargs) -> cfg.AlgoConfig:
    """``config_from_spaces`` with a vector environment's single spaces and its number of copies."""
    return config_from_spaces(
        env.single_observation_space, env.single_action_space, algo_params, n_envs=env.num_envs, **kwargs
    )
