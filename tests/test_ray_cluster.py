"""A real two-node Ray cluster on this machine: ``ray start --head`` on a free local port, a second
``ray start --address``, a short distributed PPO run and a host-loop sweep on Ray workers joining
it with ``--address``, then the cluster is stopped (its own processes only: other Ray runtimes on
the machine are left alone)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

RAY = str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_of(port: int) -> str | None:
    """The session directory of the cluster whose GCS listens on ``port``."""
    for process in psutil.process_iter(["name", "cmdline"]):
        args = process.info["cmdline"] or []
        if process.info["name"] == "gcs_server" and f"--gcs_server_port={port}" in args:
            log_dir = next(a.split("=", 1)[1] for a in args if a.startswith("--log_dir="))
            return log_dir.rsplit("/logs", 1)[0]
    return None


def _of_cluster(args: list[str], session: str, port: int) -> bool:
    """Whether a command line is one of the cluster's processes: they name its session directory,
    except the Ray client server, which names the GCS address only (``--address=IP:PORT``; once
    missed here, it outlived the test and held its port)."""
    return any(session in arg or (arg.startswith("--address=") and arg.endswith(f":{port}")) for arg in args)


def _stop_cluster(session: str, port: int) -> list[int]:
    """Terminates every process of the cluster and their children; returns those left."""
    found = set()
    for process in psutil.process_iter(["cmdline"]):
        if _of_cluster(process.info["cmdline"] or [], session, port):
            found.add(process)
            with contextlib.suppress(psutil.NoSuchProcess):
                found |= set(process.children(recursive=True))
    for process in found:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(list(found), timeout=20)
    for process in alive:
        process.kill()
    _, alive = psutil.wait_procs(alive, timeout=10)
    return [p.pid for p in alive]


def test_a_short_ppo_run_and_a_sweep_train_on_a_two_node_cluster(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16), RAY_USAGE_STATS_ENABLED="0")
    port, client_port = _free_port(), _free_port()
    head = [RAY, "start", "--head", f"--port={port}", "--num-cpus=1"]
    head += ["--include-dashboard=false", f"--ray-client-server-port={client_port}"]
    from ray._private.utils import get_ray_address_file  # where Ray keeps it (no public name)

    current = Path(get_ray_address_file(None))  # the newest cluster's address: `ray start --head` writes it
    before = current.read_text() if current.exists() else None
    subprocess.run(head, env=env, check=True, capture_output=True, timeout=120)
    session = _session_of(port)
    assert session is not None
    try:
        second = [RAY, "start", f"--address=127.0.0.1:{port}", "--num-cpus=1"]
        subprocess.run(second, env=env, check=True, capture_output=True, timeout=120)
        count = f"import ray; ray.init(address='127.0.0.1:{port}', log_to_driver=False); print(len(ray.nodes()))"
        nodes = subprocess.run([sys.executable, "-c", count], env=env, capture_output=True, text=True, timeout=120)
        assert nodes.stdout.strip().splitlines()[-1] == "2", nodes.stderr[-2000:]
        run_dir = tmp_path / "run"
        train = [sys.executable, "-m", "kitae.cli", "train", "ppo", "CartPole-v1", "--workers", "2", "--steps", "512"]
        train += ["--address", f"127.0.0.1:{port}", "--run-dir", str(run_dir), "--quiet"]
        done = subprocess.run(train, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["steps"] == 512
        assert f"127.0.0.1:{port}" in (run_dir / "config.yaml").read_text()
        # a host-loop sweep on the same cluster (its tasks scheduled SPREAD over the nodes; where
        # each ran is not checked), each task writing its combination's run directory: one file
        # system here, as the docs require
        sweep_dir = tmp_path / "sweep"
        sweep = [sys.executable, "-m", "kitae.cli", "sweep", "ppo", "CartPole-v1", "--grid",
                 "update_cfg.learning_rate=1e-3,3e-4", "--steps", "512", "--workers", "2",
                 "--address", f"127.0.0.1:{port}", "--sweep-dir", str(sweep_dir), "--quiet"]  # fmt: skip
        done = subprocess.run(sweep, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads((sweep_dir / "sweep.json").read_text())
        assert report["workers"] == 2 and len(report["combinations"]) == 2
        for name in ("learning_rate=0.001", "learning_rate=0.0003"):
            assert json.loads((sweep_dir / name / "summary.json").read_text())["steps"] == 512
    finally:
        left = _stop_cluster(session, port)
        # `ray stop` would also remove the pointer to the newest cluster, but it stops every Ray
        # runtime on the machine; leave the pointer as it was, so that a later `ray.init()` does
        # not try to join this stopped cluster
        if current.exists() and current.read_text().strip().endswith(f":{port}"):
            if before is None:
                current.unlink()
            else:
                current.write_text(before)
    assert not left
    assert not [p for p in psutil.process_iter(["cmdline"]) if _of_cluster(p.info["cmdline"] or [], session, port)]
    if _session_of(port) is not None:
        pytest.fail("the cluster's GCS still runs")
