"""How many XLA:CPU thunks (kernels, loops, library calls) kitae's compiled PPO training program
runs against rejax's, counted from JAX's profiler trace: PPO on gymnax CartPole-v1 with
compare_rejax.py's settings, ``--steps`` environment steps (default 5,120: 10 iterations of 128
vector steps of 4 environments).

Each program is compiled and run once untraced, then run once under ``jax.profiler.trace``
(Python tracing off: kitae's host-side tracing would fill the profiler's million-event buffer).
The trace's thunk events are grouped by how often each ran: a thunk that ran once per vector
step ran ``steps / 4`` times, once per gradient step ``iterations * 16`` times, and so on. The
printout gives, per group, the number of distinct thunks and their traced time.

The traced times are not the programs' speed: each event costs about a microsecond to record, so
a run with tracing took about seven times as long as without. The counts are exact.

Run: ``.venv/bin/python benchmarks/probe_thunks.py [--steps 5120]`` (rejax is in the ``compare``
extra).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
import tempfile
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parent))

# the host side of a call (dispatch, argument handling), not thunks of the program
_NOT_THUNKS = ("$", "end:", "Pjit", "Common", "Thunk", "lower", "trace_to", "Execute", "shard_args", "DevicePut",
               "Handle", "Alloc", "Parse", "Python", "Wait", "copy_to", "Buffer")  # fmt: skip


def thunk_counts(trace_dir: str) -> tuple[collections.Counter, collections.Counter]:
    """``(runs, traced microseconds)`` per thunk name in the trace written under ``trace_dir``."""
    path = next(Path(trace_dir).glob("plugins/profile/*/perfetto_trace.json.gz"))
    with gzip.open(path) as file:
        data = json.load(file)
    events = data["traceEvents"] if isinstance(data, dict) else data
    runs: collections.Counter = collections.Counter()
    micros: collections.Counter = collections.Counter()
    for event in events:
        if event.get("ph") == "X" and not event["name"].startswith(_NOT_THUNKS):
            runs[event["name"]] += 1
            micros[event["name"]] += event.get("dur", 0)
    if len(events) >= 1_000_000:
        raise RuntimeError(f"the trace holds {len(events):,} events, the profiler's limit: use fewer --steps")
    return runs, micros


def traced(label: str, call) -> tuple[collections.Counter, collections.Counter]:
    options = jax.profiler.ProfileOptions()
    options.host_tracer_level = 3
    options.python_tracer_level = 0
    trace_dir = tempfile.mkdtemp(prefix=f"probe-thunks-{label}-")
    start = time.perf_counter()
    with jax.profiler.trace(trace_dir, create_perfetto_trace=True, profiler_options=options):
        call()
    print(f"{label}: traced call and trace written in {time.perf_counter() - start:.1f} s", flush=True)
    return thunk_counts(trace_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5120)
    args = parser.parse_args()

    import compare_rejax
    import gymnax
    from compare_rejax import FiveValueStep, rejax_ppo

    from kitae.loops.compiled import CompiledExecutor
    from kitae.runs.resolve import RunSpec, resolve_train

    compare_rejax.STEPS = args.steps
    env, params = gymnax.make("CartPole-v1")
    rejax_train = jax.jit(rejax_ppo(FiveValueStep(env), params).train).lower(jax.random.PRNGKey(0)).compile()
    jax.block_until_ready(rejax_train(jax.random.PRNGKey(0)))
    run, kitae_env = resolve_train(RunSpec(algo="ppo", env_id="gymnax:CartPole-v1"))
    agent = run.agent_cls(run.algo, run.config, run_dir=tempfile.mkdtemp())
    CompiledExecutor().run(agent, kitae_env, args.steps)  # compiled (and cached) before the trace
    counts = {
        "rejax": traced("rejax", lambda: jax.block_until_ready(rejax_train(jax.random.PRNGKey(1)))),
        "kitae": traced("kitae", lambda: CompiledExecutor().run(agent, kitae_env, args.steps)),
    }
    vector_steps = args.steps // 4
    iterations = vector_steps // 128
    groups = {
        "per vector step": vector_steps,
        "per vector step, 5 rounds (threefry)": vector_steps * 5,
        "per gradient step": iterations * 16,
        "per epoch": iterations * 4,
        "per iteration": iterations,
    }
    for name, (runs, micros) in counts.items():
        print(f"== {name}")
        for group, times in groups.items():
            # a thunk of the step can also run once or twice outside the loop (the first reset)
            thunks = [t for t, n in runs.items() if times <= n <= times + 2]
            traced_ms = sum(micros[t] for t in thunks) / 1000
            print(f"  {group:38s} ran {times:6d} times: {len(thunks):4d} thunks, traced {traced_ms:8.1f} ms")
        print(f"  all thunk runs {sum(runs.values()):,}, per vector step {sum(runs.values()) / vector_steps:.1f}")


if __name__ == "__main__":
    main()
