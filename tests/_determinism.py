"""A check shared by the determinism tests whose third run of another seed would cost too much:
that the trained run is not the freshly built agent, and that another seed builds another one."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from kitae.runs import preset_agent
from kitae.runs.load import load_agent
from kitae.runs.rundir import state_fingerprint


def assert_trained_and_seeded(run_dir: Path, fingerprint: str, algo: str, env_id: str, steps: int, sets: list[str]):
    """The run in ``run_dir`` (trained from seed 0 with ``kitae train ALGO ENV_ID --steps STEPS``
    and ``--set`` each of ``sets``): its checkpoint is the state ``fingerprint`` (its summary's)
    is of; that state has the layout of the agent ``preset_agent`` builds for the same run, but
    other values (training happened); and seeds 0 and 1 build different agents (the seed is read)."""
    trained = load_agent(run_dir).state
    assert state_fingerprint(trained) == fingerprint
    fresh = []
    for seed in (0, 1):
        agent, env = preset_agent(
            algo, env_id, steps=steps, seed=seed, run_dir=run_dir.parent / f"fresh{seed}", sets=sets
        )
        env.close()
        fresh.append(agent.state)
    layout = [(np.shape(x), np.asarray(x).dtype) for x in jax.tree_util.tree_leaves(trained)]
    assert [(np.shape(x), np.asarray(x).dtype) for x in jax.tree_util.tree_leaves(fresh[0])] == layout
    assert state_fingerprint(fresh[0]) != fingerprint  # trained
    assert state_fingerprint(fresh[0]) != state_fingerprint(fresh[1])  # the seed matters
