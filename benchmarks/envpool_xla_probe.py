"""Does EnvPool's XLA interface run reliably here? (The investigation behind docs/envpool.md.)

Each trial is a fresh Python process that makes an EnvPool CartPole-v1 pool (8 environments),
resets it (``reset``; ``async_reset`` then ``recv``; or ``async_reset`` with its states never
received, ``async_reset_unreceived``), takes ``env.xla()``'s ``(handle, recv, send, step)`` and
runs ``--steps`` environment steps with random actions inside one ``jax.jit``-compiled
``jax.lax.scan`` (the way a compiled training loop would call it), then reports the total reward.
A trial that does not finish within ``--timeout`` seconds is counted as a hang and killed.

Run::

    .venv/bin/python benchmarks/envpool_xla_probe.py --trials 20            # reset, then async_reset
    .venv/bin/python benchmarks/envpool_xla_probe.py --trials 10 --modes async_reset_unreceived \
        --out envpool_xla_unreceived.json

Results: ``benchmarks/results/envpool_xla.json`` (per mode: finished, hung, failed, the errors,
the seconds each trial took).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from common import RESULTS

from kitae.runs.provenance import made_with

CHILD = r"""
import sys, time
import numpy as np
import jax, jax.numpy as jnp
import envpool

mode, steps = sys.argv[1], int(sys.argv[2])
env = envpool.make_gymnasium("CartPole-v1", num_envs=8, seed=0)
if mode == "reset":
    env.reset()
else:
    env.async_reset()
handle, recv, send, step = env.xla()
if mode == "async_reset":
    handle, _ = recv(handle)  # collect the reset's states before the first send
# "async_reset_unreceived": the reset's states are never received, so every recv in the loop returns
# the states of the step before (and the pool ends one batch ahead)

def body(carry, key):
    handle, total = carry
    action = jax.random.randint(key, (8,), 0, 2, dtype=jnp.int32)
    handle, (obs, reward, terminated, truncated, info) = step(handle, action)
    return (handle, total + reward.sum()), None

@jax.jit
def run(handle, key):
    keys = jax.random.split(key, steps)
    (handle, total), _ = jax.lax.scan(body, (handle, jnp.float32(0.0)), keys)
    return handle, total

start = time.perf_counter()
handle, total = run(handle, jax.random.PRNGKey(0))
total = float(jax.block_until_ready(total))
print(f"OK total_reward={total} seconds={time.perf_counter() - start:.3f}", flush=True)
"""


def trial(mode: str, steps: int, timeout: float) -> dict:
    start = time.perf_counter()
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHILD, mode, str(steps)], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"outcome": "hung", "seconds": time.perf_counter() - start}
    seconds = time.perf_counter() - start
    if out.returncode == 0 and "OK" in out.stdout:
        return {"outcome": "finished", "seconds": seconds, "stdout": out.stdout.strip().splitlines()[-1]}
    tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
    return {"outcome": "failed", "seconds": seconds, "returncode": out.returncode, "error": " | ".join(tail)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--out", default="envpool_xla.json")
    parser.add_argument(
        "--modes",
        nargs="+",
        default=["reset", "async_reset"],
        choices=["reset", "async_reset", "async_reset_unreceived"],
    )
    args = parser.parse_args()
    import envpool
    import jax

    result = {
        "name": "envpool_xla",
        "envpool": envpool.__version__,
        "jax": jax.__version__,
        "made_with": made_with(),
        "trials": args.trials,
        "steps": args.steps,
        "timeout_seconds": args.timeout,
        "modes": {},
        "command": f"python benchmarks/envpool_xla_probe.py --trials {args.trials} --steps {args.steps} "
        f"--modes {' '.join(args.modes)} --out {args.out}",
    }
    for mode in args.modes:
        runs = []
        for i in range(args.trials):
            runs.append(trial(mode, args.steps, args.timeout))
            print(
                f"{mode} trial {i}: {runs[-1]['outcome']} ({runs[-1]['seconds']:.1f} s) {runs[-1].get('error', '')}",
                flush=True,
            )
            if runs[-1]["outcome"] == "failed" and i >= 1 and all(r["outcome"] == "failed" for r in runs):
                break  # it fails deterministically: two failures are enough to say so
        counts = {k: sum(r["outcome"] == k for r in runs) for k in ("finished", "hung", "failed")}
        result["modes"][mode] = {**counts, "runs": runs}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / args.out).write_text(json.dumps(result, indent=2))
    print(json.dumps({m: {k: v for k, v in r.items() if k != "runs"} for m, r in result["modes"].items()}))


if __name__ == "__main__":
    main()
