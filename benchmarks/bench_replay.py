"""Benchmarks of issue 15 (replay): learning with prioritized replay, n-step returns and hindsight
relabelling, and the speed of the prioritized update.

Cases (whole ``kitae train`` processes, host loop, seeds 0, 1, 2 one after the other):

- ``per``: DQN on CartPole-v1 with the preset (rl-zoo's tuned settings, 100k steps), plain
  (uniform one-step replay: ``--set replay.n_step=1``, since the preset itself now uses 3-step
  returns) and with ``--set replay.prioritized=true --set replay.n_step=3`` (every other setting
  the same).
  Met when the median over the seeds of the first step at which the running mean of 10 episodes
  reaches 475 (a seed that never does counts as the budget) is smaller with PER + 3-step.
- ``her``: DQN on 15-bit flipping (``BitFlipping-v0``, its preset: HER ``future``, 150k steps),
  and the same with ``--set replay.her=null``. The success rate is the fraction of the last 100
  training episodes that reached their goal (a return above -15: each step costs -1 until the
  goal). Met when with HER it reaches 0.9 within the budget on every seed and without HER it
  never reaches 0.1.
- ``sac``: SAC on Pendulum-v1 with the preset (20k steps) and ``--set replay.n_step=3``: met when
  the running mean of 10 episodes reaches -200 within the budget on every seed.
- ``speed``: one compiled DQN update (``agent.update_with_replay``, jitted, 64 gradient steps of
  batch 256, the CartPole preset's network) on a full buffer of 100k transitions, uniform against
  prioritized (+ 3-step) replay, alternating, in one process: median seconds per gradient step
  over ``--repeats`` calls, and the compile seconds of each. Met when prioritized <= 1.5x uniform.

Run::

    .venv/bin/python benchmarks/bench_replay.py per|her|sac|speed [--seeds 0 1 2] [--repeats 15]

Results: ``benchmarks/results/replay.json`` (merged case by case).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, kitae_train, seed_figures

from kitae.runs.provenance import made_with

PER = ("--set", "replay.prioritized=true", "--set", "replay.n_step=3")
PLAIN = ("--set", "replay.n_step=1")  # the CartPole preset's replay is 3-step since issue 10's re-run


def _learning_runs(algo: str, env_id: str, seeds: list[int], extra: tuple[str, ...], tmp: Path, threshold: float):
    runs = []
    for seed in seeds:
        run_dir = tmp / f"{algo}-{env_id}-{seed}-{abs(hash(extra))}"
        summary = kitae_train([algo, env_id, "--seed", str(seed), *extra], run_dir)
        runs.append({**seed_figures(seed, summary, run_dir, threshold), "run_dir": run_dir})
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "run_dir"}), flush=True)
    return runs


def _median_first(runs: list[dict]) -> float:
    return statistics.median(
        r["steps"] if r["first_step_at_target"] is None else r["first_step_at_target"] for r in runs
    )


def _strip(runs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "run_dir"} for r in runs]


def case_per(seeds: list[int], tmp: Path) -> dict:
    plain = _learning_runs("dqn", "CartPole-v1", seeds, PLAIN, tmp, 475.0)
    prioritized = _learning_runs("dqn", "CartPole-v1", seeds, PER, tmp, 475.0)
    a, b = _median_first(plain), _median_first(prioritized)
    return {
        "commands": [
            "kitae train dqn CartPole-v1 --seed S " + " ".join(PLAIN),
            "kitae train dqn CartPole-v1 --seed S " + " ".join(PER),
        ],
        "plain": _strip(plain),
        "prioritized_3_step": _strip(prioritized),
        "median_first_step_at_475": {"plain": a, "prioritized_3_step": b},
        "met": b < a,
    }


def _success(run_dir: Path, seed: int, n_bits: int, window: int = 100) -> tuple[int | None, float, float]:
    """``(first step the success rate of the last `window` episodes reaches 0.9, its maximum, its
    final value)`` from a host run's ``metrics.jsonl`` (one row per episode)."""
    outcomes: list[tuple[int, bool]] = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("seed", seed) == seed and "episodic_return" in row:
            outcomes.extend([(row["step"], row["episodic_return"] > -n_bits)] * int(row.get("episodes", 1)))
    first, best, rate = None, 0.0, 0.0
    for i in range(window, len(outcomes) + 1):
        rate = statistics.fmean(ok for _, ok in outcomes[i - window : i])
        best = max(best, rate)
        if first is None and rate >= 0.9:
            first = outcomes[i - 1][0]
    return first, best, rate


def case_her(seeds: list[int], tmp: Path) -> dict:
    report: dict = {"commands": ["kitae train dqn BitFlipping-v0 --seed S", "... --set replay.her=null"]}
    for name, extra in (("her", ()), ("no_her", ("--set", "replay.her=null"))):
        runs = []
        for run in _learning_runs("dqn", "BitFlipping-v0", seeds, extra, tmp, -15.0):
            first, best, final = _success(run["run_dir"], run["seed"], 15)
            runs.append(
                {
                    "seed": run["seed"],
                    "first_step_success_0.9": first,
                    "max_success_rate": best,
                    "final_success_rate": final,
                    "train_seconds": run["train_seconds"],
                }
            )
            print(json.dumps({"case": name, **runs[-1]}), flush=True)
        report[name] = runs
    report["met"] = all(r["first_step_success_0.9"] is not None for r in report["her"]) and all(
        r["max_success_rate"] < 0.1 for r in report["no_her"]
    )
    return report


def case_sac(seeds: list[int], tmp: Path) -> dict:
    extra = ("--set", "replay.n_step=3")
    runs = _learning_runs("sac", "Pendulum-v1", seeds, extra, tmp, -200.0)
    return {
        "command": "kitae train sac Pendulum-v1 --seed S --set replay.n_step=3",
        "runs": _strip(runs),
        "met": all(r["first_step_at_target"] is not None for r in runs),
    }


def case_speed(repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from kitae.buffer import Experience, buffer_init
    from kitae.replay.sum_tree import sum_tree_set
    from kitae.runs import preset_agent

    capacity, batch, steps = 100_000, 256, 64
    sets = [f"update_cfg.batch_size={batch}", f"update_cfg.n_epochs={steps}", f"update_cfg.max_buffer_size={capacity}"]
    rng = np.random.default_rng(0)
    rows = Experience(
        observation=rng.normal(size=(capacity, 1, 4)).astype(np.float32),
        action=rng.integers(0, 2, size=(capacity, 1)).astype(np.int32),
        reward=np.ones((capacity, 1), np.float32),
        done=rng.random((capacity, 1)) < 0.02,
        next_observation=rng.normal(size=(capacity, 1, 4)).astype(np.float32),
        log_prob=np.zeros((capacity, 1), np.float32),
        truncated=np.zeros((capacity, 1), bool),
    )
    setups = {}
    for name, extra in (
        ("uniform", ["replay.n_step=1"]),
        ("prioritized", ["replay.prioritized=true", "replay.n_step=1"]),
        ("prioritized_3_step", ["replay.prioritized=true", "replay.n_step=3"]),
    ):
        agent, env = preset_agent("dqn", "CartPole-v1", run_dir=tempfile.mkdtemp(), sets=sets + extra)
        env.close()
        state = buffer_init(jax.tree_util.tree_map(lambda x: x[0], rows), capacity, agent.config.replay.prioritized)
        state = state._replace(
            data=jax.tree_util.tree_map(jnp.asarray, rows),
            position=jnp.asarray(0, jnp.int32),
            size=jnp.asarray(capacity, jnp.int32),
        )
        if state.priorities is not None:  # priorities as a run leaves them: spread, all positive
            values = jnp.asarray(rng.uniform(0.1, 2.0, capacity), jnp.float32)
            tree = sum_tree_set(state.priorities.tree, jnp.arange(capacity), values)
            state = state._replace(priorities=state.priorities._replace(tree=tree, max_priority=jnp.max(values)))
        update = jax.jit(agent.update_with_replay)
        t0 = time.perf_counter()
        jax.block_until_ready(update(agent.state, jax.random.PRNGKey(0), state))
        setups[name] = (update, agent.state, state, time.perf_counter() - t0)
    times: dict[str, list[float]] = {name: [] for name in setups}
    for i in range(repeats):
        for name, (update, agent_state, buffer_state, _) in setups.items():  # alternating
            t0 = time.perf_counter()
            jax.block_until_ready(update(agent_state, jax.random.PRNGKey(i + 1), buffer_state))
            times[name].append((time.perf_counter() - t0) / steps)
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {
        "command": f"bench_replay.py speed --repeats {repeats}",
        "setting": f"DQN CartPole preset network, batch {batch}, capacity {capacity}, {steps} gradient steps per call",
        "median_ms_per_gradient_step": {k: v * 1e3 for k, v in medians.items()},
        "min_max_ms": {k: [min(t) * 1e3, max(t) * 1e3] for k, t in times.items()},
        "compile_seconds": {name: s[3] for name, s in setups.items()},
        "ratio_prioritized_over_uniform": medians["prioritized"] / medians["uniform"],
        "ratio_prioritized_3_step_over_uniform": medians["prioritized_3_step"] / medians["uniform"],
        "met": medians["prioritized"] / medians["uniform"] <= 1.5,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("case", choices=["per", "her", "sac", "speed"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    path = RESULTS / "replay.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.case == "per":
            result = case_per(args.seeds, tmp)
        elif args.case == "her":
            result = case_her(args.seeds, tmp)
        elif args.case == "sac":
            result = case_sac(args.seeds, tmp)
        else:
            result = case_speed(args.repeats)
    result["made_with"] = made_with()
    result["date"] = time.strftime("%Y-%m-%d")
    report[args.case] = result
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
