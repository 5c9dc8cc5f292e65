"""What the cluster looked like when a test failed: the namespace's pods, the nodes' load, and the errors
the scheduler and KWOK logged. Printed by the test suites' failure hooks, so that a failure on a CI
machine (whose cluster is gone afterwards) says whether a pod was unscheduled, unplayed by KWOK or
never created."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

from colocgrpo_dev.cluster.binaries import kubectl_path

COMPONENT_LOGS = ("kwok-controller", "kube-scheduler", "kube-controller-manager")


def snapshot(kubeconfig: Path, namespace: str, log_lines: int = 15) -> str:
    """A readable report of `namespace`'s pods and events, every node's pod count and Ready condition, and
    the last `log_lines` error lines of each component this `colocgrpo-dev cluster` keeps a log of. Never
    raises: what could not be read says why instead."""
    parts = [pod_lines(kubeconfig, namespace), _events(kubeconfig, namespace), health(kubeconfig)]
    folder = Path(kubeconfig).resolve().parent / "logs"
    for component in COMPONENT_LOGS:
        parts.append(_log_errors(folder / f"{component}.log", log_lines))
    return "\n".join(part for part in parts if part)


def _get(kubeconfig: Path, *args: str) -> dict[str, Any] | str:
    try:
        result = subprocess.run(
            [str(kubectl_path()), f"--kubeconfig={kubeconfig}", "get", *args, "-o", "json", "--request-timeout=10s"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"kubectl get {' '.join(args)}: {error}"
    if result.returncode != 0:
        return f"kubectl get {' '.join(args)}: {result.stderr.strip()[:300]}"
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def pod_lines(kubeconfig: Path, namespace: str) -> str:
    """One line per pod of `namespace`: phase, node, creation, every condition with its reason, deletion; at the
    top of a timeout's message it tells an unscheduled pod (the scheduler), a bound but Pending one (KWOK) and a
    Running one (the watcher's view) apart."""
    listing = _get(kubeconfig, "pods", "-n", namespace)
    if isinstance(listing, str):
        return f"--- pods in {namespace}: {listing}"
    lines = [f"--- pods in {namespace} ({len(listing['items'])})"]
    for pod in listing["items"]:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        conditions = ",".join(
            f"{c['type']}={c['status']}{'(' + c['reason'] + ')' if c.get('reason') else ''}"
            for c in status.get("conditions") or []
        )
        deleting = f" deleting-since={meta['deletionTimestamp']}" if meta.get("deletionTimestamp") else ""
        lines.append(
            f"{meta['name']} phase={status.get('phase')} node={spec.get('nodeName') or '-'} "
            f"created={meta.get('creationTimestamp')} [{conditions}]{deleting}"
        )
    return "\n".join(lines)


def _events(kubeconfig: Path, namespace: str, last: int = 15) -> str:
    listing = _get(kubeconfig, "events", "-n", namespace)
    if isinstance(listing, str):
        return f"--- events in {namespace}: {listing}"
    events = sorted(listing["items"], key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")[-last:]
    lines = [f"--- last {len(events)} events in {namespace}"]
    for event in events:
        involved = event.get("involvedObject") or {}
        lines.append(
            f"{event.get('lastTimestamp') or event.get('eventTime')} {event.get('type')} {event.get('reason')} "
            f"{involved.get('kind')}/{involved.get('name')}: {(event.get('message') or '')[:200]}"
        )
    return "\n".join(lines)


# Error lines that say nothing of a failure: KWOK deleting a pod someone deleted first.
_BENIGN = re.compile(r"failed to delete pod [^ ]+: pods? \\?\"[^\"\\]+\\?\" not found")


def _log_errors(path: Path, last: int) -> str:
    if not path.is_file():
        return ""
    try:
        with path.open("rb") as log:
            log.seek(max(0, path.stat().st_size - 2_000_000))
            tail = log.read().decode(errors="replace").splitlines()
    except OSError as error:
        return f"--- {path.name}: {error}"
    errors = [
        line[:400]
        for line in tail
        if ('"level":"ERROR"' in line or line[:1] in ("E", "F")) and not _BENIGN.search(line)
    ]
    if not errors:
        return f"--- {path.name}: no error lines in its last 2 MB"
    return f"--- {path.name}: last {min(last, len(errors))} of {len(errors)} error lines\n" + "\n".join(errors[-last:])


def health(kubeconfig: Path) -> str:
    """One short paragraph for a timeout's message, read first in a CI log that keeps only part of the output:
    which control-plane processes of this cluster are alive, each node's readiness, taints, pods and CPU
    requested, and how many pods are unscheduled or stuck deleting. Never raises."""
    lines = [processes(kubeconfig)]
    nodes = _get(kubeconfig, "nodes")
    pods = _get(kubeconfig, "pods", "-A")
    if isinstance(nodes, str) or isinstance(pods, str):
        lines.append(nodes if isinstance(nodes, str) else str(pods))
        return "\n".join(lines)
    on_node: Counter[str] = Counter()
    cpu: Counter[str] = Counter()
    for pod in pods["items"]:
        node = (pod.get("spec") or {}).get("nodeName") or "(unscheduled)"
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        on_node[node] += 1
        for container in (pod.get("spec") or {}).get("containers") or []:
            cpu[node] += _millicores(((container.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
    deleting = sum(1 for p in pods["items"] if p["metadata"].get("deletionTimestamp"))
    for node in nodes["items"]:
        name = node["metadata"]["name"]
        ready = next((c["status"] for c in node["status"].get("conditions") or [] if c["type"] == "Ready"), "?")
        taints = ",".join(f"{t.get('key')}:{t.get('effect')}" for t in (node.get("spec") or {}).get("taints") or [])
        allocatable = node["status"].get("allocatable") or {}
        lines.append(
            f"node {name}: Ready={ready} taints=[{taints}] active pods {on_node[name]}/{allocatable.get('pods', '?')} "
            f"cpu requested {cpu[name] / 1000:g}/{allocatable.get('cpu', '?')}"
        )
    unscheduled = on_node["(unscheduled)"]
    lines.append(f"pods: {len(pods['items'])} in the cluster, {unscheduled} unscheduled, {deleting} deleting")
    return "\n".join(lines)


def processes(kubeconfig: Path) -> str:
    """Two lines on this `colocgrpo-dev cluster`'s processes: each one's state and memory, whether each listens
    on its own port, and the free disk space; then, for each one found dead, the end of its log (`last_words`).
    Reads /proc and the logs only (no API call): it answers when the API does not."""
    from colocgrpo_dev.cluster.cluster import component_state

    folder = Path(kubeconfig).resolve().parent
    names = sorted(p.stem for p in (folder / "pids").glob("*.pid")) if (folder / "pids").is_dir() else []
    found = {name: component_state(Path(kubeconfig), name) for name in names}
    states = ", ".join(f"{name} {state or 'DEAD'}" for name, state in found.items())
    report = (
        f"cluster health (process state, RSS): {states or 'no pid files (not a colocgrpo-dev cluster)'}\n"
        f"ports: {port_owners(folder, names)}; {disk_free(folder)}"
    )
    dead = [last_words(folder, name) for name, state in found.items() if state is None]
    return "\n".join([report, *dead])


def last_words(folder: Path, name: str, lines: int = 8) -> str:
    """The last `lines` lines of the log of the cluster's process `name` (kwokctl's logs/, or kueue/ for Kueue),
    for a process found dead: why it ended, or, when its log ends in the middle of ordinary work, that something
    killed it from outside."""
    path = folder / "kueue" / "kueue.log" if name == "kueue" else folder / "logs" / f"{name}.log"
    try:
        with path.open("rb") as log:
            log.seek(max(0, path.stat().st_size - 64_000))
            tail = log.read().decode(errors="replace").splitlines()[-lines:]
        modified = time.strftime("%H:%M:%S", time.localtime(path.stat().st_mtime))
    except OSError as error:
        return f"--- {name} is dead; its log: {error.strerror or error}"
    return f"--- {name} is dead; its log (last written {modified}) ends:\n" + "\n".join(line[:300] for line in tail)


def disk_free(*folders: Path) -> str:
    """Free space of the file systems holding `folders` and /tmp ("disk free: 8.1 GiB (cluster), 8.1 GiB (/tmp)"):
    a full disk stops etcd's writes and every log at once."""
    import shutil

    parts = []
    for label, folder in [*((str(f), f) for f in folders), ("/tmp", Path("/tmp"))]:
        try:
            parts.append(f"{shutil.disk_usage(folder).free / 2**30:.1f} GiB ({label})")
        except OSError as error:
            parts.append(f"? ({label}: {error.strerror})")
    return "disk free: " + ", ".join(parts)


# The flag each control-plane process serves on, as kwokctl starts them.
_PORT_FLAGS = re.compile(r"^--(?:secure-port|listen-client-urls|server-address)=(?:.*:)?(\d+)$")


def port_owners(folder: Path, names: list[str]) -> str:
    """Whether each process of the cluster in `folder` listens on the port its command line names ("ok"), and
    otherwise who does: another process on a port of this cluster (a cluster created while one of its
    processes was restarting can take it) reaches the wrong control plane."""
    listeners = _listening_sockets()
    findings = []
    for name in names:
        try:
            pid = int((folder / "pids" / f"{name}.pid").read_text().strip())
            command = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, ValueError):
            continue
        ports = [int(m.group(1)) for part in command if (m := _PORT_FLAGS.match(part))]
        mine = _socket_inodes(pid)
        for port in ports:
            inodes = listeners.get(port, set())
            if inodes & mine:
                continue
            holder = next((other for other, held in _socket_holders(inodes)), None)
            findings.append(f"{name}'s {port} " + (f"held by {holder}" if holder else "not listened on"))
    return "; ".join(findings) if findings else "every process listens on its own port"


def _listening_sockets() -> dict[int, set[str]]:
    """Listening TCP port -> socket inodes, from /proc/net/tcp and tcp6."""
    found: dict[int, set[str]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A":  # LISTEN
                found.setdefault(int(fields[1].rsplit(":", 1)[1], 16), set()).add(fields[9])
    return found


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = fd.readlink().name
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _socket_holders(inodes: set[str]) -> list[tuple[str, int]]:
    """(a short 'pid N (command)' name, pid) of each process holding one of `inodes`."""
    if not inodes:
        return []
    holders = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _socket_inodes(int(proc.name)) & inodes:
            try:
                command = (proc / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ")[:160]
            except OSError:
                command = "?"
            holders.append((f"pid {proc.name} ({command})", int(proc.name)))
    return holders


def _millicores(quantity: Any) -> int:
    """demo.cpu_millis, 0 for a quantity it does not read ("1k"): the report never raises."""
    from colocgrpo_dev.demo import cpu_millis

    try:
        return cpu_millis(str(quantity))
    except ValueError:
        return 0
