"""Distributed learning: the issue-11 targets, each trained from the command line (``kitae train
... --workers N``, the road users take) for three seeds, one run after the other.

Cases (``--only NAME`` runs one):

- ``ppo_sync``: PPO on CartPole-v1, 2 collection workers, synchronous: >= 475 within 500k steps;
- ``ppo_async``: the same with ``--async`` (asynchronous collection and gradients): >= 475 within
  500k, with the policy lag it ran at (``summary.json``'s ``distributed`` section);
- ``sac_async``: SAC on Pendulum-v1, 2 collection workers, asynchronous collection: >= -200 within
  30k steps;
- ``ppo_gymnax``: PPO on ``gymnax:CartPole-v1``, 2 workers each collecting with the compiled
  rollout: >= 475 within 500k.

The return is ``summary.json``'s ``final_return`` (the mean of the last 10 training episodes).
Each run starts its own Ray runtime (as ``kitae train`` does); its start-up is in ``compile_seconds``.

Run::

    .venv/bin/python benchmarks/bench_distributed_learning.py [--only ppo_sync] [--seeds 0 1 2]

Results: ``benchmarks/results/distributed_learning.json`` (merged case by case).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS

from kitae.runs.provenance import made_with

ROOT = Path(__file__).resolve().parents[1]

CASES: dict[str, dict] = {
    "ppo_sync": {"argv": ["ppo", "CartPole-v1", "--workers", "2", "--steps", "500000"], "target": 475.0},
    "ppo_async": {"argv": ["ppo", "CartPole-v1", "--workers", "2", "--async", "--steps", "500000"], "target": 475.0},
    "sac_async": {
        "argv": ["sac", "Pendulum-v1", "--workers", "2", "--set", "distributed.async_collection=true"]
        + ["--steps", "30000"],
        "target": -200.0,
    },
    "ppo_gymnax": {"argv": ["ppo", "gymnax:CartPole-v1", "--workers", "2", "--steps", "500000"], "target": 475.0},
}


def run_case(name: str, seeds: list[int], tmp: Path) -> dict:
    case = CASES[name]
    runs = []
    for seed in seeds:
        run_dir = tmp / f"{name}-{seed}"
        argv = [sys.executable, "-m", "kitae.cli", "train", *case["argv"], "--seed", str(seed)]
        argv += ["--run-dir", str(run_dir), "--quiet"]
        begin = time.perf_counter()
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{name} seed {seed} failed ({done.returncode}): {done.stderr[-2000:]}")
        summary = json.loads((run_dir / "summary.json").read_text())
        row = {
            "seed": seed,
            "final_return": summary["final_return"],
            "steps": summary["steps"],
            "wall_seconds": time.perf_counter() - begin,
            "compile_seconds": summary["compile_seconds"],
            "train_seconds": summary["train_seconds"],
            "sps": summary["sps"],
            "distributed": summary.get("distributed", {}),
        }
        runs.append(row)
        print(json.dumps({"case": name, **row}), flush=True)
    finals = [r["final_return"] for r in runs]
    return {
        "command": "kitae train " + " ".join(CASES[name]["argv"]) + " --seed S",
        "target": case["target"],
        "runs": runs,
        "final_returns": finals,
        "met": all(f >= case["target"] for f in finals),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=sorted(CASES), action="append")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    path = RESULTS / "distributed_learning.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or list(CASES):
            report[name] = run_case(name, args.seeds, Path(tmp))
            report[name]["made_with"] = made_with()
            RESULTS.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=2))
            print(json.dumps({name: {"final_returns": report[name]["final_returns"], "met": report[name]["met"]}}))


if __name__ == "__main__":
    main()
