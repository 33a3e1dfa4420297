"""Presets from the command line, whole processes: LunarLander-v3, Acrobot-v1 and MuJoCo.

The presets (``kitae/presets/ppo.yaml`` and ``dqn.yaml``, the environment's section) are rl-zoo's
tuned settings for LunarLander and Acrobot, and CleanRL's ``ppo_continuous_action`` settings (the
PPO paper's for MuJoCo) for Gymnasium's MuJoCo tasks. Each seed is ``kitae train ALGO ENV --seed S`` (the preset's
steps) followed by ``kitae eval RUN --episodes 20`` (the deterministic policy of the last
checkpoint, environments seeded 0-19).

Targets, on every seed, the mean of the last 10 training episodes (``final``):

| env | algo | steps | target | rl-zoo reports (deterministic evaluation, the -v2/-v1 env) |
| --- | --- | --- | --- | --- |
| LunarLander-v3 | PPO | 1 M | >= 200 (solved) | 242 +- 31 |
| LunarLander-v3 | DQN | 100k | >= 100 | 154 +- 66 |
| Acrobot-v1 | PPO | 1 M | >= -100 | -73.5 +- 18 |
| Acrobot-v1 | DQN | 100k | >= -100 | -76.6 +- 11 |
| Hopper-v5 | PPO | 1 M | >= 1500 | (the PPO paper, Hopper-v1, its figure 3 at 1 M: about 2200) |
| HalfCheetah-v5 | PPO | 1 M | >= 1000 | (the PPO paper, HalfCheetah-v1, its figure 3 at 1 M: about 1800) |
| HalfCheetah-v5 | SAC | 300k (preset: 1 M) | >= 4000 | (the SAC paper, HalfCheetah-v1, figure 1, 300k: about 6000) |

(The MuJoCo targets, set before the first run: about two thirds of the papers' curves, whose seeds
spread widely on these tasks.)

(LunarLander ran as ``benchmarks/bench_lunar.py`` before this script took its cases: the same code.)

Run::

    .venv/bin/python benchmarks/bench_zoo.py ENV [--only ppo|dqn|sac] [--seeds 0 1 2] [--jobs 2]

LunarLander needs the box2d extra, MuJoCo the mujoco extra (``make install`` has both). Results:
``benchmarks/results/zoo-ENV.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, ROOT, kitae_train, seed_figures

from kitae.runs.provenance import made_with

TARGETS = {
    "LunarLander-v3": {"ppo": 200.0, "dqn": 100.0},
    "Acrobot-v1": {"ppo": -100.0, "dqn": -100.0},
    "Hopper-v5": {"ppo": 1500.0},
    "HalfCheetah-v5": {"ppo": 1000.0, "sac": 4000.0},
}
BUDGETS = {("HalfCheetah-v5", "sac"): 300_000}
"""Cases run shorter than their preset: SAC's 1 M steps take about an hour a seed on 2 cores."""


def evaluate(run_dir: Path, episodes: int = 20) -> dict:
    """``kitae eval RUN --episodes N``: the deterministic policy's mean and spread."""
    command = [sys.executable, "-m", "kitae.cli", "eval", str(run_dir), "--episodes", str(episodes)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"kitae eval {run_dir} failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"eval_return": summary["eval_return"], "eval_return_std": summary["eval_return_std"]}


def _budget(env: str, algo: str) -> list[str]:
    return ["--steps", str(BUDGETS[env, algo])] if (env, algo) in BUDGETS else []


def run_algo(env: str, algo: str, seeds: list[int], tmp: Path, jobs: int = 1) -> dict:
    threshold = TARGETS[env][algo]

    def one_seed(seed: int) -> dict:
        run_dir = tmp / f"{algo}-{seed}"
        summary = kitae_train([algo, env, "--seed", str(seed), *_budget(env, algo)], run_dir)
        run = {
            **seed_figures(seed, summary, run_dir, threshold),
            **evaluate(run_dir),
            "sps": summary["sps"],
            "state_fingerprint": summary["state_fingerprint"],
        }
        print(json.dumps({"algo": algo, **run}), flush=True)
        return run

    # --jobs 2: two seeds at a time, each its own process (a host-loop run keeps about one core busy)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        runs = list(pool.map(one_seed, seeds))
    return {
        "command": " ".join(["kitae train", algo, env, "--seed S", *_budget(env, algo)])
        + "; kitae eval RUN --episodes 20",
        "target": f"final return (mean of the last 10 training episodes) >= {threshold:g} on every seed",
        "runs": runs,
        "met": all(r["final_return"] >= threshold for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("env", choices=sorted(TARGETS))
    parser.add_argument("--only", choices=["dqn", "ppo", "sac"], action="append")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=1, help="seeds trained at a time (default 1)")
    args = parser.parse_args()
    for algo in args.only or []:
        if algo not in TARGETS[args.env]:
            parser.error(f"{args.env} has no {algo} case; it has: {', '.join(sorted(TARGETS[args.env]))}")
    path = RESULTS / f"zoo-{args.env}.json"
    with tempfile.TemporaryDirectory(prefix="kitae-zoo-") as tmp:
        for algo in args.only or sorted(TARGETS[args.env]):
            case = {
                **run_algo(args.env, algo, args.seeds, Path(tmp), args.jobs),
                "made_with": made_with(),
            }
            # read again just before writing: --only ppo and --only dqn may run side by side
            report = json.loads(path.read_text()) if path.exists() else {}
            report[algo] = case
            RESULTS.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({algo: case["met"] for algo, case in json.loads(path.read_text()).items()}))


if __name__ == "__main__":
    main()
