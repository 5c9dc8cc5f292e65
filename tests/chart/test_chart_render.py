"""The chart rendered by the real helm: defaults, every toggle, schema-checked values."""

from __future__ import annotations

import pytest
from helm_chart import CHART, by_kind, one, run_helm

K8S_SCHEMA_VERSION = "1.36.0"  # the dev cluster's minor version


def test_helm_lint_passes_strict(helm):
    result = run_helm(helm, "lint", "--strict", str(CHART))
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


def test_helm_lint_passes_for_namespaced_and_monitoring_values(helm):
    run_helm(
        helm,
        "lint",
        "--strict",
        str(CHART),
        "--set",
        "watchNamespaces={team-a,team-b}",
        "--set",
        "metrics.serviceMonitor.enabled=true",
    )


def test_defaults_are_valid_kubernetes_objects(render_chart):
    import kubernetes_validate

    objects = render_chart()
    assert sorted(o["kind"] for o in objects) == [
        *["ClusterRole"] * 5,  # the operator's; the jobs' editor and viewer; the runtimes' admin and reader
        *["ClusterRoleBinding"] * 2,  # the operator's; every authenticated user reads the cluster's runtimes
        "Deployment",
        "PodDisruptionBudget",  # two replicas: a drain evicts one at a time
        "Role",  # leader election's Lease
        "RoleBinding",
        "Service",
        "ServiceAccount",
        *["ValidatingAdmissionPolicy"] * 3,  # the trainer's status, Kueue's labels (refused, warned)
        *["ValidatingAdmissionPolicyBinding"] * 3,
    ]
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize(
    "values",
    [
        ("--set", "watchNamespaces={a,b}"),
        ("--set", "metrics.enabled=false", "--set", "rbac.create=false"),
        (
            "--set",
            "nodeSelector.pool=system",
            "--set",
            "tolerations[0].key=k,tolerations[0].operator=Exists",
            "--set",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=pool",
            "--set",
            "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
            "--set",
            "imagePullSecrets[0].name=pull",
            "--set",
            "extraEnv[0].name=A,extraEnv[0].value=b",
            "--set",
            "priorityClassName=system-cluster-critical",
            "--set",
            "podAnnotations.a=b",
        ),
        (
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "networkPolicy.ingressNamespaces={monitoring}",
            "--set",
            "networkPolicy.apiServer.cidrs={10.0.0.1/32}",
            "--set",
            "podDisruptionBudget.minAvailable=50%",
            "--set",
            "topologySpreadConstraints[0].maxSkew=1,topologySpreadConstraints[0].topologyKey=zone",
            "--set",
            "topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
        ),
    ],
    ids=["namespaced", "metrics-and-rbac-off", "placement-and-extras", "network-policy-and-own-spread"],
)
def test_toggled_renders_are_valid_kubernetes_objects(render_chart, values):
    import kubernetes_validate

    for obj in render_chart(*values):
        kubernetes_validate.validate(obj, K8S_SCHEMA_VERSION, strict=True)


def _operator_container(objects):
    deployment = one(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return deployment, container


def test_deployment_is_two_elected_replicas_with_probes(render_chart):
    objects = render_chart()
    deployment, container = _operator_container(objects)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert {
        "--leader-election",
        "--leader-election-namespace=colocgrpo-system",
        "--leader-election-name=cgo-colocgrpo-operator",
        "--lease-duration=15",
        "--renew-deadline=10",
        "--retry-period=2",
    } <= set(container["args"])
    probe = container["livenessProbe"]["httpGet"]
    assert probe["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "liveness"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"liveness": 8080, "metrics": 9090}
    assert probe["port"] == "liveness"
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    # The Lease: created once, then only that one read and renewed, in the release namespace.
    role = next(
        r for r in by_kind(objects, "Role") if r["metadata"]["name"] == "cgo-colocgrpo-operator-leader-election"
    )
    assert role["metadata"]["namespace"] == "colocgrpo-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["cgo-colocgrpo-operator"],
            "verbs": ["get", "update"],
        },
    ]


def test_one_replica_without_election_is_recreated(render_chart):
    objects = render_chart("--set", "replicas=1", "--set", "leaderElection.enabled=false")
    deployment, container = _operator_container(objects)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not [a for a in container["args"] if a.startswith("--leader-election")]
    assert not [r for r in by_kind(objects, "Role") if r["metadata"]["name"].endswith("-leader-election")]


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        (("leaderElection.enabled=false",), "replicas > 1 needs leaderElection.enabled"),
        (("leaderElection.renewDeadline=20",), "retryPeriod < renewDeadline < leaseDuration"),
    ],
)
def test_unsafe_election_settings_are_refused(helm, values, complaint):
    sets = [arg for value in values for arg in ("--set", value)]
    result = run_helm(helm, "template", "x", str(CHART), *sets, check=False)
    assert result.returncode != 0 and complaint in result.stderr, result.stderr


def test_deployment_is_hardened(render_chart):
    deployment, container = _operator_container(render_chart())
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    # The one writable place: /tmp on an emptyDir.
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"] and "emptyDir" in pod["volumes"][0]
    assert "hostNetwork" not in pod and "hostPID" not in pod


def test_operator_command_line_defaults(render_chart):
    deployment, container = _operator_container(render_chart())
    assert container["command"] == ["colocgrpo-operator"]
    assert container["args"] == [
        "--all-namespaces",
        "--trainer-image=colocgrpo/trainer:0.1.0",
        "--log-level=INFO",
        "--liveness-port=8080",
        "--leader-election",
        "--leader-election-namespace=colocgrpo-system",
        "--leader-election-name=cgo-colocgrpo-operator",
        "--lease-duration=15",
        "--renew-deadline=10",
        "--retry-period=2",
        "--metrics-port=9090",
    ]
    assert container["image"] == "colocgrpo/operator:0.1.0"  # tag defaults to appVersion
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "cgo-colocgrpo-operator"


def test_the_operator_accepts_the_rendered_command_line(render_chart):
    # The chart's args are parsed by the operator's own command line, defaults and namespaced.
    from colocgrpo_operator.daemon import build_parser, config_from_args

    def config(*values: str):
        _, container = _operator_container(render_chart(*values))
        return config_from_args(build_parser().parse_args(container["args"]))

    defaults = config()
    assert defaults.clusterwide and defaults.trainer_image == "colocgrpo/trainer:0.1.0"
    assert (defaults.metrics_port, defaults.liveness_port, defaults.log_level) == (9090, 8080, "INFO")
    namespaced = config("--set", "watchNamespaces={team-a,team-b}", "--set", "metrics.enabled=false")
    assert namespaced.namespaces == ("team-a", "team-b") and namespaced.metrics_port == 0


def test_values_reach_the_command_line_and_pod(render_chart):
    deployment, container = _operator_container(
        render_chart(
            "--set",
            "trainerImage=registry.example/trainer:9",
            "--set",
            "logLevel=debug",
            "--set",
            "image.digest=sha256:" + "a" * 64,
            "--set",
            "nodeSelector.pool=system",
            "--set",
            "tolerations[0].key=dedicated,tolerations[0].operator=Exists",
            "--set",
            "extraArgs={--peering=none}",
        )
    )
    assert "--trainer-image=registry.example/trainer:9" in container["args"]
    assert "--log-level=DEBUG" in container["args"]
    assert container["args"][-1] == "--peering=none"
    assert container["image"] == "colocgrpo/operator@sha256:" + "a" * 64
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]


OPERATOR_ROLE = "cgo-colocgrpo-operator"


def _operator_cluster_role(objects):
    (role,) = [o for o in by_kind(objects, "ClusterRole") if o["metadata"]["name"] == OPERATOR_ROLE]
    return role


def _rules(role):
    return {
        (group, resource): set(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


# What the operator needs, exactly (tests/chart/test_chart_install.py proves it is enough).
NAMESPACED_RULES = {
    ("colocgrpo.io", "colocgrpojobs"): {"get", "list", "watch", "patch", "update", "delete"},
    ("colocgrpo.io", "colocgrpojobs/status"): {"get", "patch", "update"},
    ("colocgrpo.io", "colocgrpojobs/finalizers"): {"update"},
    ("", "configmaps"): {"create", "get", "list", "watch", "patch", "update", "delete"},
    ("", "services"): {"create", "get", "list", "watch", "patch", "update", "delete"},
    ("", "serviceaccounts"): {"create", "get", "list", "watch", "patch", "update", "delete"},
    ("rbac.authorization.k8s.io", "roles"): {"create", "get", "list", "watch", "patch", "update", "delete"},
    ("rbac.authorization.k8s.io", "rolebindings"): {"create", "get", "list", "watch", "patch", "update", "delete"},
    ("batch", "jobs"): {"create", "get", "list", "watch", "patch", "update", "delete"},
    ("", "pods"): {"get", "list", "watch", "delete"},
    ("", "events"): {"create", "patch", "list"},  # list: why a Job's pods cannot be created
    ("events.k8s.io", "events"): {"create", "patch"},
    ("kueue.x-k8s.io", "workloads"): {"get", "list", "watch"},  # read-only: why a queued job waits
    ("colocgrpo.io", "colocgrporuntimes"): {"get", "list", "watch"},  # read-only: admins own runtimes
}
CRD_DISCOVERY = {
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"},
    ("", "namespaces"): {"get"},  # is a job's namespace being deleted?
    ("colocgrpo.io", "clustercolocgrporuntimes"): {"get", "list", "watch"},  # read-only, cluster-scoped
}
NAMESPACE_OBSERVATION = {("", "namespaces"): {"list", "watch"}}


def _operator_binding(objects):
    """The ClusterRoleBinding of the operator's ServiceAccount (not the runtime readers')."""
    (binding,) = [b for b in by_kind(objects, "ClusterRoleBinding") if b["subjects"][0]["kind"] == "ServiceAccount"]
    return binding


def test_cluster_wide_rbac_is_exactly_the_needed_rules(render_chart):
    objects = render_chart()
    role = _operator_cluster_role(objects)
    assert _rules(role) == {**NAMESPACED_RULES, **CRD_DISCOVERY}
    binding = _operator_binding(objects)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "cgo-colocgrpo-operator", "namespace": "colocgrpo-system"}
    ]
    # Cluster-wide, the only namespaced grant is leader election's Lease in the release namespace.
    assert [r["metadata"]["name"] for r in by_kind(objects, "Role") + by_kind(objects, "RoleBinding")] == [
        "cgo-colocgrpo-operator-leader-election"
    ] * 2


def test_no_rule_grants_secrets_exec_logs_wildcards_or_crd_writes(render_chart):
    for objects in (render_chart(), render_chart("--set", "watchNamespaces={a}")):
        for role in by_kind(objects, "ClusterRole") + by_kind(objects, "Role"):
            for rule in role["rules"]:
                assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
                assert not {"secrets", "pods/exec", "pods/attach", "pods/log", "pods/portforward", "nodes"} & set(
                    rule["resources"]
                )
                assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
            crd = _rules(role).get(("apiextensions.k8s.io", "customresourcedefinitions"), set())
            assert crd <= {"get", "list", "watch"}
            assert _rules(role).get(("", "namespaces"), set()) <= {"get", "list", "watch"}  # read-only


def test_namespaced_rbac_gives_a_role_per_watched_namespace(render_chart):
    objects = render_chart("--set", "watchNamespaces={team-a,team-b}")
    _, container = _operator_container(objects)
    assert container["args"][:2] == ["--namespace=team-a", "--namespace=team-b"]
    assert "--all-namespaces" not in container["args"]
    # Cluster scope keeps only the reads kopf needs: CRD discovery, and following the named namespaces.
    assert _rules(_operator_cluster_role(objects)) == {**CRD_DISCOVERY, **NAMESPACE_OBSERVATION}
    roles = [r for r in by_kind(objects, "Role") if not r["metadata"]["name"].endswith("-leader-election")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert _rules(role) == NAMESPACED_RULES
    bindings = [b for b in by_kind(objects, "RoleBinding") if not b["metadata"]["name"].endswith("-leader-election")]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "cgo-colocgrpo-operator", "namespace": "colocgrpo-system"}
        ]


def test_rbac_off_renders_no_rbac(render_chart):
    objects = render_chart(
        "--set", "rbac.create=false", "--set", "rbac.userRoles=false", "--set", "watchNamespaces={a}"
    )
    assert not {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} & {o["kind"] for o in objects}
    assert one(objects, "ServiceAccount")


def test_rbac_off_keeps_the_user_roles(render_chart):
    objects = render_chart("--set", "rbac.create=false")
    names = sorted(o["metadata"]["name"] for o in by_kind(objects, "ClusterRole"))
    assert names == [f"{OPERATOR_ROLE}-{role}" for role in ("editor", "runtime-admin", "runtime-reader", "viewer")]
    assert [o["metadata"]["name"] for o in by_kind(objects, "ClusterRoleBinding")] == [
        f"{OPERATOR_ROLE}-runtime-reader"
    ]


def test_user_roles_aggregate_into_edit_and_view(render_chart):
    roles = {o["metadata"]["name"]: o for o in by_kind(render_chart(), "ClusterRole")}
    editor, viewer = roles[f"{OPERATOR_ROLE}-editor"], roles[f"{OPERATOR_ROLE}-viewer"]
    aggregate = "rbac.authorization.k8s.io/aggregate-to-"
    assert {k: v for k, v in editor["metadata"]["labels"].items() if k.startswith(aggregate)} == {
        f"{aggregate}edit": "true"
    }
    assert {k: v for k, v in viewer["metadata"]["labels"].items() if k.startswith(aggregate)} == {
        f"{aggregate}view": "true"
    }
    assert _rules(editor) == {
        ("colocgrpo.io", "colocgrpojobs"): {
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        },
        # Status belongs to the operator and the job's trainer: users only read it.
        ("colocgrpo.io", "colocgrpojobs/status"): {"get"},
    }
    assert _rules(viewer) == {
        ("colocgrpo.io", "colocgrpojobs"): {"get", "list", "watch"},
        ("colocgrpo.io", "colocgrpojobs/status"): {"get", "list", "watch"},
        ("colocgrpo.io", "colocgrporuntimes"): {"get", "list", "watch"},  # (view aggregates into edit)
    }
    # Runtimes belong to admins: a namespace's to its `admin`, the cluster's to cluster admins; everyone reads.
    runtime_admin, reader = roles[f"{OPERATOR_ROLE}-runtime-admin"], roles[f"{OPERATOR_ROLE}-runtime-reader"]
    assert runtime_admin["metadata"]["labels"][f"{aggregate}admin"] == "true"
    assert _rules(runtime_admin) == {
        ("colocgrpo.io", "colocgrporuntimes"): {
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        }
    }
    assert _rules(reader) == {("colocgrpo.io", "clustercolocgrporuntimes"): {"get", "list", "watch"}}
    bindings = {o["metadata"]["name"]: o for o in by_kind(render_chart(), "ClusterRoleBinding")}
    assert bindings[f"{OPERATOR_ROLE}-runtime-reader"]["subjects"] == [
        {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}
    ]
    without = render_chart("--set", "rbac.userRoles=false")
    assert [o["metadata"]["name"] for o in by_kind(without, "ClusterRole")] == [OPERATOR_ROLE]


def test_existing_service_account(render_chart, helm):
    objects = render_chart("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=mine")
    assert not by_kind(objects, "ServiceAccount")
    deployment, _ = _operator_container(objects)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "mine"
    assert _operator_binding(objects)["subjects"][0]["name"] == "mine"
    failed = run_helm(helm, "template", "x", str(CHART), "--set", "serviceAccount.create=false", check=False)
    assert failed.returncode != 0 and "serviceAccount.name is required" in failed.stderr


def test_metrics_service_selects_the_operator_pod(render_chart):
    objects = render_chart()
    service = one(objects, "Service")
    deployment, _ = _operator_container(objects)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    assert not by_kind(objects, "ServiceMonitor")  # off by default


def test_metrics_off(render_chart):
    objects = render_chart("--set", "metrics.enabled=false")
    assert not by_kind(objects, "Service")
    _, container = _operator_container(objects)
    assert "--metrics-port=0" in container["args"]  # the operator's "off"
    assert [p["name"] for p in container["ports"]] == ["liveness"]


def test_service_monitor_on(render_chart):
    objects = render_chart(
        "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.serviceMonitor.labels.release=prom"
    )
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    service = one(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["colocgrpo-system"]}
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"
    # The per-job series' own `namespace` label must survive the scrape (not become exported_namespace).
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True


def test_grafana_dashboard_is_off_by_default_and_a_sidecar_configmap_when_on(render_chart):
    import json

    assert not [o for o in render_chart() if o["metadata"]["name"].endswith("-dashboard")]
    objects = render_chart("--set", "grafanaDashboard.enabled=true", "--set", "grafanaDashboard.namespace=monitoring")
    (dashboard,) = [
        o for o in by_kind(objects, "ConfigMap") if o["metadata"]["name"] == "cgo-colocgrpo-operator-dashboard"
    ]
    assert dashboard["metadata"]["namespace"] == "monitoring"
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads((CHART / "dashboards" / "colocgrpo-jobs.json").read_text())
    assert json.loads(dashboard["data"]["colocgrpo-jobs.json"]) == shipped
    titles = [panel["title"] for panel in shipped["panels"]]
    assert {"Reward", "Seconds per step"} <= set(titles)
    assert any("sleep, wake, weight push" in title for title in titles)
    own = render_chart(
        "--set",
        "grafanaDashboard.enabled=true",
        "--set",
        "grafanaDashboard.label=dashboards",
        "--set",
        "grafanaDashboard.labelValue=colocgrpo",
    )
    (dashboard,) = [o for o in by_kind(own, "ConfigMap") if o["metadata"]["name"].endswith("-dashboard")]
    assert dashboard["metadata"]["labels"]["dashboards"] == "colocgrpo"


def test_service_monitor_without_metrics_fails_clearly(helm):
    result = run_helm(
        helm,
        "template",
        "x",
        str(CHART),
        "--set",
        "metrics.enabled=false",
        "--set",
        "metrics.serviceMonitor.enabled=true",
        check=False,
    )
    assert result.returncode != 0
    assert "metrics.serviceMonitor.enabled needs metrics.enabled" in result.stderr


def test_crd_is_installed_from_crds_dir_and_can_be_skipped(render_chart):
    with_crds = render_chart("--include-crds")
    crds = {c["metadata"]["name"]: c for c in by_kind(with_crds, "CustomResourceDefinition")}
    assert sorted(crds) == [
        "clustercolocgrporuntimes.colocgrpo.io",
        "colocgrpojobs.colocgrpo.io",
        "colocgrporuntimes.colocgrpo.io",
    ]
    assert crds["colocgrpojobs.colocgrpo.io"]["spec"]["names"]["shortNames"] == ["cgj"]
    assert not by_kind(render_chart("--skip-crds"), "CustomResourceDefinition")
    assert not by_kind(render_chart(), "CustomResourceDefinition")  # templates never carry the CRD


def test_trainer_status_policy_is_the_one_the_dev_cluster_installs(render_chart):
    """The chart's policy is api/admission.py's (which the tests and `colocgrpo-dev cluster up` install and the
    forgery tests prove), under the release's name, and can be turned off."""
    from colocgrpo_operator.api.admission import trainer_status_policy

    objects = render_chart(release="cgo")
    (policy,) = [o for o in by_kind(objects, "ValidatingAdmissionPolicy") if "kueue" not in o["metadata"]["name"]]
    (binding,) = [
        o for o in by_kind(objects, "ValidatingAdmissionPolicyBinding") if "kueue" not in o["metadata"]["name"]
    ]
    expected_policy, expected_binding = trainer_status_policy("cgo-colocgrpo-operator-trainer-status")
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == expected_policy["metadata"]["name"]
    assert policy["spec"] == expected_policy["spec"]
    assert binding["spec"] == expected_binding["spec"]
    off = render_chart("--set", "trainerStatusPolicy.enabled=false", "--set", "kueueLabelPolicies.enabled=false")
    assert not [o for o in off if o["kind"].startswith("ValidatingAdmissionPolicy")]


def test_kueue_label_policies_are_the_ones_the_dev_cluster_installs(render_chart):
    """The chart's two policies of Kueue's labels are api/queueing.py's (which the dev cluster installs and
    tests/operator/test_kueue.py proves against the API server), under the release's name, and can be turned off."""
    from colocgrpo_operator.api.queueing import queue_policies

    expected = queue_policies("cgo-colocgrpo-operator")
    objects = [
        o
        for o in render_chart(release="cgo")
        if o["kind"].startswith("ValidatingAdmissionPolicy") and "kueue" in o["metadata"]["name"]
    ]
    assert sorted(((o["kind"], o["metadata"]["name"], o["spec"]) for o in objects), key=str) == sorted(
        ((o["kind"], o["metadata"]["name"], o["spec"]) for o in expected), key=str
    )
    off = render_chart("--set", "kueueLabelPolicies.enabled=false")
    assert not [o for o in off if "kueue" in o["metadata"]["name"]]


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("imagee.tag=1", "additional properties 'imagee' not allowed"),
        ("image.pulPolicy=Always", "additional properties 'pulPolicy' not allowed"),
        ("metrics.serviceMonitor.enable=true", "additional properties 'enable' not allowed"),
        ("rbac.enabled=false", "additional properties 'enabled' not allowed"),
        ("logLevel=verbose", "logLevel"),
        ("watchNamespaces={Team_A}", "watchNamespaces"),
        ("livenessProbe.port=0", "livenessProbe"),
        ("podDisruptionBudget.maxUnavailable=0", "maxUnavailable"),
        ("podDisruptionBudget.maxUnavailable=half", "maxUnavailable"),
        ("networkPolicy.enable=true", "additional properties 'enable' not allowed"),
        ("networkPolicy.apiServer.ports={70000}", "ports"),
        ("trainerImage=Trainer Image:1", "trainerImage"),
    ],
)
def test_schema_rejects_typos_and_bad_values(helm, value, complaint):
    result = run_helm(helm, "template", "x", str(CHART), "--set", value, check=False)
    assert result.returncode != 0, f"--set {value} was accepted"
    assert complaint in result.stderr, result.stderr


def test_notes_tell_how_to_submit_and_watch(helm):
    result = run_helm(helm, "install", "cgo", str(CHART), "--dry-run=client", "--namespace", "ops")
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl -n default apply -f" in notes
    assert "get cgj -w" in notes
    assert "wait --for=condition=Succeeded cgj/NAME" in notes
    # Without a cluster to look the CRD up in, the notes give both ways of upgrading it.
    assert "kubectl apply --server-side --force-conflicts -f charts/colocgrpo-operator/crds/" in notes
    assert "helm install colocgrpo-crds charts/colocgrpo-crds -n ops --take-ownership" in notes


@pytest.mark.parametrize(
    "values",
    [(), ("--set", "watchNamespaces={a,b}"), ("--set", "metrics.enabled=false"), ("--set", "logLevel=warning")],
)
def test_rendered_command_line_is_what_colocgrpo_operator_accepts(render_chart, values):
    from colocgrpo_operator.daemon import build_parser

    _, container = _operator_container(render_chart(*values))
    assert container["command"] == ["colocgrpo-operator"]
    args = build_parser().parse_args(container["args"])  # SystemExit on a bad flag
    assert args.trainer_image == "colocgrpo/trainer:0.1.0"
    assert args.liveness_port == 8080
    assert args.metrics_port == (0 if "metrics.enabled=false" in values else 9090)
    assert args.namespace == (["a", "b"] if "watchNamespaces={a,b}" in values else [])
    assert args.all_namespaces == (not args.namespace)


# --- staying up: disruption budget, spread over nodes, network policy ----------------------------------------


def test_two_replicas_get_a_budget_of_one_eviction_and_a_soft_spread_over_nodes(render_chart):
    objects = render_chart()
    budget = one(objects, "PodDisruptionBudget")
    deployment, _ = _operator_container(objects)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["maxUnavailable"] == 1 and "minAvailable" not in budget["spec"]
    assert budget["spec"]["selector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (spread,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread == {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",  # soft: a one-node cluster still runs both
        "labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
    }


def test_one_replica_gets_no_budget_and_no_spread(render_chart):
    objects = render_chart("--set", "replicas=1")
    assert by_kind(objects, "PodDisruptionBudget") == []
    deployment, _ = _operator_container(objects)
    assert "topologySpreadConstraints" not in deployment["spec"]["template"]["spec"]


def test_budget_and_spread_follow_their_values(render_chart):
    objects = render_chart(
        "--set",
        "podDisruptionBudget.minAvailable=2",
        "--set",
        "replicas=3",
        "--set",
        "topologySpreadConstraints[0].maxSkew=1,topologySpreadConstraints[0].topologyKey=zone",
        "--set",
        "topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule",
    )
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["minAvailable"] == 2 and "maxUnavailable" not in budget["spec"]
    deployment, _ = _operator_container(objects)
    assert deployment["spec"]["template"]["spec"]["topologySpreadConstraints"] == [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}
    ]
    off = render_chart("--set", "podDisruptionBudget.enabled=false", "--set", "podSpread.enabled=false")
    assert by_kind(off, "PodDisruptionBudget") == []
    assert "topologySpreadConstraints" not in _operator_container(off)[0]["spec"]["template"]["spec"]
    percent = one(render_chart("--set", "podDisruptionBudget.maxUnavailable=50%"), "PodDisruptionBudget")
    assert percent["spec"]["maxUnavailable"] == "50%"


def test_network_policy_is_off_by_default(render_chart):
    assert by_kind(render_chart(), "NetworkPolicy") == []


def test_network_policy_allows_the_api_server_dns_and_the_named_namespaces_only(render_chart):
    objects = render_chart(
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "networkPolicy.ingressNamespaces={monitoring,ops}",
    )
    policy = one(objects, "NetworkPolicy")["spec"]
    deployment, container = _operator_container(objects)
    assert policy["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = policy["ingress"]
    sources = [peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for peer in ingress["from"]]
    assert sources == ["monitoring", "ops"]
    # The named ports are the container's own: the probes' and the metrics'.
    assert (
        {port["port"] for port in ingress["ports"]}
        == {p["name"] for p in container["ports"]}
        == {
            "liveness",
            "metrics",
        }
    )
    api_server, dns = policy["egress"]
    assert api_server == {"ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}]}
    assert dns["to"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ]
    assert sorted(p["protocol"] for p in dns["ports"]) == ["TCP", "UDP"] and {p["port"] for p in dns["ports"]} == {53}


def test_network_policy_without_namespaces_admits_nothing_and_pins_the_api_server(render_chart):
    policy = one(
        render_chart(
            "--set",
            "networkPolicy.enabled=true",
            "--set",
            "networkPolicy.apiServer.cidrs={10.0.0.1/32,10.0.0.2/32}",
            "--set",
            "metrics.enabled=false",
        ),
        "NetworkPolicy",
    )["spec"]
    assert policy["ingress"] == []
    assert policy["egress"][0]["to"] == [{"ipBlock": {"cidr": "10.0.0.1/32"}}, {"ipBlock": {"cidr": "10.0.0.2/32"}}]


def test_a_default_runtime_from_values_is_one_the_api_reads(render_chart):
    from colocgrpo_operator.api.runtime import parse_runtime

    assert not by_kind(render_chart(), "ClusterColocGRPORuntime")  # off by default
    objects = render_chart(
        "--set",
        "defaultRuntime.enabled=true",
        "--set",
        "defaultRuntime.name=h100",
        "--set",
        "defaultRuntime.template.image=registry.example/trainer:1",
        "--set",
        "defaultRuntime.template.scheduling.nodeSelector.gpu=h100",
        "--set",
        "defaultRuntime.lockedFields={image}",
    )
    runtime = parse_runtime(one(objects, "ClusterColocGRPORuntime"))
    assert runtime.metadata.name == "h100"
    assert runtime.spec.template.image == "registry.example/trainer:1"
    assert runtime.spec.template.scheduling.node_selector == {"gpu": "h100"}
    assert runtime.spec.locked_fields == ["image"]
