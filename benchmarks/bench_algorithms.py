"""Learning benchmarks of the algorithms of issue 14, from the command line (whole processes).

For each algorithm: ``kitae train ALGO ENV --seed S`` with the preset ``kitae train`` uses, three
seeds one after the other in the host loop (Gymnasium), and one seed in the compiled loop on the
gymnax counterpart (recorded). The issue's words decide ``met``: the running mean of the last 10
training episodes "reaches" the target within the budget (the preset's ``n_env_steps``); the
final returns (that mean at the end) are reported beside it.

| algo | host env | compiled env | target | budget |
| --- | --- | --- | --- | --- |
| a2c | CartPole-v1 | gymnax:CartPole-v1 | >= 475 | 500k |
| ddpg | Pendulum-v1 | gymnax:Pendulum-v1 | >= -200 | 20k |
| mpo | Pendulum-v1 | gymnax:Pendulum-v1 | >= -200 | 50k |
| sac (discrete) | CartPole-v1 | gymnax:CartPole-v1 | >= 450 | 200k |
| rnd_ppo | MountainCar-v0 | gymnax:MountainCar-v0 | >= -160 | 1M |

RND-PPO also has to reach the goal sooner than PPO with the same settings and no intrinsic reward:
``kitae train ppo MountainCar-v0 --config FILE --seed S``, FILE the RND-PPO preset for the id
without the fields PPO does not have (``ppo_settings_of``: intrinsic reward, its value head and
the RND networks go; every setting PPO has is the same). The figure: the median over the seeds of
the first step at which an episode returns more than -200 (``common.first_step_above``), a seed
that never does counting as the budget.

Run::

    .venv/bin/python benchmarks/bench_algorithms.py ALGO [--only host|compiled] [--seeds 0 1 2]

Results: ``benchmarks/results/ALGO.json`` (merged case by case).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml
from common import RESULTS, first_step_above, kitae_train, seed_figures

from kitae.algos.collections.ppo import PPOParams
from kitae.envs.make import EnvSpec
from kitae.runs.presets import load_preset
from kitae.runs.provenance import made_with

CASES = {
    "a2c": ("CartPole-v1", "gymnax:CartPole-v1", 475.0),
    "ddpg": ("Pendulum-v1", "gymnax:Pendulum-v1", -200.0),
    "mpo": ("Pendulum-v1", "gymnax:Pendulum-v1", -200.0),
    "sac": ("CartPole-v1", "gymnax:CartPole-v1", 450.0),  # a Discrete space: discrete SAC
    "rnd_ppo": ("MountainCar-v0", "gymnax:MountainCar-v0", -160.0),
}
GOALS = {"rnd_ppo": -200.0}
"""Algorithms compared with PPO on the same settings: the first step an episode returns more than this."""


def ppo_settings_of(algo: str, env_id: str, path: Path) -> Path:
    """Writes ``algo``'s preset for ``env_id`` without the ``algo_params`` PPO does not have, as a
    ``--config`` file for ``kitae train ppo``: the same settings, without what the algorithm adds."""
    preset = load_preset(algo, EnvSpec.parse(env_id))
    ppo_fields = set(PPOParams.__dataclass_fields__)
    preset["algo_params"] = {k: v for k, v in preset.get("algo_params", {}).items() if k in ppo_fields}
    path.write_text(yaml.safe_dump(preset, sort_keys=False))
    return path


def run_case(
    algo: str,
    env_id: str,
    seeds: list[int],
    threshold: float,
    tmp: Path,
    extra: tuple[str, ...] = (),
    goal: float | None = None,
) -> dict:
    """``kitae train algo env_id --seed S *extra`` for each seed: the figures of each run (with
    ``goal``: also the first step an episode returns more than it)."""
    runs = []
    for seed in seeds:
        run_dir = tmp / f"{algo}-{env_id.replace(':', '_')}-{seed}-{len(extra)}"
        summary = kitae_train([algo, env_id, "--seed", str(seed), *extra], run_dir)
        runs.append(seed_figures(seed, summary, run_dir, threshold))
        if goal is not None:
            runs[-1]["first_step_above_goal"] = first_step_above(run_dir, seed, goal)
        print(json.dumps({"algo": algo, "env": env_id, **runs[-1]}), flush=True)
    return {
        "command": " ".join(["kitae train", algo, env_id, "--seed S", *extra]),
        "target": f"reaches >= {threshold:g} (running mean of 10 episodes) within the preset's steps",
        "runs": runs,
        "met": all(r["first_step_at_target"] is not None for r in runs),
    }


def median_first_goal(case: dict) -> float:
    """The median over the seeds of the first step above the goal (the budget where never)."""
    return statistics.median(
        r["steps"] if r["first_step_above_goal"] is None else r["first_step_above_goal"] for r in case["runs"]
    )


def compare_with_ppo(algo: str, env_id: str, seeds: list[int], threshold: float, tmp: Path, case: dict) -> dict:
    """PPO with the same settings (``ppo_settings_of``) on the same seeds; ``case`` (the
    algorithm's) gets ``median_first_step_above_goal`` and the comparison decides its ``met``."""
    settings = ppo_settings_of(algo, env_id, tmp / f"ppo-settings-of-{algo}.yaml")
    ppo = run_case("ppo", env_id, seeds, threshold, tmp, ("--config", str(settings)), GOALS[algo])
    ppo["settings"] = yaml.safe_load(settings.read_text())
    ppo["command"] = ppo["command"].replace(str(settings), f"<{algo} preset without its own fields>")
    ppo["median_first_step_above_goal"] = median_first_goal(ppo)
    case["median_first_step_above_goal"] = median_first_goal(case)
    case["goal_sooner_than_ppo"] = case["median_first_step_above_goal"] < ppo["median_first_step_above_goal"]
    case["met"] = case["met"] and case["goal_sooner_than_ppo"]
    return ppo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("algo", choices=sorted(CASES))
    parser.add_argument("--only", choices=["host", "compiled"], action="append")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    host_env, compiled_env, threshold = CASES[args.algo]
    path = RESULTS / f"{args.algo}.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    with tempfile.TemporaryDirectory() as tmp_name:
        for case in args.only or ["host", "compiled"]:
            env_id, seeds = (host_env, args.seeds) if case == "host" else (compiled_env, [0])
            report[case] = run_case(args.algo, env_id, seeds, threshold, Path(tmp_name), goal=GOALS.get(args.algo))
            if case == "host" and args.algo in GOALS:
                report["host_ppo_same_settings"] = compare_with_ppo(
                    args.algo, env_id, seeds, threshold, Path(tmp_name), report[case]
                )
            report[case]["made_with"] = made_with()
            RESULTS.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
