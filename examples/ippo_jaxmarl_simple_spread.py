"""IPPO on JaxMARL MPE simple_spread: one PPO agent whose parameters the 3 agents share, the whole
run compiled into one XLA program, several seeds vmapped together (docs/jaxmarl.md).

Needs the ``jaxmarl`` extra: ``.venv/bin/pip install -e ".[jaxmarl]"``.

Run: ``.venv/bin/python examples/ippo_jaxmarl_simple_spread.py [N_ENV_STEPS] [N_SEEDS]`` (default
300_000 steps per seed, 2 seeds). Prints the compile and training time and, for each seed, the
team return (the 3 agents' returns added up, per 26-step episode) of the first and last training
episodes, and each agent's own return.
"""

import argparse


def main(n_env_steps: int = 300_000, n_seeds: int = 2) -> None:
    # imported here, not at the top: --help and a mistake on the command line answer at once
    import kitae.config as cfg
    from kitae.algos.collections.ppo import PPO, PPOParams
    from kitae.envs.make import make_jax_env
    from kitae.loops.compiled import compiled_train

    # 16 copies of the environment, each with 3 agents: observations are dicts keyed by agent,
    # {"agent_0": (16, 18), ...}; every agent has the same spaces.
    env = make_jax_env("jaxmarl:MPE_simple_spread_v3", n_envs=16)
    print(env, "agents:", env.agents)
    config = cfg.AlgoConfig(
        seed=0,
        algo_params=PPOParams(gamma=0.99, gae_lambda=0.95, clip_coef=0.2, entropy_coef=0.01, value_coef=0.5),
        update_cfg=cfg.UpdateConfig(
            learning_rate=2.5e-4,
            learning_rate_annealing=True,
            max_grad_norm=0.5,
            max_buffer_size=128,  # rollout: 128 steps of 16 envs x 3 agents = 6144 agent transitions
            batch_size=1536,
            n_epochs=4,
        ),
        train_cfg=cfg.TrainConfig(n_env_steps=n_env_steps),
        env_cfg=cfg.EnvConfig(
            task_name="jaxmarl:MPE_simple_spread_v3",
            observation_space=env.single_observation_space,  # ONE agent's spaces
            action_space=env.single_action_space,
            n_envs=env.num_envs,
            n_agents=env.n_agents,  # > 1: parallel mode, one set of parameters for every agent
        ),
    )
    agent = PPO("ippo-simple-spread", config)
    seeds = list(range(n_seeds))
    run = compiled_train(agent, env, n_env_steps, seeds=seeds)
    print(
        f"compile {run.compile_seconds:.1f} s, train {run.train_seconds:.1f} s, "
        f"{run.sps:,.0f} environment steps/s over {n_seeds} seed{'s' if n_seeds > 1 else ''}"
    )
    for i, seed in enumerate(seeds):
        _, curve = run.episode_curve(i)
        agents = ", ".join(f"{a} {r:.1f}" for a, r in run.final_agent_returns(i, last=100).items())
        print(
            f"seed {seed}: team return {curve[0]:.1f} at first -> {run.final_return(i, last=100):.1f} "
            f"at the end ({agents})"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "steps",
        nargs="?",
        type=int,
        default=300_000,
        metavar="N_ENV_STEPS",
        help="per seed; default: %(default)s",
    )
    parser.add_argument("seeds", nargs="?", type=int, default=2, metavar="N_SEEDS", help="default: %(default)s")
    args = parser.parse_args()
    for label, value, least in (("N_ENV_STEPS", args.steps, 1), ("N_SEEDS", args.seeds, 1)):
        if value < least:
            parser.error(f"{label} {value} is not allowed; allowed: an int >= {least}")
    main(args.steps, args.seeds)
