"""Shared-parameter PPO on PettingZoo's cooperative ``simple_spread_v3`` (docs/multi_agent.md).

Three agents learn to cover three landmarks without colliding; one set of PPO parameters acts for
all three (each from its own observation). The copies of the environment run in worker processes
(``SubProcVecParallelEnv``); pass ``--in-process`` to step them in this process instead.

Needs the ``pettingzoo`` extra: ``pip install -e ".[pettingzoo]"``.

Run: ``.venv/bin/python examples/multi_agent_simple_spread.py [N_ENV_STEPS] [--in-process] [--run-dir DIR]``
(default 100_000 steps, a minute or two on a laptop). It prints the team return (the sum of the
three agents' returns) of the first and last 100 episodes and of a uniformly random policy, and
writes the run directory (default ``runs/example-simple-spread``), its TensorBoard logs in ``logs``
(``charts/episodic_return`` for the team, ``charts/agent_0/episodic_return``... for each agent). A
run directory that already holds a run is refused: delete it or give another ``--run-dir``.
"""

import argparse
import functools

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "steps", nargs="?", type=int, default=100_000, metavar="N_ENV_STEPS", help="default: %(default)s"
    )
    parser.add_argument("--in-process", action="store_true", help="step the environments in this process")
    parser.add_argument("--run-dir", default="runs/example-simple-spread", metavar="DIR", help="default: %(default)s")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"N_ENV_STEPS {args.steps} is not allowed; allowed: an int >= 1")

    # The worker processes are spawned and import this file: JAX, the agent and the environments
    # are imported here, where they slow neither every worker's start nor --help.
    from mpe2 import simple_spread_v3

    import kitae.config as cfg
    from kitae.algos.collections.ppo import PPO, PPOParams
    from kitae.envs.parallel import SyncVecParallelEnv
    from kitae.envs.subproc import SubProcVecParallelEnv
    from kitae.runs import RunError

    n_env_steps = args.steps
    vec_env_cls = SyncVecParallelEnv if args.in_process else SubProcVecParallelEnv

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
    agent = PPO("example-simple-spread", config, run_dir=args.run_dir)
    try:
        stats = agent.train(env, n_env_steps)  # the host loop; closes env (and its workers) at the end
    except RunError as error:  # the run directory holds a run already
        parser.exit(2, f"{parser.prog}: error: {error}; from this script: delete it or give another --run-dir\n")

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
