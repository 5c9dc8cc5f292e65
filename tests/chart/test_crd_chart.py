"""The colocgrpo-crds chart: the CRD as an ordinary release object, so `helm upgrade` upgrades it.

Against the real apiserver with the real helm. The lifecycle tests run on a copy of the CRD renamed into a group of
its own (`upgrade-test.colocgrpo.io`), so they can create, take over, upgrade and delete it without touching the
CRD the rest of the session runs on; everything else about the chart (template, keep policy, helm) is the real one.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from pathlib import Path

import pytest
import yaml
from helm_chart import CHART, REPO, run_helm

pytestmark = pytest.mark.cluster

CRD_CHART = REPO / "charts" / "colocgrpo-crds"
CRD_FILE_NAME = "colocgrpojobs.colocgrpo.io.yaml"
RUNTIMES_FILE_NAME = "runtimes.colocgrpo.io.yaml"
TEST_GROUP = "upgrade-test.colocgrpo.io"
TEST_CRD = f"colocgrpojobs.{TEST_GROUP}"


def _retarget(path: Path, *, new_field: bool = False, version: str | None = None) -> None:
    """Rename the CRD in `path` into the test group; optionally give it what the next release would change."""
    crd = yaml.safe_load(path.read_text())
    crd["metadata"]["name"] = TEST_CRD
    crd["spec"]["group"] = TEST_GROUP
    crd["spec"]["names"]["shortNames"] = ["cgjut"]  # never shadow `kubectl get cgj` of the real CRD
    crd["spec"]["names"]["categories"] = ["colocgrpo-upgrade-test"]
    if new_field:
        served = crd["spec"]["versions"][0]
        served["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["upgradeMarker"] = {
            "type": "string",
            "description": "A field only the next chart version knows.",
        }
        served["additionalPrinterColumns"].append(
            {"name": "Marker", "type": "string", "jsonPath": ".spec.upgradeMarker", "priority": 1}
        )
    path.write_text(yaml.safe_dump(crd, sort_keys=False))
    if version:
        chart_yaml = path.parents[1] / "Chart.yaml"
        meta = yaml.safe_load(chart_yaml.read_text())
        meta["version"] = version
        chart_yaml.write_text(yaml.safe_dump(meta, sort_keys=False))


def _crd_chart(tmp_path: Path, version: str = "0.1.0", *, new_field: bool = False) -> Path:
    chart = tmp_path / f"colocgrpo-crds-{version}"
    shutil.copytree(CRD_CHART, chart)
    # The lifecycle is the job CRD's; the runtime CRDs the session installed are not this release's to take over.
    (chart / "templates" / RUNTIMES_FILE_NAME).unlink()
    _retarget(chart / "templates" / CRD_FILE_NAME, new_field=new_field, version=version)
    return chart


def _job(namespace: str, name: str, **spec: object) -> str:
    job = yaml.safe_load((REPO / "examples" / "tiny-cpu.yaml").read_text())
    job["apiVersion"] = f"{TEST_GROUP}/v1alpha1"
    job["metadata"] = {"name": name, "namespace": namespace}
    job["spec"].update(spec)
    return yaml.safe_dump(job)


class Lifecycle:
    def __init__(self, helm: Path, kube_cluster, namespace: str) -> None:
        self.helm, self.cluster, self.namespace = helm, kube_cluster, namespace
        self.release = f"crds-{uuid.uuid4().hex[:6]}"
        self.others: list[str] = []

    def helm_run(self, *args: str, check: bool = True):
        return run_helm(self.helm, *args, "-n", self.namespace, check=check, kubeconfig=self.cluster.kubeconfig)

    def crd(self) -> dict:
        return json.loads(self.cluster.kubectl("get", "crd", TEST_CRD, "-o", "json").stdout)

    def established(self, timeout: float = 60) -> None:
        """Wait for Established (`kubectl wait` fails at once while a new CRD has no conditions yet)."""
        deadline = time.monotonic() + timeout
        jsonpath = 'jsonpath={.status.conditions[?(@.type=="Established")].status}'
        while self.cluster.kubectl("get", "crd", TEST_CRD, "-o", jsonpath, check=False).stdout.strip() != "True":
            assert time.monotonic() < deadline, f"{TEST_CRD} not Established after {timeout} s"
            time.sleep(0.2)

    def columns(self) -> list[str]:
        return [c["name"] for c in self.crd()["spec"]["versions"][0]["additionalPrinterColumns"]]

    def apply_job(self, name: str, **spec: object):
        return self.cluster.kubectl("apply", "-f", "-", input=_job(self.namespace, name, **spec), check=False)

    def cleanup(self) -> None:
        for release in [self.release, *self.others]:
            self.helm_run("uninstall", release, "--wait", check=False)
        self.cluster.kubectl("delete", "crd", TEST_CRD, "--ignore-not-found", "--wait=true", check=False)


@pytest.fixture
def lifecycle(helm, kube_cluster, namespace):
    run = Lifecycle(helm, kube_cluster, namespace)
    yield run
    run.cleanup()


def _install_crd_elsewhere(lifecycle: Lifecycle, origin: str, tmp_path: Path) -> None:
    """Put the CRD in the cluster the way an earlier install would have."""
    if origin == "operator chart crds/":
        operator_chart = tmp_path / "colocgrpo-operator"
        shutil.copytree(CHART, operator_chart)
        _retarget(operator_chart / "crds" / CRD_FILE_NAME)
        release = f"op-{uuid.uuid4().hex[:6]}"
        lifecycle.others.append(release)
        lifecycle.helm_run(
            "install", release, str(operator_chart), "--set", "rbac.create=false", "--set", "rbac.userRoles=false"
        )
    else:
        crd = tmp_path / CRD_FILE_NAME
        shutil.copy(CHART / "crds" / CRD_FILE_NAME, crd)
        _retarget(crd)
        lifecycle.cluster.kubectl("apply", "--server-side", "-f", str(crd))
    lifecycle.established()


@pytest.mark.parametrize("origin", ["none", "operator chart crds/", "kubectl apply --server-side"])
def test_helm_upgrade_applies_the_next_crd_and_uninstall_keeps_it(lifecycle, tmp_path, origin):
    current, following = _crd_chart(tmp_path), _crd_chart(tmp_path, "0.1.1-test", new_field=True)
    install = ["install", lifecycle.release, str(current)]
    if origin != "none":
        _install_crd_elsewhere(lifecycle, origin, tmp_path)
        # A CRD that this release did not create is refused until the release is told to take it over.
        refused = lifecycle.helm_run(*install, check=False)
        assert refused.returncode != 0 and "invalid ownership metadata" in refused.stderr, refused.stderr
        install.append("--take-ownership")
    lifecycle.helm_run(*install)
    lifecycle.established()
    annotations = lifecycle.crd()["metadata"]["annotations"]
    assert annotations["meta.helm.sh/release-name"] == lifecycle.release
    assert annotations["helm.sh/resource-policy"] == "keep"
    before = lifecycle.columns()
    assert lifecycle.apply_job("old").returncode == 0
    unknown = lifecycle.apply_job("early", upgradeMarker="v2")
    assert unknown.returncode != 0 and "upgradeMarker" in unknown.stderr, unknown.stderr

    # The next chart version changes the schema; `helm upgrade` applies it. A CRD first applied by kubectl
    # keeps kubectl as a co-owner of its fields, so the first upgrade overrides it once (docs/install.md).
    upgrade = ["upgrade", lifecycle.release, str(following)]
    if origin == "kubectl apply --server-side":
        conflict = lifecycle.helm_run(*upgrade, check=False)
        assert conflict.returncode != 0 and 'conflict with "kubectl"' in conflict.stderr, conflict.stderr
        upgrade.append("--force-conflicts")
    lifecycle.helm_run(*upgrade)
    lifecycle.established()
    assert lifecycle.columns() == [*before, "Marker"]
    history = json.loads(lifecycle.helm_run("history", lifecycle.release, "-o", "json").stdout)
    assert (history[-1]["status"], history[-1]["chart"]) == ("deployed", "colocgrpo-crds-0.1.1-test")
    # The new field is part of the schema now (accepted and stored, not pruned), and the old job is still there.
    applied = lifecycle.apply_job("late", upgradeMarker="v2")
    assert applied.returncode == 0, applied.stderr
    stored = json.loads(
        lifecycle.cluster.kubectl("-n", lifecycle.namespace, "get", f"{TEST_CRD}/late", "-o", "json").stdout
    )
    assert stored["spec"]["upgradeMarker"] == "v2"
    lifecycle.cluster.kubectl("-n", lifecycle.namespace, "get", f"{TEST_CRD}/old")
    # A later upgrade needs no flag at all: the release owns what it applied.
    lifecycle.helm_run("upgrade", lifecycle.release, str(following), "--set-string", "global.note=again")

    # Uninstalling the release keeps the CRD, and with it every job.
    lifecycle.helm_run("uninstall", lifecycle.release)
    assert lifecycle.crd()["metadata"]["name"] == TEST_CRD
    names = lifecycle.cluster.kubectl("-n", lifecycle.namespace, "get", TEST_CRD, "-o", "name").stdout.split()
    assert sorted(n.rsplit("/", 1)[1] for n in names) == ["late", "old"]


def test_crd_chart_renders_the_generated_crds_kept_on_uninstall(helm):
    from colocgrpo_operator.api.crd import generate_crd
    from colocgrpo_operator.api.runtime import generate_runtime_crds

    rendered = [doc for doc in yaml.safe_load_all(run_helm(helm, "template", "crds", str(CRD_CHART)).stdout) if doc]
    assert len(rendered) == 3
    for crd in rendered:
        assert crd["metadata"].pop("annotations") == {"helm.sh/resource-policy": "keep"}
    by_name = {crd["metadata"]["name"]: crd for crd in rendered}
    assert sorted(by_name) == sorted(c["metadata"]["name"] for c in [generate_crd(), *generate_runtime_crds()])
    assert by_name["colocgrpojobs.colocgrpo.io"] == generate_crd()
    for runtime_crd in generate_runtime_crds():
        assert by_name[runtime_crd["metadata"]["name"]] == runtime_crd
    refused = run_helm(helm, "template", "crds", str(CRD_CHART), "--set", "keep=false", check=False)
    assert refused.returncode != 0 and "additional properties 'keep' not allowed" in refused.stderr
    lint = run_helm(helm, "lint", "--strict", str(CRD_CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in lint.stdout
