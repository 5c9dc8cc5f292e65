"""A kubelet's part for one container, done with containerd's `ctr run`: what a rendered pod spec says (command,
env, volumes, security context, limits), translated into `ctr run` arguments and host folders, for the image tests.

What `ctr` 1.6 cannot say is checked instead of dropped: it has no `--user`, so the pod's `runAsUser`/`runAsGroup`
must be the image's own USER (`ctr` runs that); `fsGroup` cannot add a group, so the folders standing in for volumes
are made writable for everyone, as an emptyDir is. Not translated: ports (the container gets its own network
namespace with only loopback, which is all a one-pod job uses), probes, and the service-account token (there is no
API server; the trainer then only prints its progress).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# containerd's default capability set (oci.WithDefaultSpec): what `capabilities.drop: [ALL]` has to drop.
DEFAULT_CAPABILITIES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
)
_BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def memory_bytes(quantity: str | int) -> int:
    """A Kubernetes memory quantity ("2Gi", "512Mi", "1G", "1048576") in bytes."""
    text = str(quantity)
    for suffixes in (_BINARY_SUFFIXES, _DECIMAL_SUFFIXES):
        for suffix, factor in suffixes.items():
            if text.endswith(suffix):
                return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def cpu_cores(quantity: str | int | float) -> float:
    """A Kubernetes CPU quantity ("1", "500m", 2) in cores."""
    text = str(quantity)
    return int(text[:-1]) / 1000 if text.endswith("m") else float(text)


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion: a defined variable is replaced, `$$` is a literal `$`, the rest stays."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", replace, value)


@dataclass(frozen=True)
class PodIdentity:
    """What the API server would have filled in: the pod's name, namespace and annotations (for fieldRefs)."""

    name: str
    namespace: str
    annotations: dict[str, str] = field(default_factory=dict)

    def field(self, path: str) -> str:
        if path == "metadata.name":
            return self.name
        if path == "metadata.namespace":
            return self.namespace
        match = re.fullmatch(r"metadata\.annotations\['([^']+)'\]", path)
        if match and match.group(1) in self.annotations:
            return self.annotations[match.group(1)]
        raise ValueError(f"fieldRef {path} is not known to this translation")


def container_env(container: dict[str, Any], pod: PodIdentity) -> dict[str, str]:
    """The container's environment as the kubelet sets it: values, fieldRefs, `$(VAR)` of earlier entries; the last
    duplicate wins. Secret references cannot be resolved here and raise."""
    env: dict[str, str] = {}
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)
        elif "fieldRef" in item.get("valueFrom", {}):
            env[item["name"]] = pod.field(item["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            raise ValueError(f"env {item['name']}: only value and fieldRef are translated, got {item}")
    return env


def process_args(container: dict[str, Any], image_config: dict[str, Any], env: dict[str, str]) -> list[str]:
    """The process the container runs: `command` replaces the image's ENTRYPOINT, `args` its CMD (Kubernetes'
    rules), `$(VAR)` expanded."""
    config = image_config.get("config", {})
    command = container.get("command")
    args = container.get("args")
    if command is not None:
        words = [*command, *(args or [])]
    else:
        words = [*(config.get("Entrypoint") or []), *(args if args is not None else config.get("Cmd") or [])]
    return [expand(word, env) for word in words]


def prepare_volumes(pod_spec: dict[str, Any], workdir: Path, config_maps: dict[str, dict[str, str]]) -> dict[str, Path]:
    """A host folder for each volume of the pod (an emptyDir on memory gets none: it becomes a tmpfs):
    a configMap's keys as files, an emptyDir or claim as an empty folder everyone may write (as emptyDir is; fsGroup
    cannot be given with ctr)."""
    folders = {}
    for volume in pod_spec.get("volumes") or []:
        name = volume["name"]
        if volume.get("emptyDir", {}).get("medium") == "Memory":
            continue
        folder = workdir / "volumes" / name
        folder.mkdir(parents=True)
        if "configMap" in volume:
            data = config_maps[volume["configMap"]["name"]]
            for key, text in data.items():
                (folder / key).write_text(text)
            folder.chmod(0o755)
        elif "emptyDir" in volume or "persistentVolumeClaim" in volume:
            folder.chmod(0o777)
        else:
            raise ValueError(f"volume {name}: only configMap, emptyDir and persistentVolumeClaim are translated")
        folders[name] = folder
    return folders


def _security(pod_spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The container's effective security context: the pod's, overridden by the container's."""
    return {**(pod_spec.get("securityContext") or {}), **(container.get("securityContext") or {})}


def check_user(pod_spec: dict[str, Any], container: dict[str, Any], image_user: str) -> None:
    """`ctr` runs the image's USER: the pod's runAsUser/runAsGroup must be that user, and runAsNonRoot must hold."""
    security = _security(pod_spec, container)
    uid, _, gid = image_user.partition(":")
    if "runAsUser" in security and str(security["runAsUser"]) != uid:
        raise ValueError(f"the pod runs as uid {security['runAsUser']}, the image as {image_user}: ctr cannot switch")
    if "runAsGroup" in security and str(security["runAsGroup"]) != gid:
        raise ValueError(f"the pod runs as gid {security['runAsGroup']}, the image as {image_user}: ctr cannot switch")
    if security.get("runAsNonRoot") and (not uid.isdigit() or int(uid) == 0):
        raise ValueError(f"runAsNonRoot needs a numeric non-root image user, the image's is {image_user!r}")


def ctr_run_args(
    pod_spec: dict[str, Any],
    container: dict[str, Any],
    *,
    image: str,
    image_config: dict[str, Any],
    pod: PodIdentity,
    volumes: dict[str, Path],
    termination_log: Path,
    read_only_root: bool = False,
    extra_mounts: tuple[tuple[Path, str], ...] = (),
) -> list[str]:
    """`ctr run` options, then the image, for the container of a rendered pod (the caller adds the container id and
    the process: `process_args`). `volumes` comes from `prepare_volumes`; `read_only_root` makes the root filesystem
    read-only even where the pod does not ask for it; `extra_mounts` are read-only (host path, container path)."""
    check_user(pod_spec, container, image_config.get("config", {}).get("User", "0"))
    security = _security(pod_spec, container)
    declared = {volume["name"]: volume for volume in pod_spec.get("volumes") or []}
    options: list[str] = []
    for mount in container.get("volumeMounts") or []:
        name, target = mount["name"], mount["mountPath"]
        if name not in declared:
            raise ValueError(f"volumeMount {name} names no volume of the pod")
        empty_dir = declared[name].get("emptyDir") or {}
        if empty_dir.get("medium") == "Memory":
            size = f":size={memory_bytes(empty_dir['sizeLimit'])}" if "sizeLimit" in empty_dir else ""
            options += ["--mount", f"type=tmpfs,src=tmpfs,dst={target},options=nosuid:nodev:mode=1777{size}"]
            continue
        access = "ro" if mount.get("readOnly") else "rw"
        options += ["--mount", f"type=bind,src={volumes[name]},dst={target},options=rbind:{access}"]
    for source, target in extra_mounts:
        options += ["--mount", f"type=bind,src={source},dst={target},options=rbind:ro"]
    if "terminationMessagePath" in container:
        options += [
            "--mount",
            f"type=bind,src={termination_log},dst={container['terminationMessagePath']},options=rbind:rw",
        ]
    env = container_env(container, pod)
    options += [f"--env={name}={value}" for name, value in env.items()]
    if read_only_root or security.get("readOnlyRootFilesystem"):
        options.append("--read-only")
    if "ALL" in ((security.get("capabilities") or {}).get("drop") or []):
        options += [f"--cap-drop={capability}" for capability in DEFAULT_CAPABILITIES]
    if (security.get("seccompProfile") or {}).get("type") == "RuntimeDefault":
        options.append("--seccomp")
    if security.get("allowPrivilegeEscalation") is True:
        options.append("--allow-new-privs")
    limits = (container.get("resources") or {}).get("limits") or {}
    if "memory" in limits:
        options.append(f"--memory-limit={memory_bytes(limits['memory'])}")
    if "cpu" in limits:
        options.append(f"--cpus={cpu_cores(limits['cpu'])}")
    return [*options, image]


class CtrPod:
    """One container of a rendered pod, run with `ctr run` on a tests' containerd (images.containerd.Containerd):
    its volumes as host folders under `workdir`, its root filesystem read-only.

    Args:
        containerd: the daemon (it holds `image`).
        workdir: where the volumes' folders and the termination log go.
        pod_spec: the rendered pod spec (a Job's template spec, a Deployment's).
        container: the container of it to run.
        image: the image reference to run (the rendered one may name another registry or tag).
        pod: the pod's name, namespace and annotations, for fieldRefs.
        config_maps: name -> data of the ConfigMaps the pod mounts.
    """

    def __init__(
        self,
        containerd: Any,
        workdir: Path,
        pod_spec: dict[str, Any],
        container: dict[str, Any],
        *,
        image: str,
        pod: PodIdentity,
        config_maps: dict[str, dict[str, str]] | None = None,
    ):
        self.containerd = containerd
        self.pod_spec = pod_spec
        self.container = container
        self.image = image
        self.pod = pod
        self.image_config = containerd.image_config(image)
        self.volumes = prepare_volumes(pod_spec, workdir, config_maps or {})
        self.termination_log = workdir / "termination-log"
        self.termination_log.touch()
        self.termination_log.chmod(0o666)  # as the kubelet creates it: writable for any user
        self._runs = 0

    def command(
        self,
        container_id: str,
        *,
        command: list[str] | None = None,
        args: list[str] | None = None,
        extra_mounts: tuple[tuple[Path, str], ...] = (),
    ) -> list[str]:
        """The `ctr run --rm` command line for the container, its `command` or `args` replaced when given."""
        container = dict(self.container)
        if command is not None:
            container["command"], container["args"] = command, []
        elif args is not None:
            container["args"] = args
        options = ctr_run_args(
            self.pod_spec,
            container,
            image=self.image,
            image_config=self.image_config,
            pod=self.pod,
            volumes=self.volumes,
            termination_log=self.termination_log,
            read_only_root=True,
            extra_mounts=extra_mounts,
        )
        process = process_args(container, self.image_config, container_env(container, self.pod))
        return self.containerd.run_command("--rm", *options, container_id, *process)

    def container_id(self) -> str:
        self._runs += 1
        return f"{self.pod.name}-{self._runs}"

    def run(self, timeout: float = 600, **overrides: Any) -> subprocess.CompletedProcess[str]:
        """Run the container to its end; its output and exit code."""
        container_id = self.container_id()
        try:
            return subprocess.run(
                self.command(container_id, **overrides), capture_output=True, text=True, timeout=timeout
            )
        finally:
            self.containerd.remove_container(container_id)  # a timed-out run leaves nothing behind

    def start(self, **overrides: Any) -> tuple[str, subprocess.Popen[str]]:
        """Start the container, its stdout a pipe (stderr merged); (container id, the `ctr run` process)."""
        container_id = self.container_id()
        process = subprocess.Popen(
            self.command(container_id, **overrides), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        return container_id, process
