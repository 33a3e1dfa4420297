"""The custom-agent guide (docs/custom_agents.md), as a script: a DQN from the four factories.

Run: ``.venv/bin/python examples/custom_dqn.py [N_ENV_STEPS [SEED]] [--run-dir DIR]`` (default
200_000 steps, seed 0, ``runs/example-dqn``). It trains on ``CartPole-v1`` with 16 environments,
writes the run directory (TensorBoard logs, checkpoints, ...), prints the mean return of the first
and last ten episodes and loads the trained agent back from the directory. A run directory that
already holds a run is refused: delete it or give another ``--run-dir``. Its module also registers
the agent as the command-line algorithm ``custom_dqn`` (``kitae train custom_dqn CartPole-v1
--import examples/custom_dqn.py ...``, docs/custom_agents.md).
"""

import argparse
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import distrax as dx
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

import kitae.config as cfg
from kitae.algos.collections import register_algorithm
from kitae.base import OffPolicyAgent
from kitae.buffer import Experience
from kitae.modules.modules import init_params
from kitae.modules.optimizer import optimizer_from_config
from kitae.modules.pytree import AgentPyTree, TrainState
from kitae.modules.qvalue import qvalue_factory  # noqa: F401  (imported by the guide)
from kitae.timesteps import compute_td_targets
from kitae.types import AlgoType, Params

DQN_tuple = namedtuple("DQN_tuple", ["observation", "action", "return_"])
NO_EXPLORATION = 0.0


@cfg.register_algo_params  # so that DQN.unserialize(run_dir) can read config.yaml back
@dataclass
class DQNParams:
    exploration: float
    gamma: float
    skip_steps: int
    start_step: int = -1
    target_update_interval: int = 128  # gradient steps between two copies into the target network


class DQNState(AgentPyTree):
    qvalue: TrainState


def train_state_dqn_factory(
    key: jax.Array,
    config: cfg.AlgoConfig,
    *,
    preprocess_fn: Callable = None,
    tabulate: bool = False,
) -> DQNState:
    observation_shape = config.env_cfg.observation_space.shape
    n_actions = config.env_cfg.action_space.n  # discrete spaces only

    class QValue(nn.Module):
        @nn.compact
        def __call__(self, observations: jax.Array) -> jax.Array:
            x = observations
            x = nn.relu(nn.Dense(256)(x))
            x = nn.relu(nn.Dense(256)(x))
            return nn.Dense(n_actions)(x)

    qvalue = QValue()
    return DQNState(
        TrainState.create(
            apply_fn=jax.jit(qvalue.apply),
            params=init_params(key, qvalue, [observation_shape], tabulate),
            target_params=init_params(key, qvalue, [observation_shape], False),
            # the config's learning rate, annealed if it asks, after its gradient clipping
            # (optax.adam(config.update_cfg.learning_rate) would ignore the last two)
            tx=optimizer_from_config(config, AlgoType.OFF_POLICY),
        )
    )


def explore_factory(config: cfg.AlgoConfig) -> Callable:
    @jax.jit
    def explore_fn(
        dqn_state: TrainState,
        key: jax.Array,
        observations: jax.Array,
        exploration: float,
    ) -> jax.Array:
        all_qvalues = dqn_state.apply_fn(dqn_state.params, observations)
        actions, log_probs = dx.EpsilonGreedy(all_qvalues, exploration).sample_and_log_prob(seed=key)
        return actions, log_probs

    return explore_fn


def process_experience_factory(config: cfg.AlgoConfig) -> Callable:
    algo_params = config.algo_params

    @jax.jit
    def process_experience_fn(
        dqn_state: DQNState,
        key: jax.Array,
        experience: Experience,
    ) -> tuple[jax.Array, ...]:
        qvalue = dqn_state.qvalue
        all_next_qvalues = qvalue.apply_fn(qvalue.target_params, experience.next_observation)
        next_qvalues = jnp.max(all_next_qvalues, axis=-1, keepdims=True)

        discounts = algo_params.gamma * (1.0 - experience.done[..., None])
        returns = compute_td_targets(experience.reward[..., None], discounts, next_qvalues)
        actions = experience.action[..., None]

        return (experience.observation, actions, returns)

    return process_experience_fn


def update_step_factory(config: cfg.AlgoConfig) -> Callable:
    interval = config.algo_params.target_update_interval

    @jax.jit
    def update_step_fn(
        dqn_state: DQNState,
        key: jax.Array,
        experiences: tuple[jax.Array, ...],
    ) -> tuple[DQNState, dict]:
        batch = DQN_tuple(*experiences)

        def loss_fn(params: Params):
            all_qvalues = dqn_state.qvalue.apply_fn(params, batch.observation)
            qvalues = jnp.take_along_axis(all_qvalues, batch.action, axis=-1)
            loss = jnp.mean(optax.l2_loss(qvalues, batch.return_))
            return loss, {"loss_qvalue": loss}

        (_, info), grads = jax.value_and_grad(loss_fn, has_aux=True)(dqn_state.qvalue.params)
        qvalue = dqn_state.qvalue.apply_gradients(grads=grads)
        # the target network follows the online one every `interval` gradient steps
        dqn_state.qvalue = jax.lax.cond(
            qvalue.step % interval == 0, TrainState.hard_update_target, lambda state: state, qvalue
        )

        return dqn_state, info

    return update_step_fn


class DQN(OffPolicyAgent):
    def __init__(
        self,
        run_name: str,
        config: cfg.AlgoConfig,
        *,
        preprocess_fn: Callable = None,
        tabulate: bool = False,
    ):
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
        )

        self.algo_params = self.config.algo_params

    def select_action(self, observation: jax.Array) -> tuple[jax.Array, jax.Array]:
        keys = self.interact_keys(observation)

        action, zeros = self.explore_fn(self.state.qvalue, keys, observation, exploration=NO_EXPLORATION)
        return action, zeros

    def explore(self, observation: jax.Array) -> tuple[jax.Array, jax.Array]:
        keys = self.interact_keys(observation)

        action, zeros = self.explore_fn(
            self.state.qvalue,
            keys,
            observation,
            exploration=self.algo_params.exploration,
        )
        return action, zeros


# The command line trains it too: kitae train custom_dqn CartPole-v1 --import examples/custom_dqn.py
# --set algo_params.exploration=0.1 --set algo_params.gamma=0.99 --set algo_params.skip_steps=1
register_algorithm("custom_dqn", DQN, DQNParams)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "steps", nargs="?", type=int, default=200_000, metavar="N_ENV_STEPS", help="default: %(default)s"
    )
    parser.add_argument("seed", nargs="?", type=int, default=0, metavar="SEED", help="default: %(default)s")
    parser.add_argument("--run-dir", default="runs/example-dqn", metavar="DIR", help="default: %(default)s")
    args = parser.parse_args()
    for label, value, least in (("N_ENV_STEPS", args.steps, 1), ("SEED", args.seed, 0)):
        if value < least:
            parser.error(f"{label} {value} is not allowed; allowed: an int >= {least}")

    from kitae.envs.make import make_vec_env
    from kitae.runs import RunError

    SEED = args.seed
    ENV_ID = "CartPole-v1"
    N_ENVS = 16
    N_ENV_STEPS = args.steps

    env = make_vec_env(env_id=ENV_ID, n_envs=N_ENVS, capture_video=False, run_name=None)

    env_cfg = cfg.EnvConfig(
        task_name=ENV_ID,
        observation_space=env.single_observation_space,
        action_space=env.single_action_space,
        n_envs=N_ENVS,
        n_agents=1,
    )
    # rl-zoo's CartPole DQN, on 16 environments: 128 gradient steps on batches of 64 every 256
    # transitions, from a buffer of the last 100,000 (6,250 per environment)
    dqn_params = DQNParams(exploration=0.01, gamma=0.99, skip_steps=256, start_step=-1)
    update_cfg = cfg.UpdateConfig(
        learning_rate=0.001,
        learning_rate_annealing=True,
        max_grad_norm=0.5,
        max_buffer_size=6250,
        batch_size=64,
        n_epochs=128,
        shared_encoder=True,
    )
    train_cfg = cfg.TrainConfig(n_env_steps=N_ENV_STEPS, save_frequency=-1)
    algo_config = cfg.AlgoConfig(
        seed=SEED,
        algo_params=dqn_params,
        update_cfg=update_cfg,
        train_cfg=train_cfg,
        env_cfg=env_cfg,
    )

    dqn = DQN(run_name="example-dqn", config=algo_config)
    dqn.run_dir = Path(args.run_dir)  # the guide's DQN takes no run_dir argument
    try:
        stats = dqn.train(env, dqn.config.train_cfg.n_env_steps)
    except RunError as error:  # the run directory holds a run already
        parser.exit(2, f"{parser.prog}: error: {error}; from this script: delete it or give another --run-dir\n")
    first = sum(stats.episode_returns[:10]) / max(1, len(stats.episode_returns[:10]))
    print(
        f"{stats.env_steps} steps in {stats.train_seconds:.1f} s ({stats.sps:,.0f} steps/s), "
        f"{len(stats.episode_returns)} episodes: mean return of the first 10 {first:.1f}, "
        f"of the last 10 {stats.mean_return(10):.1f}"
    )

    # The run directory gives the trained agent back.
    loaded = DQN.unserialize(dqn.run_dir)
    pairs = zip(jax.tree.leaves(loaded.state.qvalue.params), jax.tree.leaves(dqn.state.qvalue.params))
    same = all(bool((a == b).all()) for a, b in pairs)
    print(f"reloaded from {dqn.run_dir} at step {loaded.checkpoint_step}: the same parameters: {same}")
