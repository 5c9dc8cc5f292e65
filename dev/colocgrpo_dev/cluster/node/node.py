"""The dev cluster's real node: a kubelet on containerd, kube-proxy and the cluster DNS, in a network namespace of
its own (network.py), registered with the cluster's API server as `cpu-node-0`.

    node = RealNode.for_cluster("colocgrpo", cluster_dir, kubeconfig)
    node.start(network, api_port)        # relay, containerd, pause and CoreDNS images, kubelet, kube-proxy, CoreDNS
    node.import_image(archive, "docker.io/colocgrpo/trainer:0.1.0")
    node.stop()                          # containers, processes, mounts, network, state: all gone

Its processes run detached (they outlive the `cluster up` that started them), each with a pid file and a log
under `<cluster>/node/`, like kwokctl's; `stop` (from any process) ends them by those pids.

containerd's root, with the images unpacked (the trainer's alone is about 9 GB), is one folder for every cluster
of the machine, `<cache>/containerd/node`, and outlasts `stop`: an image is imported once, whichever cluster (the
demo's, the tests') runs it next. The node's containerd holds a lock on that root for as long as it runs; a node
started while another cluster's node holds it gets a root of its own, `<cache>/containerd/node-<cluster>`, which
`stop` removes, so no second copy of the images outlives its cluster.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from colocgrpo_dev.cluster.binaries import NodeBinaries
from colocgrpo_dev.cluster.commands import run
from colocgrpo_dev.cluster.node import dns, network, pki
from colocgrpo_dev.cluster.node.config import (
    COREDNS_IMAGE,
    CRI_NAMESPACE,
    NODE_NAME,
    PAUSE_IMAGE,
    REAL_NODE_LABEL,
    NodePaths,
    cni_network,
    containerd_config,
    dump,
    dump_json,
    kube_proxy_config,
    kubeconfig,
    kubelet_config,
)
from colocgrpo_dev.cluster.node.network import NodeNetwork
from colocgrpo_dev.cluster.node.oci import BinaryImage, write_archive
from colocgrpo_dev.cluster.paths import cache_dir

# Unix socket paths are at most 107 bytes; containerd's shims add their own names under the state folder.
MAX_SOCKET_PATH = 100
# The processes in start order; stop goes in reverse.
PROCESSES = ("relay", "containerd", "kubelet", "kube-proxy")
# The file in the node's state folder that names the containerd root its containerd runs on.
ROOT_RECORD = "containerd-root"


def shared_containerd_root() -> Path:
    """The containerd root every cluster's node uses when no other node holds it (the images, imported once)."""
    return cache_dir() / "containerd" / "node"


def own_containerd_root(cluster: str) -> Path:
    """The root a node gets while another cluster's node holds the shared one; removed with the node."""
    return cache_dir() / "containerd" / f"node-{cluster}"


def lock_root(root: Path) -> IO[str] | None:
    """An exclusive lock on containerd root `root` (the open lock file, `.<root name>.lock` beside it, as the image
    tests' containerd takes it), or None while another process holds it."""
    root.parent.mkdir(parents=True, exist_ok=True)
    handle = open(root.parent / f".{root.name}.lock", "w")  # noqa: SIM115 (handed to containerd, then closed)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


class NodeStartError(RuntimeError):
    """The real node did not come up; the message names the step and ends with its log."""


@dataclass
class RealNode:
    """One cluster's real node. `paths` are its folders; `kubectl` runs against its cluster as admin."""

    cluster: str
    paths: NodePaths
    admin_kubeconfig: Path
    cluster_pki: Path
    _started: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    @classmethod
    def for_cluster(cls, cluster: str, cluster_dir: Path, admin_kubeconfig: Path) -> RealNode:
        """The node of cluster `cluster`; its containerd root is the one its running containerd was given (recorded
        in its state folder), else the shared one."""
        state = cluster_dir / "node"
        recorded = state / ROOT_RECORD
        paths = NodePaths(
            state=state,
            containerd_root=Path(recorded.read_text().strip()) if recorded.is_file() else shared_containerd_root(),
            network_file=cluster_dir.parent.parent / f"{cluster}.node-network.json",
        )
        return cls(cluster=cluster, paths=paths, admin_kubeconfig=admin_kubeconfig, cluster_pki=cluster_dir / "pki")

    def create_network(self, lock_file: Path) -> NodeNetwork:
        """Make the node's network (network.create) and record it at once, so `stop` finds it whatever fails next."""
        made = network.create(self.cluster, lock_file)
        self.paths.network_file.parent.mkdir(parents=True, exist_ok=True)
        self.paths.network_file.write_text(made.to_json())
        return made

    # -- state -----------------------------------------------------------------------------------

    def network(self) -> NodeNetwork | None:
        """The node's network, when it was made and still exists."""
        if not self.paths.network_file.is_file():
            return None
        found = NodeNetwork.from_json(self.paths.network_file.read_text())
        return found if network.netns_exists(found.netns) else None

    def running(self) -> dict[str, bool]:
        """Whether each of the node's processes is alive."""
        return {name: self._pid(name) is not None for name in PROCESSES}

    def settings(self, binaries: NodeBinaries, node_network: NodeNetwork) -> str:
        """A digest of everything the node is started from: its binaries, its configuration and the DNS objects.
        A node started from other settings is stale (`healthy(settings)` says no)."""
        documents = [
            str(binaries.folder),
            containerd_config(self.paths),
            dump_json(cni_network(self.paths)),
            dump(kubelet_config(self.paths, node_network, self.cluster_pki / "ca.crt")),
            dump(kube_proxy_config(node_network, self.paths.state / "kube-proxy.kubeconfig")),
            yaml.safe_dump_all(dns.manifests()),
        ]
        return hashlib.sha256("\0".join(documents).encode()).hexdigest()

    def healthy(self, settings: str | None = None) -> bool:
        """All processes alive, the Node Ready and, given `settings`, started from them."""
        if not all(self.running().values()):
            return False
        settings_file = self.paths.state / "settings.sha256"
        if settings is not None and (not settings_file.is_file() or settings_file.read_text() != settings):
            return False
        probe = self._kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if probe.returncode:
            return False
        conditions = json.loads(probe.stdout).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, binaries: NodeBinaries, node_network: NodeNetwork, api_port: int, timeout: float = 180) -> None:
        """Bring the node up on `node_network` (made by network.create) against the API server on 127.0.0.1:`api_port`,
        and wait until it is Ready and the cluster DNS answers. Raises NodeStartError naming the step that failed."""
        if len(str(self.paths.socket)) > MAX_SOCKET_PATH:
            raise NodeStartError(f"containerd's socket path is too long for a unix socket: {self.paths.socket}")
        deadline = time.monotonic() + timeout
        root_lock = self._claim_root()
        try:
            self._write_files(node_network, api_port)
            (self.paths.state / "settings.sha256").write_text(self.settings(binaries, node_network))
            inside = network.in_netns(node_network)
            # The relay is this checkout's module, whatever copy of the developer tools the interpreter has installed.
            tools = str(Path(__file__).resolve().parents[3])
            self._spawn(
                "relay",
                [
                    sys.executable,
                    "-m",
                    "colocgrpo_dev.cluster.node.relay",
                    node_network.host_ip,
                    str(api_port),
                    "127.0.0.1",
                    str(api_port),
                ],
                env=dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tools, os.environ.get("PYTHONPATH")]))),
            )
            # containerd inherits the root's lock and holds it until it exits.
            self._spawn(
                "containerd",
                [*inside, "containerd", "--config", str(self.paths.containerd_config)],
                pass_fds=(root_lock.fileno(),),
            )
        finally:
            root_lock.close()  # containerd holds it now (or, on failure, nothing does)
        self._wait(
            "containerd",
            lambda: self.paths.socket.exists() and self._ctr("version", check=False).returncode == 0,
            deadline,
        )
        for image in self._system_images(binaries):
            self.import_image(image[0], image[1])
        self._spawn(
            "kubelet",
            [
                *inside,
                str(binaries["kubelet"]),
                f"--config={self.paths.state / 'kubelet.yaml'}",
                f"--kubeconfig={self.paths.state / 'kubelet.kubeconfig'}",
                f"--root-dir={self.paths.kubelet_dir}",
                f"--cert-dir={self.paths.pki / 'kubelet-serving'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={node_network.node_ip}",
                f"--node-labels={REAL_NODE_LABEL}=true",
            ],
        )
        self._wait("kubelet", self._node_ready, deadline)
        self._spawn(
            "kube-proxy",
            [*inside, str(binaries["kube-proxy"]), f"--config={self.paths.state / 'kube-proxy.yaml'}"],
        )
        self._kubectl("apply", "-f", "-", input=yaml.safe_dump_all(dns.manifests()))
        remaining = max(1, int(deadline - time.monotonic()))
        done = self._kubectl(
            "-n", dns.NAMESPACE, "rollout", "status", f"deployment/{dns.NAME}", f"--timeout={remaining}s", check=False
        )
        if done.returncode:
            raise NodeStartError(f"CoreDNS did not become ready: {done.stderr.strip()}\n{self._pods_summary()}")

    def stop(self) -> None:
        """End every container and process of the node, unmount what it mounted, remove its network and state.
        Safe to call on a node that is half started, already stopped, or was never started."""
        for name in ("kubelet", "kube-proxy", "relay"):
            self._terminate(name)
        if self._pid("containerd") is not None:
            self._remove_containers()
        self._terminate("containerd")
        self._kill_leftover_shims()
        self._unmount_all(self.paths.state)
        if self.paths.containerd_root != shared_containerd_root() and self.paths.containerd_root.exists():
            # A root of the node's own (the shared one was held): its copy of the images goes with it.
            self._unmount_all(self.paths.containerd_root)
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.paths.containerd_root)], check=False)
        found = (
            NodeNetwork.from_json(self.paths.network_file.read_text()) if self.paths.network_file.is_file() else None
        )
        if found is not None:
            network.delete(found)
            self.paths.network_file.unlink(missing_ok=True)
        if self.paths.state.exists():
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.paths.state)], check=False)

    def _claim_root(self) -> IO[str]:
        """Lock the shared containerd root, or else a root of this node's own, and record which in the state
        folder; returns the held lock, for containerd to inherit."""
        handle = lock_root(shared_containerd_root())
        root = shared_containerd_root()
        if handle is None:
            root = own_containerd_root(self.cluster)
            print(
                f"==> another cluster's real node holds {shared_containerd_root()}: this node imports its images "
                f"into {root}, removed when it stops",
                file=sys.stderr,
                flush=True,
            )
            handle = lock_root(root)
            if handle is None:
                raise NodeStartError(f"another containerd is using {root}: is this cluster's node starting twice?")
        self.paths = NodePaths(state=self.paths.state, containerd_root=root, network_file=self.paths.network_file)
        self.paths.state.mkdir(parents=True, exist_ok=True)
        (self.paths.state / ROOT_RECORD).write_text(str(root))
        return handle

    # -- images ----------------------------------------------------------------------------------

    def import_image(self, archive: Path, reference: str) -> str:
        """Import the OCI archive as `reference` into the node's runtime (where the kubelet looks), unless it holds
        that very image already; returns the manifest digest.

        Once unpacked, the image's compressed layers are deleted, as the CRI plugin's `discard_unpacked_layers` does
        for pulled images: containers run from the snapshots, and the archive keeps the layers (for the trainer
        image, 4 GB less in the node's root). Then whatever no image uses any more (a replaced image) goes."""
        digest = _archive_digest(archive)
        if self.image_digest(reference) != digest:
            self._ctr("images", "import", "--snapshotter", "overlayfs", str(archive), timeout=1800)
            if self.image_digest(reference) != digest:
                raise NodeStartError(f"importing {archive} did not give {reference} the digest {digest}")
            manifest = json.loads(self._ctr("content", "get", digest).stdout)
            self._ctr("content", "rm", *(layer["digest"] for layer in manifest["layers"]))
            lease = self._ctr("leases", "create").stdout.split()[0]
            self._ctr("leases", "delete", "--sync", lease)  # a synchronous garbage collection
        return digest

    def import_archive(self, archive: Path) -> str:
        """Import an OCI archive under the name its index gives its image (`org.opencontainers.image.ref.name`, a
        full reference as `images/build.py` writes it); returns that reference."""
        reference = _archive_reference(archive)
        self.import_image(archive, reference)
        return reference

    def image_digest(self, reference: str) -> str | None:
        listed = self._ctr("images", "ls", f"name=={reference}").stdout.splitlines()[1:]
        for line in listed:
            fields = line.split()
            if fields and fields[0] == reference:
                return fields[2]
        return None

    # -- containers ------------------------------------------------------------------------------

    def kill_container(self, container_id: str, signal_name: str = "SIGKILL") -> None:
        """Signal a container's process from the runtime, behind the kubelet's back (a crash, the OOM killer)."""
        self._ctr("tasks", "kill", "--signal", signal_name, container_id)

    def pod_containers(self, namespace: str) -> list[str]:
        """The runtime's containers (sandboxes included) of pods in `namespace`, by the kubelet's labels."""
        selector = f'labels."io.kubernetes.pod.namespace"=={namespace}'
        return self._ctr("containers", "ls", "-q", selector).stdout.split()

    def _system_images(self, binaries: NodeBinaries) -> list[tuple[Path, str]]:
        """The pause and CoreDNS images, made from the node's binaries into archives beside them (once)."""
        images = [
            BinaryImage(PAUSE_IMAGE, binaries["pause"]),
            BinaryImage(COREDNS_IMAGE, binaries["coredns"]),
        ]
        archives = []
        for image in images:
            archive = binaries.folder / "images" / f"{image.binary.name}.oci.tar"
            if not archive.is_file():
                write_archive(image, archive)
            archives.append((archive, image.reference))
        return archives

    # -- pieces ----------------------------------------------------------------------------------

    def _write_files(self, node_network: NodeNetwork, api_port: int) -> None:
        paths = self.paths
        for folder in (
            paths.run,
            paths.cni_conf_dir,
            paths.cni_ipam_dir,
            paths.kubelet_dir,
            paths.pod_logs,
            paths.pids,
            paths.logs,
            paths.containerd_root,
        ):
            folder.mkdir(parents=True, exist_ok=True)
        paths.resolv_conf.write_text("")
        ca_cert, ca_key = self.cluster_pki / "ca.crt", self.cluster_pki / "ca.key"
        server = f"https://{node_network.host_ip}:{api_port}"
        for name, subject, config_name in (
            ("kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}", "kubelet.kubeconfig"),
            ("kube-proxy", "/CN=system:kube-proxy", "kube-proxy.kubeconfig"),
        ):
            cert, key = pki.client_certificate(paths.pki, name, subject, ca_cert, ca_key)
            (paths.state / config_name).write_text(dump(kubeconfig(server, ca_cert, cert, key, name)))
        paths.containerd_config.write_text(containerd_config(paths))
        (paths.cni_conf_dir / "10-colocgrpo.conflist").write_text(dump_json(cni_network(paths)))
        (paths.state / "kubelet.yaml").write_text(dump(kubelet_config(paths, node_network, ca_cert)))
        (paths.state / "kube-proxy.yaml").write_text(
            dump(kube_proxy_config(node_network, paths.state / "kube-proxy.kubeconfig"))
        )

    def _spawn(
        self, name: str, command: list[str], env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = ()
    ) -> None:
        log = self.paths.logs / f"{name}.log"
        with open(log, "ab") as out:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                pass_fds=pass_fds,
            )
        (self.paths.pids / f"{name}.pid").write_text(str(process.pid))
        self._started[name] = process

    def _wait(self, name: str, ready: Callable[[], bool], deadline: float) -> None:
        """Wait until `ready()`, while every process started so far stays alive."""
        while not ready():
            for started, process in self._started.items():
                if process.poll() is not None:
                    raise NodeStartError(
                        f"{started} exited ({process.returncode}) while {name} was starting:\n{self.log_tail(started)}"
                    )
            if time.monotonic() > deadline:
                raise NodeStartError(f"{name} was not ready in time:\n{self.log_tail(name)}")
            time.sleep(0.3)

    def _node_ready(self) -> bool:
        probe = self._kubectl(
            "get", "node", NODE_NAME, "-o", "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False
        )
        return probe.returncode == 0 and probe.stdout.strip() == "True"

    def log_tail(self, name: str, lines: int = 25) -> str:
        log = self.paths.logs / f"{name}.log"
        if not log.is_file():
            return f"(no log at {log})"
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def _pods_summary(self) -> str:
        return self._kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout

    def _pid(self, name: str) -> int | None:
        """The pid of the node's `name` process, when it is alive and still that program (by its command line
        naming this node's state folder, or for the relay, this node's address)."""
        pid_file = self.paths.pids / f"{name}.pid"
        try:
            pid = int(pid_file.read_text().strip())
            command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            return None
        if status == "Z":
            return None
        if not command:  # in the middle of an exec (nsenter becoming the program): alive, and ours
            return pid
        marker = str(self.paths.state) if name != "relay" else "colocgrpo_dev.cluster.node.relay"
        return pid if marker in command else None

    def _terminate(self, name: str, grace: float = 20) -> None:
        pid = self._pid(name)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self._pid(name) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        if self._pid(name) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _ctr(self, *args: str, check: bool = True, timeout: float | None = 120) -> subprocess.CompletedProcess[str]:
        command = ["ctr", "--address", str(self.paths.socket), "--namespace", CRI_NAMESPACE, *args]
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode:
            raise NodeStartError(f"ctr {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done

    def _remove_containers(self) -> None:
        """SIGKILL every task of the CRI namespace (pods and their sandboxes) and delete them, so no container
        outlives its runtime."""
        listed = self._ctr("tasks", "ls", check=False).stdout.splitlines()[1:]
        tasks = [line.split()[0] for line in listed if line.strip()]
        for task in tasks:
            self._ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
        deadline = time.monotonic() + 30
        for task in tasks:
            while self._ctr("tasks", "delete", task, check=False).returncode and time.monotonic() < deadline:
                if task not in self._ctr("tasks", "ls", "-q", check=False).stdout.split():
                    break
                time.sleep(0.2)

    def _kill_leftover_shims(self) -> None:
        """containerd's shims outlive it by design; a shim started by this node's containerd names its socket."""
        socket = str(self.paths.socket)
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                command = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if command and command[0].endswith("containerd-shim-runc-v2") and socket in command:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)

    @staticmethod
    def _unmount_all(folder: Path) -> None:
        """Lazily unmount every mount point under `folder` (secrets and tokens the kubelet mounted, containers'
        root file systems, pods' network namespaces), deepest first."""
        prefix = str(folder.resolve()) + "/"
        points = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                points.append(point)
        for point in sorted(set(points), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True, check=False)

    def _kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        from colocgrpo_dev.cluster.binaries import kubectl_path

        return run([str(kubectl_path()), f"--kubeconfig={self.admin_kubeconfig}", *args], input=input, check=check)


def _archive_manifest(archive: Path) -> dict[str, Any]:
    """The index entry of the (one) image manifest an OCI archive holds."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{archive} has no index.json: not an OCI archive")
        manifests = json.load(member).get("manifests") or []
    if len(manifests) != 1:
        raise ValueError(f"{archive} holds {len(manifests)} manifests, not one image")
    return dict(manifests[0])


def _archive_digest(archive: Path) -> str:
    return str(_archive_manifest(archive)["digest"])


def _archive_reference(archive: Path) -> str:
    reference = (_archive_manifest(archive).get("annotations") or {}).get("org.opencontainers.image.ref.name")
    if not reference or "/" not in reference:
        raise ValueError(f"{archive} names no full image reference (org.opencontainers.image.ref.name)")
    return str(reference)
