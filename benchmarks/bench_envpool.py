"""EnvPool benchmarks (host loop): environment throughput, PPO on CartPole, PPO on Pong.

1. ``throughput``: CartPole-v1, 8 environments, uniformly random actions (drawn beforehand, the
   same for every contender), 20 000 vector steps (160 000 transitions) per repetition, median of
   5: kitae's ``EnvPoolVectorEnv`` (SAME_STEP adapter), EnvPool's own Gymnasium pool (NEXT_STEP,
   no adapter: what the adapter costs) and Gymnasium's ``SyncVectorEnv`` (``make_vec_env``).
2. ``cartpole``: PPO on ``envpool:CartPole-v1`` for 100k steps with rl-zoo's tuned settings
   (``bench_ppo.CARTPOLE``), seeds 0 1 2: final return and steps/s.
3. ``pong``: PPO on ``envpool:Pong-v5`` with the Atari preset (CleanRL's settings, shared
   NatureCNN) for ``--pong-steps`` steps (default 16 384 = 16 rollouts of 8 x 128): steps/s after
   compilation, and the time a 2M-step learning run would take at that speed. ``--pong-steps
   2000000`` runs the whole learning run (``kitae train ppo envpool:Pong-v5 --steps 2000000`` does
   the same with a run directory).

Run::

    .venv/bin/python benchmarks/bench_envpool.py                         # all three
    .venv/bin/python benchmarks/bench_envpool.py --only throughput

Results: ``benchmarks/results/envpool_throughput.json``, ``envpool_ppo_cartpole.json``,
``envpool_ppo_pong.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from common import RESULTS

from kitae.runs.provenance import made_with


def _time_steps(env, actions: np.ndarray) -> float:
    env.reset(seed=0)
    start = time.perf_counter()
    for a in actions:
        env.step(a)
    return time.perf_counter() - start


def throughput(n_envs: int = 8, vector_steps: int = 20_000, repeats: int = 5) -> dict:
    import envpool

    from kitae.envs.make import make_vec_env

    actions = np.random.default_rng(0).integers(0, 2, size=(vector_steps, n_envs)).astype(np.int32)
    makers = {
        "kitae EnvPoolVectorEnv (SAME_STEP)": lambda: make_vec_env("envpool:CartPole-v1", n_envs),
        "envpool make_gymnasium (NEXT_STEP, no adapter)": lambda: envpool.make_gymnasium(
            "CartPole-v1", num_envs=n_envs, seed=0
        ),
        "gymnasium SyncVectorEnv (SAME_STEP)": lambda: make_vec_env("CartPole-v1", n_envs),
    }
    rows = {}
    for name, make in makers.items():
        times = []
        for _ in range(repeats):
            env = make()
            times.append(_time_steps(env, actions))
            env.close()
        sps = [vector_steps * n_envs / t for t in times]
        rows[name] = {"median_sps": statistics.median(sps), "sps": sps}
        print(f"{name}: median {statistics.median(sps):,.0f} transitions/s", flush=True)
    result = {
        "name": "envpool_throughput",
        "load_average_1_5_15min_at_end": list(os.getloadavg()),
        "env": "CartPole-v1",
        "n_envs": n_envs,
        "vector_steps": vector_steps,
        "repeats": repeats,
        "actions": "uniform random, drawn beforehand",
        "results": rows,
        "made_with": made_with(),
        "command": "python benchmarks/bench_envpool.py --only throughput",
    }
    (RESULTS / "envpool_throughput.json").write_text(json.dumps(result, indent=2))
    return result


def cartpole(seeds: list[int]) -> dict:
    from bench_ppo import CARTPOLE
    from common import run_learning

    from kitae.algos.collections.ppo import PPO

    settings = dict(CARTPOLE, env_id="envpool:CartPole-v1")
    result = run_learning("envpool_ppo_cartpole", PPO, seeds=seeds, **settings)
    result["command"] = "python benchmarks/bench_envpool.py --only cartpole"
    (RESULTS / "envpool_ppo_cartpole.json").write_text(json.dumps(result, indent=2))
    return result


def pong(n_steps: int, seed: int = 0) -> dict:
    from kitae.loops.callbacks import Callback
    from kitae.loops.train import vectorized_train
    from kitae.runs import preset_agent

    agent, env = preset_agent(
        "ppo", "envpool:Pong-v5", seed=seed, steps=n_steps, run_dir=f"/tmp/kitae-bench/envpool-pong-{seed}"
    )
    config = agent.config
    marks: list[tuple[int, float]] = []  # (step, wall seconds) at each update
    start = time.perf_counter()

    class Marks(Callback):
        """Notes the time of each update (a losses point per update: log_frequency is a rollout)."""

        def on_losses(self, step: int, losses: dict, seed_index) -> None:
            marks.append((step, time.perf_counter() - start))
            print(f"Pong: step {step}, {marks[-1][1]:.0f} s, {len(marks)} updates", flush=True)

    rollout = config.update_cfg.max_buffer_size * config.env_cfg.n_envs
    agent.config.train_cfg.log_frequency = rollout
    stats = vectorized_train(seed, agent, env, n_steps, agent.algo_type, callbacks=[Marks()])
    wall = time.perf_counter() - start
    # steady speed: from the first update (which compiles) to the last, one rollout + update each
    if len(marks) < 2:
        raise SystemExit("--pong-steps must allow at least 2 updates (>= 2048 steps) to measure a speed")
    intervals = [b[1] - a[1] for a, b in zip(marks, marks[1:])]
    sps = (marks[-1][0] - marks[0][0]) / (marks[-1][1] - marks[0][1])
    run_seconds = wall - stats.compile_seconds
    full = 2_000_000 / sps + stats.compile_seconds
    result = {
        "name": "envpool_ppo_pong",
        "env_id": "envpool:Pong-v5",
        "seed": seed,
        "steps": stats.env_steps,
        "n_envs": config.env_cfg.n_envs,
        "updates": stats.n_updates,
        "wall_seconds": wall,
        "compile_seconds": stats.compile_seconds,
        "run_seconds": run_seconds,
        "seconds_per_rollout_and_update": intervals,
        "sps_after_compile": sps,
        "episodes": len(stats.episode_returns),
        "mean_return_last_10": stats.mean_return(10) if stats.episode_returns else None,
        "extrapolated_2M_seconds": full,
        "extrapolated_2M_minutes": full / 60,
        "fits_40_min": full < 40 * 60,
        "made_with": made_with(),
        "load_average_1_5_15min_at_end": list(os.getloadavg()),
        "command": f"python benchmarks/bench_envpool.py --only pong --pong-steps {n_steps}",
        "full_run_command": "kitae train ppo envpool:Pong-v5 --steps 2000000",
        "algo_params": repr(config.algo_params),
        "update_cfg": repr(config.update_cfg),
    }
    print(
        f"Pong: {stats.env_steps} steps, compile {stats.compile_seconds:.1f} s, {sps:,.0f} steps/s after "
        f"compilation; 2M steps would take {full / 60:.0f} min",
        flush=True,
    )
    (RESULTS / "envpool_ppo_pong.json").write_text(json.dumps(result, indent=2))
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=("throughput", "cartpole", "pong"), nargs="+")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--pong-steps", type=int, default=16_384)
    args = parser.parse_args()
    only = set(args.only or ("throughput", "cartpole", "pong"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    if "throughput" in only:
        throughput()
    if "cartpole" in only:
        cartpole(args.seeds)
    if "pong" in only:
        pong(args.pong_steps)


if __name__ == "__main__":
    main()
