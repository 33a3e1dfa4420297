"""What a cold ``kitae train`` does not spend: an agent's first state computed only when used,
the training program compiled while the starting state is made, one XLA device per CPU core for
seeds trained together, renderers' imports deferred, no interpreter teardown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import numpy as np
import pytest
from _agents import (
    TinyA2C,
    TinyA2CParams,
    make_config,
    tiny_a2c_explore_factory,
    tiny_a2c_process_factory,
    tiny_a2c_state_factory,
    tiny_a2c_update_factory,
)

from kitae.base import OnPolicyAgent
from kitae.compile_options import ONCE_OPTIONS, once_options, one_blas_thread
from kitae.devices import cpu_core_count, use_cpu_cores
from kitae.envs.make import make_jax_env
from kitae.loops.callbacks import Progress
from kitae.loops.program import make_loop_functions
from kitae.runs.callbacks import ImportWhileTraining
from kitae.runs.resolve import RunSpec, resolve_train

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def a2c_config():
    env = make_jax_env("gymnax:CartPole-v1", 4)
    return make_config(env, TinyA2CParams(), max_buffer_size=16, batch_size=32, n_epochs=2)


def _avals(tree) -> list[tuple]:
    return [(tuple(x.shape), np.dtype(x.dtype)) for x in jax.tree_util.tree_leaves(tree)]


def test_first_state_is_computed_on_first_use_with_the_shapes_announced(a2c_config):
    agent = TinyA2C("c", a2c_config, run_dir="unused")
    key_shape, state_shape = agent.first_state_shape()
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree_util.tree_leaves(state_shape))
    assert _avals(agent.state) == _avals(state_shape) and _avals(agent.key) == _avals(key_shape)
    key, state = jax.jit(agent.initial_state)(np.uint32(a2c_config.seed))
    for a, b in zip(jax.tree_util.tree_leaves((agent.key, agent.state)), jax.tree_util.tree_leaves((key, state))):
        np.testing.assert_array_equal(a, b)  # the same bits as the seed's initial state


def test_first_state_of_a_traced_agent_is_values_not_tracers(a2c_config):
    agent = TinyA2C("c", a2c_config, run_dir="unused")
    jax.jit(lambda x: x + jax.tree_util.tree_leaves(agent.state)[-1].sum())(1.0)  # first asked for in a trace
    assert not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(agent.state))
    np.testing.assert_array_equal(agent.key, jax.jit(agent.initial_state)(np.uint32(a2c_config.seed))[0])


def test_a_broken_state_factory_fails_when_the_agent_is_made(a2c_config):
    def broken(key, config, *, preprocess_fn=None, tabulate=False):
        tiny_a2c_state_factory(key, config)
        raise IndexError("the factory's own mistake")

    class BrokenA2C(TinyA2C):
        def __init__(self, run_name, config, **kwargs):
            factories = (broken, tiny_a2c_explore_factory, tiny_a2c_process_factory, tiny_a2c_update_factory)
            OnPolicyAgent.__init__(self, run_name, config, *factories, **kwargs)

    with pytest.raises(IndexError, match="own mistake"):
        BrokenA2C("c", a2c_config, run_dir="unused")


@pytest.mark.parametrize("count", [0, -2, True, 1.5, "2"])
def test_use_cpu_cores_rejects_counts(count):
    with pytest.raises(ValueError, match="count"):
        use_cpu_cores(count)


def test_use_cpu_cores_rejects_a_bad_environment_variable(monkeypatch):
    monkeypatch.setenv("KITAE_CPU_DEVICES", "many")
    with pytest.raises(ValueError, match="KITAE_CPU_DEVICES='many'"):
        use_cpu_cores()
    monkeypatch.setenv("KITAE_CPU_DEVICES", "0")
    with pytest.raises(ValueError, match="KITAE_CPU_DEVICES=0 is not allowed; allowed: an int >= 1"):
        use_cpu_cores()


def test_use_cpu_cores_leaves_a_started_backend_alone():
    jax.numpy.zeros(1).block_until_ready()  # the backend has started: its device count is fixed
    assert use_cpu_cores(3) == len(jax.devices("cpu"))
    assert cpu_core_count() >= 1


def test_import_while_training_imports_once_at_the_first_progress(monkeypatch):
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    callback = ImportWhileTraining("colorsys")
    assert "colorsys" not in sys.modules
    callback.on_progress(Progress(8, 1.0, None))
    assert "colorsys" in sys.modules and callback.modules == ()


def test_gymnax_renderers_imports_are_deferred_and_plots_still_work(tmp_path):
    """gymnax imports seaborn and pyplot to render; a run imports neither, and kitae's plot works."""
    script = textwrap.dedent(f"""
        import sys
        from kitae.envs.make import make_jax_env
        make_jax_env("gymnax:CartPole-v1", 2)
        loaded = [m for m in ("seaborn", "pandas", "matplotlib.pyplot")
                  if m in sys.modules and not type(sys.modules[m]).__name__ == "ImportedOnUse"]
        assert not loaded, loaded
        import numpy as np
        from kitae.runs.plotting import plot_curves
        curves = {{0: (np.arange(5.0), np.arange(5.0))}}
        plot_curves({{"run": curves}}, {str(tmp_path / "curve.png")!r})
        import matplotlib.pyplot as plt  # the stand-in gives the real pyplot on use
        assert callable(plt.subplots)
        print("OK")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr[-3000:]
    assert (tmp_path / "curve.png").stat().st_size > 1000


# XLA's defaults for the flags the suite sets besides the level (tests/conftest.py): the new fusion
# emitters, every instruction the CPU has
USERS_COMPILE = {"xla_cpu_use_fusion_emitters": True, "xla_cpu_max_isa": ""}


@pytest.mark.parametrize("algo, env_id", [("ppo", "gymnax:CartPole-v1"), ("sac", "gymnax:Pendulum-v1")])
def test_starting_state_compiled_once_has_the_default_compiles_bits(algo, env_id, tmp_path):
    """LLVM optimisation level 1 (``jit_once``'s) makes a run's starting state (parameters,
    optimizer, environments, buffer) with the same bits as XLA's default level, 3. Both levels are
    named, and the emitters and instructions a user's compile takes: the suite's XLA_FLAGS choose
    level 0, XLA's older fusion emitters and AVX for every program (tests/conftest.py)."""
    run, env = resolve_train(RunSpec(algo=algo, env_id=env_id))
    agent = run.agent_cls(run.algo, run.config, run_dir=tmp_path)
    fresh, _, _ = make_loop_functions(agent, env)
    seed = jax.numpy.asarray(5, jax.numpy.uint32)
    states = []
    for level in (3, 1):
        options = {"xla_backend_optimization_level": level, **USERS_COMPILE}
        program = jax.jit(fresh).lower(seed).compile(compiler_options=options)
        with one_blas_thread():  # as jit_once runs it: only the compile options differ
            states.append(jax.tree_util.tree_leaves(jax.block_until_ready(program(seed))))
    default_leaves, once_leaves = states
    assert len(default_leaves) == len(once_leaves) > 10
    for a, b in zip(default_leaves, once_leaves):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_programs_that_run_once_compile_at_level_1_unless_xla_flags_choose_a_level():
    assert once_options("") == {"xla_backend_optimization_level": 1}
    assert once_options("--xla_force_host_platform_device_count=2") == {"xla_backend_optimization_level": 1}
    assert once_options("--xla_backend_optimization_level=0") == {}
    assert ONCE_OPTIONS == once_options(os.environ["XLA_FLAGS"]) == {}  # the suite's level 0 (conftest)
    script = "from kitae.compile_options import ONCE_OPTIONS; print(ONCE_OPTIONS)"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.stdout.strip() == "{'xla_backend_optimization_level': 1}", done.stderr[-3000:]


def test_thread_settings_do_not_change_a_starting_state():
    """A DQN's [256, 256] layers (orthogonal init: a QR, run by OpenBLAS) start from the same bits
    whatever OMP_NUM_THREADS / OPENBLAS_NUM_THREADS say, made by the agent (host loop), by the
    compiled loop's starting-state program and by a functional agent's ``init_params`` (a Flax
    network with orthogonal [256, 256] layers). Without ``one_blas_thread`` one thread and two
    gave other weights on a 2-core machine."""
    script = textwrap.dedent("""
        import jax, numpy as np
        from kitae.compile_options import jit_once
        from kitae.loops.program import make_loop_functions
        from kitae.runs.resolve import RunSpec, preset_agent, resolve_train
        from kitae.runs.rundir import state_fingerprint
        agent, env = preset_agent("dqn", "CartPole-v1", steps=1000, run_dir="host")
        run, jax_env = resolve_train(RunSpec(algo="dqn", env_id="gymnax:CartPole-v1", run_dir="compiled"))
        fresh, _, _ = make_loop_functions(run.agent_cls(run.algo, run.config, run_dir="compiled"), jax_env)
        import flax.linen as nn, gymnasium as gym
        from kitae.functional import DQN
        class Q(nn.Module):
            n: int
            @nn.compact
            def __call__(self, x):
                init = nn.initializers.orthogonal()
                for size in (256, 256):
                    x = nn.relu(nn.Dense(size, kernel_init=init)(x))
                return nn.Dense(self.n)(x)
        functional = DQN(lambda space: Q(int(space.n)), gym.make("CartPole-v1"), learning_rate=1e-3)
        print(state_fingerprint(agent.state), state_fingerprint(jit_once(fresh)(np.uint32(5)).agent_state),
              state_fingerprint(functional.init_params(jax.random.PRNGKey(3))))
    """)
    prints = set()
    for threads in ({"OMP_NUM_THREADS": "1"}, {"OPENBLAS_NUM_THREADS": "1"}, {"OPENBLAS_NUM_THREADS": "2"}, {}):
        env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=200,
                              env={**env, **threads})  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        prints.add(done.stdout.strip().splitlines()[-1])
    assert len(prints) == 1, prints


def test_tensorboard_writer_does_not_import_pytorch(tmp_path):
    """tensorboardX imports torch where it is installed; kitae's writer hides it (a stand-in torch
    that raises if imported), writes its events, and torch imports normally afterwards."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise RuntimeError('torch was imported')\n")
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from pathlib import Path
        from kitae.runs.tensorboard import tensorboard_writer
        with tensorboard_writer(Path({str(tmp_path / "run")!r})) as writer:
            writer.add_scalar("charts/x", 1.0, 0)
        assert "torch" not in sys.modules
        try:
            import torch
        except RuntimeError as error:  # the stand-in: found again, so the hiding was undone
            print("OK", error)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "OK torch was imported" in result.stdout, result.stderr[-3000:]
    assert list((tmp_path / "run" / "logs").glob("events.out.tfevents.*"))


@pytest.mark.slow
def test_command_line_spreads_seeds_over_cpu_devices(tmp_path):
    """`kitae` gives XLA one device per core (here: KITAE_CPU_DEVICES=2): two seeds are sharded,
    summary.json says so, and the closing line reaches the terminal before the process exits."""
    command = [sys.executable, "-m", "kitae.cli", "train", "ppo", "gymnax:CartPole-v1", "--seeds", "2",
               "--steps", "1024", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    # XLA_FLAGS keep the suite's level but choose no device count (kitae would then leave the count alone)
    flags = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f)
    env = {**os.environ, "KITAE_CPU_DEVICES": "2", "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    result = subprocess.run(command, capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "final return" in result.stdout and str(tmp_path / "run") in result.stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["devices"] == 2 and len(summary["final_return"]) == 2
    assert summary["machine"]["devices"] == 2  # what a resume elsewhere compares (kitae.runs.provenance)
