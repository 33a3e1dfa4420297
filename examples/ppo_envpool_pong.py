"""PPO on Atari Pong through EnvPool (docs/envpool.md), from Python.

Run: ``.venv/bin/python examples/ppo_envpool_pong.py [N_ENV_STEPS]`` (default 10_240: a quick look;
Pong needs a few million steps to learn). Needs ``pip install -e '.[envpool]'``.

It takes the agent and environments ``kitae train ppo envpool:Pong-v5`` would
(``kitae.runs.preset_agent``: ``make_vec_env("envpool:Pong-v5", 8)``, 84x84 grayscale frames,
stack of 4, laid out ``(84, 84, 4)`` uint8, episodic life, clipped rewards; the Atari PPO preset,
CleanRL's settings: 8 envs x 128 steps, 4 epochs of 4 minibatches, lr 2.5e-4 annealed, clip 0.1,
entropy 0.01, one NatureCNN shared by actor and critic), trains in the host loop into
``runs/example-ppo-pong`` and prints the returns of the last episodes.
"""

import sys

from kitae.runs import preset_agent


def main(n_env_steps: int = 10_240) -> None:
    # Atari options: kitae.envs.make.make_vec_env("envpool:Pong-v5", 8, env_kwargs={"stack_num": 2})
    agent, env = preset_agent("ppo", "envpool:Pong-v5", steps=n_env_steps, seed=0, run_dir="runs/example-ppo-pong")
    print(f"observations {env.single_observation_space}, actions {env.single_action_space}")
    stats = agent.train(env, n_env_steps)  # closes env at the end
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
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 10_240)
