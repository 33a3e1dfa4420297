"""Shared pieces of the distributed tests: one Ray runtime per test module, agents, a recorder."""

from __future__ import annotations

import pytest

from kitae.distributed.runtime import ray_runtime
from kitae.loops.callbacks import Callback
from kitae.runs import preset_agent
from kitae.runs.rundir import state_fingerprint


@pytest.fixture(scope="module")
def ray_shared():
    with ray_runtime(num_cpus=2) as ray:
        yield ray


def agents(algo, steps, tmp_path, sets=()):
    """Two agents made alike (the second's environments closed) and the first's environments."""
    agent, env = preset_agent(algo, "CartPole-v1", steps=steps, run_dir=tmp_path / "a", sets=list(sets))
    twin, twin_env = preset_agent(algo, "CartPole-v1", steps=steps, run_dir=tmp_path / "b", sets=list(sets))
    twin_env.close()
    return agent, env, twin


def fingerprint(result):
    return state_fingerprint(result.state.agent_state)


class Scalars(Callback):
    """Records ``on_scalars``."""

    def __init__(self):
        self.rows = []

    def on_scalars(self, step, scalars):
        self.rows.append((step, scalars))
