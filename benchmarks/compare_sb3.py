"""Speed, side by side: Stable-Baselines3 (PyTorch), SBX (JAX) and kitae on the same task.

Each framework trains in its own subprocess (so peak memory is its own), one after the other,
with the same hyperparameters; the frameworks take turns for ``--repeats`` rounds so that noise
from the shared machine falls on all of them alike. Reports, per framework, the median wall
time, environment steps per second and final return (mean of the last 10 training episodes),
the peak resident memory, and kitae's speed ratio to each: in training wall time (the call that
trains, measured inside each process) and in whole processes (imports and set-up included,
paired round by round).

kitae runs four ways, the first three by default: ``kitae`` is the host loop over the same
Gymnasium vector environment as SB3 and SBX, with an empty compilation cache (every run compiles,
as SB3/SBX's first run does); ``kitae-warm`` is the same with kitae's persistent compilation cache
warmed by one untimed run (what a user's second run of a configuration costs); ``kitae-compiled``
is the compiled loop over the gymnax port of the same environment (``gymnax:CartPole-v1`` /
``gymnax:Pendulum-v1``, same dynamics, same hyperparameters), cold cache, wall time including
compilation. ``kitae-bare`` (not run by default) is the host loop with a cold cache and no run
directory: the executor called without callbacks (``kitae.loops.host.HostExecutor().run``), so
that, like SB3's and SBX's ``learn`` here, it writes no logs, checkpoints or plot.

Needs the optional comparison dependencies: ``make compare`` installs them
(``pip install torch==2.13.0`` for the CPU wheel on disk, then ``.[compare]``).

Run: ``.venv/bin/python benchmarks/compare_sb3.py --task ppo-cartpole --repeats 3``
     (``--frameworks sb3 kitae`` for a subset)
     ``.venv/bin/python benchmarks/compare_sb3.py --task sac-pendulum --repeats 3``

Results: ``benchmarks/results/compare_TASK.json``, or ``--out``'s file (a run on another machine,
kept apart from the recorded one).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

# The same settings for every framework. PPO: rl-zoo's tuned CartPole-v1 (8 envs x 32 steps,
# 20 epochs of minibatches of 256, lr 1e-3 annealed, gamma 0.98, lambda 0.8, no entropy bonus),
# separate [64, 64] tanh actor and critic. SAC: 1 env, one gradient step of 256 per env step,
# [256, 256] ReLU networks, lr 1e-3, automatic temperature, learning starts after 1000 steps.
TASKS = {
    "ppo-cartpole": dict(env_id="CartPole-v1", n_envs=8, steps=100_000),
    "sac-pendulum": dict(env_id="Pendulum-v1", n_envs=1, steps=10_000),
}
PPO = dict(
    n_steps=32,
    batch_size=256,
    n_epochs=20,
    learning_rate=1e-3,
    gamma=0.98,
    gae_lambda=0.8,
    clip_range=0.2,
    ent_coef=0.0,
    vf_coef=0.5,
    max_grad_norm=0.5,
)
SAC = dict(
    learning_rate=1e-3,
    buffer_size=1_000_000,
    batch_size=256,
    learning_starts=1000,
    gamma=0.99,
    tau=0.005,
    train_freq=1,
    gradient_steps=1,
)


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _sb3_like(framework: str, task: str, seed: int) -> dict:
    import gymnasium as gym
    import numpy as np

    if framework == "sb3":
        from stable_baselines3 import PPO as PPOClass
        from stable_baselines3 import SAC as SACClass
    else:
        from sbx import PPO as PPOClass
        from sbx import SAC as SACClass
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.monitor import Monitor

    spec = TASKS[task]
    returns: list[float] = []

    class Record(gym.Wrapper):
        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            if "episode" in info:
                returns.append(float(info["episode"]["r"]))
            return obs, reward, terminated, truncated, info

    env = make_vec_env(spec["env_id"], n_envs=spec["n_envs"], seed=seed, wrapper_class=lambda e: Record(Monitor(e)))
    if task.startswith("ppo"):
        lr = PPO["learning_rate"]
        algo_class = PPOClass
        kwargs = {
            **PPO,
            "learning_rate": lambda progress: progress * lr,
            "policy_kwargs": dict(net_arch=dict(pi=[64, 64], vf=[64, 64])),
        }
    else:
        algo_class = SACClass
        kwargs = {**SAC, "policy_kwargs": dict(net_arch=[256, 256])}
    if framework == "sb3":
        kwargs["device"] = "cpu"
    model = algo_class("MlpPolicy", env, seed=seed, verbose=0, **kwargs)
    start = time.perf_counter()
    model.learn(total_timesteps=spec["steps"])
    wall = time.perf_counter() - start
    return {
        "wall_seconds": wall,
        "sps": spec["steps"] / wall,
        "final_return": float(np.mean(returns[-10:])) if returns else float("nan"),
    }


def _kitae(task: str, seed: int, compiled: bool = False, bare: bool = False) -> dict:
    sys.path.insert(0, str(HERE))
    from common import build_config

    import kitae.config as cfg
    from kitae.envs.make import make_jax_env, make_vec_env

    spec = TASKS[task]
    if compiled:
        env = make_jax_env(f"gymnax:{spec['env_id']}", spec["n_envs"])
    else:
        env = make_vec_env(spec["env_id"], spec["n_envs"])
    if task.startswith("ppo"):
        from kitae.algos.collections.ppo import PPO as Agent
        from kitae.algos.collections.ppo import PPOParams

        params = PPOParams(
            gamma=PPO["gamma"],
            gae_lambda=PPO["gae_lambda"],
            clip_coef=PPO["clip_range"],
            clip_value_loss=False,
            entropy_coef=PPO["ent_coef"],
            value_coef=PPO["vf_coef"],
        )
        update = cfg.UpdateConfig(
            learning_rate=PPO["learning_rate"],
            learning_rate_annealing=True,
            max_grad_norm=PPO["max_grad_norm"],
            max_buffer_size=PPO["n_steps"],
            batch_size=PPO["batch_size"],
            n_epochs=PPO["n_epochs"],
        )
    else:
        from kitae.algos.collections.sac import SAC as Agent
        from kitae.algos.collections.sac import SACParams

        params = SACParams(gamma=SAC["gamma"], tau=SAC["tau"], start_step=SAC["learning_starts"])
        update = cfg.UpdateConfig(
            learning_rate=SAC["learning_rate"],
            max_grad_norm=None,
            max_buffer_size=SAC["buffer_size"],
            batch_size=SAC["batch_size"],
            n_epochs=1,
        )
    config = build_config(env, params, update, seed=seed, n_env_steps=spec["steps"], env_id=spec["env_id"])
    # a new run directory each time: agent.train writes its run there (config, checkpoints, logs)
    agent = Agent("compare", config, run_dir=tempfile.mkdtemp(prefix=f"kitae-compare-{task}-{seed}-"))
    start = time.perf_counter()
    if bare:  # the loop alone: no run directory (TensorBoard, metrics, checkpoints, plot)
        from kitae.loops.host import HostExecutor

        result = HostExecutor().run(agent, env, spec["steps"])
    else:
        result = agent.train(env, spec["steps"])
    wall = time.perf_counter() - start
    if compiled:
        return {
            "wall_seconds": wall,
            "sps": result.env_steps / wall,
            "final_return": result.final_return(),
            "compile_seconds": result.compile_seconds,
            "train_seconds": result.train_seconds,
        }
    return {
        "wall_seconds": wall,
        "sps": result.env_steps / wall,
        "final_return": result.mean_return(10),
        "compile_seconds": result.compile_seconds,
    }


def worker(framework: str, task: str, seed: int) -> None:
    if framework.startswith("kitae"):
        result = _kitae(task, seed, compiled=framework == "kitae-compiled", bare=framework == "kitae-bare")
    else:
        result = _sb3_like(framework, task, seed)
    result["peak_rss_mb"] = _peak_mb()
    print("RESULT " + json.dumps(result), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(TASKS), default="ppo-cartpole")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--frameworks",
        nargs="+",
        default=["sb3", "sbx", "kitae", "kitae-warm", "kitae-compiled"],
        choices=["sb3", "sbx", "kitae", "kitae-warm", "kitae-compiled", "kitae-bare"],
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="the JSON file to write (default: benchmarks/results/compare_TASK.json)"
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.task, args.seed)
        return

    runs: dict[str, list[dict]] = {name: [] for name in args.frameworks}
    warm_cache = tempfile.mkdtemp(prefix="kitae-compare-warm-")

    def launch(name: str, seed: int) -> subprocess.CompletedProcess:
        cache = warm_cache if name == "kitae-warm" else tempfile.mkdtemp(prefix="kitae-compare-cold-")
        return subprocess.run(
            [sys.executable, __file__, "--worker", name, "--task", args.task, "--seed", str(seed)],
            capture_output=True,
            text=True,
            env={**os.environ, "KITAE_CACHE_DIR": cache},
        )

    if "kitae-warm" in args.frameworks:
        launch("kitae-warm", 0)  # untimed: fills the cache the timed kitae-warm runs load from
    for repeat in range(args.repeats):
        for name in args.frameworks:
            begin = time.perf_counter()
            out = launch(name, repeat)
            process_seconds = time.perf_counter() - begin  # the whole process: imports and set-up too
            lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
            if out.returncode != 0 or not lines:
                raise SystemExit(f"{name} failed:\n{out.stderr[-3000:]}")
            result = json.loads(lines[-1][7:])
            result["process_seconds"] = process_seconds
            runs[name].append(result)
            print(
                f"[{args.task}] round {repeat + 1} {name}: {result['sps']:,.0f} steps/s, "
                f"process {process_seconds:.1f} s, "
                f"final return {result['final_return']:.1f}, peak {result['peak_rss_mb']:.0f} MB",
                flush=True,
            )

    summary = {
        name: {
            "median_wall_seconds": statistics.median(r["wall_seconds"] for r in rs),
            "median_process_seconds": statistics.median(r["process_seconds"] for r in rs),
            "median_sps": statistics.median(r["sps"] for r in rs),
            "median_final_return": statistics.median(r["final_return"] for r in rs),
            "max_peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
            "runs": rs,
        }
        for name, rs in runs.items()
    }
    for ours in [name for name in summary if name.startswith("kitae")]:
        for name in ("sb3", "sbx"):
            if name in summary:
                summary[ours][f"speed_ratio_vs_{name}"] = summary[ours]["median_sps"] / summary[name]["median_sps"]
                # whole processes, paired round by round (the same machine state for both)
                summary[ours][f"process_speed_ratio_vs_{name}"] = statistics.median(
                    theirs["process_seconds"] / mine["process_seconds"] for mine, theirs in zip(runs[ours], runs[name])
                )
    spec = TASKS[args.task]
    print(
        f"\n{args.task}: {spec['env_id']}, {spec['steps']:,} steps, {spec['n_envs']} env(s), "
        f"{args.repeats} rounds (medians)"
    )
    print("| framework | whole process s | training wall s | steps/s | final return | peak MB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, s in summary.items():
        print(
            f"| {name} | {s['median_process_seconds']:.1f} | {s['median_wall_seconds']:.1f} | {s['median_sps']:,.0f} | "
            f"{s['median_final_return']:.1f} | {s['max_peak_rss_mb']:.0f} |"
        )
    for ours in [name for name in summary if name.startswith("kitae")]:
        for key, value in summary[ours].items():
            if key.startswith("speed_ratio"):
                print(f"{ours} {key.replace('_', ' ')}: {value:.2f}x")
    from common import RESULTS

    path = args.out or RESULTS / f"compare_{args.task}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"task": args.task, **spec, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
