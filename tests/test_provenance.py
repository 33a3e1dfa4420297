"""What made a run (``kitae.runs.provenance``): the versions and the machine in ``summary.json``."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import warnings
from pathlib import Path

import flax
import gymnasium
import jax
import numpy as np
import optax
import pytest
from _agents import TinyDQN, TinyDQNParams, make_config

import kitae
from kitae.cli import main
from kitae.devices import shard_count
from kitae.envs.make import make_vec_env
from kitae.runs.checkpoints import Checkpointer
from kitae.runs.provenance import (
    PACKAGES,
    ProvenanceWarning,
    cpu_name,
    differences,
    machine,
    made_with,
    simd,
    versions,
)

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu vme avx2

processor\t: 1
model name\t: AMD EPYC 9R14 96-Core Processor
"""


def test_versions_are_the_installed_ones():
    found = versions()
    assert list(found) == ["kitae", "python", *PACKAGES]
    assert found["kitae"] == kitae.__version__ and found["python"] == platform.python_version()
    assert found["jax"] == jax.__version__ and found["numpy"] == np.__version__
    assert found["flax"] == flax.__version__ and found["optax"] == optax.__version__
    assert found["gymnasium"] == gymnasium.__version__


def test_the_cpu_is_named_from_cpuinfo_or_the_platform():
    assert cpu_name(CPUINFO) == "AMD EPYC 9R14 96-Core Processor"
    # no model name (some ARM kernels): what the platform module knows
    assert cpu_name("processor\t: 0\nBogoMIPS\t: 50.00\n") == (platform.processor() or platform.machine())
    assert cpu_name()  # this machine's, whatever it is


def test_the_widest_vector_extension_is_named():
    assert simd(CPUINFO) == "avx2"
    assert simd("flags\t\t: fpu sse4_2 avx avx2 avx512f avx512bw\n") == "avx512f"
    assert simd("Features\t: fp asimd evtstrm aes\n") == "asimd"  # ARM
    assert simd("processor\t: 0\n") == ""


def test_the_machine_records_xla_flags_only_when_set(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", " --xla_cpu_max_isa=AVX ")
    found = machine()
    assert found["backend"] == jax.default_backend() and found["platform"] == platform.platform()
    assert found["cpu"] == cpu_name() and found["simd"] == simd()
    assert isinstance(found["cores"], int) and 1 <= found["cores"] <= (os.cpu_count() or 1)
    assert found["xla_flags"] == "--xla_cpu_max_isa=AVX"
    monkeypatch.delenv("XLA_FLAGS")
    assert "xla_flags" not in machine()


def test_the_version_is_written_once():
    """``pyproject.toml`` reads kitae's version from ``kitae/version.py``: the installed package's
    metadata and ``kitae.__version__`` agree."""
    from importlib import metadata

    assert metadata.version("kitae") == kitae.__version__ == versions()["kitae"]


# ---------------------------------------------------------------------------------------------
# Checkpoints say what wrote them; a run resumed elsewhere says that its bits will differ
# ---------------------------------------------------------------------------------------------


def _tiny_dqn(run_dir):
    env = make_vec_env("CartPole-v1", 2)
    config = make_config(
        env, TinyDQNParams(start_step=32, skip_steps=2), max_buffer_size=64, batch_size=16, n_env_steps=200
    )
    config = dataclasses.replace(config, train_cfg=dataclasses.replace(config.train_cfg, save_frequency=50))
    return TinyDQN("t", config, run_dir=run_dir), env


def _written_elsewhere(checkpoint: Path) -> None:
    """Makes ``checkpoint``'s metadata say another CPU and another jaxlib wrote it."""
    path = checkpoint / "meta" / "metadata"
    meta = json.loads(path.read_text())
    meta["made_with"]["machine"]["simd"] = "sve"
    meta["made_with"]["versions"]["jaxlib"] = "0.0.1"
    meta["made_with"]["versions"]["python"] = "3.9.0"  # not a difference that changes the bits
    path.write_text(json.dumps(meta))


def test_a_run_resumed_on_another_machine_says_its_bits_will_differ(tmp_path):
    run_dir = tmp_path / "run"
    agent, env = _tiny_dqn(run_dir)
    agent.train(env, 100)
    checkpoints = Checkpointer(run_dir / "checkpoints")
    assert checkpoints.read_meta(100)["made_with"] == made_with()
    assert json.loads((run_dir / "summary.json").read_text())["machine"] == made_with()["machine"]

    with warnings.catch_warnings():  # the same machine and software: nothing to say
        warnings.simplefilter("error", ProvenanceWarning)
        resumed, env = _tiny_dqn(run_dir)
        assert resumed.resume(env, 150).env_steps == 150

    _written_elsewhere(checkpoints.path(150))
    again, env = _tiny_dqn(run_dir)
    expected = f"simd sve -> {simd() or '(none)'}"
    with pytest.warns(ProvenanceWarning, match=r"checkpoint step 150 .*jaxlib 0\.0\.1 -> .*" + re.escape(expected)):
        result = again.resume(env)
    assert result.env_steps == 200  # the run goes on all the same
    assert "python" not in str(differences(checkpoints.read_meta(150)["made_with"]))


def test_kitae_resume_says_it_in_one_line(tmp_path, capsys):
    run_dir = tmp_path / "run"
    argv = ["--set", "algo_params.start_step=32", "--quiet"]
    assert main(["train", "dqn", "CartPole-v1", "--steps", "64", "--run-dir", str(run_dir), *argv]) == 0
    checkpoints = Checkpointer(run_dir / "checkpoints")
    step = checkpoints.all_steps()[-1]  # the preset's whole iterations: 256
    _written_elsewhere(checkpoints.path(step))
    capsys.readouterr()
    assert main(["resume", str(run_dir), "--steps", str(2 * step), "--quiet"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "written with other software" in line]
    assert len(lines) == 1 and lines[0].startswith(f"kitae: warning: checkpoint step {step} "), lines
    assert "jaxlib 0.0.1 -> " in lines[0] and "not to the bits an uninterrupted run would have reached" in lines[0]


def test_differences_name_only_what_can_change_the_bits():
    current = made_with()
    assert differences(current) == [] and differences(None) == [] and differences({"machine": "x"}) == []
    other = json.loads(json.dumps(current))
    other["machine"]["platform"] = "Linux-0.0-other-kernel"  # the kernel's version: not the bits
    other["versions"]["python"] = "3.13.0"
    assert differences(other) == []
    other["machine"]["xla_flags"] = "--xla_cpu_max_isa=SSE4_2"
    other["machine"]["cpu"] = "Intel Xeon"
    assert differences(other) == [
        f"cpu Intel Xeon -> {current['machine']['cpu']}",
        f"xla_flags --xla_cpu_max_isa=SSE4_2 -> {current['machine'].get('xla_flags') or '(none)'}",
    ]


def test_seeds_trained_together_compare_the_devices_they_are_sharded_over():
    assert [shard_count(d, 16) for d in (1, 2, 4, 3)] == [1, 2, 4, 1]
    assert shard_count(2, 1) == 1  # one seed runs on one device either way
    current = made_with()
    other = json.loads(json.dumps(current))
    other["machine"]["devices"] = current["machine"]["devices"] * 2
    assert differences(other) == [] and differences(other, seeds=1) == []
    count = current["machine"]["devices"]
    # 4n seeds divide by both counts: sharded over 2n devices then, over n (1 is no sharding) now
    assert differences(other, seeds=4 * count) == [f"{4 * count} seeds sharded over {2 * count} -> {count} devices"]
