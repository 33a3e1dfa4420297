"""Compiled-loop benchmarks: PPO on gymnax CartPole-v1, cold and warm compilation cache, and 16
seeds in one call against 16 one-seed runs.

Settings: the ``ppo`` preset for ``gymnax:CartPole-v1`` (4 environments x 128 steps, 4 epochs of
4 minibatches, lr 2.5e-4 annealed), 500k environment steps per seed.

Each measurement runs in a fresh subprocess (so "cold" really has an empty in-memory and on-disk
cache, and peak memory is the run's own); ``--repeats`` rounds, medians reported.

``--cli`` runs, instead, the same comparison as a user makes it from the command line: one
``kitae train ppo gymnax:CartPole-v1 --seeds 16`` against 16 ``kitae train ... --seed i``
commands, each a new process (imports, agent set-up, compile from the warm cache, training, run
directory), wall time of the commands.

Run: ``.venv/bin/python benchmarks/bench_compiled.py [--repeats 3] [--steps 500000] [--cli]``
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import RESULTS


def _agent(seed: int = 0):
    from kitae.runs import preset_agent

    return preset_agent("ppo", "gymnax:CartPole-v1", seed=seed, run_dir="/tmp/kitae-bench/compiled")


def worker(mode: str, steps: int, n_seeds: int) -> dict:
    from kitae.loops.compiled import compiled_train

    start = time.perf_counter()
    if mode == "one_call":
        agent, env = _agent()
        result = compiled_train(agent, env, steps, seeds=list(range(n_seeds)))
        compile_s, train_s = result.compile_seconds, result.train_seconds
        finals = [result.final_return(i) for i in range(n_seeds)]
        sps = result.sps
    elif mode == "separate":
        compile_s = train_s = 0.0
        finals = []
        for seed in range(n_seeds):
            agent, env = _agent(seed)
            result = compiled_train(agent, env, steps)
            compile_s += result.compile_seconds
            train_s += result.train_seconds
            finals.append(result.final_return())
        sps = steps * n_seeds / train_s
    else:  # a single run (cold or warm cache, decided by the parent)
        agent, env = _agent()
        result = compiled_train(agent, env, steps)
        compile_s, train_s, finals, sps = (
            result.compile_seconds,
            result.train_seconds,
            [result.final_return()],
            result.sps,
        )
    return {
        "mode": mode,
        "compile_seconds": compile_s,
        "train_seconds": train_s,
        "wall_seconds": time.perf_counter() - start,
        "sps": sps,
        "final_returns": finals,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _run(mode: str, steps: int, n_seeds: int, cache_dir: str) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--worker", mode, "--steps", str(steps), "--n-seeds", str(n_seeds)],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "KITAE_CACHE_DIR": cache_dir},
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][7:])


def _cli_seconds(args: list[str], cache_dir: str) -> float:
    start = time.perf_counter()
    out = subprocess.run(
        [str(Path(sys.executable).with_name("kitae")), "train", "ppo", "gymnax:CartPole-v1", "--quiet", *args],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "KITAE_CACHE_DIR": cache_dir},
    )
    if out.returncode != 0:
        raise SystemExit(f"kitae train {args} failed:\n{out.stderr[-3000:]}")
    return time.perf_counter() - start


def cli_comparison(steps: int, n_seeds: int, cache_dir: str, run_root: str) -> dict:
    """Wall seconds of one ``--seeds n_seeds`` command and of ``n_seeds`` one-seed commands."""
    common = ["--steps", str(steps)]
    _cli_seconds([*common, "--run-dir", f"{run_root}/warmup"], cache_dir)  # fills the cache for one seed
    _cli_seconds([*common, "--seeds", str(n_seeds), "--run-dir", f"{run_root}/warmup-k"], cache_dir)
    one_call = _cli_seconds([*common, "--seeds", str(n_seeds), "--run-dir", f"{run_root}/k"], cache_dir)
    separate = sum(
        _cli_seconds([*common, "--seed", str(i), "--run-dir", f"{run_root}/s{i}"], cache_dir) for i in range(n_seeds)
    )
    return {"one_call_seconds": one_call, "separate_seconds": separate, "ratio": one_call / separate}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=500_000)
    parser.add_argument("--n-seeds", type=int, default=16)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--skip-seeds", action="store_true", help="only the cold / warm single runs")
    parser.add_argument("--cli", action="store_true", help="only the comparison from the command line (see above)")
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, args.steps, args.n_seeds)), flush=True)
        return

    if args.cli:
        cli_rows = []
        for repeat in range(args.repeats):
            with (
                tempfile.TemporaryDirectory(prefix="kitae-cache-") as cache,
                tempfile.TemporaryDirectory(prefix="kitae-runs-") as runs,
            ):
                cli_rows.append(cli_comparison(args.steps, args.n_seeds, cache, runs))
            r = cli_rows[-1]
            print(
                f"round {repeat + 1} cli: one command --seeds {args.n_seeds} {r['one_call_seconds']:.1f} s, "
                f"{args.n_seeds} commands {r['separate_seconds']:.1f} s, ratio {r['ratio']:.2f}",
                flush=True,
            )
        summary = {key: statistics.median(r[key] for r in cli_rows) for key in cli_rows[0]}
        print(
            f"from the command line, 1 command with --seeds {args.n_seeds} / {args.n_seeds} commands: "
            f"{summary['ratio']:.2f} (median)"
        )
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "compiled_cli_seeds.json").write_text(
            json.dumps({"steps": args.steps, "n_seeds": args.n_seeds, "summary": summary, "rows": cli_rows}, indent=2)
        )
        return

    rows: dict[str, list[dict]] = {"cold": [], "warm": [], "one_call": [], "separate": []}
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="kitae-cache-") as cache:
            rows["cold"].append(_run("single", args.steps, 1, cache))
            rows["warm"].append(_run("single", args.steps, 1, cache))
            if not args.skip_seeds:
                rows["one_call"].append(_run("one_call", args.steps, args.n_seeds, cache))
                rows["separate"].append(_run("separate", args.steps, args.n_seeds, cache))
        for name, rs in rows.items():
            if rs:
                r = rs[-1]
                print(
                    f"round {repeat + 1} {name}: compile {r['compile_seconds']:.1f} s, "
                    f"train {r['train_seconds']:.1f} s, "
                    f"{r['sps']:,.0f} steps/s, final {[round(f, 1) for f in r['final_returns']][:4]}..., "
                    f"peak {r['peak_rss_mb']:.0f} MB",
                    flush=True,
                )

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[name])

    summary = {
        name: {
            key: med(name, key) for key in ("compile_seconds", "train_seconds", "wall_seconds", "sps", "peak_rss_mb")
        }
        for name, rs in rows.items()
        if rs
    }
    for name in summary:
        summary[name]["final_returns"] = [r["final_returns"] for r in rows[name]]
    print(f"\nPPO gymnax:CartPole-v1, {args.steps:,} steps per seed, {args.repeats} rounds (medians)")
    print("| run | compile s | train s | steps/s | peak MB |")
    print("| --- | --- | --- | --- | --- |")
    for name, s in summary.items():
        print(
            f"| {name} | {s['compile_seconds']:.1f} | {s['train_seconds']:.1f} | {s['sps']:,.0f} "
            f"| {s['peak_rss_mb']:.0f} |"
        )
    if "one_call" in summary:
        ratios = [a["wall_seconds"] / b["wall_seconds"] for a, b in zip(rows["one_call"], rows["separate"])]
        summary["one_call_over_separate_wall"] = statistics.median(ratios)
        print(
            f"{args.n_seeds} seeds in one call / {args.n_seeds} separate runs, wall time: "
            f"{summary['one_call_over_separate_wall']:.2f} (median of per-round ratios)"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "compiled_ppo_cartpole.json").write_text(
        json.dumps({"steps": args.steps, "summary": summary, "rows": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
