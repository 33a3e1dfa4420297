"""SAC on Brax's inverted pendulum, the whole run compiled into one XLA program (docs/brax.md).

Run: ``.venv/bin/python examples/brax_inverted_pendulum.py [N_ENV_STEPS] [--run-dir DIR]`` (default
20_000 steps into ``runs/example-brax-sac``; needs ``pip install -e ".[brax]"``). It builds the
environment from its id, the config from kitae's preset for that id, trains in the compiled loop,
and prints compile and train time, the mean return of the last ten episodes (1000 is the most:
episodes are cut at 1000 steps) and the return of the greedy policy over 10 evaluation episodes.
A run directory that already holds a run is refused: delete it or give another ``--run-dir``.
"""

import argparse

ENV_ID = "brax:inverted_pendulum"


def evaluate(agent, episodes: int = 10, seed: int = 123):
    """Returns of ``episodes`` greedy episodes, run together (vmapped) until each has ended once."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from kitae.envs.make import make_jax_env

    env = make_jax_env(ENV_ID, episodes)
    observation, state = env.reset(jax.random.PRNGKey(seed))
    step = jax.jit(env.step)
    returns, done = np.zeros(episodes), np.zeros(episodes, bool)
    key = jax.random.PRNGKey(seed + 1)
    while not done.all():
        actions, _ = agent.select_action(observation)
        key, step_key = jax.random.split(key)
        ts = step(step_key, state, jnp.asarray(actions))
        returns += np.where(done, 0.0, np.asarray(ts.reward))
        done |= np.asarray(ts.terminated | ts.truncated)
        observation, state = ts.observation, ts.state
    return returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "steps", nargs="?", type=int, default=20_000, metavar="N_ENV_STEPS", help="default: %(default)s"
    )
    parser.add_argument("--run-dir", default="runs/example-brax-sac", metavar="DIR", help="default: %(default)s")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"N_ENV_STEPS {args.steps} is not allowed; allowed: an int >= 1")

    # imported once the command line is read: --help and a mistake answer at once
    from kitae.runs import RunError, preset_agent

    # the preset of `kitae train sac brax:inverted_pendulum`; the environment is a BraxEnv
    # ("inverted_pendulum", generalized backend) in a VecJaxEnv
    agent, env = preset_agent("sac", ENV_ID, steps=args.steps, run_dir=args.run_dir)
    print(f"{env}: observations {env.single_observation_space}, actions {env.single_action_space}")
    try:
        run = agent.train(env, args.steps)  # a VecJaxEnv trains in the compiled loop; writes the run directory
    except RunError as error:  # the run directory holds a run already
        parser.exit(2, f"{parser.prog}: error: {error}; from this script: delete it or give another --run-dir\n")
    print(f"compile {run.compile_seconds:.1f} s, train {run.train_seconds:.1f} s ({run.sps:,.0f} steps/s)")
    print(f"mean return of the last 10 training episodes: {run.final_return():.1f}")
    returns = evaluate(agent)
    print(f"greedy policy over {len(returns)} episodes: {returns.mean():.1f} +- {returns.std():.1f}")


if __name__ == "__main__":
    main()
