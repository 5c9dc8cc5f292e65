"""The cluster verbs (`get`, `describe`, `watch`, `logs`, `suspend`, `resume`, `delete`) when the cluster cannot
be used: one line saying what to check, exit 1 (as kubectl), no traceback."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from support.cli_runner import run_colocgrpo as colocgrpo

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "charts/colocgrpo-operator/crds/colocgrpojobs.colocgrpo.io.yaml"
CLUSTER_VERBS = ["get", "describe", "watch", "logs", "suspend", "resume", "delete"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def kubeconfig_for(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "c",
                "clusters": [{"name": "c", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "ns1"}}],
            }
        )
    )
    return path


def assert_one_clean_line(result: subprocess.CompletedProcess, *expected: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], lines[0]


@pytest.mark.parametrize("command", CLUSTER_VERBS)
def test_missing_kubeconfig_names_it(tmp_path, command):
    missing = tmp_path / "no-such-kubeconfig"
    result = colocgrpo(command, "job", "--kubeconfig", str(missing))
    assert_one_clean_line(result, f"kubeconfig {missing}", "--kubeconfig")


@pytest.mark.parametrize("command", CLUSTER_VERBS)
def test_unreachable_api_server_names_the_address(tmp_path, command):
    port = closed_port()
    result = colocgrpo(command, "job", "--kubeconfig", str(kubeconfig_for(tmp_path, f"https://127.0.0.1:{port}")))
    assert_one_clean_line(
        result, f"cannot reach the Kubernetes API server at https://127.0.0.1:{port}", "is the cluster up?"
    )


@pytest.mark.cluster
def test_logs_of_a_job_that_does_not_exist_says_so(kube_cluster, namespace):
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    result = colocgrpo("logs", "no-such-job", "-n", namespace, "--kubeconfig", str(kube_cluster.kubeconfig))
    assert_one_clean_line(result, f"ColocGRPOJob {namespace}/no-such-job not found")


def two_context_kubeconfig(tmp_path: Path, real: Path) -> Path:
    """`real`'s cluster under the context `real`, and a current context `dead` whose server is a closed port:
    only a command that honours --context reaches the cluster. File paths are made absolute (the copy lives
    elsewhere than `real`)."""
    config = yaml.safe_load(real.read_text())
    for section, key in (("clusters", "cluster"), ("users", "user")):
        for entry in config[section]:
            for field in ("certificate-authority", "client-certificate", "client-key", "tokenFile"):
                if entry[key].get(field):
                    entry[key][field] = str((real.parent / entry[key][field]).resolve())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
    config["clusters"].append(
        {"name": "dead", "cluster": {"server": f"https://127.0.0.1:{closed_port()}", "insecure-skip-tls-verify": True}}
    )
    config["contexts"] = [
        {"name": "real", "context": dict(context)},
        {"name": "dead", "context": {**context, "cluster": "dead"}},
    ]
    config["current-context"] = "dead"
    path = tmp_path / "two-contexts.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.cluster
def test_watch_once_prints_the_job_from_the_named_context(kube_cluster, namespace, tmp_path):
    kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD_FILE))
    job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    job["metadata"] = {"name": "seen", "namespace": namespace}
    kube_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
    kubeconfig = str(two_context_kubeconfig(tmp_path, Path(kube_cluster.kubeconfig)))
    real = ("-n", namespace, "--kubeconfig", kubeconfig, "--context", "real")

    as_json = colocgrpo("watch", "seen", "--once", "-o", "json", *real)
    assert as_json.returncode == 0, as_json.stderr
    stored = json.loads(as_json.stdout)
    assert (stored["kind"], stored["metadata"]["name"]) == ("ColocGRPOJob", "seen")
    assert stored["metadata"]["namespace"] == namespace
    as_yaml = colocgrpo("watch", "seen", "--once", "-o", "yaml", *real)
    assert as_yaml.returncode == 0 and yaml.safe_load(as_yaml.stdout)["metadata"]["uid"] == stored["metadata"]["uid"]

    # Without --context the current one (a closed port) is used; an unknown context is named.
    current = colocgrpo("watch", "seen", "-n", namespace, "--once", "--kubeconfig", kubeconfig)
    assert_one_clean_line(current, "cannot reach")
    unknown = colocgrpo("logs", "seen", "-n", namespace, "--kubeconfig", kubeconfig, "--context", "nope")
    assert_one_clean_line(unknown, "no context 'nope'")
    # A job that does not exist exits 1, as `kubectl get` does.
    missing = colocgrpo("watch", "gone", "--once", *real)
    assert_one_clean_line(missing, f"ColocGRPOJob {namespace}/gone not found")
