"""One process trains in a run directory at a time (``kitae.runs.lock``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from kitae.cli import main
from kitae.runs.errors import RunError
from kitae.runs.lock import in_use_by_this_process

# Another process, as kitae holds a directory (an exclusive flock on it), without importing kitae
# (and JAX): a second of start-up less per process
HOLD = """
import fcntl, os, sys, time
descriptor = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
time.sleep(120)
"""
TRY = """
import fcntl, os, sys
descriptor = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
try:
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
except BlockingIOError:
    sys.exit(1)
"""


@pytest.fixture
def held_elsewhere():
    """``hold(directory)``: another process holds ``directory`` until the test ends."""
    processes = []

    def hold(directory):
        process = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True)
        processes.append(process)
        assert process.stdout.readline().strip() == "held"

    yield hold
    for process in processes:
        process.kill()
        process.wait()


def _try_elsewhere(directory) -> int:
    """Exit status of another process that tries to hold ``directory``: 0 held, 1 refused."""
    return subprocess.run([sys.executable, "-c", TRY, str(directory)], check=False).returncode


def test_a_directory_is_held_by_one_process_and_again_within_it(tmp_path, held_elsewhere):
    with in_use_by_this_process(tmp_path):
        with in_use_by_this_process(tmp_path):  # the same process again (a sweep's combination)
            assert _try_elsewhere(tmp_path) == 1
        assert _try_elsewhere(tmp_path) == 1  # still held by the outer block
    assert _try_elsewhere(tmp_path) == 0  # released
    other = tmp_path / "other"
    other.mkdir()
    held_elsewhere(other)
    message = r"^sweep directory '.*other' is in use: another kitae process is training in it"
    with pytest.raises(RunError, match=message), in_use_by_this_process(other, "sweep directory"):
        pass


def test_a_forked_child_does_not_keep_the_directory_held(tmp_path):
    with in_use_by_this_process(tmp_path):
        child = os.fork()
        if child == 0:  # a subprocess environment's worker, living on after its parent let go
            time.sleep(5)
            os._exit(0)
    try:
        assert _try_elsewhere(tmp_path) == 0
    finally:
        os.kill(child, 9)
        os.waitpid(child, 0)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lock") / "run"
    assert main(["train", "dqn", "CartPole-v1", "--steps", "256", "--run-dir", str(run_dir), "--quiet"]) == 0
    return run_dir


def test_a_run_directory_another_process_trains_in_is_refused_in_one_line(finished_run, held_elsewhere, capsys):
    """Two ``kitae resume RUN_DIR`` together both trained in it before (TensorBoard points twice, one's
    metrics rows lost, both saving and deleting the same checkpoints)."""
    before = (finished_run / "metrics.jsonl").read_bytes()
    held_elsewhere(finished_run)
    capsys.readouterr()
    assert main(["resume", str(finished_run), "--steps", "512", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"kitae: error: run directory '{finished_run}' is in use: another kitae process is training in it; wait "
        "for it to end (or stop it: Ctrl-C, or kill -TERM, saves a checkpoint) and try again"
    )
    assert (finished_run / "metrics.jsonl").read_bytes() == before
    empty = finished_run.parent / "empty"  # kitae train --run-dir of a directory in use
    empty.mkdir()
    held_elsewhere(empty)
    assert main(["train", "dqn", "CartPole-v1", "--steps", "256", "--run-dir", str(empty), "--quiet"]) == 2
    assert "is in use: another kitae process" in capsys.readouterr().err
    assert list(empty.iterdir()) == []
    # a run that finished holds nothing: kitae eval reads it while another process holds it
    assert main(["eval", str(finished_run), "--episodes", "1"]) == 0
    assert json.loads((finished_run / "summary.json").read_text())["eval_episodes"] == 1


def test_a_sweep_directory_another_process_holds_is_refused(tmp_path, held_elsewhere, capsys):
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    held_elsewhere(sweep_dir)
    argv = ["sweep", "ppo", "gymnax:CartPole-v1", "--grid", "update_cfg.learning_rate=1e-3,3e-3", "--steps", "2048",
            "--sweep-dir", str(sweep_dir), "--quiet"]  # fmt: skip
    assert main(argv) == 2
    assert f"sweep directory '{sweep_dir}' is in use: another kitae process" in capsys.readouterr().err
    assert list(sweep_dir.iterdir()) == []
