"""The chart installed into the real dev cluster with the real helm.

The operator's identity is the chart's ServiceAccount, used through a token (`kubectl create token`):
`kubectl auth can-i` shows what it may and may not do, and running the operator as that identity
through a whole job proves the rules are enough.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from installed_chart import HostOperator, InstalledChart, can_i, http_get, wait_for_rbac

pytestmark = pytest.mark.cluster


@pytest.fixture
def release_name() -> str:
    return f"cgo-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def cluster_wide(helm, kube_cluster, namespace, release_name):
    chart = InstalledChart(helm, kube_cluster, release_name, namespace).install()
    yield chart
    chart.uninstall()


@pytest.fixture
def other_namespace(kube_cluster):
    name = kube_cluster.new_namespace("chart-other")
    yield name
    kube_cluster.delete_namespace(name)


@pytest.fixture
def namespaced(helm, kube_cluster, namespace, other_namespace, release_name):
    chart = InstalledChart(
        helm, kube_cluster, release_name, namespace, values=("--set", f"watchNamespaces={{{namespace}}}")
    ).install()
    yield chart
    chart.uninstall()


def test_install_creates_the_crd_operator_and_identity(cluster_wide, kube_cluster):
    crd = kube_cluster.kubectl("get", "crd", "colocgrpojobs.colocgrpo.io", "-o", "name").stdout.strip()
    assert crd == "customresourcedefinition.apiextensions.k8s.io/colocgrpojobs.colocgrpo.io"
    deployment = cluster_wide.deployment()
    assert deployment["spec"]["replicas"] == 2
    kube_cluster.kubectl("-n", cluster_wide.namespace, "get", "serviceaccount", cluster_wide.fullname)
    kube_cluster.kubectl("get", "clusterrole", cluster_wide.fullname)
    kube_cluster.kubectl("get", "clusterrolebinding", cluster_wide.fullname)
    kube_cluster.kubectl("-n", cluster_wide.namespace, "get", "service", f"{cluster_wide.fullname}-metrics")


def test_operator_pod_is_admitted_under_restricted_pod_security(helm, kube_cluster, namespace, release_name):
    """The hardened defaults meet the Pod Security Standards' `restricted` level: the namespace enforces it,
    and the Deployment's ReplicaSet still gets its pod created (PodSecurity admission would refuse it)."""
    kube_cluster.kubectl(
        "label",
        "namespace",
        namespace,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/enforce-version=latest",
    )
    chart = InstalledChart(helm, kube_cluster, release_name, namespace).install()
    try:
        selector = f"app.kubernetes.io/instance={release_name}"
        deadline = time.monotonic() + 60
        while True:
            pods = kube_cluster.kubectl("-n", namespace, "get", "pods", "-l", selector, "-o", "name").stdout.split()
            if pods:
                break
            events = kube_cluster.kubectl(
                "-n",
                namespace,
                "get",
                "events",
                "--field-selector",
                "reason=FailedCreate",
                "-o",
                "jsonpath={.items[*].message}",
            ).stdout
            assert "violates PodSecurity" not in events, events
            assert time.monotonic() < deadline, f"no operator pod after 60 s; events: {events}"
            time.sleep(0.5)
    finally:
        chart.uninstall()


def test_cluster_wide_identity_can_do_its_work(cluster_wide, kube_cluster, namespace, tmp_path):
    sa = cluster_wide.service_account_kubeconfig(tmp_path / "sa.kubeconfig")
    for args in [
        ("list", "colocgrpojobs.colocgrpo.io", "--all-namespaces"),
        ("watch", "colocgrpojobs.colocgrpo.io", "--all-namespaces"),
        ("patch", "colocgrpojobs.colocgrpo.io", "--subresource=status", "-n", namespace),
        # ttlSecondsAfterFinished: the operator deletes finished jobs.
        ("delete", "colocgrpojobs.colocgrpo.io", "-n", namespace),
        ("update", "colocgrpojobs.colocgrpo.io", "--subresource=finalizers", "-n", namespace),
        ("create", "jobs.batch", "-n", namespace),
        ("create", "configmaps", "-n", namespace),
        ("create", "services", "-n", namespace),
        ("create", "serviceaccounts", "-n", namespace),
        ("create", "roles.rbac.authorization.k8s.io", "-n", namespace),
        ("create", "rolebindings.rbac.authorization.k8s.io", "-n", namespace),
        ("delete", "pods", "-n", namespace),
        ("create", "events", "-n", namespace),
        ("list", "events", "-n", namespace),  # the Job controller's FailedCreate Events
        ("list", "customresourcedefinitions.apiextensions.k8s.io"),
    ]:
        assert can_i(kube_cluster, sa, *args), f"the operator cannot {' '.join(args)}"
    # Serving all namespaces, kopf never lists them, so the identity may not.
    assert not can_i(kube_cluster, sa, "list", "namespaces")


def _wait_for_can_i(kube_cluster, expected: bool, *args: str, timeout: float = 60) -> None:
    """Aggregation is asynchronous (the controller-manager's clusterrole-aggregation controller
    copies the rules into edit/view), so wait for the answer to settle."""
    deadline = time.monotonic() + timeout
    while can_i(kube_cluster, kube_cluster.kubeconfig, *args) != expected:
        assert time.monotonic() < deadline, f"`kubectl auth can-i {' '.join(args)}` never became {expected}"
        time.sleep(0.3)


JOBS = "colocgrpojobs.colocgrpo.io"


def test_namespace_editors_and_viewers_get_job_rights_through_the_default_roles(
    helm, kube_cluster, namespace, other_namespace, release_name
):
    """The chart's editor/viewer ClusterRoles aggregate into the apiserver's bootstrap `edit`, `admin` and
    `view` roles: a user bound to one of them in a namespace may use jobs there, and only there."""
    for user, role in (("alice", "edit"), ("bob", "view"), ("carol", "admin")):
        kube_cluster.kubectl(
            "-n", namespace, "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}", f"--user={user}"
        )
    chart = InstalledChart(helm, kube_cluster, release_name, namespace).install()
    try:
        _wait_for_can_i(kube_cluster, True, "create", JOBS, "-n", namespace, "--as=alice")
        _wait_for_can_i(kube_cluster, True, "list", JOBS, "-n", namespace, "--as=bob")
        _wait_for_can_i(kube_cluster, True, "create", JOBS, "-n", namespace, "--as=carol")
        # The aggregation controller wrote the chart's rules into the bootstrap roles themselves.
        edit = json.loads(kube_cluster.kubectl("get", "clusterrole", "edit", "-o", "json").stdout)
        assert any("colocgrpojobs" in rule.get("resources", []) for rule in edit["rules"])
        for verb in ("create", "get", "list", "watch", "patch", "update", "delete", "deletecollection"):
            assert can_i(kube_cluster, kube_cluster.kubeconfig, verb, JOBS, "-n", namespace, "--as=alice"), verb
            assert can_i(kube_cluster, kube_cluster.kubeconfig, verb, JOBS, "-n", namespace, "--as=carol"), verb
        for verb in ("get", "list", "watch"):
            assert can_i(kube_cluster, kube_cluster.kubeconfig, verb, JOBS, "-n", namespace, "--as=bob"), verb
        denied = [
            ("create", JOBS, "-n", namespace, "--as=bob"),
            ("patch", JOBS, "-n", namespace, "--as=bob"),
            ("delete", JOBS, "-n", namespace, "--as=bob"),
            # Status is the operator's and the trainer's, not the users'.
            ("patch", JOBS, "--subresource=status", "-n", namespace, "--as=alice"),
            ("update", JOBS, "--subresource=status", "-n", namespace, "--as=carol"),
            # A RoleBinding grants nothing outside its namespace.
            ("get", JOBS, "-n", other_namespace, "--as=alice"),
            ("list", JOBS, "-n", other_namespace, "--as=bob"),
            ("list", JOBS, "--all-namespaces", "--as=alice"),
        ]
        allowed = [" ".join(args) for args in denied if can_i(kube_cluster, kube_cluster.kubeconfig, *args)]
        assert not allowed, f"users may: {allowed}"
    finally:
        chart.uninstall()
    # Uninstalling the chart takes the rights away again.
    _wait_for_can_i(kube_cluster, False, "create", JOBS, "-n", namespace, "--as=alice")
    _wait_for_can_i(kube_cluster, False, "get", JOBS, "-n", namespace, "--as=bob")


# What the operator must never be able to do, in either mode.
FORBIDDEN = [
    ("get", "secrets", "--all-namespaces"),
    ("list", "secrets", "--all-namespaces"),
    ("watch", "secrets", "--all-namespaces"),
    ("create", "customresourcedefinitions.apiextensions.k8s.io"),
    ("patch", "customresourcedefinitions.apiextensions.k8s.io"),
    ("update", "customresourcedefinitions.apiextensions.k8s.io"),
    ("delete", "customresourcedefinitions.apiextensions.k8s.io"),
    ("create", "pods", "--subresource=exec", "--all-namespaces"),
    ("create", "pods", "--subresource=attach", "--all-namespaces"),
    ("get", "pods", "--subresource=log", "--all-namespaces"),
    ("create", "pods", "--all-namespaces"),
    ("create", "clusterroles.rbac.authorization.k8s.io"),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
    ("escalate", "roles.rbac.authorization.k8s.io", "--all-namespaces"),
    ("bind", "roles.rbac.authorization.k8s.io", "--all-namespaces"),
    ("impersonate", "serviceaccounts", "--all-namespaces"),
    ("delete", "namespaces"),
    ("patch", "nodes"),
    ("*", "*", "--all-namespaces"),
]


@pytest.mark.parametrize("mode", ["cluster_wide", "namespaced"])
def test_identity_cannot_read_secrets_change_crds_or_exec(mode, request, kube_cluster, namespace, tmp_path):
    chart = request.getfixturevalue(mode)
    sa = chart.service_account_kubeconfig(tmp_path / "sa.kubeconfig")
    allowed = [" ".join(args) for args in FORBIDDEN if can_i(kube_cluster, sa, *args)]
    allowed += [
        f"{' '.join(args)} (in its own namespace)"
        for args in [
            ("get", "secrets"),
            ("list", "secrets"),
            ("create", "pods", "--subresource=exec"),
        ]
        if can_i(kube_cluster, sa, *args, "-n", namespace)
    ]
    assert not allowed, f"the operator may: {allowed}"


def test_namespaced_identity_is_confined_to_the_watched_namespace(
    namespaced, kube_cluster, namespace, other_namespace, tmp_path
):
    sa = namespaced.service_account_kubeconfig(tmp_path / "sa.kubeconfig")
    assert can_i(kube_cluster, sa, "watch", "colocgrpojobs.colocgrpo.io", "-n", namespace)
    assert can_i(kube_cluster, sa, "create", "jobs.batch", "-n", namespace)
    assert can_i(kube_cluster, sa, "list", "customresourcedefinitions.apiextensions.k8s.io")
    for args in [
        ("list", "colocgrpojobs.colocgrpo.io", "--all-namespaces"),
        ("list", "colocgrpojobs.colocgrpo.io", "-n", other_namespace),
        ("create", "jobs.batch", "-n", other_namespace),
        ("delete", "pods", "-n", other_namespace),
        ("create", "roles.rbac.authorization.k8s.io", "-n", other_namespace),
        ("delete", "namespaces"),
    ]:
        assert not can_i(kube_cluster, sa, *args), f"the namespaced operator may {' '.join(args)}"


def test_documented_crd_upgrade_command_applies_a_changed_crd(cluster_wide, kube_cluster, tmp_path):
    """docs/install.md: Helm never upgrades crds/, `kubectl apply --server-side --force-conflicts` does."""
    import yaml
    from helm_chart import CHART

    original = CHART / "crds" / "colocgrpojobs.colocgrpo.io.yaml"
    crd = yaml.safe_load(original.read_text())
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    marker = f"changed by the upgrade test {uuid.uuid4().hex[:6]}"
    columns[0]["description"] = marker
    changed = tmp_path / "crds"
    changed.mkdir()
    (changed / original.name).write_text(yaml.safe_dump(crd))
    try:
        kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(changed))
        live = kube_cluster.kubectl(
            "get",
            "crd",
            crd["metadata"]["name"],
            "-o",
            "jsonpath={.spec.versions[0].additionalPrinterColumns[0].description}",
        ).stdout
        assert live == marker
    finally:
        kube_cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    live = kube_cluster.kubectl(
        "get",
        "crd",
        crd["metadata"]["name"],
        "-o",
        "jsonpath={.spec.versions[0].additionalPrinterColumns[0].description}",
    ).stdout
    assert marker not in live


# --- the operator, run on the host as the chart's identity, through a whole job ---------------------


@pytest.mark.parametrize("mode", ["cluster_wide", "namespaced"])
def test_operator_with_the_chart_identity_runs_a_job_to_success(mode, request, kube_cluster, namespace, tmp_path):
    from pathlib import Path

    import yaml

    from colocgrpo_dev.cluster.fake_pods import drive_pod_success, wait_for_pod_phase
    from colocgrpo_operator.api import JOB_NAME_LABEL

    chart = request.getfixturevalue(mode)
    sa_kubeconfig = chart.service_account_kubeconfig(tmp_path / "sa.kubeconfig")
    wait_for_rbac(kube_cluster, sa_kubeconfig, namespace)
    operator = HostOperator(chart, sa_kubeconfig, tmp_path / "operator.log").start()
    log_tail = operator.log_tail
    repo = Path(__file__).resolve().parents[2]

    try:
        status, _body = operator.probe("/healthz")
        assert status == 200, log_tail()

        job = yaml.safe_load((repo / "examples" / "tiny-cpu.yaml").read_text())
        job["metadata"] = {"name": "chart-lifecycle", "namespace": namespace}
        kube_cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))

        deadline = time.monotonic() + 90
        pods: list[str] = []
        while not pods:
            assert operator.running(), f"the operator exited:\n{log_tail()}"
            assert time.monotonic() < deadline, f"no trainer pod after 90 s:\n{log_tail()}"
            pods = kube_cluster.kubectl(
                "-n",
                namespace,
                "get",
                "pods",
                "-l",
                f"{JOB_NAME_LABEL}=chart-lifecycle",
                "-o",
                "name",
            ).stdout.split()
            time.sleep(0.5)
        for pod in pods:
            name = pod.split("/", 1)[1]
            try:
                wait_for_pod_phase(kube_cluster.core_v1, namespace, name, "Running", timeout=60)
            except TimeoutError as error:
                described = kube_cluster.kubectl("-n", namespace, "describe", "pod", name, check=False).stdout
                raise AssertionError(f"{error}\n{described}\n{log_tail()}") from error
            drive_pod_success(kube_cluster.core_v1, namespace, name)

        waited = kube_cluster.kubectl(
            "-n",
            namespace,
            "wait",
            "--for=condition=Succeeded",
            "cgj/chart-lifecycle",
            "--timeout=90s",
            check=False,
        )
        assert waited.returncode == 0, f"{waited.stderr}\n{log_tail()}"
        phase = kube_cluster.kubectl(
            "-n", namespace, "get", "cgj", "chart-lifecycle", "-o", "jsonpath={.status.phase}"
        ).stdout
        assert phase == "Succeeded"

        status, text = http_get(f"http://127.0.0.1:{operator.metrics}/metrics")
        assert status == 200 and "colocgrpo" in text
    finally:
        operator.stop()
    log = operator.log_path.read_text()
    denials = permission_denials(log)
    assert not denials, "permission denials in the operator log:\n" + "\n".join(denials) + f"\n{log[-6000:]}"


def permission_denials(log: str) -> list[str]:
    """The operator log's lines that show a permission gap: kopf's "not enough permissions", or any
    403 ("forbidden") but the API server's refusal of a write into a namespace being deleted. A
    cluster-wide operator sees other tests' namespaces go away, and says so (at DEBUG); that
    refusal is NamespaceLifecycle's, not RBAC's, and comes whatever the role."""
    found = []
    for line in log.splitlines():
        lowered = line.lower()
        if "not enough permissions" in lowered or (
            "forbidden" in lowered and "because it is being terminated" not in lowered
        ):
            found.append(line)
    return found


def test_permission_denials_are_told_from_a_namespace_being_deleted():
    rbac = (
        'ERROR colocgrpo: configmaps is forbidden: User "system:serviceaccount:colocgrpo-system:colocgrpo" '
        'cannot create resource "configmaps" in API group "" in the namespace "team-a"'
    )
    terminating = (
        'DEBUG colocgrpo: fuzz-3/job-7: not reconciled, it is being deleted: configmaps "job-7-config" is '
        "forbidden: unable to create new content in namespace fuzz-3 because it is being terminated"
    )
    kopf_gap = "WARNING kopf.activities.authentication: Not enough permissions to watch for resources"
    log = "\n".join(["INFO started", terminating, rbac, kopf_gap])
    assert permission_denials(log) == [rbac, kopf_gap]
    assert permission_denials(terminating) == []


def test_helm_upgrade_switches_to_namespaced_rbac_and_back(cluster_wide, kube_cluster, namespace, tmp_path):
    from helm_chart import CHART, run_helm

    def upgrade(*values: str) -> None:
        run_helm(
            cluster_wide.helm,
            "upgrade",
            cluster_wide.release,
            str(CHART),
            "--namespace",
            namespace,
            *values,
            kubeconfig=kube_cluster.kubeconfig,
        )

    upgrade("--set", f"watchNamespaces={{{namespace}}}")
    sa = cluster_wide.service_account_kubeconfig(tmp_path / "sa.kubeconfig")
    kube_cluster.kubectl("-n", namespace, "get", "role", cluster_wide.fullname)
    assert cluster_wide.operator_args()[0] == f"--namespace={namespace}"
    deadline = time.monotonic() + 30
    while can_i(kube_cluster, sa, "list", "colocgrpojobs.colocgrpo.io", "--all-namespaces"):
        assert time.monotonic() < deadline, "the cluster-wide grant outlived the upgrade"
        time.sleep(0.3)
    assert can_i(kube_cluster, sa, "list", "colocgrpojobs.colocgrpo.io", "-n", namespace)

    upgrade("--reset-values")
    assert kube_cluster.kubectl("-n", namespace, "get", "role", cluster_wide.fullname, check=False).returncode != 0
    assert cluster_wide.operator_args()[0] == "--all-namespaces"
    assert cluster_wide.deployment()["spec"]["strategy"]["type"] == "RollingUpdate"
