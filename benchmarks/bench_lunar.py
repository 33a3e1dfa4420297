"""LunarLander-v3 (Gymnasium, Box2D) from the command line: the presets' PPO and DQN, whole processes.

Both presets are rl-zoo's tuned LunarLander settings (``kitae/presets/ppo.yaml`` and ``dqn.yaml``,
section ``gymnasium:LunarLander-v3``): PPO over 16 environments for 1 M steps, DQN on one for
100k. Each seed is ``kitae train ALGO LunarLander-v3 --seed S`` (the preset's steps) followed by
``kitae eval RUN --episodes 20`` (the deterministic policy of the last checkpoint, environments
seeded 0-19).

Targets: LunarLander counts as solved at a return of 200. PPO: the mean of the last 10 training
episodes >= 200 on every seed (rl-zoo reports 242 +- 31 for its PPO at 1 M steps, LunarLander-v2).
DQN: >= 100 on every seed (rl-zoo reports 154 +- 66 for its DQN at 100k steps, LunarLander-v2:
a run of 100k steps is short for DQN here, and its seeds spread).

Run::

    .venv/bin/python benchmarks/bench_lunar.py [--only ppo|dqn] [--seeds 0 1 2]

Needs the box2d extra (``make install`` has it). Results: ``benchmarks/results/lunar.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ROOT, kitae_train, seed_figures

RESULTS = Path(__file__).resolve().parent / "results"
TARGETS = {"ppo": 200.0, "dqn": 100.0}
ENV = "LunarLander-v3"


def evaluate(run_dir: Path, episodes: int = 20) -> dict:
    """``kitae eval RUN --episodes N``: the deterministic policy's mean and spread."""
    command = [sys.executable, "-m", "kitae.cli", "eval", str(run_dir), "--episodes", str(episodes)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"kitae eval {run_dir} failed ({done.returncode}): {done.stderr[-2000:]}")
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"eval_return": summary["eval_return"], "eval_return_std": summary["eval_return_std"]}


def run_algo(algo: str, seeds: list[int], tmp: Path) -> dict:
    threshold = TARGETS[algo]
    runs = []
    for seed in seeds:
        run_dir = tmp / f"{algo}-{seed}"
        summary = kitae_train([algo, ENV, "--seed", str(seed)], run_dir)
        runs.append(
            {
                **seed_figures(seed, summary, run_dir, threshold),
                **evaluate(run_dir),
                "sps": summary["sps"],
                "state_fingerprint": summary["state_fingerprint"],
            }
        )
        print(json.dumps({"algo": algo, **runs[-1]}), flush=True)
    return {
        "command": f"kitae train {algo} {ENV} --seed S; kitae eval RUN --episodes 20",
        "target": f"final return (mean of the last 10 training episodes) >= {threshold:g} on every seed",
        "runs": runs,
        "met": all(r["final_return"] >= threshold for r in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(TARGETS), action="append")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    path = RESULTS / "lunar.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    with tempfile.TemporaryDirectory(prefix="kitae-lunar-") as tmp:
        for algo in args.only or sorted(TARGETS):
            report[algo] = {**run_algo(algo, args.seeds, Path(tmp)), "machine": platform.processor() or "cpu"}
            RESULTS.mkdir(exist_ok=True)
            path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({algo: case["met"] for algo, case in report.items()}))


if __name__ == "__main__":
    main()
