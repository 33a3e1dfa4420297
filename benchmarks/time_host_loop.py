"""Where the host loop's time goes: PPO on CartPole-v1 with compare_sb3.py's settings (100k steps),
timing each explore call, each update and each vector-environment step by wrapping them.

Run twice in a row so the second run loads its programs from the compilation cache:
``.venv/bin/python benchmarks/time_host_loop.py; .venv/bin/python benchmarks/time_host_loop.py``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gymnasium
import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_sb3

from kitae.loops import collect, host

seconds = {"explore": 0.0, "update": 0.0, "env step": 0.0}
calls = {"explore": 0}


def _timed(name: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        if name == "explore":  # wait for the actions, as the loop does
            out = (np.asarray(out[0]), *out[1:])
            calls["explore"] += 1
        else:
            jax.block_until_ready(out)
        seconds[name] += time.perf_counter() - start
        return out

    return wrapper


def _timed_steps(agent):  # the host loop's two compiled calls, each timed
    steps = collect.compiled_steps(agent)
    return collect.CompiledSteps(act=_timed("explore", steps.act), update=_timed("update", steps.update))


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    host.compiled_steps = _timed_steps
    gymnasium.vector.SyncVectorEnv.step = _timed("env step", gymnasium.vector.SyncVectorEnv.step)

    result = compare_sb3._kitae("ppo-cartpole", 0)
    other = result["wall_seconds"] - sum(seconds.values())
    print(
        f"wall {result['wall_seconds']:.2f} s ({result['sps']:,.0f} steps/s, "
        f"compile {result['compile_seconds']:.2f} s), "
        + ", ".join(f"{k} {v:.2f} s" for k, v in seconds.items())
        + f", explore {seconds['explore'] / calls['explore'] * 1e6:.0f} us per call, the rest {other:.2f} s"
    )


if __name__ == "__main__":
    main()
