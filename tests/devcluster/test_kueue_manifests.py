"""What the local Kueue gets installed from its own module's manifests (colocgrpo_dev/cluster/kueue.py); that it
works is tests/operator/test_kueue.py's part."""

from __future__ import annotations

import pytest
import yaml

from colocgrpo_dev.cluster.kueue import (
    MANAGED_NAMESPACE_LABEL,
    ensure_kueue,
    render_config,
    render_crds,
    render_webhook_configurations,
)
from colocgrpo_dev.cluster.paths import build_dir

URL = "https://127.0.0.1:9443"


@pytest.fixture(scope="module")
def build():
    return ensure_kueue()  # built by `make cluster-bin`; cached by the pins


def test_the_build_is_kueues_pinned_release(build):
    go_mod = (build_dir() / "kueue/go.mod").read_text()
    assert "sigs.k8s.io/kueue v0.17.0" in go_mod
    assert build.binary.is_file()
    assert build.folder.name in str(build.binary)


def test_webhooks_call_loopback_for_kueues_api_and_batch_jobs_only(build):
    configurations = render_webhook_configurations(build, URL, MANAGED_NAMESPACE_LABEL)
    kinds = {c["kind"]: c for c in configurations}
    assert set(kinds) == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    # The names Kueue's cert-controller injects its CA into.
    assert kinds["MutatingWebhookConfiguration"]["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    names = {w["name"] for c in configurations for w in c["webhooks"]}
    assert {"mjob.kb.io", "vjob.kb.io", "mresourceflavor.kb.io", "vworkload.kb.io"} <= names
    assert not {"mpod.kb.io", "mdeployment.kb.io", "mrayjob.kb.io"} & names  # integrations not enabled
    for configuration in configurations:
        for webhook in configuration["webhooks"]:
            assert set(webhook["clientConfig"]) == {"url"}
            assert webhook["clientConfig"]["url"].startswith(f"{URL}/")
            groups = {g for rule in webhook["rules"] for g in rule["apiGroups"]}
            if groups == {"batch"}:
                assert webhook["namespaceSelector"] == {"matchLabels": {"colocgrpo.dev/kueue": "true"}}


def test_crds_convert_through_loopback_as_kueues_kustomization_says(build):
    crds = {crd["metadata"]["name"]: crd for crd in render_crds(build, URL)}
    assert "workloads.kueue.x-k8s.io" in crds and "workloadpriorityclasses.kueue.x-k8s.io" in crds
    converted = {name for name, crd in crds.items() if "conversion" in crd["spec"]}
    assert converted == {
        f"{plural}.kueue.x-k8s.io" for plural in ("localqueues", "clusterqueues", "cohorts", "workloads")
    } | {"multikueueclusters.kueue.x-k8s.io"}
    assert crds["workloads.kueue.x-k8s.io"]["spec"]["conversion"]["webhook"]["clientConfig"] == {
        "url": f"{URL}/convert"
    }


def test_config_keeps_kueue_to_loopback_and_its_namespaces(tmp_path):
    config = yaml.safe_load(render_config(9443, 8081, tmp_path, MANAGED_NAMESPACE_LABEL))
    assert config["webhook"] == {"host": "127.0.0.1", "port": 9443, "certDir": str(tmp_path)}
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:8081"
    assert config["metrics"]["bindAddress"] == "0"
    assert config["leaderElection"]["leaderElect"] is False
    assert config["manageJobsWithoutQueueName"] is False
    assert config["integrations"]["frameworks"] == ["batch/job"]
    assert config["managedJobsNamespaceSelector"] == {"matchLabels": {"colocgrpo.dev/kueue": "true"}}
