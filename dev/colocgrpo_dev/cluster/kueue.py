"""Kueue's real manager against the dev cluster, as a local process on 127.0.0.1.

Built from its Go module by build/build-kueue.sh (pinned, cached by content hash next to
the CRDs and webhook manifests of the same module version). Kueue normally runs in a pod behind a
Service; here the API server reaches its webhooks on loopback instead:

- The webhook configurations are Kueue's own (config/components/webhook), kept for the batch/job
  integration and Kueue's own API groups, with `clientConfig.url: https://127.0.0.1:<port>/...`
  in place of the Service. The CRDs get the conversion webhooks of Kueue's kustomization the same
  way (`/convert` on the same port).
- Certificates: Kueue's internal cert management (open-policy-agent/cert-controller) only signs
  for `<service>.<namespace>.svc`, which the API server cannot resolve to a local process; with it
  disabled, Kueue insists on metrics certificates at the fixed path /etc/kueue/metrics/certs.
  So internal cert management stays on, and its Secret is seeded with our own CA and a server
  certificate valid for both the Service name and 127.0.0.1: the rotator finds them valid and
  keeps them, injects that CA into the webhook configurations and CRDs, and the webhook server
  reads the pair from its cert dir, where it is written too.
- Leader election off, metrics off, the visibility API server off (it would bind :8082), health
  probes on a free loopback port; `/readyz` turns ready once the webhook server listens.
- Only namespaces labelled `MANAGED_NAMESPACE_LABEL` are Kueue's (its managedJobsNamespaceSelector
  and the batch Job webhooks' namespaceSelector), so a shared test cluster's other Jobs never see
  it; integrations: batch/job only; manageJobsWithoutQueueName: false unless asked (then Kueue suspends
  every Job of those namespaces, queue name or not).
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from colocgrpo_dev.cluster.binaries import kubectl_path
from colocgrpo_dev.cluster.commands import run
from colocgrpo_dev.cluster.locking import file_lock
from colocgrpo_dev.cluster.paths import build_dir, cache_dir
from colocgrpo_dev.ports import free_port

KUEUE_NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
WEBHOOK_SECRET = "kueue-webhook-server-cert"
# The names cert-controller's rotator injects the CA into (derived from the Service name).
MUTATING_WEBHOOKS = "kueue-mutating-webhook-configuration"
VALIDATING_WEBHOOKS = "kueue-validating-webhook-configuration"
# The API groups whose webhooks are kept: Kueue's own, and the batch/job integration.
WEBHOOK_GROUPS = frozenset({"kueue.x-k8s.io", "batch"})
MANAGED_NAMESPACE_LABEL = ("colocgrpo.dev/kueue", "true")


@dataclass(frozen=True)
class KueueBuild:
    folder: Path

    @property
    def binary(self) -> Path:
        return self.folder / "kueue"

    @property
    def crd_dir(self) -> Path:
        return self.folder / "crd"

    @property
    def webhook_manifests(self) -> Path:
        return self.folder / "webhook" / "manifests.yaml"


def _build_script() -> Path:
    return build_dir() / "build-kueue.sh"


def kueue_dir() -> Path:
    """The pin-keyed folder build-kueue.sh builds into (it may not exist yet)."""
    out = run(["bash", str(_build_script()), "--dir"]).stdout
    return Path(out.strip().splitlines()[-1])


def ensure_kueue() -> KueueBuild:
    """Build Kueue if missing (a cold build takes many minutes; docs/dev-cluster.md has figures)."""
    with file_lock(cache_dir() / "kueue-bin" / ".build.lock"):
        # The build logs to stderr, which stays attached so a cold build shows progress.
        out = subprocess.run(["bash", str(_build_script())], check=True, stdout=subprocess.PIPE, text=True).stdout
    return KueueBuild(Path(out.strip().splitlines()[-1]))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def write_certificates(folder: Path) -> None:
    """A CA and a server certificate for 127.0.0.1 and Kueue's Service name, in `folder`.

    What cert-controller accepts as its own: RSA keys in PKCS#1 form (it parses the CA key with
    x509.ParsePKCS1PrivateKey), the CA named `kueue-ca` as a SAN (it verifies the CA by that
    name), and ten years of validity (it replaces certificates that expire within 90 days).
    """
    openssl = shutil.which("openssl")
    if openssl is None:
        raise FileNotFoundError("openssl is needed to make Kueue's webhook certificates (apt-get install openssl)")
    folder.mkdir(parents=True, exist_ok=True)
    service = f"{WEBHOOK_SERVICE}.{KUEUE_NAMESPACE}.svc"
    for key in ("ca.key", "tls.key"):
        run([openssl, "genrsa", "-traditional", "-out", str(folder / key), "2048"])
    x509 = [openssl, "req", "-x509", "-days", "3650"]
    ca = [
        *("-key", str(folder / "ca.key"), "-out", str(folder / "ca.crt"), "-subj", "/O=kueue/CN=kueue-ca"),
        *("-addext", "subjectAltName=DNS:kueue-ca", "-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"),
    ]
    server = [
        *("-key", str(folder / "tls.key"), "-out", str(folder / "tls.crt"), "-subj", f"/CN={service}"),
        *("-CA", str(folder / "ca.crt"), "-CAkey", str(folder / "ca.key")),
        *("-addext", f"subjectAltName=DNS:{service},DNS:localhost,IP:127.0.0.1"),
        *("-addext", "basicConstraints=critical,CA:FALSE", "-addext", "extendedKeyUsage=serverAuth"),
        *("-addext", "keyUsage=critical,digitalSignature,keyEncipherment"),
    ]
    run([*x509, *ca])
    run([*x509, *server])


def conversion_crds(crd_dir: Path) -> set[str]:
    """The CRDs that Kueue's kustomization gives a conversion webhook (its `webhook_in_*` patches)."""
    kustomization = yaml.safe_load((crd_dir / "kustomization.yaml").read_text())
    names = set()
    for patch in kustomization.get("patches") or []:
        path = crd_dir / patch["path"]
        body = yaml.safe_load(path.read_text())
        if (body.get("spec") or {}).get("conversion", {}).get("strategy") == "Webhook":
            names.add(body["metadata"]["name"])
    return names


def render_crds(build: KueueBuild, url: str) -> list[dict[str, Any]]:
    """Kueue's CRDs (config/components/crd/bases), conversion webhooks pointing at `url` (Kueue's
    cert-controller injects the CA bundle, as in a real install)."""
    converted = conversion_crds(build.crd_dir)
    crds = []
    for path in sorted((build.crd_dir / "bases").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["metadata"]["name"] in converted:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"url": f"{url}/convert"},
                    "conversionReviewVersions": ["v1"],
                },
            }
        crds.append(crd)
    return crds


def render_webhook_configurations(
    build: KueueBuild, url: str, namespace_label: tuple[str, str] | None
) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, for the API groups it serves here, called on `url` (the CA
    bundle is injected by Kueue's cert-controller)."""
    names = {"MutatingWebhookConfiguration": MUTATING_WEBHOOKS, "ValidatingWebhookConfiguration": VALIDATING_WEBHOOKS}
    configurations = []
    for document in yaml.safe_load_all(build.webhook_manifests.read_text()):
        if not document or document.get("kind") not in names:
            continue
        webhooks = []
        for webhook in document.get("webhooks") or []:
            groups = {group for rule in webhook.get("rules") or [] for group in rule.get("apiGroups") or []}
            if not groups or not groups <= WEBHOOK_GROUPS:
                continue
            path = webhook["clientConfig"]["service"]["path"]
            webhook = dict(webhook, clientConfig={"url": f"{url}{path}"})
            if namespace_label and "batch" in groups:
                webhook["namespaceSelector"] = {"matchLabels": {namespace_label[0]: namespace_label[1]}}
            webhooks.append(webhook)
        configurations.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": document["kind"],
                "metadata": {"name": names[document["kind"]], "labels": {"app.kubernetes.io/name": "kueue"}},
                "webhooks": webhooks,
            }
        )
    return configurations


def render_config(
    webhook_port: int,
    health_port: int,
    cert_dir: Path,
    namespace_label: tuple[str, str] | None,
    manage_jobs_without_queue_name: bool = False,
) -> str:
    config: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": WEBHOOK_SECRET,
        },
        "manageJobsWithoutQueueName": manage_jobs_without_queue_name,
        "integrations": {"frameworks": ["batch/job"]},
        # The on-demand visibility API server would bind :8082 on every interface.
        "featureGates": {"VisibilityOnDemand": False},
    }
    if namespace_label:
        config["managedJobsNamespaceSelector"] = {"matchLabels": {namespace_label[0]: namespace_label[1]}}
    return yaml.safe_dump(config, sort_keys=False)


class LocalKueue:
    """Kueue's manager for one cluster: `start` installs what it needs and waits until its
    webhooks answer through the API server; `stop` ends it and removes its webhook
    configurations (a cluster left running must not send requests to a dead webhook)."""

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        pid_dir: Path | None = None,
        namespace_label: tuple[str, str] | None = MANAGED_NAMESPACE_LABEL,
        manage_jobs_without_queue_name: bool = False,
    ):
        self.kubeconfig = Path(kubeconfig)
        self.workdir = Path(workdir)
        self.pid_dir = pid_dir  # a DevCluster's pids/ folder: its `down` then stops Kueue too
        self.namespace_label = namespace_label
        # Read by `start`: a test may stop Kueue, change it and start it again.
        self.manage_jobs_without_queue_name = manage_jobs_without_queue_name
        self.process: subprocess.Popen[bytes] | None = None
        self.health_port = 0
        self.webhook_port = 0

    @property
    def log_path(self) -> Path:
        return self.workdir / "kueue.log"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run([str(kubectl_path()), f"--kubeconfig={self.kubeconfig}", *args], input=input, check=check)

    def _apply(self, objects: list[dict[str, Any]]) -> None:
        documents = "\n".join(json.dumps(obj) for obj in objects)  # kubectl reads a JSON stream
        self.kubectl(
            "apply", "--server-side", "--force-conflicts", "--field-manager=colocgrpo-dev", "-f", "-", input=documents
        )

    def start(self, timeout: float = 120) -> None:
        build = ensure_kueue()
        self.workdir.mkdir(parents=True, exist_ok=True)
        certs = self.workdir / "certs"
        write_certificates(certs)
        self.webhook_port, self.health_port = free_port(), free_port()
        url = f"https://127.0.0.1:{self.webhook_port}"

        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": WEBHOOK_SECRET, "namespace": KUEUE_NAMESPACE},
            "data": {name: _b64((certs / name).read_bytes()) for name in ("ca.crt", "ca.key", "tls.crt", "tls.key")},
        }
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}}
        crds = render_crds(build, url)
        self._apply([namespace, *crds])
        self._apply([secret, *render_webhook_configurations(build, url, self.namespace_label)])
        names = [f"crd/{crd['metadata']['name']}" for crd in crds]
        self.kubectl("wait", "--for=condition=Established", f"--timeout={int(timeout)}s", *names)
        # Discovery lags behind Established (seconds, on a loaded machine). A controller that
        # rescans discovery on CRD events (kopf) then needs a CRD event after it caught up: Kueue's
        # cert-controller injecting its CA into the CRDs, once Kueue runs, is that event.
        self._wait_discovered(crds, time.monotonic() + timeout)

        config = self.workdir / "config.yaml"
        config.write_text(
            render_config(
                self.webhook_port, self.health_port, certs, self.namespace_label, self.manage_jobs_without_queue_name
            )
        )
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed right after
        self.process = subprocess.Popen(
            [str(build.binary), f"--config={config}", f"--kubeconfig={self.kubeconfig}", "--zap-log-level=2"],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        if self.pid_dir is not None and self.pid_dir.is_dir():
            (self.pid_dir / "kueue.pid").write_text(str(self.process.pid))
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.stop()
            raise

    def _wait_discovered(self, crds: list[dict[str, Any]], deadline: float) -> None:
        wanted = {
            (crd["spec"]["group"], v["name"], crd["spec"]["names"]["plural"])
            for crd in crds
            for v in crd["spec"]["versions"]
        }
        while True:
            missing = set(wanted)
            for group, version in {(g, v) for g, v, _ in wanted}:
                done = self.kubectl("get", "--raw", f"/apis/{group}/{version}", check=False)
                if done.returncode == 0:
                    served = {r["name"] for r in json.loads(done.stdout).get("resources", [])}
                    missing -= {(group, version, plural) for plural in served}
            if not missing:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kueue's CRDs not in API discovery: {sorted(missing)}")
            time.sleep(0.5)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        # 1. Its own readiness: certificates in place and the webhook server listening.
        while not self._ready():
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"Kueue not ready after {timeout}s:\n{self.log_tail()}")
            time.sleep(0.3)
        # 2. The API server reaches it: a dry-run create goes through both of its
        #    ResourceFlavor webhooks (mutating and validating).
        probe = json.dumps(
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "probe"}}
        )
        while True:
            self._check_alive()
            done = self.kubectl("create", "--dry-run=server", "-f", "-", input=probe, check=False)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Kueue's webhooks unreachable from the API server: {done.stderr}\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def _check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"Kueue exited with {self.process.returncode}:\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace: float = 20) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.pid_dir is not None:
            (self.pid_dir / "kueue.pid").unlink(missing_ok=True)
        with contextlib.suppress(Exception):
            self.kubectl(
                "delete",
                "--ignore-not-found",
                "--wait=false",
                f"mutatingwebhookconfiguration/{MUTATING_WEBHOOKS}",
                f"validatingwebhookconfiguration/{VALIDATING_WEBHOOKS}",
            )

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def default_pid_dir(kubeconfig: Path) -> Path | None:
    """The pid folder of the DevCluster whose kubeconfig this is (its `down` stops what it names)."""
    folder = Path(kubeconfig).parent / "pids"
    return folder if folder.is_dir() else None


__all__ = [
    "MANAGED_NAMESPACE_LABEL",
    "KueueBuild",
    "LocalKueue",
    "default_pid_dir",
    "ensure_kueue",
    "kueue_dir",
]
