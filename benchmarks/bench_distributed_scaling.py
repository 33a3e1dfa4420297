"""Distributed collection scaling: 1, 2 and 4 collection workers on an environment whose step
costs a fixed 2 ms of waiting (a stand-in for an expensive simulator).

``SlowCartPole-v1`` is Gymnasium's CartPole-v1 whose ``step`` first sleeps 2 ms (shipped here).
Each collection worker steps 8 copies (so a vector step waits 16 ms) with PPO's default preset;
with W workers the run has 8 W environments. Collection throughput is the run's collected
transitions over the time the updater spent collecting (``RunResult.metrics["collect_seconds"]``:
waiting for the workers' batches and adding them to the buffers), updates excluded; start-up (Ray
runtime, actors, first state) and the first iteration (its compiles) are reported apart.
Targets: 2 and 4 workers at least 1.8x and 3.2x the throughput of one.

Run::

    .venv/bin/python benchmarks/bench_distributed_scaling.py [--iterations 12] [--repeats 3]

Results: ``benchmarks/results/distributed_scaling.json``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Ray's workers inherit the environment of the runtime this process starts: they import this module
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)

import gymnasium as gym  # noqa: E402
from common import RESULTS  # noqa: E402

from kitae.runs.provenance import made_with  # noqa: E402

STEP_SECONDS = 0.002


class SlowStep(gym.Wrapper):
    """Waits ``STEP_SECONDS`` before every step (a simulator whose step costs 2 ms)."""

    def step(self, action):  # type: ignore[no-untyped-def]
        time.sleep(STEP_SECONDS)
        return self.env.step(action)


def make_slow_cartpole(**kwargs):  # type: ignore[no-untyped-def]
    return SlowStep(gym.make("CartPole-v1", **kwargs))


def register() -> None:
    if "SlowCartPole-v1" not in gym.registry:
        gym.register("SlowCartPole-v1", entry_point=make_slow_cartpole, max_episode_steps=500)


def make_agent(agent_cls, run_name, config):  # type: ignore[no-untyped-def]
    """The workers' agent recipe: registers the slow environment in the worker's process first."""
    register()
    return agent_cls(run_name, config)


def one_run(workers: int, iterations: int, run_dir: Path) -> dict:
    from kitae.config import DistributedConfig
    from kitae.distributed.executor import DistributedExecutor
    from kitae.runs import preset_agent

    register()
    agent, env = preset_agent("ppo", "SlowCartPole-v1", n_envs=8 * workers, run_dir=run_dir)
    env.close()
    per_iteration = agent.schedule.steps_per_iteration
    steps = iterations * per_iteration

    def recipe(agent):  # type: ignore[no-untyped-def]
        return functools.partial(make_agent, type(agent), agent.run_name, agent.config)

    executor = DistributedExecutor(DistributedConfig(workers=workers), agent_factory=recipe)
    begin = time.perf_counter()
    result = executor.run(agent, "SlowCartPole-v1", steps)
    wall = time.perf_counter() - begin
    collected = result.env_steps - per_iteration  # the first iteration is with the compiles
    collect_seconds = result.metrics["collect_seconds"] - result.metrics["first_collect_seconds"]
    return {
        "workers": workers,
        "steps": result.env_steps,
        "collect_sps": collected / collect_seconds,
        "startup_seconds": result.metrics["startup_seconds"],
        "first_iteration_seconds": result.compile_seconds - result.metrics["startup_seconds"],
        "train_seconds": result.train_seconds,
        "wall_seconds": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import tempfile

    from kitae.distributed.runtime import ray_runtime

    rows: list[dict] = []
    begin = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, ray_runtime():
        runtime_start_seconds = time.perf_counter() - begin
        for repeat in range(args.repeats):
            for workers in (1, 2, 4):  # alternating, so load changes fall on every layout alike
                row = one_run(workers, args.iterations, Path(tmp) / f"w{workers}-r{repeat}")
                row["repeat"] = repeat
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary = {}
    for workers in (1, 2, 4):
        mine = [r for r in rows if r["workers"] == workers]
        summary[workers] = {
            "collect_sps_median": statistics.median(r["collect_sps"] for r in mine),
            "startup_seconds_median": statistics.median(r["startup_seconds"] for r in mine),
            "first_iteration_seconds_median": statistics.median(r["first_iteration_seconds"] for r in mine),
        }
    ratios = {}
    for workers in (2, 4):  # per repeat, measured in the same round
        per_round = [
            next(r for r in rows if r["workers"] == workers and r["repeat"] == k)["collect_sps"]
            / next(r for r in rows if r["workers"] == 1 and r["repeat"] == k)["collect_sps"]
            for k in range(args.repeats)
        ]
        ratios[workers] = statistics.median(per_round)
    report = {
        "step_seconds": STEP_SECONDS,
        "runtime_start_seconds": runtime_start_seconds,
        "rows": rows,
        "summary": summary,
        "ratio_vs_one_worker_median": ratios,
        "targets": {"2": 1.8, "4": 3.2},
        "met": {"2": ratios[2] >= 1.8, "4": ratios[4] >= 3.2},
        "made_with": made_with(),
        "command": "python benchmarks/bench_distributed_scaling.py " + " ".join(sys.argv[1:]),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "distributed_scaling.json").write_text(json.dumps(report, indent=2))
    print(
        json.dumps(
            {
                "runtime_start_seconds": runtime_start_seconds,
                "summary": summary,
                "ratios": ratios,
                "met": report["met"],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
