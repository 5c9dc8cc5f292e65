"""The operator's own Kubernetes client (kube/credentials.py, kube/client.py): credentials
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

from colocgrpo_dev.ports import free_port
from colocgrpo_operator.kube import credentials as creds
from colocgrpo_operator.kube.client import KubeApi, KubeApiError
from colocgrpo_operator.kube.credentials import CredentialsError, kubeconfig_credentials, load_credentials
from support.operator_harness import REPO, tiny_job

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


def test_auth_provider_users_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="`auth-provider`.*exec plugin"):
        kubeconfig_credentials(str(_write(tmp_path / "kubeconfig", _config({"auth-provider": {"name": "gcp"}}))))


# An exec credential plugin as a Python script: each run appends a line to `runs`, then prints the
# next token of `tokens` (one per line; the last one repeats) with `expiry` as its expiration.
_PLUGIN = """
import json, os, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "runs"), "a") as runs:
    runs.write(os.environ.get("KUBERNETES_EXEC_INFO", "") + "\\n")
tokens = open(os.path.join(here, "tokens")).read().split()
done = sum(1 for _ in open(os.path.join(here, "runs")))
if os.environ.get("PLUGIN_FAIL"):
    print("the cloud said no", file=sys.stderr)
    sys.exit(3)
status = {"token": tokens[min(done, len(tokens)) - 1]}
expiry = open(os.path.join(here, "expiry")).read().strip()
if expiry:
    status["expirationTimestamp"] = expiry
version = os.environ.get("PLUGIN_VERSION", "client.authentication.k8s.io/v1")
print(json.dumps({"apiVersion": version, "kind": "ExecCredential", "status": status}))
"""


def exec_plugin_user(folder: Path, tokens: list[str], expiry: str = "", **exec_fields: object) -> dict:
    """A kubeconfig `user` running the plugin script above (relative path: resolved against the
    kubeconfig's folder, as kubectl does) through this Python."""
    plugin = folder / "plugin"
    plugin.mkdir(exist_ok=True)
    (plugin / "exec.py").write_text(_PLUGIN)
    (plugin / "tokens").write_text("\n".join(tokens))
    (plugin / "expiry").write_text(expiry)
    (plugin / "runs").unlink(missing_ok=True)
    section = {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": sys.executable,
        "args": [str(plugin / "exec.py")],
        "interactiveMode": "Never",
        **exec_fields,
    }
    return {"exec": section}


def plugin_runs(folder: Path) -> list[dict]:
    runs = folder / "plugin" / "runs"
    return [json.loads(line) for line in runs.read_text().splitlines()] if runs.exists() else []


def test_exec_plugin_token_is_cached_until_it_expires_and_renewed_after_a_401(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    later = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    user = exec_plugin_user(tmp_path, ["one", "two", "three"], later, env=[{"name": "PLUGIN_VERSION", "value": ""}])
    user["exec"]["env"] = []  # the default v1 answer
    found = kubeconfig_credentials(str(_write(tmp_path / "kubeconfig", _config(user))))
    assert plugin_runs(tmp_path) == []  # nothing runs before a token is needed
    assert found.auth_headers() == {"Authorization": "Bearer one"}
    assert found.bearer_token() == "one" and len(plugin_runs(tmp_path)) == 1  # cached
    assert found.token_expiry() == datetime.fromisoformat(later.replace("Z", "+00:00"))
    info = plugin_runs(tmp_path)[0]
    assert info == {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                    "spec": {"interactive": False}}  # fmt: skip
    assert found.refused("some other token") is False  # a 401 to a token no longer in use changes nothing
    assert found.refused("one") is True
    assert found.bearer_token() == "two" and len(plugin_runs(tmp_path)) == 2
    # A token that expires within the margin is renewed before it is sent.
    (tmp_path / "plugin" / "expiry").write_text((datetime.now(UTC) + timedelta(seconds=2)).isoformat())
    assert found.refused("two")
    assert found.bearer_token() == "three"
    assert found.bearer_token() == "three" and len(plugin_runs(tmp_path)) == 4  # expired again: run again


def test_exec_plugin_env_cluster_info_and_relative_command(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    script = tmp_path / "conf" / "bin" / "plugin.sh"
    script.parent.mkdir()
    script.write_text(
        "#!/bin/sh\n"
        'printf \'{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential",\'\n'
        'printf \'"status":{"token":"%s"}}\' "$GREETING"\n'
        'printf "%s" "$KUBERNETES_EXEC_INFO" > "$(dirname "$0")/info.json"\n'
    )
    script.chmod(0o755)
    user = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": "./bin/plugin.sh",
            "env": [{"name": "GREETING", "value": "hello"}],
            "provideClusterInfo": True,
        }
    }
    cluster = {
        "server": "https://10.0.0.1:6443",
        "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {"audience": "me"}}],
    }
    found = kubeconfig_credentials(str(_write(tmp_path / "conf" / "kubeconfig", _config(user, cluster))))
    assert found.bearer_token() == "hello"
    info = json.loads((script.parent / "info.json").read_text())
    assert info["apiVersion"] == "client.authentication.k8s.io/v1beta1"
    assert info["spec"]["cluster"] == {"server": "https://10.0.0.1:6443", "config": {"audience": "me"}}


@pytest.mark.parametrize(
    "change, needle",
    [
        ({"command": "no-such-plugin-anywhere", "args": [], "installHint": "brew install it"},
         r"`no-such-plugin-anywhere` of user 'u' is not installed or not on PATH \(brew install it\)"),
        ({"env": [{"name": "PLUGIN_FAIL", "value": "1"}]}, "exited with 3: the cloud said no"),
        ({"env": [{"name": "PLUGIN_VERSION", "value": "client.authentication.k8s.io/v1beta1"}]},
         "answered in 'client.authentication.k8s.io/v1beta1', but the kubeconfig asks for"),
        ({"apiVersion": "client.authentication.k8s.io/v1alpha1"}, "exec.apiVersion .*v1alpha1.* is not supported"),
        ({"interactiveMode": "Always"}, "needs a terminal"),
        ({"args": "--token"}, "exec.args is not a list of strings"),
        ({"env": [{"value": "x"}]}, r"exec.env\[0\] has no `name`"),
    ],
)  # fmt: skip
def test_exec_plugin_failures_are_one_line_naming_the_user(tmp_path: Path, change: dict, needle: str) -> None:
    user = exec_plugin_user(tmp_path, ["t"])
    user["exec"].update(change)
    with pytest.raises(CredentialsError, match=needle) as failed:
        kubeconfig_credentials(str(_write(tmp_path / "kubeconfig", _config(user)))).bearer_token()
    assert "\n" not in str(failed.value)


_MALFORMED = [
    ({"users": [{"user": {"token": "t"}}]}, r"users\[0\] has no `name`"),
    ({"clusters": {"k": {"server": "x"}}}, "`clusters` is not a list"),
    ({"contexts": [{"name": "c", "context": "k"}]}, r"contexts\[0\] \('c'\): `context` is not a mapping"),
    ({"contexts": [{"name": "c", "context": {"user": "u"}}]}, "context 'c' names no cluster"),
    ({"contexts": [{"name": "c", "context": {"cluster": "nope", "user": "u"}}]}, "names cluster 'nope', not defined"),
    ({"contexts": [{"name": "c", "context": {"cluster": "k", "user": "who"}}]}, "names user 'who', not defined"),
    ({"clusters": [{"name": "k", "cluster": {"server": 6443}}]}, "cluster 'k': server is not a string"),
    ({"clusters": [{"name": "k", "cluster": {"insecure-skip-tls-verify": True}}]}, "cluster 'k' has no server"),
    ({"users": [{"name": "u", "user": {"client-key-data": "%%%"}}]}, "client-key-data is not base64 of a PEM"),
    ({"current-context": ["c"]}, "current-context is not a string"),
]


@pytest.mark.parametrize("change, needle", _MALFORMED)
def test_malformed_kubeconfigs_name_the_entry(tmp_path: Path, change: dict, needle: str) -> None:
    config = {**_config({"token": "t"}), **change}
    with pytest.raises(CredentialsError, match=needle) as failed:
        kubeconfig_credentials(str(_write(tmp_path / "kubeconfig", config)))
    assert "\n" not in str(failed.value)
    assert str(tmp_path / "kubeconfig") in str(failed.value)


def test_malformed_kubeconfig_is_one_line_from_the_cli_and_the_operator(tmp_path: Path) -> None:
    from support.cli_runner import run_colocgrpo

    path = _write(tmp_path / "kubeconfig", {**_config({"token": "t"}), "users": [{"user": {}}]})
    for program, *args in (
        ("colocgrpo", "watch", "job"),
        ("colocgrpo", "logs", "job"),
        ("colocgrpo-operator", f"--liveness-port={free_port()}"),
    ):
        result = run_colocgrpo(*args, "--kubeconfig", str(path), program=program)
        # The user's commands exit 1 as kubectl does; the daemon exits 2 before it starts.
        assert result.returncode == (2 if program == "colocgrpo-operator" else 1), result.stdout + result.stderr
        lines = result.stderr.strip().splitlines()
        assert lines == [f"error: kubeconfig {path}: users[0] has no `name` (pass --kubeconfig or set KUBECONFIG)"] or (
            program == "colocgrpo-operator" and lines == [f"error: kubeconfig {path}: users[0] has no `name`"]
        ), result.stderr


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
    from colocgrpo_operator.metrics import API_REQUESTS

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

    from colocgrpo_operator.kopf_glue.startup import login

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


def _account_token(kube_cluster, namespace: str, name: str, cluster_role: str | None = None) -> str:
    """A token of a new ServiceAccount `name` (bound to `cluster_role` cluster-wide, if given)."""
    kube_cluster.kubectl("-n", namespace, "create", "serviceaccount", name)
    if cluster_role:
        kube_cluster.kubectl(
            "create", "clusterrolebinding", f"{namespace}-{name}", f"--clusterrole={cluster_role}",
            f"--serviceaccount={namespace}:{name}",
        )  # fmt: skip
    return kube_cluster.kubectl("-n", namespace, "create", "token", name, "--duration=1h").stdout.strip()


def _exec_kubeconfig(kube_cluster, folder: Path, tokens: list[str], namespace: str) -> Path:
    """The dev cluster's server and CA, with a user whose tokens come from the exec plugin."""
    server = kubeconfig_credentials(str(kube_cluster.kubeconfig)).server
    ca = base64.b64encode(_cluster_ca(kube_cluster.kubeconfig).encode()).decode()
    config = _config(exec_plugin_user(folder, tokens), {"server": server, "certificate-authority-data": ca})
    config["contexts"][0]["context"]["namespace"] = namespace
    return _write(folder / "kubeconfig", config)


def test_exec_plugin_against_the_real_api_server(kube_cluster, namespace, tmp_path) -> None:
    """The plugin's first token is refused (401): both clients run it again and go on with the next."""
    from colocgrpo_operator.kopf_glue.session import kopf_session

    good = _account_token(kube_cluster, namespace, "plugin-user")
    kubeconfig = _exec_kubeconfig(kube_cluster, tmp_path, ["not-a-token", good], namespace)
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    whoami = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
    expected = f"system:serviceaccount:{namespace}:plugin-user"

    api = KubeApi.from_kubeconfig(kubeconfig, field_manager="colocgrpo-tests", pool_size=4)
    assert api.request("POST", whoami, body=review)["status"]["userInfo"]["username"] == expected
    assert len(plugin_runs(tmp_path)) == 2
    assert api.request("POST", whoami, body=review)["status"]["userInfo"]["username"] == expected
    assert len(plugin_runs(tmp_path)) == 2  # cached (no expiry given: until the next 401)

    (tmp_path / "plugin" / "tokens").write_text(f"also-not-a-token\n{good}")
    (tmp_path / "plugin" / "runs").unlink()

    async def kopf_session_whoami() -> str:
        session = kopf_session(kubeconfig_credentials(str(kubeconfig)), 4, trust_env=False)
        async with session.aiohttp_session as http, http.post(session.server + whoami, json=review) as response:
            assert response.status == 201, await response.text()
            return (await response.json())["status"]["userInfo"]["username"]

    assert asyncio.run(kopf_session_whoami()) == expected
    assert len(plugin_runs(tmp_path)) == 2


def _tiny_priority_level(kube_cluster, namespace: str, account: str) -> str:
    """API Priority and Fairness gives `account` the smallest share there is: a priority level of
    one nominal share (a seat or two of the server's hundreds), nothing lent or borrowed, one
    queue of one, so concurrent requests beyond that get real 429s."""
    name = f"tiny-{namespace}"
    level = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "PriorityLevelConfiguration",
        "metadata": {"name": name},
        "spec": {
            "type": "Limited",
            "limited": {
                "nominalConcurrencyShares": 1,
                "lendablePercent": 0,
                "borrowingLimitPercent": 0,
                "limitResponse": {"type": "Queue", "queuing": {"queues": 1, "handSize": 1, "queueLengthLimit": 1}},
            },
        },
    }
    every = {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "namespaces": ["*"], "clusterScope": True}
    schema = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": name},
        "spec": {
            "priorityLevelConfiguration": {"name": name},
            "matchingPrecedence": 100,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [
                {
                    "subjects": [
                        {"kind": "ServiceAccount", "serviceAccount": {"name": account, "namespace": namespace}}
                    ],
                    "resourceRules": [every],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }
            ],
        },
    }
    kube_cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [level, schema]})
    )
    return name


def test_429s_from_priority_and_fairness_are_retried_after_retry_after(kube_cluster, namespace) -> None:
    import concurrent.futures

    from colocgrpo_operator.metrics import API_RETRIES

    token = _account_token(kube_cluster, namespace, "throttled", cluster_role="view")
    name = _tiny_priority_level(kube_cluster, namespace, "throttled")
    base = kubeconfig_credentials(str(kube_cluster.kubeconfig))
    ca = base.ca_data or Path(base.ca_file or "").read_text()
    path = f"/api/v1/namespaces/{namespace}/configmaps"

    def burst(api: KubeApi, threads: int = 24, rounds: int = 8) -> list[int]:
        """Status of each of threads × rounds concurrent LISTs (200, or the error's status)."""

        def one(_: int) -> int:
            try:
                api.request("GET", path)
            except KubeApiError as error:
                return error.status
            return 200

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            return list(pool.map(one, range(threads * rounds)))

    try:
        # The share is real: without retries, some requests are turned away.
        impatient = KubeApi(creds.Credentials(server=base.server, ca_data=ca, token=token), "t", 24, retry_budget=0)
        deadline = time.monotonic() + 60
        statuses = burst(impatient)
        while 429 not in statuses:  # the new priority level may take a moment to apply
            assert time.monotonic() < deadline, f"no 429 from the tiny priority level: {set(statuses)}"
            statuses = burst(impatient)
        assert set(statuses) <= {200, 429}, statuses
        impatient.close()

        before = API_RETRIES.labels(reason="throttled")._value.get()
        patient = KubeApi(creds.Credentials(server=base.server, ca_data=ca, token=token), "t", 24)
        # Every request of every burst succeeds; whether a burst is throttled at all depends on how fast a loaded
        # machine sends it, so bursts go on until one was (and its 429s were retried).
        deadline = time.monotonic() + 60
        while True:
            assert set(burst(patient)) == {200}
            if API_RETRIES.labels(reason="throttled")._value.get() > before:
                break
            assert time.monotonic() < deadline, "no burst of the patient client was throttled and retried"
        patient.close()
    finally:
        kube_cluster.kubectl("delete", "flowschema,prioritylevelconfiguration", name, "--ignore-not-found")


def test_retry_delay_honours_retry_after_and_backs_off() -> None:
    from colocgrpo_operator.kube.client import RETRY_MAX_DELAY_SECONDS, retry_delay

    assert 1 <= retry_delay("1", 0) <= 1.25
    assert 5 <= retry_delay("5", 0) <= 6.25  # the server's wait wins over a shorter backoff
    assert 4 <= retry_delay("1", 3) <= 5  # later attempts back off further
    assert retry_delay("1", 30) <= RETRY_MAX_DELAY_SECONDS * 1.25
    assert 1 <= retry_delay("Wed, 21 Oct 2015 07:28:00 GMT", 0) <= 1.25 and 1 <= retry_delay(None, 0) <= 1.25


# The operator runs in this process; once the test has seen it write a job's status (its own
# client at work, after kopf logged in and started watching), a line on stdin makes a thread
# report which client modules are loaded.
_RUN_AND_REPORT = """
import json, os, sys, threading
from colocgrpo_operator.daemon import main

def report():
    sys.stdin.readline()
    loaded = sorted(name for name, module in sys.modules.items()
                    if name.split(".")[0] in ("kubernetes", "kubernetes_asyncio") and module is not None)
    # One write of the whole line: the operator's log lines share the pipe, and print() writes the line and its
    # end separately when output is unbuffered (PYTHONUNBUFFERED), so a log line could land between them.
    os.write(1, ("LOADED " + json.dumps(loaded) + "\\n").encode())
    os._exit(0)

threading.Thread(target=report, daemon=True).start()
sys.exit(main(sys.argv[1:]))
"""


def test_an_operator_on_an_exec_kubeconfig_never_imports_the_kubernetes_client(
    kube_cluster, crd_installed, namespace, cluster, tmp_path
):
    """`colocgrpo-operator --kubeconfig` with an exec-plugin user (EKS/GKE style) reconciles a job,
    through both of its clients, without the official client in the process."""
    token = _account_token(kube_cluster, namespace, "operator", cluster_role="cluster-admin")
    kubeconfig = _exec_kubeconfig(kube_cluster, tmp_path, [token], namespace)
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'operator'}:{REPO / 'training'}")
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _RUN_AND_REPORT,
            f"--kubeconfig={kubeconfig}",
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
    assert len(plugin_runs(tmp_path)) == 1, output[-4000:]  # one token for both clients
