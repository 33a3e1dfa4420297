"""The functional RND-PPO: seed 002's stateless API over the collection's RND-PPO
(``kitae.algos.collections.rnd_ppo``).

``predict`` is PPO's (a sample of the policy, its mode in evaluation); ``update`` is the
collection's whole RND-PPO update on a rollout: RND's statistics take in the rollout's next
observations and its intrinsic discounted returns (the update hook ``prepare``), then GAE on the
extrinsic rewards and non-episodic GAE on the intrinsic ones (prediction errors over the running
standard deviation of the intrinsic returns), then ``n_epochs`` epochs of shuffled minibatches,
each training the actor-critic and the predictor (on ``update_proportion`` of the rows).

The network: ``network(action_space) -> net`` (Haiku or Flax) whose ``apply(params, obs (B,
...))`` returns ``(policy, values)``: ``policy`` as the functional PPO's, ``values`` ``(B, 2)``,
the extrinsic value in column 0 and the intrinsic one in column 1. The RND target and predictor
are kitae's (``rnd_ppo.RNDNetwork``, sized by ``rnd_hidden_sizes`` and ``rnd_feature_size``).

RND's statistics are part of ``Params`` (``update`` returns them changed): the running mean and
variance of the observations the RND networks read, those of the intrinsic returns, and each
environment's intrinsic discounted return, carried from one rollout to the next: every rollout
must have the same ``n_envs`` columns.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import optax

from kitae.algos.collections import ppo as ppo_collection
from kitae.algos.collections import rnd_ppo as collection
from kitae.functional.base import OptimState, as_key
from kitae.functional.checks import data_fields
from kitae.functional.ppo import DATA_KEYS, PPO
from kitae.modules.encoders import space_input_shape
from kitae.modules.modules import init_params
from kitae.modules.pytree import TrainState

__all__ = ["RNDPPO", "DATA_KEYS"]


class RNDPPO(PPO):
    """PPO with random network distillation as pure functions (seed 002's API). ``update``'s
    ``data``: a rollout ``(T, E, ...)`` with ``E = n_envs`` (``DATA_KEYS``, as PPO's).

    Args:
        network: ``network(action_space) -> net``, ``net.apply(params, obs)`` returning
            ``(policy, values (B, 2))`` (see the module docstring).
        env: a Gymnasium environment or vector environment (``Box`` observations; ``Discrete``,
            1-D ``MultiDiscrete`` / ``MultiBinary`` or 1-D ``Box`` actions).
        learning_rate: Adam's, for the actor-critic and the predictor.
        n_envs: the rollouts' environment columns ``E`` (default: ``env.num_envs`` for a vector
            environment, else 1).
        discount_factor, gae_lambda, clip_coef, entropy_coef, value_coef, clip_value_loss,
        normalize_advantages, intrinsic_discount_factor, extrinsic_coef, intrinsic_coef,
        update_proportion, rnd_hidden_sizes, rnd_feature_size, rnd_observation_clip: as
            ``kitae.algos.collections.rnd_ppo.RNDPPOParams``'s ``gamma``, ..., ``intrinsic_gamma``,
            ... (validated there).
        n_epochs, batch_size, max_grad_norm, seed: as ``kitae.functional.PPO``'s.

    Raises:
        ValueError: for an observation or action space RND-PPO cannot handle, a hyperparameter
            out of range, or ``n_envs`` not an int >= 1.
    """

    class Params(NamedTuple):
        """RND-PPO's parameters and statistics: the actor-critic network's, the predictor's, the
        fixed target's, and RND's running statistics (``kitae.algos.collections.ppo
        .RunningStatistics``: of the observations, ``(*obs_shape)``, and of the intrinsic
        returns, scalars) with each environment's intrinsic discounted return ``(n_envs,)``."""

        network: Any
        rnd_predictor: Any
        rnd_target: Any
        rnd_observation_statistics: Any
        intrinsic_return_statistics: Any
        intrinsic_discounted_returns: jax.Array

    class OptimOutput(NamedTuple):
        """``update``'s losses, means over its gradient steps: PPO's, the intrinsic value head's
        loss and the predictor's loss."""

        loss: jax.Array
        policy_loss: jax.Array
        value_loss: jax.Array
        intrinsic_value_loss: jax.Array
        rnd_loss: jax.Array
        entropy: jax.Array
        approx_kl: jax.Array

    def __init__(
        self,
        network: Callable[[gym.Space], Any],
        env: Any,
        learning_rate: float | optax.Schedule,
        n_envs: int | None = None,
        discount_factor: float = 0.999,
        gae_lambda: float = 0.95,
        clip_coef: float = 0.2,
        entropy_coef: float = 0.01,
        value_coef: float = 0.5,
        clip_value_loss: bool = True,
        normalize_advantages: bool = True,
        intrinsic_discount_factor: float = 0.99,
        extrinsic_coef: float = 2.0,
        intrinsic_coef: float = 1.0,
        update_proportion: float = 0.25,
        rnd_hidden_sizes: tuple[int, ...] = (64, 64),
        rnd_feature_size: int = 64,
        rnd_observation_clip: float = 5.0,
        n_epochs: int = 4,
        batch_size: int = 64,
        max_grad_norm: float | None = 0.5,
        seed: int = 0,
    ) -> None:
        super(PPO, self).__init__(network, env, learning_rate)
        n_envs = int(getattr(env, "num_envs", 1)) if n_envs is None else n_envs
        if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
            raise ValueError(f"n_envs={n_envs!r} is not allowed; allowed: an int >= 1")
        self.n_envs = n_envs
        params = collection.RNDPPOParams(
            gamma=discount_factor,
            gae_lambda=gae_lambda,
            clip_coef=clip_coef,
            entropy_coef=entropy_coef,
            value_coef=value_coef,
            clip_value_loss=clip_value_loss,
            normalize_advantages=normalize_advantages,
            intrinsic_gamma=intrinsic_discount_factor,
            extrinsic_coef=extrinsic_coef,
            intrinsic_coef=intrinsic_coef,
            update_proportion=update_proportion,
            rnd_hidden_sizes=tuple(rnd_hidden_sizes),
            rnd_feature_size=rnd_feature_size,
            rnd_observation_clip=rnd_observation_clip,
        )
        config = self.use_on_policy_collection(
            collection, params, learning_rate, n_epochs, batch_size, max_grad_norm, seed
        )
        collection.check_config(config)
        self.rnd_target_network, self.rnd_predictor_network = collection.rnd_networks(config)
        self.hooks = collection.update_hooks_factory(config)

    # -- state -----------------------------------------------------------------------------------

    value_shape = (2,)
    """The network's values are ``(B, 2)``: extrinsic in column 0, intrinsic in column 1."""
    value_allowed = "values (B, 2), the extrinsic value in column 0 and the intrinsic one in column 1"

    def init_params(self, rng: Any) -> Params:  # type: ignore[override]
        """The network on a dummy observation, the predictor and the target (keys ``split(rng,
        3)``: network, target, predictor), RND's statistics at ``count 0, mean 0, var 1`` and
        intrinsic returns 0."""
        network_key, target_key, predictor_key = jax.random.split(as_key(rng), 3)
        base = super().init_params(network_key)
        obs_shape = space_input_shape(self.observation_space)
        return RNDPPO.Params(
            network=base.network,
            rnd_predictor=init_params(predictor_key, self.rnd_predictor_network, [obs_shape]),
            rnd_target=init_params(target_key, self.rnd_target_network, [obs_shape]),
            rnd_observation_statistics=ppo_collection.init_running_statistics(
                tuple(self.observation_space.shape or ())
            ),
            intrinsic_return_statistics=ppo_collection.init_running_statistics(()),
            intrinsic_discounted_returns=jnp.zeros((self.n_envs,), jnp.float32),
        )

    def init_optimizer(self, params: Params, rng: Any) -> OptimState:  # type: ignore[override]
        """``OptimState(count=0, {"network", "rnd_predictor"} optimizer states)``: ``count`` an int32
        scalar, each optax state's moments of the shapes of its part of ``params``;
        ``rng`` (a raw ``(2,)`` uint32 PRNG key or an ``hk.PRNGSequence``) is not used."""
        del rng
        opt_state = {"network": self.tx.init(params.network), "rnd_predictor": self.tx.init(params.rnd_predictor)}
        return OptimState(jnp.zeros((), jnp.int32), opt_state)

    def collection_state(  # type: ignore[override]
        self, params: Params, optimizer_state: OptimState | None = None
    ) -> collection.RNDPPOState:
        """The collection's ``RNDPPOState`` for these explicit parts (made on every call): the
        ``Params`` pytree's parts, their shapes kept (RND's observation statistics
        ``(*obs_shape)``, the intrinsic discounted returns ``(n_envs,)``), and ``optimizer_state``
        (``None``: no optimizer states, step 0)."""
        base = super().collection_state(PPO.Params(params.network))
        step = jnp.zeros((), jnp.int32) if optimizer_state is None else optimizer_state.count
        opt = {} if optimizer_state is None else optimizer_state.opt_state
        return collection.RNDPPOState(
            actor_critic=base.actor_critic.replace(step=step, opt_state=opt.get("network")),
            observation_statistics=base.observation_statistics,
            return_statistics=base.return_statistics,
            discounted_returns=base.discounted_returns,
            rnd_predictor=TrainState(
                step=step,
                apply_fn=self.rnd_predictor_network.apply,
                params=params.rnd_predictor,
                tx=self.tx,
                opt_state=opt.get("rnd_predictor"),
            ),
            rnd_target_params=params.rnd_target,
            rnd_observation_statistics=params.rnd_observation_statistics,
            intrinsic_return_statistics=params.intrinsic_return_statistics,
            intrinsic_discounted_returns=params.intrinsic_discounted_returns,
        )

    # -- learning ---------------------------------------------------------------------------------

    def _update(  # type: ignore[override]
        self, params: Params, optimizer_state: OptimState, data: Mapping[str, Any]
    ) -> tuple[OptimOutput, Params, OptimState]:
        (reward,) = data_fields(data, ("reward",), "RNDPPO")
        if jnp.ndim(reward) != 2 or jnp.shape(reward)[1] != self.n_envs:
            raise ValueError(
                f"data['reward'] has shape {jnp.shape(reward)}, which is not allowed; allowed: (T, {self.n_envs}), "
                f"a rollout of n_envs={self.n_envs} environment columns (RND's intrinsic returns are carried per "
                "environment)"
            )
        state, info = self.rollout_update(self.collection_state(params, optimizer_state), optimizer_state, data)
        ac, predictor = state.actor_critic, state.rnd_predictor
        output = RNDPPO.OptimOutput(
            info["loss_total"],
            info["loss_policy"],
            info["loss_value"],
            info["loss_value_intrinsic"],
            info["loss_rnd"],
            info["entropy"],
            info["approx_kl"],
        )
        new = RNDPPO.Params(
            ac.params,
            predictor.params,
            state.rnd_target_params,
            state.rnd_observation_statistics,
            state.intrinsic_return_statistics,
            state.intrinsic_discounted_returns,
        )
        return output, new, OptimState(ac.step, {"network": ac.opt_state, "rnd_predictor": predictor.opt_state})
