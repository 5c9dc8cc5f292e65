"""Start, inspect and stop the local control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok) on 127.0.0.1, plus the fake GPU node pool and, where this machine can run
containers, the real node (node/).

kwokctl (`--runtime binary`) owns the control plane's processes: it starts them detached, records
their pids under the cluster's folder and stops them on delete; the real node's are recorded the same
way under its `node/` folder. All state lives under <cache>/cluster/clusters/<name>/; `down` removes
it (the real node's images stay in <cache>/containerd/node/, node/node.py says when they do not).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from colocgrpo_dev.cluster.api_install import install_api
from colocgrpo_dev.cluster.binaries import (
    NodeBinaries,
    binaries_dir,
    ensure_binaries,
    ensure_node_binaries,
    kubectl_path,
)
from colocgrpo_dev.cluster.commands import run
from colocgrpo_dev.cluster.gpu_nodes import render_gpu_nodes
from colocgrpo_dev.cluster.kwokctl_config import render_kwokctl_config, write_fake_log
from colocgrpo_dev.cluster.locking import file_lock
from colocgrpo_dev.cluster.node import host
from colocgrpo_dev.cluster.node.node import RealNode
from colocgrpo_dev.cluster.paths import cache_dir

DEFAULT_NAME = "colocgrpo"


@dataclass
class DevCluster:
    """One local cluster, by name. With `real_node`, `up` also starts the real node where this machine can run
    containers (`node_unavailable` then says why it could not, in one line)."""

    name: str = DEFAULT_NAME
    workdir: Path = field(default_factory=lambda: cache_dir() / "cluster")
    real_node: bool = False
    node_unavailable: str | None = field(default=None, init=False)

    @property
    def cluster_dir(self) -> Path:
        return self.workdir / "clusters" / self.name

    @property
    def kubeconfig(self) -> Path:
        return self.cluster_dir / "kubeconfig.yaml"

    @property
    def _config_file(self) -> Path:
        return self.workdir / f"{self.name}.kwok.yaml"

    @property
    def _lock_file(self) -> Path:
        return self.workdir / f"{self.name}.lock"

    @property
    def _fake_log(self) -> Path:
        return self.workdir / f"{self.name}-fake-container.log"

    @property
    def node(self) -> RealNode:
        """The real node's handle (whether or not it runs)."""
        return RealNode.for_cluster(self.name, self.cluster_dir, self.kubeconfig)

    # -- lifecycle -------------------------------------------------------------------------

    def up(self, timeout: float = 120) -> Path:
        """Build missing binaries, start the cluster unless it already answers, ensure the node pool
        and install the ColocGRPOJob API (the CRD and the trainer status policy, api_install.py); with
        `real_node`, start the real node too, or say in one line why this machine cannot.

        Idempotent: a running cluster is reused. Returns the kubeconfig path.
        """
        binaries = ensure_binaries()
        node_binaries = self._node_binaries()
        with file_lock(self._lock_file):
            node = self.node
            node_network = node.network() if node_binaries else None
            config = render_kwokctl_config(binaries, self._fake_log, node_network, self.cluster_dir / "pki")
            # A running cluster started from another config (new pins or stages) is replaced, and so is one whose
            # real node is missing or unwell: the node's address is part of the API server's settings.
            current = self._config_file.read_text() if self._config_file.is_file() else None
            stale_node = node_binaries is not None and (
                node_network is None or not node.healthy(node.settings(node_binaries, node_network))
            )
            if current != config or stale_node or not self.is_ready():
                self._down()
                if node_binaries is not None:
                    node_network = node.create_network(self.workdir / ".node-network.lock")
                config = render_kwokctl_config(binaries, self._fake_log, node_network, self.cluster_dir / "pki")
                self._create(config, timeout)
            self.ensure_gpu_nodes(timeout, tainted=node_binaries is not None)
            install_api(self.kubectl, int(timeout))
            if (
                node_binaries is not None
                and node_network is not None
                and not node.healthy(node.settings(node_binaries, node_network))
            ):
                node.start(node_binaries, node_network, self.api_port(), timeout=max(timeout, 180))
        return self.kubeconfig

    def _node_binaries(self) -> NodeBinaries | None:
        """The real node's binaries (built if missing) when the node is asked for and this machine can run it;
        otherwise None, with the one-line reason printed and kept in `node_unavailable`."""
        if not self.real_node:
            return None
        reason = host.unsupported_reason()
        if reason is not None:
            self.node_unavailable = reason
            print(f"==> no real node: {reason}. Without it, {host.WHAT_STILL_WORKS}.", file=sys.stderr, flush=True)
            return None
        return ensure_node_binaries()

    def api_port(self) -> int:
        """The API server's port on 127.0.0.1 (kwokctl picks a free one)."""
        server = yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        return int(server.rsplit(":", 1)[1])

    def down(self) -> None:
        """Stop every process `up` started and remove the cluster's state."""
        with file_lock(self._lock_file):
            self._down()

    def _down(self) -> None:
        # The real node first: its kubelet would otherwise keep calling an API server that is going away.
        self.node.stop()
        if self.cluster_dir.exists():
            folder = binaries_dir()
            if (folder / "kwokctl").is_file():
                self._kwokctl(folder, "delete", "cluster", check=False)
            # kwokctl may be gone (pins bumped, cache cleaned) or may have failed half-way:
            # stop whatever its pid files still name, so no process outlives `down`.
            self._stop_recorded_processes()
        shutil.rmtree(self.cluster_dir, ignore_errors=True)
        self._config_file.unlink(missing_ok=True)
        self._fake_log.unlink(missing_ok=True)

    def is_ready(self) -> bool:
        if not self.kubeconfig.is_file():
            return False
        probe = self.kubectl("get", "--raw", "/readyz", "--request-timeout=3s", check=False)
        return probe.returncode == 0 and probe.stdout.strip() == "ok"

    def status(self) -> dict[str, Any]:
        nodes: list[str] = []
        ready = self.is_ready()
        if ready:
            listing = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)
            nodes = [n["metadata"]["name"] for n in listing["items"]]
        node = self.node
        return {
            "name": self.name,
            "ready": ready,
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig.is_file() else None,
            "state": str(self.cluster_dir),
            "binaries": str(binaries_dir()),
            "nodes": nodes,
            "real_node": {"processes": node.running(), "ready": ready and node.healthy()}
            if node.paths.state.exists()
            else None,
        }

    # -- pieces ----------------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster (never the user's current context)."""
        return run([str(kubectl_path()), f"--kubeconfig={self.kubeconfig}", *args], input=input, check=check)

    def ensure_gpu_nodes(self, timeout: float = 60, tainted: bool = False) -> None:
        """Create the fake GPU nodes (if absent) and wait until KWOK reports them Ready."""
        nodes = render_gpu_nodes(tainted=tainted)
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(nodes))
        for node in nodes:
            # Node status sent on create is not guaranteed to survive kwok's initialize stage
            # racing it, so capacity is (re)asserted through the status subresource.
            patch = json.dumps({"status": node["status"]})
            self.kubectl("patch", "node", node["metadata"]["name"], "--subresource=status", "--type=merge", "-p", patch)
        names = [f"node/{node['metadata']['name']}" for node in nodes]
        self.kubectl("wait", "--for=condition=Ready", *names, f"--timeout={int(timeout)}s")

    def _create(self, config: str, timeout: float) -> None:
        if self.cluster_dir.exists():  # stale, or started from another config
            self._down()
        self.workdir.mkdir(parents=True, exist_ok=True)
        write_fake_log(self._fake_log)
        self._config_file.write_text(config)
        # kwokctl picks each port by probing down from one fixed number (kwok pkg/utils/net), so two clusters created at
        # once (make test's three suites) chose the same ports, and the second one's kwok-controller never served
        # its nodes. One creation at a time on this machine: the next probes after the last one's ports are bound.
        with file_lock(self.workdir / ".create.lock"):
            self._kwokctl(
                binaries_dir(),
                "create",
                "cluster",
                "--kubeconfig=",  # never touch ~/.kube/config
                f"--wait={int(timeout)}s",
                f"--timeout={int(timeout)}s",
            )
        # The service-account controller creating `default` proves kube-controller-manager is up.
        deadline = time.monotonic() + timeout
        while self.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode:
            if time.monotonic() > deadline:
                raise TimeoutError("kube-controller-manager did not create the default ServiceAccount")
            time.sleep(0.5)

    def _stop_recorded_processes(self, grace: float = 5) -> None:
        pids = []
        for pid_file in (self.cluster_dir / "pids").glob("*.pid"):
            try:
                pid = int(pid_file.read_text().strip())
                # Only a process running a binary of this cluster is ours to stop.
                if str(self.cluster_dir) in Path(f"/proc/{pid}/cmdline").read_text():
                    os.kill(pid, signal.SIGTERM)
                    pids.append(pid)
            except (OSError, ValueError):
                continue
        deadline = time.monotonic() + grace
        for pid in pids:
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            if Path(f"/proc/{pid}").exists():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)

    def _kwokctl(self, folder: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KWOK_WORKDIR": str(self.workdir)}
        return run(
            [str(folder / "kwokctl"), f"--name={self.name}", f"--config={self._config_file}", *args],
            env=env,
            check=check,
        )


def restart_component(kubeconfig: Path, component: str = "kube-apiserver") -> None:
    """Crash one process of the local cluster whose kubeconfig is `kubeconfig` (SIGKILL) and start it
    again at once with the same command line, environment and folder, detached like kwokctl starts
    it (its log appended to, its pid file updated).

    For fault injection (tests, `bench.chaos`): every connection to it is reset, and new ones are
    refused until the new process listens, then answer 503 until it is ready. A crash rather than
    a graceful stop, so its port is free for the shortest time: on a shared machine another
    cluster being created could take it. Raises FileNotFoundError when `kubeconfig` is not a
    `colocgrpo-dev cluster`'s (no pid file beside it).
    """
    folder, pid_file, pid, command = _component_process(kubeconfig, component)
    proc = Path(f"/proc/{pid}")
    environment = dict(
        entry.split("=", 1) for entry in (proc / "environ").read_bytes().decode().split("\0") if "=" in entry
    )
    cwd = os.readlink(proc / "cwd")
    os.kill(pid, signal.SIGKILL)
    while proc.exists() and "zombie" not in _state(proc):
        time.sleep(0.01)
    port = next((int(arg.split("=", 1)[1]) for arg in command if arg.startswith("--secure-port=")), None)
    for _ in range(50):  # the killed process's socket may take a moment to be released
        if port is not None:
            _wait_bindable(port)
        with open(folder / "logs" / f"{component}.log", "ab") as log:
            started = subprocess.Popen(
                command,
                cwd=cwd,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        with contextlib.suppress(subprocess.TimeoutExpired):
            started.wait(timeout=2)  # it exits at once when its port is still taken
        if started.poll() is None:
            pid_file.write_text(str(started.pid))
            return
        time.sleep(0.2)
    raise RuntimeError(f"{component} did not start again: see {folder / 'logs' / f'{component}.log'}")


@contextlib.contextmanager
def paused_component(kubeconfig: Path, component: str) -> Iterator[None]:
    """Freeze one process of the local cluster whose kubeconfig is `kubeconfig` (SIGSTOP) for the
    `with` block, and let it go on afterwards (SIGCONT), even when the block raises.

    For fault injection: a controller that misses everything while it is frozen (its watches
    see nothing; on resuming they find the world changed), e.g. the garbage collector in
    kube-controller-manager. Raises FileNotFoundError when `kubeconfig` is not a
    `colocgrpo-dev cluster`'s.
    """
    _, _, pid, _ = _component_process(kubeconfig, component)
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def has_component(kubeconfig: Path, component: str) -> bool:
    """Whether the cluster of `kubeconfig` is a `colocgrpo-dev cluster` with that process, which
    `restart_component` and `paused_component` can act on."""
    return _pid_file(kubeconfig, component).is_file()


def component_state(kubeconfig: Path, component: str) -> str | None:
    """That process's state letter and resident memory ("S 412 MiB"; T is stopped, Z a zombie), or None when it
    is gone or its pid is another program's now."""
    try:
        _, _, pid, _ = _component_process(kubeconfig, component)
        status = Path(f"/proc/{pid}/status").read_text()
    except (OSError, ValueError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    state = fields.get("State", "?").split()[0]
    rss = fields.get("VmRSS", "").split()
    return f"{state} {int(rss[0]) // 1024} MiB" if rss and rss[0].isdigit() else state


def _pid_file(kubeconfig: Path, component: str) -> Path:
    return Path(kubeconfig).resolve().parent / "pids" / f"{component}.pid"


def _component_process(kubeconfig: Path, component: str) -> tuple[Path, Path, int, list[str]]:
    """The cluster folder, pid file, pid and command line of one process of the local cluster whose
    kubeconfig is `kubeconfig`. Raises FileNotFoundError when there is no pid file beside it, or
    its pid is another program's now."""
    folder = Path(kubeconfig).resolve().parent
    pid_file = _pid_file(kubeconfig, component)
    pid = int(pid_file.read_text().strip())
    command = [part for part in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0") if part]
    # Ours when its command line names a file of this cluster's folder: kwokctl's processes run its bin/ copies,
    # Kueue (built elsewhere) reads this cluster's kubeconfig. The slash keeps `<name>-solo`'s processes apart.
    if not any(f"{folder}/" in part for part in command):
        raise FileNotFoundError(f"pid {pid} of {pid_file} is not this cluster's {component}")
    return folder, pid_file, pid, command


def _wait_bindable(port: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
                return
            except OSError:
                time.sleep(0.05)


def _state(proc: Path) -> str:
    try:
        return (proc / "status").read_text().split("State:", 1)[1].split("\n", 1)[0].lower()
    except (OSError, IndexError):
        return "zombie"  # gone
