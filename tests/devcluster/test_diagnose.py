"""The failure report's process facts: who listens on a control-plane process's port, and the session probes every
operator-test timeout leads with."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from colocgrpo_dev.cluster.diagnose import disk_free, port_owners, processes
from support.operator_harness import add_session_probe, session_state, wait_for

# A stand-in control-plane process: named by its port flag like kube-apiserver, listening on it unless told not to.
STAND_IN = """
import socket, sys, time
port = int(sys.argv[1].split("=")[1])
if sys.argv[2] == "listen":
    s = socket.socket(); s.bind(("127.0.0.1", port)); s.listen()
print("ready", flush=True)
time.sleep(120)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def stand_in(tmp_path):
    started = []

    def start(port: int, listen: bool) -> Path:
        process = subprocess.Popen(
            # Its command line names the cluster's kubeconfig, as Kueue's does: that makes it the cluster's process.
            [
                sys.executable,
                "-c",
                STAND_IN,
                f"--secure-port={port}",
                "listen" if listen else "idle",
                f"--kubeconfig={tmp_path / 'kubeconfig.yaml'}",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        (tmp_path / "pids").mkdir(exist_ok=True)
        (tmp_path / "pids" / "kube-apiserver.pid").write_text(str(process.pid))
        return tmp_path

    yield start
    for process in started:
        process.kill()
        process.wait()


def test_a_process_on_its_own_port_is_ok(stand_in) -> None:
    folder = stand_in(_free_port(), listen=True)
    assert port_owners(folder, ["kube-apiserver"]) == "every process listens on its own port"


def test_a_port_taken_by_another_process_names_the_holder(stand_in) -> None:
    with socket.socket() as thief:
        thief.bind(("127.0.0.1", 0))
        thief.listen()
        port = thief.getsockname()[1]
        folder = stand_in(port, listen=False)
        found = port_owners(folder, ["kube-apiserver"])
    assert found.startswith(f"kube-apiserver's {port} held by pid "), found
    assert str(os.getpid()) in found, found


def test_a_port_nobody_listens_on_is_named(stand_in) -> None:
    port = _free_port()
    folder = stand_in(port, listen=False)
    assert port_owners(folder, ["kube-apiserver"]) == f"kube-apiserver's {port} not listened on"


def test_a_dead_process_is_reported_with_the_end_of_its_log(stand_in) -> None:
    """A process whose pid file outlives it (Kueue killed mid-session, say) is DEAD, with its log's last lines,
    Kueue's from its own folder; a live one gets no log lines."""
    folder = stand_in(_free_port(), listen=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (folder / "pids" / "kueue.pid").write_text(str(gone.pid))
    (folder / "kueue").mkdir()
    (folder / "kueue" / "kueue.log").write_text("".join(f"line {i}\n" for i in range(20)) + "setup failed: boom\n")
    report = processes(folder / "kubeconfig.yaml").splitlines()
    assert report[0].startswith("cluster health (process state, RSS): kube-apiserver S "), report
    assert report[0].endswith(", kueue DEAD"), report
    assert report[2].startswith("--- kueue is dead; its log (last written "), report
    assert report[3:] == [*(f"line {i}" for i in range(13, 20)), "setup failed: boom"], report


def test_disk_free_names_each_file_system(tmp_path) -> None:
    report = disk_free(tmp_path, tmp_path / "missing")
    assert report.startswith("disk free: ") and f"GiB ({tmp_path})" in report and "(/tmp)" in report, report
    assert f"? ({tmp_path / 'missing'}: " in report, report


def test_every_timeout_leads_with_the_session_probes() -> None:
    add_session_probe("alive", lambda: "operator: alive")
    add_session_probe("broken", lambda: 1 / 0)
    try:
        with pytest.raises(AssertionError) as raised:
            wait_for(lambda: None, 0.01, "nothing", on_timeout=lambda: "the test's own detail")
    finally:
        add_session_probe("alive", None)
        add_session_probe("broken", None)
    lines = str(raised.value).splitlines()
    assert lines[0].startswith("timed out after 0.01s waiting for nothing"), lines
    assert lines[1:4] == [
        "operator: alive",
        "broken: report failed: ZeroDivisionError('division by zero')",
        "the test's own detail",
    ], lines
    assert session_state() == ""
