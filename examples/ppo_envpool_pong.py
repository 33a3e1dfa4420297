"""PPO on Atari Pong through EnvPool (docs/envpool.md), from Python.

Run: ``.venv/bin/python examples/ppo_envpool_pong.py [N_ENV_STEPS] [--run-dir DIR]`` (default
10_240 steps: a quick look, Pong needs a few million steps to learn; into ``runs/example-ppo-pong``).
Needs ``pip install -e '.[envpool]'``.

It takes the agent and environments ``kitae train ppo envpool:Pong-v5`` would
(``kitae.runs.preset_agent``: ``make_vec_env("envpool:Pong-v5", 8)``, 84x84 grayscale frames,
stack of 4, laid out ``(84, 84, 4)`` uint8, episodic life, clipped rewards; the Atari PPO preset,
CleanRL's settings: 8 envs x 128 steps, 4 epochs of 4 minibatches, lr 2.5e-4 annealed, clip 0.1,
entropy 0.01, one NatureCNN shared by actor and critic), trains in the host loop into the run
directory and prints the returns of the last episodes. A run directory that already holds a run
is refused: delete it or give another ``--run-dir``.
"""

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "steps", nargs="?", type=int, default=10_240, metavar="N_ENV_STEPS", help="default: %(default)s"
    )
    parser.add_argument("--run-dir", default="runs/example-ppo-pong", metavar="DIR", help="default: %(default)s")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"N_ENV_STEPS {args.steps} is not allowed; allowed: an int >= 1")

    # imported once the command line is read: --help and a mistake answer at once
    from kitae.runs import RunError, preset_agent

    # Atari options: kitae.envs.make.make_vec_env("envpool:Pong-v5", 8, env_kwargs={"stack_num": 2})
    agent, env = preset_agent("ppo", "envpool:Pong-v5", steps=args.steps, seed=0, run_dir=args.run_dir)
    print(f"observations {env.single_observation_space}, actions {env.single_action_space}")
    try:
        stats = agent.train(env, args.steps)  # closes env at the end
    except RunError as error:  # the run directory holds a run already
        parser.exit(2, f"{parser.prog}: error: {error}; from this script: delete it or give another --run-dir\n")
    print(
        f"{stats.env_steps} steps: {stats.compile_seconds:.0f} s compiling, then {stats.train_seconds:.0f} s "
        f"training; {stats.n_updates} updates, {len(stats.episode_returns)} episodes"
    )
    if stats.episode_returns:
        print(
            f"mean return of the last {min(10, len(stats.episode_returns))} episodes: {stats.mean_return(10):.1f} "
            "(a random policy scores about -20.7; a trained one +20)"
        )


if __name__ == "__main__":
    main()
