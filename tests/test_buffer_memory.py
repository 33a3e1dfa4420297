"""A buffer that cannot fit in memory is refused before anything is allocated or written, and an
out-of-memory error from XLA is one line on the command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from kitae.buffer import check_buffer_memory, space_nbytes
from kitae.cli import main
from kitae.devices import available_memory
from kitae.loops.compiled import compiled_train
from kitae.runs import preset_agent

CAR_RACING_ROW = 2 * 96 * 96 * 3 + 3 * 4  # observation and next observation (uint8), action (3 float32)


@pytest.mark.parametrize(
    "space,expected",
    [
        (gym.spaces.Box(0, 255, (96, 96, 3), np.uint8), 27_648),
        (gym.spaces.Box(-1.0, 1.0, (3,), np.float64), 12),  # stored as float32 (no jax_enable_x64)
        (gym.spaces.Discrete(4), 4),
        (gym.spaces.MultiDiscrete([3, 4]), 8),
        (gym.spaces.MultiBinary(5), 5),
        (gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (2,), np.float32), "b": gym.spaces.Discrete(3)}), 12),
        (gym.spaces.Tuple((gym.spaces.Discrete(3), gym.spaces.Box(0, 1, (2, 2), np.float32))), 20),
        (gym.spaces.Text(5), 0),
    ],
)
def test_space_nbytes(space, expected):
    assert space_nbytes(space) == expected


def test_a_buffer_larger_than_the_memory_available_is_refused_with_the_rows_that_fit():
    available = available_memory()
    assert available is not None and available > 0  # Linux: MemAvailable
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    total = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemTotal:"))
    assert available <= total
    check_buffer_memory(available // 4, 1000, "update_cfg.max_buffer_size")  # fits: nothing said
    with pytest.raises(ValueError) as error:
        check_buffer_memory(2 * available, 1000, "update_cfg.max_buffer_size", copies=3)
    message = str(error.value)
    assert message.startswith("update_cfg.max_buffer_size=1,000 is too large here: the 3 buffers trained together")
    # about half of the rows fit (the memory available moves a little between the two reads)
    rows = int(message.rsplit("at most ", 1)[1].split(" rows")[0].replace(",", ""))
    assert 450 <= rows <= 550, message


def _too_many_car_racing_rows() -> int:
    pytest.importorskip("Box2D")
    return 2 * available_memory() // CAR_RACING_ROW + 1


def test_kitae_train_refuses_it_in_one_line_and_writes_nothing(capsys, tmp_path):
    rows = _too_many_car_racing_rows()
    argv = ["train", "sac", "CarRacing-v3", "--steps", "300", "--set", f"update_cfg.max_buffer_size={rows}"]
    assert main([*argv, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kitae: error: update_cfg.max_buffer_size={rows:,} is too large"), err
    assert not (tmp_path / "run").exists()
    assert main(argv) == 2  # the default run directory is not claimed either
    assert not (tmp_path / "runs").exists()


def test_agent_train_refuses_it_but_the_agent_is_made(tmp_path):
    """Making the agent does not check (``kitae eval`` of a run trained on a larger machine needs
    no buffer); ``agent.train`` does, before it writes the run directory."""
    rows = _too_many_car_racing_rows()
    agent, env = preset_agent(
        "sac", "CarRacing-v3", run_dir=tmp_path / "run", steps=300, sets=[f"update_cfg.max_buffer_size={rows}"]
    )
    with pytest.raises(ValueError, match="update_cfg.max_buffer_size=.* is too large here"):
        agent.train(env)
    assert env.closed  # as agent.train's other refusals close it
    assert not (tmp_path / "run").exists()


def test_the_compiled_loop_counts_every_seeds_buffer():
    """One seed's buffer fits, four do not: the compiled loop refuses the run before it makes the
    starting state (the buffers of the seeds it trains together are allocated together)."""
    available = available_memory()
    rows = available // (2 * 28)  # a seed's buffer: at least half the memory (28 bytes a transition at least)
    if rows >= 2**31:
        pytest.skip("a machine this large needs more rows than an int32 step counter holds")
    agent, env = preset_agent("sac", "gymnax:Pendulum-v1", steps=300, sets=[f"update_cfg.max_buffer_size={rows}"])
    agent.check_buffer_memory()  # one seed's lower bound fits
    with pytest.raises(ValueError, match=r"too large here: the 4 buffers trained together"):
        compiled_train(agent, env, 300, seeds=[0, 1, 2, 3])


def test_an_out_of_memory_error_from_xla_is_one_line(tmp_path):
    """kitae's estimate is a lower bound against what the system says is available: where XLA
    still runs out of memory (here, a process limited to 6 GiB of address space, two seeds' buffers
    of about 4 GB each), the command line says so in one line, status 1."""

    command = [sys.executable, "-m", "kitae.cli", "train", "sac", "gymnax:Pendulum-v1", "--seeds", "2"]
    command += ["--steps", "2000", "--set", "update_cfg.max_buffer_size=100000000", "--quiet"]
    done = subprocess.run(
        # bash's ulimit rather than a preexec_fn: forking this process (JAX's threads) is not safe
        ["bash", "-c", 'ulimit -v 6291456 && exec "$@"', "bash", *command, "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("kitae: error: out of memory: RESOURCE_EXHAUSTED"), lines
    assert "Traceback" not in done.stderr
