"""Shared-parameter PPO on PettingZoo's cooperative ``simple_spread_v3`` (mpe2), host loop.

Acceptance (issue 6): shared-parameter PPO improves on a uniformly random policy by a margin we
record, over three seeds.

What is measured
----------------
* ``simple_spread_v3`` with its defaults: 3 agents, 3 landmarks, ``local_ratio=0.5``,
  ``max_cycles=25``, discrete actions (5). The team return of an episode is the SUM over the three
  agents of their returns (what ``charts/episodic_return`` logs).
* The random baseline: uniformly random actions for every agent, ``--eval-episodes`` episodes per
  seed in the same vector environment (same copies, seeds ``1000 + seed``).
* PPO: one set of parameters shared by the three agents, trained ``--steps`` environment steps per
  seed; then ``--eval-episodes`` fresh episodes with the trained policy's SAMPLED actions
  (``agent.explore``, as in training) in the same vector environment with the same seeds as the
  random baseline. ``final_return`` is the mean of the last 100 training episodes.
* The margin: PPO's evaluation mean minus the random policy's mean (team-return units), and
  the same in units of the random episodes' standard deviation.
* Vector environments: random-action throughput of ``SyncVecParallelEnv`` (in process) and
  ``SubProcVecParallelEnv`` (one worker process per copy) with the run's number of copies; the
  faster one trains.

Settings (shared parameters): 8 copies, rollouts of 100 steps (4 episodes per copy: 8 x 100 x 3
= 2,400 agent transitions per update), 5 epochs of 2 minibatches of 1,200, learning rate 7e-4
annealed linearly, gamma 0.95, GAE lambda 0.95, clip 0.2, entropy 0.01, rewards divided by the
running std of the discounted return (``normalize_rewards``), 64x64 tanh networks. Tried on seed 0
(100k steps, mean team return of the last 400 training episodes): MAPPO's usual gamma 0.99 and 10
epochs of 4 minibatches first fell to about -110 (the policy's entropy collapsed within 20
updates), then crawled back to -69 by 250k steps, barely past random (-72); gamma 0.95 with 5
epochs of 2 minibatches reached -61 by 100k steps.

Run::

    .venv/bin/python benchmarks/bench_pettingzoo.py                  # seeds 0 1 2
    .venv/bin/python benchmarks/bench_pettingzoo.py --steps 100000 --seeds 0

Results go to ``benchmarks/results/pettingzoo_ppo_simple_spread.json``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np
from common import RESULTS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kitae.envs.make import make_vec_env
from kitae.runs.provenance import made_with

ENV_ID = "pettingzoo:mpe2.simple_spread_v3"
PPO_PARAMS = dict(gamma=0.95, gae_lambda=0.95, clip_coef=0.2, entropy_coef=0.01, value_coef=0.5, normalize_rewards=True)


def update_cfg(n_envs: int, rollout: int):
    import kitae.config as cfg

    return cfg.UpdateConfig(
        learning_rate=7e-4,
        learning_rate_annealing=True,
        max_grad_norm=0.5,
        max_buffer_size=rollout,
        batch_size=n_envs * rollout * 3 // 2,
        n_epochs=5,
    )


def team_returns(env, act, episodes: int, seed: int) -> list[float]:
    """Team returns (sum over agents) of the first ``episodes`` episodes finished in ``env``,
    acting with ``act(observations) -> actions``."""
    observations, _ = env.reset(seed=seed)
    running = np.zeros(env.num_envs)
    returns: list[float] = []
    while len(returns) < episodes:
        observations, rewards, terminations, truncations, _ = env.step(act(observations))
        running += np.sum(list(rewards.values()), axis=0)
        ended = np.any([terminations[a] | truncations[a] for a in env.possible_agents], axis=0)
        returns.extend(running[ended].tolist())
        running[ended] = 0.0
    return returns[:episodes]


def random_actor(env, seed: int):
    rng = np.random.default_rng(seed)
    n = env.single_action_space.n
    return lambda observations: {a: rng.integers(0, n, env.num_envs) for a in env.possible_agents}


def throughput(mode: str, n_envs: int, steps: int = 2_000) -> float:
    """Environment steps per second with random actions."""
    env = make_vec_env(ENV_ID, n_envs, vectorization_mode=mode)
    try:
        act = random_actor(env, 0)
        env.reset(seed=0)
        env.step(act(None))
        start = time.perf_counter()
        for _ in range(steps // n_envs):
            env.step(act(None))
        return (steps // n_envs) * n_envs / (time.perf_counter() - start)
    finally:
        env.close()


def main() -> None:
    # JAX and the agent are imported here, not at the top: SubProcVecParallelEnv's worker
    # processes are spawned and import this file, and need none of it.
    import kitae.config as cfg
    from kitae.algos.collections.ppo import PPO, PPOParams
    from kitae.loops.train import vectorized_train

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--rollout", type=int, default=100)
    parser.add_argument("--eval-episodes", type=int, default=200)
    parser.add_argument("--mode", choices=["sync", "async", "fastest"], default="fastest")
    parser.add_argument("--output", default=str(RESULTS / "pettingzoo_ppo_simple_spread.json"))
    args = parser.parse_args()

    speeds = {mode: throughput(mode, args.n_envs) for mode in ("sync", "async")}
    print(
        f"random-action env steps/s with {args.n_envs} copies: "
        + ", ".join(f"{mode} {sps:,.0f}" for mode, sps in speeds.items()),
        flush=True,
    )
    mode = max(speeds, key=speeds.get) if args.mode == "fastest" else args.mode

    runs = []
    for seed in args.seeds:
        env = make_vec_env(ENV_ID, args.n_envs, vectorization_mode=mode)
        random_return = team_returns(env, random_actor(env, seed), args.eval_episodes, 1000 + seed)
        env.close()

        env = make_vec_env(ENV_ID, args.n_envs, vectorization_mode=mode)
        config = cfg.AlgoConfig(
            seed=seed,
            algo_params=PPOParams(**PPO_PARAMS),
            update_cfg=update_cfg(args.n_envs, args.rollout),
            train_cfg=cfg.TrainConfig(n_env_steps=args.steps),
            env_cfg=cfg.EnvConfig(
                task_name=ENV_ID,
                observation_space=env.single_observation_space,
                action_space=env.single_action_space,
                n_envs=env.num_envs,
                n_agents=env.num_agents,
            ),
        )
        agent = PPO(f"bench-pettingzoo-{seed}", config, run_dir=f"/tmp/kitae-bench/pettingzoo-{seed}")
        start = time.perf_counter()
        stats = vectorized_train(seed, agent, env, args.steps, agent.algo_type)
        wall = time.perf_counter() - start

        env = make_vec_env(ENV_ID, args.n_envs, vectorization_mode=mode)
        trained_return = team_returns(
            env,
            lambda obs, agent=agent: {a: np.asarray(x) for a, x in agent.explore(obs)[0].items()},
            args.eval_episodes,
            1000 + seed,
        )
        env.close()
        run = {
            "seed": seed,
            "random_return": float(np.mean(random_return)),
            "random_return_std": float(np.std(random_return)),
            "eval_return": float(np.mean(trained_return)),
            "eval_return_std": float(np.std(trained_return)),
            "first_100_return": float(np.mean(stats.episode_returns[:100])),
            "final_return": stats.mean_return(100),
            "final_agent_returns": stats.final_agent_returns(0, last=100),
            "steps": stats.env_steps,
            "episodes": len(stats.episode_returns),
            "updates": stats.n_updates,
            "wall_seconds": wall,
            "compile_seconds": stats.compile_seconds,
            "sps": stats.env_steps / wall,
            "sps_after_compile": stats.env_steps / (wall - stats.compile_seconds),
        }
        run["margin"] = run["eval_return"] - run["random_return"]
        run["margin_in_random_std"] = run["margin"] / run["random_return_std"]
        runs.append(run)
        print(
            f"seed {seed}: random {run['random_return']:.1f} +- {run['random_return_std']:.1f}, PPO eval "
            f"{run['eval_return']:.1f} +- {run['eval_return_std']:.1f} (training: first 100 episodes "
            f"{run['first_100_return']:.1f}, last 100 {run['final_return']:.1f}), margin {run['margin']:.1f}; "
            f"{stats.env_steps} steps in {wall:.1f} s ({stats.compile_seconds:.1f} s compiling)",
            flush=True,
        )

    result = {
        "name": "pettingzoo_ppo_simple_spread",
        "env_id": ENV_ID,
        "env_kwargs": "defaults: N=3, local_ratio=0.5, max_cycles=25, discrete actions",
        "team_return": "sum over the 3 agents of their episode returns",
        "command": "python " + " ".join(sys.argv),
        "vectorization_mode": mode,
        "vec_env_random_sps": speeds,
        "n_envs": args.n_envs,
        "n_env_steps": args.steps,
        "eval_episodes": args.eval_episodes,
        "mean_random_return": float(np.mean([r["random_return"] for r in runs])),
        "mean_eval_return": float(np.mean([r["eval_return"] for r in runs])),
        "mean_margin": float(np.mean([r["margin"] for r in runs])),
        "min_margin": float(np.min([r["margin"] for r in runs])),
        "median_wall_seconds": float(np.median([r["wall_seconds"] for r in runs])),
        "median_compile_seconds": float(np.median([r["compile_seconds"] for r in runs])),
        "passed": all(r["margin"] > 0 for r in runs),
        "runs": runs,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "made_with": made_with(),
        "algo_params": repr(PPOParams(**PPO_PARAMS)),
        "update_cfg": repr(update_cfg(args.n_envs, args.rollout)),
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2))
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "mean_random_return",
                    "mean_eval_return",
                    "mean_margin",
                    "min_margin",
                    "median_wall_seconds",
                    "passed",
                )
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
