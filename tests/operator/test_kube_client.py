"""The operator's own Kubernetes client (controller/credentials.py, controller/kube.py): credentials
from a kubeconfig or a pod's ServiceAccount, requests against the real API server, and an operator
process that never imports the official `kubernetes` package."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from colocgrpo_operator.controller import credentials as creds
from colocgrpo_operator.controller.credentials import CredentialsError, kubeconfig_credentials, load_credentials
from colocgrpo_operator.controller.kube import KubeApi, KubeApiError
from support.operator_harness import REPO, free_port, tiny_job

# ----------------------------------------------------------------------------- kubeconfig parsing


def _write(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path


def _config(user: dict, cluster: dict | None = None, context: str = "c") -> dict:
    return {
        "clusters": [{"name": "k", "cluster": cluster or {"server": "https://10.0.0.1:6443"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": context, "context": {"cluster": "k", "user": "u", "namespace": "team"}}],
        "current-context": context,
    }


def test_kubeconfig_paths_are_relative_to_the_file_and_data_is_decoded(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    path = _write(
        tmp_path / "conf" / "kubeconfig",
        _config(
            {"client-certificate": "pki/admin.crt", "client-key": "/abs/admin.key"},
            {"server": "https://10.0.0.1:6443", "certificate-authority-data": base64.b64encode(pem.encode()).decode()},
        ),
    )
    found = kubeconfig_credentials(str(path))
    assert found.server == "https://10.0.0.1:6443"
    assert found.cert_file == str(tmp_path / "conf" / "pki" / "admin.crt")
    assert found.key_file == "/abs/admin.key"
    assert found.ca_data == pem and found.ca_file is None
    assert found.namespace == "team" and found.token is None


def test_kubeconfig_token_file_is_read_and_reread(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "token").write_text("first\n")
    found = kubeconfig_credentials(str(_write(tmp_path / "kubeconfig", _config({"tokenFile": "token"}))))
    assert found.auth_headers() == {"Authorization": "Bearer first"}
    (tmp_path / "token").write_text("second")
    assert found.bearer_token() == "first"  # not re-read on every request
    monkeypatch.setattr(creds, "TOKEN_REREAD_SECONDS", 0.0)
    assert found.bearer_token() == "second"
    static = kubeconfig_credentials(str(_write(tmp_path / "static", _config({"token": "abc", "tokenFile": "token"}))))
    assert static.bearer_token() == "abc"  # a literal token wins, as in kubectl


def test_several_kubeconfigs_merge_first_definition_wins(tmp_path: Path) -> None:
    first = _write(tmp_path / "a", {"current-context": "c", "users": [{"name": "u", "user": {"token": "mine"}}]})
    second = _write(tmp_path / "b", _config({"token": "other"}, context="c"))
    found = load_credentials(f"{first}{os.pathsep}{tmp_path / 'missing'}{os.pathsep}{second}")
    assert (found.server, found.token) == ("https://10.0.0.1:6443", "mine")


@pytest.mark.parametrize(
    "user, needle",
    [
        ({"exec": {"command": "aws"}}, "`exec` plugin"),
        ({"auth-provider": {"name": "gcp"}}, "`auth-provider` plugin"),
    ],
)
def test_plugin_users_are_refused_by_name(tmp_path: Path, user: dict, needle: str) -> None:
    with pytest.raises(CredentialsError, match=needle):
        kubeconfig_credentials(str(_write(tmp_path / "kubeconfig", _config(user))))


def test_missing_or_broken_kubeconfig_says_which(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="does not exist"):
        load_credentials(str(tmp_path / "nope"))
    with pytest.raises(CredentialsError, match="no current context"):
        load_credentials(str(_write(tmp_path / "empty", {"clusters": []})))
    with pytest.raises(CredentialsError, match="not running in a pod"):
        load_credentials(None, environ={"HOME": str(tmp_path)})


def test_in_cluster_uses_the_service_env_and_account_files(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("tok")
    (tmp_path / "namespace").write_text("ops")
    environ = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    found = load_credentials(None, environ=environ, service_account_dir=tmp_path)
    assert (found.server, found.bearer_token(), found.namespace, found.ca_file) == (
        "https://[fd00::1]:443",
        "tok",
        "ops",
        None,
    )
    # A kubeconfig named explicitly wins over the pod's identity (as `--kubeconfig` promises).
    named = load_credentials(
        str(_write(tmp_path / "kc", _config({"token": "x"}))), environ=environ, service_account_dir=tmp_path
    )
    assert named.token == "x"


# ----------------------------------------------------------------------------- against the API server


def test_requests_errors_and_counting_against_the_real_api_server(kube_cluster, namespace) -> None:
    """Client certificates (the dev cluster's kubeconfig); JSON in and out; a non-2xx answer is a
    KubeApiError carrying the status code and the server's message."""
    from colocgrpo_operator.controller.metrics import API_REQUESTS

    api = KubeApi.from_kubeconfig(kube_cluster.kubeconfig, field_manager="colocgrpo-tests", pool_size=4)
    before = API_REQUESTS.labels(verb="POST")._value.get()
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": namespace},
        "data": {"a": "1"},
    }
    assert api.create(config_map) is True
    assert api.create(config_map) is False  # 409: already there, success for a reconciler
    assert API_REQUESTS.labels(verb="POST")._value.get() - before == 2
    applied = api.apply(dict(config_map, data={"a": "2"}))
    assert applied["data"] == {"a": "2"}
    assert any(f["manager"] == "colocgrpo-tests" for f in applied["metadata"]["managedFields"])
    with pytest.raises(KubeApiError) as missing:
        api.request("GET", f"/api/v1/namespaces/{namespace}/configmaps/absent")
    assert missing.value.status == 404 and "absent" in missing.value.message
    with pytest.raises(KubeApiError) as invalid:
        api.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body={"metadata": {"name": "Bad_Name"}})
    assert invalid.value.status == 422 and "Bad_Name" in invalid.value.message
    assert api.delete("ConfigMap", namespace, "cm") is True
    assert api.delete("ConfigMap", namespace, "cm") is False
    api.close()


def _cluster_ca(kubeconfig: Path) -> str:
    found = kubeconfig_credentials(str(kubeconfig))
    return found.ca_data or Path(found.ca_file).read_text()


def test_in_cluster_credentials_against_the_real_api_server(kube_cluster, namespace, tmp_path, monkeypatch) -> None:
    """A pod's view (service env vars, token and CA files) for both clients: the operator's own
    and kopf's session from the login handler. A rotated token file is picked up."""
    from urllib.parse import urlparse

    import kopf

    from colocgrpo_operator.controller.startup import login

    server = urlparse(kubeconfig_credentials(str(kube_cluster.kubeconfig)).server)
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_text(_cluster_ca(kube_cluster.kubeconfig))
    (account / "namespace").write_text(namespace)

    def new_token() -> str:
        return kube_cluster.kubectl("-n", namespace, "create", "token", "default").stdout.strip()

    (account / "token").write_text(new_token())
    monkeypatch.setattr(creds, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", server.hostname)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(server.port))
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    whoami = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    expected = f"system:serviceaccount:{namespace}:default"

    api = KubeApi.from_kubeconfig(None, field_manager="colocgrpo-tests")
    assert api.credentials.source == "in-cluster"
    assert api.request("POST", whoami, body=review)["status"]["userInfo"]["username"] == expected

    monkeypatch.setattr(creds, "TOKEN_REREAD_SECONDS", 0.0)
    (account / "token").write_text("not-a-token")
    with pytest.raises(KubeApiError) as refused:
        api.request("POST", whoami, body=review)
    assert refused.value.status == 401  # the file is read again, not cached forever
    (account / "token").write_text(new_token())
    assert api.request("POST", whoami, body=review)["status"]["userInfo"]["username"] == expected

    async def kopf_session_whoami() -> str:
        session = await login(settings=kopf.OperatorSettings(), memo=kopf.Memo())
        assert session.server == f"https://{server.hostname}:{server.port}"
        assert session.default_namespace == namespace
        async with session.aiohttp_session as http, http.post(session.server + whoami, json=review) as response:
            assert response.status == 201, await response.text()
            return (await response.json())["status"]["userInfo"]["username"]

    assert asyncio.run(kopf_session_whoami()) == expected


# The operator runs in this process; once the test has seen it write a job's status (its own
# client at work, after kopf logged in and started watching), a line on stdin makes a thread
# report which client modules are loaded.
_RUN_AND_REPORT = """
import json, os, sys, threading
from colocgrpo_operator.cli import main

def report():
    sys.stdin.readline()
    loaded = sorted(name for name, module in sys.modules.items()
                    if name.split(".")[0] in ("kubernetes", "kubernetes_asyncio") and module is not None)
    print("LOADED " + json.dumps(loaded), flush=True)
    os._exit(0)

threading.Thread(target=report, daemon=True).start()
sys.exit(main(sys.argv[1:]))
"""


def test_a_running_operator_never_imports_the_kubernetes_client(kube_cluster, crd_installed, namespace, cluster):
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}")
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _RUN_AND_REPORT,
            "operator",
            f"--kubeconfig={kube_cluster.kubeconfig}",
            f"--namespace={namespace}",
            f"--metrics-port={free_port()}",
            f"--liveness-port={free_port()}",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
        text=True,
    )
    try:
        cluster.create_job(namespace, tiny_job("no-client"))
        deadline = time.monotonic() + 60
        while not (cluster.get_job(namespace, "no-client") or {}).get("status"):
            assert process.poll() is None, process.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "the operator wrote no status"
            time.sleep(0.2)
        output, _ = process.communicate("report\n", timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    report = [line for line in output.splitlines() if line.startswith("LOADED ")]
    assert report, output[-4000:]
    assert json.loads(report[0][len("LOADED ") :]) == [], output[-4000:]
