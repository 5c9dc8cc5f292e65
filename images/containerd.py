"""A containerd of our own: started with a given config, on its own root, state and socket, never the system's.

    with Containerd(root=cache / "containerd" / "root") as daemon:
        daemon.import_archive(archive, "docker.io/colocgrpo/trainer:0.1.0")
        daemon.ctr("run", "--rm", "docker.io/colocgrpo/trainer:0.1.0", "probe", "python", "-V")

The image tests run the built images through it with `ctr`; a local kubelet can start it with the CRI plugin on
(`cri=True` and its settings in `extra_config`). The root (images, snapshots) may live in the cache folder, so an
archive imported once stays imported; the state (sockets, running tasks) is a temporary folder removed by `stop`.
Everything the daemon would otherwise put elsewhere on the machine (`/opt/containerd`, `/run/containerd/fifo`) is
under one of the two. One daemon at a time may use a root: `start` holds a lock on it.

Needs root, containerd and runc (`apt-get install containerd runc`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Any

DEFAULT_NAMESPACE = "colocgrpo"
# Where containerd 1.6's shims put their sockets whatever the config says (`<state dir default>/s`).
SHIM_SOCKET_DIR = Path("/run/containerd/s")


def archive_manifest_digest(archive: Path) -> str:
    """The digest of the (one) image manifest an OCI archive's index.json names."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        if member is None:
            raise ValueError(f"{archive} has no index.json: not an OCI archive")
        index = json.load(member)
    manifests = index.get("manifests") or []
    if len(manifests) != 1:
        raise ValueError(f"{archive} holds {len(manifests)} manifests, not one image")
    return str(manifests[0]["digest"])


def chain_id(diff_ids: list[str]) -> str:
    """The OCI chain ID of a layer stack (image-spec config.md): the first diff ID, then sha256 of "<chain> <diff>"
    for each next one. containerd names a stack's committed snapshot by it."""
    chain = diff_ids[0]
    for diff in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {diff}".encode()).hexdigest()
    return chain


class Containerd:
    """One containerd daemon, its `ctr`, and the images it holds.

    Args:
        root: containerd's persistent folder (content store, snapshots, metadata).
        namespace: the containerd namespace `ctr` works in.
        cri: keep the CRI plugin (for a kubelet); off, the daemon serves `ctr` only.
        extra_config: TOML appended to the generated config (e.g. CRI plugin settings).
    """

    def __init__(self, root: Path, *, namespace: str = DEFAULT_NAMESPACE, cri: bool = False, extra_config: str = ""):
        self.root = Path(root)
        self.namespace = namespace
        self.cri = cri
        self.extra_config = extra_config
        # Unix socket paths are short (108 bytes): the state lives in a short temporary folder.
        self.state = Path(tempfile.mkdtemp(prefix="colocgrpo-ctrd-"))
        self.address = self.state / "containerd.sock"
        self.fifo_dir = self.state / "fifo"
        self.runc_root = self.state / "runc"
        self.log_path = self.state / "containerd.log"
        self._process: subprocess.Popen[bytes] | None = None
        self._lock: IO[str] | None = None
        self._made_shim_dirs: list[Path] = []

    def config_text(self) -> str:
        """containerd's config (version 2): every path under root or state."""
        disabled = [] if self.cri else ['"io.containerd.grpc.v1.cri"']
        return (
            "version = 2\n"
            f'root = "{self.root}"\n'
            f'state = "{self.state / "state"}"\n'
            f"disabled_plugins = [{', '.join(disabled)}]\n"
            "[grpc]\n"
            f'  address = "{self.address}"\n'
            "[plugins]\n"
            '  [plugins."io.containerd.internal.v1.opt"]\n'
            f'    path = "{self.root / "opt"}"\n'
        ) + self.extra_config

    def start(self, timeout: float = 60) -> None:
        """Start the daemon and wait until `ctr` reaches it; on failure, leave nothing running or held."""
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout: float) -> None:
        for tool in ("containerd", "ctr", "runc"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"{tool} is not installed: apt-get install containerd runc")
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = open(self.root.parent / f".{self.root.name}.lock", "w")  # noqa: SIM115 (held until stop)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.close()
            self._lock = None
            raise RuntimeError(f"another containerd is using {self.root}") from None
        # The shims' socket folder is fixed: note which of its folders are ours to remove at stop.
        self._made_shim_dirs = [p for p in (SHIM_SOCKET_DIR, *SHIM_SOCKET_DIR.parents[:-2]) if not p.exists()]
        config = self.state / "config.toml"
        config.write_text(self.config_text())
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                ["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"containerd exited ({self._process.returncode}):\n{self.log_tail()}")
            if self.address.exists() and self.ctr("version", check=False).returncode == 0:
                return
            time.sleep(0.2)
        raise TimeoutError(f"containerd did not answer on {self.address} within {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        if not self.log_path.is_file():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def ctr_command(self, *args: str) -> list[str]:
        """`ctr` on this daemon's socket and namespace, with `args`."""
        return ["ctr", "--address", str(self.address), "--namespace", self.namespace, *args]

    def run_command(self, *args: str) -> list[str]:
        """`ctr run` with this daemon's FIFO and runc folders (not the system's), then `args`: options, image, id,
        process."""
        return self.ctr_command("run", "--fifo-dir", str(self.fifo_dir), "--runc-root", str(self.runc_root), *args)

    def ctr(self, *args: str, check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
        """Run `ctr args`, capturing its output; with check, a failure raises with what ctr said."""
        result = subprocess.run(self.ctr_command(*args), capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()}")
        return result

    def image_digest(self, ref: str) -> str | None:
        """The digest of the manifest `ref` names here, or None when there is no such image."""
        listed = self.ctr("images", "ls", f"name=={ref}").stdout.splitlines()[1:]
        for line in listed:
            fields = line.split()
            if fields and fields[0] == ref:
                return fields[2]
        return None

    def import_archive(self, archive: Path, ref: str, *, keep_layers: bool = False) -> str:
        """Import (and unpack) the OCI archive whose image is named `ref`, unless that image is here already; then
        remove what no image uses any more. Returns the image's manifest digest.

        Unless `keep_layers`, the image's compressed layers are deleted once unpacked, as the CRI plugin's
        `discard_unpacked_layers` does: containers run from the unpacked snapshots, and the archive holds the layers
        (for the trainer image, 4 GB less). Such an image cannot be exported or pushed from this containerd."""
        digest = archive_manifest_digest(archive)
        if self.image_digest(ref) == digest and self.is_unpacked(digest):
            return digest
        # `ctr images import` names the new image before it unpacks it. Until then the snapshots of the layers the
        # old image shares with it (all but the last, after a code change) would belong to no image, and a garbage
        # collection in between deletes them under the unpacker ("parent snapshot ... does not exist"). A second
        # name keeps the old image, and so its snapshots, until the new one is unpacked.
        keeper = f"{ref}-previous"
        if self.image_digest(ref) is not None:
            self.ctr("images", "tag", "--force", ref, keeper)
        try:
            self.ctr("images", "import", "--snapshotter", "overlayfs", str(archive))
            if self.image_digest(ref) != digest or not self.is_unpacked(digest):
                raise RuntimeError(f"importing {archive} did not make {ref} name {digest}, unpacked")
            if not keep_layers:
                manifest = json.loads(self.ctr("content", "get", digest).stdout)
                self.ctr("content", "rm", *(layer["digest"] for layer in manifest["layers"]))
        finally:
            self.ctr("images", "rm", keeper, check=False)
        self.collect_garbage()
        return digest

    def is_unpacked(self, manifest_digest: str) -> bool:
        """Whether the image of `manifest_digest` has its whole root file system here as a committed snapshot: the one
        named by the chain ID of its config's layer diff IDs. An import interrupted before its unpack finished leaves
        the image named but not unpacked; a container cannot run from it."""
        manifest = self.ctr("content", "get", manifest_digest, check=False)
        if manifest.returncode != 0:
            return False
        config = self.ctr("content", "get", json.loads(manifest.stdout)["config"]["digest"], check=False)
        if config.returncode != 0:
            return False
        chain = chain_id(json.loads(config.stdout)["rootfs"]["diff_ids"])
        return self.ctr("snapshots", "--snapshotter", "overlayfs", "info", chain, check=False).returncode == 0

    def collect_garbage(self) -> None:
        """Delete the content and snapshots no image uses (an image replaced by a newer import)."""
        lease = self.ctr("leases", "create").stdout.split()[0]
        self.ctr("leases", "delete", "--sync", lease)

    def image_config(self, ref: str) -> dict[str, Any]:
        """The OCI image config of `ref` (User, Env, Entrypoint, Cmd, WorkingDir, Labels under "config")."""
        manifest = json.loads(self.ctr("content", "get", self._require(ref)).stdout)
        return dict(json.loads(self.ctr("content", "get", manifest["config"]["digest"]).stdout))

    def _require(self, ref: str) -> str:
        digest = self.image_digest(ref)
        if digest is None:
            raise RuntimeError(f"no image {ref} in {self.root}")
        return digest

    def remove_container(self, container_id: str) -> None:
        """Kill the container's task, if any, and delete both (quietly when they are gone already)."""
        self.ctr("tasks", "kill", "--signal", "SIGKILL", container_id, check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.ctr("tasks", "delete", container_id, check=False).returncode == 0 or not self._has_task(
                container_id
            ):
                break
            time.sleep(0.2)
        self.ctr("containers", "delete", container_id, check=False)

    def _has_task(self, container_id: str) -> bool:
        listed = self.ctr("tasks", "ls", check=False).stdout.splitlines()[1:]
        return any(line.split()[:1] == [container_id] for line in listed)

    def containers(self) -> list[str]:
        return [line.split()[0] for line in self.ctr("containers", "ls", "-q").stdout.splitlines() if line.strip()]

    def remove_leftovers(self) -> None:
        """Remove every container of the namespace and every active (not committed) overlayfs snapshot: what a run
        killed before its cleanup leaves in a kept root. A container's snapshot is keyed by the container's id, so
        one left behind would fail the next `ctr run` of that id with "snapshot ... already exists"."""
        for container_id in self.containers():
            self.remove_container(container_id)
        listed = self.ctr("snapshots", "--snapshotter", "overlayfs", "ls").stdout.splitlines()[1:]
        active = [fields[0] for fields in (line.split() for line in listed) if fields and fields[-1] == "Active"]
        if active:
            self.ctr("snapshots", "--snapshotter", "overlayfs", "rm", *active)

    def stop(self) -> None:
        """Remove every container of the namespace, stop the daemon, delete the state folder, release the root."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(RuntimeError):
                for container_id in self.containers():
                    self.remove_container(container_id)
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        shutil.rmtree(self.state, ignore_errors=True)
        for folder in self._made_shim_dirs:  # deepest first; only while empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def __enter__(self) -> Containerd:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
