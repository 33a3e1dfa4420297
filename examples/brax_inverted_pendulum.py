"""SAC on Brax's inverted pendulum, the whole run compiled into one XLA program (docs/brax.md).

Run: ``.venv/bin/python examples/brax_inverted_pendulum.py [N_ENV_STEPS]`` (default 20_000; needs
``pip install -e ".[brax]"``). It builds the environment from its id, the config from kitae's
preset for that id, trains in the compiled loop, and prints compile and train time, the mean
return of the last ten episodes (1000 is the most: episodes are cut at 1000 steps) and the
return of the greedy policy over 10 evaluation episodes.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

from kitae.algos.collections.sac import SAC
from kitae.envs.make import make_jax_env
from kitae.runs import preset_agent

ENV_ID = "brax:inverted_pendulum"


def evaluate(agent: SAC, episodes: int = 10, seed: int = 123) -> np.ndarray:
    """Returns of ``episodes`` greedy episodes, run together (vmapped) until each has ended once."""
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
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    # the preset of `kitae train sac brax:inverted_pendulum`; the environment is a BraxEnv
    # ("inverted_pendulum", generalized backend) in a VecJaxEnv
    agent, env = preset_agent("sac", ENV_ID, steps=steps, run_dir="runs/example-brax-sac")
    print(f"{env}: observations {env.single_observation_space}, actions {env.single_action_space}")
    run = agent.train(env, steps)  # a VecJaxEnv trains in the compiled loop; writes runs/example-brax-sac
    print(f"compile {run.compile_seconds:.1f} s, train {run.train_seconds:.1f} s ({run.sps:,.0f} steps/s)")
    print(f"mean return of the last 10 training episodes: {run.final_return():.1f}")
    returns = evaluate(agent)
    print(f"greedy policy over {len(returns)} episodes: {returns.mean():.1f} +- {returns.std():.1f}")


if __name__ == "__main__":
    main()
