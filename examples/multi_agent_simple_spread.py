"""Shared-parameter PPO on PettingZoo's cooperative ``simple_spread_v3`` (docs/multi_agent.md).

Three agents learn to cover three landmarks without colliding; one set of PPO parameters acts for
all three (each from its own observation). The copies of the environment run in worker processes
(``SubProcVecParallelEnv``); pass ``--in-process`` to step them in this process instead.

Needs the ``pettingzoo`` extra: ``pip install -e ".[pettingzoo]"``.

Run: ``.venv/bin/python examples/multi_agent_simple_spread.py [N_ENV_STEPS] [--in-process]``
(default 100_000 steps, a minute or two on a laptop). It prints the team return (the sum of the
three agents' returns) of the first and last 100 episodes and of a uniformly random policy, and
writes TensorBoard logs to ``runs/example-simple-spread/logs`` (``charts/episodic_return`` for the
team, ``charts/agent_0/episodic_return``... for each agent).
"""

import functools
import sys

import numpy as np
from mpe2 import simple_spread_v3

from kitae.envs.parallel import SyncVecParallelEnv
from kitae.envs.subproc import SubProcVecParallelEnv


def main() -> None:
    # The worker processes are spawned and import this file: JAX and the agent are imported here,
    # where they do not slow every worker's start (the environments need none of it).
    import kitae.config as cfg
    from kitae.algos.collections.ppo import PPO, PPOParams

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    n_env_steps = int(args[0]) if args else 100_000
    vec_env_cls = SyncVecParallelEnv if "--in-process" in sys.argv else SubProcVecParallelEnv

    # 8 copies of the environment; each maker must be picklable for worker processes
    # (functools.partial or a lambda both work: kitae sends them with cloudpickle).
    env = vec_env_cls([functools.partial(simple_spread_v3.parallel_env, N=3, max_cycles=25)] * 8)
    print(
        f"{env.num_envs} copies, agents {env.possible_agents}, each observes "
        f"{env.single_observation_space.shape} and acts in {env.single_action_space}"
    )

    config = cfg.AlgoConfig(
        seed=0,
        algo_params=PPOParams(gamma=0.95, gae_lambda=0.95, entropy_coef=0.01, normalize_rewards=True),
        update_cfg=cfg.UpdateConfig(
            learning_rate=7e-4, learning_rate_annealing=True, max_buffer_size=100, batch_size=1200, n_epochs=5
        ),
        train_cfg=cfg.TrainConfig(n_env_steps=n_env_steps),
        env_cfg=cfg.EnvConfig(
            task_name="pettingzoo:mpe2.simple_spread_v3",
            observation_space=env.single_observation_space,  # ONE agent's spaces
            action_space=env.single_action_space,
            n_envs=env.num_envs,
            n_agents=env.num_agents,  # > 1: the shared-parameter (parallel) mode
        ),
    )
    agent = PPO("example-simple-spread", config)
    stats = agent.train(env, n_env_steps)  # the host loop; closes env (and its workers) at the end

    random_env = SyncVecParallelEnv([functools.partial(simple_spread_v3.parallel_env, N=3, max_cycles=25)] * 8)
    rng = np.random.default_rng(0)
    observations, _ = random_env.reset(seed=100)
    running, random_returns = np.zeros(8), []
    while len(random_returns) < 100:
        actions = {a: rng.integers(0, 5, 8) for a in random_env.possible_agents}
        observations, rewards, terminations, truncations, _ = random_env.step(actions)
        running += np.sum(list(rewards.values()), axis=0)
        ended = truncations["agent_0"] | terminations["agent_0"]
        random_returns += running[ended].tolist()
        running[ended] = 0.0
    random_env.close()

    print(
        f"team return: first 100 episodes {np.mean(stats.episode_returns[:100]):.1f}, "
        f"last 100 {stats.mean_return(100):.1f}; uniformly random policy {np.mean(random_returns):.1f}"
    )
    for name, returns in stats.agent_episode_returns.items():
        print(f"  {name}: last 100 episodes {np.mean(returns[-100:]):.1f}")


if __name__ == "__main__":  # needed: worker processes are spawned and import this file
    main()
