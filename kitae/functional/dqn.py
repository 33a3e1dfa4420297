"""The functional DQN of seed 002, over the collection's DQN (``kitae.algos.collections.dqn``).

``predict`` is the collection's epsilon-greedy ``explore`` with epsilon from the schedule at the
policy state's ``count``; ``update`` is the collection's processing (TD targets, Double DQN as an
option), ``compute_gradients`` and ``apply_gradients`` (Adam, then the target copy every
``target_update_interval`` gradient steps, counted by ``OptimState.count``). Nothing else.

Example (a whole loop: ``examples/functional_dqn.py``)::

    import gymnasium as gym
    import haiku as hk
    import jax
    from kitae.functional import DQN

    def network(action_space):
        return hk.without_apply_rng(hk.transform(lambda x: hk.nets.MLP([64, 64, action_space.n])(x)))

    env = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    agent = DQN(network, env, learning_rate=1e-3)
    params = agent.init_params(jax.random.PRNGKey(0))
    policy_state = agent.init_policy(jax.random.PRNGKey(1))
    optimizer_state = agent.init_optimizer(params, jax.random.PRNGKey(2))
    output, policy_state = agent.predict(params, policy_state, obs, key, evaluation=False)
    optim_output, params, optimizer_state = agent.update(params, optimizer_state, batch)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import optax

from kitae.algos.collections import dqn as collection
from kitae.functional.base import CollectionAgent, OptimState, as_key
from kitae.functional.checks import (
    OFF_POLICY_DATA_KEYS,
    PROBE_BATCH,
    check_output_shape,
    dummy_observation,
    probe_observation,
)
from kitae.modules.pytree import TrainState

__all__ = ["DQN", "Params", "PolicyState", "PolicyOutput", "OptimOutput", "DATA_KEYS"]

DATA_KEYS = OFF_POLICY_DATA_KEYS
"""What ``DQN.update``'s ``data`` holds, each with a leading batch axis ``B``: ``obs`` and
``next_obs`` ``(B, *obs_shape)`` (``next_obs`` the real next observation, also where an episode
was truncated), ``action`` ``(B,)``, ``reward`` ``(B,)``, ``terminated`` ``(B,)`` (bootstrapping
stops only there)."""


def default_epsilon_schedule() -> optax.Schedule:
    """Seed 002's default: ``optax.polynomial_schedule(0.9, 0.05, power=1, transition_steps=50_000)``."""
    return optax.polynomial_schedule(init_value=0.9, end_value=0.05, power=1.0, transition_steps=50_000)


class DQN(CollectionAgent):
    """Deep Q-Network as pure functions (seed 002).

    Args:
        network: ``network(action_space) -> net`` mapping observations ``(B, ...)`` to Q-values
            ``(B, n_actions)`` (Haiku ``hk.Transformed`` or Flax module).
        env: a Gymnasium environment or vector environment with a ``Discrete`` action space.
        learning_rate: Adam's learning rate, a float > 0 or an optax schedule (counted in
            gradient steps).
        discount_factor: ``gamma`` in ``[0, 1]``.
        epsilon_schedule: ``count -> epsilon``, read at the policy state's ``count``; default
            polynomial (linear) 0.9 -> 0.05 over 50,000 steps.
        target_update_interval: copy the online parameters to the target every this many
            gradient steps (``OptimState.count``), an int >= 1.
        double_dqn: Double DQN targets (the online network picks the next action).
        loss: ``"huber"`` or ``"l2"`` (``kitae.algos.collections.dqn.dqn_loss``).
        max_grad_norm: clip gradients to this global norm (``None``: no clipping).

    Raises:
        TypeError: for a network creator or environment that is not allowed.
        ValueError: for a non-``Discrete`` action space or a hyperparameter out of range (the
            message names it).
    """

    class Params(NamedTuple):
        """DQN's parameters: the online network's (``policy``) and the target network's."""

        policy: Any
        target: Any

    class PolicyState(NamedTuple):
        """What acting carries: ``count``, the ``predict`` calls in training mode so far (int32; the
        epsilon schedule reads it)."""

        count: jax.Array  # type: ignore[assignment]  # the seed's field name shadows tuple.count

    class PolicyOutput(NamedTuple):
        """``predict``'s output for ``B`` observations: ``actions`` ``(B,)`` int32, ``q_values``
        ``(B, n_actions)``, ``epsilon`` the exploration rate used (a scalar; 0 in evaluation)."""

        actions: jax.Array
        q_values: jax.Array
        epsilon: jax.Array

    class OptimOutput(NamedTuple):
        """``update``'s output: ``loss`` (the mean TD loss), ``q_values`` (the mean Q-value of the
        taken actions), scalars, before the step."""

        loss: jax.Array
        q_values: jax.Array

    def __init__(
        self,
        network: Callable[[gym.Space], Any],
        env: Any,
        learning_rate: float | optax.Schedule,
        discount_factor: float = 0.99,
        epsilon_schedule: optax.Schedule | None = None,
        target_update_interval: int = 50,
        double_dqn: bool = False,
        loss: str = "huber",
        max_grad_norm: float | None = None,
    ) -> None:
        super().__init__(network, env, learning_rate)
        if epsilon_schedule is not None and not callable(epsilon_schedule):
            raise ValueError(
                f"epsilon_schedule={epsilon_schedule!r} is not allowed; allowed: a callable count -> epsilon"
            )
        self.epsilon_schedule = default_epsilon_schedule() if epsilon_schedule is None else epsilon_schedule
        # The collection's DQNParams validate the rest and name the field (gamma, interval, loss).
        params = collection.DQNParams(
            gamma=discount_factor,
            target_update_interval=target_update_interval,
            tau=1.0,
            double_dqn=double_dqn,
            loss=loss,
        )
        self.use_collection(collection, self.collection_config(params, max_grad_norm), learning_rate, max_grad_norm)

    def check_action_space(self, action_space: gym.Space) -> None:
        """Raises ``ValueError`` unless ``action_space`` is ``Discrete``."""
        if not isinstance(action_space, gym.spaces.Discrete):
            raise ValueError(f"action_space={action_space} is not allowed for DQN; allowed: gymnasium.spaces.Discrete")

    # -- state -----------------------------------------------------------------------------------

    def init_params(self, rng: Any) -> Params:
        """``Params(policy, target)``: the network initialised on a dummy observation, the target
        a copy.

        Raises:
            TypeError: if the network's output is not Q-values ``(B, n_actions)`` (checked on a
                batch of ``PROBE_BATCH`` zero observations), naming the shape found and the one
                required.
        """
        policy = self.network.init(as_key(rng), dummy_observation(self.observation_space))
        assert isinstance(self.action_space, gym.spaces.Discrete)  # check_action_space
        n = int(self.action_space.n)
        check_output_shape(
            jax.eval_shape(self.network.apply, policy, probe_observation(self.observation_space)),
            (PROBE_BATCH, n),
            "DQN's network (Q-values)",
            f"(B, n_actions) with n_actions={n} for the action space {self.action_space}",
        )
        return Params(policy, jax.tree_util.tree_map(jnp.copy, policy))

    def init_policy(self, rng: Any) -> PolicyState:
        """``PolicyState(count=0)``, an int32 scalar; ``rng`` (a raw ``(2,)`` uint32 PRNG key or an
        ``hk.PRNGSequence``) is not used (accepted for the seed's signature)."""
        del rng
        return PolicyState(jnp.zeros((), jnp.int32))

    def init_optimizer(self, params: Params, rng: Any) -> OptimState:
        """``OptimState(count=0, opt_state)`` (``count`` an int32 scalar) for ``params.policy``,
        the online network's parameter pytree (the optax state's moments take its leaves' shapes);
        ``rng`` (a raw ``(2,)`` uint32 PRNG key or an ``hk.PRNGSequence``) is not used."""
        del rng
        return OptimState(jnp.zeros((), jnp.int32), self.tx.init(params.policy))

    def _train_state(self, params: Params, optimizer_state: OptimState | None = None) -> collection.DQNState:
        """The collection's state for these explicit parts (built on every call, never stored)."""
        state = TrainState(
            step=jnp.zeros((), jnp.int32) if optimizer_state is None else optimizer_state.count,
            apply_fn=self.network.apply,
            params=params.policy,
            tx=self.tx,
            opt_state=None if optimizer_state is None else optimizer_state.opt_state,
            target_params=params.target,
        )
        return collection.DQNState(qvalue=state)

    # -- acting and learning ----------------------------------------------------------------------

    def _predict(
        self, params: Params, policy_state: PolicyState, obs: Any, key: jax.Array, evaluation: bool = False
    ) -> tuple[PolicyOutput, PolicyState]:
        """Epsilon-greedy actions for observations ``(B, ...)``.

        Training (``evaluation=False``): epsilon is ``epsilon_schedule(policy_state.count)`` and
        the count goes up by one. Evaluation: greedy actions (epsilon 0), the policy state
        unchanged.

        Returns:
            ``(PolicyOutput(actions (B,), q_values (B, n), epsilon), PolicyState)``.
        """
        state = self._train_state(params)
        epsilon = (
            jnp.zeros((), jnp.float32)
            if evaluation
            else jnp.asarray(self.epsilon_schedule(policy_state.count), jnp.float32)
        )
        actions, _ = self._explore(state, key, obs, 0, epsilon)
        q_values = self.network.apply(params.policy, obs)
        count = policy_state.count if evaluation else policy_state.count + 1
        return PolicyOutput(actions, q_values, epsilon), PolicyState(count)

    def _update(
        self, params: Params, optimizer_state: OptimState, data: Mapping[str, Any]
    ) -> tuple[OptimOutput, Params, OptimState]:
        """One gradient step on a batch (``DATA_KEYS``): the collection's TD targets, loss and
        Adam step, then the target copy where ``count + 1`` is a multiple of the interval.

        Returns:
            ``(OptimOutput(loss, q_values), Params, OptimState(count + 1, opt_state))``.
        """
        # DQN's processing and gradients use no randomness: the update key is never read
        state, info = self.off_policy_update(self._train_state(params, optimizer_state), data, optimizer_state.count)
        qvalue = state.qvalue
        return (
            OptimOutput(info["loss_qvalue"], info["q_values"]),
            Params(qvalue.params, qvalue.target_params),
            OptimState(qvalue.step, qvalue.opt_state),
        )


Params = DQN.Params
PolicyState = DQN.PolicyState
PolicyOutput = DQN.PolicyOutput
OptimOutput = DQN.OptimOutput
