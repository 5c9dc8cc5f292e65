"""`watch` and `logs` when the cluster cannot be used: one line saying what to check, exit 2, no traceback."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from support.cli_runner import run_colocgrpo as colocgrpo

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "charts/colocgrpo-operator/crds/colocgrpojobs.colocgrpo.io.yaml"


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
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for text in expected:
        assert text in lines[0], lines[0]


@pytest.mark.parametrize("command", ["watch", "logs"])
def test_missing_kubeconfig_names_it(tmp_path, command):
    missing = tmp_path / "no-such-kubeconfig"
    result = colocgrpo(command, "job", "--kubeconfig", str(missing))
    assert_one_clean_line(result, f"kubeconfig {missing}", "--kubeconfig")


@pytest.mark.parametrize("command", ["watch", "logs"])
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
