"""Images in the compiled loop: PPO on gymnax Breakout-MinAtar ((10, 10, 4) observations,
``MinAtarCNN`` picked by ``encoder_factory``), seeds vmapped in one program, against a uniformly
random policy measured in the same environment.

Settings (close to PureJaxRL's PPO for MinAtar, not tuned here):
64 environments, rollouts of 128 steps, 4 epochs of 8 minibatches (1024 transitions), learning
rate 5e-4 annealed, clip 0.2, entropy 0.01, GAE 0.95, gamma 0.99, a separate actor and critic.

Run: ``.venv/bin/python benchmarks/bench_minatar.py [--steps N] [--seeds 0 1 2]`` (default: 500k
steps, seed 0: a few minutes on a 2-core CPU; MinAtar agents usually need 5-10M steps to play
well, so this shows learning against the random policy, not final performance); writes
``benchmarks/results/minatar_breakout.json``.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import jax
import jax.numpy as jnp
import numpy as np
from common import RESULTS

from kitae.runs.provenance import made_with

ENV_ID = "gymnax:Breakout-MinAtar"


def random_policy_return(env, n_steps: int, seed: int = 0) -> tuple[float, int]:
    """Mean return of the episodes a uniformly random policy finishes in ``n_steps`` vector steps."""
    from kitae.loops.episodes import track_episodes

    n = env.single_action_space.n

    def step(carry, key):
        state, running, lengths, total, count = carry
        action_key, step_key = jax.random.split(key)
        actions = jax.random.randint(action_key, (env.num_envs,), 0, n)
        ts = env.step(step_key, state, actions)
        ended = jnp.logical_or(ts.terminated, ts.truncated)
        running, lengths, returns, _ = track_episodes(jnp, running, lengths, ts.reward, ended)
        return (
            ts.state,
            running,
            lengths,
            total + jnp.sum(jnp.where(ended, returns, 0.0)),
            count + jnp.sum(ended),
        ), None

    @jax.jit
    def run(key):
        reset_key, steps_key = jax.random.split(key)
        _, state = env.reset(reset_key)
        zeros = jnp.zeros(env.num_envs, jnp.float32)
        carry = (state, zeros, jnp.zeros(env.num_envs, jnp.int32), jnp.zeros(()), jnp.zeros((), jnp.int32))
        (_, _, _, total, count), _ = jax.lax.scan(step, carry, jax.random.split(steps_key, n_steps))
        return total, count

    total, count = run(jax.random.PRNGKey(seed))
    return float(total) / max(int(count), 1), int(count)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=500_000, help="environment steps per seed")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()

    import kitae.config as cfg
    from kitae.algos.collections.ppo import PPO, PPOParams
    from kitae.envs.make import make_jax_env
    from kitae.loops.compiled import compiled_train

    n_envs = 64
    env = make_jax_env(ENV_ID, n_envs)
    config = cfg.AlgoConfig(
        seed=args.seeds[0],
        algo_params=PPOParams(gamma=0.99, gae_lambda=0.95, clip_coef=0.2, entropy_coef=0.01, value_coef=0.5),
        update_cfg=cfg.UpdateConfig(
            learning_rate=5e-4,
            learning_rate_annealing=True,
            max_grad_norm=0.5,
            max_buffer_size=128,
            batch_size=1024,
            n_epochs=4,
        ),
        train_cfg=cfg.TrainConfig(n_env_steps=args.steps),
        env_cfg=cfg.EnvConfig(
            task_name=ENV_ID,
            observation_space=env.single_observation_space,
            action_space=env.single_action_space,
            n_envs=n_envs,
        ),
    )
    agent = PPO("bench-minatar", config, run_dir="/tmp/kitae-bench/minatar")
    start = time.perf_counter()
    result = compiled_train(agent, env, args.steps, seeds=list(args.seeds))
    wall = time.perf_counter() - start
    finals = [result.final_return(i) for i in range(len(args.seeds))]
    random_return, random_episodes = random_policy_return(env, 2_000)
    row = {
        "algo": "ppo",
        "env_id": ENV_ID,
        "encoder": "MinAtarCNN",
        "n_envs": n_envs,
        "steps_per_seed": result.env_steps,
        "seeds": list(args.seeds),
        "final_returns": finals,
        "median_final_return": float(np.median(finals)),
        "random_policy_return": random_return,
        "random_policy_episodes": random_episodes,
        "compile_seconds": result.compile_seconds,
        "train_seconds": result.train_seconds,
        "wall_seconds": wall,
        "sps_all_seeds": result.sps,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "made_with": made_with(),
        "command": f".venv/bin/python benchmarks/bench_minatar.py --steps {args.steps} --seeds "
        + " ".join(map(str, args.seeds)),
    }
    print(json.dumps(row, indent=2))
    path = RESULTS / "minatar_breakout.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(row, indent=2) + "\n")


if __name__ == "__main__":
    main()
